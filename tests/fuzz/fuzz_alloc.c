/* fuzz_alloc.c - libFuzzer target: the allocator core (daemon/alloc.c) driven
 * by arbitrary call sequences, on small heaps of both policies, with the
 * invariant validator (ha_validate) after every call.
 *
 * Input: 4 parameter bytes (ranks 1..8, min_block 16..512, chunk_size =
 * min_block * 1..8, initial = 1..3 chunks, va = initial + 0..15 chunks),
 * then operations, one opcode byte each plus arguments:
 *   alloc SIZE      the alloc protocol of alloc.h (collect when asked, grow
 *                   by what is asked), sizes from 0 and 1 up to 2^64-1
 *   free R I        rank R frees model block I (held or not: the expected
 *                   answer is HA_OK or HA_ENOTHELD)
 *   free-bogus      an offset that is no block start (or is: expected from
 *                   the model)
 *   collect         ha_collect
 *   collect-apply   ha_collect_candidates, then ha_collect_apply of a
 *                   subset, or of an invalid list (HA_EINVAL, no change)
 *   grow N          an unsolicited ha_grow (HA_EVA past va_size)
 *
 * Every operation runs on four heaps: one per policy, and a twin of each fed
 * the same calls. Checked (abort on violation): ha_validate; a model of the
 * blocks (offset, size, which ranks hold it, pending) agrees with every
 * answer and statistic: no two blocks overlap, blocks lie inside the extent,
 * are aligned to min_block, have the class
 * ha_class_size names; a failed call changes nothing; the alloc protocol
 * ends within collect, grow, retry; reclaimed counts equal what every rank
 * released; the twin gives identical answers and statistics (determinism).
 */
#include "alloc.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "fuzz_alloc: check failed: %s: ", #cond);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

typedef struct mblk {
    uint64_t off, size;
    uint32_t held; /* bit r: rank r holds it */
    bool pending;  /* every rank released it, not reclaimed */
    bool gone;     /* reclaimed */
} mblk;

typedef struct model {
    ha_heap *h, *twin;
    ha_policy pol;
    ha_params p;
    uint64_t mapped;
    mblk *b;
    size_t nb, cap;
} model;

typedef struct input {
    const uint8_t *d;
    size_t n, i;
} input;

static uint8_t in8(input *in) { return in->i < in->n ? in->d[in->i++] : 0; }
static uint16_t in16(input *in) { return (uint16_t)(in8(in) | in8(in) << 8); }

static void validate(const ha_heap *h, const char *after)
{
    char err[512];
    int rc = ha_validate(h, err, sizeof err);
    CHECK(rc == HA_OK, "ha_validate after %s: %s", after, err);
}

static void same(model *m, const char *after)
{
    ha_stats a, b;
    ha_get_stats(m->h, &a);
    ha_get_stats(m->twin, &b);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "policy %s: the twin's statistics differ after %s", ha_policy_name(m->pol),
          after);
}

static void model_check(model *m, const char *after)
{
    ha_stats s;
    ha_get_stats(m->h, &s);
    uint64_t live = 0, pend = 0, nlive = 0, npend = 0;
    uint64_t held[8] = {0};
    for (size_t i = 0; i < m->nb; i++) {
        const mblk *b = &m->b[i];
        if (b->gone)
            continue;
        if (b->pending) {
            pend += b->size;
            npend++;
        } else {
            live += b->size;
            nlive++;
        }
        for (uint32_t r = 0; r < m->p.ranks; r++)
            if (b->held >> r & 1)
                held[r] += b->size;
    }
    CHECK(s.mapped == m->mapped, "%s: mapped %" PRIu64 ", model %" PRIu64, after, s.mapped, m->mapped);
    CHECK(s.live_bytes == live && s.pending_bytes == pend,
          "%s: live %" PRIu64 "/%" PRIu64 " pending %" PRIu64 "/%" PRIu64, after, s.live_bytes, live, s.pending_bytes,
          pend);
    CHECK(s.live_blocks == nlive && s.pending_blocks == npend, "%s: block counts", after);
    CHECK(s.free_bytes == s.mapped - live - pend, "%s: free_bytes %" PRIu64, after, s.free_bytes);
    for (uint32_t r = 0; r < m->p.ranks; r++) {
        uint64_t hb, rb;
        ha_rank_stats(m->h, r, &hb, &rb);
        CHECK(hb == held[r], "%s: rank %u holds %" PRIu64 ", model %" PRIu64, after, r, hb, held[r]);
    }
}

