/* heapd.c - the heapd program: options, config, backend, loop, signals. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "dispatch.h"
#include "heap.h"
#include "log.h"
#include "notify.h"
#include "ring.h"
#include "server.h"
#include "store.h"

/* A printf format: %s is the backend kinds (hb_kind_list). */
static const char usage[] = "usage: heapd [options]\n"
                            "\n"
                            "heapd owns GPU memory (or host memory) on this node and serves it to the ranks of\n"
                            "distributed jobs as a symmetric heap over a Unix socket.\n"
                            "\n"
                            "options:\n"
                            "  -c, --config FILE     configuration file (default " HD_DEFAULT_CONFIG " if it exists)\n"
                            "      --check-config    check the configuration, print the effective values, and exit\n"
                            "  -s, --socket PATH     Unix socket to listen on (overrides `socket`)\n"
                            "  -b, --backend KIND    %s (overrides `backend`)\n"
                            "  -l, --log-level LVL   error, warn, info or debug (overrides `log_level`)\n"
                            "  -h, --help            this help\n"
                            "  -V, --version         print the version\n"
                            "\n"
                            "signals: SIGTERM/SIGINT stop cleanly, SIGHUP reloads the configuration.\n"
                            "See heapd(8) and heapd.conf(5).\n";

typedef struct daemon_state {
    uv_loop_t *loop;
    hd_config cfg;
    const char *config_path;
    hb_backend *be;
    hd_registry *reg;
    hd_dispatch *disp;
    hd_server *srv;
    hd_store *store;
    uv_timer_t store_watch; /* reconnects and resubscribes to the store */
    int store_was_ready;
    uv_signal_t sigterm, sigint, sighup;
    uv_timer_t status;
    int stopping;
} daemon_state;

static void status_update(daemon_state *d)
{
    char buf[256];
    snprintf(buf, sizeof buf, "STATUS=%u heap(s), %u client(s), backend %s", hd_registry_heaps(d->reg),
             hd_server_clients(d->srv), hb_name(d->be));
    hd_notify(buf);
}

static void status_cb(uv_timer_t *t) { status_update(t->data); }

/* Forced-collect requests reach a node only while it is subscribed: keep the
 * store connections up, not only at collects. */
static void store_watch_cb(uv_timer_t *t)
{
    daemon_state *d = t->data;
    if (!d->store)
        return;
    int ready = hd_store_ready(d->store);
    const char *auth = hd_store_auth_error(d->store);
    if (ready != d->store_was_ready)
        hd_log(ready ? HD_LOG_INFO : HD_LOG_WARN, "store %s is %s%s%s", hd_store_url(d->store),
               ready ? "connected and subscribed" : "unreachable; reconnecting every 2 s",
               !ready && auth[0] ? ": " : "", !ready ? auth : "");
    d->store_was_ready = ready;
    if (!ready)
        hd_store_connect(d->store);
}

static void on_stop(uv_signal_t *s, int signum)
{
    daemon_state *d = s->data;
    if (d->stopping)
        return;
    d->stopping = 1;
    hd_info("received %s: stopping (refusing new requests, closing %u client(s))",
            signum == SIGTERM ? "SIGTERM" : "SIGINT", hd_server_clients(d->srv));
    hd_notify("STOPPING=1\nSTATUS=stopping");
    hd_server_shutdown(d->srv);
    if (d->store) {
        uv_timer_stop(&d->store_watch);
        uv_close((uv_handle_t *)&d->store_watch, NULL);
        hd_registry_set_store(d->reg, NULL);
        hd_store_close(d->store);
        d->store = NULL;
    }
    uv_signal_stop(&d->sigterm);
    uv_signal_stop(&d->sigint);
    uv_signal_stop(&d->sighup);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->sighup, NULL);
    uv_timer_stop(&d->status);
    uv_close((uv_handle_t *)&d->status, NULL);
}

/* The server's part of the configuration (at start; at SIGHUP the server
 * keeps its socket and max_clients). */
