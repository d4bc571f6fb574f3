"""Run by test_windows.py in a process of its own (libheapc_nccl loads NCCL
once per process): mode "stub" with LD_LIBRARY_PATH at the recording NCCL
stand-in (tests/nccl_stub/libnccl.so.2, whose ncclCommWindowRegister and
ncclCommWindowDeregister count), mode "none" with the machine's own
libnccl.so.2, if any (no GPU: NCCL refuses).
Registers a heap with heapd.torch.register and prints what the stand-in saw
at each step, as JSON."""
import ctypes
import json
import os
import sys

sock, build, name, mode = sys.argv[1:5]
import torch  # noqa: E402

import heapd  # noqa: E402
import heapd.torch as ht  # noqa: E402

MIB = 1 << 20
out = {}
h = heapd.Heap(name, 0, 1, sock, chunk_size="1M", initial_size="1M", extent_bound=True)
out["extent_bound"] = h.extent_bound
if mode == "none":
    try:
        ht.register(h, 0x1234)
        out["raised"] = None
    except ht.NcclError as e:
        out["raised"] = [type(e).__name__, e.code, e.name, str(e)]
    out["windows"] = getattr(h, "nccl_windows", None) is not None
    h.close()
    print("RESULT " + json.dumps(out))
    sys.exit(0)

stub = ctypes.CDLL(os.path.join(build, "tests/nccl_stub/libnccl.so.2"))


def seen():
    g = lambda t, n: t.in_dll(stub, n).value  # noqa: E731
    return {"reg": g(ctypes.c_ulong, "stub_win_reg"), "dereg": g(ctypes.c_ulong, "stub_win_dereg"),
            "comm": g(ctypes.c_void_p, "stub_win_comm"), "buf": g(ctypes.c_void_p, "stub_win_buf"),
            "size": g(ctypes.c_size_t, "stub_win_size"), "flags": g(ctypes.c_int, "stub_win_flags"),
            "bytes": g(ctypes.c_size_t, "stub_win_bytes"), "mapped": h.mapped}


out["base"] = int(h.bases[0])
reg = ht.register(h, 0x1234)
out["attach"] = seen()
out["same"] = h.nccl_windows is reg
try:
    ht.register(h, 0x1234)
except heapd.StateError as e:
    out["twice"] = str(e)
small = h.empty(1000, dtype=torch.uint8)
big = h.empty(3 * MIB, dtype=torch.uint8)   # a growth: one more window
out["growth"] = seen()
out["stats"] = reg.stats()
# A forked child (a DataLoader worker) closing or dropping its copy of the
# registration makes no NCCL call: the communicator is the parent's.
rfd, wfd = os.pipe()
pid = os.fork()
if pid == 0:
    dereg = lambda: ctypes.c_ulong.in_dll(stub, "stub_win_dereg").value  # noqa: E731
    before = dereg()
    reg.close()
    reg.__del__()
    os.write(wfd, json.dumps({"before": before, "after": dereg()}).encode())
    os._exit(0)
os.close(wfd)
out["fork"] = json.loads(os.read(rfd, 4096).decode())
os.waitpid(pid, 0)
os.close(rfd)
h.release()
out["released"] = seen()
h.restore()
out["restored"] = seen()
del small, big
h.close()
out["closed"] = seen()
out["stats_after"] = reg.stats()
reg.close()
print("RESULT " + json.dumps(out))
