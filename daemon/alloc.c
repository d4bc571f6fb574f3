/* alloc.c - the symmetric allocator core (see alloc.h for the contract):
 * parameters, the policies' table, lifetime, alloc, grow, free, collect,
 * introspection: what every policy shares; each policy's own steps are in
 * its file (alloc_coalesce.c, alloc_seed.c) behind its ha_policy_ops. The
 * structures and their invariants are in alloc_int.h; the bitmaps, the block
 * table and the validator in the other alloc_*.c files. */
#include "alloc_int.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_err(char *err, size_t errlen, const char *fmt, const char *what, unsigned long long v)
{
    if (err && errlen)
        snprintf(err, errlen, fmt, what, v);
}

static void set_msg(char *err, size_t errlen, const char *msg)
{
    if (err && errlen)
        snprintf(err, errlen, "%s", msg);
}

#ifdef HEAPD_DEBUG
void ha_debug_check(const ha_heap *h, const char *where)
{
    char err[256];
    if (ha_validate(h, err, sizeof err) != HA_OK) {
        fprintf(stderr, "heapd: allocator invariant broken after %s: %s\n", where, err);
        abort();
    }
}
#endif

const char *ha_strerror(int code)
{
    switch (code) {
#define HA_STR_X(N, v, w, d)                                                                                           \
    case HA_##N:                                                                                                       \
        return d;
        HA_ERRORS(HA_STR_X)
#undef HA_STR_X
    default:
        return "unknown allocator error";
    }
}

const char *ha_errname(int code)
{
    switch (code) {
#define HA_NAME_X(N, v, w, d)                                                                                          \
    case HA_##N:                                                                                                       \
        return "HA_" #N;
        HA_ERRORS(HA_NAME_X)
#undef HA_NAME_X
    default:
        return "HA_UNKNOWN";
    }
}

/* ---- policies ------------------------------------------------------------ */

static const ha_policy_ops *const policy_ops[HA_POLICY_COUNT] = {
#define HA_OPS_X(U, l, w) [HA_POLICY_##U] = &ha_##l##_ops,
    HPO_POLICIES(HA_OPS_X)
#undef HA_OPS_X
};
#define HA_ROW_X(U, l, w) _Static_assert((int)HA_POLICY_##U == (int)HPO_##U, "ha_policy follows common/policy.h");
HPO_POLICIES(HA_ROW_X)
#undef HA_ROW_X

const ha_policy_ops *ha_policy_ops_of(ha_policy p) { return (unsigned)p < HA_POLICY_COUNT ? policy_ops[p] : NULL; }

const char *ha_policy_name(ha_policy p)
{
    const char *s = hpo_name((unsigned)p);
    return s ? s : "unknown";
}

int ha_policy_parse(const char *s, ha_policy *out)
{
    if (!s || !out)
        return HA_EINVAL;
    int i = strcmp(s, "default") ? hpo_index(s) : 0;
    if (i < 0)
        return HA_EINVAL;
    *out = (ha_policy)i;
    return HA_OK;
}

