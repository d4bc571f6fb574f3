"""heapd's Python package against a real heapd (host backend) and real rank
processes: attach, symmetric offsets, peer views, free orders, errors."""
import gc
import os
import random
import signal
import time

import pytest
import torch

import heapd
from conftest import ok, run_ranks


def _attach(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock) as h:
        s = h.status()
        return (h.name, h.rank, h.world_size, h.backend, s.mapped, h.local_ranks())


def test_attach(sock, heapname):
    res = ok(run_ranks(_attach, 3, sock, heapname)[0])
    for r, (name, rank, world, be, mapped, local) in enumerate(res):
        assert (name, rank, world, be) == (heapname, r, 3, "host")
        assert mapped > 0
        assert local == [0, 1, 2]


def _offsets(rank, world, sock, name):
    rng = random.Random(1234)          # same sizes on every rank
    dtypes = [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bfloat16]
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="1M") as h:
        offs, ptrs, keep = [], [], []   # kept: a dropped tensor frees its block
        for i in range(200):
            shape = (rng.randint(1, 64), rng.randint(1, 300))
            t = h.empty(shape, dtype=dtypes[i % len(dtypes)])
            assert t.shape == shape and t.dtype == dtypes[i % len(dtypes)]
            assert t.device.type == "cpu"
            offs.append(h.offset(t))
            ptrs.append(t.data_ptr())
            keep.append(t)
        assert len(set(ptrs)) == len(ptrs)
        return offs, h.status().growths


def test_offsets_identical(sock, heapname):
    res = ok(run_ranks(_offsets, 4, sock, heapname)[0])
    assert len(res[0][0]) == 200
    for r in range(1, 4):
        assert res[r][0] == res[0][0], f"rank {r}'s offsets differ from rank 0's"
    assert res[0][1] >= 1, "the workload should have grown the heap past 1 MiB"


def _peer(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock) as h:
        x = h.zeros((256, 4), dtype=torch.float32)
        big = h.zeros((3, 1 << 18), dtype=torch.int32)    # 3 MiB: in a grown chunk
        h.collect()                                  # everyone allocated and zeroed
        nxt = (rank + 1) % world
        px = h.peer(x, nxt)
        assert px.shape == x.shape and px.dtype == x.dtype
        # A torch op writes through the peer view; a view of a view too.
        torch.add(torch.arange(1024, dtype=torch.float32).view(256, 4), 1000.0 * rank, out=px)
        h.peer(big[1], nxt)[::2].fill_(rank + 7)
        h.collect()                                  # the writes are done everywhere
        prv = (rank - 1) % world
        want = torch.arange(1024, dtype=torch.float32).view(256, 4) + 1000.0 * prv
        assert torch.equal(x, want), "peer view: the previous rank's write is not visible"
        assert int(big[1][0]) == prv + 7 and int(big[1][1]) == 0 and int(big[0].abs().sum()) == 0
        # Reading a peer's block sees what that peer wrote.
        x.mul_(2)
        h.collect()
        assert torch.equal(h.peer(x, nxt), 2 * (torch.arange(1024, dtype=torch.float32).view(256, 4) + 1000.0 * rank))
        h.collect()
        return True


def test_peer_views(sock, heapname):
    assert ok(run_ranks(_peer, 3, sock, heapname)[0]) == [True] * 3


