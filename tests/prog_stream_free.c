/* prog_stream_free - stream-ordered frees against a running heapd (issue 18):
 * a collect never waits for the device, and a block freed while a kernel
 * still writes into it is not handed out again until that kernel finished.
 * Run by scripts/gpu.sh (cuda backend) and its host dry run, and by
 * tests/it_stream_free.sh (host backend) in make check.
 *
 *   prog_stream_free --socket PATH [--ranks N] [--host] [--spin-ms MS]
 *                    [--heap PREFIX] [--timeout S]
 *
 * The parent forks N ranks before anything touches CUDA. Each rank, twice,
 * on a fresh heap each time (64 MiB chunks, min_block 4 KiB, coalesce):
 *   seq 0  B = alloc(1 MiB)   (offset 0); heapc_collect (a barrier)
 *   seq 1  F = alloc(8 MiB)
 *          starts the "kernel" on stream s: it spins --spin-ms (default 50)
 *          ms, then writes KPAT over all of B;
 *          heapc_free_async(B, s) while the kernel runs;
 *   seq 2  L = alloc(8 MiB): the coalesce policy's large-block trigger asks
 *          for a collect (every rank joins it) - timed;
 *   seq 3  Y = alloc(512 KiB): the next owner (lowest fit: B's offset if B
 *          had been reclaimed). Y and L are filled with owner
 *          patterns (on another stream) right away, while the kernel may
 *          still run; then the rank waits for the kernel and checks that
 *          both still hold their patterns and that Y is not B;
 *          heapc_collect; seq 4 Z = alloc(512 KiB): B's offset once its kernel
 *          finished.
 *   Round "stream": no sync hook (libheapc's default since issue 18): the
 *   collect at seq 2 must not wait for the kernel (B waits for its stream:
 *   stream_waiting = 1, so Y is not B).
 *   Round "hook": heapc_set_device_sync with cuCtxSynchronize (the old
 *   default): the collect waits for the kernel, B is reclaimed there.
 * --host: a host-backend heapd; the kernel is a thread and s a heapc_hstream
 * (the host completion source). The thread writes only when the rank, after
 * filling Y, lets it (so it writes into B after the free and after the next
 * owner got its block); the hook round's hook lets it and waits for it, as a
 * device sync would. No timing there: the rank waits for states.
 *
 * Then two issue 27 rounds under reclaim eager: "eager" (stream reuse off:
 * the release waits for the kernel, no collect needed) and "reuse" (the
 * default: released at the free, reused on the kernel's own stream while
 * the kernel runs, and a plain heapc_alloc that reuses it waits for the
 * stream; reuse_round). Those rounds and the first two set
 * heapc_set_stream_reuse as they need.
 * Output: 'rank R: ...' lines, 't NAME VALUE' lines (alloc_stream_us,
 * alloc_hook_us: the triggering allocation of each round; kernel_ms), then
 * the parent's verdict. Exit 0 when every check passed, 1 on a failure, 2
 * usage, 77 when CUDA is not available ("skipped: no GPU").
 */
#include "cuda_dl.h"
#include "heapc.h"
#include "heapc_cuda.h"

#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 16
#define MiB       (1024ull * 1024ull)
/* The next owners' size: another size bin than B's, so that the coalesce
 * policy places them bottom-up, on B's offset once B is free. */
#define YSIZE (512 * 1024ull)

static struct {
    const char *sock;
    const char *heap;
    int ranks;
    int host;
    int spin_ms;
    int timeout_s;
} o = {NULL, "streamfree", 2, 0, 50, 60};

static int R = -1;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    printf("rank %d: %s\n", R, buf);
    fflush(stdout);
}

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        say("FAIL: " __VA_ARGS__);                                                                                     \
        return 1;                                                                                                      \
    } while (0)