static hd_server_opts server_opts(const hd_config *c)
{
    _Static_assert(sizeof c->socket_path == sizeof((hd_server_opts *)0)->socket_path, "socket path sizes differ");
    hd_server_opts o = {.socket_mode = c->socket_mode,
                        .max_clients = c->max_clients,
                        .admin_reserve = c->admin_reserve,
                        .admin_gid = c->admin_gid,
                        .max_clients_per_uid = c->max_clients_per_uid,
                        .max_fds_per_uid = c->max_fds_per_uid,
                        .max_queue_per_uid = c->max_queue_per_uid,
                        .hello_timeout_ms = c->hello_timeout_ms,
                        .max_frame_before_hello = c->max_frame_before_hello,
                        .max_fds_per_conn = c->max_fds_per_conn,
                        .max_queue_per_conn = c->max_queue_per_conn,
                        .max_queued_fds_per_conn = c->max_queued_fds_per_conn,
                        .max_queued_fds_per_uid = c->max_queued_fds_per_uid,
                        .max_inflight_fds_per_conn = c->max_inflight_fds_per_conn,
                        .max_inflight_fds_per_uid = c->max_inflight_fds_per_uid};
    memcpy(o.socket_path, c->socket_path, sizeof o.socket_path);
    return o;
}

/* The request rings' part (at start only: a SIGHUP does not change them). */
static hd_ring_opts ring_opts(const hd_config *c)
{
    return (hd_ring_opts){.spin_us = c->ring_spin_us, .backoff_us = c->ring_backoff_us};
}

static void on_hup(uv_signal_t *s, int signum)
{
    (void)signum;
    daemon_state *d = s->data;
    if (!d->config_path) {
        hd_info("SIGHUP: no configuration file to reload");
        return;
    }
    hd_notify("RELOADING=1");
    hd_config n;
    hd_config_defaults(&n);
    char err[512];
    if (hd_config_reload(d->config_path, &n, err, sizeof err)) {
        hd_error("SIGHUP: configuration not reloaded: %s (the running configuration stays)", err);
        hd_notify("READY=1");
        return;
    }
    if (strcmp(n.socket_path, d->cfg.socket_path) || n.socket_mode != d->cfg.socket_mode)
        hd_warn("SIGHUP: socket/socket_mode changed; restart heapd to apply (kept %s)", d->cfg.socket_path);
    if (strcmp(n.backend, d->cfg.backend))
        hd_warn("SIGHUP: backend changed to %s; restart heapd to apply (kept %s)", n.backend, d->cfg.backend);
    if (n.max_clients != d->cfg.max_clients)
        hd_warn("SIGHUP: max_clients changed; restart heapd to apply");
    if (strcmp(n.store, d->cfg.store) || strcmp(n.node, d->cfg.node) ||
        strcmp(n.store_credentials, d->cfg.store_credentials) || strcmp(n.store_key, d->cfg.store_key))
        hd_warn("SIGHUP: store/node/store_credentials/store_key changed; restart heapd to apply");
    snprintf(n.store, sizeof n.store, "%s", d->cfg.store);
    snprintf(n.store_credentials, sizeof n.store_credentials, "%s", d->cfg.store_credentials);
    snprintf(n.store_key, sizeof n.store_key, "%s", d->cfg.store_key);
    snprintf(n.node, sizeof n.node, "%s", d->cfg.node);
    snprintf(n.socket_path, sizeof n.socket_path, "%s", d->cfg.socket_path);
    n.socket_mode = d->cfg.socket_mode;
    snprintf(n.backend, sizeof n.backend, "%s", d->cfg.backend);
    n.max_clients = d->cfg.max_clients;
    d->cfg = n;
    hd_server_opts so = server_opts(&n);
    hd_server_set_opts(d->srv, &so);
    hd_log_set_level(n.log_level);
    hd_log_set_format(n.log_format);
    hd_registry_set_config(d->reg, &n);
    hd_info("SIGHUP: configuration reloaded from %s (log level, heap defaults and timeouts apply to new heaps)",
            d->config_path);
    hd_notify("READY=1");
}