def _orders(rank, world, sock, name):
    sizes = [4 << 10, 64 << 10, 8 << 10, 256 << 10, 1 << 10, 16 << 10] * 6
    with heapd.Heap(name, rank, world, sock, chunk_size="4M", initial_size="4M", reclaim="collect") as h:
        ts = [h.empty(s, dtype=torch.uint8) for s in sizes]
        first = [h.offset(t) for t in ts]
        order = list(range(len(ts)))
        random.Random(rank * 7919 + 1).shuffle(order)   # a different order per rank
        for k, i in enumerate(order):
            h.free(ts[i])
            if k % 5 == rank % 5:
                h.flush()                                # different batching per rank too
        with pytest.raises(heapd.NotHeldError):
            h.free(ts[order[0]])
        h.flush()
        total = sum(sizes)
        deadline = time.monotonic() + 60        # hang guard; we wait for the state
        while h.status().rank_released != total and time.monotonic() < deadline:
            time.sleep(0.001)
        released = h.status().rank_released
        h.collect()
        st = h.status()
        again = [h.offset(h.empty(s, dtype=torch.uint8)) for s in sizes]
        # (heap-wide figures like live may already include another rank's
        # next allocations: read this rank's own)
        return first, again, released, st.rank_released, st.collects, h.status().growths


def test_free_orders_then_collect_and_reuse(sock, heapname):
    res = ok(run_ranks(_orders, 4, sock, heapname)[0])
    total = sum([4 << 10, 64 << 10, 8 << 10, 256 << 10, 1 << 10, 16 << 10] * 6)
    for r in range(4):
        first, again, released, live_after, collects, growths = res[r]
        assert first == res[0][0] and again == res[0][1], f"rank {r}: offsets differ"
        assert released == total, "every block this rank freed is released"
        assert live_after == 0, "after the collect nothing this rank released is pending"
        assert collects >= 1
        # Reuse: the two rounds together (over 4 MiB) fit the 4 MiB heap only
        # because the second reuses what the first freed.
        assert growths == 0
    assert max(res[0][1]) < 4 << 20


def _figures(e):
    return e.n, e.ranks, e.sizes


def _shim_refusal(h):
    """Rank 0's next allocation through libheapc_torch.so, the allocator
    route's shim (heapd.torch.use_heap needs CUDA; the shim's refusal path
    does not): refused, and the HeapdError use_heap would raise."""
    import ctypes
    import heapd.torch as ht
    from heapd import _lib as L
    shim = ctypes.CDLL(ht._shim_path())
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    ht._set(shim.heapc_torch_init, ctypes.c_int, [ctypes.c_void_p] * 7)
    assert shim.heapc_torch_init(addr(L.alloc_async), addr(L.free_async), addr(L.errstr), addr(L.base),
                                 addr(L.rank), addr(L.mapped), addr(L.last_asymmetry)) == 0
    ht._set(shim.heapc_torch_set_current, ctypes.c_void_p, [ctypes.c_void_p])
    ht._set(shim.heapc_torch_alloc, ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p])
    ht._set(shim.heapc_torch_last_code, ctypes.c_int, [])
    ht._set(shim.heapc_torch_last_error, ctypes.c_char_p, [])
    ht._set(shim.heapc_torch_last_asymmetry, ctypes.c_size_t,
            [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32),
             ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t])
    shim.heapc_torch_set_current(h._c)
    try:
        assert not shim.heapc_torch_alloc(16, 0, None)     # refused; no driver here either
    finally:
        shim.heapc_torch_set_current(None)
    return ht._refusal(shim, 1)


def _asym(rank, world, sock, name, ev, done, via_shim=False):
    with heapd.Heap(name, rank, world, sock) as h:
        keep = [h.empty(1024, dtype=torch.uint8)]          # allocation 0: the same on both
        if rank == 0:
            keep.append(h.empty(4096, dtype=torch.uint8))  # allocation 1, decided by rank 0
            ev.set()
            done.wait(60)                                  # rank 1 was refused
            if via_shim:
                raise _shim_refusal(h)
            try:
                h.empty(16, dtype=torch.uint8)             # rank 0's next call: the heap is poisoned
            except heapd.AsymmetryError as e:
                with pytest.raises(heapd.AsymmetryError) as again:
                    h.collect()                            # every call, a collect too
                assert _figures(again.value) == _figures(e)
                raise
            return "no error"
        ev.wait(60)
        try:
            h.empty(8192, dtype=torch.uint8)               # allocation 1, another size
        except heapd.AsymmetryError as e:
            with pytest.raises(heapd.AsymmetryError) as again:
                h.empty(4096, dtype=torch.uint8)           # poisoned: the right size too
            assert _figures(again.value) == _figures(e)
            raise
        finally:
            done.set()
        return "no error"


