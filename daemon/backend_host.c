/* backend_host.c - the "host" backend: chunks are sealed memfds in host
 * memory. One pseudo-device (index 0, UUID ""). See backend.h. */
#define HEAPD_BACKEND_IMPL 1
#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

typedef struct host_backend {
    hb_backend base;
    uint64_t page;
} host_backend;

static void host_close(hb_backend *be) { free(be); }

static int host_device_count(const hb_backend *be)
{
    (void)be;
    return 1;
}

static int host_device_from_uuid(const hb_backend *be, const char *uuid, int *index, char *err, size_t errlen)
{
    (void)be;
    if (uuid[0] == '\0') {
        *index = 0;
        return HB_OK;
    }
    return hb_fail(err, errlen, HB_ENOTFOUND,
                   "the host backend has no GPU \"%s\": its one pseudo-device is named by the "
                   "empty UUID; attach with an empty device UUID, or run heapd with the cuda "
                   "backend to serve GPUs",
                   uuid);
}

static int host_device_uuid(const hb_backend *be, int index, char *buf, size_t len)
{
    (void)be;
    (void)index;
    buf[0] = '\0';
    return HB_OK;
}

static uint64_t host_granularity(const hb_backend *be, int device)
{
    (void)device;
    return ((const host_backend *)be)->page;
}

static int errno_status(int e)
{
    return (e == ENOMEM || e == ENOSPC || e == EMFILE || e == ENFILE) ? HB_ENOMEM : HB_ESYS;
}

static int host_chunk_create(hb_backend *be, int device, uint64_t size, hb_chunk *out, char *err, size_t errlen)
{
    (void)be;
    int fd = memfd_create("heapd-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        int e = errno;
        return hb_fail(err, errlen, errno_status(e),
                       "memfd_create(heapd-chunk) failed: %s; raise the open-file limit "
                       "(ulimit -n) if heapd has run out of descriptors",
                       strerror(e));
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        return hb_fail(err, errlen, errno_status(e), "ftruncate of a %" PRIu64 "-byte host chunk failed: %s", size,
                       strerror(e));
    }
    /* A client holding a dup of the fd must not be able to shrink the chunk
     * under the other ranks (SIGBUS) or grow it. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        int e = errno;
        close(fd);
        return hb_fail(err, errlen, HB_ESYS, "sealing a host chunk memfd failed: %s; heapd needs Linux 3.17 or newer",
                       strerror(e));
    }
    out->fd = fd;
    out->device = device;
    out->size = size;
    out->handle = 0;
    return HB_OK; /* ftruncate of a new memfd reads as zeros */
}

static void host_chunk_release(hb_backend *be, hb_chunk *c)
{
    (void)be;
    if (c->fd >= 0)
        close(c->fd);
}

static int host_chunk_scrub(hb_backend *be, hb_chunk *c, char *err, size_t errlen)
{
    (void)be;
    /* Punching the whole range frees the pages; every mapping then reads
     * fresh zero pages. */
    if (fallocate(c->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)c->size) == 0)
        return HB_OK;
    int e = errno;
    if (e != EOPNOTSUPP && e != ENOSYS && e != EPERM)
        return hb_fail(err, errlen, HB_ESYS, "fallocate(PUNCH_HOLE) of a %" PRIu64 "-byte host chunk failed: %s",
                       c->size, strerror(e));
    void *p = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (p == MAP_FAILED) {
        e = errno;
        return hb_fail(err, errlen, errno_status(e), "mapping a %" PRIu64 "-byte host chunk to zero it failed: %s",
                       c->size, strerror(e));
    }
    memset(p, 0, c->size);
    munmap(p, c->size);
    return HB_OK;
}

/* Issue 30: c's bytes to host memory (save) or back (load). */
static int host_chunk_copy(hb_backend *be, hb_chunk *c, void *host, int save, char *err, size_t errlen)
{
    (void)be;
    void *p = mmap(NULL, c->size, save ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        return hb_fail(err, errlen, errno_status(e), "mapping a %" PRIu64 "-byte host chunk to %s it failed: %s",
                       c->size, save ? "save" : "load", strerror(e));
    }
    if (save)
        memcpy(host, p, c->size);
    else
        memcpy(p, host, c->size);
    munmap(p, c->size);
    return HB_OK;
}

/* Host memory needs no pinning for host chunks. */
static int host_host_pin(hb_backend *be, void *p, uint64_t len, int pin, char *err, size_t errlen)
{
    (void)be, (void)p, (void)len, (void)pin, (void)err, (void)errlen;
    return HB_OK;
}

/* Reads "Key:   123 kB" lines; returns 0 when both were found. */
static int read_proc_meminfo(uint64_t *avail, uint64_t *total)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f)
        return -1;
    char line[256];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) {
            *total = (uint64_t)kb * 1024;
            found |= 1;
        } else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            *avail = (uint64_t)kb * 1024;
            found |= 2;
        }
    }
    fclose(f);
    return found == 3 ? 0 : -1;
}

static int host_meminfo(hb_backend *be, int device, uint64_t *free_bytes, uint64_t *total_bytes, char *err,
                        size_t errlen)
{
    (void)be;
    (void)device;
    uint64_t avail = 0, total = 0;
    if (read_proc_meminfo(&avail, &total) != 0) {
        struct sysinfo si;
        if (sysinfo(&si) != 0) {
            int e = errno;
            return hb_fail(err, errlen, HB_ESYS,
                           "neither /proc/meminfo nor sysinfo() gave the host's memory: %s; "
                           "mount /proc in heapd's namespace",
                           strerror(e));
        }
        total = (uint64_t)si.totalram * si.mem_unit;
        avail = ((uint64_t)si.freeram + si.bufferram) * si.mem_unit;
    }
    if (avail > total)
        avail = total;
    *free_bytes = avail;
    *total_bytes = total;
    return HB_OK;
}

static const hb_ops host_ops = {
    .name = "host",
    .close = host_close,
    .device_count = host_device_count,
    .device_from_uuid = host_device_from_uuid,
    .device_uuid = host_device_uuid,
    .granularity = host_granularity,
    .chunk_create = host_chunk_create,
    .chunk_release = host_chunk_release,
    .chunk_scrub = host_chunk_scrub,
    .chunk_copy = host_chunk_copy,
    .host_pin = host_host_pin,
    .meminfo = host_meminfo,
};

int hb_host_open(hb_backend **out, char *err, size_t errlen)
{
    host_backend *hb = calloc(1, sizeof *hb);
    if (!hb)
        return hb_fail(err, errlen, HB_ENOMEM, "out of host memory opening the host backend");
    long page = sysconf(_SC_PAGESIZE);
    hb->page = page > 0 ? (uint64_t)page : 4096;
    hb->base.ops = &host_ops;
    *out = &hb->base;
    return HB_OK;
}
