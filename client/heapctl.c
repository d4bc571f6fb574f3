/* heapctl - operator's command line for heapd: list heaps, show statistics,
 * force a collect, drop a detached heap. Talks to heapd through libheapc (heapc.h). */
#include "heapc.h"
#include "heapctl.h"
#include "utf8.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef HEAPD_VERSION
#define HEAPD_VERSION "unknown"
#endif

/* --timeout: how long heapctl waits for heapd's answers. */
#define DEFAULT_TIMEOUT_MS 5000

#define EXIT_OPFAIL 1
#define EXIT_USAGE  2

static void usage(FILE *f)
{
    fprintf(f, "Usage: heapctl [--socket PATH] [--json] [--timeout SEC] COMMAND [ARGS]\n"
               "\n"
               "Inspect and steer heapd, the per-node symmetric heap daemon.\n"
               "\n"
               "Commands:\n"
               "  heaps           List the heaps heapd serves, one line each: name, world size,\n"
               "                  connected clients, bytes mapped per rank, allocation policy,\n"
               "                  owner uid and, for a heap whose clients are all gone, how long\n"
               "                  it has been detached and how long it persists, and for a heap\n"
               "                  whose memory is not active its state (memory released).\n"
               "  stats [HEAP]    Statistics of HEAP (default: every heap): per heap the bytes\n"
               "                  mapped, live (held by some rank), released (released by every\n"
               "                  rank, awaiting a collect) and free, collects, growths, clients,\n"
               "                  owner, state (attached, or detached with its age and persist),\n"
               "                  allocations decided, the pending forced collect, parameters and\n"
               "                  device memory, collects the allocator skipped (SKIPPED), when\n"
               "                  freed blocks are reused (RECLAIM: eager or collect) and the\n"
               "                  blocks reused with no collect (EAGER); per\n"
               "                  rank whether it is attached, its pid, live and released bytes,\n"
               "                  its next allocation number, its blocks waiting for their\n"
               "                  stream (STREAM_WAIT) and its collects without a device sync\n"
               "                  (NO_SYNC), both as of its last collect; per heap its memory\n"
               "                  (MEMORY: active, releasing, released or restoring; see\n"
               "                  heapc_release), the chunk bytes backed by memory now\n"
               "                  (RESIDENT), heapd's host copy (HOST_COPY), releases, restores,\n"
               "                  and the spare chunks made ahead of growth (SPARE; GROW_AHEAD:\n"
               "                  the spares each rank keeps, 0: none), trims and the chunk bytes\n"
               "                  they gave back (TRIMS, TRIMMED; heapc_trim, automatic ones\n"
               "                  included; TRIM_THRESHOLD: the automatic trim's, -: none).\n"
               "  collect HEAP    Force a collect on HEAP: every rank collects at the same\n"
               "                  allocation number, which heapctl prints. Ranks reach it when\n"
               "                  they next allocate.\n"
               "  drop HEAP       Release HEAP, a detached heap (its clients all gone; see\n"
               "                  heaps), now, with its memory. Refused while clients are\n"
               "                  attached. Its owner, root and heapd.conf's admin_group may.\n"
               "  metrics [FILE]  Every figure in the Prometheus text exposition format\n"
               "                  (heapd_* families), on stdout or into FILE, replaced\n"
               "                  atomically (node_exporter's textfile collector). When heapd\n"
               "                  cannot be reached: heapd_up 0, exit status 1.\n"
               "\n"
               "Options:\n"
               "  -s, --socket PATH  heapd's socket (default: $HEAPD_SOCKET, else\n"
               "                     " HEAPC_DEFAULT_SOCKET ")\n"
               "  -j, --json         print one JSON object on stdout instead of text\n"
               "  -t, --timeout SEC  wait at most SEC seconds for each answer of heapd\n"
               "                     (default 5; 0: no limit); a stopped or hung heapd\n"
               "                     then fails with exit status 1\n"
               "  -h, --help         print this help and exit\n"
               "  -V, --version      print heapctl's version and exit\n"
               "\n"
               "Options may come before or after the command. Sizes in text output are\n"
               "binary (1 KiB = 1024 B); JSON gives every size in bytes.\n"
               "\n"
               "Exit status: 0 success, 1 heapd could not be reached or refused the\n"
               "operation (the message on stderr says why), 2 usage error.\n"
               "\n"
               "Examples:\n"
               "  heapctl heaps\n"
               "  heapctl stats trainer\n"
               "  heapctl --json stats | jq '.heaps[].collects'\n"
               "  heapctl --socket /tmp/heapd.sock collect trainer\n"
               "  heapctl drop trainer\n"
               "  heapctl metrics /var/lib/prometheus/node-exporter/heapd.prom\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("heapctl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nTry 'heapctl --help'.\n", stderr);
    return EXIT_USAGE;
}

/* getopt_long's '?': an unknown option, or a value given to one that takes
 * none (--json=1). arg is the word getopt stopped at. */
static int bad_option(const struct option *opts, const char *arg, int opt)
{
    if (arg && !strncmp(arg, "--", 2)) {
        const char *eq = strchr(arg, '=');
        size_t n = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        for (const struct option *o = opts; o->name; o++)
            if (eq && o->has_arg == no_argument && strlen(o->name) == n && !strncmp(o->name, arg + 2, n))
                return usage_error("option --%s takes no value (got %s)", o->name, arg);
        return usage_error("unknown option %.*s", (int)(eq ? (size_t)(eq - arg) : strlen(arg)), arg);
    }
    if (opt)
        return usage_error("unknown option -%c", opt);
    return usage_error("unknown option %s", arg ? arg : "");
}

/* "5", "0.5", "30s": seconds; "0": no limit (-1). */
static int parse_timeout(const char *v, int *ms)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || errno || d < 0 || d > 86400 || (*end && strcmp(end, "s")))
        return -1;
    *ms = d == 0 ? -1 : (int)(d * 1000 + 0.5);
    if (*ms == 0)
        *ms = 1;
    return 0;
}