int ha_params_check(const ha_params *p, char *err, size_t errlen)
{
    if (!p) {
        set_msg(err, errlen, "no parameters given");
        return HA_EINVAL;
    }
#define BAD(fmt, what, v)                                                                                              \
    do {                                                                                                               \
        set_err(err, errlen, fmt, what, (unsigned long long)(v));                                                      \
        return HA_EINVAL;                                                                                              \
    } while (0)
    if (p->ranks < 1 || p->ranks > HA_MAX_RANKS)
        BAD("%s must be between 1 and 4096, got %llu", "ranks", p->ranks);
    if (!is_pow2(p->min_block))
        BAD("%s must be a power of two, got %llu", "min_block", p->min_block);
    if (p->chunk_size == 0 || p->chunk_size % p->min_block)
        BAD("%s must be a non-zero multiple of min_block, got %llu", "chunk_size", p->chunk_size);
    if (p->initial_size < p->chunk_size || p->initial_size % p->chunk_size)
        BAD("%s must be a whole number (>= 1) of chunks, got %llu", "initial_size", p->initial_size);
    if (p->va_size < p->initial_size || p->va_size % p->chunk_size)
        BAD("%s must be a whole number of chunks and >= initial_size, got %llu", "va_size", p->va_size);
    if (p->va_size > HA_MAX_VA)
        BAD("%s must be at most 2^56 bytes, got %llu", "va_size", p->va_size);
    if (!ha_policy_ops_of(p->policy)) {
        if (err && errlen)
            snprintf(err, errlen, "policy must be one of %s, got %u", HPO_NAMES, (unsigned)p->policy);
        return HA_EINVAL;
    }
    if (p->reclaim != HA_RECLAIM_COLLECT && p->reclaim != HA_RECLAIM_EAGER)
        BAD("%s must be collect (0) or eager (1), got %llu", "reclaim", p->reclaim);
    if (p->reclaim == HA_RECLAIM_EAGER && !p->one_decider) {
        set_msg(err, errlen,
                "reclaim eager needs one decider (a heap on one node: one core decides every rank's allocations); "
                "use reclaim = collect");
        return HA_EINVAL;
    }
    if (p->extent_bound && p->policy != HA_POLICY_COALESCE) {
        set_msg(err, errlen, "extent_bound needs the coalesce policy (the seed's classes ignore extents)");
        return HA_EINVAL;
    }
    if (p->reclaim == HA_RECLAIM_EAGER && p->policy == HA_POLICY_SEED) {
        set_msg(err, errlen,
                "reclaim eager: the seed policy reclaims only at collects; use reclaim = collect or policy coalesce");
        return HA_EINVAL;
    }
#undef BAD
    return HA_OK;
}

const ha_params *ha_get_params(const ha_heap *h) { return &h->p; }

uint64_t ha_meta_bytes(const ha_params *p, uint64_t mapped)
{
    const ha_policy_ops *o = ha_policy_ops_of(p->policy);
    return o && p->min_block ? o->meta_bytes(p, mapped) : 0;
}

uint64_t ha_class_size(const ha_heap *h, uint64_t size)
{
    if (size == 0 || size > (UINT64_C(1) << 63))
        return 0;
    if (size < h->p.min_block)
        size = h->p.min_block;
    return h->ops->class_size(&h->p, size);
}

/* ---- lifetime ------------------------------------------------------------ */

int ha_create(const ha_params *p, ha_heap **out, char *err, size_t errlen)
{
    if (!out)
        return HA_EINVAL;
    *out = NULL;
    int rc = ha_params_check(p, err, errlen);
    if (rc)
        return rc;
    ha_heap *h = calloc(1, sizeof *h);
    if (!h)
        goto nomem;
    h->p = *p;
    h->ops = ha_policy_ops_of(p->policy);
    h->kmin = log2u(p->min_block);
    h->kmax = log2u(p->va_size);
    h->rel_bytes = calloc(p->ranks, sizeof(uint64_t));
    if (!h->rel_bytes)
        goto nomem;
    if (hat_init(&h->tab, 64, (p->ranks + 63) / 64, h->kmin))
        goto nomem;
    h->mapped = p->initial_size;
    h->free_bytes = p->initial_size;
    if ((h->ops->create && h->ops->create(h)) || hae_create(h))
        goto nomem;
    *out = h;
    HA_DEBUG_CHECK(h, "ha_create");
    return HA_OK;
nomem:
    ha_destroy(h);
    set_msg(err, errlen, "out of memory creating the allocator");
    return HA_ENOMEM;
}

void ha_destroy(ha_heap *h)
{
    if (!h)
        return;
    hat_free(&h->tab);
    hab_free(&h->holes);
    hab_free(&h->bounds);
    free(h->pending.v);
    if (h->ops && h->ops->destroy)
        h->ops->destroy(h);
    free(h->rel_bytes);
    free(h);
}

