/*
 * check_nccl_win.c - issue 32: the heap as NCCL windows
 * (hnccl_register_heap, heapc_set_map_hook) against a real heapd (build/heapd,
 * host backend, started by main() on a temporary socket). NCCL's window
 * calls go to a recording function table (NCCL cannot run without a GPU)
 * that checks what NCCL needs of every call: the range is mapped (every
 * chunk readable: process_vm_readv) when it is registered and still when it
 * is deregistered, no byte is in two live windows, the flags are
 * NCCL_WIN_COLL_SYMMETRIC, the communicator is the one given. After every
 * step the live windows must be exactly this rank's mapped chunks.
 * Covered: registration at the call and at every growth, deregistration at
 * detach and at heapc_free_ctx, no double registration, release and
 * restore, trim (holes and the top, what stays registered again), failures,
 * extent_bound (no block outside a window), and two ranks (threads, one
 * heapc and hnccl context each) making the same calls at the same offsets
 * of their own copies.
 *
 * heapd: $HEAPD (a path), else $BUILD/heapd, else build/heapd.
 */
#include "heapc.h"
#include "heapc_nccl.h"

#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check_util.h"

#define MiB ((uint64_t)1 << 20)

static pid_t g_main_pid, g_heapd = -1;
static char g_dir[64], g_sock[108];

/* ---- heapd -------------------------------------------------------------------- */

static const char *heapd_path(void)
{
    static char path[512];
    const char *h = getenv("HEAPD");
    if (h && *h)
        return h;
    const char *b = getenv("BUILD");
    snprintf(path, sizeof path, "%s/heapd", b && *b ? b : "build");
    return path;
}

static void heapd_stop(void)
{
    if (g_heapd <= 0 || getpid() != g_main_pid)
        return;
    kill(g_heapd, SIGTERM);
    waitpid(g_heapd, NULL, 0);
    g_heapd = -1;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "check_nccl_win: could not remove %s\n", g_dir);
}

