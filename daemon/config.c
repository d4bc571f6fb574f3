/* config.c - see config.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <grp.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"
#include "size.h"
#include "store.h"

void hd_config_defaults(hd_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->socket_path, sizeof c->socket_path, "%s", HD_DEFAULT_SOCKET);
    c->socket_mode = 0660;
    snprintf(c->backend, sizeof c->backend, "auto");
    c->log_level = HD_LOG_INFO;
    c->chunk_size = UINT64_C(64) << 20;
    c->initial_size = 0;
    c->va_size = UINT64_C(64) << 30;
    c->min_block = 512;
    c->policy = HA_POLICY_COALESCE;
    c->reclaim = HA_RECLAIM_EAGER;
    c->collect_timeout_ms = 30000;
    c->grow_ahead = 1;
    c->reclaim_lookahead = 64;
    c->persist = 0;
    c->max_persist = 86400;
    c->max_clients = 1024;
    c->admin_reserve = 8;
    c->max_clients_per_uid = 256;
    c->max_fds_per_uid = 4096;
    c->max_queue_per_uid = UINT64_C(64) << 20;
    c->hello_timeout_ms = 10000;
    c->max_frame_before_hello = 4096;
    c->max_fds_per_conn = 1024;
    c->max_queue_per_conn = UINT64_C(8) << 20;
    c->max_queued_fds_per_conn = 256;
    c->max_queued_fds_per_uid = 1024;
    c->max_inflight_fds_per_conn = 512;
    c->max_inflight_fds_per_uid = 2048;
    c->max_chunk_fds_per_uid = 32768;
    c->max_chunks = UINT32_C(1) << 24;
    c->max_blocks = UINT32_C(1) << 28;
    c->admin_gid = -1;
    char host[256] = "node";
    gethostname(host, sizeof host - 1);
    size_t j = 0;
    for (size_t i = 0; host[i] && j < sizeof c->node - 1; i++)
        if ((host[i] >= 'a' && host[i] <= 'z') || (host[i] >= 'A' && host[i] <= 'Z') ||
            (host[i] >= '0' && host[i] <= '9') || host[i] == '.' || host[i] == '_' || host[i] == '-')
            c->node[j++] = host[i];
    c->node[j] = 0;
    if (!j)
        snprintf(c->node, sizeof c->node, "node");
    c->meminfo_interval_ms = 1000;
    c->ring = 1;
    c->ring_spin_us = -1;
    c->ring_backoff_us = -1;
}

/* Lines of the keys the cross-key checks blame (0: not in the file). */
enum { L_CHUNK, L_INITIAL, L_VA, L_MIN_BLOCK, L_N };

typedef struct parse_state {
    FILE *f;
    int line;
    int err_line; /* the first error's line (0: none yet) */
    int stop;     /* an error was found: the reader ends the file */
    int key_line[L_N];
    int nkeys; /* keys set by the file */
    hd_config cfg;
    char msg[512];
} parse_state;

static void fail_at(parse_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_at(parse_state *st, const char *fmt, ...)
{
    if (st->err_line)
        return; /* the first error wins */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    st->err_line = st->line;
    st->stop = 1;
}

/* Feeds inih one line at a time and does what inih does not:
 *   - ` # comment` after a value (whitespace, then #) is a comment, as
 *     ` ; comment` is for inih; a # inside a value (no space before it)
 *     stays part of the value;
 *   - a `[section]` header is an error even when no key follows it;
 *   - after the first error the file ends, so that the error reported is
 *     the first one, with its line. */
static char *reader(char *str, int num, void *stream)
{
    parse_state *st = stream;
    if (st->stop)
        return NULL;
    char *r = fgets(str, num, st->f);
    if (!r)
        return NULL;
    st->line++;
    char *p = str;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '#' || *p == ';')
        return r;
    for (char *q = p; *q; q++)
        if (*q == '#' && q > p && (q[-1] == ' ' || q[-1] == '\t')) {
            q[0] = '\n';
            q[1] = 0;
            break;
        }
    if (*p == '[') {
        size_t n = strcspn(p, "\r\n");
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
            n--;
        fail_at(st, "unknown section %.*s: heapd.conf has no sections; remove the line", (int)(n > 80 ? 80 : n), p);
        return NULL;
    }
    return r;
}

