/* check_policy.c - common/policy.h, the one list of allocator policies,
 * against everything that names them: the core's enum, names and tables
 * (daemon/alloc*.c), heapd.proto's Policy, libheapc's heapc_policy_name
 * (heapctl, python/heapd); and the core's code table (HA_ERRORS). */
#include "alloc_int.h"
#include "heapc.h"
#include "heapd.pb-c.h"
#include "policy.h"

#include <check.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include "check_util.h"

HPO_CHECK_WIRE()
HA_CHECK_WIRE()
_Static_assert((int)HEAPC_POLICY_DEFAULT == (int)HEAPD__POLICY__POLICY_DEFAULT, "heapc.h: default");
_Static_assert((int)HEAPC_POLICY_COALESCE == (int)HEAPD__POLICY__POLICY_COALESCE, "heapc.h: coalesce");
_Static_assert((int)HEAPC_POLICY_SEED == (int)HEAPD__POLICY__POLICY_SEED, "heapc.h: seed");
_Static_assert((int)HA_POLICY_COUNT == (int)HPO_COUNT, "one core policy per row");

START_TEST(rows_agree)
{
    char names[256] = "";
    for (unsigned i = 0; i < HPO_COUNT; i++) {
        const char *n = hpo_name(i);
        ck_assert_ptr_nonnull(n);
        ck_assert_int_eq(hpo_index(n), (int)i);
        ck_assert_str_eq(ha_policy_name((ha_policy)i), n);
        ha_policy p = HA_POLICY_COUNT;
        ck_assert_int_eq(ha_policy_parse(n, &p), HA_OK);
        ck_assert_int_eq(p, i);
        /* wire values 1, 2, ... without a gap (python/heapd counts up) */
        ck_assert_int_eq(hpo_to_wire(i), (int)i + 1);
        ck_assert_int_eq(hpo_from_wire(hpo_to_wire(i)), (int)i);
        ck_assert_str_eq(heapc_policy_name((heapc_policy)hpo_to_wire(i)), n);
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", n);
    }
    ck_assert_str_eq(HPO_NAMES, names);
    ck_assert_ptr_null(hpo_name(HPO_COUNT));
    ck_assert_int_eq(hpo_index("default"), -1);
    ck_assert_int_eq(hpo_index(NULL), -1);
    ck_assert_int_eq(hpo_from_wire(0), -1);
    ck_assert_int_eq(hpo_from_wire(HPO_COUNT + 1), -1);
    ck_assert_int_eq(hpo_to_wire(HPO_COUNT), 0);
    ck_assert_str_eq(heapc_policy_name(HEAPC_POLICY_DEFAULT), "default");
    ck_assert_str_eq(heapc_policy_name((heapc_policy)(HPO_COUNT + 1)), "unknown");
    ck_assert_str_eq(ha_policy_name(HA_POLICY_COUNT), "unknown");
    ha_policy p = HA_POLICY_SEED;
    ck_assert_int_eq(ha_policy_parse("default", &p), HA_OK);
    ck_assert_int_eq(p, 0);
}
END_TEST

/* Every value of heapd.proto's Policy but POLICY_DEFAULT is a row, named
 * POLICY_<its name in capitals>. */
START_TEST(proto_values_are_rows)
{
    const ProtobufCEnumDescriptor *d = &heapd__policy__descriptor;
    ck_assert_uint_eq(d->n_values, HPO_COUNT + 1);
    for (unsigned v = 0; v < d->n_values; v++) {
        int w = d->values[v].value;
        if (w == HEAPD__POLICY__POLICY_DEFAULT)
            continue;
        int i = hpo_from_wire(w);
        ck_assert_msg(i >= 0, "proto Policy %s (%d) has no row in common/policy.h", d->values[v].name, w);
        char want[64] = "POLICY_";
        for (const char *c = hpo_name((unsigned)i); *c && strlen(want) + 1 < sizeof want; c++)
            want[strlen(want)] = (char)toupper((unsigned char)*c);
        ck_assert_str_eq(d->values[v].name, want);
    }
}
END_TEST

/* Every row has a table, with every operation the core calls unguarded. */
START_TEST(tables_complete)
{
    for (unsigned i = 0; i < HPO_COUNT; i++) {
        const ha_policy_ops *o = ha_policy_ops_of((ha_policy)i);
        ck_assert_ptr_nonnull(o);
        ck_assert_msg(o->class_size && o->meta_bytes && o->alloc && o->grow && o->reclaim && o->top && o->validate,
                      "policy %s: an operation is missing", hpo_name(i));
    }
    ck_assert_ptr_null(ha_policy_ops_of(HA_POLICY_COUNT));
}
END_TEST

