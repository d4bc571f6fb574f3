/* heapsim_idmap.c - heapsim's ID map: block names of a trace to their offset,
 * size and holders (open addressing, linear probing, backward-shift delete;
 * prefix idmap_). */
#include "heapsim.h"

#include <stdlib.h>
#include <string.h>

/* ---- ID map ---------------------------------------------------------------- */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    h ^= h >> 29; /* FNV's low bits are weak for short keys */
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

int idmap_init(id_map *m)
{
    m->cap = 1024;
    m->len = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

void idmap_free(id_map *m)
{
    for (size_t i = 0; i < m->cap; i++)
        free(m->slots[i].key);
    free(m->slots);
}

id_entry *idmap_find(const id_map *m, const char *key)
{
    uint64_t h = hash_str(key);
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        id_entry *e = &m->slots[i];
        if (e->key == NULL)
            return NULL;
        if (e->hash == h && strcmp(e->key, key) == 0)
            return e;
    }
}

static int idmap_grow(id_map *m)
{
    size_t ncap = m->cap * 2;
    id_entry *ns = calloc(ncap, sizeof *ns);
    if (ns == NULL)
        return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key == NULL)
            continue;
        size_t j = m->slots[i].hash & (ncap - 1);
        while (ns[j].key != NULL)
            j = (j + 1) & (ncap - 1);
        ns[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return 0;
}

/* Inserts key (not present). Returns the entry, NULL when out of memory. */
id_entry *idmap_insert(id_map *m, const char *key)
{
    if ((m->len + 1) * 10 > m->cap * 7 && idmap_grow(m) != 0)
        return NULL;
    char *k = strdup(key);
    if (k == NULL)
        return NULL;
    uint64_t h = hash_str(key);
    size_t mask = m->cap - 1;
    size_t i = h & mask;
    while (m->slots[i].key != NULL)
        i = (i + 1) & mask;
    m->slots[i] = (id_entry){.key = k, .hash = h};
    m->len++;
    return &m->slots[i];
}

void idmap_remove(id_map *m, id_entry *e)
{
    size_t mask = m->cap - 1;
    size_t i = (size_t)(e - m->slots);
    free(e->key);
    m->slots[i].key = NULL;
    m->len--;
    /* Shift later members of the probe run back into the hole. */
    for (size_t j = (i + 1) & mask; m->slots[j].key != NULL; j = (j + 1) & mask) {
        size_t home = m->slots[j].hash & mask;
        /* Move j to i unless its home lies cyclically in (i, j]. */
        int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        m->slots[i] = m->slots[j];
        m->slots[j].key = NULL;
        i = j;
    }
}
