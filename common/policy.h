/* policy.h - the allocator's policies: the one list of their names and wire
 * values (daemon and client; issue 26).
 *
 * Everything that names a policy reads HPO_POLICIES: the core's enum and
 * table (daemon/alloc.h, alloc.c: HA_POLICY_<UPPER>, ha_<lower>_ops), its
 * names (ha_policy_name/parse: heapd.conf, heapsim --policy, heapsim
 * --compare's columns), the wire<->core mapping below (the heap wing's
 * attach, reply's HeapParams), libheapc's heapc_policy_name (heapctl; the
 * Python package builds its names from it). A new policy is one row here,
 * its file daemon/alloc_<lower>.c (defining ha_<lower>_ops) and its value in
 * heapd.proto's Policy (HPO_CHECK_WIRE fails the build without it).
 *
 * X(UPPER, lower, wire): the row's index is the core's ha_policy value (the
 * first row is the default), wire the protocol's POLICY_<UPPER>. Wire value
 * 0, POLICY_DEFAULT, is no policy: the daemon's configured default.
 */
#ifndef HEAPD_POLICY_H
#define HEAPD_POLICY_H

#include <string.h>

#define HPO_POLICIES(X)                                                                                                \
    X(COALESCE, coalesce, 1)                                                                                           \
    X(SEED, seed, 2)

/* Row indexes: HPO_<UPPER>, HPO_COUNT. */
enum {
#define HPO_X(U, l, w) HPO_##U,
    HPO_POLICIES(HPO_X)
#undef HPO_X
        HPO_COUNT
};

/* "coalesce, seed": every name, for messages. */
#define HPO_NAMES_X(U, l, w) ", " #l
#define HPO_NAMES            (HPO_POLICIES(HPO_NAMES_X) + 2)

/* ", 1 (coalesce), 2 (seed)": every wire value with its name, for messages. */
#define HPO_WIRE_CHOICES_X(U, l, w) ", " #w " (" #l ")"
#define HPO_WIRE_CHOICES            HPO_POLICIES(HPO_WIRE_CHOICES_X)

/* Ties each row's wire value to heapd.proto (where its header is included). */
#define HPO_CHECK_WIRE_X(U, l, w) _Static_assert(HEAPD__POLICY__POLICY_##U == w, "common/policy.h: wire of " #l);
#define HPO_CHECK_WIRE()          HPO_POLICIES(HPO_CHECK_WIRE_X) _Static_assert(HEAPD__POLICY__POLICY_DEFAULT == 0, "");

/* The name of row i, NULL if there is none. */
static inline const char *hpo_name(unsigned i)
{
    static const char *const names[] = {
#define HPO_NAME_X(U, l, w) #l,
        HPO_POLICIES(HPO_NAME_X)
#undef HPO_NAME_X
    };
    return i < HPO_COUNT ? names[i] : NULL;
}

/* The row named s, -1 if none. */
static inline int hpo_index(const char *s)
{
    for (unsigned i = 0; s && i < HPO_COUNT; i++)
        if (!strcmp(s, hpo_name(i)))
            return (int)i;
    return -1;
}

/* Row i's wire value (0, the daemon's default, if there is no row i). */
static inline int hpo_to_wire(unsigned i)
{
    static const int wire[] = {
#define HPO_WIRE_X(U, l, w) w,
        HPO_POLICIES(HPO_WIRE_X)
#undef HPO_WIRE_X
    };
    return i < HPO_COUNT ? wire[i] : 0;
}

/* The row whose wire value is w, -1 if none (0, the default, included). */
static inline int hpo_from_wire(int w)
{
    for (unsigned i = 0; i < HPO_COUNT; i++)
        if (w != 0 && hpo_to_wire(i) == w)
            return (int)i;
    return -1;
}

#endif
