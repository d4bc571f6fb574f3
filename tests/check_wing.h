/* check_wing.h - the fixture tests/check_names.c and tests/check_commit.c
 * share (issue 29): a recording reply sink that keeps the latest answer of
 * each peer (live sets and markers copied), setup and teardown over
 * check_wing_fixture.h (a libuv loop, the host backend, a registry), and
 * requests built from a few arguments. Header only, like
 * check_util.h: each test is one program. */
#ifndef HEAPD_CHECK_WING_H
#define HEAPD_CHECK_WING_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NPEER 4
#include "check_wing_fixture.h"
#include "store.h"

/* ---- the recording sink: the latest answer of each peer ----------------- */

typedef enum {
    R_NONE,
    R_ERROR,
    R_ATTACH,
    R_ALLOC,
    R_FREE,
    R_COLLECT,
    R_DETACH,
    R_STATS,
    R_COMMIT,
    R_RELEASE,
    R_RESTORE,
    R_TRIM
} rec_kind;

typedef struct rec {
    rec_kind kind;
    Heapd__ErrCode code;
    char msg[1500];
    hd_asym_out asym;
    char names[HD_ASYM_RANKS][300]; /* asym.names[i] copied ("": NULL) */
    bool named[HD_ASYM_RANKS];
    uint64_t seq, offset, next_seq, generation, value;
    bool resumed, collect_needed, trim_needed, rel_some;
    hd_live_block *live; /* names copied into live_names */
    char (*live_names)[256];
    size_t nlive;
    hd_marker markers[70];
    size_t nmarkers;
    uint32_t stat_markers;
    uint64_t bookkeeping;
    /* Issue 30 (tests/check_release.c): ReleaseReply's bytes; an attach's
     * and a restore's chunk fds, kept open (closed by the next record);
     * a Stats reply's state and resident bytes. */
    uint64_t released, saved, restored;
    bool att_released;
    int fds[64];
    size_t nfds;
    uint32_t state;
    uint64_t resident, host_copy;
    uint64_t spare, mapped; /* issue 27 (tests/check_spare.c): Stats' spare_bytes, mapped, grow_ahead */
    uint32_t grow_ahead;
    /* Issue 30 (tests/check_trim.c): TrimReply; an alloc's chunks (count,
     * first index); a Stats reply's trims and trimmed bytes. */
    uint64_t trimmed, trims;
    uint32_t trim_chunks[64];
    size_t ntrim, alloc_nchunks;
    uint32_t alloc_first;
    int count; /* answers so far */
} rec;

static rec recs[NPEER];

static rec *record(hd_peer *p, rec_kind kind)
{
    rec *r = &recs[(intptr_t)p->data];
    int count = r->count;
    for (size_t i = 0; i < r->nfds; i++)
        close(r->fds[i]);
    free(r->live);
    free(r->live_names);
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->count = count + 1;
    return r;
}

