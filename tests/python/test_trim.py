"""Issue 30, trim: heap.trim() gives back the wholly free chunks of a heap on
every rank, from Python, against a real heapd (host backend) with real rank
processes: exactly those chunks (not one with a live block, not one with a
block every rank freed but not yet collected), the top's and the holes below
a live block, the same bytes on every rank; offsets unchanged, live content
intact (its own and a peer's copy), an allocation after the trim symmetric and
at the offsets trimmed (a hole mapped again at its address); heapd's figures
(stats, heapctl --json, the table, metrics: chunk bytes follow); a rank killed
while the other waits in the trim."""
import os
import signal
import subprocess

import pytest
import torch

import heapd
from conftest import BUILD, ok, run_ranks

MIB = 1 << 20


def _ctl(sock, *args):
    p = subprocess.run([os.path.join(BUILD, "heapctl"), "--socket", sock, *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    if args and args[0] == "--json":
        import json
        return json.loads(p.stdout)
    return p.stdout


def _metrics(sock, name):
    lab = '{heap="%s"' % name
    return {l.split(lab)[0]: l.rsplit(" ", 1)[1] for l in _ctl(sock, "metrics").splitlines() if lab in l}


def _chunk_maps():
    """This process's mappings of heapd's chunk memfds (its own and its peers')."""
    with open("/proc/self/maps") as f:
        return sum("/memfd:heapd-chunk" in l for l in f)


def _trim(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="1M") as h:
        keep = h.empty(1000, dtype=torch.int64)       # in the first chunk
        keep.copy_(torch.arange(1000) * (rank + 3))
        big = [h.empty(MIB, dtype=torch.uint8) for _ in range(3)]   # a chunk each
        for t in big:
            t.fill_(rank + 1)
        h.collect()
        m0 = h.mapped
        assert m0 == 4 * MIB, m0
        offs = sorted(h.offset(t) for t in big)
        assert offs == [MIB, 2 * MIB, 3 * MIB], offs
        top = max(big, key=h.offset)
        # Every chunk but the first and the top one free: the two between
        # become holes; the extent stays.
        for t in [t for t in big if t is not top]:
            h.free(t)
        big = [top]
        got = [h.trim()]
        assert h.mapped == m0
        # Rank 1 freed the top block, rank 0 not yet: still live.
        if rank == 1:
            h.free(top)
        got.append(h.trim())
        assert h.mapped == m0
        if rank == 0:
            h.free(top)
        big = []
        del top
        maps = _chunk_maps()
        got.append(h.trim())                          # the top chunk goes, the holes below with it
        got.append((maps, _chunk_maps()))
        st = h.stats()
        got.append((h.mapped, h.status().mapped, st["mapped"], st["trims"], st["trimmed_bytes"],
                    st["resident_bytes"]))
        nxt = (rank + 1) % world
        assert torch.equal(keep, torch.arange(1000) * (rank + 3)), "live content changed by the trim"
        assert torch.equal(h.peer(keep, nxt), torch.arange(1000) * (nxt + 3)), "a peer's copy changed"
        if rank == 0:                                 # heapctl while the heap is trimmed
            prom = _metrics(sock, name)
            js = _ctl(sock, "--json", "stats", name)["heaps"][0]
            text = _ctl(sock, "stats", name)
            got.append(((js["trims"], js["trimmed_bytes"], js["mapped"]),
                        (prom["heapd_heap_trims_total"], prom["heapd_heap_trimmed_bytes_total"],
                         prom["heapd_heap_chunk_bytes"], prom["heapd_heap_mapped_bytes"]),
                        "TRIMMED" in text and "TRIMS" in text))
        h.collect()                                   # rank 0 looked before anything grows
        # Growth comes back at the offsets trimmed, the same on every rank.
        again = h.empty(2 * MIB, dtype=torch.uint8)
        again.fill_(9 + rank)
        h.collect()
        got.append((h.offset(again), h.mapped, int(h.peer(again, nxt)[-1])))
        return got


def test_trim_gives_back_the_wholly_free_top_chunks(sock, heapname):
    res = ok(run_ranks(_trim, 2, sock, heapname)[0])
    for r, got in enumerate(res):
        assert got[0] == 2 * MIB, f"rank {r}: the 2 free chunks below the live top are holes: {got[0]}"
        assert got[1] == 0, f"rank {r}: a block one rank still holds is live"
        assert got[2] == MIB, f"rank {r}: trimmed {got[2]}, want the top chunk"
        assert got[3] == (4, 2), f"rank {r}: chunk mappings before and after: {got[3]}"
        assert got[4] == (MIB, MIB, MIB, 2, 3 * MIB * 2, MIB * 2), got[4]
        off, mapped, peer_last = got[-1]
        assert off in (MIB, 2 * MIB) and mapped == 3 * MIB, got[-1]
        assert peer_last == 9 + (r + 1) % 2
    assert res[0][-1][0] == res[1][-1][0], "asymmetric allocation after the trim"
    (js, prom, table) = res[0][5]
    assert js == (2, 6 * MIB, MIB)
    assert prom == ("2", str(6 * MIB), str(2 * MIB), str(MIB)), prom
    assert table


def _mapping_at(addr):
    """The path of this process's mapping that holds addr ('' if anonymous)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return parts[5] if len(parts) > 5 else ""
    return None


def _hole(rank, world, sock, name):
    """A wholly free chunk between two live blocks: trimmed on every rank
    (unmapped here, own and peer's), the blocks around it intact; an
    allocation that needs room maps it again at its address."""
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="1M") as h:
        big = [h.empty(MIB, dtype=torch.uint8) for _ in range(3)]
        big.sort(key=h.offset)
        assert [h.offset(t) for t in big] == [0, MIB, 2 * MIB]
        for i, t in enumerate(big):
            t.fill_(10 * rank + i)
        h.collect()
        nxt = (rank + 1) % world
        bases = [big[0].data_ptr(), h.peer(big[0], nxt).data_ptr()]
        h.free(big[1])
        del big[1], t
        maps = _chunk_maps()
        got = [h.trim(), h.mapped, (maps, _chunk_maps()),
               ["heapd-chunk" in (_mapping_at(b + MIB) or "") for b in bases],
               ["heapd-chunk" in (_mapping_at(b + 2 * MIB) or "") for b in bases]]
        st = h.stats()
        got.append((st["mapped"], st["resident_bytes"], st["trims"]))
        assert all(int(t.min()) == int(t.max()) == 10 * rank + 2 * i for i, t in enumerate(big)), \
            "live content changed by the trim"
        assert int(h.peer(big[1], nxt)[0]) == 10 * nxt + 2, "a peer's copy changed"
        h.release(mode="host")                        # a hole stays one through release and restore
        h.restore()
        got.append((_chunk_maps(), int(big[0][-1]), int(h.peer(big[1], nxt)[-1])))
        again = h.empty(MIB, dtype=torch.uint8)       # no room: the hole comes back
        again.fill_(7 + rank)
        h.collect()
        got.append((h.offset(again), h.mapped, _chunk_maps(),
                    ["heapd-chunk" in (_mapping_at(b + MIB) or "") for b in bases],
                    int(h.peer(again, nxt)[-1]), int(big[1][0])))
        return got


def test_trim_hole_between_live_blocks(sock, heapname):
    res = ok(run_ranks(_hole, 2, sock, heapname)[0])
    for r, got in enumerate(res):
        assert got[0] == MIB, f"rank {r}: trimmed {got[0]}, want the chunk between the live blocks"
        assert got[1] == 3 * MIB, f"rank {r}: the extent stays: {got[1]}"
        assert got[2] == (6, 4), f"rank {r}: chunk mappings before and after: {got[2]}"
        assert got[3] == [False, False], f"rank {r}: the hole is still mapped (own, peer's)"
        assert got[4] == [True, True], f"rank {r}: a live chunk got unmapped"
        assert got[5] == (3 * MIB, 2 * 2 * MIB, 1), got[5]
        assert got[6] == (4, 10 * r, 10 * ((r + 1) % 2) + 2), f"rank {r}: after release and restore: {got[6]}"
        assert got[7] == (MIB, 3 * MIB, 6, [True, True], 7 + (r + 1) % 2, 10 * r + 2), got[7]
    assert res[0][7][0] == res[1][7][0], "asymmetric allocation after the trim"


def _pending(rank, world, sock, name):
    """reclaim collect: blocks every rank freed are pending until a collect,
    and a pending block is not free."""
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="1M",
                    reclaim="collect") as h:
        assert h.reclaim == "collect"
        keep = h.zeros(16)
        big = [h.empty(MIB, dtype=torch.uint8) for _ in range(2)]
        h.collect()
        for t in big:
            h.free(t)
        del big, t
        before = h.trim()
        h.collect()
        after = h.trim()
        return before, after, h.mapped, int(keep.sum())


def test_pending_blocks_are_not_free(sock, heapname):
    res = ok(run_ranks(_pending, 2, sock, heapname)[0])
    assert res == [(0, 2 * MIB, MIB, 0)] * 2, res


def _stream_held(rank, world, sock, name):
    """A block freed on a stream whose work has not completed is still held
    (host backend: a heapc_hstream whose item is begun, not complete): its
    chunk stays; once the item completes, the next trim takes it. Nothing
    waits for the stream."""
    import ctypes
    from heapd import _lib as L
    create, begin, complete, destroy = (L.lib.heapc_hstream_create, L.lib.heapc_hstream_begin,
                                        L.lib.heapc_hstream_complete, L.lib.heapc_hstream_destroy)
    create.restype, create.argtypes = ctypes.c_void_p, []
    begin.restype, begin.argtypes = ctypes.c_uint64, [ctypes.c_void_p]
    complete.restype, complete.argtypes = None, [ctypes.c_void_p, ctypes.c_uint64]
    destroy.restype, destroy.argtypes = None, [ctypes.c_void_p]
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="1M") as h:
        h.set_stream_reuse(False)   # issue 18's rule (with reuse on, trim waits: test_reclaim)
        keep = h.zeros(16)
        t = h.empty(MIB, dtype=torch.uint8)
        h.collect()
        s = create()
        ticket = begin(s)                             # work on the stream still "runs"
        h.free(t, stream=s)
        del t
        held = h.trim()
        complete(s, ticket)
        freed = h.trim()
        destroy(s)
        return held, freed, h.mapped, int(keep.sum())


def test_stream_pending_free_holds_its_chunk(sock, heapname):
    res = ok(run_ranks(_stream_held, 2, sock, heapname)[0])
    assert res == [(0, MIB, MIB, 0)] * 2, res


def _killed_mid(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", persist=30) as h:
        x = h.empty(MIB, dtype=torch.uint8)
        h.collect()
        h.free(x)
        del x
        h.collect()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            h.trim()
            return ("returned",)
        except heapd.PeerGoneError as e:
            return ("gone", str(e), h.mapped)


def test_rank_killed_mid_trim(sock, heapname):
    from test_resume import _drop
    try:
        res = run_ranks(_killed_mid, 2, sock, heapname, expect_dead=(1,))[0]
        kind, val = res[0]
        assert kind == "ok", val
        assert val[0] == "gone", val
        assert "rank 1" in val[1] and "trim" in val[1], val[1]
        st = heapd.stats(heapname, sock)
        assert st["trims"] == 0 and st["mapped"] == val[2], st
    finally:
        _drop(heapname, sock)


def _refused(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock) as h:
        h.release()
        with pytest.raises(heapd.StateError, match="released"):
            h.trim()
        h.restore()
        return h.trim() >= 0


def test_trim_refused_while_released(sock, heapname):
    assert ok(run_ranks(_refused, 2, sock, heapname)[0]) == [True, True]
