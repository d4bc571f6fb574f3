#!/usr/bin/env python3
"""torch_bench.py - heapd's Python package against torch on one GPU (issue 17).

    HEAPD_SOCKET=... python3 bench/torch_bench.py [--json OUT] [--build build-gpu] [--host]

Figures (medians, us per call; one line each, "torch_bench NAME VALUE"):
  alloc:  heapd.empty (tensor on the heap) and heapc_alloc alone, against
          torch.empty cached (the caching allocator's hit) and uncached
          (torch.cuda.empty_cache() before each: a cudaMalloc), at 4K, 2M, 64M;
  probe:  the status page from Python (heap.device_free(), heap.status())
          against torch.cuda.memory_reserved()+memory_allocated() and
          torch.cuda.mem_get_info();
  nccl:   dist.all_reduce of 1 float (world 1, NCCL): raw, under LD_PRELOAD of
          libheapc_nccl_preload.so (skip, and probe on all_reduce), and
          Python-level wrap_collectives with the probe - each in its own
          process, under a timeout.
--host: the CPU subset (host-backend heapd, CPU tensors, no NCCL part), for
scripts/gpu.sh's dry run. Exit 0 when every part ran."""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def med(fn, n, setup=None):
    ts = []
    for _ in range(n):
        if setup:
            setup()
        t = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t)
    ts.sort()
    return ts[len(ts) // 2] / 1000.0


def part_alloc(res, host, sock):
    import torch
    import heapd
    from heapd import _lib as L
    dev = "cpu" if host else "cuda"
    sizes = {"4K": 4 << 10, "2M": 2 << 20, "64M": 64 << 20}
    with heapd.Heap(f"torch-bench-{os.getpid()}", 0, 1, sock, chunk_size="256M", device=dev) as h:
        for name, size in sizes.items():
            n = 200 if size < (64 << 20) else 40
            ts = []

            def one():
                ts.append(h.empty(size, dtype=torch.uint8))
            res[f"heapd_empty_us_{name}"] = med(one, n)
            for t in ts:
                h.free(t)
            ts.clear()
            h.collect()
            p, o = ctypes.c_void_p(), ctypes.c_uint64()
            offs = []

            def raw():
                L.alloc(h._c, size, ctypes.byref(p), ctypes.byref(o))
                offs.append(o.value)
            res[f"heapc_alloc_us_{name}"] = med(raw, n)
            for x in offs:
                L.free(h._c, x)
            h.collect()

            def cached():
                y = torch.empty(size, dtype=torch.uint8, device=dev)
                del y
            cached()
            res[f"torch_empty_cached_us_{name}"] = med(cached, n)
            if not host:
                keep = []
                res[f"torch_empty_uncached_us_{name}"] = med(
                    lambda: keep.append(torch.empty(size, dtype=torch.uint8, device=dev)),
                    min(n, 40), setup=lambda: (keep.clear(), torch.cuda.empty_cache()))
                keep.clear()
                torch.cuda.empty_cache()
        # probe
        res["probe_page_device_free_us"] = med(h.device_free, 5000)
        res["probe_page_status_us"] = med(h.status, 5000)
        st = L.Status()
        sc, bp = L.status, ctypes.byref(st)
        res["probe_page_raw_ctypes_us"] = med(lambda: sc(h._c, bp), 5000)
        if not host:
            res["probe_torch_reserved_plus_allocated_us"] = med(
                lambda: torch.cuda.memory_reserved() + torch.cuda.memory_allocated(), 5000)
            res["probe_torch_mem_get_info_us"] = med(torch.cuda.mem_get_info, 2000)


NCCL_CHILD = r'''
import os, sys, time, json
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import torch, torch.distributed as dist
mode, sock = sys.argv[2], sys.argv[3]
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
import heapd, heapd.torch as ht
h = heapd.Heap("nccl-bench-%d" % os.getpid(), 0, 1, sock)
x = h.zeros(1, dtype=torch.float32)
if mode == "wrap":
    ht.wrap_collectives(h, probe=["all_reduce"], threshold=1)
for _ in range(200):
    dist.all_reduce(x)
torch.cuda.synchronize()
ts = []
for i in range(3000):
    t = time.perf_counter_ns(); dist.all_reduce(x); ts.append(time.perf_counter_ns() - t)
    if i % 100 == 99:
        torch.cuda.synchronize()
torch.cuda.synchronize()
ts.sort()
pre = ht.preload()
print("RESULT " + json.dumps({"us": ts[len(ts) // 2] / 1000.0,
      "calls": pre.counters()["calls"]["all_reduce"] if pre else None,
      "probes": pre.counters()["probes"] if pre else None}), flush=True)
dist.destroy_process_group()
h.close()
'''


def part_nccl(res, build, sock):
    pre = os.path.join(build, "libheapc_nccl_preload.so")
    runs = [("raw", {}, "raw"), ("preload_skip", {"LD_PRELOAD": pre}, "raw"),
            ("preload_probe", {"LD_PRELOAD": pre, "HEAPC_NCCL_PROBE": "all_reduce",
                               "HEAPC_NCCL_FREE_MIN": "1"}, "raw"),
            ("python_wrap_probe", {}, "wrap")]
    ok = True
    for i, (name, env, mode) in enumerate(runs):
        e = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(31000 + os.getpid() % 500 + i))
        e.update(env)
        try:
            p = subprocess.run([sys.executable, "-c", NCCL_CHILD, ROOT, mode, sock], env=e,
                               capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            print(f"torch_bench: all_reduce {name}: timed out after 60 s")
            ok = False
            continue
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not line:
            print(f"torch_bench: all_reduce {name}: exit {p.returncode}\n{p.stderr[-2000:]}")
            ok = False
            continue
        r = json.loads(line[0][7:])
        res[f"all_reduce_us_{name}"] = r["us"]
        if env.get("LD_PRELOAD"):
            res[f"all_reduce_intercepted_calls_{name}"] = r["calls"]
            res[f"all_reduce_probes_{name}"] = r["probes"]
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--build", default=os.environ.get("HEAPD_BUILD", "build-gpu"))
    ap.add_argument("--host", action="store_true")
    a = ap.parse_args()
    sock = os.environ.get("HEAPD_SOCKET")
    if not sock:
        print("torch_bench: set HEAPD_SOCKET to a running heapd's socket")
        return 2
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    os.environ.setdefault("HEAPC_LIB", os.path.join(build, "libheapc.so"))
    import torch
    if not a.host and not torch.cuda.is_available():
        print("torch_bench: torch sees no GPU (use --host for the CPU subset)")
        return 2
    if not a.host:
        torch.cuda.set_device(0)
        torch.cuda.synchronize()
    res = {"torch": torch.__version__, "host": a.host}
    part_alloc(res, a.host, sock)
    ok = True
    if not a.host:
        ok = part_nccl(res, build, sock)
    for k, v in res.items():
        print(f"torch_bench {k} {v}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