static int op_error(heapc *c)
{
    fprintf(stderr, "heapctl: %s\n", heapc_errstr(c));
    return EXIT_OPFAIL;
}

/* ---- UTF-8 ----------------------------------------------------------------- */

/* hu_len (common/utf8.h): names from heapd are bytes; output must be UTF-8. */
#define utf8_len hu_len

/* ---- text helpers -------------------------------------------------------- */

/* "0 B", "1000 B", "4 KiB", "12.5 MiB": exact values without decimals. */
static const char *human(uint64_t v, char *buf, size_t len)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    double d = (double)v;
    while (d >= 1024.0 && u < 6) {
        d /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%" PRIu64 " B", v);
    else if (v % ((uint64_t)1 << (10 * u)) == 0)
        snprintf(buf, len, "%" PRIu64 " %s", v >> (10 * u), units[u]);
    else
        snprintf(buf, len, "%.1f %s", d, units[u]);
    return buf;
}

#define MAXCOL 16 /* the widest table: 16 (parameters) */
/* Heap names are up to 255 bytes; a cell holds one whole, as UTF-8 (an
 * invalid byte becomes U+FFFD, 3 bytes): never truncated. */
#define CELL 1024

typedef struct table {
    int ncol;
    const char *head[MAXCOL];
    int right[MAXCOL]; /* right-align this column */
    char (*cells)[MAXCOL][CELL];
    size_t nrows, cap;
} table;

static void tbl_init(table *t, int ncol, const char *const *head, const int *right)
{
    memset(t, 0, sizeof *t);
    t->ncol = ncol;
    for (int i = 0; i < ncol; i++) {
        t->head[i] = head[i];
        t->right[i] = right[i];
    }
}

/* Appends a row; cells filled with tbl_set. NULL when out of memory. */
static char (*tbl_row(table *t))[CELL]
{
    if (t->nrows == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 16;
        void *n = realloc(t->cells, ncap * sizeof *t->cells);
        if (!n)
            return NULL;
        t->cells = n;
        t->cap = ncap;
    }
    memset(t->cells[t->nrows], 0, sizeof t->cells[t->nrows]);
    return t->cells[t->nrows++];
}

static void cellf(char *cell, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cellf(char *cell, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cell, CELL, fmt, ap);
    va_end(ap);
}

/* A name into a cell: valid UTF-8, control characters as U+FFFD. */
static void cellname(char *cell, const char *s)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p && o + 4 < CELL;) {
        int n = utf8_len(p);
        if (!n || *p < 0x20 || *p == 0x7f) {
            memcpy(cell + o, "\xef\xbf\xbd", 3);
            o += 3;
            p += n ? n : 1;
            continue;
        }
        memcpy(cell + o, p, (size_t)n);
        o += (size_t)n;
        p += n;
    }
    cell[o] = 0;
}