/* ---- allocation ---------------------------------------------------------- */

/* The policy's ha_alloc_with (one indirect call; its class size and step
 * inlined there). */
int ha_alloc(ha_heap *h, uint64_t size, ha_alloc_result *res)
{
    if (!h || !res)
        return HA_EINVAL;
    uint64_t t = h->p.trim_threshold;
    if (t && !h->alloc_open && h->free_bytes >= t && ha_trimmable(h, t) >= t) {
        memset(res, 0, sizeof *res);
        h->alloc_open = true; /* issue 30: trim first, then this allocation */
        h->trims_asked++;
        return HA_NEED_TRIM;
    }
    int rc = h->ops->alloc(h, size, res);
    h->alloc_open = rc > HA_OK; /* HA_NEED_*: the allocation goes on */
    return rc;
}

/* A growth by `chunks`: the holes it refills (lowest first) and the bytes
 * it adds at the top. HA_OK, or HA_EVA when those would pass va_size. */
static int grow_split(const ha_heap *h, uint32_t chunks, uint64_t *refill, uint64_t *add)
{
    *refill = h->nholes < chunks ? h->nholes : chunks;
    *add = (chunks - *refill) * h->p.chunk_size;
    return *add > h->p.va_size - h->mapped ? HA_EVA : HA_OK;
}

int ha_grow_plan(const ha_heap *h, uint32_t chunks, ha_chunk_fn fn, void *data)
{
    if (!h || chunks == 0 || !fn)
        return HA_EINVAL;
    uint64_t refill, add;
    if (grow_split(h, chunks, &refill, &add))
        return HA_EVA;
    uint64_t i = 0;
    for (uint64_t n = 0; n < refill; n++, i++)
        fn(data, (uint32_t)(i = hab_next(&h->holes, i)));
    for (uint64_t j = h->mapped / h->p.chunk_size; j < (h->mapped + add) / h->p.chunk_size; j++)
        fn(data, (uint32_t)j);
    return HA_OK;
}

int ha_grow(ha_heap *h, uint32_t chunks)
{
    if (!h || chunks == 0)
        return HA_EINVAL;
    uint64_t cs = h->p.chunk_size, refill, add;
    if (grow_split(h, chunks, &refill, &add))
        return HA_EVA;
    if (hae_grow(h, refill, h->mapped / cs, (h->mapped + add) / cs)) /* issue 32 */
        return HA_ENOMEM;
    if (add && h->ops->grow(h, h->mapped + add))
        return HA_ENOMEM;
    for (uint64_t n = 0; n < refill; n++) { /* issue 30: holes first, lowest first */
        uint64_t i = hab_first(&h->holes);
        hab_clear(&h->holes, i);
        h->nholes--;
        h->ops->fill(h, i * cs);
    }
    h->free_bytes += add + refill * cs;
    h->grown_bytes += add + refill * cs;
    h->growths++;
    if (h->skip_pending) {
        h->collects_skipped++;
        h->asked_answered = true; /* count each skip once */
        h->skip_pending = false;
    }
    HA_DEBUG_CHECK(h, "ha_grow");
    return HA_OK;
}

int ha_chunk_hole(const ha_heap *h, uint32_t index) { return h && hab_test(&h->holes, index); }

/* ha_trim's top: the wholly free chunks that end the extent leave it, then
 * the holes that end it then, and so on; the extent keeps a chunk. The
 * chunks that leave it and were no holes are reported (ascending). */
