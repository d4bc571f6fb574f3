/* config.h - heapd.conf: defaults, parsing, validation.
 *
 * The file is `key = value` lines (inih syntax; `#` or `;` starts a comment
 * line). Every key, its meaning and its default are listed in heapd.conf(5)
 * and in the shipped heapd.conf. Unknown keys and bad values are errors of
 * the form "FILE:LINE: what is wrong"; nothing is applied from a file with an
 * error. Sizes take K, M, G, T suffixes (powers of 1024). */
#ifndef HEAPD_CONFIG_H
#define HEAPD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "alloc.h"

#define HD_DEFAULT_CONFIG "/etc/heapd/heapd.conf"
#define HD_DEFAULT_SOCKET "/run/heapd/heapd.sock"
/* Issue 27: the most spare chunks per rank a heap keeps (grow_ahead). */
#define HD_CONFIG_GROW_AHEAD_MAX 16u
/* Issue 27: the longest lookahead of cross-node eager reclaim. */
#define HD_CONFIG_LOOKAHEAD_MAX 65536u

typedef struct hd_config {
    char socket_path[108];
    unsigned socket_mode; /* permissions of the socket file */
    char backend[16];     /* auto | cuda | host */
    int log_level;        /* HD_LOG_* */
    int log_format;       /* HD_LOG_FMT_*: text or json (off the journal) */
    /* Defaults for heaps whose Attach leaves a parameter at 0. */
    uint64_t chunk_size;
    uint64_t initial_size; /* 0: one chunk */
    uint64_t va_size;
    uint64_t min_block;
    ha_policy policy;
    ha_reclaim reclaim; /* issue 27: eager (a heap on one node; seed and multi-node heaps: collect) */
    uint32_t collect_timeout_ms;
    uint32_t grow_ahead; /* issue 27: spare chunks per rank (0: none), <= HD_CONFIG_GROW_AHEAD_MAX */
    /* Issue 27: a heap across nodes under eager reclaim agrees its reclaims
     * through the store every reclaim_lookahead allocations, each taking
     * effect that many allocations later (0: such heaps use collect). */
    uint32_t reclaim_lookahead;
    /* Issue 30: the automatic trim's threshold for heaps on one node whose
     * Attach leaves trim_threshold at 0 (bytes; 0: off). */
    uint64_t trim_threshold;
    /* Issue 29: seconds a formed heap with no client stays (detached) when
     * its Attach leaves persist_s at 0 (0: released with its last client),
     * and the most an Attach may ask for. Invariant: persist <= max_persist. */
    uint32_t persist;
    uint32_t max_persist;
    /* Limits. */
    uint32_t max_clients;
    /* Transport limits (issue 15): per uid (root is exempt), per connection. */
    uint32_t admin_reserve;          /* connections past max_clients for root and admin_group */
    uint32_t max_clients_per_uid;    /* connections of one uid at once */
    uint32_t max_fds_per_uid;        /* received fds one uid's connections hold (partial frames, closing) */
    uint64_t max_queue_per_uid;      /* unsent reply bytes of one uid's connections */
    uint32_t hello_timeout_ms;       /* a connection without Hello by then is closed */
    uint32_t max_frame_before_hello; /* payload bytes of a frame before Hello */
    uint32_t max_fds_per_conn;       /* received fds one connection holds for partial frames */
    uint64_t max_queue_per_conn;     /* unsent reply bytes of one connection */
    /* Reply fds (issue 33): queued (open in heapd) pause reading; in flight
     * (sent, not yet received) hold sending. */
    uint32_t max_queued_fds_per_conn, max_queued_fds_per_uid;
    uint32_t max_inflight_fds_per_conn, max_inflight_fds_per_uid;
    uint32_t max_chunk_fds_per_uid; /* chunks of one uid's heaps here (0: none) */
    /* Per heap and rank: va_size / chunk_size (chunks: fds, records) and
     * va_size / min_block (the allocator's bitmaps: ~4 bits each). */
    uint32_t max_chunks;
    uint32_t max_blocks;
    /* Access: members of admin_group (and root) may attach to any heap and
     * force collects on any heap; others only on heaps their uid created. */
    char admin_group[64]; /* "" : none */
    long admin_gid;       /* resolved at load, -1: none */
    /* Quotas in bytes of chunk memory (every rank's chunks); 0: none.
     * quota_uid also counts heapd's bookkeeping of the uid's heaps (bitmaps,
     * block records, decision logs: registry.c's uid_use). */
    uint64_t quota_heap;
    uint64_t quota_uid;
    /* Several nodes: the store that reconciles collects ("" : single node)
     * and this node's name in it (default: the host name). */
    char store[256];
    char store_credentials[256]; /* the store's AUTH file ("" : none; issue 33 item 1) */
    char store_key[256];         /* the cluster key that signs collect results ("" : from the credentials) */
    char node[65];
    uint32_t meminfo_interval_ms; /* device memory sampling period */
    /* Request rings (issue 16, daemon/ring.h): offered at RingSetup when
     * ring is 1; after a ring's last request heapd busy-polls it for
     * ring_spin_us, then polls it between yields of its core for
     * ring_backoff_us, then sleeps on its doorbell. -1: auto (by the number
     * of cores: no polling on 2 or fewer). */
    int ring;
    long ring_spin_us;
    long ring_backoff_us;
} hd_config;

void hd_config_defaults(hd_config *c);

/* Loads FILE over the defaults. On error returns -1 and writes
 * "FILE:LINE: message" (or "FILE: message") into err; *c is unchanged. */
int hd_config_load(const char *path, hd_config *c, char *err, size_t errlen);

/* The same for SIGHUP, stricter: PATH must be a regular file that sets at
 * least one key (an empty file, a directory, a FIFO or an unreadable path is
 * an error, so that the running configuration stays). */
int hd_config_reload(const char *path, hd_config *c, char *err, size_t errlen);

#endif
