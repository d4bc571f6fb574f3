/* heap.h - the heap registry: heaps by name, their ranks, the allocation
 * sequence, collect orchestration and growth.
 *
 * What it promises:
 *   - Each allocation number of a heap is decided once, by the allocator
 *     core, and every rank's n-th allocation gets that decision; a rank whose
 *     n-th size differs gets ERR_ASYMMETRY naming n and both sizes, and
 *     nothing changes.
 *   - Attach and Collect are collective over every rank of the heap; a rank
 *     that does not come within the heap's timeout, or disconnects, is named
 *     in the error every waiting rank gets.
 *   - Growth creates one chunk per rank; every client learns of every chunk
 *     (its own and its peers') before it uses an offset in it.
 *   - A heap is destroyed, and its chunks released, when its last client
 *     detaches or disconnects.
 * Runs on the loop thread only. */
#ifndef HEAPD_HEAP_H
#define HEAPD_HEAP_H

#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "heapd.pb-c.h"
#include "server.h"

typedef struct hd_registry hd_registry;
typedef struct hd_heap hd_heap;

int hd_registry_create(uv_loop_t *loop, hb_backend *be, const hd_config *cfg, hd_registry **out);
/* Releases every heap and its chunks (clients must be gone). */
void hd_registry_destroy(hd_registry *r);
uint32_t hd_registry_heaps(const hd_registry *r);
/* Replace the heap defaults (SIGHUP); existing heaps keep their parameters. */
void hd_registry_set_config(hd_registry *r, const hd_config *cfg);
struct hd_store;
/* Heaps whose ranks span nodes reconcile collects through `store` (NULL:
 * single node only). */
void hd_registry_set_store(hd_registry *r, struct hd_store *store);
/* 1 if heaps may span nodes (a store is configured). */
int hd_registry_has_store(const hd_registry *r);

void hd_heap_attach(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__Attach *m);
void hd_heap_alloc(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__Alloc *m);
void hd_heap_free(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__Free *m);
void hd_heap_collect(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__Collect *m);
void hd_heap_detach(hd_registry *r, hd_conn *c, uint64_t id);
void hd_heap_stats(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__Stats *m,
                   const char *backend_name, uint32_t clients);
void hd_heap_force_collect(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__ForceCollect *m);
/* The connection is going away: detach it, fail collectives it was part of. */
void hd_heap_conn_closed(hd_registry *r, hd_conn *c);

#endif