static void print_config(const char *path, const hd_config *c)
{
    printf("%s: ok\n", path ? path : "(built-in defaults)");
    printf("socket = %s\nsocket_mode = %04o\nbackend = %s\nlog_level = %s\nlog_format = %s\n", c->socket_path,
           c->socket_mode, c->backend, (const char *const[]){"error", "warn", "info", "debug"}[c->log_level & 3],
           c->log_format == HD_LOG_FMT_JSON ? "json" : "text");
    printf("chunk_size = %llu\ninitial_size = %llu\nva_size = %llu\nmin_block = %llu\npolicy = %s\n",
           (unsigned long long)c->chunk_size, (unsigned long long)c->initial_size, (unsigned long long)c->va_size,
           (unsigned long long)c->min_block, ha_policy_name(c->policy));
    printf("reclaim = %s\n", c->reclaim == HA_RECLAIM_EAGER ? "eager" : "collect");
    printf("grow_ahead = %u\nreclaim_lookahead = %u\n", (unsigned)c->grow_ahead, (unsigned)c->reclaim_lookahead);
    printf("trim_threshold = %llu\n", (unsigned long long)c->trim_threshold);
    printf("collect_timeout_ms = %u\nmax_clients = %u\nmeminfo_interval_ms = %u\n", c->collect_timeout_ms,
           c->max_clients, c->meminfo_interval_ms);
    printf("persist = %u\nmax_persist = %u\n", c->persist, c->max_persist);
    printf("admin_reserve = %u\n", c->admin_reserve);
    printf("max_clients_per_uid = %u\nmax_fds_per_uid = %u\nmax_queue_per_uid = %llu\n", c->max_clients_per_uid,
           c->max_fds_per_uid, (unsigned long long)c->max_queue_per_uid);
    printf("hello_timeout_ms = %u\nmax_frame_before_hello = %u\nmax_fds_per_conn = %u\nmax_queue_per_conn = %llu\n",
           c->hello_timeout_ms, c->max_frame_before_hello, c->max_fds_per_conn,
           (unsigned long long)c->max_queue_per_conn);
    printf("max_queued_fds_per_conn = %u\nmax_queued_fds_per_uid = %u\nmax_inflight_fds_per_conn = %u\n"
           "max_inflight_fds_per_uid = %u\nmax_chunk_fds_per_uid = %u\n",
           c->max_queued_fds_per_conn, c->max_queued_fds_per_uid, c->max_inflight_fds_per_conn,
           c->max_inflight_fds_per_uid, c->max_chunk_fds_per_uid);
    printf("max_chunks = %u\nmax_blocks = %u\n", c->max_chunks, c->max_blocks);
    printf("admin_group = %s\nquota_heap = %llu\nquota_uid = %llu\n", c->admin_group, (unsigned long long)c->quota_heap,
           (unsigned long long)c->quota_uid);
    /* A password in the store URL is never printed. */
    const char *at = strchr(c->store, '@'), *pw = strchr(c->store + (c->store[0] ? 8 : 0), ':');
    if (at && pw && pw < at)
        printf("store = %.*s:***%s\n", (int)(pw - c->store), c->store, at);
    else
        printf("store = %s\n", c->store);
    printf("store_credentials = %s\nstore_key = %s\nnode = %s\n", c->store_credentials, c->store_key, c->node);
    printf("ring = %s\n", c->ring ? "on" : "off");
    if (c->ring_spin_us < 0)
        printf("ring_spin_us = auto\n");
    else
        printf("ring_spin_us = %ld\n", c->ring_spin_us);
    if (c->ring_backoff_us < 0)
        printf("ring_backoff_us = auto\n");
    else
        printf("ring_backoff_us = %ld\n", c->ring_backoff_us);
}

/* main's steps return HEAPD_GO_ON, or the status heapd exits with. */
#define HEAPD_GO_ON (-1)

/* What the command line overrides (NULL: not given). */
typedef struct cli_opts {
    const char *socket, *backend, *level;
    int check;
} cli_opts;

/* Parses the options: HEAPD_GO_ON, 0 (--help, --version) or 2 (a usage
 * error, said on stderr). */
static int parse_args(int argc, char **argv, daemon_state *d, cli_opts *cli)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},    {"check-config", no_argument, 0, 'C'},
        {"socket", required_argument, 0, 's'},    {"backend", required_argument, 0, 'b'},
        {"log-level", required_argument, 0, 'l'}, {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "c:s:b:l:hV", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            d->config_path = optarg;
            break;
        case 'C':
            cli->check = 1;
            break;
        case 's':
            cli->socket = optarg;
            break;
        case 'b':
            cli->backend = optarg;
            break;
        case 'l':
            cli->level = optarg;
            break;
        case 'h': {
            char kinds[64];
            printf(usage, hb_kind_list(kinds, sizeof kinds, " or ", 0));
            return 0;
        }
        case 'V':
            printf("heapd %s (protocol %d)\n", HEAPD_VERSION, HEAPD__CONST__PROTOCOL_VERSION);
            return 0;
        default:
            fputs("heapd: try `heapd --help`\n", stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "heapd: unexpected argument \"%s\"; try `heapd --help`\n", argv[optind]);
        return 2;
    }
    return HEAPD_GO_ON;
}

