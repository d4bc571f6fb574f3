/* commit.c - the heap wing's commit markers (issue 29): Commit is collective
 * over the heap's local ranks, like Collect, with its own state and timer
 * (the heap's collect timeout), so that it never disturbs a collect. When
 * every local rank committed the same tag, value and allocation number, the
 * heap records the marker tag = (value, seq) and every rank gets
 * CommitReply{value, generation}. Middle floor (heap_int.h). */
#include "heap_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* A heap's commit in progress. Invariant: active <=> waiting > 0 <=> the
 * heap's commit_left is set; waiting == number of ranks with in_commit. */
struct hh_commit {
    uv_timer_t timer; /* first: the close callback frees the struct */
    hd_heap *h;
    bool active;
    char tag[HD_TAG_MAX + 1];
    uint64_t value, seq;
    uint32_t first; /* the rank that committed first */
    uint32_t waiting;
};

static void commit_closed(uv_handle_t *t) { free(t->data); }

/* The heap's commit_gone: the heap is destroyed. */
static void commit_gone(hd_heap *h)
{
    struct hh_commit *s = h->commit;
    h->commit = NULL;
    h->commit_left = NULL;
    uv_timer_stop(&s->timer);
    uv_close((uv_handle_t *)&s->timer, commit_closed);
}

/* Ends the commit in progress: every waiting rank gets code and msg (code
 * 0: its CommitReply). */
static void commit_end(hd_heap *h, Heapd__ErrCode code, const char *msg)
{
    struct hh_commit *s = h->commit;
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (!k->in_commit)
            continue;
        k->in_commit = false;
        if (!k->conn)
            continue;
        if (code)
            hd_peer_error(k->conn, k->commit_id, code, "%s", msg);
        else
            k->conn->out->commit(k->conn, k->commit_id, s->value, h->generation);
    }
    s->active = false;
    s->waiting = 0;
    h->commit_left = NULL;
    uv_timer_stop(&s->timer);
}

/* The heap's commit_left while a commit waits: rank `rank`'s client left. */
static void commit_rank_left(hd_heap *h, uint32_t rank, bool clean)
{
    char msg[512];
    snprintf(msg, sizeof msg, "commit \"%s\" on heap \"%s\" failed: rank %u (pid %ld) %s while the others waited",
             h->commit->tag, h->name, rank, (long)h->ranks[rank].pid, clean ? "detached" : "disconnected");
    commit_end(h, HEAPD__ERR_CODE__ERR_PEER_GONE, msg);
}

static bool in_commit(const hd_rank *k) { return k->in_commit; }

static void commit_timeout(uv_timer_t *t)
{
    struct hh_commit *s = t->data;
    hd_heap *h = s->h;
    if (!s->active)
        return;
    char missing[400], msg[1000];
    hh_ranks_not_in(h, in_commit, missing, sizeof missing);
    snprintf(msg, sizeof msg,
             "commit \"%s\" on heap \"%s\" at allocation %llu timed out after %u ms: rank(s) %s never committed; "
             "every rank must commit the same tag at the same point",
             s->tag, h->name, (unsigned long long)s->seq, h->timeout_ms, missing);
    hd_warn("%s", msg);
    commit_end(h, HEAPD__ERR_CODE__ERR_TIMEOUT, msg);
}

/* h's commit state, made at its first Commit. NULL if out of memory. */
static struct hh_commit *commit_state(hd_heap *h)
{
    if (h->commit)
        return h->commit;
    struct hh_commit *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->h = h;
    uv_timer_init(h->reg->loop, &s->timer);
    s->timer.data = s;
    h->commit = s;
    h->commit_gone = commit_gone;
    return s;
}

/* The marker of tag, or where a new one goes (NULL: no room). */
static hd_marker *marker_slot(hd_heap *h, const char *tag)
{
    for (uint32_t i = 0; i < h->nmarkers; i++)
        if (!strcmp(h->markers[i].tag, tag))
            return &h->markers[i];
    if (h->nmarkers == HD_MARKERS_MAX)
        return NULL;
    if (!h->markers && !(h->markers = calloc(HD_MARKERS_MAX, sizeof *h->markers)))
        return NULL;
    return &h->markers[h->nmarkers];
}

/* Every local rank committed: the marker is recorded and every rank
 * answered. */