static inline void close_all(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

static inline void s_error(hd_peer *p, uint64_t id, Heapd__ErrCode code, const char *msg, const hd_asym_out *asym)
{
    (void)id;
    rec *r = record(p, R_ERROR);
    r->code = code;
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    if (asym) {
        r->asym = *asym;
        for (int i = 0; i < HD_ASYM_RANKS; i++) {
            r->named[i] = asym->names[i] != NULL;
            snprintf(r->names[i], sizeof r->names[i], "%s", asym->names[i] ? asym->names[i] : "");
            r->asym.names[i] = NULL;
        }
    }
}

static inline void s_attach(hd_peer *p, uint64_t id, const hd_attach_out *a)
{
    (void)id;
    rec *r = record(p, R_ATTACH);
    r->next_seq = a->next_seq;
    r->generation = a->generation;
    r->resumed = a->resumed;
    r->nlive = a->nlive;
    r->live = calloc(a->nlive + 1, sizeof *r->live);
    r->live_names = calloc(a->nlive + 1, sizeof *r->live_names);
    ck_assert(r->live && r->live_names);
    for (size_t i = 0; i < a->nlive; i++) {
        r->live[i] = a->live[i];
        snprintf(r->live_names[i], sizeof r->live_names[i], "%s", a->live[i].name ? a->live[i].name : "");
        r->live[i].name = a->live[i].name ? r->live_names[i] : NULL;
    }
    ck_assert_uint_le(a->nmarkers, 70);
    if (a->nmarkers)
        memcpy(r->markers, a->markers, a->nmarkers * sizeof *a->markers);
    r->nmarkers = a->nmarkers;
    r->att_released = a->released;
    size_t keep = a->nchunks < 64 ? a->nchunks : 64;
    memcpy(r->fds, a->fds, keep * sizeof *a->fds);
    r->nfds = keep;
    close_all(a->fds + keep, a->nfds - keep);
}

static inline void s_alloc(hd_peer *p, uint64_t id, const hd_alloc_out *a)
{
    (void)id;
    rec *r = record(p, R_ALLOC);
    r->seq = a->seq;
    r->offset = a->offset;
    r->collect_needed = a->collect_needed;
    r->trim_needed = a->trim_needed;
    r->mapped = a->mapped;
    r->alloc_nchunks = a->nchunks;
    r->alloc_first = a->nchunks ? a->new_chunks[0].index : 0;
    close_all(a->fds, a->nchunks);
}

static inline void s_free(hd_peer *p, uint64_t id, uint32_t accepted) { (void)id, (void)accepted, record(p, R_FREE); }

static inline void s_collect(hd_peer *p, uint64_t id, const hd_collect_out *o)
{
    (void)id, (void)o;
    record(p, R_COLLECT);
}

static inline void s_detach(hd_peer *p, uint64_t id) { (void)id, record(p, R_DETACH); }

static inline void s_force(hd_peer *p, uint64_t id, uint64_t at_seq) { (void)p, (void)id, (void)at_seq; }

static inline void s_stats(hd_peer *p, uint64_t id, const hd_stats_out *s)
{
    (void)id;
    rec *r = record(p, R_STATS);
    ck_assert_uint_eq(s->nheaps, 1);
    r->generation = s->heaps[0].generation;
    r->stat_markers = s->heaps[0].markers;
    r->bookkeeping = s->heaps[0].bookkeeping_bytes;
    r->state = s->heaps[0].state;
    r->resident = s->heaps[0].resident_bytes;
    r->host_copy = s->heaps[0].host_copy_bytes;
    r->spare = s->heaps[0].spare_bytes;
    r->mapped = s->heaps[0].mapped;
    r->grow_ahead = s->heaps[0].grow_ahead;
    r->trims = s->heaps[0].trims;
    r->trimmed = s->heaps[0].trimmed_bytes;
}

static inline void s_trim(hd_peer *p, uint64_t id, const hd_trim_out *o)
{
    (void)id;
    rec *r = record(p, R_TRIM);
    r->trimmed = o->trimmed_bytes;
    r->mapped = o->mapped;
    r->ntrim = o->nchunks < 64 ? o->nchunks : 64;
    memcpy(r->trim_chunks, o->chunks, r->ntrim * sizeof *o->chunks);
}

static inline void s_release(hd_peer *p, uint64_t id, const hd_release_out *o)
{
    (void)id;
    rec *r = record(p, R_RELEASE);
    r->released = o->released;
    r->saved = o->saved;
    r->rel_some = o->some;
    r->ntrim = o->nchunks < 64 ? o->nchunks : 64; /* issue 30: the named blocks' chunks */
    memcpy(r->trim_chunks, o->chunks, r->ntrim * sizeof *o->chunks);
}

static inline void s_restore(hd_peer *p, uint64_t id, const hd_restore_out *o)
{
    (void)id;
    rec *r = record(p, R_RESTORE);
    r->restored = o->restored_bytes;
    size_t keep = o->nchunks < 64 ? o->nchunks : 64;
    memcpy(r->fds, o->fds, keep * sizeof *o->fds);
    r->nfds = keep;
    close_all(o->fds + keep, o->nchunks - keep);
}

static inline void s_commit(hd_peer *p, uint64_t id, uint64_t value, uint64_t generation)
{
    (void)id;
    rec *r = record(p, R_COMMIT);
    r->value = value;
    r->generation = generation;
}

static const hd_reply_ops sink = {.error = s_error,
                                  .attach = s_attach,
                                  .alloc = s_alloc,
                                  .free = s_free,
                                  .collect = s_collect,
                                  .detach = s_detach,
                                  .force = s_force,
                                  .stats = s_stats,
                                  .commit = s_commit,
                                  .release = s_release,
                                  .restore = s_restore,
                                  .trim = s_trim}; /* drop: tests/check_persist.c */

/* ---- fixture ------------------------------------------------------------ */

static uint32_t persist_s;      /* the heaps' HeapParams.persist_s (0: none) */
static uint64_t trim_threshold; /* issue 30: their HeapParams.trim_threshold (0: heapd.conf's) */

static inline void setup(void)
{
    memset(recs, 0, sizeof recs);
    persist_s = 0;
    trim_threshold = 0;
    hd_config cfg;
    hd_config_defaults(&cfg);
    ckw_start(&cfg, &sink, 2000);
}

static inline void teardown(void)
{
    for (int i = 0; i < NPEER; i++) {
        for (size_t j = 0; j < recs[i].nfds; j++)
            close(recs[i].fds[j]);
        recs[i].nfds = 0;
    }
    ckw_stop();
    for (int i = 0; i < NPEER; i++) {
        free(recs[i].live);
        free(recs[i].live_names);
    }
}

static const rec *last(int peer) { return &recs[peer]; }

/* Peer attaches as rank of heap "h" (2 ranks, chunk chunk_mb MiB). */
static inline void attach_p(int peer, uint32_t rank, uint64_t chunk_mb, uint64_t va_mb, uint32_t timeout_ms)
{
    Heapd__HeapParams p = HEAPD__HEAP_PARAMS__INIT;
    p.persist_s = persist_s;
    p.trim_threshold = trim_threshold;
    p.chunk_size = chunk_mb << 20;
    p.initial_size = chunk_mb << 20;
    p.va_size = va_mb << 20;
    p.min_block = 4096;
    p.collect_timeout_ms = timeout_ms;
    Heapd__Attach m = HEAPD__ATTACH__INIT;
    m.heap = (char *)"h";
    m.world_size = 2;
    m.rank = rank;
    m.params = &p;
    hd_heap_attach(reg, &peers[peer], 1, &m);
    validate();
}

static inline void attach(int peer, uint32_t rank) { attach_p(peer, rank, 1, 64, 200); }

/* Peers 0 and 1 attach as ranks 0 and 1: the heap forms. */
static inline void formed(void)
{
    attach(0, 0);
    attach(1, 1);
    ck_assert_int_eq(last(0)->kind, R_ATTACH);
    ck_assert_int_eq(last(1)->kind, R_ATTACH);
    ck_assert(!last(1)->resumed);
    ck_assert_uint_eq(last(1)->generation, 0);
    ck_assert_uint_eq(last(1)->nlive, 0);
}

static inline void alloc_n(int peer, uint64_t seq, uint64_t size, const char *name)
{
    Heapd__Alloc m = HEAPD__ALLOC__INIT;
    m.seq = seq;
    m.size = size;
    if (name)
        m.name = (char *)name;
    hd_heap_alloc(reg, &peers[peer], seq, &m);
    validate();
}

/* Both ranks allocate seq; the offset. */
static inline uint64_t alloc2(uint64_t seq, uint64_t size, const char *name)
{
    alloc_n(0, seq, size, name);
    ck_assert_msg(last(0)->kind == R_ALLOC, "%s", last(0)->msg);
    alloc_n(1, seq, size, name);
    ck_assert_msg(last(1)->kind == R_ALLOC, "%s", last(1)->msg);
    ck_assert_uint_eq(last(0)->offset, last(1)->offset);
    return last(0)->offset;
}

static inline void free1(int peer, uint64_t offset)
{
    Heapd__Free m = HEAPD__FREE__INIT;
    m.n_offsets = 1;
    m.offsets = &offset;
    hd_heap_free(reg, &peers[peer], 0, &m);
    validate();
    ck_assert_msg(last(peer)->kind == R_FREE, "%s", last(peer)->msg);
}

static inline void collect(int peer, uint64_t seq)
{
    Heapd__Collect m = HEAPD__COLLECT__INIT;
    m.seq = seq;
    hd_heap_collect(reg, &peers[peer], seq, &m);
    validate();
}

static inline void commit(int peer, const char *tag, uint64_t value, uint64_t seq)
{
    Heapd__Commit m = HEAPD__COMMIT__INIT;
    m.tag = (char *)tag;
    m.value = value;
    m.seq = seq;
    hd_heap_commit(reg, &peers[peer], 7, &m);
    validate();
}

static inline void stats(int peer)
{
    Heapd__Stats m = HEAPD__STATS__INIT;
    hd_heap_stats(reg, &peers[peer], 3, &m, "host", 0);
    ck_assert_int_eq(last(peer)->kind, R_STATS);
}

static inline void is_error(int peer, Heapd__ErrCode code, const char *part)
{
    const rec *r = last(peer);
    ck_assert_msg(r->kind == R_ERROR && r->code == code, "peer %d: kind %d code %d: %s", peer, r->kind, r->code,
                  r->msg);
    ck_assert_msg(strstr(r->msg, part), "peer %d: \"%s\" lacks \"%s\"", peer, r->msg, part);
}

/* Rank 1's client (peer 1) crashes: disconnects without Detach. */
static inline void crash1(void)
{
    hd_heap_conn_closed(reg, &peers[1]);
    validate();
}

#endif