/* Display width: code points (cells hold valid UTF-8). */
static int width(const char *s)
{
    int w = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        w += (*p & 0xc0) != 0x80;
    return w;
}

static void tbl_print(const table *t, const char *indent)
{
    int w[MAXCOL];
    for (int i = 0; i < t->ncol; i++) {
        w[i] = (int)strlen(t->head[i]);
        for (size_t r = 0; r < t->nrows; r++) {
            int l = width(t->cells[r][i]);
            if (l > w[i])
                w[i] = l;
        }
    }
    for (size_t r = 0; r <= t->nrows; r++) {
        fputs(indent, stdout);
        for (int i = 0; i < t->ncol; i++) {
            const char *s = r == 0 ? t->head[i] : t->cells[r - 1][i];
            int last = i == t->ncol - 1;
            int pad = w[i] - width(s);
            if (t->right[i])
                printf("%*s%s", pad, "", s);
            else if (last)
                printf("%s", s);
            else
                printf("%s%*s", s, pad, "");
            if (!last)
                fputs("  ", stdout);
        }
        putchar('\n');
    }
}

static void tbl_free(table *t)
{
    free(t->cells);
    t->cells = NULL;
}

/* ---- commands ------------------------------------------------------------- */

/* `metrics [FILE]`: stdout, or FILE replaced atomically (heapctl_prom_file).
 * When heapd cannot be reached the output still says so (heapd_up 0) and
 * heapctl exits 1. */
static int cmd_metrics(const char *sock, int timeout_ms, const char *file)
{
    heapc *c = heapc_connect_timeout(sock, timeout_ms);
    if (!c) {
        fprintf(stderr, "heapctl: out of memory\n");
        return EXIT_OPFAIL;
    }
    heapc_daemon_stats *s = NULL;
    int rc = 0;
    if (heapc_err(c) || heapc_stats(c, NULL, &s) != HEAPC_OK) {
        op_error(c);
        s = NULL;
        rc = EXIT_OPFAIL;
    }
    int wrc = file ? heapctl_prom_file(file, s) : (heapctl_prom_write(stdout, s), fflush(stdout));
    heapc_stats_free(s);
    heapc_free_ctx(c);
    return wrc == 0 ? rc : EXIT_OPFAIL;
}

/* A heap's state: "attached", or "detached 12s, persists 600s" (issue 29). */
static const char *state_text(const heapc_heap_stats *h, char *buf, size_t len)
{
    if (h->clients || !h->detached_ms) /* detached_ms > 0 while detached */
        snprintf(buf, len, "attached");
    else
        snprintf(buf, len, "detached %" PRIu64 "s, persists %" PRIu32 "s", h->detached_ms / 1000, h->persist_s);
    return buf;
}

static int cmd_heaps(heapc *c, int json)
{
    heapc_daemon_stats *s;
    if (heapc_stats(c, NULL, &s) != HEAPC_OK)
        return op_error(c);
    if (json) {
        heapctl_json_stats(s, 0);
    } else {
        int wn = 0;
        char name[CELL];
        for (size_t i = 0; i < s->nheaps; i++) {
            cellname(name, s->heaps[i].name);
            int l = width(name);
            wn = l > wn ? l : wn;
        }
        for (size_t i = 0; i < s->nheaps; i++) {
            const heapc_heap_stats *h = &s->heaps[i];
            char m[32], st[64];
            cellname(name, h->name);
            printf("%s%*s  world %" PRIu32 "  clients %" PRIu32 "  mapped %s  policy %s  owner %" PRIu32 "  %s%s%s\n",
                   name, wn - width(name), "", h->world_size, h->clients, human(h->mapped, m, sizeof m),
                   heapc_policy_name(h->params.policy), h->owner_uid, state_text(h, st, sizeof st),
                   h->state ? "  memory " : "", h->state ? heapctl_state_name(h->state) : "");
        }
    }
    heapc_stats_free(s);
    return fflush(stdout) == 0 ? 0 : EXIT_OPFAIL;
}

/* `stats`: the heap table's and the parameter table's rows of heap h; -1 when
 * out of memory. */
