"""torch_symm_probe.py - PyTorch's own symmetric memory, the anchor heapd's
alloc is compared with on the GPU machine (issue 16's table): with a world of
one process,

  - symm_empty_us            torch.distributed._symmetric_memory.empty(4 KiB)
                             then del (median of 200);
  - symm_empty_rendezvous_us empty(4 KiB) + rendezvous(group) then del
                             (median of 20: each rendezvous exchanges handles);
  - cuda_empty_cached_us     torch.empty(4 KiB) + del on the caching
                             allocator's cached path (median of 2000), the
                             same process, for the same table.

    python3 scripts/torch_symm_probe.py OUT.json
Prints one "symm NAME VALUE" line per figure; exits 0 with "skipped: ..."
when torch, a GPU or symmetric memory is missing (older torch, no NCCL)."""
import json
import os
import sys
import tempfile

from probe_util import median_us

try:
    import torch
    import torch.distributed as dist
except Exception as e:  # noqa: BLE001
    print(f"skipped: torch not importable ({e})")
    sys.exit(0)
if not torch.cuda.is_available():
    print("skipped: torch sees no GPU")
    sys.exit(0)
try:
    import torch.distributed._symmetric_memory as symm_mem
except Exception as e:  # noqa: BLE001
    print(f"skipped: torch {torch.__version__} has no symmetric memory ({e})")
    sys.exit(0)




def main():
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    fd, path = tempfile.mkstemp(prefix="symm-store-")
    os.close(fd)
    os.unlink(path)
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=0, world_size=1,
                            device_id=dev)
    group = dist.group.WORLD
    res = {"torch_version": torch.__version__}
    try:
        size = 4 << 10
        x = torch.empty(size, dtype=torch.uint8, device=dev)  # warm the cache
        del x

        def cached():
            y = torch.empty(size, dtype=torch.uint8, device=dev)
            del y

        res["cuda_empty_cached_us"] = median_us(cached, 2000)

        def empty():
            y = symm_mem.empty(size, dtype=torch.uint8, device=dev)
            del y

        empty()  # the first call sets the allocator up
        res["symm_empty_us"] = median_us(empty, 200)

        def empty_rdv():
            y = symm_mem.empty(size, dtype=torch.uint8, device=dev)
            symm_mem.rendezvous(y, group=group.group_name)
            del y

        empty_rdv()
        res["symm_empty_rendezvous_us"] = median_us(empty_rdv, 20)
    finally:
        dist.destroy_process_group()
        if os.path.exists(path):
            os.unlink(path)
    for k, v in res.items():
        print(f"symm {k} {v}")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(res, f, indent=1)


try:
    main()
except Exception as e:  # noqa: BLE001
    print(f"skipped: symmetric memory did not run here ({type(e).__name__}: {e})")
    sys.exit(0)
