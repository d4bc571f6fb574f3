/* blocks.c - the heap wing's block table (issue 29): for every decided block
 * still standing, its allocation number, offset, requested size, block size
 * and name, so that a rank re-attaching gets its live set. Open addressing
 * keyed by offset: O(1) per decision; entries of blocks that no longer
 * exist are swept when the table would grow past twice the allocator's
 * blocks (amortised). Also the text check names share with heap names.
 * Bottom floor (heap_int.h): it calls no other file of the wing. */
#include "heap_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

#define EMPTY UINT64_MAX

static size_t slot_of(uint64_t offset, size_t cap)
{
    uint64_t x = offset * UINT64_C(0x9e3779b97f4a7c15);
    return (size_t)(x ^ (x >> 29)) & (cap - 1);
}

/* The entry is still its block's. */
static bool standing(const hd_heap *h, const hh_block *e)
{
    return e->seq != EMPTY && ha_block_size(h->core, e->offset) != 0;
}

/* The slot of offset in v (cap slots): its entry, or the empty slot where
 * it goes. */
static hh_block *probe(hh_block *v, size_t cap, uint64_t offset)
{
    size_t i = slot_of(offset, cap);
    while (v[i].seq != EMPTY && v[i].offset != offset)
        i = (i + 1) & (cap - 1);
    return &v[i];
}

/* Rebuilds the table with cap slots, keeping only the entries still
 * standing. 0, or -1 out of memory (the table unchanged). */
static int rebuild(hd_heap *h, size_t cap)
{
    hh_blocks *t = &h->blocks;
    hh_block *v = malloc(cap * sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < cap; i++)
        v[i].seq = EMPTY;
    size_t n = 0;
    for (size_t i = 0; i < t->cap; i++) {
        hh_block *e = &t->v[i];
        if (e->seq == EMPTY)
            continue;
        if (!standing(h, e)) {
            if (e->name)
                t->name_bytes -= strlen(e->name) + 1;
            free(e->name);
            continue;
        }
        *probe(v, cap, e->offset) = *e;
        n++;
    }
    free(t->v);
    t->v = v;
    t->cap = cap;
    t->n = n;
    return 0;
}

/* Room for one more entry: sweeps when the table holds more than twice the
 * allocator's blocks, grows when it is half full. */
static int reserve(hd_heap *h)
{
    hh_blocks *t = &h->blocks;
    if (t->cap && t->n + 1 <= t->cap / 2)
        return 0;
    if (!t->cap)
        return rebuild(h, 64);
    ha_stats st;
    ha_get_stats(h->core, &st);
    if (t->n > 2 * (st.live_blocks + st.pending_blocks) && rebuild(h, t->cap))
        return -1;
    return t->n + 1 <= t->cap / 2 ? 0 : rebuild(h, t->cap * 2);
}

int hh_blocks_put(hd_heap *h, uint64_t seq, uint64_t offset, uint64_t size, const char *name)
{
    char *nm = NULL;
    if (name && name[0] && !(nm = strdup(name)))
        return -1;
    if (reserve(h)) {
        free(nm);
        return -1;
    }
    hh_blocks *t = &h->blocks;
    hh_block *e = probe(t->v, t->cap, offset);
    if (e->seq == EMPTY)
        t->n++;
    else if (e->name) {
        t->name_bytes -= strlen(e->name) + 1;
        free(e->name);
    }
    *e = (hh_block){offset, seq, size, nm};
    if (nm)
        t->name_bytes += strlen(nm) + 1;
    return 0;
}

const hh_block *hh_blocks_get(const hd_heap *h, uint64_t offset)
{
    const hh_blocks *t = &h->blocks;
    if (!t->cap)
        return NULL;
    const hh_block *e = probe(t->v, t->cap, offset);
    return standing(h, e) ? e : NULL;
}

static int by_seq(const void *a, const void *b)
{
    const hd_live_block *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

long hh_blocks_held(const hd_heap *h, uint32_t lidx, hd_live_block **out)
{
    const hh_blocks *t = &h->blocks;
    *out = NULL;
    size_t n = 0;
    hd_live_block *v = malloc((t->n ? t->n : 1) * sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < t->cap; i++) {
        const hh_block *e = &t->v[i];
        if (standing(h, e) && ha_rank_holds(h->core, lidx, e->offset))
            v[n++] = (hd_live_block){e->seq, e->offset, e->size, ha_block_size(h->core, e->offset), e->name};
    }
    qsort(v, n, sizeof *v, by_seq);
    *out = v;
    return (long)n;
}

/* Some local rank holds the block at offset (a live block, not pending). */
static bool held(const hd_heap *h, uint64_t offset)
{
    for (uint32_t r = 0; r < h->ap.ranks; r++)
        if (ha_rank_holds(h->core, r, offset))
            return true;
    return false;
}

int hh_blocks_chunks(const hd_heap *h, char *const *names, size_t n, uint32_t nch, uint8_t *mark, const char **missing)
{
    uint64_t cs = h->ap.chunk_size;
    for (size_t i = 0; i < n; i++) {
        bool found = false;
        for (size_t s = 0; s < h->blocks.cap; s++) {
            const hh_block *e = &h->blocks.v[s];
            if (!e->name || !standing(h, e) || strcmp(e->name, names[i]) || !held(h, e->offset))
                continue;
            found = true;
            uint64_t end = e->offset + ha_block_size(h->core, e->offset);
            for (uint64_t j = (e->offset + cs - 1) / cs; j < end / cs && j < nch; j++)
                mark[j] = 1;
        }
        if (!found) {
            *missing = names[i];
            return -1;
        }
    }
    return 0;
}

int hh_name_check(const char *name, char *why, size_t len)
{
    size_t n = strlen(name);
    if (n > HD_NAME_MAX) {
        snprintf(why, len, "is %zu bytes, over the limit of %d; use a shorter name", n, HD_NAME_MAX);
        return -1;
    }
    return hh_text_check(name, why, len);
}

uint64_t hh_blocks_bytes(const hd_heap *h) { return h->blocks.cap * sizeof(hh_block) + h->blocks.name_bytes; }

uint64_t hh_blocks_add_bytes(const hd_heap *h, const char *name)
{
    const hh_blocks *t = &h->blocks;
    uint64_t grow = !t->cap ? 64 : t->n + 1 > t->cap / 2 ? t->cap : 0; /* slots added */
    return grow * sizeof(hh_block) + (name && name[0] ? strlen(name) + 1 : 0);
}

void hh_blocks_free(hd_heap *h)
{
    hh_blocks *t = &h->blocks;
    for (size_t i = 0; i < t->cap; i++)
        if (t->v[i].seq != EMPTY)
            free(t->v[i].name);
    free(t->v);
    memset(t, 0, sizeof *t);
}

uint32_t hh_name_hash(const char *name)
{
    if (!name || !name[0])
        return 0;
    uint32_t x = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        x = (x ^ *p) * 16777619u;
    return x ? x : 1;
}

int hh_text_check(const char *s, char *why, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; p[i];) {
        int n = hu_len(p + i);
        if (!n) {
            snprintf(why, len, "is not valid UTF-8 (byte 0x%02x at offset %zu); use UTF-8 text", p[i], i);
            return -1;
        }
        if ((n == 1 && (p[i] < 0x20 || p[i] == 0x7f)) || (n == 2 && p[i] == 0xc2 && p[i + 1] < 0xa0)) {
            unsigned cp = n == 1 ? p[i] : p[i + 1];
            snprintf(why, len, "contains the control character U+%04X at offset %zu; use printable characters", cp, i);
            return -1;
        }
        i += (size_t)n;
    }
    return 0;
}
