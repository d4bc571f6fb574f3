"""torch_probe.py - the anchors heapd is compared with on the GPU machine:
PyTorch's caching allocator (torch.empty + del, cached) for sizes 4 KiB to
1 GiB, and the memory probes trainers use: torch.cuda.mem_get_info() (a
driver call) and memory_reserved() + memory_allocated() (seed 000's probe,
which walks the allocator's statistics), with few and with many segments.

    python3 scripts/torch_probe.py OUT.json
Prints one line per figure; exits 0 with "skipped: ..." when torch or a GPU
is missing."""
import json
import sys

from probe_util import median_us

try:
    import torch
except Exception as e:  # noqa: BLE001
    print(f"skipped: torch not importable ({e})")
    sys.exit(0)
if not torch.cuda.is_available():
    print("skipped: torch sees no GPU")
    sys.exit(0)




dev = torch.device("cuda")
torch.cuda.synchronize()
res = {}
res["mem_get_info_us"] = median_us(torch.cuda.mem_get_info, 2000)
res["reserved_plus_allocated_us_few_segments"] = median_us(
    lambda: (torch.cuda.memory_reserved(), torch.cuda.memory_allocated()), 2000)
# Many segments: keep blocks of many sizes alive (expandable segments off).
keep = [torch.empty((i % 64 + 1) * (2 << 20), dtype=torch.uint8, device=dev) for i in range(400)]
torch.cuda.synchronize()
res["segments"] = len(torch.cuda.memory_snapshot())
res["reserved_plus_allocated_us_many_segments"] = median_us(
    lambda: (torch.cuda.memory_reserved(), torch.cuda.memory_allocated()), 500)
del keep
torch.cuda.empty_cache()
sizes = {"4K": 4 << 10, "2M": 2 << 20, "64M": 64 << 20, "256M": 256 << 20, "1G": 1 << 30}
res["torch_empty_del_cached_us"] = {}
for name, size in sizes.items():
    x = torch.empty(size, dtype=torch.uint8, device=dev)  # warm the cache
    del x

    def one(size=size):
        y = torch.empty(size, dtype=torch.uint8, device=dev)
        del y

    res["torch_empty_del_cached_us"][name] = median_us(one, 500)
for k, v in res.items():
    print(f"torch {k} {v}")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1)