static int parse_u32(const char *v, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-' || x < lo || x > hi)
        return -1;
    *out = (uint32_t)x;
    return 0;
}

static int size_at_least(uint64_t v, uint64_t min) { return v >= min; }

/* One key of heapd.conf: its name, the function that parses its value into
 * the field at `off` of hd_config, and that function's bounds. A parser
 * returns 1, or 0 with the sentence (without FILE:LINE) in st->msg. */
typedef struct key_desc key_desc;
typedef int (*key_parse_fn)(parse_state *st, const key_desc *k, const char *value);
struct key_desc {
    const char *name;
    key_parse_fn parse;
    size_t off;       /* the field in hd_config (parsers with a field of their own ignore it) */
    uint64_t lo, hi;  /* sizes: lo is the minimum; numbers: the range */
    const char *what; /* numbers: what the value counts ("a number of milliseconds") */
    int line_slot;    /* L_* for the cross-key checks, or -1 */
};

#define FIELD(st, k, type) ((type *)((char *)&(st)->cfg + (k)->off))

static int key_msg(parse_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int key_msg(parse_state *st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    return 0;
}

static int parse_size_key(parse_state *st, const key_desc *k, const char *value)
{
    uint64_t sz;
    if (hsz_parse_size(value, &sz) || !size_at_least(sz, k->lo))
        return key_msg(st, "%s: \"%s\" is not a size (bytes with optional K, M, G, T suffix, >= %llu)", k->name, value,
                       (unsigned long long)k->lo);
    *FIELD(st, k, uint64_t) = sz;
    return 1;
}

static int parse_u32_key(parse_state *st, const key_desc *k, const char *value)
{
    uint32_t u;
    if (parse_u32(value, (uint32_t)k->lo, (uint32_t)k->hi, &u))
        return key_msg(st, "%s: \"%s\" is not %s (%llu..%llu)", k->name, value, k->what, (unsigned long long)k->lo,
                       (unsigned long long)k->hi);
    *FIELD(st, k, uint32_t) = u;
    return 1;
}

static int parse_socket(parse_state *st, const key_desc *k, const char *value)
{
    hd_config *c = &st->cfg;
    (void)k;
    if (value[0] != '/' || strlen(value) >= sizeof c->socket_path)
        return key_msg(st, "socket: \"%s\" must be an absolute path shorter than %zu bytes", value,
                       sizeof c->socket_path);
    snprintf(c->socket_path, sizeof c->socket_path, "%s", value);
    return 1;
}

static int parse_socket_mode(parse_state *st, const key_desc *k, const char *value)
{
    (void)k;
    char *end;
    unsigned long m = strtoul(value, &end, 8);
    if (end == value || *end || m > 0777)
        return key_msg(st, "socket_mode: \"%s\" is not an octal mode such as 0660", value);
    st->cfg.socket_mode = (unsigned)m;
    return 1;
}

static int parse_backend(parse_state *st, const key_desc *k, const char *value)
{
    (void)k;
    char kinds[64];
    if (hb_kind_parse(value) < 0)
        return key_msg(st, "backend: \"%s\" is not one of %s", value, hb_kind_list(kinds, sizeof kinds, ", ", 0));
    snprintf(st->cfg.backend, sizeof st->cfg.backend, "%s", value);
    return 1;
}

static int parse_log_level(parse_state *st, const key_desc *k, const char *value)
{
    (void)k;
    int l = hd_log_parse_level(value);
    if (l < 0)
        return key_msg(st, "log_level: \"%s\" is not one of error, warn, info, debug", value);
    st->cfg.log_level = l;
    return 1;
}

static int parse_log_format(parse_state *st, const key_desc *k, const char *value)
{
    (void)k;
    int f = hd_log_parse_format(value);
    if (f < 0)
        return key_msg(st, "log_format: \"%s\" is not one of text, json", value);
    st->cfg.log_format = f;
    return 1;
}

static int parse_policy(parse_state *st, const key_desc *k, const char *value)
{
    (void)k;
    if (ha_policy_parse(value, &st->cfg.policy))
        return key_msg(st, "policy: \"%s\" is not one of %s", value, HPO_NAMES);
    return 1;
}

/* Issue 27: eager | collect. */
static int parse_reclaim(parse_state *st, const key_desc *k, const char *value)
{
    (void)k;
    if (!strcmp(value, "eager"))
        st->cfg.reclaim = HA_RECLAIM_EAGER;
    else if (!strcmp(value, "collect"))
        st->cfg.reclaim = HA_RECLAIM_COLLECT;
    else
        return key_msg(st, "reclaim: \"%s\" is not one of eager, collect", value);
    return 1;
}

/* Issue 33 item 1: a file readable by heapd only, "USER PASSWORD" or
 * "PASSWORD" (checked now, read again when the store opens). */
static int parse_store_credentials(parse_state *st, const key_desc *k, const char *value)
{
    hd_config *c = &st->cfg;
    char why[600], user[128], pass[256];
    (void)k;
    if (strlen(value) >= sizeof c->store_credentials)
        return key_msg(st, "store_credentials: the path is longer than %zu bytes", sizeof c->store_credentials - 1);
    if (value[0] && hd_store_check_credentials(value, user, sizeof user, pass, sizeof pass, why, sizeof why)) {
        explicit_bzero(pass, sizeof pass);
        return key_msg(st, "%s", why);
    }
    explicit_bzero(pass, sizeof pass);
    snprintf(c->store_credentials, sizeof c->store_credentials, "%s", value);
    return 1;
}

/* Issue 33 item 1: the cluster key file (the credentials file's checks). */
static int parse_store_key(parse_state *st, const key_desc *k, const char *value)
{
    hd_config *c = &st->cfg;
    char why[600];
    (void)k;
    if (strlen(value) >= sizeof c->store_key)
        return key_msg(st, "store_key: the path is longer than %zu bytes", sizeof c->store_key - 1);
    if (value[0] && hd_store_check_key(value, NULL, 0, NULL, why, sizeof why))
        return key_msg(st, "%s", why);
    snprintf(c->store_key, sizeof c->store_key, "%s", value);
    return 1;
}

static int parse_store(parse_state *st, const key_desc *k, const char *value)
{
    hd_config *c = &st->cfg;
    char why[400];
    (void)k;
    if (value[0] && strlen(value) >= sizeof c->store)
        return key_msg(st, "store: the URL is longer than %zu bytes", sizeof c->store - 1);
    /* The parser heapd uses at start: what passes here, heapd accepts. */
    if (value[0] && hd_store_check_url(value, why, sizeof why))
        return key_msg(st, "store: %s", why);
    snprintf(c->store, sizeof c->store, "%s", value);
    return 1;
}

static int parse_node(parse_state *st, const key_desc *k, const char *value)
{
    hd_config *c = &st->cfg;
    (void)k;
    size_t n = strlen(value);
    if (n == 0)
        return 1; /* empty: the host name */
    bool okname = n >= 1 && n < sizeof c->node;
    for (size_t i = 0; okname && i < n; i++)
        okname = (value[i] >= 'a' && value[i] <= 'z') || (value[i] >= 'A' && value[i] <= 'Z') ||
                 (value[i] >= '0' && value[i] <= '9') || value[i] == '.' || value[i] == '_' || value[i] == '-';
    if (!okname)
        return key_msg(st, "node: \"%s\" must be 1 to 64 of A-Z a-z 0-9 . _ -", value);
    snprintf(c->node, sizeof c->node, "%s", value);
    return 1;
}

static int parse_admin_group(parse_state *st, const key_desc *k, const char *value)
{
    hd_config *c = &st->cfg;
    (void)k;
    if (!value[0]) {
        c->admin_group[0] = 0;
        c->admin_gid = -1;
        return 1;
    }
    struct group *g = getgrnam(value);
    if (!g || strlen(value) >= sizeof c->admin_group)
        return key_msg(st,
                       "admin_group: no group named \"%s\" on this system (create it, or leave "
                       "admin_group empty)",
                       value);
    snprintf(c->admin_group, sizeof c->admin_group, "%s", value);
    c->admin_gid = (long)g->gr_gid;
    return 1;
}

/* The request rings' keys (issue 16): ring, ring_spin_us, ring_backoff_us.
 * 1: taken, 0: bad value (st->msg), -1: not a ring key. */
static int ring_key(parse_state *st, const char *name, const char *value)
{
    hd_config *c = &st->cfg;
    uint32_t u;
    if (!strcmp(name, "ring")) {
        if (strcmp(value, "on") && strcmp(value, "off")) {
            snprintf(st->msg, sizeof st->msg, "ring: \"%s\" is not on or off", value);
            return 0;
        }
        c->ring = !strcmp(value, "on");
        return 1;
    }
    int spin = !strcmp(name, "ring_spin_us");
    if (spin || !strcmp(name, "ring_backoff_us")) {
        long *field = spin ? &c->ring_spin_us : &c->ring_backoff_us;
        if (!strcmp(value, "auto")) {
            *field = -1;
            return 1;
        }
        if (parse_u32(value, 0, 1000000, &u)) {
            snprintf(st->msg, sizeof st->msg, "%s: \"%s\" is not auto or a number of microseconds (0..1000000)", name,
                     value);
            return 0;
        }
        *field = (long)u;
        return 1;
    }
    return -1;
}

/* The ring keys through ring_key (issue 16). */
static int parse_ring(parse_state *st, const key_desc *k, const char *value) { return ring_key(st, k->name, value); }

#define OFF(field) offsetof(hd_config, field)
static const key_desc keys[] = {
    {"socket", parse_socket, 0, 0, 0, NULL, -1},
    {"socket_mode", parse_socket_mode, 0, 0, 0, NULL, -1},
    {"backend", parse_backend, 0, 0, 0, NULL, -1},
    {"log_level", parse_log_level, 0, 0, 0, NULL, -1},
    {"log_format", parse_log_format, 0, 0, 0, NULL, -1},
    {"policy", parse_policy, 0, 0, 0, NULL, -1},
    {"reclaim", parse_reclaim, 0, 0, 0, NULL, -1},
    {"quota_heap", parse_size_key, OFF(quota_heap), 0, 0, NULL, -1},
    {"quota_uid", parse_size_key, OFF(quota_uid), 0, 0, NULL, -1},
    {"store", parse_store, 0, 0, 0, NULL, -1},
    {"store_credentials", parse_store_credentials, 0, 0, 0, NULL, -1},
    {"store_key", parse_store_key, 0, 0, 0, NULL, -1},
    {"node", parse_node, 0, 0, 0, NULL, -1},
    {"admin_group", parse_admin_group, 0, 0, 0, NULL, -1},
    {"chunk_size", parse_size_key, OFF(chunk_size), 4096, 0, NULL, L_CHUNK},
    {"initial_size", parse_size_key, OFF(initial_size), 0, 0, NULL, L_INITIAL},
    {"va_size", parse_size_key, OFF(va_size), 4096, 0, NULL, L_VA},
    {"min_block", parse_size_key, OFF(min_block), 1, 0, NULL, L_MIN_BLOCK},
    {"collect_timeout_ms", parse_u32_key, OFF(collect_timeout_ms), 1, 86400000, "a number of milliseconds", -1},
    {"reclaim_lookahead", parse_u32_key, OFF(reclaim_lookahead), 0, HD_CONFIG_LOOKAHEAD_MAX, "a number of allocations",
     -1},
    {"grow_ahead", parse_u32_key, OFF(grow_ahead), 0, HD_CONFIG_GROW_AHEAD_MAX, "a number of chunks", -1},
    {"trim_threshold", parse_size_key, OFF(trim_threshold), 0, 0, NULL, -1}, /* issue 30; 0: off */
    /* Issue 29: 0xFFFFFFFF is the wire's "none" (HeapParams.persist_s). */
    {"persist", parse_u32_key, OFF(persist), 0, UINT32_MAX - 1, "a number of seconds", -1},
    {"max_persist", parse_u32_key, OFF(max_persist), 0, UINT32_MAX - 1, "a number of seconds", -1},
    {"max_clients", parse_u32_key, OFF(max_clients), 1, 1000000, "a number", -1},
    /* Transport limits (issue 15): per uid (root exempt), per connection. */
    {"admin_reserve", parse_u32_key, OFF(admin_reserve), 0, 1024, "a number of connections", -1},
    {"max_clients_per_uid", parse_u32_key, OFF(max_clients_per_uid), 1, 1000000, "a number", -1},
    {"max_fds_per_uid", parse_u32_key, OFF(max_fds_per_uid), 1, 1000000, "a number", -1},
    {"max_queue_per_uid", parse_size_key, OFF(max_queue_per_uid), 5 << 20, 0, NULL, -1},
    {"hello_timeout_ms", parse_u32_key, OFF(hello_timeout_ms), 10, 3600000, "a number of milliseconds", -1},
    {"max_frame_before_hello", parse_u32_key, OFF(max_frame_before_hello), 64, 4u << 20, "a number of bytes", -1},
    {"max_fds_per_conn", parse_u32_key, OFF(max_fds_per_conn), 1, 1024, "a number", -1},
    {"max_queue_per_conn", parse_size_key, OFF(max_queue_per_conn), 5 << 20, 0, NULL, -1},
    {"max_queued_fds_per_conn", parse_u32_key, OFF(max_queued_fds_per_conn), 1, 1000000, "a number", -1},
    {"max_queued_fds_per_uid", parse_u32_key, OFF(max_queued_fds_per_uid), 1, 1000000, "a number", -1},
    /* At least one sendmsg's batch (HW_FDS_PER_MSG = 250), or fds never go. */
    {"max_inflight_fds_per_conn", parse_u32_key, OFF(max_inflight_fds_per_conn), 250, 1000000, "a number", -1},
    {"max_inflight_fds_per_uid", parse_u32_key, OFF(max_inflight_fds_per_uid), 250, 1000000, "a number", -1},
    {"max_chunk_fds_per_uid", parse_u32_key, OFF(max_chunk_fds_per_uid), 0, INT32_MAX, "a number of chunks", -1},
    {"max_chunks", parse_u32_key, OFF(max_chunks), 1, INT32_MAX, "a number of chunks", -1},
    {"max_blocks", parse_u32_key, OFF(max_blocks), 1, UINT32_MAX, "a number of min_blocks", -1},
    {"meminfo_interval_ms", parse_u32_key, OFF(meminfo_interval_ms), 10, 3600000, "a number of milliseconds", -1},
    /* Request rings (issue 16). */
    {"ring", parse_ring, 0, 0, 0, NULL, -1},
    {"ring_spin_us", parse_ring, 0, 0, 0, NULL, -1},
    {"ring_backoff_us", parse_ring, 0, 0, 0, NULL, -1},
};
#undef OFF

static const key_desc *find_key(const char *name)
{
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(name, keys[i].name))
            return &keys[i];
    return NULL;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
    parse_state *st = user;
    if (st->stop)
        return 1;
    if (section[0]) {
        fail_at(st, "unknown section [%s]: heapd.conf has no sections", section);
        return 0;
    }
    const key_desc *k = find_key(name);
    int rc = k ? k->parse(st, k, value) : key_msg(st, "unknown key \"%s\" (see heapd.conf(5) for the keys)", name);
    if (rc == 0) {
        /* A value with a # in it may be a comment without a space before it. */
        char m[sizeof st->msg];
        snprintf(m, sizeof m, "%s", st->msg);
        st->msg[0] = 0;
        fail_at(st, "%s%s", m,
                strchr(value, '#') ? " (a # starts a comment only after a space: "
                                     "`key = value # comment`)"
                                   : "");
    } else {
        st->nkeys++;
        if (k->line_slot >= 0)
            st->key_line[k->line_slot] = st->line;
    }
    return rc;
}

