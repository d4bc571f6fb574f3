"""Issue 27: reclaim "eager", heapd's default for a heap on one node - a block
every rank freed is reused with no collect and no barrier - against a real
heapd (host backend) and real rank processes; and "collect" when asked."""
import random

import pytest
import torch

import heapd
from conftest import ok, run_ranks, wait_for

SIZES = [4 << 10, 64 << 10, 8 << 10, 256 << 10, 1 << 10, 16 << 10] * 6


_wait = wait_for


def _rounds(rank, world, sock, name):
    """Three rounds of the same sizes, freed in a different order on each
    rank, never a collect: each round reuses the last one's blocks once every
    rank's frees reached heapd (the heap's live bytes say so)."""
    with heapd.Heap(name, rank, world, sock, chunk_size="4M", initial_size="4M") as h:
        rounds = []
        for rnd in range(3):
            ts = [h.empty(s, dtype=torch.uint8) for s in SIZES]
            for i, t in enumerate(ts):
                t.fill_((rank * 31 + rnd * 7 + i) & 0xff)
            rounds.append([h.offset(t) for t in ts])
            order = list(range(len(ts)))
            random.Random(rank * 7919 + rnd).shuffle(order)
            for k, i in enumerate(order):           # each block intact until its free
                assert int(ts[i][0]) == (rank * 31 + rnd * 7 + i) & 0xff
                assert int(ts[i][-1]) == (rank * 31 + rnd * 7 + i) & 0xff
                h.free(ts[i])
                if k % 5 == rank % 5:
                    h.flush()                        # different batching per rank
            del ts
            h.flush()
            # every rank's frees are in once live is 0, or once another rank,
            # which saw that, decided the next round's first allocation
            n = (rnd + 1) * len(SIZES)
            _wait(lambda: h.status().live == 0 or h.status().allocs > n, "every rank's frees")
        st = h.stats()
        return rounds, h.reclaim, st["collects"], st["growths"], st["eager_reclaims"], st["params"]["reclaim"]


def test_eager_reuse_without_collect(sock, heapname):
    res = ok(run_ranks(_rounds, 3, sock, heapname)[0])
    for r in range(3):
        rounds, reclaim, collects, growths, eager, preclaim = res[r]
        assert rounds == res[0][0], f"rank {r}: offsets differ from rank 0's"
        assert (reclaim, preclaim) == ("eager", "eager")
        assert collects == 0, "no collect, no barrier"
        # 3 rounds of 1.3 MiB on a 4 MiB heap: only reuse keeps it from growing
        assert growths == 0
        assert eager >= 2 * len(SIZES)


def _held_not_reused(rank, world, sock, name):
    """A block rank 1 still holds is never handed out, however long rank 0
    waits; once rank 1 frees it, the next allocation gets it."""
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="1M") as h:
        x = h.empty(512 << 10, dtype=torch.uint8)
        off = h.offset(x)
        if rank == 0:
            h.free(x)
            h.flush()
            # its own release is in (rank_held would count rank 1's next
            # allocation, which rank 0 has not asked for yet)
            _wait(lambda: h.status().rank_released == 512 << 10, "rank 0's free")
        y = h.empty(256 << 10, dtype=torch.uint8)  # every rank: allocation 1
        y_off = h.offset(y)
        h.collect()                                 # both ranks past allocation 1 (a barrier)
        if rank == 1:
            assert int(x[0]) == int(x[0])           # still ours
            h.free(x)
            h.flush()
        _wait(lambda: h.status().live == 256 << 10 or h.status().allocs > 2, "rank 1's free")
        z = h.empty(512 << 10, dtype=torch.uint8)  # allocation 2
        return off, y_off, h.offset(z)


def test_held_block_not_reused(sock, heapname):
    res = ok(run_ranks(_held_not_reused, 2, sock, heapname)[0])
    assert res[0] == res[1]
    off, y_off, z_off = res[0]
    assert not (off <= y_off < off + (512 << 10)), "a block rank 1 held was handed out"
    assert z_off == off, "the block is reused once both ranks freed it"


def _collect_mode(rank, world, sock, name):
    # small blocks on a large heap: no policy trigger asks for a collect
    with heapd.Heap(name, rank, world, sock, chunk_size="4M", initial_size="16M", reclaim="collect") as h:
        x = h.empty(64 << 10, dtype=torch.uint8)
        off = h.offset(x)
        h.free(x)
        h.flush()
        _wait(lambda: h.status().live == 0 or h.status().allocs > 1, "both frees")
        y = h.empty(64 << 10, dtype=torch.uint8)   # pending, not reused: it fits beside x
        h.collect()
        z = h.empty(64 << 10, dtype=torch.uint8)   # after the collect: reused
        return h.reclaim, off, h.offset(y), h.offset(z), h.stats()["eager_reclaims"]


def test_collect_mode_waits_for_collect(sock, heapname):
    res = ok(run_ranks(_collect_mode, 2, sock, heapname)[0])
    assert res[0] == res[1]
    reclaim, off, y, z, eager = res[0]
    assert reclaim == "collect" and eager == 0
    assert y != off
    assert z == off


def test_reclaim_checked(sock, heapname):
    with pytest.raises(ValueError, match="reclaim"):
        heapd.Heap(heapname, 0, 1, sock, reclaim="sometimes")
    with heapd.Heap(heapname, 0, 1, sock, policy="seed") as h:
        assert h.reclaim == "collect", "the seed policy reclaims at collects"