def test_asymmetry_poisons_the_heap(sock, heapname):
    """Issue 31 item 5: the rank that asks second gets AsymmetryError, and so
    does the earlier rank's next call; both carry heapd's figures: n, both
    ranks and both sizes (libheapc's heapc_last_asymmetry, not the text)."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    ev, done = ctx.Event(), ctx.Event()
    res, _ = run_ranks(_asym, 2, sock, heapname, ev, done)
    for r in (0, 1):
        kind, val = res[r]
        assert kind == "raised" and val[0] == "AsymmetryError", f"rank {r}: {res[r]}"
        cls, msg, extra, _tb = val
        assert extra["name"] == "ERR_ASYMMETRY" and "poisoned" in msg, msg
        assert (extra["n"], extra["ranks"], extra["sizes"]) == (1, [0, 1], [4096, 8192]), extra
        assert extra["size"] == 8192 and extra["other_size"] == 4096, extra


def test_asymmetry_figures_through_the_torch_shim(sock, heapname):
    """use_heap's error (the shim's refusal) carries the same figures."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    ev, done = ctx.Event(), ctx.Event()
    res, _ = run_ranks(_asym, 2, sock, heapname, ev, done, True)
    for r in (0, 1):
        kind, val = res[r]
        assert kind == "raised" and val[0] == "AsymmetryError", f"rank {r}: {res[r]}"
        assert (val[2]["n"], val[2]["ranks"], val[2]["sizes"]) == (1, [0, 1], [4096, 8192]), val
    assert "refused by heapd" in res[0][1][1], res[0][1][1]


def _gone(rank, world, sock, name, ev):
    h = heapd.Heap(name, rank, world, sock, collect_timeout_ms=60000)
    h.zeros(100)
    if rank == 1:
        ev.wait(60)                     # rank 0 is about to wait in collect
        os.kill(os.getpid(), signal.SIGKILL)
    ev.set()
    h.collect()
    return "collect returned"


def test_rank_killed_peer_gone(sock, heapname):
    import multiprocessing as mp
    ev = mp.get_context("fork").Event()
    res, codes = run_ranks(_gone, 2, sock, heapname, ev, expect_dead=(1,))
    assert codes[1] == -signal.SIGKILL
    kind, val = res[0]
    assert kind == "raised" and val[0] == "PeerGoneError", res[0]
    assert "rank 1" in val[1] and val[2]["name"] == "ERR_PEER_GONE"


def _env(rank, world, sock):
    with heapd.Heap.from_env(socket=sock) as h:
        t = h.zeros(10)
        return h.name, h.rank, h.world_size, h.offset(t)


def test_from_env_torchrun(sock):
    run = f"run{os.getpid()}"
    env = lambda r: {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",  # noqa: E731
                     "TORCHELASTIC_RUN_ID": run, "LOCAL_RANK": str(r)}
    res = ok(run_ranks(_env, 2, sock, env=env)[0])
    assert res == [(f"torch-{run}", 0, 2, 0), (f"torch-{run}", 1, 2, 0)]


def test_from_env_slurm(sock):
    env = lambda r: {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_NODEID": "0",  # noqa: E731
                     "SLURM_TASKS_PER_NODE": "2(x1)", "SLURM_JOB_ID": f"{os.getpid()}",
                     "SLURM_STEP_ID": "3", "SLURM_LOCALID": str(r)}
    res = ok(run_ranks(_env, 2, sock, env=env)[0])
    assert [x[0] for x in res] == [f"slurm-{os.getpid()}.3"] * 2 and [x[1] for x in res] == [0, 1]
    # node 3 of "1(x3),2": 2 tasks here (all of the world: a single-node heap)
    env2 = lambda r: {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_NODEID": "3",  # noqa: E731
                      "SLURM_TASKS_PER_NODE": "1(x3),2", "SLURM_JOB_ID": f"j{os.getpid()}"}
    res = ok(run_ranks(_env, 2, sock, env=env2)[0])
    assert [x[0] for x in res] == [f"slurm-j{os.getpid()}.0"] * 2


