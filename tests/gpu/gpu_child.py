"""One rank of a GPU test case (tests/gpu/test_torch_gpu.py runs these as
separate processes: CUDA does not survive fork, and the allocator route must
be installed before the first CUDA tensor of a fresh process).

    python3 gpu_child.py CASE RANK WORLD SOCKET HEAP
Prints "RESULT <json>" and exits 0, or raises (exit 1)."""
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

import heapd  # noqa: E402
import heapd.torch as ht  # noqa: E402

case, rank, world, sock, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
out = {"case": case, "rank": rank}


def tensors():
    torch.cuda.set_device(0)
    with heapd.Heap(name, rank, world, sock) as h:
        out["backend"] = h.backend
        x = h.zeros(1024, 256, dtype=torch.float32)
        y = h.empty(3, 5, dtype=torch.bfloat16)
        out["device"] = str(x.device)
        out["is_cuda"] = x.is_cuda and y.is_cuda
        x.add_(2.5)
        out["sum"] = float(x.sum())
        out["offsets"] = [h.offset(x), h.offset(y)]
        s = h.status()
        out["device_free"], out["device_total"] = s.device_free, s.device_total
        big = h.zeros(100 << 20, dtype=torch.uint8)        # over a 64 MiB chunk: growth
        big[-1] = 7
        out["big_last"] = int(big[-1])
        out["growths"] = h.status().growths
        h.free(x); h.free(y); h.free(big)
        h.collect()
        out["live_after"] = h.status().rank_held


def peer():
    torch.cuda.set_device(0)
    with heapd.Heap(name, rank, world, sock) as h:
        x = h.zeros(4096, dtype=torch.float32)
        h.collect()
        other = 1 - rank
        px = h.peer(x, other)
        out["peer_device"] = str(px.device)
        # a torch op on this process writes into the other process's tensor
        torch.mul(torch.arange(4096, device=px.device, dtype=torch.float32), float(rank + 1), out=px)
        torch.cuda.synchronize()
        h.collect()
        want = torch.arange(4096, device=x.device, dtype=torch.float32) * float(other + 1)
        out["saw_peer_write"] = bool(torch.equal(x, want))
        h.collect()


def alloc_route():
    # Before anything initialises torch's CUDA state (set_device does: it
    # initialises the caching allocator, which can then not be swapped).
    ht.install_allocator()
    torch.cuda.set_device(0)
    outside0 = torch.empty(1000, device="cuda")  # the driver's pool, not the heap
    h = heapd.Heap(name, rank, world, sock)
    base, mapped_va = h.ptr(0), None
    sizes = [4096, 1 << 20, 12345, 3 << 20, 64, 256 << 10] * 5
    with ht.use_heap(h):
        ts = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]
        y = ts[1].float() * 2                     # a torch op's output lands on the heap too
        first = [t.data_ptr() - base for t in ts] + [y.data_ptr() - base]
        # free in a rank-dependent order (torch frees -> deferred heap frees)
        order = list(range(len(ts)))
        random.Random(rank + 17).shuffle(order)
        for i in order:
            ts[i] = None
        del y
        h.collect()                               # same point on every rank
        again = [torch.empty(s, dtype=torch.uint8, device="cuda").data_ptr() - base for s in sizes[:6]]
    outside1 = torch.empty(1000, device="cuda")
    out["first"], out["again"] = first, again
    out["outside_not_on_heap"] = all(not (0 <= t.data_ptr() - base < (64 << 30))
                                     for t in (outside0, outside1))
    out["counters"] = ht.allocator_counters()
    out["mapped"] = h.mapped
    del outside0, outside1
    h.collect()
    # Different sizes on the two ranks: the rank that asks second is refused
    # (ERR_ASYMMETRY), gets driver memory, and the block raises. The heap is
    # poisoned (issue 31): every rank's next call - here a collect, which the
    # first rank may already wait in - raises the same AsymmetryError.
    out["asym"] = None
    try:
        with ht.use_heap(h):
            z = torch.empty(4096 * (rank + 1), dtype=torch.uint8, device="cuda")
            z.fill_(1)
            torch.cuda.synchronize()
    except heapd.AsymmetryError as e:
        out["asym"] = [e.n, e.ranks, e.sizes]
    out["poisoned"] = None
    try:
        h.collect()
    except heapd.AsymmetryError as e:
        out["poisoned"] = [e.n, e.ranks, e.sizes]
    h.close()
    del mapped_va


