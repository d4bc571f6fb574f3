"""Shared by the heapd pytest files: a real heapd (started by
tests/it_python.sh, socket in $HEAPD_SOCKET) and real rank processes.

run_ranks(fn, world, *args) forks `world` processes that each call
fn(rank, world, *args) and returns their results by rank; an exception in a
rank comes back as ("raised", class name, message, extra attributes). A rank
that neither answers nor exits within the timeout fails the test (the
timeout is a hang guard, not a synchronisation: the tests wait for states)."""
import multiprocessing as mp
import os
import sys
import traceback

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
BUILD = os.environ.get("BUILD", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)

HANG_S = 120
_ctx = mp.get_context("fork")


def _child(fn, rank, world, args, q):
    try:
        res = fn(rank, world, *args)
        q.put((rank, "ok", res))
    except BaseException as e:  # noqa: BLE001
        extra = {k: getattr(e, k) for k in ("n", "ranks", "sizes", "size", "other_size", "code", "name")
                 if hasattr(e, k)}
        q.put((rank, "raised", (type(e).__name__, str(e), extra, traceback.format_exc())))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run_ranks(fn, world, *args, env=None, expect_dead=()):
    q = _ctx.Queue()
    procs = []
    for r in range(world):
        old = dict(os.environ)
        if env:
            os.environ.update(env(r) if callable(env) else env)
        p = _ctx.Process(target=_child, args=(fn, r, world, args, q))
        p.start()
        os.environ.clear()
        os.environ.update(old)
        procs.append(p)
    res = {}
    want = world - len(expect_dead)
    try:
        for _ in range(want):
            r, kind, val = q.get(timeout=HANG_S)
            res[r] = (kind, val)
    finally:
        for p in procs:
            p.join(timeout=HANG_S)
            if p.is_alive():
                p.kill()
    for r in range(world):
        if r not in expect_dead and r not in res:
            pytest.fail(f"rank {r} gave no result (exit code {procs[r].exitcode})")
    return [res.get(r) for r in range(world)], [p.exitcode for p in procs]


def wait_for(cond, what, limit=60, nap=0.001):
    """Polls cond() until it holds: tests wait for a state; limit (seconds)
    is only a hang guard, and its expiry fails the test naming `what`."""
    import time
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(nap)


def ok(results):
    """The values of ranks that returned; fails the test if one raised."""
    out = []
    for r, kv in enumerate(results):
        assert kv is not None, f"rank {r}: no result"
        kind, val = kv
        if kind != "ok":
            pytest.fail(f"rank {r} raised {val[0]}: {val[1]}\n{val[3]}")
        out.append(val)
    return out


@pytest.fixture
def sock():
    s = os.environ.get("HEAPD_SOCKET")
    if not s or not os.path.exists(s):
        pytest.fail("HEAPD_SOCKET does not name a running heapd's socket: run tests/it_python.sh")
    return s


_n = [0]


@pytest.fixture
def heapname(request):
    _n[0] += 1
    return f"py-{request.node.name[:40]}-{os.getpid()}-{_n[0]}"
