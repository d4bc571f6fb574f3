/* backend.c - picks a backend and checks arguments before dispatching to
 * backend_host.c or backend_cuda.c. See backend.h. */
#define HEAPD_BACKEND_IMPL 1
#include "backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int hb_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

static void chunk_clear(hb_chunk *c)
{
    c->fd = -1;
    c->device = -1;
    c->size = 0;
    c->handle = 0;
}

const char *const hb_kind_names[HB_KIND_N] = {
    [HB_KIND_AUTO] = "auto", [HB_KIND_CUDA] = "cuda", [HB_KIND_HOST] = "host"};

int hb_kind_parse(const char *name)
{
    for (int k = 0; name && k < HB_KIND_N; k++)
        if (strcmp(name, hb_kind_names[k]) == 0)
            return k;
    return -1;
}

const char *hb_kind_list(char *buf, size_t len, const char *last, int quoted)
{
    size_t n = 0;
    if (len)
        buf[0] = '\0';
    for (int k = 0; k < HB_KIND_N && n < len; k++) {
        const char *sep = k == 0 ? "" : k == HB_KIND_N - 1 ? last : ", ";
        int w = snprintf(buf + n, len - n, quoted ? "%s\"%s\"" : "%s%s", sep, hb_kind_names[k]);
        n += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

int hb_open(const char *kind, hb_backend **out, char *err, size_t errlen)
{
    if (!out)
        return hb_fail(err, errlen, HB_EINVAL, "hb_open: out is NULL");
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    int k = !kind || !*kind ? HB_KIND_AUTO : hb_kind_parse(kind);
    if (k == HB_KIND_HOST)
        return hb_host_open(out, err, errlen);
    if (k == HB_KIND_CUDA)
        return hb_cuda_open(out, err, errlen);
    if (k == HB_KIND_AUTO) {
        int rc = hb_cuda_open(out, err, errlen);
        if (rc != HB_EUNAVAIL)
            return rc; /* a GPU is there: use it or report why not */
        /* Keep cuda's reason: on success err says why host was chosen. */
        rc = hb_host_open(out, NULL, 0);
        if (rc != HB_OK)
            return hb_host_open(out, err, errlen);
        return HB_OK;
    }
    char kinds[64];
    return hb_fail(err, errlen, HB_EINVAL, "unknown backend \"%s\": use %s", kind,
                   hb_kind_list(kinds, sizeof kinds, " or ", 1));
}

void hb_close(hb_backend *be)
{
    if (be)
        be->ops->close(be);
}

const char *hb_name(const hb_backend *be) { return be ? be->ops->name : "none"; }

int hb_device_count(const hb_backend *be) { return be ? be->ops->device_count(be) : 0; }

int hb_device_from_uuid(const hb_backend *be, const char *uuid, int *index, char *err, size_t errlen)
{
    if (!be || !index)
        return hb_fail(err, errlen, HB_EINVAL, "hb_device_from_uuid: backend or index is NULL");
    if (!uuid)
        uuid = "";
    return be->ops->device_from_uuid(be, uuid, index, err, errlen);
}

int hb_device_uuid(const hb_backend *be, int index, char *buf, size_t len)
{
    if (!be || !buf || len == 0 || index < 0 || index >= be->ops->device_count(be))
        return HB_EINVAL;
    return be->ops->device_uuid(be, index, buf, len);
}

uint64_t hb_granularity(const hb_backend *be, int device)
{
    if (!be || device < 0 || device >= be->ops->device_count(be))
        return 0;
    return be->ops->granularity(be, device);
}

static int check_device(const hb_backend *be, int device, char *err, size_t errlen)
{
    int n = be->ops->device_count(be);
    if (device < 0 || device >= n)
        return hb_fail(err, errlen, HB_EINVAL, "device index %d is out of range: the %s backend has %d device%s",
                       device, be->ops->name, n, n == 1 ? "" : "s");
    return HB_OK;
}

int hb_chunk_create(hb_backend *be, int device, uint64_t size, hb_chunk *out, char *err, size_t errlen)
{
    if (!out)
        return hb_fail(err, errlen, HB_EINVAL, "hb_chunk_create: out is NULL");
    chunk_clear(out);
    if (!be)
        return hb_fail(err, errlen, HB_EINVAL, "hb_chunk_create: backend is NULL");
    int rc = check_device(be, device, err, errlen);
    if (rc)
        return rc;
    if (size == 0)
        return hb_fail(err, errlen, HB_EINVAL, "chunk size is 0: give the heap a chunk_size of at least one granule");
    uint64_t g = be->ops->granularity(be, device);
    if (g && size % g != 0)
        return hb_fail(err, errlen, HB_EINVAL,
                       "chunk size %llu is not a multiple of the allocation granularity "
                       "%llu of %s device %d: round the heap's chunk_size up to a multiple of %llu",
                       (unsigned long long)size, (unsigned long long)g, be->ops->name, device, (unsigned long long)g);
    rc = be->ops->chunk_create(be, device, size, out, err, errlen);
    if (rc)
        chunk_clear(out);
    return rc;
}

void hb_chunk_release(hb_backend *be, hb_chunk *c)
{
    if (!be || !c)
        return;
    if (c->fd >= 0 || c->handle)
        be->ops->chunk_release(be, c);
    chunk_clear(c);
}

int hb_chunk_scrub(hb_backend *be, hb_chunk *c, char *err, size_t errlen)
{
    if (!be || !c)
        return hb_fail(err, errlen, HB_EINVAL, "hb_chunk_scrub: backend or chunk is NULL");
    if (c->size == 0 || c->fd < 0)
        return hb_fail(err, errlen, HB_EINVAL, "hb_chunk_scrub: the chunk was released or never created");
    int rc = check_device(be, c->device, err, errlen);
    if (rc)
        return rc;
    return be->ops->chunk_scrub(be, c, err, errlen);
}

static int chunk_copy(hb_backend *be, hb_chunk *c, void *host, int save, char *err, size_t errlen)
{
    if (!be || !c || !host)
        return hb_fail(err, errlen, HB_EINVAL, "hb_chunk_%s: a NULL argument", save ? "save" : "load");
    if (c->size == 0 || c->fd < 0)
        return hb_fail(err, errlen, HB_EINVAL, "hb_chunk_%s: the chunk was released or never created",
                       save ? "save" : "load");
    int rc = check_device(be, c->device, err, errlen);
    if (rc)
        return rc;
    return be->ops->chunk_copy(be, c, host, save, err, errlen);
}

int hb_chunk_save(hb_backend *be, hb_chunk *c, void *host, char *err, size_t errlen)
{
    return chunk_copy(be, c, host, 1, err, errlen);
}

int hb_chunk_load(hb_backend *be, hb_chunk *c, const void *host, char *err, size_t errlen)
{
    return chunk_copy(be, c, (void *)host, 0, err, errlen);
}

int hb_host_pin(hb_backend *be, void *p, uint64_t len, char *err, size_t errlen)
{
    if (!be || !p || !len)
        return hb_fail(err, errlen, HB_EINVAL, "hb_host_pin: a NULL argument or no bytes");
    return be->ops->host_pin(be, p, len, 1, err, errlen);
}

void hb_host_unpin(hb_backend *be, void *p)
{
    if (be && p)
        be->ops->host_pin(be, p, 0, 0, NULL, 0);
}

int hb_meminfo(hb_backend *be, int device, uint64_t *free_bytes, uint64_t *total_bytes, char *err, size_t errlen)
{
    if (!be || !free_bytes || !total_bytes)
        return hb_fail(err, errlen, HB_EINVAL, "hb_meminfo: a NULL argument");
    int rc = check_device(be, device, err, errlen);
    if (rc)
        return rc;
    return be->ops->meminfo(be, device, free_bytes, total_bytes, err, errlen);
}
