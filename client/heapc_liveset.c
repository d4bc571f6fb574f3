/* heapc_liveset.c - libheapc: the live-offset set (the blocks this rank
 * holds, so that a free of another offset is refused here). heapc_int.h has
 * the struct. */
#include "heapc_int.h"

/* ---- live-offset set ------------------------------------------------------
 * Open addressing, linear probing, backward-shift deletion. Keys are block
 * offsets; EMPTY marks a free slot (heapc_int.h: the set's struct). */

static size_t ls_hash(uint64_t k, size_t cap)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

static int ls_find(const liveset *s, uint64_t k, size_t *slot)
{
    if (!s->cap)
        return 0;
    for (size_t i = ls_hash(k, s->cap);; i = (i + 1) & (s->cap - 1)) {
        if (s->keys[i] == EMPTY)
            return 0;
        if (s->keys[i] == k) {
            *slot = i;
            return 1;
        }
    }
}

static int ls_grow(liveset *s)
{
    size_t ncap = s->cap ? s->cap * 2 : 256;
    uint64_t *nk = malloc(ncap * sizeof *nk), *nz = malloc(ncap * sizeof *nz);
    if (!nk || !nz) {
        free(nk);
        free(nz);
        return -1;
    }
    for (size_t i = 0; i < ncap; i++)
        nk[i] = EMPTY;
    for (size_t i = 0; i < s->cap; i++) {
        if (s->keys[i] == EMPTY)
            continue;
        size_t j = ls_hash(s->keys[i], ncap);
        while (nk[j] != EMPTY)
            j = (j + 1) & (ncap - 1);
        nk[j] = s->keys[i];
        nz[j] = s->sizes[i];
    }
    free(s->keys);
    free(s->sizes);
    s->keys = nk;
    s->sizes = nz;
    s->cap = ncap;
    return 0;
}

/* 1 inserted, 0 already there, -1 out of memory. */
static int ls_insert(liveset *s, uint64_t k, uint64_t size)
{
    size_t slot;
    if (ls_find(s, k, &slot))
        return 0;
    if ((s->n + 1) * 4 > s->cap * 3 && ls_grow(s) != 0)
        return -1;
    size_t i = ls_hash(k, s->cap);
    while (s->keys[i] != EMPTY)
        i = (i + 1) & (s->cap - 1);
    s->keys[i] = k;
    s->sizes[i] = size;
    s->n++;
    return 1;
}

/* 1 removed (*size: its block size, 0 if not known), 0 not there. */
static int ls_remove(liveset *s, uint64_t k, uint64_t *size)
{
    size_t i;
    if (!ls_find(s, k, &i))
        return 0;
    if (size)
        *size = s->sizes[i];
    size_t mask = s->cap - 1;
    for (size_t j = (i + 1) & mask; s->keys[j] != EMPTY; j = (j + 1) & mask) {
        size_t h = ls_hash(s->keys[j], s->cap);
        /* Move j into the hole at i if j's home is not in (i, j]. */
        if (((j - h) & mask) >= ((j - i) & mask)) {
            s->keys[i] = s->keys[j];
            s->sizes[i] = s->sizes[j];
            i = j;
        }
    }
    s->keys[i] = EMPTY;
    s->n--;
    return 1;
}

int hci_ls_insert(liveset *s, uint64_t k, uint64_t size) { return ls_insert(s, k, size); }

int hci_ls_remove(liveset *s, uint64_t k, uint64_t *size) { return ls_remove(s, k, size); }

void hci_ls_clear(liveset *s)
{
    free(s->keys);
    free(s->sizes);
    memset(s, 0, sizeof *s);
}
