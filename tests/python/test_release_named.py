"""Issue 30, a release of named blocks: heap.release(names=[...]) gives back
only the chunks that lie wholly inside those live blocks, against a real
heapd (host backend) with real rank processes: those chunks unmapped here
(own and peer's), every other tensor of the heap still mapped, readable and
writable while released, heapd's resident bytes down by them only; restore()
brings the named blocks' content back at the same addresses; a name no live
block has is refused on every rank with nothing released."""
import os
import subprocess

import pytest
import torch

import heapd
from conftest import BUILD, ok, run_ranks

MIB = 1 << 20


def _chunk_maps():
    """This process's mappings of heapd's chunk memfds (its own and its peers')."""
    with open("/proc/self/maps") as f:
        return sum("/memfd:heapd-chunk" in l for l in f)


def _chunk_at(addr):
    """Whether this process maps one of heapd's chunks at addr."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return len(parts) > 5 and "heapd-chunk" in parts[5]
    return False


def _metrics(sock, name):
    p = subprocess.run([os.path.join(BUILD, "heapctl"), "--socket", sock, "metrics"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    lab = '{heap="%s"' % name
    return {l.split(lab)[0]: l.rsplit(" ", 1)[1] for l in p.stdout.splitlines() if lab in l}


def _named(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="1M") as h:
        w = h.empty(1000, dtype=torch.int64, name="weights")      # chunk 0
        w.copy_(torch.arange(1000) * (rank + 3))
        mine = h.zeros(16)                                         # chunk 0 too; no peer reads it
        kv = h.empty(2 * MIB, dtype=torch.uint8, name="kv")        # chunks 1 and 2, wholly
        kv.fill_(rank + 7)
        h.collect()
        nxt = (rank + 1) % world
        addrs = [kv.data_ptr(), h.peer(kv, nxt).data_ptr(), w.data_ptr()]
        got = [h.offset(kv), _chunk_maps()]
        h.release(mode="host", names=["kv"])
        st = h.stats()
        prom = _metrics(sock, name)
        got.append((h.state, _chunk_maps(), [_chunk_at(a) for a in addrs], st["resident_bytes"],
                    prom["heapd_heap_chunk_bytes"], prom["heapd_heap_resident_bytes"]))
        # The rest of the heap works while released: its own copy and the peer's.
        assert torch.equal(w, torch.arange(1000) * (rank + 3)), "a kept tensor changed"
        assert torch.equal(h.peer(w, nxt), torch.arange(1000) * (nxt + 3)), "a kept peer copy changed"
        mine.fill_(rank + 1)                                       # and takes writes
        assert int(mine.sum()) == 16 * (rank + 1)
        h.restore()
        got.append((h.state, _chunk_maps(), int(kv.min()), int(kv.max()), int(h.peer(kv, nxt)[-1]),
                    h.stats()["resident_bytes"]))
        try:
            h.release(names=["nope"])
            got.append(None)
        except heapd.HeapdError as e:
            got.append((e.name, "no live block is named" in str(e), h.state))
        more = h.empty(16)                                        # active: allocations go on
        got.append(h.offset(more) < MIB)
        return got


def test_release_named_blocks_only(sock, heapname):
    res = ok(run_ranks(_named, 2, sock, heapname)[0])
    for r, got in enumerate(res):
        assert got[0] == MIB and got[1] == 6, f"rank {r}: layout {got[:2]}"
        state, maps, at, resident, prom_chunk, prom_resident = got[2]
        assert (prom_chunk, prom_resident) == (str(2 * MIB), str(2 * MIB)), got[2]
        assert state == "released", got[2]
        assert maps == 2, f"rank {r}: the named block's chunks still mapped (own, peer's): {maps}"
        assert at == [False, False, True], f"rank {r}: kv, peer's kv, weights mapped: {at}"
        assert resident == 2 * MIB, f"rank {r}: resident {resident}, want chunk 0 of 2 ranks"
        assert got[3] == ("active", 6, r + 7, r + 7, (r + 1) % 2 + 7, 6 * MIB), f"rank {r}: {got[3]}"
        assert got[4] == ("ERR_NOT_FOUND", True, "active"), got[4]
        assert got[5]


def test_release_names_checked(sock, heapname):
    with heapd.Heap(heapname, 0, 1, sock) as h:
        with pytest.raises(TypeError, match="list of block names"):
            h.release(names="kv")
        with pytest.raises(ValueError, match="empty block name"):
            h.release(names=[""])