static int stats_heap_rows(table *th, table *tp, const heapc_heap_stats *h)
{
    char(*row)[CELL] = tbl_row(th);
    char(*prow)[CELL] = tbl_row(tp);
    if (!row || !prow)
        return -1;
    cellname(row[0], h->name);
    cellf(row[1], "%" PRIu32, h->world_size);
    cellf(row[2], "%" PRIu32, h->clients);
    cellf(row[3], "%" PRIu32, h->owner_uid);
    state_text(h, row[4], CELL);
    human(h->mapped, row[5], CELL);
    human(h->live_bytes, row[6], CELL);
    human(h->released_bytes, row[7], CELL);
    human(h->free_bytes, row[8], CELL);
    cellf(row[9], "%" PRIu64, h->collects);
    cellf(row[10], "%" PRIu64, h->growths);
    cellf(row[11], "%" PRIu64, h->next_seq);
    if (h->collect_pending)
        cellf(row[12], "%" PRIu64, h->pending_collect_seq);
    else
        cellf(row[12], "-");
    cellname(prow[0], h->name);
    cellf(prow[1], "%s", heapc_policy_name(h->params.policy));
    cellf(prow[2], "%s", h->params.reclaim == HEAPC_RECLAIM_EAGER ? "eager" : "collect");
    human(h->params.chunk_size, prow[3], CELL);
    human(h->params.initial_size, prow[4], CELL);
    human(h->params.va_size, prow[5], CELL);
    human(h->params.min_block, prow[6], CELL);
    cellf(prow[7], "%" PRIu32 " ms", h->params.collect_timeout_ms);
    cellf(prow[8], "%" PRIu64, h->epoch);
    if (h->device_total) {
        human(h->device_free, prow[9], CELL);
        human(h->device_total, prow[10], CELL);
    } else {
        cellf(prow[9], "-");
        cellf(prow[10], "-");
    }
    cellf(prow[11], "%" PRIu64, h->collects_skipped);
    human(h->bookkeeping_bytes, prow[12], CELL);
    cellf(prow[13], "%" PRIu64, h->eager_reclaims);
    cellf(prow[14], "%" PRIu32, h->grow_ahead);
    if (h->params.trim_threshold > 0) /* issue 30 */
        human((uint64_t)h->params.trim_threshold, prow[15], CELL);
    else
        cellf(prow[15], "-");
    return 0;
}

/* `stats`: the memory table's row of heap h (issue 30: its memory on this
 * node, released or not); -1 when out of memory. */
static int stats_mem_row(table *tm, const heapc_heap_stats *h)
{
    char(*row)[CELL] = tbl_row(tm);
    if (!row)
        return -1;
    cellname(row[0], h->name);
    cellf(row[1], "%s", heapctl_state_name(h->state));
    human(h->resident_bytes, row[2], CELL);
    human(h->host_copy_bytes, row[3], CELL);
    cellf(row[4], "%" PRIu64, h->releases);
    cellf(row[5], "%" PRIu64, h->restores);
    human(h->spare_bytes, row[6], CELL); /* issue 27 */
    cellf(row[7], "%" PRIu64, h->trims); /* issue 30 */
    human(h->trimmed_bytes, row[8], CELL);
    return 0;
}

/* `stats`: the rank table's rows of heap h; -1 when out of memory. */
static int stats_rank_rows(table *tr, const heapc_heap_stats *h)
{
    for (size_t r = 0; r < h->nranks; r++) {
        const heapc_rank_stats *k = &h->ranks[r];
        char(*rrow)[CELL] = tbl_row(tr);
        if (!rrow)
            return -1;
        cellname(rrow[0], h->name);
        cellf(rrow[1], "%" PRIu32, k->rank);
        cellf(rrow[2], "%s", k->attached ? "yes" : "no");
        if (k->pid)
            cellf(rrow[3], "%" PRIu32, k->pid);
        else
            cellf(rrow[3], "-");
        human(k->live_bytes, rrow[4], CELL);
        human(k->released_bytes, rrow[5], CELL);
        cellf(rrow[6], "%" PRIu64, k->next_seq);
        cellf(rrow[7], "%" PRIu64, k->stream_waiting);
        cellf(rrow[8], "%" PRIu64, k->device_waits_avoided);
    }
    return 0;
}