static mblk *model_add(model *m)
{
    if (m->nb == m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 64;
        mblk *n = realloc(m->b, nc * sizeof *n);
        CHECK(n != NULL, "realloc");
        m->b = n;
        m->cap = nc;
    }
    memset(&m->b[m->nb], 0, sizeof m->b[0]);
    return &m->b[m->nb++];
}

static void op_alloc(model *m, uint64_t size)
{
    ha_alloc_result ra, rb;
    int collects = 0, grows = 0;
    for (int step = 0;; step++) {
        CHECK(step < 4, "policy %s: the alloc protocol did not end (size %" PRIu64 ", %d collects, %d grows)",
              ha_policy_name(m->pol), size, collects, grows);
        ha_stats before;
        ha_get_stats(m->h, &before);
        int a = ha_alloc(m->h, size, &ra);
        int b = ha_alloc(m->twin, size, &rb);
        CHECK(a == b && memcmp(&ra, &rb, sizeof ra) == 0, "twin answered alloc(%" PRIu64 ") differently", size);
        validate(m->h, "ha_alloc");
        if (a == HA_NEED_COLLECT) {
            CHECK(collects == 0 && grows == 0, "a second collect asked for, or one after a grow");
            ha_stats after;
            ha_get_stats(m->h, &after);
            CHECK(memcmp(&before, &after, sizeof before) == 0, "HA_NEED_COLLECT changed the heap");
            uint64_t k1, y1, k2, y2;
            CHECK(ha_collect(m->h, &k1, &y1) == HA_OK && ha_collect(m->twin, &k2, &y2) == HA_OK, "collect");
            CHECK(k1 == k2 && y1 == y2, "twin collect");
            uint64_t nk = 0, ny = 0;
            for (size_t i = 0; i < m->nb; i++)
                if (m->b[i].pending && !m->b[i].gone) {
                    m->b[i].gone = true;
                    nk++;
                    ny += m->b[i].size;
                }
            CHECK(k1 == nk && y1 == ny,
                  "collect reclaimed %" PRIu64 " blocks / %" PRIu64 " bytes, model %" PRIu64 " / %" PRIu64, k1, y1, nk,
                  ny);
            collects++;
            continue;
        }
        if (a == HA_NEED_GROW) {
            CHECK(grows == 0, "a second grow asked for");
            CHECK(ra.grow_chunks > 0, "grow of 0 chunks");
            CHECK(m->mapped + (uint64_t)ra.grow_chunks * m->p.chunk_size <= m->p.va_size, "asked to grow past va_size");
            ha_stats after;
            ha_get_stats(m->h, &after);
            CHECK(memcmp(&before, &after, sizeof before) == 0, "HA_NEED_GROW changed the heap");
            CHECK(ha_grow(m->h, ra.grow_chunks) == HA_OK && ha_grow(m->twin, ra.grow_chunks) == HA_OK,
                  "ha_grow(%u) after HA_NEED_GROW failed", ra.grow_chunks);
            m->mapped += (uint64_t)ra.grow_chunks * m->p.chunk_size;
            grows++;
            continue;
        }
        if (a != HA_OK) {
            CHECK(a == HA_EVA || (a == HA_EINVAL && size == 0), "alloc(%" PRIu64 ") returned %d", size, a);
            ha_stats after;
            ha_get_stats(m->h, &after);
            CHECK(memcmp(&before, &after, sizeof before) == 0, "a failed alloc changed the heap");
            /* HA_EVA: an empty heap at va_size would take the class */
            if (a == HA_EVA) {
                uint64_t c = ha_class_size(m->h, size);
                bool empty = true;
                for (size_t i = 0; i < m->nb && empty; i++)
                    empty = m->b[i].gone;
                CHECK(!(empty && c != 0 && c <= m->p.chunk_size && m->mapped >= c && m->pol == HA_POLICY_COALESCE),
                      "HA_EVA for a %" PRIu64 "-byte class in an empty coalesce heap of %" PRIu64 " bytes", c,
                      m->mapped);
            }
            return;
        }
        uint64_t c = ha_class_size(m->h, size);
        CHECK(ra.block_size == c && c >= size && c >= m->p.min_block, "block_size %" PRIu64 " for size %" PRIu64,
              ra.block_size, size);
        CHECK(ra.offset + c <= m->mapped && ra.offset + c > ra.offset, "block outside the extent");
        CHECK(ra.offset % m->p.min_block == 0, "block not aligned to min_block");
        for (size_t i = 0; i < m->nb; i++) {
            const mblk *o = &m->b[i];
            if (o->gone)
                continue;
            CHECK(ra.offset + c <= o->off || o->off + o->size <= ra.offset,
                  "policy %s: new block [%" PRIu64 ", +%" PRIu64 ") overlaps block [%" PRIu64 ", +%" PRIu64 ") (%s)",
                  ha_policy_name(m->pol), ra.offset, c, o->off, o->size, o->pending ? "pending" : "held");
        }
        mblk *nb = model_add(m);
        nb->off = ra.offset;
        nb->size = c;
        nb->held = (UINT32_C(1) << m->p.ranks) - 1;
        return;
    }
}

