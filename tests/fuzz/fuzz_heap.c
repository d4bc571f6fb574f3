/* fuzz_heap.c - libFuzzer target: the heap wing (daemon/heap/) driven by
 * request sequences from several clients, in process: no socket, no server,
 * no dispatch; answers go to fuzz_wing.h's checking sink.
 *
 * Input: a config byte, then steps of an opcode byte (low 4 bits: what,
 * high bits: which client) and its arguments:
 *   0 attach   1 alloc   2 free   3 collect   4 force collect   5 detach
 *   6 stats    7 disconnect (the wing's conn_closed; the client comes back
 *   as a fresh peer)   8 a new uid for an unattached client (owner, root,
 *   another uid)   9 tick (the due timers: 1 ms timeouts)
 *   10 round: every client bound to a heap asks for the same size at its
 *      next allocation number, collecting when told to (how real ranks
 *      move a heap forward; a random sequence rarely does); on a heap with
 *      local_every (issue 28) a client decides what another was given
 *      without heapd and tells it with its next Alloc (replica records)
 *   11 burst: 1..64 rounds of one size, or (rarely: a count byte above
 *      239) 1..8192 (the decision log's trim at 4096 decisions), every
 *      client freeing its blocks every 2^k rounds
 *   12 commit (issue 29: a marker's tag, value and allocation number)
 * hd_heap_validate after every step, and fuzz_wing.h's checks. */
#include "fuzz_wing.h"

static hd_peer peers[NPEER];

static hd_peer *fw_peer(int i) { return &peers[i]; }
static void fw_deliver_free(int i, Heapd__Free *m) { hd_heap_free(fw_reg, &peers[i], 4, m); }

/* Request r->f from client i, straight into the wing. */
static void deliver(int i, const fw_req *r)
{
    hd_peer *p = &peers[i];
    const Heapd__Frame *f = &r->f;
    switch (f->body_case) {
    case HEAPD__FRAME__BODY_ATTACH:
        hd_heap_attach(fw_reg, p, f->id, f->attach);
        break;
    case HEAPD__FRAME__BODY_ALLOC:
        hd_heap_alloc(fw_reg, p, f->id, f->alloc);
        break;
    case HEAPD__FRAME__BODY_FREE:
        hd_heap_free(fw_reg, p, f->id, f->free);
        break;
    case HEAPD__FRAME__BODY_COLLECT:
        hd_heap_collect(fw_reg, p, f->id, f->collect);
        break;
    case HEAPD__FRAME__BODY_FORCE_COLLECT:
        hd_heap_force_collect(fw_reg, p, f->id, f->force_collect);
        break;
    case HEAPD__FRAME__BODY_DETACH:
        hd_heap_detach(fw_reg, p, f->id);
        break;
    case HEAPD__FRAME__BODY_STATS:
        hd_heap_stats(fw_reg, p, f->id, f->stats, "host", NPEER);
        break;
    case HEAPD__FRAME__BODY_COMMIT:
        hd_heap_commit(fw_reg, p, f->id, f->commit);
        break;
    default:
        break;
    }
}

/* Request r from client i, and what heapd made of the records it carried. */
static void deliver_rec(int i, const fw_req *r)
{
    uint64_t before = fw_rank_next(i);
    deliver(i, r);
    if (r->nrec)
        fw_rec_after(i, before, r->rec_from, r->rec, r->nrec, 1);
}

static void round_size(uint64_t size, int start)
{
    for (int k = 0; k < NPEER; k++) {
        int i = (start + k) % NPEER;
        fw_sync(i);
        if (!peers[i].bind.heap || fw_round_local(i, size))
            continue;
        fw_client *cl = &fw_cl[i];
        Heapd__Alloc m = HEAPD__ALLOC__INIT;
        m.seq = cl->ask_seq = cl->next_seq + cl->npend;
        m.size = cl->ask_size = size;
        m.decided_from = cl->next_seq; /* issue 28: its pending records */
        m.decided = cl->pend;
        m.n_decided = 2 * cl->npend;
        uint64_t before = fw_rank_next(i);
        hd_heap_alloc(fw_reg, &peers[i], 1, &m);
        if (m.n_decided)
            fw_rec_after(i, before, m.decided_from, m.decided, m.n_decided, 1);
        fw_validate("a round's alloc");
        fw_sync(i);
        if (peers[i].bind.heap && fw_cl[i].next_seq <= m.seq) {
            /* collect_needed, or an error: collect at that number */
            Heapd__Collect c = HEAPD__COLLECT__INIT;
            c.seq = fw_cl[i].next_seq;
            hd_heap_collect(fw_reg, &peers[i], 2, &c);
            fw_validate("a round's collect");
        }
    }
}

static void round_all(fw_input *in)
{
    uint64_t size = fw_size(in);
    round_size(size, in8(in) % NPEER);
}

static void burst(fw_input *in)
{
    uint64_t size = fw_size(in);
    uint8_t nb = in8(in);
    unsigned n = nb < 240 ? 1u + nb % 64u : 1u + in16(in) % 8192u;
    unsigned every = 1u << (in8(in) % 14);
    for (unsigned k = 0; k < n; k++) {
        round_size(size, (int)(k % NPEER));
        if ((k + 1) % every)
            continue;
        for (int i = 0; i < NPEER; i++) {
            fw_sync(i);
            if (!peers[i].bind.heap || !fw_cl[i].noffs)
                continue;
            Heapd__Free m = HEAPD__FREE__INIT;
            m.n_offsets = (size_t)fw_cl[i].noffs;
            m.offsets = fw_cl[i].offs;
            m.decided_from = fw_cl[i].next_seq; /* issue 28: its pending records first */
            m.decided = fw_cl[i].pend;
            m.n_decided = 2 * fw_cl[i].npend;
            uint64_t before = fw_rank_next(i);
            hd_heap_free(fw_reg, &peers[i], 3, &m);
            if (m.n_decided)
                fw_rec_after(i, before, m.decided_from, m.decided, m.n_decided, 1);
            fw_cl[i].noffs = fw_cl[i].nputoff = 0;
            fw_validate("a burst's free");
        }
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fw_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *what[] = {"attach",     "alloc",   "free", "collect", "force collect", "detach", "stats",
                                 "disconnect", "new uid", "tick", "round",   "burst",         "commit"};
    fw_input in = {data, size, 0};
    int fds0 = fw_count_fds();
    fw_begin(&in, fds0);
    for (int i = 0; i < NPEER; i++)
        fw_peer_init(&peers[i], i, 0);
    static fw_req r;
    while (!in_done(&in)) {
        uint8_t op = in8(&in);
        int i = (op >> 4) % NPEER;
        int k = (op & 15) % 13;
        switch (k) {
        case 7:
            hd_heap_conn_closed(fw_reg, &peers[i]);
            fw_peer_init(&peers[i], i, in8(&in));
            break;
        case 8:
            if (!peers[i].bind.heap)
                fw_peer_init(&peers[i], i, in8(&in));
            break;
        case 9:
            fw_tick();
            break;
        case 10:
            round_all(&in);
            break;
        case 11:
            burst(&in);
            break;
        case 12:
            fw_request(&in, i, 8, &r);
            deliver(i, &r);
            break;
        default:
            fw_request(&in, i, k, &r);
            deliver_rec(i, &r);
            break;
        }
        fw_validate(what[k]);
    }
    for (int i = 0; i < NPEER; i++) {
        hd_heap_conn_closed(fw_reg, &peers[i]);
        fw_validate("a disconnect at the end");
    }
    fw_end(fds0);
    return 0;
}
