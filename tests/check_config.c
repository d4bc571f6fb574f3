/* check_config.c - daemon/config.h: heapd.conf's defaults, every kind of
 * key (sizes, numbers, octal mode, names, the ring's auto), comments, the
 * bounds, errors that name FILE:LINE and the key (the first error wins,
 * nothing is applied), the cross-key checks of the heap defaults, the
 * stricter reload (SIGHUP), and the shipped heapd.conf. */
#include "config.h"

#include <check.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_util.h"
#include "log.h"

static char dir[32], path[64];
static char err[1024];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/check_config.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/heapd.conf", dir);
    err[0] = 0;
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

static void write_file(const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* Loads text over the defaults into *c: hd_config_load's result. */
static int load(const char *text, hd_config *c)
{
    write_file(text);
    hd_config_defaults(c);
    return hd_config_load(path, c, err, sizeof err);
}

/* text must fail with "FILE:LINE: want..." (want a prefix of the rest). */
static void load_fails(const char *text, int line, const char *want)
{
    hd_config c;
    ck_assert_msg(load(text, &c) == -1, "loaded: %s", text);
    char where[128];
    if (line)
        snprintf(where, sizeof where, "%s:%d: ", path, line);
    else
        snprintf(where, sizeof where, "%s: ", path);
    ck_assert_msg(!strncmp(err, where, strlen(where)), "want \"%s\" first: %s", where, err);
    ck_assert_msg(strstr(err + strlen(where), want) == err + strlen(where), "want \"%s\" after the place: %s", want,
                  err);
}

START_TEST(defaults)
{
    hd_config c;
    hd_config_defaults(&c);
    ck_assert_str_eq(c.socket_path, HD_DEFAULT_SOCKET);
    ck_assert_uint_eq(c.socket_mode, 0660);
    ck_assert_str_eq(c.backend, "auto");
    ck_assert_int_eq(c.log_level, HD_LOG_INFO);
    ck_assert_uint_eq(c.chunk_size, 64u << 20);
    ck_assert_uint_eq(c.initial_size, 0);
    ck_assert_uint_eq(c.va_size, UINT64_C(64) << 30);
    ck_assert_uint_eq(c.min_block, 512);
    ck_assert_int_eq(c.policy, HA_POLICY_COALESCE);
    ck_assert_uint_eq(c.collect_timeout_ms, 30000);
    ck_assert_uint_eq(c.persist, 0);
    ck_assert_uint_eq(c.max_persist, 86400);
    ck_assert_uint_eq(c.max_clients, 1024);
    ck_assert_uint_eq(c.max_clients_per_uid, 256);
    ck_assert_uint_eq(c.max_fds_per_uid, 4096);
    ck_assert_uint_eq(c.max_queue_per_uid, 64u << 20);
    ck_assert_uint_eq(c.hello_timeout_ms, 10000);
    ck_assert_uint_eq(c.max_frame_before_hello, 4096);
    ck_assert_uint_eq(c.max_fds_per_conn, 1024);
    ck_assert_uint_eq(c.max_queue_per_conn, 8u << 20);
    ck_assert_uint_eq(c.max_chunks, 1u << 24);
    ck_assert_uint_eq(c.max_blocks, 1u << 28);
    ck_assert_str_eq(c.admin_group, "");
    ck_assert_int_eq(c.admin_gid, -1);
    ck_assert_uint_eq(c.quota_heap, 0);
    ck_assert_uint_eq(c.quota_uid, 0);
    ck_assert_str_eq(c.store, "");
    ck_assert_msg(c.node[0], "the node name defaults to the host name (or \"node\")");
    ck_assert_uint_eq(c.meminfo_interval_ms, 1000);
    ck_assert_int_eq(c.ring, 1);
    ck_assert_int_eq(c.ring_spin_us, -1);
    ck_assert_int_eq(c.ring_backoff_us, -1);
}
END_TEST

START_TEST(every_kind_of_key)
{
    hd_config c;
    int rc = load("# a comment\n"
                  "; another\n"
                  "socket = /tmp/x/heapd.sock\n"
                  "socket_mode = 0600\n"
                  "backend = host   # a comment after the value\n"
                  "log_level = debug\n"
                  "log_format = json\n"
                  "chunk_size = 2M\n"
                  "initial_size = 4M\n"
                  "va_size = 1G\n"
                  "min_block = 4K\n"
                  "policy = seed\n"
                  "collect_timeout_ms = 500\n"
                  "persist = 600\n"
                  "max_persist = 3600\n"
                  "max_clients = 7\n"
                  "max_clients_per_uid = 3\n"
                  "max_fds_per_uid = 100\n"
                  "max_queue_per_uid = 6M\n"
                  "hello_timeout_ms = 10\n"
                  "max_frame_before_hello = 64\n"
                  "max_fds_per_conn = 1\n"
                  "max_queue_per_conn = 5M\n"
                  "max_chunks = 1000\n"
                  "max_blocks = 1000000\n"
                  "meminfo_interval_ms = 3600000\n"
                  "admin_group = root\n"
                  "quota_heap = 1G\n"
                  "quota_uid = 2G\n"
                  "store = redis://10.0.0.5:6380\n"
                  "node = n-1.a_b\n"
                  "ring = off\n"
                  "ring_spin_us = 7\n"
                  "ring_backoff_us = auto\n",
                  &c);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_str_eq(c.socket_path, "/tmp/x/heapd.sock");
    ck_assert_uint_eq(c.socket_mode, 0600);
    ck_assert_str_eq(c.backend, "host");
    ck_assert_int_eq(c.log_level, HD_LOG_DEBUG);
    ck_assert_int_eq(c.log_format, HD_LOG_FMT_JSON);
    ck_assert_uint_eq(c.chunk_size, 2u << 20);
    ck_assert_uint_eq(c.initial_size, 4u << 20);
    ck_assert_uint_eq(c.va_size, 1u << 30);
    ck_assert_uint_eq(c.min_block, 4096);
    ck_assert_int_eq(c.policy, HA_POLICY_SEED);
    ck_assert_uint_eq(c.collect_timeout_ms, 500);
    ck_assert_uint_eq(c.persist, 600);
    ck_assert_uint_eq(c.max_persist, 3600);
    ck_assert_uint_eq(c.max_clients, 7);
    ck_assert_uint_eq(c.max_clients_per_uid, 3);
    ck_assert_uint_eq(c.max_fds_per_uid, 100);
    ck_assert_uint_eq(c.max_queue_per_uid, 6u << 20);
    ck_assert_uint_eq(c.hello_timeout_ms, 10);
    ck_assert_uint_eq(c.max_frame_before_hello, 64);
    ck_assert_uint_eq(c.max_fds_per_conn, 1);
    ck_assert_uint_eq(c.max_queue_per_conn, 5u << 20);
    ck_assert_uint_eq(c.max_chunks, 1000);
    ck_assert_uint_eq(c.max_blocks, 1000000);
    ck_assert_uint_eq(c.meminfo_interval_ms, 3600000);
    ck_assert_str_eq(c.admin_group, "root");
    ck_assert_int_eq(c.admin_gid, 0);
    ck_assert_uint_eq(c.quota_heap, 1u << 30);
    ck_assert_uint_eq(c.quota_uid, 2u << 30);
    ck_assert_str_eq(c.store, "redis://10.0.0.5:6380");
    ck_assert_str_eq(c.node, "n-1.a_b");
    ck_assert_int_eq(c.ring, 0);
    ck_assert_int_eq(c.ring_spin_us, 7);
    ck_assert_int_eq(c.ring_backoff_us, -1);
}
END_TEST

/* Values at the ends of their ranges load; one past them is an error that
 * names the key and its range. */
START_TEST(bounds)
{
    hd_config c;
    ck_assert_msg(load("collect_timeout_ms = 86400000\nmax_fds_per_conn = 1024\nring_spin_us = 1000000\n", &c) == 0,
                  "%s", err);
    load_fails("\n\ncollect_timeout_ms = 0\n", 3,
               "collect_timeout_ms: \"0\" is not a number of milliseconds (1..86400000)");
    load_fails("collect_timeout_ms = 86400001\n", 1, "collect_timeout_ms: \"86400001\"");
    load_fails("max_fds_per_conn = 1025\n", 1, "max_fds_per_conn: \"1025\" is not a number (1..1024)");
    load_fails("max_clients = -1\n", 1, "max_clients: \"-1\"");
    load_fails("hello_timeout_ms = 9\n", 1, "hello_timeout_ms: \"9\"");
    load_fails("max_frame_before_hello = 63\n", 1, "max_frame_before_hello: \"63\"");
    load_fails("chunk_size = 1K\n", 1,
               "chunk_size: \"1K\" is not a size (bytes with optional K, M, G, T suffix, >= 4096)");
    load_fails("max_queue_per_conn = 4M\n", 1, "max_queue_per_conn: \"4M\" is not a size");
    load_fails("ring_spin_us = 1000001\n", 1,
               "ring_spin_us: \"1000001\" is not auto or a number of microseconds (0..1000000)");
    load_fails("ring = yes\n", 1, "ring: \"yes\" is not on or off");
    load_fails("socket_mode = 0999\n", 1, "socket_mode: \"0999\" is not an octal mode");
    load_fails("socket = relative.sock\n", 1, "socket: \"relative.sock\" must be an absolute path");
    ck_assert_msg(load("persist = 86400\nmax_persist = 4294967294\n", &c) == 0, "%s", err);
    load_fails("max_persist = 4294967295\n", 1,
               "max_persist: \"4294967295\" is not a number of seconds (0..4294967294)");
    load_fails("persist = -1\n", 1, "persist: \"-1\"");
}
END_TEST

/* Names: the backends' (one list, backend.h), the log's, the policy's, a
 * group that exists, the node's characters, the store's URL. */
START_TEST(names)
{
    load_fails("backend = gpu\n", 1, "backend: \"gpu\" is not one of auto, cuda, host");
    load_fails("log_level = loud\n", 1, "log_level: \"loud\" is not one of error, warn, info, debug");
    load_fails("log_format = xml\n", 1, "log_format: \"xml\" is not one of text, json");
    load_fails("policy = buddy\n", 1, "policy: \"buddy\"");
    load_fails("node = a/b\n", 1, "node: \"a/b\" must be 1 to 64 of");
    load_fails("store = http://x\n", 1, "store: store URL \"http://x\" must start with redis://");
    if (!getgrnam("no-such-group-heapd"))
        load_fails("admin_group = no-such-group-heapd\n", 1, "admin_group: no group named \"no-such-group-heapd\"");
    /* A # without a space before it is part of the value: the error says so. */
    load_fails("node = a#b\n", 1, "node: \"a#b\" must be 1 to 64 of");
    ck_assert_msg(strstr(err, "a # starts a comment only after a space"), "%s", err);
}
END_TEST

/* The file's structure: unknown keys, sections, lines without `=`; the
 * first error wins; nothing of a bad file is applied. */
START_TEST(errors_name_the_line)
{
    load_fails("max_clients = 5\nbogus = 1\n", 2, "unknown key \"bogus\" (see heapd.conf(5) for the keys)");
    load_fails("[heapd]\nmax_clients = 5\n", 1, "unknown section [heapd]: heapd.conf has no sections");
    load_fails("max_clients = 5\njust words\n", 2, "syntax error: expected `key = value`");
    load_fails("max_clients = 0\nbogus = 1\n", 1, "max_clients: \"0\"");

    hd_config c;
    hd_config_defaults(&c);
    c.max_clients = 77;
    write_file("max_clients = 5\nmax_fds_per_conn = 5000\n");
    ck_assert_int_eq(hd_config_load(path, &c, err, sizeof err), -1);
    ck_assert_uint_eq(c.max_clients, 77); /* unchanged */

    ck_assert_int_eq(hd_config_load("/nonexistent/heapd.conf", &c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "/nonexistent/heapd.conf: cannot open: "), "%s", err);
    ck_assert_int_eq(hd_config_load(dir, &c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "is a directory, not a configuration file"), "%s", err);
}
END_TEST

/* The heap defaults must make a heap: each rule blames the key set last. */
START_TEST(cross_key_checks)
{
    load_fails("min_block = 768\n", 1, "min_block = 768 B is not a power of two (512, 4K, 64K...)");
    load_fails("min_block = 1M\nchunk_size = 1536K\n", 2,
               "chunk_size = 1536 KiB is not a multiple of min_block = 1 MiB; change chunk_size");
    load_fails("chunk_size = 4M\ninitial_size = 6M\n", 2, "initial_size = 6 MiB is not a whole number of chunks");
    load_fails("va_size = 65M\n", 1, "va_size = 65 MiB is not a whole number of chunks");
    load_fails("chunk_size = 64M\nva_size = 64M\ninitial_size = 128M\n", 3, "va_size = 64 MiB");
    load_fails("max_chunks = 10\n", 0,
               "the heap defaults are over heapd's limits: va_size / chunk_size = 1024, over "
               "max_chunks = 10");
    load_fails("persist = 86401\n", 0, "persist = 86401 is over max_persist = 86400");
    load_fails("max_persist = 60\npersist = 61\n", 0, "persist = 61 is over max_persist = 60");
}
END_TEST

/* The reload refuses what would reset every key (a file without keys) and
 * anything that is no regular file; the load at start takes /dev/null. */
START_TEST(reload_is_stricter)
{
    hd_config c;
    hd_config_defaults(&c);
    write_file("# only a comment\n");
    ck_assert_int_eq(hd_config_load(path, &c, err, sizeof err), 0);
    ck_assert_int_eq(hd_config_reload(path, &c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ": has no keys (empty, or only comments)"), "%s", err);
    ck_assert_int_eq(hd_config_load("/dev/null", &c, err, sizeof err), 0);
    ck_assert_int_eq(hd_config_reload("/dev/null", &c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "/dev/null: is not a regular file"), "%s", err);
    char fifo[80];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(hd_config_reload(fifo, &c, err, sizeof err), -1); /* and does not block */
    ck_assert_msg(strstr(err, "is not a regular file"), "%s", err);
    unlink(fifo);
    write_file("max_clients = 9\n");
    ck_assert_msg(hd_config_reload(path, &c, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(c.max_clients, 9);
}
END_TEST

/* The shipped heapd.conf: every key at its default, but backend. */
START_TEST(store_key_file)
{
    /* Issue 33 item 1: the cluster key's file, checked like store_credentials. */
    char kp[96], text[160];
    hd_config c;
    snprintf(kp, sizeof kp, "%s/store.key", dir);
    snprintf(text, sizeof text, "store_key = %s\n", kp);
    FILE *f = fopen(kp, "w");
    ck_assert_ptr_nonnull(f);
    fputs("a-cluster-key-of-32-bytes-012345\n", f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(chmod(kp, 0644), 0);
    load_fails(text, 1, "store_key ");
    ck_assert_msg(strstr(err, "readable or writable by others"), "%s", err);
    ck_assert_int_eq(chmod(kp, 0600), 0);
    ck_assert_msg(load(text, &c) == 0, "%s", err);
    ck_assert_str_eq(c.store_key, kp);
    f = fopen(kp, "w");
    ck_assert_ptr_nonnull(f);
    fputs("short\n", f);
    ck_assert_int_eq(fclose(f), 0);
    load_fails(text, 1, "store_key ");
    ck_assert_msg(strstr(err, "16 to 256"), "%s", err);
    unlink(kp);
}
END_TEST

START_TEST(shipped_file)
{
    const char *src = getenv("HEAPD_SRC");
    char p[512];
    snprintf(p, sizeof p, "%s/heapd.conf", src ? src : ".");
    hd_config d, c;
    hd_config_defaults(&d);
    hd_config_defaults(&c);
    ck_assert_msg(hd_config_load(p, &c, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.backend, "host");
    ck_assert_str_eq(c.socket_path, d.socket_path);
    ck_assert_str_eq(c.node, d.node);
    ck_assert_str_eq(c.store, d.store);
    ck_assert_str_eq(c.admin_group, d.admin_group);
#define SAME(f) ck_assert_msg(c.f == d.f, #f " differs from its default")
    SAME(socket_mode);
    SAME(log_level);
    SAME(log_format);
    SAME(chunk_size);
    SAME(initial_size);
    SAME(va_size);
    SAME(min_block);
    SAME(policy);
    SAME(collect_timeout_ms);
    SAME(persist);
    SAME(max_persist);
    SAME(max_clients);
    SAME(max_clients_per_uid);
    SAME(max_fds_per_uid);
    SAME(max_queue_per_uid);
    SAME(hello_timeout_ms);
    SAME(max_frame_before_hello);
    SAME(max_fds_per_conn);
    SAME(max_queue_per_conn);
    SAME(max_chunks);
    SAME(max_blocks);
    SAME(admin_gid);
    SAME(quota_heap);
    SAME(quota_uid);
    SAME(meminfo_interval_ms);
    SAME(ring);
    SAME(ring_spin_us);
    SAME(ring_backoff_us);
#undef SAME
}
END_TEST

static Suite *config_suite(void)
{
    Suite *su = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, defaults);
    tcase_add_test(tc, every_kind_of_key);
    tcase_add_test(tc, bounds);
    tcase_add_test(tc, names);
    tcase_add_test(tc, errors_name_the_line);
    tcase_add_test(tc, cross_key_checks);
    tcase_add_test(tc, reload_is_stricter);
    tcase_add_test(tc, shipped_file);
    tcase_add_test(tc, store_key_file);
    suite_add_tcase(su, tc);
    return su;
}

int main(void) { return cku_run(config_suite()); }