/* Starts heapd (host backend, 1 MiB chunks); exits the program when it cannot. */
static void heapd_start(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/check_nccl_win.XXXXXX");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "check_nccl_win: mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
    char conf[128], log[128];
    snprintf(conf, sizeof conf, "%s/heapd.conf", g_dir);
    snprintf(log, sizeof log, "%s/heapd.log", g_dir);
    snprintf(g_sock, sizeof g_sock, "%s/heapd.sock", g_dir);
    FILE *f = fopen(conf, "w");
    if (!f) {
        fprintf(stderr, "check_nccl_win: cannot write %s: %s\n", conf, strerror(errno));
        exit(1);
    }
    fprintf(f, "socket = %s\nbackend = host\nlog_level = warn\ncollect_timeout_ms = 5000\n", g_sock);
    fclose(f);
    pid_t parent = getpid();
    g_heapd = fork();
    if (g_heapd == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        if (!freopen(log, "w", stderr))
            _exit(126);
        execl(heapd_path(), heapd_path(), "--config", conf, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) { /* waits for the state: heapd answers */
        if (waitpid(g_heapd, NULL, WNOHANG) == g_heapd) {
            fprintf(stderr, "check_nccl_win: heapd %s exited at start (see %s)\n", heapd_path(), log);
            exit(1);
        }
        heapc *c = heapc_connect(g_sock);
        int ok = c && heapc_err(c) == 0;
        heapc_free_ctx(c);
        if (ok)
            return;
        usleep(10000);
    }
    fprintf(stderr, "check_nccl_win: heapd did not answer on %s\n", g_sock);
    exit(1);
}

static heapc *attach_bound(const char *heap, int32_t extent_bound)
{
    heapc *c = heapc_connect(g_sock);
    ck_assert_msg(c && heapc_err(c) == 0, "heapc_connect: %s", c ? heapc_errstr(c) : "NULL");
    heapc_params p;
    memset(&p, 0, sizeof p);
    p.chunk_size = MiB;
    p.initial_size = MiB;
    p.va_size = 64 * MiB;
    p.extent_bound = extent_bound;
    ck_assert_msg(heapc_attach(c, heap, 0, 1, &p) == HEAPC_OK, "heapc_attach(%s): %s", heap, heapc_errstr(c));
    return c;
}

static heapc *attach(const char *heap) { return attach_bound(heap, 0); }

/* ---- the recording table -------------------------------------------------------- */

#define WMAX 256
static struct wrec {
    char *p;
    size_t size;
    int flags, live;
    ncclComm_t comm;
} w[WMAX];
static int w_n, w_dereg, w_fail;
static pthread_mutex_t w_mu = PTHREAD_MUTEX_INITIALIZER; /* two ranks' threads record at once */
/* Every call in order: 'R'egister or 'D'eregister, the window's range. */
static struct wev {
    char op;
    char *p;
    size_t size;
} ev[2 * WMAX];
static int ev_n;
static char w_bad[512]; /* the first thing NCCL would refuse */
static const ncclComm_t COMM = (ncclComm_t)(void *)0x5eed;

static void bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void bad(const char *fmt, ...)
{
    if (w_bad[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w_bad, sizeof w_bad, fmt, ap);
    va_end(ap);
}

/* 1 when the byte at p can be read (mapped), 0 when not (EFAULT). */
static int readable(const char *p)
{
    char b;
    struct iovec l = {&b, 1}, r = {(void *)p, 1};
    return process_vm_readv(getpid(), &l, 1, &r, 1, 0) == 1;
}

static int range_mapped(const char *p, size_t size)
{
    for (size_t o = 0; o < size; o += MiB)
        if (!readable(p + o))
            return 0;
    return 1;
}

static ncclResult_t r_register_locked(ncclComm_t comm, void *buf, size_t size, ncclWindow_t *win, int flags)
{
    if (w_fail)
        return ncclUnhandledCudaError;
    char *p = buf;
    if (w_n == WMAX) {
        bad("more than %d registrations", WMAX);
        return ncclInternalError;
    }
    for (int i = 0; i < w_n; i++)
        if (w[i].live && p < w[i].p + w[i].size && w[i].p < p + size)
            bad("registration %d (%p, %zu bytes) overlaps live window %d (%p, %zu bytes)", w_n, buf, size, i,
                (void *)w[i].p, w[i].size);
    if (!range_mapped(p, size))
        bad("registration %d (%p, %zu bytes) of memory not mapped", w_n, buf, size);
    if (flags != NCCL_WIN_COLL_SYMMETRIC || comm != COMM)
        bad("registration %d: flags %d, comm %p", w_n, flags, (void *)comm);
    w[w_n] = (struct wrec){p, size, flags, 1, comm};
    *win = (ncclWindow_t)(uintptr_t)(++w_n);
    ev[ev_n++] = (struct wev){'R', p, size};
    return ncclSuccess;
}

static ncclResult_t r_deregister_locked(ncclComm_t comm, ncclWindow_t win)
{
    uintptr_t i = (uintptr_t)win - 1;
    if (i >= (uintptr_t)w_n || !w[i].live || comm != COMM) {
        bad("deregistration of window %p (comm %p): not a live window", (void *)win, (void *)comm);
        return ncclInvalidArgument;
    }
    if (!range_mapped(w[i].p, w[i].size))
        bad("window %zu (%p, %zu bytes) deregistered after its memory was unmapped", (size_t)i, (void *)w[i].p,
            w[i].size);
    w[i].live = 0;
    w_dereg++;
    ev[ev_n++] = (struct wev){'D', w[i].p, w[i].size};
    return ncclSuccess;
}

static ncclResult_t r_register(ncclComm_t comm, void *buf, size_t size, ncclWindow_t *win, int flags)
{
    pthread_mutex_lock(&w_mu);
    ncclResult_t r = r_register_locked(comm, buf, size, win, flags);
    pthread_mutex_unlock(&w_mu);
    return r;
}

static ncclResult_t r_deregister(ncclComm_t comm, ncclWindow_t win)
{
    pthread_mutex_lock(&w_mu);
    ncclResult_t r = r_deregister_locked(comm, win);
    pthread_mutex_unlock(&w_mu);
    return r;
}

static const char *r_error_string(ncclResult_t r) { return r == ncclUnhandledCudaError ? "rec: cuda" : "rec: other"; }

static const hnccl_table rec_table = {
    .GetErrorString = r_error_string,
    .CommWindowRegister = r_register,
    .CommWindowDeregister = r_deregister,
};

static void rec_reset(void)
{
    memset(w, 0, sizeof w);
    w_n = w_dereg = w_fail = ev_n = 0;
    w_bad[0] = '\0';
}

static int live_count(void)
{
    int n = 0;
    for (int i = 0; i < w_n; i++)
        n += w[i].live;
    return n;
}

/* The live windows are exactly this rank's mapped chunks below heapc_mapped
 * (each window its own chunks, disjoint: checked at registration), and the
 * stats say so. */
static void windows_match(heapc *c, hnccl_ctx *x, const char *when)
{
    ck_assert_msg(!w_bad[0], "%s: %s", when, w_bad);
    char *base = heapc_base(c, heapc_rank(c));
    uint64_t mapped = heapc_mapped(c), bytes = 0;
    for (uint64_t o = 0; o < mapped; o += MiB) {
        int in = 0;
        for (int i = 0; i < w_n; i++)
            in += w[i].live && base + o >= w[i].p && base + o < w[i].p + w[i].size;
        ck_assert_msg(in == readable(base + o), "%s: chunk at offset %" PRIu64 ": %s, in %d windows", when, o,
                      readable(base + o) ? "mapped" : "not mapped", in);
        bytes += in ? MiB : 0;
    }
    hnccl_window_stats st;
    ck_assert_int_eq(hnccl_get_window_stats(x, &st), HNCCL_OK);
    ck_assert_msg(st.registered_bytes == bytes && st.windows == (uint64_t)live_count() && st.extents == st.windows,
                  "%s: stats say %" PRIu64 " bytes in %" PRIu64 " windows (%" PRIu64 " extents), the table %" PRIu64
                  " bytes in %d",
                  when, st.registered_bytes, st.windows, st.extents, bytes, live_count());
}

static hnccl_ctx *registered(heapc *c)
{
    rec_reset();
    hnccl_ctx *x = hnccl_new(c);
    ck_assert_ptr_nonnull(x);
    ck_assert_int_eq(hnccl_set_table(x, &rec_table), HNCCL_OK);
    ck_assert_msg(hnccl_register_heap(x, COMM, NULL) == HNCCL_OK, "%s", hnccl_errstr(x));
    return x;
}

static uint64_t alloc(heapc *c, size_t size)
{
    uint64_t off;
    ck_assert_msg(heapc_alloc(c, size, NULL, &off) == HEAPC_OK, "heapc_alloc(%zu): %s", size, heapc_errstr(c));
    return off;
}

/* ---- tests ------------------------------------------------------------------------- */

START_TEST(attach_growth_detach)
{
    heapc *c = attach("win-grow");
    hnccl_ctx *x = registered(c);
    char *base = heapc_base(c, 0);
    ck_assert_int_eq(w_n, 1); /* the mapped extent at the call: the initial chunk */
    ck_assert_ptr_eq(w[0].p, base);
    ck_assert_uint_eq(w[0].size, heapc_mapped(c));
    windows_match(c, x, "after hnccl_register_heap");
    /* Every growth: one more window, at the offsets the growth mapped. */
    int grows = 0;
    for (int i = 0; i < 6; i++) {
        uint64_t before = heapc_mapped(c);
        int n0 = w_n;
        alloc(c, (size_t)(i % 3 + 1) * MiB);
        if (heapc_mapped(c) > before) {
            grows++;
            ck_assert_int_eq(w_n, n0 + 1);
            ck_assert_ptr_eq(w[n0].p, base + before);
            ck_assert_uint_eq(w[n0].size, heapc_mapped(c) - before);
        } else {
            ck_assert_int_eq(w_n, n0);
        }
        windows_match(c, x, "after a growth");
    }
    ck_assert_int_ge(grows, 3);
    int live = live_count();
    ck_assert_int_eq(heapc_detach(c), HEAPC_OK);
    ck_assert_msg(!w_bad[0], "%s", w_bad);
    ck_assert_int_eq(w_dereg, live); /* every window, before the unmap */
    ck_assert_int_eq(live_count(), 0);
    hnccl_window_stats st;
    hnccl_get_window_stats(x, &st);
    ck_assert_int_eq(st.registered, 0);
    ck_assert_uint_eq(st.windows + st.extents + st.registered_bytes, 0);
    ck_assert_uint_eq(st.registrations, (uint64_t)w_n);
    ck_assert_uint_eq(st.deregistrations, (uint64_t)w_n);
    hnccl_free(x); /* nothing left to deregister */
    ck_assert_int_eq(w_dereg, live);
    heapc_free_ctx(c);
}
END_TEST

START_TEST(no_double_registration)
{
    heapc *c = attach("win-double");
    hnccl_ctx *x = registered(c);
    alloc(c, 2 * MiB);
    int n = w_n;
    /* Again on the same context: refused, nothing registered. */
    ck_assert_int_eq(hnccl_register_heap(x, COMM, c), HNCCL_EINVAL);
    ck_assert_msg(strstr(hnccl_errstr(x), "registers heap win-double already"), "%s", hnccl_errstr(x));
    /* Another context on the same heapc: refused (one hook per heapc). */
    hnccl_ctx *y = hnccl_new(c);
    hnccl_set_table(y, &rec_table);
    ck_assert_int_eq(hnccl_register_heap(y, COMM, c), HNCCL_EINVAL);
    ck_assert_msg(strstr(hnccl_errstr(y), "map hook already"), "%s", hnccl_errstr(y));
    hnccl_free(y);
    ck_assert_int_eq(w_n, n);
    windows_match(c, x, "after the refusals");
    /* No range was reported twice. */
    hnccl_window_stats st;
    hnccl_get_window_stats(x, &st);
    ck_assert_uint_eq(st.overlaps_skipped, 0);
    ck_assert_int_eq(hnccl_deregister_heap(x), HNCCL_OK);
    ck_assert_int_eq(live_count(), 0);
    ck_assert_int_eq(hnccl_register_heap(x, COMM, c), HNCCL_OK); /* registered again: one window per run */
    ck_assert_int_eq(live_count(), 1);
    windows_match(c, x, "after registering again");
    hnccl_free(x); /* deregisters */
    ck_assert_int_eq(live_count(), 0);
    ck_assert_msg(!w_bad[0], "%s", w_bad);
    alloc(c, 8 * MiB); /* the hook is gone: a growth registers nothing */
    ck_assert_int_eq(live_count(), 0);
    heapc_free_ctx(c);
}
END_TEST

START_TEST(release_restore)
{
    heapc *c = attach("win-release");
    hnccl_ctx *x = registered(c);
    alloc(c, 3 * MiB);
    windows_match(c, x, "before the release");
    int live = live_count(), n = w_n;
    ck_assert_int_eq(heapc_release(c, HEAPC_RELEASE_HOST), HEAPC_OK);
    ck_assert_msg(!w_bad[0], "%s", w_bad); /* deregistered while still mapped */
    ck_assert_int_eq(live_count(), 0);
    ck_assert_int_eq(w_dereg, live);
    windows_match(c, x, "released");
    ck_assert_int_eq(heapc_restore(c), HEAPC_OK);
    /* One window per run restored: here the whole extent at once. */
    ck_assert_int_eq(live_count(), 1);
    ck_assert_int_eq(w_n, n + 1);
    ck_assert_ptr_eq(w[n].p, heapc_base(c, 0));
    ck_assert_uint_eq(w[n].size, heapc_mapped(c));
    windows_match(c, x, "restored");
    heapc_free_ctx(c); /* without a detach: still deregistered first */
    ck_assert_msg(!w_bad[0], "%s", w_bad);
    ck_assert_int_eq(live_count(), 0);
    hnccl_free(x);
}
END_TEST

START_TEST(trim_hole_and_top)
{
    heapc *c = attach("win-trim");
    hnccl_ctx *x = registered(c);
    uint64_t off[3];
    for (int i = 0; i < 3; i++)
        off[i] = alloc(c, MiB);
    ck_assert_uint_eq(off[1], MiB);
    ck_assert_uint_eq(off[2], 2 * MiB);
    uint64_t big = alloc(c, 3 * MiB); /* one growth of 3 chunks: one window */
    ck_assert_uint_eq(big, 3 * MiB);
    ck_assert_int_eq(live_count(), 4);
    windows_match(c, x, "before the trims");
    /* A hole: the chunk between two live blocks. */
    ck_assert_int_eq(heapc_free(c, off[1]), HEAPC_OK);
    uint64_t trimmed = 0;
    ck_assert_int_eq(heapc_trim(c, &trimmed), HEAPC_OK);
    ck_assert_uint_eq(trimmed, MiB);
    ck_assert_int_eq(live_count(), 3);
    windows_match(c, x, "after trimming the hole");
    uint64_t one = alloc(c, MiB); /* no room: the hole comes back, a window of its own */
    ck_assert_uint_eq(one, MiB);
    ck_assert_int_eq(live_count(), 4);
    windows_match(c, x, "after the hole came back");
    /* The 3-chunk window loses two chunks: it goes, and the chunk of the
     * block placed in it is registered again alone. */
    ck_assert_int_eq(heapc_free(c, big), HEAPC_OK);
    ck_assert_int_eq(heapc_flush(c), HEAPC_OK);
    uint64_t in3 = alloc(c, MiB);
    ck_assert_msg(in3 >= 3 * MiB && in3 < 6 * MiB, "placed at %" PRIu64, in3);
    int n = w_n;
    ck_assert_int_eq(heapc_trim(c, &trimmed), HEAPC_OK);
    ck_assert_uint_eq(trimmed, 2 * MiB);
    ck_assert_int_eq(w_n, n + 1);
    ck_assert_ptr_eq(w[n].p, heapc_base(c, 0) + in3);
    ck_assert_uint_eq(w[n].size, MiB);
    windows_match(c, x, "after trimming the top");
    ck_assert_int_eq(heapc_detach(c), HEAPC_OK);
    ck_assert_int_eq(live_count(), 0);
    ck_assert_msg(!w_bad[0], "%s", w_bad);
    hnccl_free(x);
    heapc_free_ctx(c);
}
END_TEST

START_TEST(failures)
{
    heapc *c = attach("win-fail");
    rec_reset();
    hnccl_ctx *x = hnccl_new(c);
    hnccl_set_table(x, &rec_table);
    /* Not attached. */
    heapc *d = heapc_connect(g_sock);
    ck_assert_int_eq(hnccl_register_heap(x, COMM, d), HNCCL_EINVAL);
    ck_assert_msg(strstr(hnccl_errstr(x), "not attached"), "%s", hnccl_errstr(x));
    heapc_free_ctx(d);
    /* A table without the window calls (NCCL before 2.27). */
    static const hnccl_table old = {.GetErrorString = r_error_string};
    hnccl_set_table(x, &old);
    ck_assert_int_eq(hnccl_register_heap(x, COMM, c), HNCCL_ELOAD);
    ck_assert_msg(strstr(hnccl_errstr(x), "NCCL 2.27"), "%s", hnccl_errstr(x));
    /* NCCL refuses the registration: nothing stays, the hook is gone. */
    hnccl_set_table(x, &rec_table);
    w_fail = 1;
    ck_assert_int_eq(hnccl_register_heap(x, COMM, c), ncclUnhandledCudaError);
    ck_assert_msg(strstr(hnccl_errstr(x), "ncclCommWindowRegister") && strstr(hnccl_errstr(x), "win-fail"), "%s",
                  hnccl_errstr(x));
    hnccl_window_stats st;
    hnccl_get_window_stats(x, &st);
    ck_assert_uint_eq(st.register_errors, 1);
    ck_assert_uint_eq(st.registered + st.extents + st.windows, 0);
    /* A growth whose registration fails: the allocation stands, the extent
     * has no window, the error is the hnccl context's. */
    w_fail = 0;
    ck_assert_int_eq(hnccl_register_heap(x, COMM, c), HNCCL_OK);
    w_fail = 1;
    alloc(c, 4 * MiB);
    ck_assert_int_eq(hnccl_err(x), ncclUnhandledCudaError);
    hnccl_get_window_stats(x, &st);
    ck_assert_uint_eq(st.register_errors, 2);
    ck_assert_uint_eq(st.extents, 2);
    ck_assert_uint_eq(st.windows, 1);
    w_fail = 0;
    ck_assert_int_eq(heapc_detach(c), HEAPC_OK);
    ck_assert_int_eq(live_count(), 0);
    ck_assert_msg(!w_bad[0], "%s", w_bad);
    hnccl_free(x);
    heapc_free_ctx(c);
}
END_TEST

/* Blocks of a random sequence that are in no live window (across two). */
static int outside_windows(const char *heap, int32_t bound, uint64_t seed)
{
    heapc *c = attach_bound(heap, bound);
    heapc_params got;
    ck_assert_int_eq(heapc_get_params(c, &got), HEAPC_OK);
    ck_assert_int_eq(got.extent_bound, bound);
    hnccl_ctx *x = registered(c);
    char *base = heapc_base(c, 0);
    uint64_t live[16], s = seed;
    size_t nlive = 0;
    int outside = 0;
    for (int step = 0; step < 300; step++) {
        if (nlive < 16 && cku_rng_below(&s, 3)) {
            uint64_t size = 4096 + cku_rng_below(&s, cku_rng_below(&s, 4) ? 256 * 1024 : 2 * MiB);
            uint64_t off = alloc(c, size);
            int in = 0;
            for (int i = 0; i < w_n; i++)
                in += w[i].live && base + off >= w[i].p && base + off + size <= w[i].p + w[i].size;
            outside += !in;
            live[nlive++] = off;
        } else if (nlive) {
            size_t i = cku_rng_below(&s, nlive);
            ck_assert_int_eq(heapc_free(c, live[i]), HEAPC_OK);
            live[i] = live[--nlive];
            ck_assert_int_eq(heapc_flush(c), HEAPC_OK);
        }
    }
    windows_match(c, x, "after the sequence");
    ck_assert_int_eq(heapc_detach(c), HEAPC_OK);
    hnccl_free(x);
    heapc_free_ctx(c);
    return outside;
}

START_TEST(extent_bound_blocks_inside_windows)
{
    int off = 0;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        char name[32];
        snprintf(name, sizeof name, "win-bound-%d", (int)seed);
        ck_assert_int_eq(outside_windows(name, 1, seed * 104729), 0);
        snprintf(name, sizeof name, "win-free-%d", (int)seed);
        off += outside_windows(name, 0, seed * 104729);
    }
    /* Without it, blocks do cross growth bounds (what extent_bound is for). */
    ck_assert_int_gt(off, 0);
    /* A later attach asking for it on a heap without: refused, naming it
     * (a heap kept by persist, attached again). */
    heapc *c = heapc_connect(g_sock);
    heapc_params p = {.chunk_size = MiB, .persist_s = 60};
    ck_assert_int_eq(heapc_attach(c, "win-plain", 0, 1, &p), HEAPC_OK);
    ck_assert_int_eq(heapc_detach(c), HEAPC_OK);
    p.extent_bound = 1;
    ck_assert_int_eq(heapc_attach(c, "win-plain", 0, 1, &p), HEAPC_EMISMATCH);
    ck_assert_msg(strstr(heapc_errstr(c), "extent_bound"), "%s", heapc_errstr(c));
    ck_assert_int_eq(heapc_drop(c, "win-plain", NULL), HEAPC_OK);
    heapc_free_ctx(c);
}
END_TEST

/* ---- two ranks -------------------------------------------------------------------- */

typedef struct rank_run {
    uint32_t rank;
    char *base; /* this rank's own copy */
    char err[400];
} rank_run;

#define RFAIL(r, what, msg)                                                                                            \
    do {                                                                                                               \
        snprintf((r)->err, sizeof(r)->err, "rank %u: %s: %s", (unsigned)(r)->rank, what, msg);                         \
        goto out;                                                                                                      \
    } while (0)

/* One rank's sequence: every collective call in the same order as the
 * other rank's. */
static void *rank_main(void *arg)
{
    rank_run *r = arg;
    heapc *c = heapc_connect(g_sock);
    hnccl_ctx *x = NULL;
    heapc_params p = {.chunk_size = MiB, .initial_size = MiB, .va_size = 64 * MiB, .extent_bound = 1};
    if (heapc_attach(c, "win-two", r->rank, 2, &p) != HEAPC_OK)
        RFAIL(r, "heapc_attach", heapc_errstr(c));
    r->base = heapc_base(c, r->rank);
    x = hnccl_new(c);
    hnccl_set_table(x, &rec_table);
    if (hnccl_register_heap(x, COMM, c) != HNCCL_OK)
        RFAIL(r, "hnccl_register_heap", hnccl_errstr(x));
    static const size_t sizes[] = {512 * 1024, 3 * MiB, 100 * 1024, 2 * MiB, 5 * MiB};
    uint64_t off[5];
    for (int i = 0; i < 5; i++)
        if (heapc_alloc(c, sizes[i], NULL, &off[i]) != HEAPC_OK)
            RFAIL(r, "heapc_alloc", heapc_errstr(c));
    if (heapc_free(c, off[4]) || heapc_free(c, off[1]) || heapc_collect(c) || heapc_trim(c, NULL))
        RFAIL(r, "free, collect, trim", heapc_errstr(c));
    if (heapc_release(c, HEAPC_RELEASE_DISCARD) || heapc_restore(c))
        RFAIL(r, "release, restore", heapc_errstr(c));
    if (heapc_alloc(c, 4 * MiB, NULL, &off[4]) || heapc_detach(c))
        RFAIL(r, "heapc_alloc, heapc_detach", heapc_errstr(c));
out:
    hnccl_free(x);
    heapc_free_ctx(c);
    return NULL;
}

/* Rank r's events (its own copy's range), as offsets from its base. */
static int rank_events(const rank_run *r, struct wev *out)
{
    int n = 0;
    for (int i = 0; i < ev_n; i++)
        if (ev[i].p >= r->base && ev[i].p < r->base + 64 * MiB)
            out[n++] = (struct wev){ev[i].op, (char *)(uintptr_t)(ev[i].p - r->base), ev[i].size};
    return n;
}

START_TEST(two_ranks_register_alike)
{
    rec_reset();
    rank_run r[2] = {{.rank = 0}, {.rank = 1}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, rank_main, &r[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    ck_assert_msg(!r[0].err[0] && !r[1].err[0], "%s %s", r[0].err, r[1].err);
    ck_assert_msg(!w_bad[0], "%s", w_bad);
    static struct wev e0[2 * WMAX], e1[2 * WMAX];
    int n0 = rank_events(&r[0], e0), n1 = rank_events(&r[1], e1);
    /* Only the ranks' own copies (each context maps its peer's too). */
    ck_assert_int_eq(n0 + n1, ev_n);
    ck_assert_int_eq(n0, n1);
    int regs = 0;
    for (int i = 0; i < n0; i++) {
        ck_assert_msg(e0[i].op == e1[i].op && e0[i].p == e1[i].p && e0[i].size == e1[i].size,
                      "call %d: rank 0 %c at offset %zu (%zu bytes), rank 1 %c at offset %zu (%zu bytes)", i, e0[i].op,
                      (size_t)(uintptr_t)e0[i].p, e0[i].size, e1[i].op, (size_t)(uintptr_t)e1[i].p, e1[i].size);
        regs += e0[i].op == 'R';
    }
    ck_assert_int_ge(regs, 5); /* attach, growths, what a trim leaves, restore, a growth */
    ck_assert_int_eq(live_count(), 0);
}
END_TEST

static Suite *win_suite(void)
{
    Suite *s = suite_create("heapc_nccl_win");
    TCase *tc = tcase_create("windows");
    tcase_add_test(tc, attach_growth_detach);
    tcase_add_test(tc, no_double_registration);
    tcase_add_test(tc, release_restore);
    tcase_add_test(tc, trim_hole_and_top);
    tcase_add_test(tc, failures);
    tcase_add_test(tc, extent_bound_blocks_inside_windows);
    tcase_add_test(tc, two_ranks_register_alike);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_main_pid = getpid();
    heapd_start();
    atexit(heapd_stop);
    return cku_run(win_suite());
}