START_TEST(codes)
{
    static const int all[] = {
#define ALL_X(N, v, w, s) HA_##N,
        HA_ERRORS(ALL_X)
#undef ALL_X
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        ck_assert_str_ne(ha_strerror(all[i]), "unknown allocator error");
        ck_assert_str_ne(ha_errname(all[i]), "HA_UNKNOWN");
        for (size_t j = 0; j < i; j++) {
            ck_assert_int_ne(all[i], all[j]);
            ck_assert_str_ne(ha_strerror(all[i]), ha_strerror(all[j]));
        }
    }
    ck_assert_str_eq(ha_errname(HA_EVA), "HA_EVA");
    ck_assert_str_eq(ha_errname(HA_OK), "HA_OK");
    ck_assert_str_eq(ha_strerror(HA_ENOTHELD), "no block held by this rank starts at this offset");
    ck_assert_str_eq(ha_errname(-99), "HA_UNKNOWN");
    ck_assert_str_eq(ha_strerror(99), "unknown allocator error");
    /* issue 26: it said "no parameters given0" */
    char err[64] = "";
    ck_assert_int_eq(ha_params_check(NULL, err, sizeof err), HA_EINVAL);
    ck_assert_str_eq(err, "no parameters given");
    ha_params p = {.ranks = 1,
                   .chunk_size = 1 << 20,
                   .initial_size = 1 << 20,
                   .va_size = 1 << 20,
                   .min_block = 512,
                   .policy = HA_POLICY_COUNT};
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_EINVAL);
    ck_assert_msg(strstr(err, HPO_NAMES) != NULL, "'%s' does not list the policies", err);
}
END_TEST

static ha_heap *mk(ha_policy pol)
{
    ha_params p = {.ranks = 2,
                   .chunk_size = 1 << 20,
                   .initial_size = 1 << 20,
                   .va_size = 8 << 20,
                   .min_block = 512,
                   .policy = pol};
    ha_heap *h = NULL;
    ck_assert_int_eq(ha_create(&p, &h, NULL, 0), HA_OK);
    ha_alloc_result res;
    ck_assert_int_eq(ha_alloc(h, 4096, &res), HA_OK);
    ck_assert_int_eq(ha_validate(h, NULL, 0), HA_OK);
    return h;
}

/* Each policy's validate (through its table) catches a broken invariant of
 * its own, and ha_validate reports it. */
START_TEST(validators_catch)
{
    char err[256] = "";
    ha_heap *h = mk(HA_POLICY_SEED);
    h->bump += 1; /* misaligned */
    ck_assert_int_eq(ha_validate(h, err, sizeof err), HA_EINVAL);
    ck_assert_msg(strstr(err, "bump") != NULL, "seed: %s", err);
    h->bump -= 1;
    ck_assert_int_eq(ha_validate(h, err, sizeof err), HA_OK);
    ha_destroy(h);

    h = mk(HA_POLICY_COALESCE);
    /* split the free extent [4096, 1 MiB) in two adjacent ones */
    hac_fx f = {4096, (1 << 20) - 4096};
    hac_del(h, f);
    hac_add(h, 4096, 4096);
    hac_add(h, 8192, (1 << 20) - 8192);
    ck_assert_int_eq(ha_validate(h, err, sizeof err), HA_EINVAL);
    ck_assert_msg(strstr(err, "adjacent") != NULL, "coalesce: %s", err);
    ha_destroy(h);

    h = mk(HA_POLICY_COALESCE);
    h->ops = ha_policy_ops_of(HA_POLICY_SEED);
    ck_assert_int_eq(ha_validate(h, err, sizeof err), HA_EINVAL);
    ck_assert_msg(strstr(err, "table") != NULL, "%s", err);
    h->ops = ha_policy_ops_of(HA_POLICY_COALESCE);
    ha_destroy(h);
}
END_TEST

static Suite *policy_suite(void)
{
    Suite *s = suite_create("policy");
    TCase *tc = tcase_create("list");
    tcase_add_test(tc, rows_agree);
    tcase_add_test(tc, proto_values_are_rows);
    tcase_add_test(tc, tables_complete);
    tcase_add_test(tc, codes);
    tcase_add_test(tc, validators_catch);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return cku_run(policy_suite()); }