/* The heap-default rules of ha_params_check, each blamed on the key of the
 * file that breaks it (the one set there; the later line when both are),
 * with its line and the values in binary units. */
static int cross_check(const parse_state *st, const char *path, char *err, size_t errlen)
{
    const hd_config *n = &st->cfg;
    const int *L = st->key_line;
    char a[40], b[40], cc[40];
#define SZ(v, buf) (hsz_format_size((v), (buf), sizeof(buf)) ? (buf) : "?")
#define WHERE(i)   (L[i] ? "" : " (the default)")
    if (n->min_block & (n->min_block - 1)) {
        snprintf(err, errlen, "%s:%d: min_block = %s is not a power of two (512, 4K, 64K...)", path, L[L_MIN_BLOCK],
                 SZ(n->min_block, a));
        return -1;
    }
    if (n->chunk_size % n->min_block) {
        int chunk = L[L_CHUNK] >= L[L_MIN_BLOCK];
        snprintf(err, errlen, "%s:%d: chunk_size = %s%s is not a multiple of min_block = %s%s; change %s", path,
                 chunk ? L[L_CHUNK] : L[L_MIN_BLOCK], SZ(n->chunk_size, a), WHERE(L_CHUNK), SZ(n->min_block, b),
                 WHERE(L_MIN_BLOCK), chunk ? "chunk_size" : "min_block");
        return -1;
    }
    if (n->initial_size && n->initial_size % n->chunk_size) {
        int init = L[L_INITIAL] >= L[L_CHUNK];
        snprintf(err, errlen,
                 "%s:%d: initial_size = %s%s is not a whole number of chunks of chunk_size = %s%s; "
                 "change %s (or set initial_size = 0: one chunk)",
                 path, init ? L[L_INITIAL] : L[L_CHUNK], SZ(n->initial_size, a), WHERE(L_INITIAL), SZ(n->chunk_size, b),
                 WHERE(L_CHUNK), init ? "initial_size" : "chunk_size");
        return -1;
    }
    uint64_t init = n->initial_size ? n->initial_size : n->chunk_size;
    if (n->va_size % n->chunk_size) {
        if (L[L_VA] > L[L_CHUNK])
            snprintf(err, errlen,
                     "%s:%d: va_size = %s is not a whole number of chunks of chunk_size = %s%s; "
                     "use a multiple of chunk_size",
                     path, L[L_VA], SZ(n->va_size, a), SZ(n->chunk_size, b), WHERE(L_CHUNK));
        else
            snprintf(err, errlen,
                     "%s:%d: chunk_size = %s does not divide va_size = %s%s (a heap maps whole "
                     "chunks); use a chunk_size that divides it (a power of two such as 2M, 4M or 64M) or "
                     "change va_size",
                     path, L[L_CHUNK], SZ(n->chunk_size, a), SZ(n->va_size, b), WHERE(L_VA));
        return -1;
    }
    if (n->va_size < init) {
        int va = L[L_VA] > (L[L_INITIAL] > L[L_CHUNK] ? L[L_INITIAL] : L[L_CHUNK]);
        snprintf(err, errlen, "%s:%d: va_size = %s%s is below the initial mapping (%s%s); raise va_size", path,
                 va ? L[L_VA] : (L[L_INITIAL] ? L[L_INITIAL] : L[L_CHUNK]), SZ(n->va_size, a), WHERE(L_VA),
                 SZ(init, cc), n->initial_size ? ", initial_size" : ", one chunk_size");
        return -1;
    }
#undef SZ
#undef WHERE
    return 0;
}

