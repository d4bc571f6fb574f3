/* fuzz_wing.h - what fuzz_heap.c and fuzz_dispatch.c share: an in-process
 * heap wing (registry, host backend, the fuzzer's own libuv loop, no
 * socket), a checking reply sink, the decoding of fuzz bytes into requests,
 * and the checks after every step. Header only: each fuzzer is one program.
 *
 * Input: one config byte (quotas, the heap defaults, and with its top bit
 * an fd budget: RLIMIT_NOFILE lowered to the fds open now plus 4..67 for the
 * input, so that chunk, status page and dup failures happen for real), then
 * steps. Each step
 * is an opcode byte and its arguments, read with in8/in16/in64 (past the end:
 * zeros). Requests come from NPEER clients (hostile ones: any order, any
 * seq, any size, names of 0..355 bytes of any content, ranks and world sizes
 * out of range, parameters that do not divide, 1 ms timeouts). Issue 28:
 * heaps with local_every, Allocs and Frees carrying replica records (see
 * fw_records; rounds' records are true: a lagging client decides what a
 * peer was given, and tells heapd with its next Alloc, as libheapc does).
 *
 * Checked, aborting with a message (libFuzzer saves the input):
 *   - hd_heap_validate after every step (heap_int.h's invariants);
 *   - every reply: an Error has a known code and a 1..1499-byte message;
 *     every fd handed to the sink is open (then the sink closes it); an
 *     AttachReply's fds are its chunks plus the status page; an allocation
 *     lies inside the mapped extent, and two clients bound to the same heap
 *     get the same offset and size for the same allocation number (and had
 *     asked for the same size); a replica record heapd applied (its rank's
 *     next allocation number moved past it) is the decision every other
 *     client of the heap was given for that number; a HeapOp (AllocReply,
 *     CollectReply) is at the allocation it answers, offsets ascending;
 *   - after the input: every client gone and the registry destroyed, no
 *     libuv handle is left and the process has the fds it had before (no
 *     chunk, status page or timer leaked).
 * Plus ASan and UBSan on everything (-fno-sanitize-recover).
 * FUZZ_WING_TRACE=1 in the environment prints every reply (to see how far
 * an input gets: build/fuzz/fuzz_heap FILE); FUZZ_WING_NO_LOCAL=1: no Attach
 * asks for local_every (records still go, to heaps that refuse them). */
#ifndef HEAPD_FUZZ_WING_H
#define HEAPD_FUZZ_WING_H

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "heap.h"
#include "log.h"
#ifdef __clang__ /* heap_int.h silences a gcc warning clang does not know */
#pragma clang diagnostic ignored "-Wunknown-warning-option"
#endif
#include "heap_int.h" /* issue 28: a rank's next allocation number, to see which records heapd applied */

#define NPEER    6
#define NDEC     32
#define NOFF     32
#define MAXTICKS 3
#define NPEND    32   /* issue 28: records a client keeps before it tells heapd */
#define NREC     4100 /* records one request may carry (over HW_DECIDED_MAX) */

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "fuzz_wing: check failed: %s: ", #cond);                                                   \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

typedef struct fw_input {
    const uint8_t *d;
    size_t n, i;
} fw_input;

static inline uint8_t in8(fw_input *in) { return in->i < in->n ? in->d[in->i++] : 0; }
static inline uint16_t in16(fw_input *in) { return (uint16_t)(in8(in) | in8(in) << 8); }
static inline uint32_t in32(fw_input *in) { return (uint32_t)in16(in) | (uint32_t)in16(in) << 16; }
static inline uint64_t in64(fw_input *in) { return (uint64_t)in32(in) | (uint64_t)in32(in) << 32; }
static inline bool in_done(const fw_input *in) { return in->i >= in->n; }

/* What a client learned: its decisions since it bound to its heap (size:
 * the block's, 0 unknown; ask: the size asked for, 0 unknown). */
typedef struct fw_dec {
    uint64_t seq, off, size, ask;
} fw_dec;

