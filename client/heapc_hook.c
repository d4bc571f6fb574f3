/* heapc_hook.c - libheapc: the map hook (issue 32, heapc.h:
 * heapc_set_map_hook). The events name runs of this rank's own chunks, so
 * that a layer above (libheapc_nccl) registers exactly the memory mapped and
 * lets go of it before it is unmapped. heapc_int.h has the context. */
#include "heapc_int.h"

/* This rank's own address space, or NULL (not attached, no spaces). */
static hm_space *own_space(heapc *c, uint32_t rank)
{
    if (!c->spaces || !c->local_index || rank == UINT32_MAX)
        return NULL;
    int32_t i = c->local_index[rank];
    return i < 0 || !c->spaces[i].base ? NULL : &c->spaces[i];
}

static int slot_on(const hm_space *s, const uint8_t *mark, uint32_t j)
{
    return hm_is_mapped(s, j) && (!mark || mark[j]);
}

/* Calls the hook once with every run of marked, mapped slots; when the
 * arrays cannot be allocated, once per run (same runs, several calls). */
static void emit_runs(heapc *c, const hm_space *s, int event, const uint8_t *mark)
{
    size_t n = 0;
    for (uint32_t j = 0; j < s->nchunks; j++)
        n += slot_on(s, mark, j) && (j == 0 || !slot_on(s, mark, j - 1));
    if (n == 0)
        return;
    uint64_t one_off, one_size;
    uint64_t *offs = malloc(n * sizeof *offs), *sizes = malloc(n * sizeof *sizes);
    size_t k = 0;
    for (uint32_t j = 0; j < s->nchunks;) {
        if (!slot_on(s, mark, j)) {
            j++;
            continue;
        }
        uint32_t e = j;
        while (e < s->nchunks && slot_on(s, mark, e))
            e++;
        one_off = (uint64_t)j * s->chunk_size;
        one_size = (uint64_t)(e - j) * s->chunk_size;
        if (offs && sizes) {
            offs[k] = one_off;
            sizes[k] = one_size;
            k++;
        } else {
            c->map_fn(c->map_arg, event, (char *)s->base, &one_off, &one_size, 1);
        }
        j = e;
    }
    if (offs && sizes)
        c->map_fn(c->map_arg, event, (char *)s->base, offs, sizes, k);
    free(offs);
    free(sizes);
}

void hci_hook_emit(heapc *c, uint32_t rank, int event, const uint8_t *mark)
{
    if (!c->map_fn)
        return;
    const hm_space *s = own_space(c, rank);
    if (s)
        emit_runs(c, s, event, mark);
}

void hci_hook_drop(heapc *c, uint32_t rank)
{
    if (!c->map_fn)
        return;
    hci_hook_emit(c, rank, HEAPC_MAP_REMOVING, NULL);
    heapc_map_fn fn = c->map_fn;
    void *arg = c->map_arg;
    c->map_fn = NULL;
    c->map_arg = NULL;
    fn(arg, HEAPC_MAP_DROPPED, NULL, NULL, NULL, 0);
}

int heapc_set_map_hook(heapc *c, heapc_map_fn fn, void *arg)
{
    pthread_mutex_lock(&c->mu);
    if (fn && c->map_fn && (c->map_fn != fn || c->map_arg != arg)) {
        int rc = hci_set_err(c, HEAPC_ESTATE,
                             "heapc_set_map_hook: the context has a map hook already (one hnccl context registers "
                             "the heap: hnccl_register_heap); remove it first (heapc_set_map_hook(c, NULL, NULL), "
                             "hnccl_deregister_heap)");
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    c->map_fn = fn;
    c->map_arg = fn ? arg : NULL;
    const view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    if (fn && c->attached && v && c->mstate == HEAPC_STATE_ACTIVE)
        hci_hook_emit(c, v->rank, HEAPC_MAP_ADDED, NULL);
    int rc = hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}
