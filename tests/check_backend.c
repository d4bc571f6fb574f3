/* check_backend.c - daemon/backend.h (host and cuda chunk backends) and
 * client/heapc_map.h (mapping chunks into a rank's address space).
 *
 * The cuda TCase runs only where hb_open("cuda") succeeds (probed in a child
 * process, so that this runner's parent never initialises CUDA before it
 * forks the tests); elsewhere it prints "skipped: no GPU (cuda backend
 * tests)". */
#include "backend.h"
#include "heapc_map.h"
#include "check_util.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#if HEAPD_HAVE_CUDA_H
#include <cuda.h>
#include <dlfcn.h>
#endif

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)

static int g_have_gpu; /* hb_open("cuda") succeeded in the probe child */

/* ---- helpers ------------------------------------------------------------ */

static hb_backend *open_host(void)
{
    hb_backend *be = NULL;
    char err[512] = "";
    ck_assert_msg(hb_open("host", &be, err, sizeof err) == HB_OK, "hb_open(host): %s", err);
    ck_assert_ptr_nonnull(be);
    return be;
}

static uint64_t page_size(void) { return (uint64_t)sysconf(_SC_PAGESIZE); }

/* 1 when all n bytes at p are zero. */
static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

/* 1 when fd's n bytes read back as zeros (pread, not a mapping). */
static int fd_reads_zero(int fd, size_t n)
{
    char buf[65536];
    size_t off = 0;
    while (off < n) {
        size_t want = n - off < sizeof buf ? n - off : sizeof buf;
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r <= 0 || !all_zero(buf, (size_t)r))
            return 0;
        off += (size_t)r;
    }
    return 1;
}

static void fill_pattern(void *p, size_t n, uint32_t seed)
{
    uint32_t *w = p;
    for (size_t i = 0; i < n / 4; i++)
        w[i] = seed ^ (uint32_t)(i * 2654435761u);
}

/* Index of the first word that differs from the pattern, or -1. */
static long check_pattern(const void *p, size_t n, uint32_t seed)
{
    const uint32_t *w = p;
    for (size_t i = 0; i < n / 4; i++)
        if (w[i] != (seed ^ (uint32_t)(i * 2654435761u)))
            return (long)i;
    return -1;
}

/* ---- host backend ------------------------------------------------------- */

START_TEST(host_open_and_devices)
{
    hb_backend *be = open_host();
    ck_assert_str_eq(hb_name(be), "host");
    ck_assert_int_eq(hb_device_count(be), 1);
    ck_assert_uint_eq(hb_granularity(be, 0), page_size());
    ck_assert_uint_eq(hb_granularity(be, 1), 0);
    ck_assert_uint_eq(hb_granularity(be, -1), 0);

    char uuid[HB_UUID_LEN] = "x";
    ck_assert_int_eq(hb_device_uuid(be, 0, uuid, sizeof uuid), HB_OK);
    ck_assert_str_eq(uuid, "");
    ck_assert_int_eq(hb_device_uuid(be, 1, uuid, sizeof uuid), HB_EINVAL);

    int idx = -1;
    char err[512] = "";
    ck_assert_int_eq(hb_device_from_uuid(be, "", &idx, err, sizeof err), HB_OK);
    ck_assert_int_eq(idx, 0);
    idx = -1;
    ck_assert_int_eq(hb_device_from_uuid(be, NULL, &idx, err, sizeof err), HB_OK);
    ck_assert_int_eq(idx, 0);
    idx = 7;
    const char *unknown = "GPU-0badc0de-1234-5678-9abc-def012345678";
    ck_assert_int_eq(hb_device_from_uuid(be, unknown, &idx, err, sizeof err), HB_ENOTFOUND);
    ck_assert_int_eq(idx, 7);
    ck_assert_msg(strstr(err, unknown) && strstr(err, "host backend"),
                  "the message should name the UUID and the host backend: %s", err);
    hb_close(be);
    hb_close(NULL);
}
END_TEST

