"""Issue 31, items 9-11: threads get distinct blocks, a forked child never
touches its parent's connection, and a dropped tensor frees its block."""
import gc
import os
import threading
import time

import pytest
import torch

import heapd
from conftest import HANG_S


def _wait(cond, what):
    deadline = time.monotonic() + HANG_S        # hang guard; we wait for the state
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.001)


def test_threads_get_distinct_blocks(sock, heapname):
    """Item 9: 4 threads x 200 allocations on one Heap land on 800 addresses."""
    with heapd.Heap(heapname, 0, 1, sock, chunk_size="4M", initial_size="8M") as h:
        out = [[] for _ in range(4)]
        go = threading.Barrier(4)

        def work(i):
            go.wait()
            for _ in range(200):
                t = h.empty(64, dtype=torch.uint8)
                out[i].append((t, t.data_ptr(), h.offset(t)))
        ths = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        ptrs = [p for o in out for _, p, _ in o]
        offs = [f for o in out for _, _, f in o]
        assert len(ptrs) == 800
        assert len(set(ptrs)) == 800, "two threads got the same block"
        assert len(set(offs)) == 800


def test_dropped_tensor_frees_its_block(sock, heapname):
    """Item 11: `del x` frees x's block (deferred); a collect makes it reusable
    (reclaim "collect"; the eager default: tests/python/test_reclaim.py)."""
    with heapd.Heap(heapname, 0, 1, sock, reclaim="collect") as h:
        assert h.reclaim == "collect"
        x = h.zeros(1 << 16, dtype=torch.uint8)
        x_off = h.offset(x)
        v = x[100:200]                       # a view keeps the block
        del x
        gc.collect()
        h.flush()
        assert h.status().rank_released == 0, "freed while a view still uses it"
        del v
        h.flush()
        _wait(lambda: h.status().rank_released == 1 << 16, "the dropped block's release")
        h.collect()
        assert h.status().live == 0
        y = h.empty(1 << 16, dtype=torch.uint8)
        assert h.offset(y) == x_off, "the dropped block is reused"
        h.free(y)                            # explicit free stays, and is not repeated
        del y
        h.flush()
        _wait(lambda: h.status().rank_released == 1 << 16, "the explicit free")
        h.collect()
        assert h.stats()["client"]["frees"] == 2


def test_peer_view_does_not_free(sock, heapname):
    with heapd.Heap(heapname, 0, 1, sock) as h:
        x = h.zeros(1024, dtype=torch.uint8)
        p = h.peer(x, 0)
        del p
        h.flush()
        assert h.stats()["client"]["frees"] == 0
        del x
        assert h.stats()["client"]["frees"] == 1


def test_forked_child_leaves_parent_heap(sock, heapname):
    """Item 10: a child that drops, frees, collects or exits never detaches
    the parent's heap, and gets a clear error if it allocates."""
    h = heapd.Heap(heapname, 0, 1, sock)
    x = h.zeros(4096, dtype=torch.uint8)
    kids = []
    for _ in range(3):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                  # the child
            os.close(r)
            msg = "ok"
            try:
                try:
                    h.empty(10)
                    msg = "allocated on the parent's heap"
                except heapd.StateError as e:
                    if "forked child" not in str(e) or "Heap of its own" not in str(e):
                        msg = f"unclear error: {e}"
                for f in (lambda: h.free(x), h.collect, h.flush):
                    try:
                        f()
                        msg = "freed or collected on the parent's connection"
                    except heapd.StateError:
                        pass
                h.close()
                del f, x, h                             # the last references in the child
                gc.collect()
            except BaseException as e:  # noqa: BLE001
                msg = f"raised {e!r}"
            os.write(w, msg.encode())
            os.close(w)
            os._exit(0)
        os.close(w)
        kids.append((pid, r))
    for pid, r in kids:
        msg = b""
        while True:
            b = os.read(r, 4096)
            if not b:
                break
            msg += b
        os.close(r)
        _, status = os.waitpid(pid, 0)
        assert msg.decode() == "ok", msg
    st = heapd.stats(heapname, sock)
    assert st["clients"] == 1 and st["ranks"][0]["attached"] is True
    y = h.zeros(4096, dtype=torch.uint8)             # the parent's heap still works
    h.collect()
    x.fill_(1)
    assert int(x.sum()) == 4096 and h.offset(y) != h.offset(x)
    h.close()
