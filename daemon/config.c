/* config.c - see config.h. */
#include "config.h"

#include <errno.h>
#include <stdbool.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <grp.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "size.h"

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
    c->collect_timeout_ms = 30000;
    c->max_clients = 1024;
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
}

typedef struct parse_state {
    FILE *f;
    int line;
    hd_config cfg;
    char msg[256];
} parse_state;

static char *reader(char *str, int num, void *stream)
{
    parse_state *st = stream;
    char *r = fgets(str, num, st->f);
    if (r)
        st->line++;
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

static int handler(void *user, const char *section, const char *name, const char *value)
{
    parse_state *st = user;
    hd_config *c = &st->cfg;
    uint64_t sz;
    uint32_t u;
    if (section[0]) {
        snprintf(st->msg, sizeof st->msg, "unknown section [%s]: heapd.conf has no sections", section);
        return 0;
    }
#define SIZE_KEY(key, field, min)                                                                  \
    if (!strcmp(name, key)) {                                                                      \
        if (hs_parse_size(value, &sz) || !size_at_least(sz, (min))) {                                             \
            snprintf(st->msg, sizeof st->msg,                                                      \
                     "%s: \"%s\" is not a size (bytes with optional K, M, G, T suffix, >= %llu)",  \
                     key, value, (unsigned long long)(min));                                       \
            return 0;                                                                              \
        }                                                                                          \
        c->field = sz;                                                                             \
        return 1;                                                                                  \
    }
    if (!strcmp(name, "socket")) {
        if (value[0] != '/' || strlen(value) >= sizeof c->socket_path) {
            snprintf(st->msg, sizeof st->msg, "socket: \"%s\" must be an absolute path shorter than %zu bytes",
                     value, sizeof c->socket_path);
            return 0;
        }
        snprintf(c->socket_path, sizeof c->socket_path, "%s", value);
        return 1;
    }
    if (!strcmp(name, "socket_mode")) {
        char *end;
        unsigned long m = strtoul(value, &end, 8);
        if (end == value || *end || m > 0777) {
            snprintf(st->msg, sizeof st->msg, "socket_mode: \"%s\" is not an octal mode such as 0660", value);
            return 0;
        }
        c->socket_mode = (unsigned)m;
        return 1;
    }
    if (!strcmp(name, "backend")) {
        if (strcmp(value, "auto") && strcmp(value, "cuda") && strcmp(value, "host")) {
            snprintf(st->msg, sizeof st->msg, "backend: \"%s\" is not one of auto, cuda, host", value);
            return 0;
        }
        snprintf(c->backend, sizeof c->backend, "%s", value);
        return 1;
    }
    if (!strcmp(name, "log_level")) {
        int l = hd_log_parse_level(value);
        if (l < 0) {
            snprintf(st->msg, sizeof st->msg, "log_level: \"%s\" is not one of error, warn, info, debug", value);
            return 0;
        }
        c->log_level = l;
        return 1;
    }
    if (!strcmp(name, "policy")) {
        if (ha_policy_parse(value, &c->policy)) {
            snprintf(st->msg, sizeof st->msg, "policy: \"%s\" is not one of coalesce, seed", value);
            return 0;
        }
        return 1;
    }
    SIZE_KEY("quota_heap", quota_heap, 0)
    SIZE_KEY("quota_uid", quota_uid, 0)
    if (!strcmp(name, "store")) {
        if (value[0] && (strncmp(value, "redis://", 8) || strlen(value) >= sizeof c->store || !value[8])) {
            snprintf(st->msg, sizeof st->msg, "store: \"%s\" is not redis://HOST:PORT (or empty for a single node)",
                     value);
            return 0;
        }
        snprintf(c->store, sizeof c->store, "%s", value);
        return 1;
    }
    if (!strcmp(name, "node")) {
        size_t n = strlen(value);
        if (n == 0)
            return 1; /* empty: the host name */
        bool okname = n >= 1 && n < sizeof c->node;
        for (size_t i = 0; okname && i < n; i++)
            okname = (value[i] >= 'a' && value[i] <= 'z') || (value[i] >= 'A' && value[i] <= 'Z') ||
                     (value[i] >= '0' && value[i] <= '9') || value[i] == '.' || value[i] == '_' ||
                     value[i] == '-';
        if (!okname) {
            snprintf(st->msg, sizeof st->msg, "node: \"%s\" must be 1 to 64 of A-Z a-z 0-9 . _ -", value);
            return 0;
        }
        snprintf(c->node, sizeof c->node, "%s", value);
        return 1;
    }
    if (!strcmp(name, "admin_group")) {
        if (!value[0]) {
            c->admin_group[0] = 0;
            c->admin_gid = -1;
            return 1;
        }
        struct group *g = getgrnam(value);
        if (!g || strlen(value) >= sizeof c->admin_group) {
            snprintf(st->msg, sizeof st->msg, "admin_group: no group named \"%s\" on this system (create it, or "
                     "leave admin_group empty)", value);
            return 0;
        }
        snprintf(c->admin_group, sizeof c->admin_group, "%s", value);
        c->admin_gid = (long)g->gr_gid;
        return 1;
    }
    SIZE_KEY("chunk_size", chunk_size, 4096)
    SIZE_KEY("initial_size", initial_size, 0)
    SIZE_KEY("va_size", va_size, 4096)
    SIZE_KEY("min_block", min_block, 1)
    if (!strcmp(name, "collect_timeout_ms")) {
        if (parse_u32(value, 1, 86400000, &u)) {
            snprintf(st->msg, sizeof st->msg, "collect_timeout_ms: \"%s\" is not a number of milliseconds (1..86400000)", value);
            return 0;
        }
        c->collect_timeout_ms = u;
        return 1;
    }
    if (!strcmp(name, "max_clients")) {
        if (parse_u32(value, 1, 1000000, &u)) {
            snprintf(st->msg, sizeof st->msg, "max_clients: \"%s\" is not a number (1..1000000)", value);
            return 0;
        }
        c->max_clients = u;
        return 1;
    }
    if (!strcmp(name, "meminfo_interval_ms")) {
        if (parse_u32(value, 10, 3600000, &u)) {
            snprintf(st->msg, sizeof st->msg, "meminfo_interval_ms: \"%s\" is not a number of milliseconds (10..3600000)", value);
            return 0;
        }
        c->meminfo_interval_ms = u;
        return 1;
    }
#undef SIZE_KEY
    snprintf(st->msg, sizeof st->msg, "unknown key \"%s\" (see heapd.conf(5) for the keys)", name);
    return 0;
}

int hd_config_load(const char *path, hd_config *c, char *err, size_t errlen)
{
    parse_state st;
    memset(&st, 0, sizeof st);
    st.cfg = *c;
    st.f = fopen(path, "r");
    if (!st.f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    int rc = ini_parse_stream(reader, &st, handler, &st);
    fclose(st.f);
    if (rc > 0) {
        snprintf(err, errlen, "%s:%d: %s", path, rc,
                 st.msg[0] ? st.msg : "syntax error: expected `key = value`");
        return -1;
    }
    if (rc < 0) {
        snprintf(err, errlen, "%s: cannot read the file", path);
        return -1;
    }
    /* Cross-key checks: the defaults must make a valid heap. */
    hd_config *n = &st.cfg;
    ha_params p = {.ranks = 1, .chunk_size = n->chunk_size,
                   .initial_size = n->initial_size ? n->initial_size : n->chunk_size,
                   .va_size = n->va_size, .min_block = n->min_block, .policy = n->policy};
    char why[200];
    if (ha_params_check(&p, why, sizeof why)) {
        snprintf(err, errlen, "%s: the heap defaults are inconsistent: %s", path, why);
        return -1;
    }
    *c = *n;
    return 0;
}
