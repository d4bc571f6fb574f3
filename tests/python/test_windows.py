"""Issue 32: heapd.torch.register(heap, pg) registers a heap as NCCL
windows. Without a GPU it runs over the recording NCCL stand-in
(tests/nccl_stub/libnccl.so.2, found through LD_LIBRARY_PATH by
libheapc_nccl's own loader, in a process of its own: windows_child.py):
the heap's extent at the call and each growth registered
(NCCL_WIN_COLL_SYMMETRIC, the communicator given), release and close
deregistering, restore registering again; with the machine's NCCL and no
GPU (or no NCCL) a clean NcclError; the argument checks. The LD_PRELOAD switch (HEAPC_NCCL_REGISTER)
is tested in test_preload.py. A forked child's close of the registration
makes no NCCL call."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

import heapd
import heapd.torch as ht

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "windows_child.py")
MIB = 1 << 20


def child(sock, name, mode):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python")
    e["HEAPC_LIB"] = os.path.join(BUILD, "libheapc.so")
    e.pop("LD_PRELOAD", None)
    if mode == "stub":
        e["LD_LIBRARY_PATH"] = os.path.join(BUILD, "tests", "nccl_stub")
    else:
        e.pop("LD_LIBRARY_PATH", None)
    p = subprocess.run([sys.executable, CHILD, sock, BUILD, name, mode], env=e,
                       capture_output=True, text=True, timeout=180)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"child failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}"
    return json.loads(lines[0][7:])


def test_register_follows_the_heap(sock, heapname):
    r = child(sock, heapname, "stub")
    assert r["extent_bound"] is True
    a = r["attach"]
    assert (a["reg"], a["dereg"], a["comm"], a["flags"]) == (1, 0, 0x1234, 1), a
    assert a["buf"] == r["base"] and a["size"] == a["mapped"] == a["bytes"] == MIB, a
    assert r["same"] and "registered already" in r["twice"]
    g = r["growth"]
    assert g["reg"] == 2 and g["dereg"] == 0, g
    assert g["buf"] == r["base"] + MIB and g["size"] == g["mapped"] - MIB, g
    assert g["bytes"] == g["mapped"], "every mapped byte in a window"
    f = r["fork"]
    assert f["before"] == f["after"] == 0, f"a forked child's close deregistered in NCCL: {f}"
    s = r["stats"]
    assert (s["windows"], s["extents"], s["registered_bytes"], s["registered"]) == \
        (2, 2, g["mapped"], True), s
    rel = r["released"]
    assert rel["dereg"] == 2 and rel["bytes"] == 0, "release deregisters every window"
    res = r["restored"]
    assert res["reg"] == 3 and res["bytes"] == g["mapped"] and res["buf"] == r["base"], \
        "restore registers the mapped extent again (one run: one window)"
    c = r["closed"]
    assert c["dereg"] == 3 and c["bytes"] == 0, "close (detach) deregisters"
    assert r["stats_after"]["registered"] is False and r["stats_after"]["windows"] == 0


def test_machine_nccl_without_gpu_fails_cleanly(sock, heapname):
    """The machine's own libnccl.so.2 (no GPU here): NCCL refuses the
    registration, or there is none (or one before 2.27): an NcclError that
    names it, and nothing stays registered."""
    r = child(sock, heapname, "none")
    kind, code, name, msg = r["raised"]
    assert kind == "NcclError", r["raised"]
    if code == -2:
        assert name == "ERR_LOAD" and ("libnccl.so.2" in msg or "2.27" in msg), r["raised"]
    else:
        assert code > 0 and "ncclCommWindowRegister" in msg and "nothing stays registered" in msg, \
            r["raised"]
    assert r["windows"] is False


def test_argument_errors(sock, heapname):
    with heapd.Heap(heapname, 0, 1, sock) as h:
        with pytest.raises(TypeError, match="_comm_ptr"):
            ht.register(h, object())
        with pytest.raises(ValueError, match="not one"):
            ht.register(h, 0)
        assert getattr(h, "nccl_windows", None) is None
    with pytest.raises(heapd.StateError, match="closed"):
        ht.register(h, 0x1234)


def _from_group(rank, world, port):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        heapd.Heap.from_group(nccl_windows=True)
        got = None
    except TypeError as e:
        got = str(e)
    last = heapd._current()
    dist.destroy_process_group()
    return got, last is None


def test_from_group_nccl_windows_needs_an_nccl_group(sock):
    """Heap.from_group(nccl_windows=True) on a gloo group: a TypeError that
    says so, and the heap it attached is closed again."""
    import socket
    from conftest import ok, run_ranks
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = ok(run_ranks(_from_group, 1, port, env={"HEAPD_SOCKET": sock, "OMP_NUM_THREADS": "1"})[0])
    msg, closed = res[0]
    assert msg and ("has no _comm_ptr()" in msg or "has no NCCL backend" in msg), msg
    assert closed, "the heap stays attached after the failed registration"