def _env_err(rank, world, sock):
    heapd.Heap.from_env(socket=sock)


def test_from_env_missing_variable(sock):
    for k in ("RANK", "SLURM_PROCID"):
        os.environ.pop(k, None)
    res, _ = run_ranks(_env_err, 1, sock, env={"RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    kind, (cls, msg, extra, _tb) = res[0]
    assert kind == "raised" and extra["name"] == "ERR_INVALID", res[0]
    assert "WORLD_SIZE is not set" in msg and "torchrun" in msg
    res, _ = run_ranks(_env_err, 1, sock)
    assert "no launcher environment" in res[0][1][1]
    res, _ = run_ranks(_env_err, 1, sock, env={"RANK": "x1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"})
    assert 'RANK="x1"' in res[0][1][1]


def test_tensor_keeps_heap_alive(sock, heapname):
    h = heapd.Heap(heapname, 0, 1, sock)
    x = h.zeros((1000,), dtype=torch.float64)
    v = x[10:20]
    h.close()
    with pytest.raises(heapd.StateError):
        h.empty(10)
    x.fill_(3.0)                          # still mapped: the tensor holds the heap
    assert float(v.sum()) == 30.0
    assert heapd.stats(heapname, sock)["clients"] == 1
    del x
    gc.collect()
    assert heapd.stats(heapname, sock)["clients"] == 1   # the view still holds it
    del v
    gc.collect()
    with pytest.raises(heapd.HeapdError) as e:
        heapd.stats(heapname, sock)
    assert e.value.name == "ERR_NOT_FOUND"


def test_connect_error_names_socket(tmp_path):
    with pytest.raises(heapd.HeapdConnectionError) as e:
        heapd.Heap("x", 0, 1, str(tmp_path / "nothere.sock"))
    assert "nothere.sock" in str(e.value)


def test_free_on_stream_waits_for_it(sock, heapname):
    """Issue 18: a block freed on a stream (a heapc_hstream on the host backend) is
    released to heapd only once the stream's work completed; a collect does not wait."""
    import ctypes
    from heapd import _lib as L
    L.lib.heapc_hstream_create.restype = ctypes.c_void_p
    L.lib.heapc_hstream_begin.restype = ctypes.c_uint64
    L.lib.heapc_hstream_begin.argtypes = [ctypes.c_void_p]
    L.lib.heapc_hstream_complete.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    L.lib.heapc_hstream_destroy.argtypes = [ctypes.c_void_p]
    hs = L.lib.heapc_hstream_create()
    assert hs
    h = heapd.Heap(heapname, 0, 1, sock)
    h.set_stream_reuse(False)                # issue 18's rule (issue 27's: test_reclaim)
    x = h.zeros((1 << 16,), dtype=torch.uint8)
    ticket = L.lib.heapc_hstream_begin(hs)   # work on x is "in flight"
    h.free(x, stream=hs)
    h.collect()                              # does not wait: x stays held
    st = h.stats()
    assert st["client"]["stream_waiting"] == 1
    assert st["client"]["device_waits_avoided"] >= 1
    assert st["released_bytes"] == 0 and st["live_bytes"] >= 1 << 16
    L.lib.heapc_hstream_complete(hs, ticket)
    h.collect()                              # now it is released and reclaimed
    st = h.stats()
    assert st["client"]["stream_waiting"] == 0
    assert st["live_bytes"] == 0
    h.close()
    L.lib.heapc_hstream_destroy(hs)
