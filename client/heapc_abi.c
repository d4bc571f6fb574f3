/* heapc_abi.c - libheapc: what bindings in other languages (python/heapd's
 * ctypes) check and share instead of copying: the layout version and the
 * sizes of the public structs, and the one size parser. */
#include "heapc_int.h"

#include "size.h"

uint32_t heapc_abi_version(void) { return HEAPC_ABI_VERSION; }

/* The public structs by name. */
static const struct {
    const char *name;
    size_t size;
} abi_types[] = {
    {"heapc_params", sizeof(heapc_params)},
    {"heapc_status_t", sizeof(heapc_status_t)},
    {"heapc_counters", sizeof(heapc_counters)},
    {"heapc_rank_stats", sizeof(heapc_rank_stats)},
    {"heapc_hist", sizeof(heapc_hist)},
    {"heapc_heap_stats", sizeof(heapc_heap_stats)},
    {"heapc_daemon_stats", sizeof(heapc_daemon_stats)},
    {"heapc_block", sizeof(heapc_block)},
};

size_t heapc_sizeof(const char *type)
{
    if (!type)
        return 0;
    for (size_t i = 0; i < sizeof abi_types / sizeof abi_types[0]; i++)
        if (strcmp(abi_types[i].name, type) == 0)
            return abi_types[i].size;
    return 0;
}

int heapc_parse_size(const char *s, uint64_t *out)
{
    if (!out)
        return HEAPC_EINVAL;
    return hsz_parse_size(s, out) == 0 ? 0 : HEAPC_EINVAL;
}