def nccl():
    import torch.distributed as dist
    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl", rank=0, world_size=1)
    with heapd.Heap(name, rank, world, sock) as h:
        pre = ht.preload()
        out["preload"] = pre is not None
        x = h.zeros(1 << 20, dtype=torch.float32)
        x.fill_(3.0)
        dist.all_reduce(x)
        g = h.zeros(1 << 20, dtype=torch.float32)
        dist.all_gather_into_tensor(g, x)
        torch.cuda.synchronize()
        out["values_ok"] = float(x[0]) == 3.0 and float(g[-1]) == 3.0
        if pre:
            out["counters"] = pre.counters()
            out["probe_ops"] = pre.probe_ops()
            out["missing"] = pre.missing()
    dist.destroy_process_group()


def trim():
    """Issue 30 on the GPU: a 256 MiB tensor at the top of the heap, freed
    on its stream (released at once: stream-ordered reuse) while a kernel
    still writes it; trim waits for that work, unmaps its chunks on every
    rank, the device's free memory grows by them, the small tensor below
    keeps its content, and a new 256 MiB tensor grows the heap back at the
    same offset."""
    torch.cuda.set_device(0)
    with heapd.Heap(name, rank, world, sock, chunk_size="64M", initial_size="64M") as h:
        keep = h.full((1024,), float(rank + 1))
        big = h.empty(256 << 20, dtype=torch.uint8)
        off = h.offset(big)
        big.fill_(5)                                  # queued on the current stream
        h.free(big)                                   # on that stream: the fill may still run
        del big
        h.collect()                                   # a barrier: both ranks' releases are in
        mapped0 = h.mapped
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info()[0]
        h.collect()                                   # both measured before either trims
        out["trimmed"] = h.trim()
        h.collect()                                   # both ranks unmapped
        out["free_growth"] = torch.cuda.mem_get_info()[0] - free0
        out["mapped"] = (mapped0, h.mapped)
        out["keep_ok"] = float(keep.sum()) == 1024.0 * (rank + 1)
        x = h.empty(256 << 20, dtype=torch.uint8)     # grows back
        x.fill_(9)
        torch.cuda.synchronize()
        out["regrow_same_offset"] = h.offset(x) == off
        out["regrow_ok"] = int(x[-1]) == 9 and int(x[0]) == 9
        out["trims"] = h.stats()["trims"]
        del x, keep


def autotrim():
    """Issue 30's automatic trim on the GPU: trim_threshold 128M; a 256 MiB
    tensor freed by both ranks; the next allocation trims first, with no
    trim() call, and the device's free memory grows by both ranks' chunks."""
    torch.cuda.set_device(0)
    with heapd.Heap(name, rank, world, sock, chunk_size="64M", initial_size="64M",
                    trim_threshold="128M") as h:
        keep = h.full((1024,), float(rank + 1))
        big = h.empty(256 << 20, dtype=torch.uint8)
        big.fill_(5)
        h.free(big)
        del big
        torch.cuda.synchronize()
        h.collect()                                   # both ranks' releases are in
        mapped0 = h.mapped
        free0 = torch.cuda.mem_get_info()[0]
        h.collect()                                   # both measured before either trims
        small = h.zeros(16)                           # trims first
        h.collect()                                   # both ranks unmapped
        out["free_growth"] = torch.cuda.mem_get_info()[0] - free0
        out["mapped"] = (mapped0, h.mapped)
        out["keep_ok"] = float(keep.sum()) == 1024.0 * (rank + 1)
        out["trims"] = h.stats()["trims"]
        out["threshold"] = h.trim_threshold
        del small, keep


def release_named():
    """Issue 30's release of named blocks on the GPU: only the 256 MiB
    tensor "kv" goes (its 4 chunks, on both ranks: the device's free memory
    grows by them); the tensor "w" in the first chunk is used while
    released; restore() brings kv back bit for bit at its address."""
    torch.cuda.set_device(0)
    with heapd.Heap(name, rank, world, sock, chunk_size="64M", initial_size="64M") as h:
        w = h.full((1024,), float(rank + 1), name="w")
        kv = h.empty(256 << 20, dtype=torch.uint8, name="kv")
        kv.fill_(5 + rank)
        addr = kv.data_ptr()
        torch.cuda.synchronize()
        h.collect()
        free0 = torch.cuda.mem_get_info()[0]
        h.collect()                                   # both measured before either releases
        h.release("host", names=["kv"])
        h.collect()                                   # collects work while released: both released
        out["free_growth"] = torch.cuda.mem_get_info()[0] - free0
        out["resident"] = h.stats()["resident_bytes"]
        w += 1                                        # the rest of the heap works
        torch.cuda.synchronize()
        out["w_ok"] = float(w.sum()) == 1024.0 * (rank + 2)
        h.restore()
        out["kv_ok"] = int(kv.min()) == 5 + rank and int(kv.max()) == 5 + rank and kv.data_ptr() == addr
        del w, kv


{"tensors": tensors, "peer": peer, "alloc_route": alloc_route, "nccl": nccl, "trim": trim,
 "autotrim": autotrim, "release_named": release_named}[case]()
print("RESULT " + json.dumps(out), flush=True)
