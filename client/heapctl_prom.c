/* heapctl_prom.c - heapctl's Prometheus writer: `heapctl metrics` in the
 * text exposition format (docs/man/heapctl.1 lists the families). */
#include "heapctl.h"
#include "utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* hu_len (common/utf8.h): names from heapd are bytes; output must be UTF-8. */
#define utf8_len hu_len

/* ---- Prometheus text exposition format ------------------------------------- */

/* A label value: \ " and newline escaped, invalid UTF-8 as U+FFFD. */
static void prom_label(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p;) {
        int n = utf8_len(p);
        if (!n) {
            fputs("\xef\xbf\xbd", f);
            p++;
            continue;
        }
        if (*p == '\\' || *p == '"')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else
            fwrite(p, 1, (size_t)n, f);
        p += n;
    }
}

typedef struct prom {
    FILE *f;
    const char *last; /* the family whose HELP/TYPE were written last */
} prom;

static void prom_family(prom *m, const char *name, const char *type, const char *help)
{
    if (m->last && !strcmp(m->last, name))
        return;
    fprintf(m->f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    m->last = name;
}

/* One sample of a per-heap family: NAME{heap="..",owner_uid=".."[,EXTRA]} V */
static void prom_heap(prom *m, const char *name, const heapc_heap_stats *h, const char *extra, double v)
{
    fprintf(m->f, "%s{heap=\"", name);
    prom_label(m->f, h->name);
    fprintf(m->f, "\",owner_uid=\"%" PRIu32 "\"%s%s} %.17g\n", h->owner_uid, extra ? "," : "", extra ? extra : "", v);
}

static void prom_hist(prom *m, const char *name, const heapc_heap_stats *h, const heapc_hist *g)
{
    char bn[128], le[64];
    uint64_t cum = 0;
    snprintf(bn, sizeof bn, "%s_bucket", name);
    for (size_t i = 0; i <= g->nbounds; i++) {
        cum += g->counts[i];
        if (i < g->nbounds)
            snprintf(le, sizeof le, "le=\"%.17g\"", g->bounds[i]);
        else
            snprintf(le, sizeof le, "le=\"+Inf\"");
        prom_heap(m, bn, h, le, (double)cum);
    }
    snprintf(bn, sizeof bn, "%s_sum", name);
    prom_heap(m, bn, h, NULL, g->sum_seconds);
    snprintf(bn, sizeof bn, "%s_count", name);
    prom_heap(m, bn, h, NULL, (double)g->count);
}

/* The daemon's families: build, uptime, clients, heaps, store, quotas. */
static void prom_daemon(prom *m, const heapc_daemon_stats *s)
{
    FILE *f = m->f;
    prom_family(m, "heapd_build_info", "gauge", "heapd's version and backend (always 1).");
    fputs("heapd_build_info{version=\"", f);
    prom_label(f, s->version);
    fputs("\",backend=\"", f);
    prom_label(f, s->backend);
    fputs("\"} 1\n", f);
    prom_family(m, "heapd_uptime_seconds", "gauge", "Seconds since heapd started.");
    fprintf(f, "heapd_uptime_seconds %.3f\n", (double)s->uptime_ms / 1000.0);
    prom_family(m, "heapd_clients", "gauge", "Client connections heapd serves.");
    fprintf(f, "heapd_clients %" PRIu32 "\n", s->clients);
    prom_family(m, "heapd_heaps", "gauge", "Heaps heapd serves (that this user may see).");
    fprintf(f, "heapd_heaps %zu\n", s->nheaps);
    prom_family(m, "heapd_store_configured", "gauge", "1 when heaps may span nodes through a store.");
    fprintf(f, "heapd_store_configured %d\n", s->store[0] ? 1 : 0);
    prom_family(m, "heapd_store_connected", "gauge",
                "1 when the store is connected and subscribed, 0 when unreachable or not configured.");
    fprintf(f, "heapd_store_connected %d\n", s->store_connected ? 1 : 0);
    prom_family(m, "heapd_quota_heap_bytes", "gauge",
                "heapd.conf quota_heap: most chunk memory of one heap (0: no limit).");
    fprintf(f, "heapd_quota_heap_bytes %" PRIu64 "\n", s->quota_heap);
    prom_family(m, "heapd_quota_uid_bytes", "gauge",
                "heapd.conf quota_uid: most chunk memory and bookkeeping of one uid's heaps (0: no limit).");
    fprintf(f, "heapd_quota_uid_bytes %" PRIu64 "\n", s->quota_uid);
}

/* The chunk memory heapd's quotas charge a heap with: its extent on every
 * local rank, while released only what a release of named blocks kept
 * (resident_bytes; issue 30), and its spare chunks (issue 27). */
static uint64_t chunk_bytes(const heapc_heap_stats *h)
{
    if (h->state == HEAPC_STATE_RELEASED || h->state == HEAPC_STATE_RESTORING)
        return h->resident_bytes;
    return h->mapped * (h->nranks ? h->nranks : 1) + h->spare_bytes;
}

/* Quota use per uid: the chunk memory of its heaps on this node, their
 * bookkeeping, and the two together (what quota_uid bounds). */
static void prom_uids(prom *m, const heapc_daemon_stats *s)
{
    static const char *fam[][2] = {
        {"heapd_uid_chunk_bytes", "Chunk memory of all heaps of a uid on this node."},
        {"heapd_uid_bookkeeping_bytes",
         "heapd's bookkeeping of all heaps of a uid on this node (allocator bitmaps and block records, decision "
         "logs)."},
        {"heapd_uid_quota_bytes",
         "Chunk memory and bookkeeping of a uid's heaps on this node (what quota_uid bounds)."},
    };
    FILE *f = m->f;
    for (size_t k = 0; k < 3; k++) {
        prom_family(m, fam[k][0], "gauge", fam[k][1]);
        for (size_t i = 0; i < s->nheaps; i++) {
            int first = 1;
            for (size_t j = 0; j < i && first; j++)
                first = s->heaps[j].owner_uid != s->heaps[i].owner_uid;
            if (!first)
                continue;
            uint64_t ch = 0, bk = 0;
            for (size_t j = i; j < s->nheaps; j++)
                if (s->heaps[j].owner_uid == s->heaps[i].owner_uid) {
                    ch += chunk_bytes(&s->heaps[j]);
                    bk += s->heaps[j].bookkeeping_bytes;
                }
            const uint64_t v[] = {ch, bk, ch + bk};
            fprintf(f, "%s{owner_uid=\"%" PRIu32 "\"} %" PRIu64 "\n", fam[k][0], s->heaps[i].owner_uid, v[k]);
        }
    }
}

/* The per-heap gauges and counters (one family per table row). */
static void prom_heaps(prom *m, const heapc_daemon_stats *s)
{
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"heapd_heap_world_size", "gauge", "Ranks of the heap."},
        {"heapd_heap_clients", "gauge", "Ranks attached to the heap on this node."},
        {"heapd_heap_mapped_bytes", "gauge", "Heap bytes mapped per rank."},
        {"heapd_heap_chunk_bytes", "gauge",
         "Chunk memory of the heap on this node, all its ranks here, its spare chunks included (what quota_heap "
         "bounds; while released, only the chunks a release of named blocks kept)."},
        {"heapd_heap_live_bytes", "gauge", "Bytes of blocks some rank still holds."},
        {"heapd_heap_released_bytes", "gauge", "Bytes every rank released, awaiting a collect."},
        {"heapd_heap_free_bytes", "gauge", "Mapped bytes available to allocations."},
        {"heapd_heap_collects_total", "counter", "Collects completed."},
        {"heapd_heap_growths_total", "counter", "Growths (chunks added to every rank)."},
        {"heapd_heap_allocations_total", "counter", "Allocations decided."},
        {"heapd_heap_collect_pending", "gauge", "1 when a collect is owed (forced or the allocator's)."},
        {"heapd_heap_device_free_bytes", "gauge", "Free memory of the heap's device (host backend: MemAvailable)."},
        {"heapd_heap_device_total_bytes", "gauge", "Total memory of the heap's device (host backend: MemTotal)."},
        {"heapd_heap_bookkeeping_bytes", "gauge",
         "heapd's bookkeeping of the heap that quota_uid charges besides its chunks (allocator bitmaps and block "
         "records, decision log)."},
        {"heapd_heap_detached_seconds", "gauge",
         "Seconds the heap has been without a client (detached, awaiting a re-attach; 0: it has clients)."},
        {"heapd_heap_persist_seconds", "gauge",
         "Seconds the heap stays once its clients are all gone (0: it goes with its last client)."},
        {"heapd_heap_state", "gauge",
         "The heap's memory on this node: 0 active, 1 releasing, 2 released, 3 restoring (heapc_release)."},
        {"heapd_heap_resident_bytes", "gauge",
         "Chunk bytes of the heap backed by memory now, all its ranks on this node (while released, only the "
         "chunks a release of named blocks kept)."},
        {"heapd_heap_host_copy_bytes", "gauge",
         "Host memory heapd holds with the heap's content (released in host mode, or kept after restore)."},
        {"heapd_heap_releases_total", "counter", "Releases of the heap's memory."},
        {"heapd_heap_restores_total", "counter", "Restores of the heap's memory."},
        {"heapd_heap_eager_reclaims_total", "counter",
         "Blocks reused with no collect: reclaimed at their last free (reclaim eager)."},
        {"heapd_heap_spare_bytes", "gauge",
         "Spare chunk bytes heapd made ahead of the heap's growth, all its ranks on this node (issue 27; charged to "
         "the quotas like chunks)."},
        {"heapd_heap_trims_total", "counter", "Trims that gave chunks of the heap back (heapc_trim)."},
        {"heapd_heap_trimmed_bytes_total", "counter",
         "Chunk bytes trims gave back, all the heap's ranks on this node."},
    };
    for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
        if (!s->nheaps)
            break;
        prom_family(m, fam[k].name, fam[k].type, fam[k].help);
        for (size_t i = 0; i < s->nheaps; i++) {
            const heapc_heap_stats *h = &s->heaps[i];
            const double v[] = {h->world_size,
                                h->clients,
                                (double)h->mapped,
                                (double)chunk_bytes(h),
                                (double)h->live_bytes,
                                (double)h->released_bytes,
                                (double)h->free_bytes,
                                (double)h->collects,
                                (double)h->growths,
                                (double)h->next_seq,
                                h->collect_pending ? 1 : 0,
                                (double)h->device_free,
                                (double)h->device_total,
                                (double)h->bookkeeping_bytes,
                                (double)h->detached_ms / 1000.0,
                                h->persist_s,
                                h->state,
                                (double)h->resident_bytes,
                                (double)h->host_copy_bytes,
                                (double)h->releases,
                                (double)h->restores,
                                (double)h->eager_reclaims,
                                (double)h->spare_bytes,
                                (double)h->trims,
                                (double)h->trimmed_bytes};
            _Static_assert(sizeof v / sizeof v[0] == sizeof fam / sizeof fam[0], "a value per family");
            prom_heap(m, fam[k].name, h, NULL, v[k]);
        }
    }
}

