/* chunks.c - the heap wing's chunk records: a rank's chunks created and
 * trimmed (attach's first chunks, growth and its rollback, issue 27's spares
 * after them: taken first, dropped), and the chunk
 * refs with dup'ed fds that attach and alloc replies carry (see heap.h).
 * Bottom floor (heap_int.h): it calls only the backend. */
#include "heap_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Issue 33 item 2: each chunk is an fd open in heapd, and 4 KiB chunks make
 * them cheap; 0 if `add` more for the heaps of `uid` stay within
 * max_chunk_fds_per_uid (root exempt; 0: no limit), else -1 with why. */
int hh_chunk_fds_check(const hd_registry *r, uid_t uid, uint64_t add, char *why, size_t len)
{
    uint64_t lim = r->cfg.max_chunk_fds_per_uid, have = 0;
    if (!lim || uid == 0)
        return 0;
    for (const hd_heap *h = r->heaps; h; h = h->next)
        if (h->owner == uid)
            for (uint32_t q = 0; q < h->world_size; q++)
                have += h->ranks[q].nchunks + h->ranks[q].nspare; /* issue 27: spares are fds too */
    if (have + add <= lim)
        return 0;
    snprintf(why, len,
             "uid %ld's heaps would hold %llu chunks on this node (now %llu), over max_chunk_fds_per_uid = %llu "
             "(each chunk is an fd open in heapd); use a larger chunk_size, or ask for a larger "
             "max_chunk_fds_per_uid",
             (long)uid, (unsigned long long)(have + add), (unsigned long long)have, (unsigned long long)lim);
    return -1;
}

int hh_rank_reserve(hd_rank *k, uint32_t n, char *err, size_t errlen)
{
    if (n <= k->capchunks)
        return 0;
    uint32_t nc = k->capchunks ? k->capchunks : 4;
    while (nc < n)
        nc *= 2;
    hb_chunk *c = realloc(k->chunks, nc * sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory for chunk records");
        return -1;
    }
    k->chunks = c;
    k->capchunks = nc;
    return 0;
}

int hh_rank_add_chunks(hd_heap *h, hd_rank *k, uint32_t upto, char *err, size_t errlen)
{
    if (hh_rank_reserve(k, upto + k->nspare, err, errlen))
        return -1;
    while (k->nchunks < upto) {
        if (k->nspare) { /* issue 27: the spare after the chunks becomes the next one */
            k->nspare--;
            k->nchunks++;
            continue;
        }
        int rc = hb_chunk_create(h->reg->be, k->device, h->ap.chunk_size, &k->chunks[k->nchunks], err, errlen);
        if (rc)
            return rc;
        k->nchunks++;
    }
    return 0;
}

uint32_t hh_rank_drop_spares(hd_heap *h, hd_rank *k, uint32_t keep)
{
    uint32_t n = 0;
    for (; k->nspare > keep; n++)
        hb_chunk_release(h->reg->be, &k->chunks[k->nchunks + --k->nspare]);
    return n;
}

void hh_rank_trim_chunks(hd_heap *h, hd_rank *k, uint32_t keep)
{
    hh_rank_drop_spares(h, k, 0);
    while (k->nchunks > keep)
        hb_chunk_release(h->reg->be, &k->chunks[--k->nchunks]);
}

void hh_chunk_msg_free(chunk_msg *m, bool close_fds)
{
    if (close_fds)
        for (size_t i = 0; i < m->n; i++)
            if (m->fds[i] >= 0)
                close(m->fds[i]);
    free(m->refs);
    free(m->fds);
    memset(m, 0, sizeof *m);
}

/* Fills m with chunk_msg (heap_int.h) for [from, to), holes (absent
 * chunks, fd -1) left out. Returns 0, or -1 if out of memory / fds. */
int hh_chunk_msg_build(hd_heap *h, uint32_t from, uint32_t to, chunk_msg *m)
{
    memset(m, 0, sizeof *m);
    if (to <= from)
        return 0;
    size_t max = (size_t)(to - from) * h->world_size;
    m->refs = calloc(max, sizeof *m->refs);
    m->fds = calloc(max, sizeof *m->fds);
    if (!m->refs || !m->fds) {
        hh_chunk_msg_free(m, false);
        return -1;
    }
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (!k->joined)
            continue;
        for (uint32_t j = from; j < to && j < k->nchunks; j++) {
            if (k->chunks[j].fd < 0)
                continue; /* issue 30: a hole (trimmed, not refilled yet) */
            int fd = dup(k->chunks[j].fd);
            if (fd < 0) {
                hh_chunk_msg_free(m, true);
                return -1;
            }
            m->refs[m->n].rank = q;
            m->refs[m->n].index = j;
            m->fds[m->n] = fd;
            m->n++;
        }
    }
    return 0;
}
