/* heapc_names.c - libheapc, issue 29: the named blocks this rank holds, the
 * attach reply's live set (with its LiveBatch frames) and commit markers,
 * heapc_lookup, heapc_commit and the calls that read what a re-attach gave.
 * heapc_int.h has the context and its rules. */
#include "heapc_int.h"

/* ---- the named blocks: ascending offset ------------------------------------ */

/* Debug builds (HEAPD_DEBUG): heapc_int.h's equations for `named` (strictly
 * ascending offsets, named_n <= named_cap) and `live_blocks` (ascending
 * seq); aborts on a violation (a libheapc bug). */
static void names_validate(const heapc *c)
{
#ifdef HEAPD_DEBUG
    if (c->named_n > c->named_cap)
        abort();
    for (size_t i = 1; i < c->named_n; i++)
        if (c->named[i - 1].offset >= c->named[i].offset)
            abort();
    for (size_t i = 1; i < c->live_n; i++)
        if (c->live_blocks[i - 1].seq > c->live_blocks[i].seq)
            abort();
#else
    (void)c;
#endif
}

/* Index of the first entry at or above offset. */
static size_t named_pos(const heapc *c, uint64_t offset)
{
    size_t lo = 0, hi = c->named_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->named[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int hci_names_add(heapc *c, const char *name, uint64_t seq, uint64_t offset, uint64_t size, uint64_t block_size)
{
    size_t i = named_pos(c, offset);
    char *dup = strdup(name);
    if (!dup)
        return -1;
    if (i < c->named_n && c->named[i].offset == offset) { /* a block of an earlier attach, named again */
        free(c->named[i].name);
    } else {
        if (c->named_n == c->named_cap) {
            size_t cap = c->named_cap ? c->named_cap * 2 : 16;
            named_block *n = realloc(c->named, cap * sizeof *n);
            if (!n) {
                free(dup);
                return -1;
            }
            c->named = n;
            c->named_cap = cap;
        }
        memmove(c->named + i + 1, c->named + i, (c->named_n - i) * sizeof *c->named);
        c->named_n++;
    }
    c->named[i] = (named_block){dup, seq, offset, size, block_size};
    names_validate(c);
    return 0;
}

void hci_names_forget(heapc *c, uint64_t offset)
{
    size_t i = named_pos(c, offset);
    if (i >= c->named_n || c->named[i].offset != offset)
        return;
    free(c->named[i].name);
    memmove(c->named + i, c->named + i + 1, (c->named_n - i - 1) * sizeof *c->named);
    c->named_n--;
    names_validate(c);
}

void hci_names_clear(heapc *c)
{
    for (size_t i = 0; i < c->named_n; i++)
        free(c->named[i].name);
    free(c->named);
    c->named = NULL;
    c->named_n = c->named_cap = 0;
    for (size_t i = 0; i < c->live_n; i++)
        if (c->live_blocks[i].name[0])
            free((char *)c->live_blocks[i].name);
    free(c->live_blocks);
    c->live_blocks = NULL;
    c->live_n = 0;
    for (size_t i = 0; i < c->markers_n; i++)
        free(c->markers[i].tag);
    free(c->markers);
    c->markers = NULL;
    c->markers_n = 0;
    c->generation = 0;
    c->resumed = 0;
}

/* ---- what the attach reply gave -------------------------------------------- */

static marker *marker_find(heapc *c, const char *tag)
{
    for (size_t i = 0; i < c->markers_n; i++)
        if (strcmp(c->markers[i].tag, tag) == 0)
            return &c->markers[i];
    return NULL;
}

/* Sets (or adds) the marker of tag. 0, or -1 out of memory. */
static int marker_set(heapc *c, const char *tag, uint64_t value, uint64_t seq)
{
    marker *m = marker_find(c, tag);
    if (!m) {
        char *t = strdup(tag);
        marker *n = t ? realloc(c->markers, (c->markers_n + 1) * sizeof *n) : NULL;
        if (!n) {
            free(t);
            return -1;
        }
        c->markers = n;
        m = &c->markers[c->markers_n++];
        m->tag = t;
    }
    m->value = value;
    m->seq = seq;
    return 0;
}

/* The live set (ascending seq: heapd's order), the named blocks among it,
 * its offsets in c->live, the markers, the generation. A resumed rank's live
 * set is complete: frees of other offsets are refused here. */
static int names_attach_live(heapc *c, const Heapd__AttachReply *ar)
{
    if (ar->n_live) {
        c->live_blocks = calloc(ar->n_live, sizeof *c->live_blocks);
        if (!c->live_blocks)
            return -1;
    }
    for (size_t i = 0; i < ar->n_live; i++) {
        const Heapd__LiveBlock *b = ar->live[i];
        const char *nm = b->name && *b->name ? b->name : "";
        heapc_block *o = &c->live_blocks[c->live_n];
        *o = (heapc_block){b->seq, b->offset, b->size, b->block_size, ""};
        if (*nm && !(o->name = strdup(nm)))
            return -1;
        c->live_n++;
        if (*nm && hci_names_add(c, nm, b->seq, b->offset, b->size, b->block_size) != 0)
            return -1;
        if (hci_ls_insert(&c->live, b->offset, b->block_size) < 0)
            return -1;
    }
    return 0;
}

static int block_cmp(const void *a, const void *b)
{
    uint64_t x = ((const heapc_block *)a)->seq, y = ((const heapc_block *)b)->seq;
    return x < y ? -1 : x > y;
}

int hci_names_attach(heapc *c, const Heapd__AttachReply *ar)
{
    c->generation = ar->generation;
    c->resumed = ar->resumed;
    if (names_attach_live(c, ar) != 0)
        return hci_set_err(c, HEAPC_EOOM, "out of memory keeping the %zu live blocks of heap %s's attach", ar->n_live,
                           c->heap);
    for (size_t i = 0; i < ar->n_markers; i++) {
        const Heapd__Marker *m = ar->markers[i];
        if (m->tag && *m->tag && marker_set(c, m->tag, m->value, m->seq) != 0)
            return hci_set_err(c, HEAPC_EOOM, "out of memory keeping heap %s's commit markers", c->heap);
    }
    /* heapd sends ascending seq; heapc_live promises it whatever came. */
    if (c->live_n > 1)
        qsort(c->live_blocks, c->live_n, sizeof *c->live_blocks, block_cmp);
    if (ar->resumed)
        c->live_complete = c->live.n == ar->n_live;
    names_validate(c);
    return HEAPC_OK;
}

/* ---- LiveBatch frames ------------------------------------------------------- */

int hci_live_add(live_acc *a, Heapd__LiveBatch *b)
{
    if (a->n + b->n_blocks > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 1024;
        while (cap < a->n + b->n_blocks)
            cap *= 2;
        Heapd__LiveBlock **n = realloc(a->b, cap * sizeof *n);
        if (!n)
            return -1;
        a->b = n;
        a->cap = cap;
    }
    /* Taken from the frame: its free leaves them (n_blocks 0). */
    memcpy(a->b + a->n, b->blocks, b->n_blocks * sizeof *b->blocks);
    a->n += b->n_blocks;
    b->n_blocks = 0;
    return 0;
}

int hci_live_merge(live_acc *a, Heapd__AttachReply *ar)
{
    if (!a->n)
        return 0;
    Heapd__LiveBlock **all = malloc((a->n + ar->n_live) * sizeof *all);
    if (!all)
        return -1;
    memcpy(all, a->b, a->n * sizeof *all);
    if (ar->n_live)
        memcpy(all + a->n, ar->live, ar->n_live * sizeof *all);
    free(ar->live); /* the default allocator's (malloc), as heapd__frame__free_unpacked frees it */
    ar->live = all;
    ar->n_live += a->n;
    free(a->b);
    memset(a, 0, sizeof *a);
    return 0;
}

void hci_live_free(live_acc *a)
{
    for (size_t i = 0; i < a->n; i++)
        heapd__live_block__free_unpacked(a->b[i], NULL);
    free(a->b);
    memset(a, 0, sizeof *a);
}

/* ---- the API ----------------------------------------------------------------- */

int heapc_lookup(heapc *c, const char *name, uint64_t *offset, uint64_t *size)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!c->attached) {
        rc = hci_set_err(c, HEAPC_ESTATE, "heapc_lookup: not attached to a heap; call heapc_attach");
    } else {
        const named_block *best = NULL;
        for (size_t i = 0; name && *name && i < c->named_n; i++)
            if (strcmp(c->named[i].name, name) == 0 && (!best || c->named[i].seq > best->seq))
                best = &c->named[i];
        if (!best) {
            rc = hci_set_err(c, HEAPC_ENOTFOUND,
                             "heapc_lookup: rank %" PRIu32 " holds no block named \"%s\" in heap %s (%zu named "
                             "blocks held); allocate it with heapc_alloc_named",
                             atomic_load(&c->view)->rank, name ? name : "", c->heap, c->named_n);
        } else {
            if (offset)
                *offset = best->offset;
            if (size)
                *size = best->size;
            rc = hci_ok(c);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int commit_locked(heapc *c, const char *tag, uint64_t value)
{
    if (!c->attached)
        return hci_set_err(c, HEAPC_ESTATE, "heapc_commit: not attached to a heap; call heapc_attach");
    size_t tl = tag ? strlen(tag) : 0;
    if (tl == 0 || tl > HEAPC_TAG_MAX)
        return hci_set_err(c, HEAPC_EINVAL, "heapc_commit: the tag is %zu bytes; give 1 to %d", tl, HEAPC_TAG_MAX);
    int rc = hci_flush_all_locked(c);
    if (rc != HEAPC_OK)
        return rc;
    Heapd__Commit cm = HEAPD__COMMIT__INIT;
    cm.tag = (char *)tag;
    cm.value = value;
    cm.seq = c->next_seq;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_COMMIT;
    req.commit = &cm;
    Heapd__Frame *rep;
    hw_frame raw;
    rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_COMMIT_REPLY, &rep, &raw);
    if (rc != HEAPC_OK)
        return rc;
    uint64_t v = rep->commit_reply ? rep->commit_reply->value : value;
    if (rep->commit_reply && rep->commit_reply->generation)
        c->generation = rep->commit_reply->generation;
    hci_rpc_done(rep, &raw);
    if (marker_set(c, tag, v, cm.seq) != 0)
        return hci_set_err(c, HEAPC_EOOM,
                           "heapc_commit: heapd recorded %s = %" PRIu64 " but this context is out of memory "
                           "keeping it (heapc_committed will not see it)",
                           tag, v);
    return HEAPC_OK;
}

int heapc_commit(heapc *c, const char *tag, uint64_t value)
{
    pthread_mutex_lock(&c->mu);
    int rc = commit_locked(c, tag, value);
    if (rc == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_committed(heapc *c, const char *tag, uint64_t *value)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    const marker *m = tag ? marker_find(c, tag) : NULL;
    if (!c->attached)
        rc = hci_set_err(c, HEAPC_ESTATE, "heapc_committed: not attached to a heap; call heapc_attach");
    else if (!m)
        rc = hci_set_err(c, HEAPC_ENOTFOUND, "heapc_committed: heap %s has no commit marker \"%s\" (%zu markers)",
                         c->heap, tag ? tag : "", c->markers_n);
    else {
        if (value)
            *value = m->value;
        rc = hci_ok(c);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

uint64_t heapc_generation(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t g = c->attached ? c->generation : 0;
    pthread_mutex_unlock(&c->mu);
    return g;
}

int heapc_resumed(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int r = c->attached && c->resumed;
    pthread_mutex_unlock(&c->mu);
    return r;
}

size_t heapc_live(heapc *c, heapc_block *out, size_t max)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->attached ? c->live_n : 0;
    for (size_t i = 0; out && i < n && i < max; i++)
        out[i] = c->live_blocks[i];
    pthread_mutex_unlock(&c->mu);
    return n;
}