/* Opens PATH for parsing: never blocks (a FIFO is refused, not waited on),
 * never reads a directory. Returns the stream, or NULL with the sentence. */
static FILE *open_config(const char *path, bool reload, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        close(fd);
        snprintf(err, errlen,
                 "%s: is a directory, not a configuration file; give the path of heapd.conf "
                 "(e.g. %s/heapd.conf)",
                 path, path);
        return NULL;
    }
    /* A FIFO or socket would block the loop; at start /dev/null is fine. */
    if (!S_ISREG(sb.st_mode) && (reload || !S_ISCHR(sb.st_mode))) {
        close(fd);
        snprintf(err, errlen, "%s: is not a regular file; give the path of heapd.conf", path);
        return NULL;
    }
    FILE *f = fdopen(fd, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

static int load(const char *path, bool reload, hd_config *c, char *err, size_t errlen)
{
    parse_state st;
    memset(&st, 0, sizeof st);
    st.cfg = *c;
    st.f = open_config(path, reload, err, errlen);
    if (!st.f)
        return -1;
    int rc = ini_parse_stream(reader, &st, handler, &st);
    int rerr = ferror(st.f) ? errno : 0;
    fclose(st.f);
    if (rerr) {
        snprintf(err, errlen, "%s: cannot read the file: %s", path, strerror(rerr));
        return -1;
    }
    if (st.err_line && (rc <= 0 || st.err_line <= rc)) {
        snprintf(err, errlen, "%s:%d: %s", path, st.err_line, st.msg);
        return -1;
    }
    if (rc > 0) {
        snprintf(err, errlen, "%s:%d: syntax error: expected `key = value`", path, rc);
        return -1;
    }
    if (rc < 0) {
        snprintf(err, errlen, "%s: cannot read the file", path);
        return -1;
    }
    if (reload && !st.nkeys) {
        snprintf(err, errlen,
                 "%s: has no keys (empty, or only comments); a reload would set every key, "
                 "quota_uid and admin_group too, to its built-in default. Write the configuration, then "
                 "send SIGHUP again",
                 path);
        return -1;
    }
    /* Cross-key checks: the defaults must make a valid heap. */
    hd_config *n = &st.cfg;
    if (cross_check(&st, path, err, errlen))
        return -1;
    if (n->persist > n->max_persist) {
        snprintf(err, errlen, "%s: persist = %u is over max_persist = %u; lower persist or raise max_persist", path,
                 n->persist, n->max_persist);
        return -1;
    }
    ha_params p = {.ranks = 1,
                   .chunk_size = n->chunk_size,
                   .initial_size = n->initial_size ? n->initial_size : n->chunk_size,
                   .va_size = n->va_size,
                   .min_block = n->min_block,
                   .policy = n->policy};
    char why[200];
    if (ha_params_check(&p, why, sizeof why)) {
        snprintf(err, errlen, "%s: the heap defaults are inconsistent: %s", path, why);
        return -1;
    }
    if (n->va_size / n->chunk_size > n->max_chunks || n->va_size / n->min_block > n->max_blocks) {
        bool chunks = n->va_size / n->chunk_size > n->max_chunks;
        snprintf(err, errlen,
                 "%s: the heap defaults are over heapd's limits: va_size / %s = %llu, over %s = %u; "
                 "lower va_size, raise %s or %s",
                 path, chunks ? "chunk_size" : "min_block",
                 (unsigned long long)(n->va_size / (chunks ? n->chunk_size : n->min_block)),
                 chunks ? "max_chunks" : "max_blocks", chunks ? n->max_chunks : n->max_blocks,
                 chunks ? "chunk_size" : "min_block", chunks ? "max_chunks" : "max_blocks");
        return -1;
    }
    *c = *n;
    return 0;
}

int hd_config_load(const char *path, hd_config *c, char *err, size_t errlen)
{
    return load(path, false, c, err, errlen);
}

int hd_config_reload(const char *path, hd_config *c, char *err, size_t errlen)
{
    return load(path, true, c, err, errlen);
}
