/* heapsim.h - the heapsim program's files (not a library): the replay
 * (heapsim.c, prefix sim_), the trace generator (heapsim_gen.c, gen_) and
 * the policy comparison (heapsim_compare.c, cmp_), the ID map (heapsim_idmap.c,
 * idmap_). */
#ifndef HEAPD_HEAPSIM_H
#define HEAPD_HEAPSIM_H

#include "alloc.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- ID map: open addressing, linear probing, backward-shift delete ---- */

typedef struct id_entry {
    char *key; /* NULL: empty slot */
    uint64_t hash;
    uint64_t offset;
    uint64_t size;    /* block size handed out */
    uint32_t holders; /* ranks that still hold the block */
} id_entry;

typedef struct id_map {
    id_entry *slots;
    size_t cap; /* power of two */
    size_t len;
} id_map;

/* heapsim_idmap.c: 0 or -1 (out of memory); find: NULL when absent; insert:
 * a new entry for key (NULL: out of memory); remove: e from the map. */
int idmap_init(id_map *m);
void idmap_free(id_map *m);
id_entry *idmap_find(const id_map *m, const char *key);
id_entry *idmap_insert(id_map *m, const char *key);
void idmap_remove(id_map *m, id_entry *e);

/* ---- the replay (heapsim.c) ---------------------------------------------- */

typedef struct sim {
    const char *name; /* trace name for messages */
    unsigned long line;
    int offsets;
    ha_policy policy;
    ha_reclaim reclaim; /* eager: one decider, a block is reclaimed at its last free */
    ha_heap *heap;
    uint32_t ranks;
    id_map ids;
    uint64_t triggered; /* collects ha_alloc asked for */
    uint64_t empty;     /* collects that reclaimed nothing */
    /* The overlap checker, independent of the allocator core: one bit per
     * min_block of the blocks handed out and not yet reclaimed (a block
     * every rank freed is reclaimed at the next collect). */
    uint64_t unit; /* min_block */
    uint64_t *occ; /* occupancy bits */
    size_t occ_words;
    uint64_t *rel; /* (offset, size) pairs every rank freed since the last collect */
    size_t nrel, caprel;
    uint64_t overlaps;
} sim;

/* A decimal whole number (digits only) -> *out; -1 otherwise. */
int sim_parse_u64(const char *t, uint64_t *out);
/* Replays the trace at path ("-": stdin) into s (fresh, policy set).
 * 0 done, 1 failed (or overlaps found), 2 a bad trace line. */
int sim_replay_path(sim *s, const char *path);
/* The summary line of a replay. */
void sim_print_summary(const sim *s);
void sim_free(sim *s);

/* ---- heapsim_gen.c ------------------------------------------------------- */

/* Writes the trace of `seed` to out, cut to max_steps allocations. 0 or 1
 * (a message printed). */
int gen_trace(uint64_t seed, uint64_t max_steps, FILE *out);

/* ---- heapsim_compare.c --------------------------------------------------- */

/* Replays n traces under every policy (the default policy with `reclaim`,
 * the others with collect), prints the table, the `worst` worst traces and
 * the summary line. 0, or 1 when a replay failed or overlapped. */
int cmp_traces(int n, char **paths, int worst, ha_reclaim reclaim);

#endif
