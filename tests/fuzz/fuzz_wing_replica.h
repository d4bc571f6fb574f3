/* fuzz_wing_replica.h - part of fuzz_wing.h (included once, where it
 * stands, after the clients' state and the sink it uses): issue 28's replica
 * records, what a client sends as its replica's decisions and what it learns
 * heapd applied. A file of its own only to keep fuzz_wing.h readable. */
#ifndef HEAPD_FUZZ_WING_REPLICA_H
#define HEAPD_FUZZ_WING_REPLICA_H

/* ---- issue 28: replica records ----------------------------------------------- */

/* Heapd's next allocation number for client i's rank (the harness reads it
 * to see which records heapd applied); UINT64_MAX: bound to no heap. */
static uint64_t fw_rank_next(int i)
{
    const hd_peer *p = fw_peer(i);
    return p->bind.heap ? p->bind.heap->ranks[p->bind.rank].next_seq : UINT64_MAX;
}

/* The decision another client of i's heap was given for allocation seq,
 * its asked size known: 1 and *d, else 0. */
static int fw_known(int i, uint64_t seq, fw_dec *d)
{
    fw_sync(i);
    for (int j = 0; j < NPEER && fw_cl[i].heap; j++) {
        fw_sync(j);
        if (j == i || fw_cl[j].heap != fw_cl[i].heap)
            continue;
        for (int k = 0; k < fw_cl[j].ndec; k++)
            if (fw_cl[j].dec[k].seq == seq && fw_cl[j].dec[k].ask) {
                *d = fw_cl[j].dec[k];
                return 1;
            }
    }
    return 0;
}

/* A round's allocation of `size` bytes by client i on a heap with
 * local_every: decided without heapd (a pending record, 1) when another
 * client was given that allocation number and it is no multiple of
 * local_every, as libheapc's replica would; else 0 (ask heapd). */
static int fw_round_local(int i, uint64_t size)
{
    fw_client *c = &fw_cl[i];
    uint64_t n = c->next_seq + c->npend;
    fw_dec d;
    if (!c->le || n % c->le == 0 || c->npend >= NPEND || !fw_known(i, n, &d) || d.ask != size)
        return 0;
    c->pend[2 * c->npend] = size;
    c->pend[2 * c->npend + 1] = d.off;
    c->npend++;
    return 1;
}

/* After client i's request that carried records v[0..nv) from `from`, its
 * rank at `before` then: the records heapd applied (below its next number
 * now) are the heap's decisions (checked against the other clients', then
 * kept as the client's). trusted 0: what heapd got may differ from v (a cut
 * or changed frame): only the client's next number is taken. */
static void fw_rec_after(int i, uint64_t before, uint64_t from, const uint64_t *v, size_t nv, int trusted)
{
    fw_sync(i);
    uint64_t after = fw_rank_next(i);
    fw_client *c = &fw_cl[i];
    c->npend = 0;
    if (before == UINT64_MAX || after == UINT64_MAX)
        return;
    TRACE("%d: records from %llu: %zu values, the rank %llu -> %llu\n", i, (unsigned long long)from, nv,
          (unsigned long long)before, (unsigned long long)after);
    for (size_t k = 0; trusted && k + 1 < nv; k += 2) {
        uint64_t s = from + k / 2;
        if (s < before || s >= after)
            continue;
        fw_dec d = {s, v[k + 1], 0, v[k]}, o;
        if (fw_known(i, s, &o)) {
            CHECK(o.off == d.off && o.ask == d.ask,
                  "heapd applied a record of allocation %llu (%llu bytes at %llu); another client asked %llu, "
                  "was given %llu",
                  (unsigned long long)s, (unsigned long long)d.ask, (unsigned long long)d.off,
                  (unsigned long long)o.ask, (unsigned long long)o.off);
            d.size = o.size;
        }
        c->dec[c->nputdec++ % NDEC] = d;
        c->ndec = c->ndec < NDEC ? c->ndec + 1 : NDEC;
        c->offs[c->nputoff++ % NOFF] = d.off;
        c->noffs = c->noffs < NOFF ? c->noffs + 1 : NOFF;
    }
    c->next_seq = after;
}

/* Client i's pending records told heapd on a Free of nothing (what libheapc
 * sends before a Collect, Commit or Detach). */
static void fw_flush(int i)
{
    fw_sync(i);
    fw_client *c = &fw_cl[i];
    if (!c->npend)
        return;
    Heapd__Free m = HEAPD__FREE__INIT;
    m.decided_from = c->next_seq;
    m.decided = c->pend;
    m.n_decided = 2 * c->npend;
    uint64_t before = fw_rank_next(i);
    fw_deliver_free(i, &m);
    fw_rec_after(i, before, m.decided_from, m.decided, m.n_decided, 1);
}

#endif
