/* prog_layout.c - the layout of every C struct that the Python package
 * mirrors with ctypes (python/heapd/_lib.py, python/heapd/torch.py), as JSON
 * on stdout: {"struct": {"size": n, "fields": [[name, offset, size], ...]}}
 * with the fields in declaration order. tests/python/test_layout.py
 * compares it with the ctypes classes, so that a field added, moved or
 * resized on one side only fails a test instead of corrupting memory. */
#include <stddef.h>
#include <stdio.h>

#include "heapc.h"
#include "heapc_nccl.h"

static const char *sep;

static void begin(const char *name, size_t size)
{
    printf("%s\n \"%s\": {\"size\": %zu, \"fields\": [", sep, name, size);
    sep = "";
}

static void field(const char *name, size_t off, size_t size)
{
    printf("%s[\"%s\", %zu, %zu]", sep, name, off, size);
    sep = ", ";
}

static void end(void)
{
    printf("]}");
    sep = ",";
}

#define BEGIN(T) begin(#T, sizeof(T))
#define F(T, f)  field(#f, offsetof(T, f), sizeof(((T *)0)->f))

static void params(void)
{
    BEGIN(heapc_params);
    F(heapc_params, chunk_size);
    F(heapc_params, initial_size);
    F(heapc_params, va_size);
    F(heapc_params, min_block);
    F(heapc_params, policy);
    F(heapc_params, collect_timeout_ms);
    F(heapc_params, device_uuid);
    F(heapc_params, local_size);
    F(heapc_params, job);
    F(heapc_params, persist_s);
    F(heapc_params, reclaim);
    F(heapc_params, grow_ahead);
    F(heapc_params, trim_threshold);
    F(heapc_params, extent_bound);
    F(heapc_params, local_every);
    end();
}

static void status(void)
{
    BEGIN(heapc_status_t);
    F(heapc_status_t, mapped);
    F(heapc_status_t, live);
    F(heapc_status_t, released);
    F(heapc_status_t, free);
    F(heapc_status_t, rank_held);
    F(heapc_status_t, rank_released);
    F(heapc_status_t, collects);
    F(heapc_status_t, growths);
    F(heapc_status_t, allocs);
    F(heapc_status_t, epoch);
    F(heapc_status_t, device_free);
    F(heapc_status_t, device_total);
    F(heapc_status_t, device_sampled_ns);
    F(heapc_status_t, updates);
    F(heapc_status_t, collects_skipped);
    F(heapc_status_t, stream_waiting);
    F(heapc_status_t, device_waits_avoided);
    F(heapc_status_t, state);
    F(heapc_status_t, resident);
    F(heapc_status_t, releases);
    F(heapc_status_t, restores);
    end();
}

static void counters(void)
{
    BEGIN(heapc_counters);
    F(heapc_counters, allocs);
    F(heapc_counters, frees);
    F(heapc_counters, free_batches);
    F(heapc_counters, collects);
    F(heapc_counters, collects_needed);
    F(heapc_counters, chunks_mapped);
    F(heapc_counters, heap_collects);
    F(heapc_counters, last_reclaimed_blocks);
    F(heapc_counters, last_reclaimed_bytes);
    F(heapc_counters, queued_frees);
    F(heapc_counters, stream_waiting);
    F(heapc_counters, stream_markers);
    F(heapc_counters, device_waits_avoided);
    F(heapc_counters, stream_early);
    F(heapc_counters, stream_in_flight);
    F(heapc_counters, stream_reuse_waits);
    F(heapc_counters, local_allocs);
    F(heapc_counters, replica_lost);
    end();
}