START_TEST(open_auto_cuda_and_bad_kind)
{
    hb_backend *be = NULL;
    char err[512] = "";
    ck_assert_msg(hb_open("auto", &be, err, sizeof err) == HB_OK, "hb_open(auto): %s", err);
    ck_assert_str_eq(hb_name(be), g_have_gpu ? "cuda" : "host");
    /* Issue 20: a fall back to host keeps cuda's reason for the caller's
     * warning; no fall back, no message. */
    if (g_have_gpu)
        ck_assert_str_eq(err, "");
    else
        ck_assert_msg(strstr(err, "host backend") || strstr(err, "GPU") || strstr(err, "libcuda"),
                      "hb_open(auto) fell back to host without saying why: \"%s\"", err);
    hb_close(be);

    be = NULL;
    ck_assert_msg(hb_open(NULL, &be, err, sizeof err) == HB_OK, "hb_open(NULL): %s", err);
    ck_assert_str_eq(hb_name(be), g_have_gpu ? "cuda" : "host");
    hb_close(be);

    be = NULL;
    err[0] = '\0';
    int rc = hb_open("cuda", &be, err, sizeof err);
    if (!g_have_gpu) {
        ck_assert_int_eq(rc, HB_EUNAVAIL);
        ck_assert_ptr_null(be);
        ck_assert_msg(strstr(err, "no NVIDIA driver was found") || strstr(err, "no usable GPU") ||
                          strstr(err, "no GPU was found") || strstr(err, "without CUDA headers"),
                      "hb_open(cuda) should say that no driver or GPU was found: %s", err);
        ck_assert_msg(strstr(err, "host backend"), "the message should say what to do: %s", err);
    } else {
        ck_assert_msg(rc == HB_OK, "hb_open(cuda) on a GPU machine: %s", err);
        hb_close(be);
    }
    if (access("/dev/nvidiactl", F_OK) != 0)
        ck_assert_msg(!g_have_gpu, "the cuda backend opened on a machine without /dev/nvidiactl");

    be = (hb_backend *)1;
    ck_assert_int_eq(hb_open("tpu", &be, err, sizeof err), HB_EINVAL);
    ck_assert_ptr_null(be);
    ck_assert_str_eq(err, "unknown backend \"tpu\": use \"auto\", \"cuda\" or \"host\"");
    ck_assert_int_eq(hb_open("host", NULL, err, sizeof err), HB_EINVAL);
}
END_TEST

/* The one list of the kinds' names (heapd.conf and heapd --backend use it). */
START_TEST(kind_names)
{
    ck_assert_int_eq(hb_kind_parse("auto"), HB_KIND_AUTO);
    ck_assert_int_eq(hb_kind_parse("cuda"), HB_KIND_CUDA);
    ck_assert_int_eq(hb_kind_parse("host"), HB_KIND_HOST);
    ck_assert_int_eq(hb_kind_parse("Host"), -1);
    ck_assert_int_eq(hb_kind_parse(""), -1);
    ck_assert_int_eq(hb_kind_parse(NULL), -1);
    char buf[64];
    ck_assert_str_eq(hb_kind_list(buf, sizeof buf, ", ", 0), "auto, cuda, host");
    ck_assert_str_eq(hb_kind_list(buf, sizeof buf, " or ", 0), "auto, cuda or host");
    ck_assert_str_eq(hb_kind_list(buf, sizeof buf, " or ", 1), "\"auto\", \"cuda\" or \"host\"");
    ck_assert_str_eq(hb_kind_list(buf, 8, ", ", 0), "auto, c"); /* cut, terminated */
    ck_assert_str_eq(hb_kind_list(buf, 4, ", ", 0), "aut");
}
END_TEST