static uint64_t trim_top(ha_heap *h, ha_chunk_fn fn, void *data)
{
    uint64_t cs = h->p.chunk_size, cut = 0;
    for (;;) {
        uint64_t nm = align_up(h->ops->top(h), cs); /* every block lies below the top */
        if (nm < cs)
            nm = cs;
        if (nm < h->mapped) {
            uint64_t old = h->mapped;
            h->ops->shrink(h, nm);
            h->free_bytes -= old - nm;
            cut += old - nm;
            for (uint64_t j = nm / cs; fn && j < old / cs; j++)
                fn(data, (uint32_t)j);
        }
        uint64_t last = h->mapped / cs - 1;
        if (h->mapped == cs || !hab_test(&h->holes, last))
            return cut;
        while (h->mapped > cs && hab_test(&h->holes, last)) { /* trimmed before: not reported */
            hab_clear(&h->holes, last--);
            h->nholes--;
            h->mapped -= cs;
        }
    }
}

uint64_t ha_trimmable(const ha_heap *h, uint64_t enough)
{
    if (!h)
        return 0;
    uint64_t cs = h->p.chunk_size, nm = align_up(h->ops->top(h), cs);
    uint64_t top = h->mapped > nm && h->mapped > cs ? h->mapped - (nm < cs ? cs : nm) : 0;
    if (top >= enough || !h->ops->punchable)
        return top;
    return top + h->ops->punchable(h, enough - top);
}

int ha_trim(ha_heap *h, uint32_t *chunks, ha_chunk_fn fn, void *data)
{
    if (chunks)
        *chunks = 0;
    if (!h)
        return HA_EINVAL;
    uint64_t punched = 0;
    if (h->ops->punch) {
        if (hab_resize(&h->holes, h->mapped / h->p.chunk_size))
            return HA_ENOMEM;
        punched = h->ops->punch(h, fn, data);
        h->free_bytes -= punched;
    }
    uint64_t cut = punched + trim_top(h, fn, data);
    if (!cut)
        return HA_OK;
    h->trims++;
    h->trimmed_bytes += cut;
    if (chunks)
        *chunks = (uint32_t)(cut / h->p.chunk_size);
    HA_DEBUG_CHECK(h, "ha_trim");
    return HA_OK;
}

static int reserve(ha_heap *h, const uint64_t *offs, size_t n);

/* Sorted offsets (each a pending record, out of the pending vector; the
 * policy made room for them) back to the free space: the policy's reclaim
 * and the byte counters every reclaim moves. Returns their bytes. */
static uint64_t reclaim_blocks(ha_heap *h, const uint64_t *offs, size_t n)
{
    uint64_t total = h->ops->reclaim(h, offs, n);
    for (uint32_t r = 0; r < h->p.ranks; r++)
        h->rel_bytes[r] -= total;
    h->pending_bytes -= total;
    h->free_bytes += total;
    return total;
}

/* reclaim = eager: the blocks a release completed (the pending vector)
 * back to the free space at once, sorted as a collect would, counted as
 * eager reclaims (not as a collect: the collect flags, handed_since_collect
 * and used_at_collect stay). When the policy cannot make room (HA_ENOMEM)
 * they stay pending, for the next release or a collect. */
static void eager_reclaim(ha_heap *h)
{
    size_t n = h->pending.n;
    if (h->p.reclaim != HA_RECLAIM_EAGER || n == 0)
        return;
    if (n > 1)
        hat_sort_offsets(h->pending.v, n, h->kmin, log2u(h->mapped) + 1);
    if (reserve(h, h->pending.v, n))
        return;
    reclaim_blocks(h, h->pending.v, n);
    h->eager_reclaims += n;
    h->pending.n = 0;
}

/* After releases that left blocks pending (ha_free, ha_free_batch): one
 * decider's coalesce policy may collect again (a collect now reclaims
 * more), and reclaim = eager reclaims them at once. */
static void after_release(ha_heap *h)
{
    if (h->pending.n && h->p.one_decider && h->ops->every_collect_answers)
        h->collect_answered = false;
    eager_reclaim(h);
}