typedef struct fw_client {
    const hd_heap *heap; /* the binding the records below belong to */
    uint64_t epoch;      /* its heap's (a heap made where a gone one was is another) */
    fw_dec dec[NDEC];    /* the last NDEC (ndec of them; nputdec put) */
    int ndec, nputdec;
    uint64_t offs[NOFF]; /* the last NOFF offsets it was given (for frees) */
    int noffs, nputoff;
    uint64_t next_seq;
    uint32_t le;                /* issue 28: the heap's local_every (AttachReply) */
    uint64_t ask_seq, ask_size; /* its last Alloc (ask_seq UINT64_MAX: none known) */
    uint64_t pend[2 * NPEND];   /* records from next_seq on, not yet told heapd */
    size_t npend;
} fw_client;

static uv_loop_t fw_loop;
static hb_backend *fw_be;
static hd_registry *fw_reg;
static fw_client fw_cl[NPEER];
static int fw_ticks;
static struct rlimit fw_nofile; /* the limit to restore after an input */
static int fw_trace, fw_no_local;

#define TRACE(...)                                                                                                     \
    do {                                                                                                               \
        if (fw_trace)                                                                                                  \
            fprintf(stderr, __VA_ARGS__);                                                                              \
    } while (0)
/* The fuzzer's: client i's peer as the wing sees it now; a Free from client
 * i, delivered as its other requests are. */
static hd_peer *fw_peer(int i);
static void fw_deliver_free(int i, Heapd__Free *m);

static int fw_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    CHECK(d, "opendir /proc/self/fd");
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/* Forgets client i's records when its binding changed. */
static void fw_sync(int i)
{
    const hd_heap *h = fw_peer(i)->bind.heap;
    if (fw_cl[i].heap != h || (h && fw_cl[i].epoch != h->epoch)) {
        memset(&fw_cl[i], 0, sizeof fw_cl[i]);
        fw_cl[i].heap = h;
        fw_cl[i].epoch = h ? h->epoch : 0;
        fw_cl[i].ask_seq = UINT64_MAX;
    }
}

static int fw_index(const hd_peer *p)
{
    int i = (int)(intptr_t)p->data;
    CHECK(i >= 0 && i < NPEER, "reply to an unknown peer %d", i);
    return i;
}

static void fw_take_fds(const int *fds, size_t n, const char *what)
{
    for (size_t k = 0; k < n; k++) {
        CHECK(fds[k] >= 0 && fcntl(fds[k], F_GETFD) != -1, "%s: fd %zu of %zu (%d) is not open", what, k, n, fds[k]);
        close(fds[k]);
    }
}

static void s_error(hd_peer *p, uint64_t id, Heapd__ErrCode code, const char *msg, const hd_asym_out *asym)
{
    TRACE("%d: error %d: %s\n", fw_index(p), (int)code, msg);
    (void)id;
    CHECK(protobuf_c_enum_descriptor_get_value(&heapd__err_code__descriptor, (int)code), "unknown error code %d",
          (int)code);
    CHECK(msg && *msg && strlen(msg) < 1500, "error %d: empty or overlong message", (int)code);
    /* Issue 29: a name asymmetry may have equal sizes; issue 28: a replica's
     * record that heapd decided otherwise names its rank twice. */
    CHECK(!asym || (code == HEAPD__ERR_CODE__ERR_ASYMMETRY && asym->nranks == HD_ASYM_RANKS &&
                    (asym->with_names || asym->sizes[0] != asym->sizes[1] || asym->ranks[0] == asym->ranks[1])),
          "error %d: asymmetry fields on another error, or not two ranks of different sizes or names", (int)code);
}

static void s_attach(hd_peer *p, uint64_t id, const hd_attach_out *a)
{
    int i = fw_index(p);
    (void)id;
    TRACE("%d: attached, world %u, mapped %llu, next %llu\n", i, a->world_size, (unsigned long long)a->mapped,
          (unsigned long long)a->next_seq);
    CHECK(a->nfds == a->nchunks + (a->status_index >= 0), "AttachReply: %zu fds for %zu chunks (status %d)", a->nfds,
          a->nchunks, a->status_index);
    CHECK(a->status_index < 0 || (size_t)a->status_index == a->nchunks, "status page at %d of %zu", a->status_index,
          a->nfds);
    for (size_t k = 0; k < a->nchunks; k++)
        CHECK(a->chunks[k].rank < a->world_size, "chunk of rank %u in a world of %u", a->chunks[k].rank, a->world_size);
    CHECK(a->ap->chunk_size && a->mapped % a->ap->chunk_size == 0, "mapped %llu, chunk %llu",
          (unsigned long long)a->mapped, (unsigned long long)a->ap->chunk_size);
    CHECK(a->local_every <= HD_LOCAL_EVERY_MAX, "AttachReply: local_every %u", a->local_every);
    fw_take_fds(a->fds, a->nfds, "AttachReply");
    fw_sync(i);
    fw_cl[i].next_seq = a->next_seq;
    fw_cl[i].le = a->local_every;
}