static void stats(void)
{
    BEGIN(heapc_rank_stats);
    F(heapc_rank_stats, rank);
    F(heapc_rank_stats, attached);
    F(heapc_rank_stats, live_bytes);
    F(heapc_rank_stats, released_bytes);
    F(heapc_rank_stats, next_seq);
    F(heapc_rank_stats, pid);
    F(heapc_rank_stats, stream_waiting);
    F(heapc_rank_stats, device_waits_avoided);
    end();
    BEGIN(heapc_hist);
    F(heapc_hist, nbounds);
    F(heapc_hist, bounds);
    F(heapc_hist, counts);
    F(heapc_hist, count);
    F(heapc_hist, sum_seconds);
    end();
    BEGIN(heapc_heap_stats);
    F(heapc_heap_stats, name);
    F(heapc_heap_stats, world_size);
    F(heapc_heap_stats, params);
    F(heapc_heap_stats, mapped);
    F(heapc_heap_stats, live_bytes);
    F(heapc_heap_stats, released_bytes);
    F(heapc_heap_stats, free_bytes);
    F(heapc_heap_stats, collects);
    F(heapc_heap_stats, growths);
    F(heapc_heap_stats, clients);
    F(heapc_heap_stats, next_seq);
    F(heapc_heap_stats, epoch);
    F(heapc_heap_stats, pending_collect_seq);
    F(heapc_heap_stats, device_free);
    F(heapc_heap_stats, device_total);
    F(heapc_heap_stats, nranks);
    F(heapc_heap_stats, ranks);
    F(heapc_heap_stats, collects_skipped);
    F(heapc_heap_stats, collect_pending);
    F(heapc_heap_stats, owner_uid);
    F(heapc_heap_stats, collect_wait);
    F(heapc_heap_stats, growth);
    F(heapc_heap_stats, bookkeeping_bytes);
    F(heapc_heap_stats, persist_s);
    F(heapc_heap_stats, detached_ms);
    F(heapc_heap_stats, generation);
    F(heapc_heap_stats, markers);
    F(heapc_heap_stats, state);
    F(heapc_heap_stats, resident_bytes);
    F(heapc_heap_stats, host_copy_bytes);
    F(heapc_heap_stats, releases);
    F(heapc_heap_stats, restores);
    F(heapc_heap_stats, eager_reclaims);
    F(heapc_heap_stats, spare_bytes);
    F(heapc_heap_stats, grow_ahead);
    F(heapc_heap_stats, trims);
    F(heapc_heap_stats, trimmed_bytes);
    end();
    BEGIN(heapc_daemon_stats);
    F(heapc_daemon_stats, version);
    F(heapc_daemon_stats, backend);
    F(heapc_daemon_stats, clients);
    F(heapc_daemon_stats, nheaps);
    F(heapc_daemon_stats, heaps);
    F(heapc_daemon_stats, uptime_ms);
    F(heapc_daemon_stats, store);
    F(heapc_daemon_stats, store_connected);
    F(heapc_daemon_stats, quota_heap);
    F(heapc_daemon_stats, quota_uid);
    end();
    BEGIN(heapc_block);
    F(heapc_block, seq);
    F(heapc_block, offset);
    F(heapc_block, size);
    F(heapc_block, block_size);
    F(heapc_block, name);
    end();
}

static void nccl(void)
{
    BEGIN(hnccl_probe_info);
    F(hnccl_probe_info, op);
    F(hnccl_probe_info, op_name);
    F(hnccl_probe_info, source);
    F(hnccl_probe_info, device_free);
    F(hnccl_probe_info, device_total);
    F(hnccl_probe_info, threshold);
    F(hnccl_probe_info, below);
    F(hnccl_probe_info, cuda_queried);
    F(hnccl_probe_info, have_page);
    F(hnccl_probe_info, page);
    end();
    BEGIN(hnccl_counters);
    F(hnccl_counters, calls);
    F(hnccl_counters, probes);
    F(hnccl_counters, probe_errors);
    F(hnccl_counters, below);
    F(hnccl_counters, callbacks);
    F(hnccl_counters, cuda_queries);
    F(hnccl_counters, cuda_reused);
    F(hnccl_counters, nccl_errors);
    end();
    BEGIN(hnccl_window_stats); /* issue 32 */
    F(hnccl_window_stats, registered_bytes);
    F(hnccl_window_stats, windows);
    F(hnccl_window_stats, extents);
    F(hnccl_window_stats, registrations);
    F(hnccl_window_stats, deregistrations);
    F(hnccl_window_stats, register_errors);
    F(hnccl_window_stats, overlaps_skipped);
    F(hnccl_window_stats, registered);
    end();
}

int main(void)
{
    sep = "{";
    params();
    status();
    counters();
    stats();
    nccl();
    printf("\n}\n");
    return 0;
}
