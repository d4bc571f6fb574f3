"""Issue 29: heaps that outlive their ranks, from Python. Named blocks
(empty(..., name=), tensor(name), tensors()), persist=, and - against a
heapd that keeps detached heaps - a re-attach after every rank was killed
(SIGKILL) finding the named tensors' content intact, the live set, the
commit markers and a symmetric next allocation; Heap.from_env with
$HEAPD_PERSIST re-attaching the same way."""
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch

import heapd
from conftest import BUILD, HANG_S, ok, run_ranks


def _wait(cond, what):
    deadline = time.monotonic() + HANG_S        # hang guard; we wait for the state
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


def _detached(name, sock):
    """The heap exists and has no client (its ranks are gone, it persists)."""
    try:
        return heapd.stats(name, sock)["clients"] == 0
    except heapd.HeapdError:
        return False


def _drop(name, sock):
    """Releases a detached heap (heapctl drop), so that it does not stay."""
    ctl = os.path.join(BUILD, "heapctl")
    if shutil.which(ctl):
        subprocess.run([ctl, "--socket", sock, "drop", name], capture_output=True, timeout=60)


def test_named_blocks(sock, heapname):
    """name=: the block is found by name (tensor, tensors), stays when its
    tensors are dropped, and is gone after free."""
    with heapd.Heap(heapname, 0, 1, sock) as h:
        w = h.zeros(4, 8, dtype=torch.float32, name="w")
        w += torch.arange(32, dtype=torch.float32).view(4, 8)
        plain = h.ones(16)
        again = h.tensor("w", (4, 8), torch.float32)
        assert torch.equal(again, w) and again.data_ptr() == w.data_ptr()
        assert h.tensor("w", dtype=torch.float32).shape == (32,)
        assert h.tensor("w", 8, torch.float32).shape == (8,)
        with pytest.raises(KeyError, match="no block named 'nope'"):
            h.tensor("nope", (1,), torch.float32)
        with pytest.raises(ValueError, match="has 128 bytes"):
            h.tensor("w", (5, 8), torch.float32)
        h.full_like(plain, 3, name="s")
        t = h.tensors()
        assert sorted(t) == ["s", "w"]
        assert t["w"].dtype == torch.uint8 and t["w"].numel() == 128
        held = h.status().rank_held
        del w, again, t
        h.flush()
        assert h.status().rank_held == held, "a named block was freed with its tensors"
        h.free(h.tensor("w", (1,), torch.uint8))
        assert sorted(h.tensors()) == ["s"]
        with pytest.raises(KeyError):
            h.tensor("w")
        with pytest.raises(TypeError, match="name="):
            h.empty(4, name=b"bytes")
        with pytest.raises(ValueError, match="at most 255"):
            h.empty(4, name="n" * 256)
        assert h.committed("never", default=-1) == -1
        assert h.resumed is False and h.generation == 0
        assert h.live() == []


def test_persist_argument(sock, heapname):
    with pytest.raises(ValueError, match="persist=-1"):
        heapd.Heap(heapname, 0, 1, sock, persist=-1)


def _phase1(rank, world, name, sock, env):
    """Allocates, fills and commits on every rank, then dies (SIGKILL)."""
    h = heapd.Heap.from_env(name, sock) if env else heapd.Heap(name, rank, world, sock, persist=60)
    assert not h.resumed
    w = h.empty(1024, dtype=torch.int32, name="w")
    w.copy_(torch.arange(1024, dtype=torch.int32) * (rank + 1))
    keep = h.empty(100, dtype=torch.uint8)             # unnamed, live (held at the kill)
    m = h.zeros(3, 3, dtype=torch.float64, name="m")
    m.fill_(rank + 0.5)
    h.commit("step", 3)
    assert keep.numel() == 100
    os.kill(os.getpid(), signal.SIGKILL)


def _phase2(rank, world, name, sock, env):
    """Re-attaches: what phase 1 left, then goes on."""
    h = heapd.Heap.from_env(name, sock) if env else heapd.Heap(name, rank, world, sock, persist=60)
    assert h.resumed and h.generation >= 1, (h.resumed, h.generation)
    w = h.tensor("w", (1024,), torch.int32)
    assert torch.equal(w, torch.arange(1024, dtype=torch.int32) * (rank + 1)), "content lost"
    assert torch.equal(h.tensor("m", (3, 3), torch.float64), torch.full((3, 3), rank + 0.5,
                                                                          dtype=torch.float64))
    assert h.committed("step") == 3
    live = h.live()
    assert [b["name"] for b in live] == ["w", "", "m"], live
    assert [b["seq"] for b in live] == sorted(b["seq"] for b in live)
    assert sorted(h.tensors()) == ["m", "w"]
    nxt = h.empty(64, dtype=torch.uint8, name="next")
    h.free(h.tensor("m", (1,), torch.uint8))
    h.commit("step", 4)
    assert h.committed("step") == 4
    out = (h.offset(w), h.offset(nxt), h.generation)
    h.close()
    return out