/* Issue 28: a HeapOp at allocation `at` (UINT64_MAX: any), offsets ascending. */
static void fw_check_op(const hd_op_out *op, uint64_t at, const char *what)
{
    if (!op)
        return;
    CHECK(at == UINT64_MAX || op->at == at, "%s: a HeapOp at %llu", what, (unsigned long long)op->at);
    for (size_t k = 1; k < op->n; k++)
        CHECK(op->offsets[k - 1] < op->offsets[k], "%s: HeapOp offsets %llu then %llu", what,
              (unsigned long long)op->offsets[k - 1], (unsigned long long)op->offsets[k]);
}

static void s_alloc(hd_peer *p, uint64_t id, const hd_alloc_out *a)
{
    int i = fw_index(p);
    (void)id;
    TRACE("%d: alloc %llu: %s offset %llu size %llu mapped %llu\n", i, (unsigned long long)a->seq,
          a->collect_needed ? "collect needed," : "", (unsigned long long)a->offset, (unsigned long long)a->block_size,
          (unsigned long long)a->mapped);
    fw_take_fds(a->fds, a->nchunks, "AllocReply");
    fw_check_op(a->op, a->seq, "AllocReply");
    fw_sync(i);
    if (a->collect_needed)
        return;
    uint64_t ask = a->seq == fw_cl[i].ask_seq ? fw_cl[i].ask_size : 0;
    CHECK(a->block_size && a->offset + a->block_size <= a->mapped && a->offset < a->offset + a->block_size,
          "allocation %llu: [%llu, +%llu) outside the %llu mapped bytes", (unsigned long long)a->seq,
          (unsigned long long)a->offset, (unsigned long long)a->block_size, (unsigned long long)a->mapped);
    /* Every client of this heap got, or gets, the same decision. */
    for (int j = 0; j < NPEER; j++) {
        if (j == i)
            continue;
        fw_sync(j);
        if (fw_cl[j].heap != fw_cl[i].heap)
            continue;
        for (int k = 0; k < fw_cl[j].ndec; k++)
            if (fw_cl[j].dec[k].seq == a->seq) {
                const fw_dec *d = &fw_cl[j].dec[k];
                CHECK(d->off == a->offset && (!d->size || d->size == a->block_size),
                      "allocation %llu: offset %llu size %llu to one client, %llu %llu to another",
                      (unsigned long long)a->seq, (unsigned long long)a->offset, (unsigned long long)a->block_size,
                      (unsigned long long)d->off, (unsigned long long)d->size);
                CHECK(!d->ask || !ask || d->ask == ask, "allocation %llu: asked for %llu and %llu, both given",
                      (unsigned long long)a->seq, (unsigned long long)ask, (unsigned long long)d->ask);
            }
    }
    fw_client *c = &fw_cl[i];
    c->dec[c->nputdec++ % NDEC] = (fw_dec){a->seq, a->offset, a->block_size, ask};
    c->ndec = c->ndec < NDEC ? c->ndec + 1 : NDEC;
    c->offs[c->nputoff++ % NOFF] = a->offset;
    c->noffs = c->noffs < NOFF ? c->noffs + 1 : NOFF;
    c->next_seq = a->seq + 1;
}

static void s_free(hd_peer *p, uint64_t id, uint32_t accepted)
{
    TRACE("%d: free: %u accepted\n", fw_index(p), accepted);
    (void)id;
}
static void s_collect(hd_peer *p, uint64_t id, const hd_collect_out *o)
{
    TRACE("%d: collect %llu: %llu blocks\n", fw_index(p), (unsigned long long)o->collects,
          (unsigned long long)o->blocks);
    CHECK(!o->omitted || !o->op, "CollectReply: ops omitted and given");
    fw_check_op(o->op, UINT64_MAX, "CollectReply");
    (void)id;
}
static void s_detach(hd_peer *p, uint64_t id)
{
    TRACE("%d: detached\n", fw_index(p));
    (void)id;
}
static void s_force(hd_peer *p, uint64_t id, uint64_t at)
{
    TRACE("%d: forced collect at %llu\n", fw_index(p), (unsigned long long)at);
    (void)id;
}