static void commit_done(hd_heap *h)
{
    struct hh_commit *s = h->commit;
    hd_marker *mk = marker_slot(h, s->tag);
    if (!mk) {
        commit_end(h, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory recording the commit marker");
        return;
    }
    if (mk == &h->markers[h->nmarkers])
        h->nmarkers++;
    snprintf(mk->tag, sizeof mk->tag, "%s", s->tag);
    mk->value = s->value;
    mk->seq = s->seq;
    hd_debug("heap \"%s\": marker \"%s\" = %llu at allocation %llu", h->name, s->tag, (unsigned long long)s->value,
             (unsigned long long)s->seq);
    commit_end(h, 0, NULL);
}

/* The request's own checks (tag, seq, nodes, room). 0, or -1 once the
 * peer got the error. */
static int commit_check(hd_heap *h, hd_peer *c, uint64_t id, const Heapd__Commit *m)
{
    uint32_t rank = hd_peer_binding(c)->rank;
    const hd_rank *k = &h->ranks[rank];
    char why[200];
    size_t len = m->tag ? strlen(m->tag) : 0;
    if (h->local_size < h->world_size)
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "commit markers do not cross nodes yet; heap \"%s\" spans nodes (local_size %u < world_size "
                      "%u): keep markers in the job (e.g. a checkpoint's step) for such heaps",
                      h->name, h->local_size, h->world_size);
    else if (!len || len > HD_TAG_MAX)
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "commit tag must be 1 to %d bytes (it is %zu)", HD_TAG_MAX,
                      len);
    else if (hh_text_check(m->tag, why, sizeof why))
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "commit tag %s", why);
    else if (k->in_commit)
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "rank %u is already waiting in a commit", rank);
    else if (m->seq != k->next_seq)
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL,
                      "commit at allocation %llu, but rank %u is at allocation %llu", (unsigned long long)m->seq, rank,
                      (unsigned long long)k->next_seq);
    else if (!marker_slot(h, m->tag))
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_QUOTA,
                      "heap \"%s\" has %d commit markers, the most it keeps; commit under one of its tags again "
                      "(a marker per tag: its latest value)",
                      h->name, HD_MARKERS_MAX);
    else
        return 0;
    return -1;
}

/* A joined rank without a client: the peer gets ERR_PEER_GONE naming it
 * (and so does a commit in progress). Returns true if so. */
static bool peer_gone(hd_heap *h, hd_peer *c, uint64_t id)
{
    char msg[512];
    if (!hh_unconnected_rank(h, "commit", "it must re-attach first", msg, sizeof msg))
        return false;
    hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PEER_GONE, "%s", msg);
    if (h->commit && h->commit->active)
        commit_end(h, HEAPD__ERR_CODE__ERR_PEER_GONE, msg);
    return true;
}

/* The rank's commit differs from the one in progress: it and every waiting
 * rank get ERR_ASYMMETRY naming both. */
static void commit_asym(hd_heap *h, hd_peer *c, uint64_t id, const Heapd__Commit *m)
{
    struct hh_commit *s = h->commit;
    uint32_t rank = hd_peer_binding(c)->rank;
    char msg[1000];
    snprintf(msg, sizeof msg,
             "asymmetric commit on heap \"%s\": rank %u committed \"%s\" = %llu at allocation %llu, rank %u \"%s\" = "
             "%llu at allocation %llu; every rank must commit the same tag and value at the same point (no marker "
             "was recorded)",
             h->name, s->first, s->tag, (unsigned long long)s->value, (unsigned long long)s->seq, rank, m->tag,
             (unsigned long long)m->value, (unsigned long long)m->seq);
    hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_ASYMMETRY, "%s", msg);
    commit_end(h, HEAPD__ERR_CODE__ERR_ASYMMETRY, msg);
}

void hd_heap_commit(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Commit *m)
{
    (void)r;
    hd_binding *b = hd_peer_binding(c);
    hd_heap *h = hh_formed_heap(c, id, "commit");
    if (!h)
        return;
    if (hh_poison_check(h, c, id) || commit_check(h, c, id, m) || peer_gone(h, c, id))
        return;
    struct hh_commit *s = commit_state(h);
    if (!s) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
        return;
    }
    if (s->active && (strcmp(s->tag, m->tag) || s->value != m->value || s->seq != m->seq)) {
        commit_asym(h, c, id, m);
        return;
    }
    if (!s->active) {
        s->active = true;
        snprintf(s->tag, sizeof s->tag, "%s", m->tag);
        s->value = m->value;
        s->seq = m->seq;
        s->first = b->rank;
        h->commit_left = commit_rank_left;
        uv_update_time(h->reg->loop);
        uv_timer_start(&s->timer, commit_timeout, h->timeout_ms, 0);
    }
    hd_rank *k = &h->ranks[b->rank];
    k->in_commit = true;
    k->commit_id = id;
    if (++s->waiting == h->local_size)
        commit_done(h);
}
