"""Issue 30: release a heap's memory and restore it at the same offsets, from
Python, against a real heapd (host backend) with real rank processes: the
content bit for bit after a host release on every rank, zeros after a
discard, offsets and addresses unchanged, a symmetric allocation after the
restore, allocations refused while released (StateError saying so), the
`with heap.released():` form restoring on an exception, heap.state and the
status page's and heapd's views (heapctl's too), keep=True's host copy, a
released heap outliving its ranks (persist), a released tensor touched
(SIGSEGV), and examples/rl_swap.py."""
import ctypes
import os
import signal
import subprocess
import sys

import pytest
import torch

import heapd
from conftest import BUILD, ROOT, ok, run_ranks


def _fill(h, rank):
    """Tensors of several sizes and dtypes, one past the first chunk and one
    named, with content of this rank's."""
    g = torch.Generator().manual_seed(1000 + rank)
    ts = [h.empty(1000, dtype=torch.float32), h.empty(3, 77, dtype=torch.int64),
          h.empty(3 << 20, dtype=torch.uint8), h.empty(5, dtype=torch.bfloat16, name="nm")]
    for t in ts:
        t.copy_(torch.randint(0, 250, t.shape, generator=g).to(t.dtype))
    return ts


def _host_roundtrip(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock, chunk_size="1M") as h:
        ts = _fill(h, rank)
        want = [t.clone() for t in ts]
        ptrs, offs = [t.data_ptr() for t in ts], [h.offset(t) for t in ts]
        s0 = h.status()                              # before the collect: no rank released yet
        assert (h.state, s0.state_name, s0.resident) == ("active", "active", s0.mapped)
        h.collect()                                  # every rank wrote its tensors
        nxt = (rank + 1) % world
        peer_want = h.peer(ts[0], nxt).clone()
        h.release(mode="host")
        s = h.status()
        st = h.stats()
        assert h.state == "released" and s.state_name == "released" and s.resident == 0
        assert st["state"] == "released" and st["resident_bytes"] == 0
        assert 0 < st["host_copy_bytes"] <= s0.mapped * world and st["releases"] == 1
        assert s.mapped == s0.mapped, "the extent must stay while released"
        h.collect()                                  # no rank restores before every rank looked
        h.restore()
        s = h.status()
        assert h.state == "active" and s.state_name == "active" and s.resident == s0.mapped
        same = [torch.equal(t, w) for t, w in zip(ts, want)]
        assert all(same), f"rank {rank}: content changed by release/restore: {same}"
        assert [t.data_ptr() for t in ts] == ptrs and [h.offset(t) for t in ts] == offs
        assert torch.equal(h.peer(ts[0], nxt), peer_want), "a peer's copy changed"
        assert torch.equal(h.tensor("nm", (5,), torch.bfloat16), want[3])
        st = h.stats()
        assert (st["releases"], st["restores"], st["host_copy_bytes"]) == (1, 1, 0)
        new = [h.zeros(4096), h.empty(2 << 20, dtype=torch.uint8)]   # one grows the heap
        new[0] += rank
        h.collect()
        assert int(h.peer(new[0], nxt)[0]) == nxt
        h.collect()
        return offs, [h.offset(t) for t in new]


def test_host_release_restores_content_and_offsets(sock, heapname):
    res = ok(run_ranks(_host_roundtrip, 2, sock, heapname)[0])
    assert res[0] == res[1], "offsets differ between the ranks"


def _discard(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock) as h:
        x, y = h.ones(512), h.full((2, 300), 7, dtype=torch.int32)
        with pytest.raises(ValueError, match="mode='bogus'"):
            h.release(mode="bogus")
        with pytest.raises(ValueError, match="keep=True.*host"):
            h.release(mode="discard", keep=True)
        assert h.state == "active"
        h.release(mode="discard")
        assert h.stats()["host_copy_bytes"] == 0
        h.restore()
        assert int(x.abs().sum()) == 0 and int(y.abs().sum()) == 0, "discard must give zeros"
        x.fill_(3)                                   # the memory works again
        assert int(x.sum()) == 3 * 512
        return h.offset(x), h.offset(y)


def test_discard_gives_zeros(sock, heapname):
    res = ok(run_ranks(_discard, 2, sock, heapname)[0])
    assert res[0] == res[1]