static void s_stats(hd_peer *p, uint64_t id, const hd_stats_out *s)
{
    TRACE("%d: stats: %zu heaps\n", fw_index(p), s->nheaps);
    (void)id;
    for (size_t k = 0; k < s->nheaps; k++) {
        const hd_heap_info *h = &s->heaps[k];
        CHECK(h->name && *h->name, "a heap without a name in Stats");
        CHECK(h->n_ranks == h->world_size, "heap \"%s\": %zu rank records for %u ranks", h->name, h->n_ranks,
              h->world_size);
        CHECK(h->free_bytes <= h->mapped, "heap \"%s\": %llu free of %llu mapped", h->name,
              (unsigned long long)h->free_bytes, (unsigned long long)h->mapped);
    }
}

static void s_commit(hd_peer *p, uint64_t id, uint64_t value, uint64_t generation)
{
    TRACE("%d: committed %llu (generation %llu)\n", fw_index(p), (unsigned long long)value,
          (unsigned long long)generation);
    (void)id;
}

static void s_drop(hd_peer *p, uint64_t id, uint64_t released)
{
    TRACE("%d: dropped %llu bytes\n", fw_index(p), (unsigned long long)released);
    (void)id;
}

static const hd_reply_ops fw_sink = {.error = s_error,
                                     .attach = s_attach,
                                     .alloc = s_alloc,
                                     .free = s_free,
                                     .collect = s_collect,
                                     .detach = s_detach,
                                     .force = s_force,
                                     .stats = s_stats,
                                     .drop = s_drop,
                                     .commit = s_commit};

static int fw_privileged(const hd_peer *p, long gid)
{
    (void)gid;
    return p->uid == 0;
}

/* A fresh peer for client i (pid and uid from the input). */
static void fw_peer_init(hd_peer *p, int i, uint8_t b)
{
    static const uid_t uids[4] = {4242, 4242, 0, 7};
    memset(p, 0, sizeof *p);
    p->pid = 1000 + i;
    p->uid = uids[b & 3];
    p->privileged = fw_privileged;
    p->out = &fw_sink;
    p->data = (void *)(intptr_t)i;
}

static void fw_validate(const char *after)
{
    char why[512];
    CHECK(hd_heap_validate(fw_reg, why, sizeof why) == 0, "hd_heap_validate after %s: %s", after, why);
}

/* Once per process: the loop (libuv opens a process-wide pipe with the
 * first one: before any fd count), the host backend, no log. */
static void fw_init(void)
{
    char err[256];
    hd_log_set_level(-1);
    fw_trace = getenv("FUZZ_WING_TRACE") != NULL;
    fw_no_local = getenv("FUZZ_WING_NO_LOCAL") != NULL;
    CHECK(uv_loop_init(&fw_loop) == 0, "uv_loop_init");
    CHECK(hb_open("host", &fw_be, err, sizeof err) == 0, "hb_open: %s", err);
}

/* A registry for one input; its config from one byte (fds: the process's
 * fds now). */
static void fw_begin(fw_input *in, int fds)
{
    uint8_t b = in8(in);
    CHECK(getrlimit(RLIMIT_NOFILE, &fw_nofile) == 0, "getrlimit");
    if (b & 0x80) {
        struct rlimit l = fw_nofile;
        l.rlim_cur = (rlim_t)fds + 4 + (in8(in) & 63);
        if (l.rlim_cur < fw_nofile.rlim_cur)
            CHECK(setrlimit(RLIMIT_NOFILE, &l) == 0, "setrlimit");
    }
    hd_config cfg;
    hd_config_defaults(&cfg);
    cfg.chunk_size = (uint64_t)64 << 10 << (b & 3); /* 64K..512K */
    cfg.va_size = (uint64_t)16 << 20;
    cfg.min_block = (uint64_t)256 << ((b >> 2) & 3);
    cfg.collect_timeout_ms = 60000;
    cfg.quota_heap = b & 0x10 ? (uint64_t)4 << 20 : 0;
    cfg.quota_uid = b & 0x20 ? (uint64_t)6 << 20 : 0;
    cfg.policy = b & 0x40 ? HA_POLICY_SEED : HA_POLICY_COALESCE;
    CHECK(hd_registry_create(&fw_loop, fw_be, &cfg, &fw_reg) == 0, "hd_registry_create");
    memset(fw_cl, 0, sizeof fw_cl);
    fw_ticks = 0;
}

