"""alloc_table.py - issue 16's table: one allocation's cost on every path,
side by side, from the JSON files of one gpu.sh run (or a make bench run):

    python3 scripts/alloc_table.py DIR
DIR holds rtt_bench.json (heapd on the request ring and on the socket, the raw
socket ping-pong, 1-8 clients, heapd's idle CPU) and, when present,
torch.json (torch.empty cached), symm.json (PyTorch's symmetric memory) and
gpu_bench.json (cudaMalloc). Prints a markdown table; a missing file's rows
say "not measured". Exit 0 unless rtt_bench.json is missing or unreadable."""
import json
import os
import sys


def load(d, name):
    try:
        with open(os.path.join(d, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    rtt = load(d, "rtt_bench.json")
    if not rtt or "rtt" not in rtt:
        print(f"alloc_table: no rtt_bench.json in {d}")
        return 1
    print("| path (4 KiB) | clients | p50 us | p99 us | calls/s (all clients) | p50 / ping-pong |")
    print("|---|---|---|---|---|---|")
    for r in rtt["rtt"]:
        c, pp = r["clients"], r["pingpong_p50_us"]
        print(f"| heapd, request ring | {c} | {r['ring_p50_us']:.2f} | {r['ring_p99_us']:.2f} | "
              f"{r['ring_ops_per_s']:.0f} | {r['ring_p50_us'] / pp:.2f} |")
        print(f"| heapd, socket | {c} | {r['heapd_p50_us']:.2f} | {r['heapd_p99_us']:.2f} | "
              f"{r['heapd_ops_per_s']:.0f} | {r['heapd_p50_us'] / pp:.2f} |")
        print(f"| raw socket ping-pong (anchor) | {c} | {pp:.2f} | {r['pingpong_p99_us']:.2f} | "
              f"{r['pingpong_ops_per_s']:.0f} | 1.00 |")
    t = load(d, "torch.json")
    v = (t or {}).get("torch_empty_del_cached_us", {}).get("4K")
    print(f"| torch.empty + del, cached | 1 | {v:.2f} | | | |" if v is not None
          else "| torch.empty + del, cached | | not measured | | | |")
    g = load(d, "gpu_bench.json")
    cm = None
    for row in (g or {}).get("rows", []):
        if row.get("size") == 4096:
            cm = row.get("cuda_malloc_us")
    if cm is None and (g or {}).get("rows"):
        row = min(g["rows"], key=lambda x: x.get("size", 1 << 62))
        cm = row.get("cuda_malloc_us")
    print(f"| cudaMalloc (smallest size of gpu_bench) | 1 | {cm:.2f} | | | |" if cm is not None
          else "| cudaMalloc | | not measured | | | |")
    s = load(d, "symm.json") or {}
    for k, label in (("symm_empty_us", "torch symm_mem.empty + del (world 1)"),
                     ("symm_empty_rendezvous_us", "torch symm_mem.empty + rendezvous + del (world 1)")):
        print(f"| {label} | 1 | {s[k]:.2f} | | | |" if k in s else f"| {label} | | not measured | | | |")
    print(f"\nheapd idle: {rtt.get('heapd_idle_cpu_pct', float('nan')):.3f}% of a core with no client, "
          f"{rtt.get('heapd_idle_cpu_pct_8_ring_clients', float('nan')):.3f}% with 8 idle ring clients; "
          f"ring spin {rtt.get('ring_spin_us', '?')} us")
    return 0


sys.exit(main())