def _while_released(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock) as h:
        keep, gone = h.zeros(100), h.zeros(200)
        off_gone = h.offset(gone)
        h.release()
        with pytest.raises(heapd.StateError, match="released.*restore") as e:
            h.zeros(16)
        msg = str(e.value)
        with pytest.raises(heapd.StateError):
            h.release()                              # already released
        h.free(gone)                                 # free, collect, lookup and stats work
        del gone
        h.collect()
        assert h.stats()["state"] in ("released", "restoring")   # a peer may be restoring already
        h.restore()
        with pytest.raises(heapd.StateError):
            h.restore()                              # not released
        again = h.zeros(200)
        more = h.zeros(1000)
        assert int(keep.sum()) == 0
        return msg, off_gone, h.offset(again), h.offset(more)


def test_alloc_while_released_is_a_state_error(sock, heapname):
    res = ok(run_ranks(_while_released, 2, sock, heapname)[0])
    assert res[0][1:] == res[1][1:], "allocations after the restore are not symmetric"
    assert heapname in res[0][0]


def _context(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock) as h:
        x = h.full((64,), rank + 10, dtype=torch.int64)
        with pytest.raises(RuntimeError, match="rollout failed"):
            with h.released(mode="host") as hh:
                assert hh is h and h.state == "released"
                raise RuntimeError("rollout failed")
        assert h.state == "active"
        assert torch.equal(x, torch.full((64,), rank + 10, dtype=torch.int64))
        with h.released(mode="host", keep=True):
            assert h.status().resident == 0
        kept = h.stats()["host_copy_bytes"]
        assert kept > 0, "keep=True: the host copy stays after the restore"
        with h.released():
            pass
        assert int(x[0]) == rank + 10
        st = h.stats()
        return st["releases"], st["restores"], kept


def test_context_manager_restores_on_exception(sock, heapname):
    res = ok(run_ranks(_context, 2, sock, heapname)[0])
    assert res[0][:2] == (3, 3) and res[1][:2] == (3, 3)