static void fw_count_handle(uv_handle_t *h, void *arg)
{
    (void)h;
    ++*(int *)arg;
}

/* After the clients are gone: the registry destroyed, nothing left. */
static void fw_end(int fds_before)
{
    hd_registry_destroy(fw_reg);
    fw_reg = NULL;
    CHECK(setrlimit(RLIMIT_NOFILE, &fw_nofile) == 0, "setrlimit");
    for (int k = 0; k < 4; k++)
        uv_run(&fw_loop, UV_RUN_NOWAIT);
    int nh = 0;
    uv_walk(&fw_loop, fw_count_handle, &nh);
    CHECK(nh == 0, "%d libuv handle(s) left after hd_registry_destroy", nh);
    int fds = fw_count_fds();
    CHECK(fds == fds_before, "%d fds before the input, %d after (a chunk or status page leaked)", fds_before, fds);
}

/* Runs the timers that are due after ~2 ms (a collect or attach timeout
 * of 1 ms): at most MAXTICKS per input, so an input stays fast. */
static void fw_tick(void)
{
    if (fw_ticks++ >= MAXTICKS)
        return;
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
    uv_run(&fw_loop, UV_RUN_NOWAIT);
}

#include "fuzz_wing_replica.h" /* issue 28: replica records */

/* ---- requests from bytes ---------------------------------------------------- */

/* A heap name: mostly one of three (so clients meet), else 0..355 bytes of
 * the input (any byte: NUL ends it early). */
static char *fw_name(fw_input *in, char *buf, size_t cap)
{
    static const char *names[3] = {"a", "b", "job.7"};
    uint8_t b = in8(in);
    if (b < 224) {
        snprintf(buf, cap, "%s", names[b % 3]);
        return buf;
    }
    size_t len = in8(in) + (b & 1 ? 100u : 0u);
    if (len >= cap)
        len = cap - 1;
    for (size_t k = 0; k < len; k++)
        buf[k] = (char)in8(in);
    buf[len] = 0;
    return buf;
}

/* A size: small, a power of two and its neighbours, or anything. */
static uint64_t fw_size(fw_input *in)
{
    uint8_t b = in8(in);
    switch (b >> 6) {
    case 0:
        return in16(in);
    case 1: {
        unsigned sh = b & 63;
        int d = (int)(in8(in) % 3) - 1;
        return ((uint64_t)1 << sh) + (uint64_t)(int64_t)d;
    }
    case 2:
        return (uint64_t)(b & 63) << 12;
    default:
        return in64(in);
    }
}

static uint32_t fw_world(fw_input *in)
{
    uint8_t b = in8(in);
    if (b < 240)
        return 1 + b % 4;
    return b & 1 ? in16(in) : in32(in);
}

/* Storage for one decoded request. */
typedef struct fw_req {
    Heapd__Frame f;
    Heapd__Attach at;
    Heapd__HeapParams hp;
    Heapd__Alloc al;
    Heapd__Free fr;
    Heapd__Collect co;
    Heapd__ForceCollect fc;
    Heapd__Stats st;
    Heapd__Detach de;
    Heapd__Hello he;
    Heapd__Commit cm;
    uint64_t offs[8];
    char name[356];
    char job[16];
    uint64_t rec[2 * NREC + 1]; /* issue 28: the Alloc's or Free's records */
    size_t nrec;
    uint64_t rec_from;
} fw_req;

/* Issue 28: the records client i's Alloc or Free carries (r->rec[0..nrec)
 * from r->rec_from), by selector b: below 128 its pending ones (often
 * none); 128..191 true ones: what other clients were given from its next
 * number on (b & 8: then one guessed, past its last block); 192..223 the
 * same after 1..8 sent again; 224..255 hostile: any start (gaps, resends,
 * anything), any count (odd; or near and over the limit), any sizes and
 * offsets. Returns the allocation number after them (hostile: the client's). */