/* A fresh chunk: a memfd of the right size, close-on-exec, sealed, zeros. */
static void check_new_chunk(const hb_chunk *c, uint64_t size)
{
    ck_assert_int_ge(c->fd, 0);
    ck_assert_uint_eq(c->size, size);
    ck_assert_int_eq(c->device, 0);

    char path[64], target[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", c->fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    ck_assert_int_gt(n, 0);
    target[n] = '\0';
    ck_assert_msg(strncmp(target, "/memfd:heapd-chunk", 18) == 0, "fd is %s, not a memfd", target);

    struct stat st;
    ck_assert_int_eq(fstat(c->fd, &st), 0);
    ck_assert_int_eq((uint64_t)st.st_size, size);
    ck_assert(fcntl(c->fd, F_GETFD) & FD_CLOEXEC);
    int seals = fcntl(c->fd, F_GET_SEALS);
    ck_assert_int_ge(seals, 0);
    ck_assert(seals & F_SEAL_SHRINK);
    ck_assert(seals & F_SEAL_GROW);
    ck_assert_msg(ftruncate(c->fd, (off_t)size / 2) != 0 && errno == EPERM, "a client could shrink the chunk");
    ck_assert_msg(fd_reads_zero(c->fd, size), "a new chunk does not read as zeros");
}

START_TEST(host_chunk_create_sizes)
{
    hb_backend *be = open_host();
    uint64_t pg = hb_granularity(be, 0);
    char err[512] = "";
    hb_chunk one, several;
    ck_assert_msg(hb_chunk_create(be, 0, pg, &one, err, sizeof err) == HB_OK, "%s", err);
    check_new_chunk(&one, pg);
    ck_assert_uint_eq(one.handle, 0);
    ck_assert_msg(hb_chunk_create(be, 0, 5 * pg, &several, err, sizeof err) == HB_OK, "%s", err);
    check_new_chunk(&several, 5 * pg);
    ck_assert_int_ne(one.fd, several.fd);

    hb_chunk bad;
    err[0] = '\0';
    ck_assert_int_eq(hb_chunk_create(be, 0, pg + 1, &bad, err, sizeof err), HB_EINVAL);
    ck_assert_int_eq(bad.fd, -1);
    ck_assert_uint_eq(bad.size, 0);
    ck_assert_msg(strstr(err, "not a multiple") && strstr(err, "granularity"), "%s", err);
    ck_assert_int_eq(hb_chunk_create(be, 0, 3 * pg / 2, &bad, err, sizeof err), HB_EINVAL);
    ck_assert_int_eq(hb_chunk_create(be, 0, 0, &bad, err, sizeof err), HB_EINVAL);
    ck_assert_int_eq(bad.fd, -1);
    ck_assert_int_eq(hb_chunk_create(be, 1, pg, &bad, err, sizeof err), HB_EINVAL);
    ck_assert_msg(strstr(err, "out of range"), "%s", err);
    ck_assert_int_eq(hb_chunk_create(be, -1, pg, &bad, err, sizeof err), HB_EINVAL);
    hb_chunk_release(be, &bad); /* harmless on a failed create */

    hb_chunk_release(be, &one);
    hb_chunk_release(be, &several);
    hb_close(be);
}
END_TEST

START_TEST(host_chunk_scrub)
{
    hb_backend *be = open_host();
    char err[512] = "";
    uint64_t size = 64 * hb_granularity(be, 0);
    hb_chunk c;
    ck_assert_msg(hb_chunk_create(be, 0, size, &c, err, sizeof err) == HB_OK, "%s", err);
    /* A client's mapping, kept across the scrub. */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, c.fd, 0);
    ck_assert_ptr_ne(p, MAP_FAILED);
    fill_pattern(p, size, 0x5eed);
    ck_assert(!fd_reads_zero(c.fd, size));
    ck_assert_msg(hb_chunk_scrub(be, &c, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_msg(all_zero(p, size), "a live mapping still sees old data after the scrub");
    ck_assert(fd_reads_zero(c.fd, size));
    struct stat st;
    ck_assert_int_eq(fstat(c.fd, &st), 0);
    ck_assert_int_eq((uint64_t)st.st_size, size);
    /* Usable again after the scrub. */
    fill_pattern(p, size, 0x1234);
    ck_assert_int_eq(check_pattern(p, size, 0x1234), -1);
    munmap(p, size);

    hb_chunk_release(be, &c);
    ck_assert_int_eq(hb_chunk_scrub(be, &c, err, sizeof err), HB_EINVAL);
    hb_close(be);
}
END_TEST

START_TEST(host_meminfo)
{
    hb_backend *be = open_host();
    char err[512] = "";
    uint64_t f = 0, t = 0;
    ck_assert_msg(hb_meminfo(be, 0, &f, &t, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_uint_gt(t, 0);
    ck_assert_uint_le(f, t);
    ck_assert_uint_gt(f, 0);
    ck_assert_int_eq(hb_meminfo(be, 1, &f, &t, err, sizeof err), HB_EINVAL);
    ck_assert_int_eq(hb_meminfo(be, 0, NULL, &t, err, sizeof err), HB_EINVAL);
    hb_close(be);
}
END_TEST

START_TEST(host_release_closes_fd)
{
    int before = cku_count_fds();
    hb_backend *be = open_host();
    uint64_t pg = hb_granularity(be, 0);
    char err[512] = "";
    hb_chunk c[3];
    for (int i = 0; i < 3; i++)
        ck_assert_msg(hb_chunk_create(be, 0, (uint64_t)(i + 1) * pg, &c[i], err, sizeof err) == HB_OK, "%s", err);
    ck_assert_int_eq(cku_count_fds(), before + 3);
    int fd0 = c[0].fd;
    hb_chunk_release(be, &c[0]);
    ck_assert_int_eq(c[0].fd, -1);
    ck_assert_uint_eq(c[0].size, 0);
    ck_assert_int_eq(fcntl(fd0, F_GETFD), -1);
    ck_assert_int_eq(errno, EBADF);
    ck_assert_int_eq(cku_count_fds(), before + 2);
    hb_chunk_release(be, &c[0]); /* second release: a no-op */
    hb_chunk_release(be, &c[1]);
    hb_chunk_release(be, &c[2]);
    hb_chunk_release(be, NULL);
    hb_close(be);
    ck_assert_int_eq(cku_count_fds(), before);
}
END_TEST

/* ---- client mapper, host kind ------------------------------------------- */

START_TEST(map_reserve_errors)
{
    hm_space s;
    char err[512] = "";
    uint64_t pg = page_size();
    ck_assert_int_eq(hm_reserve(HM_HOST, 64 * MiB, pg + 1, &s, err, sizeof err), HM_EINVAL);
    ck_assert_ptr_null(hm_base(&s));
    ck_assert_msg(strstr(err, "page size"), "%s", err);
    ck_assert_int_eq(hm_reserve(HM_HOST, 0, MiB, &s, err, sizeof err), HM_EINVAL);
    ck_assert_int_eq(hm_reserve(HM_HOST, MiB, 0, &s, err, sizeof err), HM_EINVAL);
    ck_assert_int_eq(hm_reserve(HM_HOST, UINT64_MAX, pg, &s, err, sizeof err), HM_EINVAL);
    ck_assert_int_eq(hm_reserve((hm_kind)7, MiB, pg, &s, err, sizeof err), HM_EINVAL);
    ck_assert_int_eq(hm_unmap_all(&s), HM_OK); /* on a failed reserve: no-op */

    /* va_size rounds up to whole chunks. */
    ck_assert_msg(hm_reserve(HM_HOST, 64 * MiB + 1, MiB, &s, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_uint_eq(s.nchunks, 65);
    ck_assert_uint_eq(s.va_size, 65 * MiB);
    ck_assert_uint_eq((uintptr_t)hm_base(&s) % MiB, 0);
    ck_assert_int_eq(hm_unmap_all(&s), HM_OK);

    if (!g_have_gpu) {
        err[0] = '\0';
        ck_assert_int_eq(hm_reserve(HM_CUDA, 64 * MiB, 2 * MiB, &s, err, sizeof err), HM_EUNAVAIL);
        ck_assert_msg(strstr(err, "NVIDIA driver") || strstr(err, "GPU") || strstr(err, "CUDA headers"), "%s", err);
        ck_assert_ptr_null(hm_base(&s));
        int ord = -1;
        ck_assert_int_eq(hm_cuda_device_by_uuid("", &ord, err, sizeof err), HM_EUNAVAIL);
        char u[64];
        ck_assert_int_eq(hm_cuda_device_uuid(0, u, sizeof u, err, sizeof err), HM_EUNAVAIL);
    }
}
END_TEST

/* The forked "rank": maps the inherited fds into its own space and checks
 * what the parent wrote, then writes its own pattern. Returns an exit code. */
static int child_rank(int fd0, int fd2)
{
    hm_space s;
    char err[512];
    if (hm_reserve(HM_HOST, 64 * MiB, MiB, &s, err, sizeof err) != HM_OK)
        return 10;
    if (hm_map_chunk(&s, 0, fd0, err, sizeof err) != HM_OK || hm_map_chunk(&s, 2, fd2, err, sizeof err) != HM_OK)
        return 11;
    char *b = hm_base(&s);
    if (check_pattern(b, MiB, 0xa0) != -1 || check_pattern(b + 2 * MiB, MiB, 0xa2) != -1)
        return 12;
    fill_pattern(b + 2 * MiB, MiB, 0xc2);
    if (hm_unmap_all(&s) != HM_OK)
        return 13;
    return 0;
}

START_TEST(map_host_two_spaces_and_fork)
{
    hb_backend *be = open_host();
    char err[512] = "";
    hb_chunk c0, c2, small;
    ck_assert_msg(hb_chunk_create(be, 0, MiB, &c0, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_msg(hb_chunk_create(be, 0, MiB, &c2, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_msg(hb_chunk_create(be, 0, hb_granularity(be, 0), &small, err, sizeof err) == HB_OK, "%s", err);

    /* Rank A maps the chunks' own fds. */
    hm_space a, b;
    ck_assert_msg(hm_reserve(HM_HOST, 64 * MiB, MiB, &a, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_ptr_nonnull(hm_base(&a));
    ck_assert_uint_eq(a.nchunks, 64);
    ck_assert_uint_eq(a.va_size, 64 * MiB);
    ck_assert_msg(hm_map_chunk(&a, 0, c0.fd, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_msg(hm_map_chunk(&a, 2, c2.fd, err, sizeof err) == HM_OK, "%s", err);
    ck_assert(hm_is_mapped(&a, 0));
    ck_assert(!hm_is_mapped(&a, 1));
    ck_assert(hm_is_mapped(&a, 2));
    ck_assert(!hm_is_mapped(&a, 64));
    ck_assert_uint_eq(a.nmapped, 2);

    /* Errors leave the space as it was. */
    ck_assert_int_eq(hm_map_chunk(&a, 64, c0.fd, err, sizeof err), HM_EINVAL);
    ck_assert_msg(strstr(err, "past the end"), "%s", err);
    ck_assert_int_eq(hm_map_chunk(&a, 0, c2.fd, err, sizeof err), HM_EINVAL);
    ck_assert_msg(strstr(err, "already mapped"), "%s", err);
    ck_assert_int_eq(hm_map_chunk(&a, 1, -1, err, sizeof err), HM_EINVAL);
    ck_assert_int_eq(hm_map_chunk(&a, 1, 987654, err, sizeof err), HM_EBADFD);
    ck_assert_int_eq(hm_map_chunk(&a, 1, small.fd, err, sizeof err), HM_EBADFD);
    ck_assert_msg(strstr(err, "chunk 1 holds") && strstr(err, "less than"), "%s", err);
    ck_assert(!hm_is_mapped(&a, 1));
    ck_assert_uint_eq(a.nmapped, 2);

    /* Rank B (same process) maps dups and closes them right away: the
     * mapping must outlive the caller's fd. */
    ck_assert_msg(hm_reserve(HM_HOST, 64 * MiB, MiB, &b, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_ptr_ne(hm_base(&a), hm_base(&b));
    int d0 = dup(c0.fd), d2 = dup(c2.fd);
    ck_assert_msg(hm_map_chunk(&b, 0, d0, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_msg(hm_map_chunk(&b, 2, d2, err, sizeof err) == HM_OK, "%s", err);
    close(d0);
    close(d2);

    char *pa = hm_base(&a), *pb = hm_base(&b);
    ck_assert(all_zero(pb, MiB));
    fill_pattern(pa, MiB, 0xa0);
    fill_pattern(pa + 2 * MiB, MiB, 0xa2);
    ck_assert_int_eq(check_pattern(pb, MiB, 0xa0), -1);
    ck_assert_int_eq(check_pattern(pb + 2 * MiB, MiB, 0xa2), -1);
    fill_pattern(pb + MiB / 2, MiB / 2, 0xb0);
    ck_assert_int_eq(check_pattern(pa + MiB / 2, MiB / 2, 0xb0), -1);
    fill_pattern(pa, MiB, 0xa0);

    /* A forked rank gets the fds by inheritance and maps them itself. */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(child_rank(c0.fd, c2.fd));
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked rank failed (status 0x%x)", status);
    ck_assert_int_eq(check_pattern(pa + 2 * MiB, MiB, 0xc2), -1);
    ck_assert_int_eq(check_pattern(pb + 2 * MiB, MiB, 0xc2), -1);

    /* An unmapped slot is not memory: touching it faults. */
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        volatile char *hole = pa + MiB;
        char v = *hole;
        (void)v;
        _exit(0);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
                  "reading an unmapped slot did not fault (status 0x%x)", status);

    /* A scrub reaches every rank's mapping. */
    ck_assert_msg(hb_chunk_scrub(be, &c0, err, sizeof err) == HB_OK, "%s", err);
    ck_assert(all_zero(pa, MiB));
    ck_assert(all_zero(pb, MiB));

    ck_assert_int_eq(hm_unmap_all(&a), HM_OK);
    ck_assert_ptr_null(hm_base(&a));
    ck_assert_uint_eq(a.nmapped, 0);
    ck_assert_int_eq(hm_unmap_all(&a), HM_OK); /* again: no-op */
    ck_assert_int_eq(hm_map_chunk(&a, 0, c0.fd, err, sizeof err), HM_EINVAL);
    /* B still sees the memory after A let go, and after heapd releases it. */
    hb_chunk_release(be, &c2);
    ck_assert_int_eq(check_pattern(pb + 2 * MiB, MiB, 0xc2), -1);
    ck_assert_int_eq(hm_unmap_all(&b), HM_OK);

    hb_chunk_release(be, &c0);
    hb_chunk_release(be, &small);
    hb_close(be);
}
END_TEST

/* ---- cuda (GPU machines only) ------------------------------------------- */

#if HEAPD_HAVE_CUDA_H

/* The few driver calls the test makes itself (libheapc's table holds only
 * what the mapper needs). */
static struct {
    __typeof__(cuDevicePrimaryCtxRetain) *PrimaryCtxRetain;
    __typeof__(cuDevicePrimaryCtxRelease_v2) *PrimaryCtxRelease;
    __typeof__(cuDeviceGet) *DeviceGet;
    __typeof__(cuCtxSetCurrent) *CtxSetCurrent;
    __typeof__(cuCtxSynchronize) *CtxSynchronize;
    __typeof__(cuMemsetD32_v2) *MemsetD32;
    __typeof__(cuMemcpyDtoH_v2) *MemcpyDtoH;
} tcu;

/* Loads the calls and makes device 0's primary context current; 0 or -1.
 * No ck_assert: the peer process of the cross-process test uses it too. */
static int tcu_enter(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return -1;
    *(void **)&tcu.PrimaryCtxRetain = dlsym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&tcu.PrimaryCtxRelease = dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
    *(void **)&tcu.DeviceGet = dlsym(lib, "cuDeviceGet");
    *(void **)&tcu.CtxSetCurrent = dlsym(lib, "cuCtxSetCurrent");
    *(void **)&tcu.CtxSynchronize = dlsym(lib, "cuCtxSynchronize");
    *(void **)&tcu.MemsetD32 = dlsym(lib, "cuMemsetD32_v2");
    *(void **)&tcu.MemcpyDtoH = dlsym(lib, "cuMemcpyDtoH_v2");
    if (!(tcu.PrimaryCtxRetain && tcu.PrimaryCtxRelease && tcu.DeviceGet && tcu.CtxSetCurrent && tcu.CtxSynchronize &&
          tcu.MemsetD32 && tcu.MemcpyDtoH))
        return -1;
    CUdevice dev;
    CUcontext ctx;
    if (tcu.DeviceGet(&dev, 0) != CUDA_SUCCESS || tcu.PrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
        return -1;
    return tcu.CtxSetCurrent(ctx) == CUDA_SUCCESS ? 0 : -1;
}

static void test_cuda_enter(void)
{
    ck_assert_msg(tcu_enter() == 0, "could not load the test's CUDA calls or enter device 0");
}

static void test_cuda_leave(void)
{
    tcu.CtxSetCurrent(NULL);
    tcu.PrimaryCtxRelease(0);
}

static CUdeviceptr dptr(const hm_space *s, uint32_t slot)
{
    return (CUdeviceptr)(uintptr_t)hm_base(s) + (CUdeviceptr)slot * s->chunk_size;
}

/* Every 32-bit word of the n bytes at device address p equals v. */
static void expect_words(CUdeviceptr p, size_t n, uint32_t v, uint32_t *buf, const char *what)
{
    ck_assert_int_eq(tcu.MemcpyDtoH(buf, p, n), CUDA_SUCCESS);
    size_t i = 0;
    while (i < n / 4 && buf[i] == v) /* no ck_assert per word: each one logs a mark point */
        i++;
    ck_assert_msg(i == n / 4, "%s: word %zu is 0x%08x, want 0x%08x", what, i, buf[i], v);
}

START_TEST(cuda_chunks_map_and_copy)
{
    hb_backend *be = NULL;
    char err[512] = "";
    ck_assert_msg(hb_open("cuda", &be, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_str_eq(hb_name(be), "cuda");
    ck_assert_int_ge(hb_device_count(be), 1);

    /* UUIDs: nvidia-smi form, round trips, unknown ones refused with a list. */
    char uuid[HB_UUID_LEN];
    ck_assert_int_eq(hb_device_uuid(be, 0, uuid, sizeof uuid), HB_OK);
    ck_assert_msg(strncmp(uuid, "GPU-", 4) == 0 && strlen(uuid) == 40, "uuid %s", uuid);
    ck_assert_int_eq(hb_device_uuid(be, 0, uuid, 20), HB_EINVAL);
    ck_assert_int_eq(hb_device_uuid(be, 0, uuid, sizeof uuid), HB_OK);
    int idx = -1;
    ck_assert_msg(hb_device_from_uuid(be, uuid, &idx, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_int_eq(idx, 0);
    char upper[HB_UUID_LEN];
    for (size_t i = 0; i <= strlen(uuid); i++)
        upper[i] = (char)((uuid[i] >= 'a' && uuid[i] <= 'f') ? uuid[i] - 32 : uuid[i]);
    ck_assert_int_eq(hb_device_from_uuid(be, upper, &idx, err, sizeof err), HB_OK);
    ck_assert_int_eq(hb_device_from_uuid(be, uuid + 4, &idx, err, sizeof err), HB_OK);
    ck_assert_int_eq(hb_device_from_uuid(be, "", &idx, err, sizeof err), HB_OK);
    ck_assert_int_eq(idx, 0);
    const char *unknown = "GPU-00000000-0000-0000-0000-000000000001";
    ck_assert_int_eq(hb_device_from_uuid(be, unknown, &idx, err, sizeof err), HB_ENOTFOUND);
    ck_assert_msg(strstr(err, unknown) && strstr(err, uuid), "should list %s: %s", uuid, err);
    ck_assert_int_eq(hb_device_from_uuid(be, "GPU-nonsense", &idx, err, sizeof err), HB_EINVAL);

    int ord = -1;
    ck_assert_msg(hm_cuda_device_by_uuid(uuid, &ord, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_int_eq(ord, 0);
    char cuuid[64];
    ck_assert_msg(hm_cuda_device_uuid(0, cuuid, sizeof cuuid, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_str_eq(cuuid, uuid);
    ck_assert_int_eq(hm_cuda_device_by_uuid(unknown, &ord, err, sizeof err), HM_ENOTFOUND);

    uint64_t g = hb_granularity(be, 0);
    ck_assert_uint_gt(g, 0);
    const uint64_t size = 64 * MiB;
    ck_assert_uint_eq(size % g, 0);
    hb_chunk c0, c1, bad;
    ck_assert_int_eq(hb_chunk_create(be, 0, g + 4096, &bad, err, sizeof err), HB_EINVAL);
    ck_assert_msg(strstr(err, "granularity"), "%s", err);
    ck_assert_msg(hb_chunk_create(be, 0, size, &c0, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_msg(hb_chunk_create(be, 0, size, &c1, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_int_ge(c0.fd, 0);
    ck_assert_int_ge(c1.fd, 0);
    ck_assert_uint_ne(c0.handle, 0);
    ck_assert_uint_eq(c0.size, size);
    ck_assert(fcntl(c0.fd, F_GETFD) & FD_CLOEXEC);

    uint64_t f = 0, t = 0;
    ck_assert_msg(hb_meminfo(be, 0, &f, &t, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_uint_gt(t, 0);
    ck_assert_uint_le(f, t);

    /* Out of memory: named call, CUDA error, HB_ENOMEM. */
    uint64_t huge = (2 * t + g - 1) / g * g;
    ck_assert_int_eq(hb_chunk_create(be, 0, huge, &bad, err, sizeof err), HB_ENOMEM);
    ck_assert_msg(strstr(err, "cuMemCreate(") && strstr(err, "CUDA_ERROR_OUT_OF_MEMORY"), "%s", err);

    /* Two "ranks" in one process, different layouts of the same chunks. The
     * test thread has no current context: the mapper brings its own. */
    hm_space a, b;
    ck_assert_msg(hm_reserve(HM_CUDA, 4 * size, size, &a, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_int_eq(a.device, 0);
    ck_assert_msg(hm_map_chunk(&a, 0, c0.fd, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_msg(hm_map_chunk(&a, 1, c1.fd, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_int_eq(hm_set_cuda_device(&a, 0, err, sizeof err), HM_EINVAL);
    ck_assert_msg(hm_reserve(HM_CUDA, 4 * size, size, &b, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_msg(hm_set_cuda_device(&b, 0, err, sizeof err) == HM_OK, "%s", err);
    int d0 = dup(c0.fd), d1 = dup(c1.fd);
    ck_assert_msg(hm_map_chunk(&b, 0, d0, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_msg(hm_map_chunk(&b, 2, d1, err, sizeof err) == HM_OK, "%s", err);
    close(d0); /* the caller may close its fds once mapped */
    close(d1);
    ck_assert_int_eq(hm_map_chunk(&b, 1, -1, err, sizeof err), HM_EINVAL);
    ck_assert_int_eq(hm_map_chunk(&b, 4, c0.fd, err, sizeof err), HM_EINVAL);
    int notcuda = memfd_create("not-a-cuda-chunk", MFD_CLOEXEC);
    ck_assert_int_ge(notcuda, 0);
    ck_assert_int_eq(ftruncate(notcuda, (off_t)size), 0);
    ck_assert_int_ne(hm_map_chunk(&b, 3, notcuda, err, sizeof err), HM_OK);
    ck_assert_msg(strstr(err, "cuMemImportFromShareableHandle"), "%s", err);
    close(notcuda);
    ck_assert(!hm_is_mapped(&b, 3));

    test_cuda_enter();
    uint32_t *buf = malloc(size);
    ck_assert_ptr_nonnull(buf);
    expect_words(dptr(&b, 0), size, 0, buf, "new chunk 0 through b");
    expect_words(dptr(&b, 2), size, 0, buf, "new chunk 1 through b");

    ck_assert_int_eq(tcu.MemsetD32(dptr(&a, 0), 0xA5A50000u, size / 4), CUDA_SUCCESS);
    ck_assert_int_eq(tcu.MemsetD32(dptr(&a, 1), 0x5A5A1111u, size / 4), CUDA_SUCCESS);
    ck_assert_int_eq(tcu.CtxSynchronize(), CUDA_SUCCESS);
    expect_words(dptr(&b, 0), size, 0xA5A50000u, buf, "chunk 0 written through a, read through b");
    expect_words(dptr(&b, 2), size, 0x5A5A1111u, buf, "chunk 1 written through a, read through b");

    /* Scrub reaches the clients' mappings; the other chunk is untouched. */
    ck_assert_msg(hb_chunk_scrub(be, &c0, err, sizeof err) == HB_OK, "%s", err);
    expect_words(dptr(&b, 0), size, 0, buf, "chunk 0 after scrub");
    expect_words(dptr(&a, 1), size, 0x5A5A1111u, buf, "chunk 1 after scrubbing chunk 0");

    /* heapd releasing a chunk does not pull it from under a client. */
    hb_chunk_release(be, &c1);
    expect_words(dptr(&b, 2), size, 0x5A5A1111u, buf, "chunk 1 after heapd released it");
    free(buf);
    test_cuda_leave();

    ck_assert_int_eq(hm_unmap_all(&a), HM_OK);
    ck_assert_int_eq(hm_unmap_all(&b), HM_OK);
    ck_assert_ptr_null(hm_base(&b));
    hb_chunk_release(be, &c0);
    hb_close(be);
}
END_TEST

/* Sends n fds over a Unix socket with one byte. */
static int send_fds(int sock, const int *fds, int n)
{
    char byte = 'F';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = CMSG_SPACE((size_t)n * sizeof(int))};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
    memcpy(CMSG_DATA(c), fds, (size_t)n * sizeof(int));
    return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

static int recv_fds(int sock, int *fds, int n)
{
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    if (recvmsg(sock, &m, 0) != 1)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN((size_t)n * sizeof(int)))
        return -1;
    memcpy(fds, CMSG_DATA(c), (size_t)n * sizeof(int));
    return 0;
}

/* The other process: receives two chunk fds, maps them, checks chunk 0's
 * pattern, writes chunk 1's. Forked before this test touches CUDA. */
static int cuda_peer(int sock, uint64_t size)
{
    int fds[2];
    char err[512], ok = 'K';
    if (recv_fds(sock, fds, 2) != 0)
        return 20;
    hm_space s;
    if (hm_reserve(HM_CUDA, 2 * size, size, &s, err, sizeof err) != HM_OK)
        return 21;
    if (hm_map_chunk(&s, 0, fds[0], err, sizeof err) != HM_OK || hm_map_chunk(&s, 1, fds[1], err, sizeof err) != HM_OK)
        return 22;
    close(fds[0]);
    close(fds[1]);
    if (tcu_enter() != 0)
        return 28;
    uint32_t *buf = malloc(size);
    if (!buf || tcu.MemcpyDtoH(buf, dptr(&s, 0), size) != CUDA_SUCCESS)
        return 23;
    for (size_t i = 0; i < size / 4; i++)
        if (buf[i] != 0xC0FFEE00u)
            return 24;
    if (tcu.MemsetD32(dptr(&s, 1), 0xBEEF0001u, size / 4) != CUDA_SUCCESS || tcu.CtxSynchronize() != CUDA_SUCCESS)
        return 25;
    free(buf);
    test_cuda_leave();
    if (hm_unmap_all(&s) != HM_OK)
        return 26;
    return write(sock, &ok, 1) == 1 ? 0 : 27;
}

START_TEST(cuda_fds_across_processes)
{
    const uint64_t size = 64 * MiB;
    const char *fk = getenv("CK_FORK");
    if (fk && strcmp(fk, "no") == 0)
        return; /* earlier tests initialised CUDA in this process: a forked peer could not use it */
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        _exit(cuda_peer(sv[1], size));
    }
    close(sv[1]);

    hb_backend *be = NULL;
    char err[512] = "";
    ck_assert_msg(hb_open("cuda", &be, err, sizeof err) == HB_OK, "%s", err);
    hb_chunk c[2];
    for (int i = 0; i < 2; i++)
        ck_assert_msg(hb_chunk_create(be, 0, size, &c[i], err, sizeof err) == HB_OK, "%s", err);
    hm_space s;
    ck_assert_msg(hm_reserve(HM_CUDA, 2 * size, size, &s, err, sizeof err) == HM_OK, "%s", err);
    for (uint32_t i = 0; i < 2; i++)
        ck_assert_msg(hm_map_chunk(&s, i, c[i].fd, err, sizeof err) == HM_OK, "%s", err);
    test_cuda_enter();
    ck_assert_int_eq(tcu.MemsetD32(dptr(&s, 0), 0xC0FFEE00u, size / 4), CUDA_SUCCESS);
    ck_assert_int_eq(tcu.CtxSynchronize(), CUDA_SUCCESS);

    int fds[2] = {c[0].fd, c[1].fd};
    ck_assert_int_eq(send_fds(sv[0], fds, 2), 0);
    char reply = 0;
    ssize_t r = read(sv[0], &reply, 1);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the peer process failed (status 0x%x: exit code %d)",
                  status, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    ck_assert_int_eq(r, 1);
    ck_assert_int_eq(reply, 'K');

    uint32_t *buf = malloc(size);
    ck_assert_ptr_nonnull(buf);
    expect_words(dptr(&s, 1), size, 0xBEEF0001u, buf, "chunk 1 written by the peer process");
    free(buf);
    test_cuda_leave();
    ck_assert_int_eq(hm_unmap_all(&s), HM_OK);
    hb_chunk_release(be, &c[0]);
    hb_chunk_release(be, &c[1]);
    hb_close(be);
    close(sv[0]);
}
END_TEST

#endif /* HEAPD_HAVE_CUDA_H */

/* ---- runner ------------------------------------------------------------- */

/* Opens the cuda backend in a child, so this process never initialises CUDA
 * (check forks every test from it; CUDA does not survive a fork). */
static int probe_gpu(void)
{
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        hb_backend *be = NULL;
        char err[512] = "";
        int rc = hb_open("cuda", &be, err, sizeof err);
        if (rc != HB_OK && access("/dev/nvidiactl", F_OK) == 0)
            fprintf(stderr,
                    "note: this machine has an NVIDIA device, but the cuda backend did not "
                    "open: %s (under AddressSanitizer, set ASAN_OPTIONS=protect_shadow_gap=0)\n",
                    err);
        _exit(rc == HB_OK ? 0 : 1);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static Suite *backend_suite(void)
{
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("host");
    tcase_add_test(tc, host_open_and_devices);
    tcase_add_test(tc, open_auto_cuda_and_bad_kind);
    tcase_add_test(tc, kind_names);
    tcase_add_test(tc, host_chunk_create_sizes);
    tcase_add_test(tc, host_chunk_scrub);
    tcase_add_test(tc, host_meminfo);
    tcase_add_test(tc, host_release_closes_fd);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);

    tc = tcase_create("map_host");
    tcase_add_test(tc, map_reserve_errors);
    tcase_add_test(tc, map_host_two_spaces_and_fork);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);

#if HEAPD_HAVE_CUDA_H
    if (g_have_gpu) {
        tc = tcase_create("cuda");
        tcase_add_test(tc, cuda_chunks_map_and_copy);
        tcase_add_test(tc, cuda_fds_across_processes);
        tcase_set_timeout(tc, 120);
        suite_add_tcase(s, tc);
    }
#endif
    return s;
}

int main(void)
{
    g_have_gpu = probe_gpu();
#if !HEAPD_HAVE_CUDA_H
    g_have_gpu = 0;
#endif
    if (!g_have_gpu) {
        printf("skipped: no GPU (cuda backend tests)\n");
        fflush(stdout);
    }
    return cku_run(backend_suite());
}