int ha_free(ha_heap *h, uint32_t rank, uint64_t offset)
{
    if (!h || rank >= h->p.ranks)
        return HA_EINVAL;
    ha_blk *b = hat_find(&h->tab, offset);
    if (!b)
        return HA_ENOTHELD;
    uint64_t *held = hat_held(&h->tab, b);
    uint64_t bit = UINT64_C(1) << (rank % 64);
    if (!(held[rank / 64] & bit))
        return HA_ENOTHELD;
    if (b->nrel + 1 == h->p.ranks && hat_vec_reserve(&h->pending, 1))
        return HA_ENOMEM;
    uint64_t sz = b->size;
    held[rank / 64] &= ~bit;
    b->nrel++;
    h->rel_bytes[rank] += sz;
    h->frees++;
    if (b->nrel == h->p.ranks) {
        b->pending = 1;
        h->pending.v[h->pending.n++] = offset;
        h->live_bytes -= sz;
        h->pending_bytes += sz;
        after_release(h);
    }
    HA_DEBUG_CHECK(h, "ha_free");
    return HA_OK;
}

/* Frees on a batch walk their offsets in order: each step asks for the home
 * slot of the record HA_FREE_AHEAD offsets ahead, so that the misses of a
 * batch (one per record at 10^6 blocks) overlap instead of adding up. */
#define HA_FREE_AHEAD 8

/* Takes back one release of rank's bit on b (the undo of a step of
 * ha_free_batch, in reverse order: a block it made pending is the last
 * entry of the pending vector). */
static void unfree(ha_heap *h, uint32_t rank, ha_blk *b)
{
    uint64_t sz = b->size;
    if (b->pending) {
        b->pending = 0;
        h->pending.n--;
        h->live_bytes += sz;
        h->pending_bytes -= sz;
    }
    hat_held(&h->tab, b)[rank / 64] |= UINT64_C(1) << (rank % 64);
    b->nrel--;
    h->rel_bytes[rank] -= sz;
}

int ha_free_batch(ha_heap *h, uint32_t rank, const uint64_t *offsets, size_t n, size_t *bad)
{
    if (!h || rank >= h->p.ranks || (n && !offsets))
        return HA_EINVAL;
    if (hat_vec_reserve(&h->pending, n))
        return HA_ENOMEM;
    uint64_t bit = UINT64_C(1) << (rank % 64);
    size_t ahead = h->tab.cap < HA_PREFETCH_CAP ? 0 : n < HA_FREE_AHEAD ? n : HA_FREE_AHEAD;
    for (size_t i = 0; i < ahead; i++)
        hat_prefetch(&h->tab, offsets[i]);
    for (size_t i = 0; i < n; i++) {
        if (ahead && i + HA_FREE_AHEAD < n)
            hat_prefetch(&h->tab, offsets[i + HA_FREE_AHEAD]);
        ha_blk *b = hat_find(&h->tab, offsets[i]);
        uint64_t *held = b ? hat_held(&h->tab, b) : NULL;
        if (!b || !(held[rank / 64] & bit)) {
            /* all or nothing: the ones before i are in the caches */
            for (size_t j = i; j-- > 0;)
                unfree(h, rank, hat_find(&h->tab, offsets[j]));
            if (bad)
                *bad = i;
            HA_DEBUG_CHECK(h, "ha_free_batch");
            return HA_ENOTHELD;
        }
        uint64_t sz = b->size;
        held[rank / 64] &= ~bit;
        b->nrel++;
        h->rel_bytes[rank] += sz;
        if (b->nrel == h->p.ranks) {
            b->pending = 1;
            h->pending.v[h->pending.n++] = offsets[i];
            h->live_bytes -= sz;
            h->pending_bytes += sz;
        }
    }
    h->frees += n;
    after_release(h);
    HA_DEBUG_CHECK(h, "ha_free_batch");
    return HA_OK;
}

uint64_t ha_block_size(const ha_heap *h, uint64_t offset)
{
    const ha_blk *b = h ? hat_find(&h->tab, offset) : NULL;
    return b ? b->size : 0;
}