static uint64_t fw_records(fw_input *in, int i, uint8_t b, fw_req *r)
{
    fw_client *c = &fw_cl[i];
    size_t n = 0;
    r->rec_from = c->next_seq;
    if (b < 128) {
        memcpy(r->rec, c->pend, c->npend * 2 * sizeof *r->rec);
        r->nrec = 2 * c->npend;
        return c->next_seq + c->npend;
    }
    if (b >= 224) {
        uint8_t f = in8(in), nb = in8(in);
        r->rec_from = f < 64 ? c->next_seq + (f & 7) : f < 128 ? c->next_seq - (f & 7) : in64(in);
        n = nb < 250 ? nb % 9u : nb < 255 ? 2u * 4096 - 2 + (nb - 250u) : in16(in) % (2u * NREC);
        for (size_t k = 0; k < n; k++) {
            uint8_t x = in8(in);
            r->rec[k] = x < 200 ? (uint64_t)x << (k % 2 ? 12 : 8) : k % 2 ? in64(in) : fw_size(in);
        }
        r->nrec = n;
        return c->next_seq;
    }
    uint64_t s = c->next_seq, back = b >= 192 ? 1u + (b & 7u) : 0;
    for (r->rec_from = s > back ? s - back : 0; r->rec_from + n / 2 < s; n += 2) {
        r->rec[n] = in8(in) + 1u; /* heapd skips those: anything */
        r->rec[n + 1] = in64(in);
    }
    fw_dec d;
    for (; n < 2 * NPEND && (!c->le || s % c->le) && fw_known(i, s, &d); s++, n += 2) {
        r->rec[n] = d.ask;
        r->rec[n + 1] = d.off;
    }
    if (b & 8 && (!c->le || s % c->le)) {
        const fw_dec *l = c->ndec ? &c->dec[(c->nputdec - 1) % NDEC] : NULL;
        r->rec[n] = l && l->ask ? l->ask : 4096;
        r->rec[n + 1] = l ? l->off + l->size : 0;
        n += 2;
    }
    r->nrec = n;
    return r->rec_from + n / 2;
}

/* An Attach into r->at (r->hp its parameters, when it has some). */
static void fw_req_attach(fw_input *in, fw_req *r)
{
    heapd__attach__init(&r->at);
    r->at.heap = fw_name(in, r->name, sizeof r->name);
    r->at.world_size = fw_world(in);
    uint8_t b = in8(in);
    r->at.rank = b < 200 ? b % 4 : in32(in);
    uint8_t pb = in8(in);
    if (pb & 1) {
        heapd__heap_params__init(&r->hp);
        if (pb & 2)
            r->hp.chunk_size = pb & 4 ? fw_size(in) : (uint64_t)64 << 10 << (in8(in) & 3);
        if (pb & 8)
            r->hp.initial_size = fw_size(in);
        if (pb & 16)
            r->hp.va_size = pb & 4 ? fw_size(in) : (uint64_t)1 << (20 + in8(in) % 6);
        if (pb & 32)
            r->hp.min_block = fw_size(in);
        uint8_t pol = in8(in);
        r->hp.policy = (Heapd__Policy)(pol % 3);
        if (pol & 0x80) /* issue 28 */
            r->hp.local_every = pol & 0x40 ? in32(in) : 2u + (pol >> 2 & 15u);
        r->hp.collect_timeout_ms = pb & 64 ? 1 : (pb & 128 ? in32(in) : 0);
        r->at.params = &r->hp;
    }
    uint8_t lb = in8(in);
    r->at.local_size = lb < 250 ? 0 : in32(in);
    if (lb >= 200 && lb < 250) { /* issue 28: local_every 2..16 */
        if (!r->at.params) {
            heapd__heap_params__init(&r->hp);
            r->at.params = &r->hp;
        }
        r->hp.local_every = 2u + lb % 15u;
    }
    if (lb == 255) {
        snprintf(r->job, sizeof r->job, "j%u", in8(in));
        r->at.job = r->job;
    }
    if (fw_no_local)
        r->hp.local_every = 0;
    r->f.body_case = HEAPD__FRAME__BODY_ATTACH;
    r->f.attach = &r->at;
}

