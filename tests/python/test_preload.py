"""libheapc_nccl_preload.so under LD_PRELOAD in a real python process with a
real heapd page, over the recording NCCL stand-in (tests/nccl_stub): calls
intercepted and passed on, the policy from the environment, the probe's
release callback, counters, NCCL failures reported with the memory state."""
import json
import os
import subprocess
import sys

from conftest import BUILD, ROOT

PRE = os.path.join(BUILD, "libheapc_nccl_preload.so")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preload_child.py")
OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
       "send", "recv", "group_start", "group_end"]


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def child(sock, name, env, attach=True):
    e = dict(os.environ)
    for k in list(e):
        if k.startswith("HEAPC_NCCL") or k == "NCCL_STUB_FAIL":
            del e[k]
    e.pop("HEAPC_LIB", None)
    e.update(env)
    e["LD_PRELOAD"] = PRE
    e["PYTHONPATH"] = os.path.join(ROOT, "python")
    p = subprocess.run([sys.executable, CHILD, sock, BUILD, name, "1" if attach else "0"],
                       env=e, capture_output=True, text=True, timeout=180)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"child failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}"
    return json.loads(lines[0][7:]), p


def test_intercepts_with_policy_and_callback(sock, heapname):
    big = str(2 * mem_total())      # free memory is always below this: the callback runs
    r, _ = child(sock, heapname, {"HEAPC_NCCL_PROBE": "allreduce,all_gather_into_tensor",
                                  "HEAPC_NCCL_SKIP": "group_end", "HEAPC_NCCL_FREE_MIN": big})
    assert r["preload"] and "LD_PRELOAD" in r["library_path"]
    assert r["results"] == [0] * 9
    assert r["stub_calls"] == [1] * 9, "every call reached the real (stand-in) NCCL once"
    c = r["counters"]
    assert c["calls"] == {op: (0 if op == "all_to_all" else 1) for op in OPS}
    # all_reduce, all_gather (environment) and group_start (default) probe;
    # group_end was switched off; the hot ops skip.
    assert r["probe_ops"] == ["all_reduce", "all_gather", "group_start"]
    assert c["probes"] == 3 and c["probe_errors"] == 0
    assert c["below"] == 3 and c["callbacks"] == 3 and c["nccl_errors"] == 0
    assert [s[0] for s in r["seen"]] == ["all_reduce", "all_gather", "group_start"]
    assert all(s[1] > 0 and s[2] == int(big) and s[3] == 1 for s in r["seen"]), r["seen"]
    assert r["args_ok"] and r["missing"] == "" and r["last_error"] == ""


def test_threshold_not_reached(sock, heapname):
    r, _ = child(sock, heapname, {"HEAPC_NCCL_PROBE": "all", "HEAPC_NCCL_FREE_MIN": "4K"})
    c = r["counters"]
    assert c["probes"] == 9 and c["below"] == 0 and c["callbacks"] == 0 and r["seen"] == []


def test_nccl_failure_reports_memory(sock, heapname):
    r, _ = child(sock, heapname, {"NCCL_STUB_FAIL": "ncclAllReduce"})
    assert r["results"][0] == 1 and r["results"][1:] == [0] * 8
    assert r["counters"]["nccl_errors"] == 1
    msg = r["last_error"]
    for want in ("ncclAllReduce", "stub: unhandled cuda error", "stub: the last error",
                 "memory at failure (heapd status page, rank 0"):
        assert want in msg, f"{want!r} not in {msg!r}"


def test_unbound_probe_counts_errors_and_calls_nccl(sock, heapname):
    r, _ = child(sock, heapname, {"HEAPC_NCCL_PROBE": "all_reduce"}, attach=False)
    c = r["counters"]
    assert r["stub_calls"] == [1] * 9 and r["results"] == [0] * 9
    assert c["probes"] == 0 and c["probe_errors"] == 3   # all_reduce, group_start, group_end


def test_bad_environment_keeps_defaults_and_says_why(sock, heapname, tmp_path):
    dump = tmp_path / "dump.txt"
    r, _ = child(sock, heapname, {"HEAPC_NCCL_PROBE": "frobnicate",
                                  "HEAPC_NCCL_PRELOAD_DUMP": str(dump)})
    assert r["probe_ops"] == ["group_start", "group_end"]
    assert "frobnicate" in r["last_error"] and "HEAPC_NCCL_PROBE" in r["last_error"]
    text = dump.read_text()
    assert "all_reduce=2 " in text and "group_end=1 " in text and "frobnicate" in text, text


def test_register_switch_registers_at_the_first_heap_collective(sock, heapname):
    """Issue 32: HEAPC_NCCL_REGISTER=1 registers the bound heap as windows at
    the first collective on a heap buffer, with that call's communicator
    (the stand-in "torch" passes 0x1), once; the detach deregisters."""
    r, _ = child(sock, heapname, {"HEAPC_NCCL_REGISTER": "1"})
    w = r["windows"]
    assert (w["reg"], w["dereg"], w["comm"], w["flags"]) == (1, 0, 0x1, 1), w
    assert w["buf"] == w["base"] and w["size"] == w["mapped"] > 0, w
    assert r["results"] == [0] * 9 and r["last_error"] == ""
    c = r["windows_closed"]
    assert (c["reg"], c["dereg"]) == (1, 1), "the detach deregisters the window"


def test_register_switch_off_and_bad_value(sock, heapname):
    r, _ = child(sock, heapname, {})
    assert r["windows"]["reg"] == 0, "no registration unless asked"
    r, _ = child(sock, heapname + "-b", {"HEAPC_NCCL_REGISTER": "yes"})
    assert r["windows"]["reg"] == 0
    assert "HEAPC_NCCL_REGISTER" in r["last_error"] and "yes" in r["last_error"], r["last_error"]


def test_register_switch_nccl_refuses(sock, heapname):
    r, _ = child(sock, heapname, {"HEAPC_NCCL_REGISTER": "1", "NCCL_STUB_FAIL": "ncclCommWindowRegister"})
    assert r["windows"]["reg"] == 0 and r["results"] == [0] * 9, "the collective goes on"
    assert "HEAPC_NCCL_REGISTER" in r["last_error"] and "ncclCommWindowRegister" in r["last_error"], \
        r["last_error"]