def _ctl(sock, *args):
    """heapctl's output (parsed when --json)."""
    import json
    p = subprocess.run([os.path.join(BUILD, "heapctl"), "--socket", sock, *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout) if "--json" in args else p.stdout


def _mine(text, name):
    """The line of heap `name` in heapctl heaps' output."""
    lines = [ln for ln in text.splitlines() if ln.split()[:1] == [name]]
    assert len(lines) == 1, text
    return lines[0]


def test_state_values(sock, heapname):
    h = heapd.Heap(heapname, 0, 1, sock)
    assert h.state == "active" and heapd.stats(heapname, sock)["state"] == "active"
    assert heapd._lib.STATES == ("active", "releasing", "released", "restoring")
    h.release("discard")
    assert h.state == "released" and h.status().state_name == "released"
    assert _ctl(sock, "--json", "stats", heapname)["heaps"][0]["state"] == "released"
    assert [x["state"] for x in _ctl(sock, "--json", "heaps")["heaps"] if x["name"] == heapname] \
        == ["released"]
    text = _ctl(sock, "stats", heapname)
    row = [ln.split() for ln in text.splitlines() if ln.startswith(heapname + " ")]
    assert any(r[1:3] == ["released", "0"] for r in row), text    # MEMORY, RESIDENT
    assert "MEMORY" in text and "HOST_COPY" in text
    assert _mine(_ctl(sock, "heaps"), heapname).endswith("  memory released")
    prom = _ctl(sock, "metrics")
    assert f'heapd_heap_state{{heap="{heapname}",owner_uid="{os.getuid()}"}} 2' in prom
    assert f'heapd_heap_releases_total{{heap="{heapname}",owner_uid="{os.getuid()}"}} 1' in prom
    h.restore()
    assert h.state == "active"
    assert _ctl(sock, "--json", "stats", heapname)["heaps"][0]["restores"] == 1
    assert _mine(_ctl(sock, "heaps"), heapname).endswith("  attached")
    h.close()
    assert h.state is None


def _leave_released(rank, world, sock, name):
    h = heapd.Heap(name, rank, world, sock, persist=60)
    w = h.empty(4096, dtype=torch.int32, name="w")
    w.copy_(torch.arange(4096, dtype=torch.int32) * (rank + 3))
    h.release("host")
    h.close()
    return True


def _back_released(rank, world, sock, name):
    h = heapd.Heap(name, rank, world, sock, persist=60)
    assert h.resumed and h.state == "released", (h.resumed, h.state)
    w = h.tensor("w", (4096,), torch.int32)           # a view; not touched while released
    h.restore()
    assert h.state == "active"
    same = torch.equal(w, torch.arange(4096, dtype=torch.int32) * (rank + 3))
    nxt = h.zeros(64)                                 # allocations work again, symmetric
    off = h.offset(nxt)
    h.collect()
    h.close()
    return same, off


def test_released_heap_outlives_its_ranks(sock, heapname):
    """Host mode: heapd's copy outlives the processes. Ranks release and
    leave; the heap stays detached and released (no chunk memory, the host
    copy); ranks that re-attach find it released, restore, and have the
    content back."""
    from test_resume import _detached, _drop, _wait
    try:
        assert ok(run_ranks(_leave_released, 2, sock, heapname)[0]) == [True, True]
        _wait(lambda: _detached(heapname, sock), "the released heap to be detached")
        st = heapd.stats(heapname, sock)
        assert (st["state"], st["resident_bytes"]) == ("released", 0) and st["host_copy_bytes"] > 0
        # heapctl metrics: a released heap charges no chunk memory (as heapd's quotas count it)
        prom = _ctl(sock, "metrics")
        lab = '{heap="%s"' % heapname
        rows = {l.split(lab)[0]: l.rsplit(" ", 1)[1] for l in prom.splitlines() if lab in l}
        assert (rows["heapd_heap_state"], rows["heapd_heap_chunk_bytes"], rows["heapd_heap_resident_bytes"]) \
            == ("2", "0", "0"), rows
        res = ok(run_ranks(_back_released, 2, sock, heapname)[0])
        assert [r[0] for r in res] == [True, True], "content lost across the re-attach"
        assert res[0][1] == res[1][1]
    finally:
        _drop(heapname, sock)


def _touch(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock) as h:
        x = h.ones(1024, dtype=torch.uint8)
        p = x.data_ptr()
        h.release("host")
        pid = os.fork()
        if pid == 0:                                 # the child reads the released memory
            import faulthandler
            faulthandler.disable()                   # pytest's: no traceback for the expected fault
            ctypes.string_at(p, 1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        h.restore()
        assert int(x.sum()) == 1024
        return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV


def test_touching_a_released_tensor_faults(sock, heapname):
    assert ok(run_ranks(_touch, 1, sock, heapname)[0]) == [True], \
        "reading a released tensor's address did not fault (SIGSEGV)"


def test_rl_swap_example(sock):
    env = dict(os.environ, HEAPD_SOCKET=sock)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples/rl_swap.py"), "--nproc", "2",
                        "--cpu", "--rounds", "3", "--steps", "10"], env=env, capture_output=True,
                       text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in (0, 1):
        assert out.count(f"rank {r}: restored, content unchanged") == 2, out
    assert "released: resident 0 of " in out and "state released" in out
    assert "releases 2 restores 2" in out


def _killed_mid(rank, world, sock, name, when):
    """Rank 1 dies (SIGKILL) while rank 0 waits in the release (or, after a
    release together, in the restore); rank 0's call fails naming rank 1, and
    the heap keeps its state."""
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", persist=30) as h:
        x = h.empty(4096, dtype=torch.int32)
        x.fill_(7 + rank)
        h.collect()
        if when == "restore":
            h.release(mode="host")
        h.collect() if when == "release" else None
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            h.release(mode="host") if when == "release" else h.restore()
            return ("returned",)
        except heapd.PeerGoneError as e:
            return ("gone", "rank 1" in str(e), h.status().state_name)


@pytest.mark.parametrize("when", ["release", "restore"])
def test_rank_killed_mid_release_or_restore(sock, heapname, when):
    from test_resume import _drop
    try:
        results = run_ranks(_killed_mid, 2, sock, heapname, when, expect_dead=(1,))[0]
        kind, val = results[0]
        assert kind == "ok", f"rank 0 raised {val}"
        assert val[:2] == ("gone", True), f"rank 0: {val}"
        assert val[2] == ("active" if when == "release" else "released"), f"rank 0 ends with the heap {val[2]}"
    finally:
        _drop(heapname, sock)