int ha_rank_holds(const ha_heap *h, uint32_t rank, uint64_t offset)
{
    if (!h || rank >= h->p.ranks)
        return 0;
    const ha_blk *b = hat_find(&h->tab, offset);
    if (!b)
        return 0;
    return (int)((hat_held(&h->tab, b)[rank / 64] >> (rank % 64)) & 1);
}

/* ---- collect ------------------------------------------------------------- */

/* Reclaims sorted offsets (each a pending record, already removed from the
 * pending vector; the policy made room for them) as a collect: then the
 * collect's counters and flags. */
static void reclaim_sorted(ha_heap *h, const uint64_t *offs, size_t n, uint64_t *bytes)
{
    uint64_t total = reclaim_blocks(h, offs, n);
    h->collects++;
    h->handed_since_collect = 0;
    h->used_at_collect = h->mapped - h->free_bytes;
    if (h->collect_asked) {
        h->collect_asked = false;
        h->collect_answered = h->asked_answered = true;
    }
    h->skip_pending = false;
    if (h->ops->every_collect_answers)
        h->collect_answered = true; /* coalesce: every collect answers (docs/design.md) */
    if (bytes)
        *bytes = total;
}

static int reserve(ha_heap *h, const uint64_t *offs, size_t n)
{
    return h->ops->reserve ? h->ops->reserve(h, offs, n) : 0;
}

int ha_collect(ha_heap *h, uint64_t *reclaimed_blocks, uint64_t *reclaimed_bytes)
{
    if (!h)
        return HA_EINVAL;
    if (h->pending.n)
        hat_sort_offsets(h->pending.v, h->pending.n, h->kmin, log2u(h->mapped) + 1);
    if (reserve(h, h->pending.v, h->pending.n))
        return HA_ENOMEM;
    size_t n = h->pending.n;
    reclaim_sorted(h, h->pending.v, n, reclaimed_bytes);
    h->pending.n = 0;
    if (reclaimed_blocks)
        *reclaimed_blocks = n;
    HA_DEBUG_CHECK(h, "ha_collect");
    return HA_OK;
}

int ha_collect_candidates(const ha_heap *h, uint64_t **offsets, size_t *n)
{
    if (!h || !offsets || !n)
        return HA_EINVAL;
    *offsets = NULL;
    *n = 0;
    if (h->pending.n == 0)
        return HA_OK;
    uint64_t *v = malloc(h->pending.n * sizeof *v);
    if (!v)
        return HA_ENOMEM;
    memcpy(v, h->pending.v, h->pending.n * sizeof *v);
    hat_sort_offsets(v, h->pending.n, h->kmin, log2u(h->mapped) + 1);
    *offsets = v;
    *n = h->pending.n;
    return HA_OK;
}

/* Marks offsets[0..n) (sorted ascending, each a pending record), makes
 * room for them and takes them out of the pending vector: 0, or HA_EINVAL /
 * HA_ENOMEM with nothing changed. */
static int take_pending(ha_heap *h, const uint64_t *offsets, size_t n)
{
    if (!h || (n && !offsets))
        return HA_EINVAL;
    for (size_t i = 0; i < n; i++) {
        ha_blk *b = hat_find(&h->tab, offsets[i]);
        if (!b || !b->pending || (i && offsets[i] <= offsets[i - 1])) {
            for (size_t j = 0; j < i; j++)
                hat_find(&h->tab, offsets[j])->mark = 0;
            return HA_EINVAL;
        }
        b->mark = 1;
    }
    if (reserve(h, offsets, n)) {
        for (size_t j = 0; j < n; j++)
            hat_find(&h->tab, offsets[j])->mark = 0;
        return HA_ENOMEM;
    }
    size_t w = 0;
    for (size_t i = 0; i < h->pending.n; i++) {
        ha_blk *b = hat_find(&h->tab, h->pending.v[i]);
        if (!b->mark)
            h->pending.v[w++] = h->pending.v[i];
    }
    h->pending.n = w;
    return HA_OK;
}