/* An Alloc from client i into r->al, maybe carrying records (issue 28). */
static void fw_req_alloc(fw_input *in, int i, fw_req *r)
{
    fw_client *c = &fw_cl[i];
    heapd__alloc__init(&r->al);
    uint8_t b = in8(in);
    uint64_t next = fw_records(in, i, in8(in), r);
    r->al.decided_from = r->rec_from;
    r->al.decided = r->rec;
    r->al.n_decided = r->nrec;
    r->al.seq = b < 200 ? next : b < 230 ? next + (b & 3) - 1 : in64(in);
    r->al.size = fw_size(in);
    c->ask_seq = r->al.seq;
    c->ask_size = r->al.size;
    if (b >= 180 && b < 200) /* issue 29: a name, valid or not */
        r->al.name = fw_name(in, r->name, sizeof r->name);
    r->f.body_case = HEAPD__FRAME__BODY_ALLOC;
    r->f.alloc = &r->al;
}

/* A Free from client i into r->fr, maybe carrying records (issue 28). */
static void fw_req_free(fw_input *in, int i, fw_req *r)
{
    fw_client *c = &fw_cl[i];
    heapd__free__init(&r->fr);
    uint8_t nb = in8(in);
    size_t n = (nb & 0x7f) % 9;
    fw_records(in, i, nb & 0x80 ? in8(in) : 0, r); /* issue 28 */
    r->fr.decided_from = r->rec_from;
    r->fr.decided = r->rec;
    r->fr.n_decided = r->nrec;
    for (size_t k = 0; k < n; k++) {
        uint8_t b = in8(in);
        if (b < 200 && c->noffs)
            r->offs[k] = c->offs[b % c->noffs];
        else
            r->offs[k] = b < 230 ? (uint64_t)in16(in) << 8 : in64(in);
    }
    r->fr.n_offsets = n;
    r->fr.offsets = r->offs;
    r->f.body_case = HEAPD__FRAME__BODY_FREE;
    r->f.free = &r->fr;
}

/* The next request for client i into r->f (its body_case, id). kind: 0
 * attach, 1 alloc, 2 free, 3 collect, 4 force, 5 detach, 6 stats, 7 hello,
 * 8 commit (issue 29). */
static void fw_request(fw_input *in, int i, int kind, fw_req *r)
{
    if (kind == 3 || kind == 5 || kind == 8)
        fw_flush(i);
    fw_sync(i);
    fw_client *c = &fw_cl[i];
    heapd__frame__init(&r->f);
    r->f.id = in8(in);
    r->nrec = 0;
    switch (kind) {
    case 0:
        fw_req_attach(in, r);
        break;
    case 1:
        fw_req_alloc(in, i, r);
        break;
    case 2:
        fw_req_free(in, i, r);
        break;
    case 3: {
        heapd__collect__init(&r->co);
        uint8_t b = in8(in);
        r->co.seq = b < 220 ? c->next_seq : in64(in);
        r->co.stream_waiting = in8(in);
        r->co.device_waits_avoided = in8(in);
        r->f.body_case = HEAPD__FRAME__BODY_COLLECT;
        r->f.collect = &r->co;
        break;
    }
    case 4:
        heapd__force_collect__init(&r->fc);
        r->fc.heap = fw_name(in, r->name, sizeof r->name);
        r->f.body_case = HEAPD__FRAME__BODY_FORCE_COLLECT;
        r->f.force_collect = &r->fc;
        break;
    case 5:
        heapd__detach__init(&r->de);
        r->f.body_case = HEAPD__FRAME__BODY_DETACH;
        r->f.detach = &r->de;
        break;
    case 6: {
        heapd__stats__init(&r->st);
        uint8_t b = in8(in);
        r->st.heap = b & 1 ? fw_name(in, r->name, sizeof r->name) : (char *)"";
        r->f.body_case = HEAPD__FRAME__BODY_STATS;
        r->f.stats = &r->st;
        break;
    }
    case 8: {
        heapd__commit__init(&r->cm);
        uint8_t b = in8(in);
        r->cm.tag = b < 128 ? (char *)(b & 1 ? "step" : "epoch") : fw_name(in, r->name, sizeof r->name);
        r->cm.value = in8(in) & 3;
        r->cm.seq = b & 64 ? in64(in) : c->next_seq;
        r->f.body_case = HEAPD__FRAME__BODY_COMMIT;
        r->f.commit = &r->cm;
        break;
    }
    default:
        heapd__hello__init(&r->he);
        r->he.version = in8(in) < 250 ? HEAPD__CONST__PROTOCOL_VERSION : in32(in);
        r->he.client = (char *)"fuzz";
        r->f.body_case = HEAPD__FRAME__BODY_HELLO;
        r->f.hello = &r->he;
        break;
    }
}

#endif