/* The per-heap histograms and the per-rank gauges (there are heaps). */
static void prom_hists_ranks(prom *m, const heapc_daemon_stats *s)
{
    prom_family(m, "heapd_heap_collect_wait_seconds", "histogram",
                "Seconds from the first rank's collect to the replies (completed collects).");
    for (size_t i = 0; i < s->nheaps; i++)
        prom_hist(m, "heapd_heap_collect_wait_seconds", &s->heaps[i], &s->heaps[i].collect_wait);
    prom_family(m, "heapd_heap_growth_seconds", "histogram",
                "Seconds heapd took to create and hand out a growth's chunks.");
    for (size_t i = 0; i < s->nheaps; i++)
        prom_hist(m, "heapd_heap_growth_seconds", &s->heaps[i], &s->heaps[i].growth);
    static const char *rf[][2] = {
        {"heapd_rank_attached", "1 when a client is attached as this rank."},
        {"heapd_rank_live_bytes", "Bytes this rank holds."},
        {"heapd_rank_released_bytes", "Bytes this rank released, not yet reclaimed."},
        {"heapd_rank_next_allocation",
         "This rank's next allocation number (a rank that trails is the one collectives wait for)."},
    };
    for (size_t k = 0; k < 4; k++) {
        prom_family(m, rf[k][0], "gauge", rf[k][1]);
        for (size_t i = 0; i < s->nheaps; i++)
            for (size_t r = 0; r < s->heaps[i].nranks; r++) {
                const heapc_rank_stats *q = &s->heaps[i].ranks[r];
                char ex[48];
                snprintf(ex, sizeof ex, "rank=\"%" PRIu32 "\"", q->rank);
                const double v[] = {q->attached ? 1 : 0, (double)q->live_bytes, (double)q->released_bytes,
                                    (double)q->next_seq};
                prom_heap(m, rf[k][0], &s->heaps[i], ex, v[k]);
            }
    }
}