#define HC(call)                                                                                                       \
    do {                                                                                                               \
        if ((call) != HEAPC_OK)                                                                                        \
            FAIL("%s: %s: %s", #call, heapc_errname(heapc_err(c)), heapc_errstr(c));                                   \
    } while (0)

#include "stream_dev.h"

/* ---- one round ------------------------------------------------------------ */

static int check_owner(dev *d, heapc *c, const char *what, uint64_t off, uint64_t size, uint32_t pat)
{
    uint32_t got = 0;
    long bad = dev_check(d, heapc_ptr(c, off), pat, size / 4, &got);
    if (bad == -2)
        FAIL("reading %s: %s", what, d->err);
    if (bad >= 0)
        FAIL("%s (offset %" PRIu64 ") lost its owner's data at word %ld: 0x%08x, want 0x%08x%s", what, off, bad, got,
             pat, got == KPAT ? " (the freed block's kernel wrote there: it was handed out too early)" : "");
    return 0;
}

/* This rank's context on a fresh heap PREFIX-suffix: chunk-sized chunks (and
 * initial extent, 0: heapd's), min_block 4 KiB, the coalesce policy, the
 * reclaim asked for, stream-ordered reuse on or off. NULL after a FAIL line. */
static heapc *round_attach(const char *suffix, uint64_t chunk, uint64_t initial, heapc_reclaim reclaim, int reuse)
{
    char heap[128];
    snprintf(heap, sizeof heap, "%s-%s", o.heap, suffix);
    heapc *c = heapc_connect(o.sock);
    if (!c) {
        say("FAIL: heapc_connect: out of memory");
        return NULL;
    }
    heapc_params p = {0};
    p.chunk_size = chunk;
    p.initial_size = initial;
    p.min_block = 4096;
    p.policy = HEAPC_POLICY_COALESCE;
    p.collect_timeout_ms = (uint32_t)o.timeout_s * 1000u;
    p.reclaim = reclaim;
    heapc_set_timeout(c, o.timeout_s * 1000);
    if (heapc_err(c) != HEAPC_OK || heapc_attach(c, heap, (uint32_t)R, (uint32_t)o.ranks, &p) != HEAPC_OK ||
        heapc_set_stream_reuse(c, reuse) != HEAPC_OK) {
        say("FAIL: attaching to heap %s: %s: %s", heap, heapc_errname(heapc_err(c)), heapc_errstr(c));
        heapc_free_ctx(c);
        return NULL;
    }
    return c;
}

static int round_main(dev *d, int hook)
{
    const char *name = hook ? "hook" : "stream";
    /* these rounds are about the collect (eager: eager_round), with issue
     * 18's rule: released once the stream's work completed */
    heapc *c = round_attach(name, 64 * MiB, 0, HEAPC_RECLAIM_COLLECT, 0);
    if (!c)
        return 1;
    if (hook)
        HC(heapc_set_device_sync(c, sync_hook, d));
    uint64_t b, f, l, y, z;
    void *bp;
    HC(heapc_alloc(c, 1 * MiB, &bp, &b));
    HC(heapc_collect(c)); /* a barrier: the ranks reach the timed collect together */
    HC(heapc_alloc(c, 8 * MiB, NULL, &f));
    heapc_counters k0;
    HC(heapc_get_counters(c, &k0));
    if (dev_kernel(d, bp, 1 * MiB / 4))
        FAIL("starting the kernel: %s", d->err);
    HC(heapc_free_async(c, b, dev_stream(d)));
    double t0 = now_us();
    HC(heapc_alloc(c, 8 * MiB, NULL, &l));
    double t_alloc = now_us() - t0;
    int running = dev_kernel_running(d);
    heapc_counters k1;
    HC(heapc_get_counters(c, &k1));
    if (k1.collects_needed != k0.collects_needed + 1)
        FAIL("the 8 MiB allocation after 9 MiB handed out did not trigger a collect "
             "(collects_needed %" PRIu64 " -> %" PRIu64 ")",
             k0.collects_needed, k1.collects_needed);
    heapc_status_t sp;
    if (heapc_status(c, &sp) != HEAPC_OK)
        FAIL("heapc_status: no status page");
    if (sp.stream_waiting != k1.stream_waiting || sp.device_waits_avoided != k1.device_waits_avoided)
        FAIL("status page: stream_waiting %" PRIu64 ", device_waits_avoided %" PRIu64 "; the rank sent %" PRIu64
             " and %" PRIu64 " with its collect",
             sp.stream_waiting, sp.device_waits_avoided, k1.stream_waiting, k1.device_waits_avoided);
    HC(heapc_alloc(c, YSIZE, NULL, &y));
    say("%s: B %" PRIu64 " freed on the kernel's stream; trigger alloc %.1f us, kernel %s after "
        "it; stream_waiting %" PRIu64 ", device_waits_avoided %" PRIu64 ", next owner Y at %" PRIu64,
        name, b, t_alloc, running ? "still running" : "finished", k1.stream_waiting, k1.device_waits_avoided, y);
    if (!hook) {
        /* Without a hook the collect did not wait: on the host the kernel
         * cannot have finished (it waits for us), so B must still wait. */
        if (d->host && (!running || k1.stream_waiting != 1))
            FAIL("stream round: the kernel %s and %" PRIu64 " blocks wait for their stream, want "
                 "running and 1",
                 running ? "runs" : "finished", k1.stream_waiting);
        if (k1.device_waits_avoided <= k0.device_waits_avoided && d->host)
            FAIL("stream round: device_waits_avoided did not move (%" PRIu64 ")", k1.device_waits_avoided);
    } else if (running || k1.stream_waiting != 0) {
        FAIL("hook round: after the hook the kernel %s and %" PRIu64 " blocks wait, want finished "
             "and 0",
             running ? "runs" : "finished", k1.stream_waiting);
    }
    if (running && y == b)
        FAIL("%s: block %" PRIu64 " was handed out again while the kernel that writes it runs", name, b);
    /* The owners write now, while the kernel may still run. */
    uint32_t ypat = 0x59000000u | (uint32_t)R, lpat = 0x4c000000u | (uint32_t)R;
    if (dev_fill(d, heapc_ptr(c, y), ypat, YSIZE / 4) || dev_fill(d, heapc_ptr(c, l), lpat, 8 * MiB / 4))
        FAIL("owner writes: %s", d->err);
    if (dev_kernel_wait(d))
        FAIL("waiting for the kernel: %s", d->err);
    if (check_owner(d, c, "Y", y, YSIZE, ypat) || check_owner(d, c, "L", l, 8 * MiB, lpat))
        return 1;
    /* The kernel finished: the next collect releases B, and it is reused. */
    HC(heapc_collect(c));
    HC(heapc_alloc(c, YSIZE, NULL, &z));
    uint32_t zpat = 0x5a000000u | (uint32_t)R;
    if (dev_fill(d, heapc_ptr(c, z), zpat, YSIZE / 4) || check_owner(d, c, "Z", z, YSIZE, zpat))
        return 1;
    heapc_counters k2;
    HC(heapc_get_counters(c, &k2));
    if (k2.stream_waiting != 0)
        FAIL("%s: %" PRIu64 " blocks still wait for their stream after the kernel finished", name, k2.stream_waiting);
    say("%s: after the kernel: Z at %" PRIu64 " (%s B); owners' data intact; markers %" PRIu64, name, z,
        z == b ? "reuses" : "not", k2.stream_markers);
    printf("t alloc_%s_us %.1f\n", name, t_alloc);
    printf("t kernel_running_after_alloc_%s %d\n", name, running);
    fflush(stdout);
    HC(heapc_detach(c));
    heapc_free_ctx(c);
    return 0;
}

/* Issue 27, reclaim eager: a block freed on the kernel's stream is not
 * handed out while the kernel runs, with no collect anywhere; once the
 * kernel finished, the release rides on the next call and the block is
 * reused (after a barrier, so that every rank's release is in). */
static int eager_round(dev *d)
{
    /* released once complete: reuse_round has the other rule */
    heapc *c = round_attach("eager", 64 * MiB, 0, HEAPC_RECLAIM_EAGER, 0);
    if (!c)
        return 1;
    heapc_params got;
    HC(heapc_get_params(c, &got));
    if (got.reclaim != HEAPC_RECLAIM_EAGER)
        FAIL("eager round: the heap's reclaim is %d, want eager", (int)got.reclaim);
    uint64_t b, y, z;
    void *bp;
    HC(heapc_alloc(c, 1 * MiB, &bp, &b));
    if (dev_kernel(d, bp, 1 * MiB / 4))
        FAIL("starting the kernel: %s", d->err);
    HC(heapc_free_async(c, b, dev_stream(d)));
    HC(heapc_flush(c));
    HC(heapc_alloc(c, 1 * MiB, NULL, &y));
    int running = dev_kernel_running(d);
    if (running && y == b)
        FAIL("eager round: block %" PRIu64 " was handed out again while the kernel that writes it runs", b);
    if (d->host && !running)
        FAIL("eager round: the host kernel finished before its go-ahead");
    if (dev_kernel_wait(d))
        FAIL("waiting for the kernel: %s", d->err);
    HC(heapc_flush(c));   /* the completed release goes out */
    HC(heapc_collect(c)); /* a barrier: every rank's release is in (nothing left to reclaim) */
    HC(heapc_alloc(c, 1 * MiB, NULL, &z));
    heapc_counters k;
    HC(heapc_get_counters(c, &k));
    if (z != b)
        FAIL("eager round: after the kernel, the next 1 MiB block is at %" PRIu64 ", not B's %" PRIu64, z, b);
    if (k.last_reclaimed_blocks != 0)
        FAIL("eager round: the collect reclaimed %" PRIu64 " blocks; eager reclaim had reclaimed B already",
             k.last_reclaimed_blocks);
    say("eager: B %" PRIu64 " freed on the kernel's stream; Y at %" PRIu64 " while it ran (%s); Z reuses B, no "
        "collect needed",
        b, y, running ? "running" : "finished");
    HC(heapc_detach(c));
    heapc_free_ctx(c);
    return 0;
}

/* Host: completes the kernel stream's work once a caller waits for it. */
static void *complete_when_waited(void *arg)
{
    dev *d = arg;
    while (heapc_hstream_waiters(d->hs) == 0)
        sched_yield();
    heapc_hstream_complete(d->hs, d->ticket);
    return NULL;
}

/* Starts stream work that holds a freed block: the kernel (cuda), or a
 * ticket that complete_when_waited completes (host). */
static int hold_stream(dev *d, void *dst, pthread_t *th)
{
    if (!d->host)
        return dev_kernel(d, dst, 1 * MiB / 4);
    d->ticket = heapc_hstream_begin(d->hs);
    return pthread_create(th, NULL, complete_when_waited, d) != 0;
}

/* The reuse round's block and heap: the CUDA granularity. */
#define RSIZE (2 * MiB)

/* Issue 27, stream-ordered reuse (libheapc's default): a block freed on the
 * kernel's stream is released at once; after a barrier (every rank's
 * release in) the next allocation on that stream reuses it while the kernel
 * still runs, with no wait - stream order makes it safe, and the owner's
 * write on that stream lands after the kernel's. A plain heapc_alloc that
 * reuses it again while new work holds it waits for that work. */
static int reuse_round(dev *d)
{
    heapc *c = round_attach("reuse", RSIZE, RSIZE, HEAPC_RECLAIM_EAGER, 1); /* one block fills it: a reuse is B */
    if (!c)
        return 1;
    uint64_t b, y, z;
    void *bp;
    HC(heapc_alloc(c, RSIZE, &bp, &b));
    if (dev_kernel(d, bp, 1 * MiB / 4))
        FAIL("starting the kernel: %s", d->err);
    HC(heapc_free_async(c, b, dev_stream(d)));
    HC(heapc_collect(c)); /* a barrier: every rank's release is in */
    HC(heapc_alloc_async(c, RSIZE, dev_stream(d), NULL, &y));
    int running = dev_kernel_running(d);
    heapc_counters k;
    HC(heapc_get_counters(c, &k));
    if (y != b)
        FAIL("reuse round: the allocation on the kernel's stream got %" PRIu64 ", not B's %" PRIu64, y, b);
    if (k.stream_early != 1 || k.stream_reuse_waits != 0)
        FAIL("reuse round: stream_early %" PRIu64 ", stream_reuse_waits %" PRIu64 ", want 1 and 0", k.stream_early,
             k.stream_reuse_waits);
    if (d->host && (!running || k.stream_in_flight != 1))
        FAIL("reuse round: the kernel %s, %" PRIu64 " blocks in flight; want running and 1",
             running ? "runs" : "finished", k.stream_in_flight);
    /* The owner's write on the kernel's stream: cuda, queued behind the
     * running kernel (had it run first, the kernel's KPAT would be there);
     * host, after the thread wrote. */
    uint32_t ypat = 0x52000000u | (uint32_t)R;
    int wrc = d->host ? dev_kernel_wait(d) || dev_fill(d, heapc_ptr(c, y), ypat, RSIZE / 4)
                      : dev_fill_on(d, heapc_ptr(c, y), ypat, RSIZE / 4, dev_stream(d)) || dev_kernel_wait(d);
    if (wrc)
        FAIL("kernel, then the owner's write: %s", d->err);
    if (check_owner(d, c, "Y", y, RSIZE, ypat))
        return 1;
    /* Again, now reused by heapc_alloc (no stream): it waits for the work. */
    pthread_t th;
    if (hold_stream(d, heapc_ptr(c, y), &th))
        FAIL("holding the stream: %s", d->err);
    HC(heapc_free_async(c, y, dev_stream(d)));
    HC(heapc_collect(c));
    HC(heapc_alloc(c, RSIZE, NULL, &z));
    int still = dev_kernel_running(d);
    if (d->host)
        pthread_join(th, NULL);
    HC(heapc_get_counters(c, &k));
    if (z != b || k.stream_reuse_waits != 1 || (d->host ? heapc_hstream_pending(d->hs) != 0 : still))
        FAIL("reuse round: heapc_alloc got %" PRIu64 " (B %" PRIu64 "), stream_reuse_waits %" PRIu64
             ", the stream's work %s; want B, 1 and done",
             z, b, k.stream_reuse_waits, (d->host ? heapc_hstream_pending(d->hs) != 0 : still) ? "pending" : "done");
    if (!d->host && dev_kernel_wait(d))
        FAIL("waiting for the kernel: %s", d->err);
    say("reuse: B %" PRIu64 " reused on its stream while the kernel ran (%s), no wait; heapc_alloc waited for the "
        "stream once",
        b, running ? "running" : "finished");
    HC(heapc_detach(c));
    heapc_free_ctx(c);
    return 0;
}

static int rank_main(void)
{
    dev d;
    int rc = dev_open(&d, o.host, o.spin_ms);
    if (rc == X_SKIP) {
        say("skipped: no GPU (%s)", d.err);
        return X_SKIP;
    }
    if (rc)
        FAIL("device: %s", d.err);
    if (round_main(&d, 0) || round_main(&d, 1) || eager_round(&d) || reuse_round(&d))
        return 1;
    say("ok");
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: prog_stream_free --socket PATH [--ranks N] [--host] [--spin-ms MS] "
               "[--heap PREFIX] [--timeout S]\n");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"socket", required_argument, NULL, 's'}, {"ranks", required_argument, NULL, 'n'},
        {"host", no_argument, NULL, 'H'},         {"spin-ms", required_argument, NULL, 'm'},
        {"heap", required_argument, NULL, 'p'},   {"timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 's':
            o.sock = optarg;
            break;
        case 'n':
            o.ranks = atoi(optarg);
            break;
        case 'H':
            o.host = 1;
            break;
        case 'm':
            o.spin_ms = atoi(optarg);
            break;
        case 'p':
            o.heap = optarg;
            break;
        case 't':
            o.timeout_s = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!o.sock || o.ranks < 1 || o.ranks > MAX_RANKS || o.spin_ms < 1 || o.timeout_s < 1) {
        usage(stderr);
        fprintf(stderr, "prog_stream_free: give --socket, --ranks 1..%d, --spin-ms >= 1\n", MAX_RANKS);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("t kernel_ms %d\n", o.spin_ms);
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < o.ranks; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("prog_stream_free: fork");
            return 1;
        }
        if (pid == 0) {
            R = r;
            alarm((unsigned)o.timeout_s * 3); /* a hung rank ends; the parent reports it */
            _exit(rank_main());
        }
        pids[r] = pid;
    }
    int worst = 0, skipped = 0;
    for (int r = 0; r < o.ranks; r++) {
        int st;
        if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st)) {
            printf("rank %d: FAIL: %s\n", r, "killed (timeout?)");
            worst = 1;
        } else if (WEXITSTATUS(st) == X_SKIP) {
            skipped = 1;
        } else if (WEXITSTATUS(st) != 0) {
            worst = 1;
        }
    }
    if (worst) {
        printf("prog_stream_free: FAILED\n");
        return 1;
    }
    if (skipped) {
        printf("skipped: no GPU\n");
        return X_SKIP;
    }
    printf("prog_stream_free: %d ranks ok (%s)\n", o.ranks, o.host ? "host" : "cuda");
    return 0;
}