def test_stream_reuse_waits_for_the_stream(sock, heapname):
    """Issue 27, stream-ordered reuse (libheapc's default): a block freed on
    a stream (a heapc_hstream here) goes to heapd at once and is reused by the
    next allocation while the stream's work still runs; that allocation has no
    stream (Heap.empty), so it waits until the work completed - a thread
    completes it once it sees the wait, so nothing here waits for a time."""
    import ctypes
    import threading
    from heapd import _lib as L
    L.lib.heapc_hstream_create.restype = ctypes.c_void_p
    L.lib.heapc_hstream_begin.restype = ctypes.c_uint64
    L.lib.heapc_hstream_begin.argtypes = [ctypes.c_void_p]
    L.lib.heapc_hstream_complete.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    L.lib.heapc_hstream_waiters.restype = ctypes.c_uint64
    L.lib.heapc_hstream_waiters.argtypes = [ctypes.c_void_p]
    L.lib.heapc_hstream_pending.restype = ctypes.c_uint64
    L.lib.heapc_hstream_pending.argtypes = [ctypes.c_void_p]
    hs = L.lib.heapc_hstream_create()
    with heapd.Heap(heapname, 0, 1, sock, chunk_size="1M", initial_size="1M") as h:
        x = h.empty(1 << 20, dtype=torch.uint8)      # fills the heap: a reuse must be x
        off = h.offset(x)
        ticket = L.lib.heapc_hstream_begin(hs)     # work on x is in flight
        h.free(x, stream=hs)
        del x
        st = h.stats()["client"]
        assert st["stream_early"] == 1 and st["stream_in_flight"] == 1
        assert st["stream_waiting"] == 0, "released at the free, not held back"

        def complete():
            _wait(lambda: L.lib.heapc_hstream_waiters(hs) > 0, "the allocation's wait")
            L.lib.heapc_hstream_complete(hs, ticket)
        t = threading.Thread(target=complete)
        t.start()
        y = h.empty(1 << 20, dtype=torch.uint8)      # reuses x: waits for hs first
        assert L.lib.heapc_hstream_pending(hs) == 0, "the allocation returned before the stream's work completed"
        t.join()
        st = h.stats()
        assert h.offset(y) == off
        assert st["client"]["stream_reuse_waits"] == 1
        assert st["growths"] == 0 and st["collects"] == 0
    L.lib.heapc_hstream_destroy.argtypes = [ctypes.c_void_p]
    L.lib.heapc_hstream_destroy(hs)


def test_trim_waits_for_early_released_blocks(sock, heapname):
    """With stream-ordered reuse a block freed on a stream is heapd's at
    once, so trim (which unmaps free chunks) first waits for that stream's
    work: a thread completes it once it sees the wait."""
    import ctypes
    import threading
    from heapd import _lib as L
    for f, res, args in (("heapc_hstream_create", ctypes.c_void_p, []),
                         ("heapc_hstream_begin", ctypes.c_uint64, [ctypes.c_void_p]),
                         ("heapc_hstream_complete", None, [ctypes.c_void_p, ctypes.c_uint64]),
                         ("heapc_hstream_waiters", ctypes.c_uint64, [ctypes.c_void_p]),
                         ("heapc_hstream_pending", ctypes.c_uint64, [ctypes.c_void_p]),
                         ("heapc_hstream_destroy", None, [ctypes.c_void_p])):
        getattr(L.lib, f).restype, getattr(L.lib, f).argtypes = res, args
    hs = L.lib.heapc_hstream_create()
    with heapd.Heap(heapname, 0, 1, sock, chunk_size="1M", initial_size="1M") as h:
        keep = h.zeros(16)
        t = h.empty(1 << 20, dtype=torch.uint8)       # grows into a second chunk
        ticket = L.lib.heapc_hstream_begin(hs)
        h.free(t, stream=hs)
        del t

        def complete():
            _wait(lambda: L.lib.heapc_hstream_waiters(hs) > 0, "trim's wait")
            L.lib.heapc_hstream_complete(hs, ticket)
        th = threading.Thread(target=complete)
        th.start()
        trimmed = h.trim()
        assert L.lib.heapc_hstream_pending(hs) == 0, "trim returned before the stream's work completed"
        th.join()
        assert trimmed == 1 << 20 and h.mapped == 1 << 20
        assert float(keep.sum()) == 0.0
    L.lib.heapc_hstream_destroy(hs)


def _killed_with_releases(rank, world, sock, name):
    """Rank 1 frees x and is killed before its release leaves the queue
    (nothing flushed it); rank 0 frees x too. x stays rank 1's, so eager
    reclaim never hands it out: the next allocations go beside it, and
    heapd's figures say rank 1 still holds it."""
    import os
    import signal
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="4M", persist=30) as h:
        x = h.empty(64 << 10, dtype=torch.uint8)
        off = h.offset(x)
        h.collect()                                   # both hold x
        h.free(x)
        del x
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)      # its release dies in its queue
        h.flush()
        _wait(lambda: not heapd.stats(name, sock)["ranks"][1]["attached"], "rank 1 gone")
        y = h.empty(64 << 10, dtype=torch.uint8)      # allocation 1: decided by rank 0 alone
        st = heapd.stats(name, sock)
        return off, h.offset(y), st["ranks"][1]["live_bytes"], st["eager_reclaims"]


def test_rank_killed_with_releases_in_flight(sock, heapname):
    from test_resume import _drop
    try:
        res = run_ranks(_killed_with_releases, 2, sock, heapname, expect_dead=(1,))[0]
        kind, val = res[0]
        assert kind == "ok", val
        off, y, held1, eager = val
        assert y != off, "a block the killed rank never released was handed out"
        assert held1 >= 64 << 10, "heapd lost track of what rank 1 holds"
        assert eager == 0
    finally:
        _drop(heapname, sock)