/* `stats` as text: the heap, parameter, memory and rank tables. */
static int stats_tables(const heapc_daemon_stats *s)
{
    static const char *hh[] = {"HEAP",     "WORLD", "CLIENTS",  "OWNER",   "STATE",  "MAPPED",    "LIVE",
                               "RELEASED", "FREE",  "COLLECTS", "GROWTHS", "ALLOCS", "COLLECT_AT"};
    static const int hr[] = {0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const char *ph[] = {"HEAP",        "POLICY",  "RECLAIM",    "CHUNK",         "INITIAL",      "VA",
                               "MIN_BLOCK",   "TIMEOUT", "EPOCH",      "DEVICE_FREE",   "DEVICE_TOTAL", "SKIPPED",
                               "BOOKKEEPING", "EAGER",   "GROW_AHEAD", "TRIM_THRESHOLD"};
    static const int pr[] = {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    static const char *rh[] = {"HEAP",     "RANK",     "ATTACHED",    "PID",    "LIVE",
                               "RELEASED", "NEXT_SEQ", "STREAM_WAIT", "NO_SYNC"};
    static const int rr[] = {0, 1, 0, 1, 1, 1, 1, 1, 1};
    static const char *mh[] = {"HEAP",     "MEMORY", "RESIDENT", "HOST_COPY", "RELEASES",
                               "RESTORES", "SPARE",  "TRIMS",    "TRIMMED"};
    static const int mr[] = {0, 0, 1, 1, 1, 1, 1, 1, 1};
    table th, tp, tm, tr;
    tbl_init(&th, 13, hh, hr);
    tbl_init(&tp, 16, ph, pr);
    tbl_init(&tm, 9, mh, mr);
    tbl_init(&tr, 9, rh, rr);
    int rc = 0;
    for (size_t i = 0; i < s->nheaps && rc == 0; i++) {
        if (stats_heap_rows(&th, &tp, &s->heaps[i]) != 0 || stats_mem_row(&tm, &s->heaps[i]) != 0 ||
            stats_rank_rows(&tr, &s->heaps[i]) != 0)
            rc = EXIT_OPFAIL;
    }
    if (rc == 0) {
        putchar('\n');
        tbl_print(&th, "");
        putchar('\n');
        tbl_print(&tp, "");
        putchar('\n');
        tbl_print(&tm, "");
        if (tr.nrows) {
            putchar('\n');
            tbl_print(&tr, "");
        }
    } else {
        fprintf(stderr, "heapctl: out of memory formatting the statistics\n");
    }
    tbl_free(&th);
    tbl_free(&tp);
    tbl_free(&tm);
    tbl_free(&tr);
    return rc;
}

static int cmd_stats(heapc *c, const char *heap, int json)
{
    heapc_daemon_stats *s;
    if (heapc_stats(c, heap, &s) != HEAPC_OK)
        return op_error(c);
    if (json) {
        heapctl_json_stats(s, 1);
        heapc_stats_free(s);
        return fflush(stdout) == 0 ? 0 : EXIT_OPFAIL;
    }
    printf("heapd %s, backend %s, %" PRIu32 " client%s, %zu heap%s\n", s->version, s->backend, s->clients,
           s->clients == 1 ? "" : "s", s->nheaps, s->nheaps == 1 ? "" : "s");
    int rc = s->nheaps ? stats_tables(s) : 0;
    heapc_stats_free(s);
    if (fflush(stdout) != 0)
        rc = EXIT_OPFAIL;
    return rc;
}

static int cmd_collect(heapc *c, const char *heap, int json)
{
    uint64_t at = 0;
    if (heapc_force_collect(c, heap, &at) != HEAPC_OK)
        return op_error(c);
    if (json) {
        fputs("{\"heap\": ", stdout);
        heapctl_json_str(heap);
        printf(", \"at_seq\": %" PRIu64 "}\n", at);
    } else {
        printf("collect on heap %s takes effect at allocation %" PRIu64 "\n", heap, at);
    }
    return fflush(stdout) == 0 ? 0 : EXIT_OPFAIL;
}

/* `drop HEAP` (issue 29): a detached heap released now. */
static int cmd_drop(heapc *c, const char *heap, int json)
{
    uint64_t released = 0;
    if (heapc_drop(c, heap, &released) != HEAPC_OK)
        return op_error(c);
    char b[32];
    if (json) {
        fputs("{\"heap\": ", stdout);
        heapctl_json_str(heap);
        printf(", \"released_bytes\": %" PRIu64 "}\n", released);
    } else {
        printf("heap %s dropped: %s of chunks released\n", heap, human(released, b, sizeof b));
    }
    return fflush(stdout) == 0 ? 0 : EXIT_OPFAIL;
}

/* heaps 0, stats 1, collect 2, metrics 3, drop 4; else as command(). */
static int command_number(const char *cmd)
{
    if (!strcmp(cmd, "heaps"))
        return 0;
    if (!strcmp(cmd, "stats"))
        return 1;
    if (!strcmp(cmd, "collect"))
        return 2;
    if (!strcmp(cmd, "metrics"))
        return 3;
    if (!strcmp(cmd, "drop"))
        return 4;
    if (!strcmp(cmd, "help")) {
        usage(stdout);
        return -1;
    }
    return -1 - usage_error("unknown command '%s' (heaps, stats, collect, metrics, drop)", cmd);
}

/* The command's number (heaps 0, stats 1, collect 2, metrics 3, drop 4) when it and
 * its arguments are valid; else -1 - the exit status (help: printed, 0; a
 * usage error: reported, EXIT_USAGE). */
static int command(const char *cmd, int nargs, char **args, int json)
{
    int want = command_number(cmd);
    if (want < 0)
        return want;
    if (want == 0 && nargs > 0)
        return -1 - usage_error("heaps takes no argument");
    if (want == 1 && nargs > 1)
        return -1 - usage_error("stats takes at most one heap name");
    const char *what = want == 2 ? "collect" : "drop";
    if ((want == 2 || want == 4) && nargs != 1)
        return -1 - usage_error("%s takes exactly one heap name", what);
    if ((want == 2 || want == 4) && !*args[0])
        return -1 - usage_error("%s: the heap name is empty", what);
    if (want == 3 && nargs > 1)
        return -1 - usage_error("metrics takes at most one file name");
    if (want == 3 && json)
        return -1 - usage_error("metrics prints the Prometheus text format; --json does not apply");
    return want;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},  {"json", no_argument, NULL, 'j'},
        {"timeout", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},       {NULL, 0, NULL, 0},
    };
    const char *sock = NULL;
    int json = 0, o, timeout_ms = DEFAULT_TIMEOUT_MS;
    opterr = 0;
    while ((o = getopt_long(argc, argv, ":s:jt:hV", opts, NULL)) != -1) {
        switch (o) {
        case 's':
            sock = optarg;
            break;
        case 'j':
            json = 1;
            break;
        case 't':
            if (parse_timeout(optarg, &timeout_ms))
                return usage_error("--timeout %s: give seconds (0.5, 5, 30; 0: wait forever)", optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("heapctl %s\n", HEAPD_VERSION);
            return 0;
        case ':':
            return usage_error("option %s needs an argument", argv[optind - 1]);
        default:
            return bad_option(opts, argv[optind - 1], optopt);
        }
    }
    if (optind >= argc)
        return usage_error("no command given (heaps, stats, collect, metrics, drop)");
    const char *cmd = argv[optind];
    int nargs = argc - optind - 1;
    char **args = argv + optind + 1;
    if (sock && !*sock)
        return usage_error("--socket needs a path");

    int want = command(cmd, nargs, args, json);
    if (want < 0)
        return -want - 1; /* help: 0; a usage error: EXIT_USAGE */
    if (want == 3)
        return cmd_metrics(sock, timeout_ms, nargs ? args[0] : NULL);

    heapc *c = heapc_connect_timeout(sock, timeout_ms);
    if (!c) {
        fprintf(stderr, "heapctl: out of memory\n");
        return EXIT_OPFAIL;
    }
    if (heapc_err(c)) {
        int rc = op_error(c);
        heapc_free_ctx(c);
        return rc;
    }
    int rc;
    if (want == 0)
        rc = cmd_heaps(c, json);
    else if (want == 1)
        rc = cmd_stats(c, nargs ? args[0] : NULL, json);
    else if (want == 2)
        rc = cmd_collect(c, args[0], json);
    else
        rc = cmd_drop(c, args[0], json);
    heapc_free_ctx(c);
    return rc;
}