/* Every family of `heapctl metrics` (docs/man/heapctl.1 lists them). s NULL:
 * heapd could not be reached: heapd_up 0 only. */
void heapctl_prom_write(FILE *f, const heapc_daemon_stats *s)
{
    prom m = {f, NULL};
    prom_family(&m, "heapd_up", "gauge", "1 when heapctl reached heapd and it answered, else 0.");
    fprintf(f, "heapd_up %d\n", s ? 1 : 0);
    if (!s)
        return;
    prom_daemon(&m, s);
    prom_uids(&m, s);
    prom_heaps(&m, s);
    if (s->nheaps)
        prom_hists_ranks(&m, s);
}

/* ---- the textfile collector's file (issue 33 item 8) ----------------------- */

static FILE *prom_tmp(const char *file, char *tmp, size_t tmplen)
{
    if (snprintf(tmp, tmplen, "%s.XXXXXX", file) >= (int)tmplen) {
        fprintf(stderr, "heapctl: metrics: the path %s is too long\n", file);
        return NULL;
    }
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr,
                "heapctl: metrics: cannot create %s: %s (does the directory exist, and may "
                "this user write it?)\n",
                tmp, strerror(errno));
        return NULL;
    }
    FILE *f = fchmod(fd, 0644) == 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "heapctl: metrics: cannot prepare %s: %s\n", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
    }
    return f;
}

int heapctl_prom_file(const char *file, const heapc_daemon_stats *s)
{
    char tmp[4096];
    FILE *f = prom_tmp(file, tmp, sizeof tmp);
    if (!f)
        return -1;
    heapctl_prom_write(f, s);
    int werr = ferror(f);
    if (fclose(f) != 0 || werr || rename(tmp, file) != 0) {
        fprintf(stderr, "heapctl: metrics: cannot write %s: %s\n", file, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}
