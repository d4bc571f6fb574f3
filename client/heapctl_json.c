/* heapctl_json.c - heapctl's --json output: the statistics as one JSON
 * object (field names as libheapc's structs; python/heapd's stats use the
 * same, tests/python/test_abi.py checks). */
#include "heapctl.h"
#include "utf8.h"

#include <inttypes.h>
#include <stdio.h>

void heapctl_json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        int n = hu_len(p);
        if (n == 0) { /* not UTF-8: JSON must be */
            fputs("\\ufffd", stdout);
            continue;
        }
        if (n == 3 && p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) {
            printf("\\u%04x", 0x2000 | (p[2] - 0x80)); /* U+2028/9: line breaks to some readers */
            p += 2;
            continue;
        }
        if (n > 1) {
            fwrite(p, 1, (size_t)n, stdout);
            p += n - 1;
            continue;
        }
        switch (*p) {
        case '"':
            fputs("\\\"", stdout);
            break;
        case '\\':
            fputs("\\\\", stdout);
            break;
        case '\b':
            fputs("\\b", stdout);
            break;
        case '\f':
            fputs("\\f", stdout);
            break;
        case '\n':
            fputs("\\n", stdout);
            break;
        case '\r':
            fputs("\\r", stdout);
            break;
        case '\t':
            fputs("\\t", stdout);
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                printf("\\u%04x", *p);
            else
                putchar(*p);
        }
    }
    putchar('"');
}

const char *heapctl_state_name(uint32_t state)
{
    static const char *names[] = {"active", "releasing", "released", "restoring"};
    return state < sizeof names / sizeof names[0] ? names[state] : "unknown";
}

static void json_params(const heapc_params *p)
{
    printf("{\"chunk_size\": %" PRIu64 ", \"initial_size\": %" PRIu64 ", \"va_size\": %" PRIu64
           ", \"min_block\": %" PRIu64 ", \"policy\": ",
           p->chunk_size, p->initial_size, p->va_size, p->min_block);
    heapctl_json_str(heapc_policy_name(p->policy));
    printf(", \"collect_timeout_ms\": %" PRIu32 ", \"reclaim\": \"%s\", \"grow_ahead\": %" PRId32
           ", \"trim_threshold\": %" PRId64 ", \"extent_bound\": %s, \"local_every\": %" PRId32 "}",
           p->collect_timeout_ms, p->reclaim == HEAPC_RECLAIM_EAGER ? "eager" : "collect", p->grow_ahead,
           p->trim_threshold, p->extent_bound ? "true" : "false", p->local_every);
}

static void json_heap(const heapc_heap_stats *h)
{
    fputs("{\"name\": ", stdout);
    heapctl_json_str(h->name);
    printf(", \"world_size\": %" PRIu32 ", \"params\": ", h->world_size);
    json_params(&h->params);
    printf(", \"mapped\": %" PRIu64 ", \"live_bytes\": %" PRIu64 ", \"released_bytes\": %" PRIu64
           ", \"free_bytes\": %" PRIu64 ", \"collects\": %" PRIu64 ", \"growths\": %" PRIu64 ", \"clients\": %" PRIu32
           ", \"next_seq\": %" PRIu64 ", \"epoch\": %" PRIu64
           ", \"collect_pending\": %s, \"pending_collect_seq\": %" PRIu64 ", \"device_free\": %" PRIu64
           ", \"device_total\": %" PRIu64 ", \"collects_skipped\": %" PRIu64 ", \"bookkeeping_bytes\": %" PRIu64
           ", \"persist_s\": %" PRIu32 ", \"detached_ms\": %" PRIu64 ", \"generation\": %" PRIu64
           ", \"markers\": %" PRIu32 ", \"owner_uid\": %" PRIu32,
           h->mapped, h->live_bytes, h->released_bytes, h->free_bytes, h->collects, h->growths, h->clients, h->next_seq,
           h->epoch, h->collect_pending ? "true" : "false", h->pending_collect_seq, h->device_free, h->device_total,
           h->collects_skipped, h->bookkeeping_bytes, h->persist_s, h->detached_ms, h->generation, h->markers,
           h->owner_uid);
    /* issue 30: the heap's memory on this node */
    printf(", \"state\": \"%s\", \"resident_bytes\": %" PRIu64 ", \"host_copy_bytes\": %" PRIu64
           ", \"releases\": %" PRIu64 ", \"restores\": %" PRIu64 ", \"eager_reclaims\": %" PRIu64
           ", \"spare_bytes\": %" PRIu64 ", \"grow_ahead\": %" PRIu32 ", \"trims\": %" PRIu64
           ", \"trimmed_bytes\": %" PRIu64 ", \"ranks\": [",
           heapctl_state_name(h->state), h->resident_bytes, h->host_copy_bytes, h->releases, h->restores,
           h->eager_reclaims, h->spare_bytes, h->grow_ahead, h->trims, h->trimmed_bytes);
    for (size_t r = 0; r < h->nranks; r++) {
        const heapc_rank_stats *k = &h->ranks[r];
        printf("%s{\"rank\": %" PRIu32 ", \"attached\": %s, \"pid\": %" PRIu32 ", \"live_bytes\": %" PRIu64
               ", \"released_bytes\": %" PRIu64 ", \"next_seq\": %" PRIu64 ", \"stream_waiting\": %" PRIu64
               ", \"device_waits_avoided\": %" PRIu64 "}",
               r ? ", " : "", k->rank, k->attached ? "true" : "false", k->pid, k->live_bytes, k->released_bytes,
               k->next_seq, k->stream_waiting, k->device_waits_avoided);
    }
    fputs("]}", stdout);
}

void heapctl_json_stats(const heapc_daemon_stats *s, int full)
{
    fputs("{\"version\": ", stdout);
    heapctl_json_str(s->version);
    fputs(", \"backend\": ", stdout);
    heapctl_json_str(s->backend);
    printf(", \"clients\": %" PRIu32 ", \"heaps\": [", s->clients);
    for (size_t i = 0; i < s->nheaps; i++) {
        const heapc_heap_stats *h = &s->heaps[i];
        fputs(i ? ", " : "", stdout);
        if (full) {
            json_heap(h);
        } else {
            fputs("{\"name\": ", stdout);
            heapctl_json_str(h->name);
            printf(", \"world_size\": %" PRIu32 ", \"clients\": %" PRIu32 ", \"mapped\": %" PRIu64
                   ", \"owner_uid\": %" PRIu32 ", \"persist_s\": %" PRIu32 ", \"detached_ms\": %" PRIu64
                   ", \"policy\": ",
                   h->world_size, h->clients, h->mapped, h->owner_uid, h->persist_s, h->detached_ms);
            heapctl_json_str(heapc_policy_name(h->params.policy));
            printf(", \"state\": \"%s\"}", heapctl_state_name(h->state));
        }
    }
    fputs("]}\n", stdout);
}
