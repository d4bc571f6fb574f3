/* statuspage.c - see statuspage.h. */
#include "statuspage.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1; older libc headers lack it */
#endif

int hd_status_create(hd_status *s, uint32_t rank, char *err, size_t errlen)
{
    s->fd = -1;
    s->page = NULL;
    int fd = memfd_create("heapd-status", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        snprintf(err, errlen, "memfd_create for the status page failed: %s", strerror(errno));
        return -1;
    }
    if (ftruncate(fd, HS_PAGE_SIZE) < 0) {
        snprintf(err, errlen, "sizing the status page failed: %s", strerror(errno));
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, HS_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "mapping the status page failed: %s", strerror(errno));
        close(fd);
        return -1;
    }
    /* Clients may map it but never resize it under heapd, nor write it:
     * F_SEAL_FUTURE_WRITE refuses every write and writable mapping from now
     * on, heapd's own mapping (made above) stays writable. A kernel older
     * than 5.1 lacks it (EINVAL): the page is then writable by its clients,
     * as before; libheapc needs only the three others (heapc_map.h). */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0 &&
        (errno != EINVAL || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)) {
        snprintf(err, errlen, "sealing the status page failed: %s; heapd needs Linux 3.17 or newer", strerror(errno));
        munmap(p, HS_PAGE_SIZE);
        close(fd);
        return -1;
    }
    s->fd = fd;
    s->page = p;
    memset(p, 0, HS_PAGE_SIZE);
    s->page->magic = HS_MAGIC;
    s->page->version = HS_VERSION;
    s->page->rank = rank;
    return 0;
}

void hd_status_destroy(hd_status *s)
{
    if (s->page)
        munmap(s->page, HS_PAGE_SIZE);
    if (s->fd >= 0)
        close(s->fd);
    s->page = NULL;
    s->fd = -1;
}

#define PUT(field) __atomic_store_n(&p->field, v->field, __ATOMIC_RELAXED)

void hd_status_write(hd_status *s, const hs_page *v)
{
    hs_page *p = s->page;
    if (!p)
        return;
    uint64_t seq = __atomic_load_n(&p->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&p->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    PUT(mapped);
    PUT(live);
    PUT(released);
    PUT(free);
    PUT(rank_held);
    PUT(rank_released);
    PUT(collects);
    PUT(growths);
    PUT(allocs);
    PUT(epoch);
    PUT(device_free);
    PUT(device_total);
    PUT(device_sampled_ns);
    PUT(collects_skipped);
    PUT(stream_waiting);
    PUT(device_waits_avoided);
    PUT(state);
    PUT(resident);
    PUT(releases);
    PUT(restores);
    __atomic_store_n(&p->updates, p->updates + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&p->seq, seq + 2, __ATOMIC_RELEASE);
}