/* The built-in defaults, then the configuration file (-c, else
 * HD_DEFAULT_CONFIG if it exists), then the command line's overrides:
 * HEAPD_GO_ON, 1 (the file is wrong) or 2 (an option's value is). */
static int load_config(daemon_state *d, const cli_opts *cli)
{
    hd_config_defaults(&d->cfg);
    if (!d->config_path && access(HD_DEFAULT_CONFIG, R_OK) == 0)
        d->config_path = HD_DEFAULT_CONFIG;
    char err[1024] = "";
    if (d->config_path && hd_config_load(d->config_path, &d->cfg, err, sizeof err)) {
        fprintf(stderr, "heapd: %s\n", err);
        return 1;
    }
    if (cli->socket) {
        if (cli->socket[0] != '/' || strlen(cli->socket) >= sizeof d->cfg.socket_path) {
            fprintf(stderr, "heapd: --socket %s: must be an absolute path shorter than %zu bytes\n", cli->socket,
                    sizeof d->cfg.socket_path);
            return 2;
        }
        snprintf(d->cfg.socket_path, sizeof d->cfg.socket_path, "%s", cli->socket);
    }
    if (cli->backend) {
        if (hb_kind_parse(cli->backend) < 0) {
            char kinds[64];
            fprintf(stderr, "heapd: --backend %s: must be %s\n", cli->backend,
                    hb_kind_list(kinds, sizeof kinds, " or ", 0));
            return 2;
        }
        snprintf(d->cfg.backend, sizeof d->cfg.backend, "%s", cli->backend);
    }
    if (cli->level) {
        int l = hd_log_parse_level(cli->level);
        if (l < 0) {
            fprintf(stderr, "heapd: --log-level %s: must be error, warn, info or debug\n", cli->level);
            return 2;
        }
        d->cfg.log_level = l;
    }
    return HEAPD_GO_ON;
}

/* The configured log level and format; SIGPIPE ignored (the server and
 * hiredis write to sockets with write(2)). */
static void setup_logging(const hd_config *cfg)
{
    hd_log_set_level(cfg->log_level);
    hd_log_set_format(cfg->log_format);
    signal(SIGPIPE, SIG_IGN);
    /* The fd budget: connections, fds clients pass (held until closed) and
     * chunk fds all count against RLIMIT_NOFILE; take the hard limit (systemd
     * sets LimitNOFILE's soft value low for select() users; heapd uses epoll). */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
            hd_debug("open files limit raised to %llu (the hard limit)", (unsigned long long)rl.rlim_cur);
    }
}

/* The backend, the loop and the heap registry: HEAPD_GO_ON or 1. */
static int create_heaps(daemon_state *d)
{
    char err[1024] = "";
    if (hb_open(d->cfg.backend, &d->be, err, sizeof err)) {
        hd_error("cannot open the %s backend: %s", d->cfg.backend, err);
        hd_notify("STATUS=backend failed");
        return 1;
    }
    if (err[0]) /* backend = auto fell back to host memory: say why */
        hd_warn("backend auto: using host memory, not the GPU: %s (set backend = host where that is "
                "intended, or backend = cuda to refuse to start without a GPU)",
                err);
    d->loop = uv_default_loop();
    if (hd_registry_create(d->loop, d->be, &d->cfg, &d->reg)) {
        hd_error("out of memory");
        return 1;
    }
    return HEAPD_GO_ON;
}

/* The store's warnings (messages it dropped: issue 33 item 1). */
static void store_warn(void *arg, const char *msg)
{
    (void)arg;
    hd_warn("%s", msg);
}

/* The cross-node store when `store =` is set, and the timer that keeps it
 * connected: HEAPD_GO_ON or 1. */
static int open_store(daemon_state *d)
{
    char err[1024] = "";
    if (!d->cfg.store[0])
        return HEAPD_GO_ON;
    hd_store_opts so = {.url = d->cfg.store,
                        .node = d->cfg.node,
                        .credentials = d->cfg.store_credentials,
                        .key_file = d->cfg.store_key,
                        .warn = store_warn};
    if (hd_store_open_opts(d->loop, &so, &d->store, err, sizeof err)) {
        hd_error("store %s: %s", d->cfg.store, err);
        return 1;
    }
    hd_store_connect(d->store);
    hd_registry_set_store(d->reg, d->store);
    d->store_was_ready = 1; /* log the first failure */
    uv_timer_init(d->loop, &d->store_watch);
    d->store_watch.data = d;
    uv_timer_start(&d->store_watch, store_watch_cb, 2000, 2000);
    uv_unref((uv_handle_t *)&d->store_watch);
    hd_info("heaps may span nodes: collects are reconciled through %s as node \"%s\"", hd_store_url(d->store),
            d->cfg.node);
    if (!hd_store_signed(d->store))
        hd_warn("store: collect results are not signed (no store_key or store_credentials): a program that can "
                "publish to Redis can forge them; docs/multinode.md \"Security\"");
    return HEAPD_GO_ON;
}

