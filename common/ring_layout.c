/* ring_layout.c - the ring layout's helpers (see ring_layout.h). */
#include "ring_layout.h"

#include <stdio.h>
#include <string.h>

int hr_geom_ok(hr_geom g)
{
    if (g.nslots < 1 || g.nslots > HR_NSLOTS_MAX)
        return -1;
    if (g.slot_size < HR_SLOT_HDR + 64 || g.slot_size > HR_SLOT_SIZE_MAX || g.slot_size % 64)
        return -1;
    return 0;
}

size_t hr_size(hr_geom g) { return HR_HDR_SIZE + 2 * (size_t)g.nslots * g.slot_size; }

void hr_init(void *mem, hr_geom g)
{
    memset(mem, 0, hr_size(g));
    hr_header *h = mem;
    h->magic = HR_MAGIC;
    h->version = HR_VERSION;
    h->nslots = g.nslots;
    h->slot_size = g.slot_size;
    h->size = hr_size(g);
    atomic_init(&h->srv_sleeping, 0);
    atomic_init(&h->resp_futex, 0);
    atomic_init(&h->cli_waiting, 0);
}

int hr_header_check(const void *mem, size_t size, hr_geom *out, char *why, size_t len)
{
    const hr_header *h = mem;
    if (size < HR_HDR_SIZE || h->magic != HR_MAGIC || h->version != HR_VERSION) {
        snprintf(why, len, "the ring's header has magic 0x%08x version %u (want 0x%08x version %u)",
                 size >= sizeof *h ? h->magic : 0, size >= sizeof *h ? h->version : 0, HR_MAGIC, HR_VERSION);
        return -1;
    }
    hr_geom g = {h->nslots, h->slot_size};
    if (hr_geom_ok(g) || hr_size(g) != size || h->size != size) {
        snprintf(why, len, "the ring's geometry (%u slots of %u bytes, %llu bytes) does not match its %zu-byte memfd",
                 g.nslots, g.slot_size, (unsigned long long)h->size, size);
        return -1;
    }
    *out = g;
    return 0;
}

hr_slot *hr_req_slot(void *mem, hr_geom g, uint64_t s)
{
    return (hr_slot *)((char *)mem + HR_HDR_SIZE + (size_t)(s % g.nslots) * g.slot_size);
}

hr_slot *hr_resp_slot(void *mem, hr_geom g, uint64_t s)
{
    return (hr_slot *)((char *)mem + HR_HDR_SIZE + ((size_t)g.nslots + (size_t)(s % g.nslots)) * g.slot_size);
}

/* FNV-1a over the fields and the payload. */
uint32_t hr_chk(uint64_t id, uint32_t len, uint32_t kind, const void *payload)
{
    uint32_t h = 2166136261u;
    uint64_t w[2] = {id, ((uint64_t)len << 32) | kind};
    const unsigned char *b = (const unsigned char *)w;
    for (size_t i = 0; i < sizeof w; i++)
        h = (h ^ b[i]) * 16777619u;
    b = payload;
    for (uint32_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 16777619u;
    return h;
}

void hr_put(hr_slot *sl, uint64_t s, uint64_t id, uint32_t kind, const void *payload, uint32_t len)
{
    if (len && payload != sl->payload)
        memcpy(sl->payload, payload, len);
    sl->id = id;
    sl->len = len;
    sl->kind = kind;
    sl->chk = hr_chk(id, len, kind, sl->payload);
    atomic_store_explicit(&sl->seq, s + 1, memory_order_release);
}

int hr_posted(const hr_slot *sl, uint64_t s)
{
    return atomic_load_explicit(&((hr_slot *)sl)->seq, memory_order_acquire) == s + 1;
}

/* Copies a complete slot whose seq was s + 1: fields, payload, then checks
 * that seq did not move and chk matches. */
static int copy_slot(const hr_slot *csl, uint64_t s, hr_geom g, unsigned char *buf, uint64_t *id, uint32_t *len,
                     uint32_t *kind)
{
    hr_slot *sl = (hr_slot *)csl;
    /* Each field read once: the other side may change them meanwhile. */
    uint64_t i = *(volatile uint64_t *)&sl->id;
    uint32_t l = *(volatile uint32_t *)&sl->len;
    uint32_t k = *(volatile uint32_t *)&sl->kind;
    uint32_t c = *(volatile uint32_t *)&sl->chk;
    if (l > hr_payload_max(g))
        return HR_ELEN;
    memcpy(buf, sl->payload, l);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&sl->seq, memory_order_relaxed) != s + 1)
        return HR_ETORN;
    if (hr_chk(i, l, k, buf) != c)
        return HR_ETORN;
    *id = i;
    *len = l;
    *kind = k;
    return HR_OK;
}

int hr_take(const hr_slot *sl, uint64_t s, hr_geom g, unsigned char *buf, uint64_t *id, uint32_t *len)
{
    uint64_t seq = atomic_load_explicit(&((hr_slot *)sl)->seq, memory_order_acquire);
    uint64_t prev = s >= g.nslots ? s + 1 - g.nslots : 0;
    if (seq == prev)
        return HR_EMPTY;
    if (seq != s + 1)
        return HR_ESEQ;
    uint32_t kind;
    int rc = copy_slot(sl, s, g, buf, id, len, &kind);
    if (rc == HR_OK && kind != HR_KIND_REQUEST)
        return HR_EKIND;
    return rc;
}

int hr_read_resp(const hr_slot *sl, uint64_t s, hr_geom g, unsigned char *buf, uint64_t *id, uint32_t *len,
                 uint32_t *kind)
{
    if (atomic_load_explicit(&((hr_slot *)sl)->seq, memory_order_acquire) != s + 1)
        return HR_EMPTY;
    return copy_slot(sl, s, g, buf, id, len, kind);
}

const char *hr_strerror(int rc)
{
    switch (rc) {
#define HR_CODE_DESC(name, value, desc)                                                                                \
    case name:                                                                                                         \
        return desc;
        HR_CODE_MAP(HR_CODE_DESC)
#undef HR_CODE_DESC
    }
    return "unknown ring error";
}

const char *hr_errname(int rc)
{
    switch (rc) {
#define HR_CODE_NAME(name, value, desc)                                                                                \
    case name:                                                                                                         \
        return #name;
        HR_CODE_MAP(HR_CODE_NAME)
#undef HR_CODE_NAME
    }
    return "HR_E(unknown)";
}
