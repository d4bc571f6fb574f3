"""Issue 30, automatic trim: a heap with trim_threshold gives its wholly free
chunks back by itself, against a real heapd (host backend) with real rank
processes: once blocks at the top are freed by every rank, the next
allocation trims first on every rank (no one calls trim()), the chunks are
unmapped here (own and peer's), offsets stay symmetric, live content stays,
heapd counts the trim (stats, heapctl --json); with threshold 0 nothing is
trimmed."""
import json
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


def _auto(rank, world, sock, name, threshold):
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="1M",
                    trim_threshold=threshold) as h:
        keep = h.empty(1000, dtype=torch.int64)       # in the first chunk
        keep.copy_(torch.arange(1000) * (rank + 3))
        big = [h.empty(MIB, dtype=torch.uint8) for _ in range(3)]   # a chunk each
        h.collect()
        got = [h.trim_threshold, h.stats()["params"]["trim_threshold"], h.mapped, _chunk_maps(),
               sorted(h.offset(t) for t in big)]
        for t in big:
            h.free(t)
        del big, t
        h.collect()                                   # every rank's frees are in: 3 free chunks on top
        small = h.empty(16)                           # this allocation trims first (threshold 2M)
        small.fill_(rank)
        st = h.stats()
        got.append((h.mapped, _chunk_maps(), st["trims"], st["trimmed_bytes"], st["mapped"],
                    st["resident_bytes"], h.offset(small)))
        nxt = (rank + 1) % world
        assert torch.equal(keep, torch.arange(1000) * (rank + 3)), "live content changed by the trim"
        assert torch.equal(h.peer(keep, nxt), torch.arange(1000) * (nxt + 3)), "a peer's copy changed"
        if rank == 0:
            p = subprocess.run([os.path.join(BUILD, "heapctl"), "--socket", sock, "--json", "stats", name],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stdout + p.stderr
            js = json.loads(p.stdout)["heaps"][0]
            t = subprocess.run([os.path.join(BUILD, "heapctl"), "--socket", sock, "stats", name],
                               capture_output=True, text=True, timeout=60).stdout
            head, row = t.split("\n\n")[2].splitlines()[:2]      # the parameter table: the last column
            got.append((js["trims"], js["params"]["trim_threshold"],
                        head.rstrip().endswith("TRIM_THRESHOLD") and row.rstrip().rsplit("  ", 1)[-1].strip()))
        h.collect()                                   # rank 0 looked before anything grows
        again = h.empty(MIB, dtype=torch.uint8)       # grows back at the offsets trimmed, no trim
        again.fill_(5 + rank)
        h.collect()
        got.append((h.offset(again), h.mapped, h.stats()["trims"], int(h.peer(again, nxt)[-1])))
        return got


def test_threshold_trims_without_a_call(sock, heapname):
    res = ok(run_ranks(_auto, 2, sock, heapname, "2M")[0])
    for r, got in enumerate(res):
        assert got[:5] == [2 * MIB, 2 * MIB, 4 * MIB, 8, [MIB, 2 * MIB, 3 * MIB]], f"rank {r}: {got[:5]}"
        mapped, maps, trims, trimmed, st_mapped, resident, off = got[5]
        assert (mapped, st_mapped) == (MIB, MIB), f"rank {r}: the top's 3 chunks not given back: {got[5]}"
        assert maps == 2, f"rank {r}: trimmed chunks still mapped here (own, peer's): {maps}"
        assert (trims, trimmed, resident) == (1, 3 * MIB * 2, MIB * 2), got[5]
        off_again, mapped_again, trims_again, peer_last = got[-1]
        assert (mapped_again, trims_again) == (2 * MIB, 1), got[-1]
        assert off_again == MIB and peer_last == 5 + (r + 1) % 2, got[-1]
    assert res[0][5][-1] == res[1][5][-1], "asymmetric allocation at the automatic trim"
    assert res[0][6] == (1, 2 * MIB, "2 MiB"), res[0][6]


def test_threshold_zero_trims_nothing(sock, heapname):
    res = ok(run_ranks(_auto, 2, sock, heapname, 0)[0])
    for r, got in enumerate(res):
        assert got[:4] == [0, -1, 4 * MIB, 8], f"rank {r}: {got[:4]}"
        mapped, maps, trims, trimmed = got[5][:4]
        assert (mapped, maps, trims, trimmed) == (4 * MIB, 8, 0, 0), f"rank {r}: trimmed by itself: {got[5]}"
        assert got[-1][2] == 0, got[-1]
    assert res[0][6] == (0, -1, "-"), res[0][6]


def test_threshold_checked(sock, heapname):
    with pytest.raises(ValueError, match="not a size"):
        heapd.Heap(heapname, 0, 1, sock, trim_threshold="1MB")