static void op_free(model *m, uint32_t rank, uint64_t off)
{
    ha_stats before;
    ha_get_stats(m->h, &before);
    mblk *b = NULL;
    for (size_t i = 0; i < m->nb; i++)
        if (!m->b[i].gone && m->b[i].off == off) {
            b = &m->b[i];
            break;
        }
    int want = b && (b->held >> rank & 1) ? HA_OK : HA_ENOTHELD;
    CHECK(ha_rank_holds(m->h, rank, off) == (want == HA_OK), "ha_rank_holds disagrees with the model");
    CHECK(ha_block_size(m->h, off) == (b ? b->size : 0), "ha_block_size(%" PRIu64 ")", off);
    int a = ha_free(m->h, rank, off);
    int c = ha_free(m->twin, rank, off);
    CHECK(a == c, "twin answered free differently");
    CHECK(a == want, "policy %s: free(rank %u, %" PRIu64 ") returned %d, model says %d", ha_policy_name(m->pol), rank,
          off, a, want);
    if (a != HA_OK) {
        ha_stats after;
        ha_get_stats(m->h, &after);
        CHECK(memcmp(&before, &after, sizeof before) == 0, "a refused free changed the heap");
        return;
    }
    b->held &= ~(UINT32_C(1) << rank);
    if (!b->held)
        b->pending = true;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

static void op_collect(model *m)
{
    uint64_t k1, y1, k2, y2, nk = 0, ny = 0;
    CHECK(ha_collect(m->h, &k1, &y1) == HA_OK && ha_collect(m->twin, &k2, &y2) == HA_OK, "ha_collect failed");
    CHECK(k1 == k2 && y1 == y2, "twin collect");
    for (size_t i = 0; i < m->nb; i++)
        if (m->b[i].pending && !m->b[i].gone) {
            m->b[i].gone = true;
            nk++;
            ny += m->b[i].size;
        }
    CHECK(k1 == nk && y1 == ny, "collect reclaimed %" PRIu64 "/%" PRIu64 ", model %" PRIu64 "/%" PRIu64, k1, y1, nk,
          ny);
}

static void op_collect_apply(model *m, uint8_t mask, bool invalid)
{
    uint64_t *c1 = NULL, *c2 = NULL;
    size_t n1 = 0, n2 = 0;
    CHECK(ha_collect_candidates(m->h, &c1, &n1) == HA_OK && ha_collect_candidates(m->twin, &c2, &n2) == HA_OK,
          "ha_collect_candidates failed");
    CHECK(n1 == n2 && (n1 == 0 || memcmp(c1, c2, n1 * sizeof *c1) == 0), "twin candidates differ");
    /* the model's pending offsets, sorted */
    size_t np = 0;
    for (size_t i = 0; i < m->nb; i++)
        np += m->b[i].pending && !m->b[i].gone;
    uint64_t *mp = malloc((np ? np : 1) * sizeof *mp);
    CHECK(mp != NULL, "malloc");
    np = 0;
    for (size_t i = 0; i < m->nb; i++)
        if (m->b[i].pending && !m->b[i].gone)
            mp[np++] = m->b[i].off;
    qsort(mp, np, sizeof *mp, cmp_u64);
    CHECK(np == n1 && (np == 0 || memcmp(mp, c1, np * sizeof *mp) == 0), "candidates differ from the model");
    free(mp);
    uint64_t *sub = malloc((n1 + 2) * sizeof *sub);
    CHECK(sub != NULL, "malloc");
    size_t ns = 0;
    for (size_t i = 0; i < n1; i++)
        if (mask >> (i % 8) & 1)
            sub[ns++] = c1[i];
    ha_stats before;
    ha_get_stats(m->h, &before);
    if (invalid) {
        /* not sorted, a duplicate, or an offset that is no candidate */
        int kind = mask % 3;
        if (kind == 0 && ns >= 2) {
            uint64_t t = sub[0];
            sub[0] = sub[1];
            sub[1] = t;
        } else if (kind == 1 && ns >= 1) {
            sub[ns] = sub[ns - 1];
            ns++;
        } else {
            sub[ns++] = UINT64_MAX - 7;
        }
        uint64_t by;
        CHECK(ha_collect_apply(m->h, sub, ns, &by) == HA_EINVAL && ha_collect_apply(m->twin, sub, ns, &by) == HA_EINVAL,
              "an invalid collect list was accepted");
        ha_stats after;
        ha_get_stats(m->h, &after);
        CHECK(memcmp(&before, &after, sizeof before) == 0, "a refused collect_apply changed the heap");
    } else {
        uint64_t b1 = 0, b2 = 0, want = 0;
        CHECK(ha_collect_apply(m->h, sub, ns, &b1) == HA_OK && ha_collect_apply(m->twin, sub, ns, &b2) == HA_OK,
              "ha_collect_apply of a subset of the candidates failed");
        CHECK(b1 == b2, "twin collect_apply");
        for (size_t k = 0; k < ns; k++)
            for (size_t i = 0; i < m->nb; i++)
                if (!m->b[i].gone && m->b[i].off == sub[k]) {
                    CHECK(m->b[i].pending, "applied a non-pending block");
                    m->b[i].gone = true;
                    want += m->b[i].size;
                    break;
                }
        CHECK(b1 == want, "collect_apply reclaimed %" PRIu64 " bytes, model %" PRIu64, b1, want);
    }
    free(sub);
    free(c1);
    free(c2);
}

static void op_grow(model *m, uint32_t chunks)
{
    ha_stats before;
    ha_get_stats(m->h, &before);
    int a = ha_grow(m->h, chunks), b = ha_grow(m->twin, chunks);
    CHECK(a == b, "twin grow");
    int want = chunks == 0 ? HA_EINVAL : m->mapped + (uint64_t)chunks * m->p.chunk_size > m->p.va_size ? HA_EVA : HA_OK;
    CHECK(a == want, "grow(%u) returned %d, expected %d", chunks, a, want);
    if (a == HA_OK)
        m->mapped += (uint64_t)chunks * m->p.chunk_size;
    else {
        ha_stats after;
        ha_get_stats(m->h, &after);
        CHECK(memcmp(&before, &after, sizeof before) == 0, "a refused grow changed the heap");
    }
}

/* Size of an allocation from opcode bits and a 16-bit argument. */
static uint64_t pick_size(const model *m, uint8_t sel, uint16_t v)
{
    switch (sel % 16) {
    case 0:
        return 0;
    case 1:
        return m->p.va_size + 1 + v;
    case 2:
        return UINT64_MAX - v;
    case 3:
        return (UINT64_C(1) << 63) + v;
    case 4:
        return m->p.va_size - (v % m->p.min_block);
    default: {
        /* mostly small: 1 .. 2^e with e up to log2(va) */
        uint32_t lg = 63u - (uint32_t)__builtin_clzll(m->p.va_size);
        uint32_t e = (uint32_t)(sel >> 4) % (lg + 1);
        return 1 + ((uint64_t)v * 2654435761u) % (UINT64_C(1) << e);
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in = {data, size, 0};
    if (size < 4)
        return 0;
    ha_params p;
    memset(&p, 0, sizeof p);
    p.ranks = 1 + in8(&in) % 8;
    p.min_block = UINT64_C(16) << (in8(&in) % 6);
    p.chunk_size = p.min_block * (1 + in8(&in) % 8);
    uint8_t v = in8(&in);
    p.initial_size = p.chunk_size * (1 + v % 3);
    p.va_size = p.initial_size + p.chunk_size * (v / 3 % 16);
    model m[2];
    memset(m, 0, sizeof m);
    for (int k = 0; k < 2; k++) {
        char err[256];
        m[k].pol = k ? HA_POLICY_SEED : HA_POLICY_COALESCE;
        m[k].p = p;
        m[k].p.policy = m[k].pol;
        CHECK(ha_params_check(&m[k].p, err, sizeof err) == HA_OK, "params: %s", err);
        CHECK(ha_create(&m[k].p, &m[k].h, err, sizeof err) == HA_OK, "create: %s", err);
        CHECK(ha_create(&m[k].p, &m[k].twin, err, sizeof err) == HA_OK, "create: %s", err);
        m[k].mapped = p.initial_size;
        validate(m[k].h, "ha_create");
    }
    while (in.i < in.n) {
        uint8_t op = in8(&in);
        uint16_t a16 = 0;
        uint8_t a8 = 0;
        switch (op % 8) {
        case 0:
        case 1:
        case 2:
            a8 = in8(&in);
            a16 = in16(&in);
            for (int k = 0; k < 2; k++)
                op_alloc(&m[k], pick_size(&m[k], a8, a16));
            break;
        case 3:
            a8 = in8(&in);
            a16 = in16(&in);
            for (int k = 0; k < 2; k++)
                if (m[k].nb)
                    op_free(&m[k], a8 % p.ranks, m[k].b[a16 % m[k].nb].off);
            break;
        case 4:
            a8 = in8(&in);
            a16 = in16(&in);
            for (int k = 0; k < 2; k++) {
                uint64_t off = m[k].nb ? m[k].b[a16 % m[k].nb].off + (op >> 3) : a16;
                op_free(&m[k], a8 % p.ranks, off);
            }
            break;
        case 5:
            for (int k = 0; k < 2; k++)
                op_collect(&m[k]);
            break;
        case 6:
            a8 = in8(&in);
            for (int k = 0; k < 2; k++)
                op_collect_apply(&m[k], a8, (op >> 3) % 4 == 0);
            break;
        case 7:
            for (int k = 0; k < 2; k++)
                op_grow(&m[k], (uint32_t)(op >> 3) % 5);
            break;
        }
        for (int k = 0; k < 2; k++) {
            model_check(&m[k], "an operation");
            same(&m[k], "an operation");
            validate(m[k].h, "an operation");
            validate(m[k].twin, "an operation (twin)");
        }
    }
    for (int k = 0; k < 2; k++) {
        ha_destroy(m[k].h);
        ha_destroy(m[k].twin);
        free(m[k].b);
    }
    return 0;
}