/* Dispatch and the listening server: HEAPD_GO_ON or 1. */
static int create_server(daemon_state *d)
{
    char err[1024] = "";
    hd_ring_opts ro = ring_opts(&d->cfg);
    if (hd_dispatch_create(d->reg, hb_name(d->be), &d->disp) ||
        (d->cfg.ring && hd_dispatch_rings(d->disp, d->loop, &ro))) {
        hd_error("out of memory");
        return 1;
    }
    hd_server_opts so = server_opts(&d->cfg);
    if (hd_server_create(d->loop, &so, hd_dispatch_handlers(), d->disp, &d->srv, err, sizeof err) ||
        hd_server_start(d->srv, err, sizeof err)) {
        hd_error("%s", err);
        hd_notify("STATUS=cannot listen");
        return 1;
    }
    hd_dispatch_set_server(d->disp, d->srv);
    return HEAPD_GO_ON;
}

/* SIGTERM, SIGINT, SIGHUP, and the systemd status timer. */
static void setup_signals(daemon_state *d)
{
    uv_signal_init(d->loop, &d->sigterm);
    uv_signal_init(d->loop, &d->sigint);
    uv_signal_init(d->loop, &d->sighup);
    d->sigterm.data = d->sigint.data = d->sighup.data = d;
    uv_signal_start(&d->sigterm, on_stop, SIGTERM);
    uv_signal_start(&d->sigint, on_stop, SIGINT);
    uv_signal_start(&d->sighup, on_hup, SIGHUP);
    uv_timer_init(d->loop, &d->status);
    d->status.data = d;
    uv_timer_start(&d->status, status_cb, 5000, 5000);
    uv_unref((uv_handle_t *)&d->status);
}

/* Says "ready" in the log and to systemd, runs the loop until on_stop
 * closed every handle, and releases everything. */
static int run(daemon_state *d)
{
    hd_info("heapd %s ready: socket %s, backend %s (%d device%s)", HEAPD_VERSION,
            hd_server_socket_activated(d->srv) ? "fd 3 from systemd (socket activation)" : d->cfg.socket_path,
            hb_name(d->be), hb_device_count(d->be), hb_device_count(d->be) == 1 ? "" : "s");
    char ready[256];
    snprintf(ready, sizeof ready, "READY=1\nSTATUS=0 heaps, 0 clients, backend %s\nMAINPID=%ld", hb_name(d->be),
             (long)getpid());
    hd_notify(ready);

    uv_run(d->loop, UV_RUN_DEFAULT);
    return 0;
}

/* Every connection is closed (hd_server_shutdown, then the loop ran them
 * out); the server's own handles close next, and it is freed by their last
 * close callback: run the loop once more before closing it. */
static void teardown(daemon_state *d)
{
    hd_registry_destroy(d->reg);
    hd_server_destroy(d->srv);
    d->srv = NULL;
    hd_dispatch_destroy(d->disp);
    uv_run(d->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(d->loop))
        hd_warn("the event loop still had open handles at exit");
    hb_close(d->be);
    hd_info("stopped");
}

int main(int argc, char **argv)
{
    daemon_state d;
    cli_opts cli;
    int rc;

    memset(&d, 0, sizeof d);
    memset(&cli, 0, sizeof cli);
    if ((rc = parse_args(argc, argv, &d, &cli)) != HEAPD_GO_ON)
        return rc;
    hd_log_setup(); /* the journal when JOURNAL_STREAM is stderr */
    if ((rc = load_config(&d, &cli)) != HEAPD_GO_ON)
        return rc;
    if (cli.check) {
        print_config(d.config_path, &d.cfg);
        return 0;
    }
    setup_logging(&d.cfg);
    if ((rc = create_heaps(&d)) != HEAPD_GO_ON || (rc = open_store(&d)) != HEAPD_GO_ON ||
        (rc = create_server(&d)) != HEAPD_GO_ON)
        return rc;
    setup_signals(&d);
    rc = run(&d);
    teardown(&d);
    return rc;
}
