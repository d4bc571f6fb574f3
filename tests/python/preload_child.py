"""Run by test_preload.py under LD_PRELOAD=libheapc_nccl_preload.so: attaches a
heap (unless told not to), loads the stand-in "torch" library (libnccl_user.so,
which references NCCL and is linked against the recording libnccl.so.2), makes
each NCCL call through it and prints what the preload and the stand-in saw,
as JSON."""
import ctypes
import json
import os
import sys

sock, build, name, attach = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
import torch  # noqa: E402,F401 - as a trainer would

import heapd  # noqa: E402
import heapd.torch as ht  # noqa: E402

out = {"library_path": heapd.library_path}
h = heapd.Heap(name, 0, 1, sock) if attach else None
pre = ht.preload()
out["preload"] = pre is not None
seen = []
pre.set_release_callback(lambda info: seen.append([info.op_name.decode(), info.device_free,
                                                   info.threshold, info.have_page]))
user = ctypes.CDLL(os.path.join(build, "tests/nccl_stub/libnccl_user.so"))
stub = ctypes.CDLL(os.path.join(build, "tests/nccl_stub/libnccl.so.2"))
user.user_call.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
buf = h.zeros(64) if h else torch.zeros(64)
ptr = buf.data_ptr()
out["results"] = [user.user_call(i, ptr, 16) for i in range(9)]
calls = (ctypes.c_ulong * 9).in_dll(stub, "stub_calls")
out["stub_calls"] = list(calls)
out["counters"] = pre.counters()
out["seen"] = list(seen)
out["probe_ops"] = pre.probe_ops()
out["last_error"] = pre.last_error()
out["missing"] = pre.missing()
# Arguments pass through unchanged.
user.user_call(0, ptr + 8, 77)
out["args_ok"] = (ctypes.c_size_t.in_dll(stub, "stub_last_count").value == 77 and
                  ctypes.c_void_p.in_dll(stub, "stub_last_send").value == ptr + 8)


def windows():
    """Issue 32: what the stand-in's ncclCommWindowRegister saw."""
    g = lambda t, n: t.in_dll(stub, n).value  # noqa: E731
    return {"reg": g(ctypes.c_ulong, "stub_win_reg"), "dereg": g(ctypes.c_ulong, "stub_win_dereg"),
            "comm": g(ctypes.c_void_p, "stub_win_comm"), "buf": g(ctypes.c_void_p, "stub_win_buf"),
            "size": g(ctypes.c_size_t, "stub_win_size"), "flags": g(ctypes.c_int, "stub_win_flags"),
            "base": int(h.bases[0]) if h else 0, "mapped": h.mapped if h else 0}


out["windows"] = windows()
if h:
    del buf
    h.close()
out["windows_closed"] = windows()
out["last_error_closed"] = pre.last_error()
print("RESULT " + json.dumps(out))
sys.stdout.flush()