int ha_collect_apply(ha_heap *h, const uint64_t *offsets, size_t n, uint64_t *reclaimed_bytes)
{
    int rc = take_pending(h, offsets, n);
    if (rc)
        return rc;
    reclaim_sorted(h, offsets, n, reclaimed_bytes);
    HA_DEBUG_CHECK(h, "ha_collect_apply");
    return HA_OK;
}

int ha_reclaim_apply(ha_heap *h, const uint64_t *offsets, size_t n, uint64_t *reclaimed_bytes)
{
    if (h && h->p.policy == HA_POLICY_SEED)
        return HA_EINVAL; /* the seed's algorithm reclaims at collects only */
    int rc = take_pending(h, offsets, n);
    if (rc)
        return rc;
    uint64_t total = reclaim_blocks(h, offsets, n);
    h->eager_reclaims += n;
    if (reclaimed_bytes)
        *reclaimed_bytes = total;
    HA_DEBUG_CHECK(h, "ha_reclaim_apply");
    return HA_OK;
}

/* ---- introspection ------------------------------------------------------- */

void ha_get_stats(const ha_heap *h, ha_stats *s)
{
    memset(s, 0, sizeof *s);
    s->mapped = h->mapped;
    s->live_bytes = h->live_bytes;
    s->pending_bytes = h->pending_bytes;
    s->free_bytes = h->free_bytes;
    s->pending_blocks = h->pending.n;
    s->live_blocks = h->tab.count - h->pending.n;
    s->allocs = h->allocs;
    s->frees = h->frees;
    s->collects = h->collects;
    s->growths = h->growths;
    s->handed_since_collect = h->handed_since_collect;
    s->collects_skipped = h->collects_skipped;
    s->eager_reclaims = h->eager_reclaims;
    s->trims = h->trims;
    s->trims_asked = h->trims_asked;
    s->trimmed_bytes = h->trimmed_bytes;
    s->hole_bytes = h->nholes * h->p.chunk_size;
    s->top = h->ops->top(h);
}

void ha_rank_stats(const ha_heap *h, uint32_t rank, uint64_t *held_bytes, uint64_t *released_bytes)
{
    uint64_t hb = 0, rb = 0;
    if (h && rank < h->p.ranks) {
        hb = h->live_bytes + h->pending_bytes - h->rel_bytes[rank];
        rb = h->rel_bytes[rank];
    }
    if (held_bytes)
        *held_bytes = hb;
    if (released_bytes)
        *released_bytes = rb;
}

size_t ha_memory_usage(const ha_heap *h)
{
    size_t m = sizeof *h;
    m += h->tab.cap * (sizeof(ha_blk) + (h->tab.words > 1 ? h->tab.words * sizeof(uint64_t) : 0)) + h->tab.cap / 8;
    for (uint32_t l = 0; l < h->fstart.nlevels; l++)
        m += (h->fstart.nw[l] + h->fend.nw[l]) * sizeof(uint64_t);
    m += h->pending.cap * sizeof(uint64_t);
    m += h->p.ranks * sizeof(uint64_t);
    for (int k = 0; k < 64; k++) {
        m += h->lifo[k].cap * sizeof(uint64_t);
        for (uint32_t l = 0; l < h->freebits[k].nlevels; l++)
            m += h->freebits[k].nw[l] * sizeof(uint64_t);
    }
    return m;
}

size_t ha_block_bytes(const ha_heap *h, size_t more)
{
    size_t cap = h->tab.cap;
    while ((h->tab.count + more) * 2 > cap)
        cap *= 2;
    size_t rec = sizeof(ha_blk) + (h->tab.words > 1 ? h->tab.words * sizeof(uint64_t) : 0);
    size_t pend = h->pending.cap > cap / 2 ? h->pending.cap : cap / 2;
    return cap * rec + cap / 8 + pend * sizeof(uint64_t);
}