def _phase3(rank, world, name, sock, env):
    h = heapd.Heap.from_env(name, sock) if env else heapd.Heap(name, rank, world, sock, persist=60)
    assert h.resumed
    with pytest.raises(KeyError):
        h.tensor("m")
    got = (h.committed("step"), sorted(h.tensors()), h.generation)
    h.collect()                                        # the ranks meet before they leave
    h.close()
    return got


def _launch_env(heapname, sock):
    def env(r):
        return {"HEAPD_SOCKET": sock, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                "TORCHELASTIC_RUN_ID": heapname, "HEAPD_HEAP": heapname, "HEAPD_PERSIST": "60",
                "OMP_NUM_THREADS": "1"}
    return env


@pytest.mark.parametrize("env", [False, True], ids=["Heap", "from_env"])
def test_reattach_after_sigkill(sock, heapname, env):
    """Every rank killed after a commit; the restarted ranks find their
    named tensors intact, the live set, the marker, and allocate on
    symmetrically; a second restart sees the second commit."""
    e = _launch_env(heapname, sock) if env else {"OMP_NUM_THREADS": "1"}
    name = None if env else heapname
    try:
        run_ranks(_phase1, 2, name, sock, env, env=e, expect_dead=(0, 1))
        _wait(lambda: _detached(heapname, sock), "the killed ranks' heap to be detached")
        r2 = ok(run_ranks(_phase2, 2, name, sock, env, env=e)[0])
        assert r2[0][:2] == r2[1][:2], f"offsets differ across ranks: {r2}"
        _wait(lambda: _detached(heapname, sock), "the heap to be detached again")
        r3 = ok(run_ranks(_phase3, 2, name, sock, env, env=e)[0])
        assert r3[0][:2] == (4, ["next", "w"]) and r3[0][:2] == r3[1][:2], r3
        assert min(r[2] for r in r3) > max(r[2] for r in r2), "the generation did not count the re-attach"
    finally:
        _drop(heapname, sock)


def _many(rank, world, name, sock, n):
    """n blocks (every 1000th named, its bytes its index), then SIGKILL."""
    h = heapd.Heap(name, rank, world, sock, persist=60)
    keep = []
    for i in range(n):
        t = h.empty(64, dtype=torch.uint8, name=f"b{i}" if i % 1000 == 0 else None)
        t.fill_(i % 251)
        keep.append(t)
    h.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _many_back(rank, world, name, sock, n):
    h = heapd.Heap(name, rank, world, sock, persist=60)
    live = h.live()
    assert len(live) == n and [b["seq"] for b in live] == list(range(n)), len(live)
    named = {b["name"]: b for b in live if b["name"]}
    assert sorted(named) == sorted(f"b{i}" for i in range(0, n, 1000))
    for i in range(0, n, 1000):
        t = h.tensor(f"b{i}", (64,), torch.uint8)
        assert int(t.min()) == int(t.max()) == i % 251, i
        assert h.offset(t) == named[f"b{i}"]["offset"]
    h.free_offset(live[1]["offset"])                    # an unnamed one, known from the live set
    with pytest.raises(heapd.NotHeldError):
        h.free_offset(live[1]["offset"])
    h.close()
    return len(live)


def test_live_set_larger_than_a_frame(sock, heapname):
    """20000 live blocks: heapd sends them in LiveBatch frames before the
    AttachReply (more than 16384 per frame do not fit), libheapc puts them
    together: every block, in seq order, the names and contents intact."""
    n = 20000
    try:
        run_ranks(_many, 1, heapname, sock, n, expect_dead=(0,))
        _wait(lambda: _detached(heapname, sock), "the killed rank's heap to be detached")
        assert ok(run_ranks(_many_back, 1, heapname, sock, n)[0]) == [n]
    finally:
        _drop(heapname, sock)


def _asym_names(rank, world, name, sock):
    h = heapd.Heap(name, rank, world, sock)
    mine = f"r{rank}"
    try:
        t = h.empty(64, dtype=torch.uint8, name=mine)
        got = None
    except heapd.AsymmetryError as e:
        got = (e.n, e.ranks, e.names)
        assert e.names and e.names[-1] == mine and e.names[0] != mine, e.names
        t = h.empty(64, dtype=torch.uint8, name=e.names[0])   # not consumed: ask again
    off = h.offset(t)
    h.collect()                                           # not poisoned
    h.close()
    return got, off


def test_name_asymmetry(sock, heapname):
    """Ranks that name their n-th allocation differently: the second gets
    AsymmetryError with both names (.names), the allocation number is not
    consumed and the heap is not poisoned."""
    res = ok(run_ranks(_asym_names, 2, heapname, sock)[0])
    errs = [g for g, _ in res if g]
    assert len(errs) == 1 and errs[0][0] == 0 and sorted(errs[0][2]) == ["r0", "r1"], res
    assert res[0][1] == res[1][1]
