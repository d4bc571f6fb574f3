#!/usr/bin/env python3
"""allreduce_triton.py - a one-shot all-reduce over heapd's symmetric heap:
every rank puts its input into a heap buffer, and one kernel on every rank
reads all local ranks' buffers through the device pointer table
(heap.bases[r] + heap.offset(buf)) and sums them. Checked against a local
sum of every rank's input (and against torch.distributed.all_reduce), timed
beside torch.distributed.all_reduce of the same size.

    python3 examples/allreduce_triton.py --nproc 2              # spawns 2 ranks (one GPU is enough)
    python3 -m torch.distributed.run --nproc_per_node=2 --standalone --redirects 1 --tee 1 examples/allreduce_triton.py
    python3 examples/allreduce_triton.py --nproc 2 --cpu        # no GPU: the same through peer views

On CUDA the kernel is Triton's (needs triton and a cuda-backend heapd); with
--cpu (a host-backend heapd) the same one-shot reduction runs in torch over
the same pointer table's peer views, so the structure is checked without a
GPU. Ordering: the ranks meet at host barriers (the stream is synchronised,
then heap.collect()) before the kernel reads peers and before the buffers are
refilled. Output: one line per rank, and rank 0's figures ("us per call").
"""
import argparse
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import heapd  # noqa: E402

_kernel = None


def triton_kernel():
    """The Triton one-shot all-reduce: out[i] = sum over ranks r of rank r's
    copy of the heap buffer at byte offset `offset`, element i."""
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit
    def allreduce_kernel(bases_ptr, offset, out_ptr, n, WORLD: tl.constexpr,
                         BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        idx = pid * BLOCK + tl.arange(0, BLOCK)
        mask = idx < n
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in tl.static_range(WORLD):
            base = tl.load(bases_ptr + r)                           # int64 address
            p = tl.cast(base + offset, tl.pointer_type(tl.float32))  # rank r's copy
            acc += tl.load(p + idx, mask=mask, other=0.0)
        tl.store(out_ptr + idx, acc, mask=mask)

    def launch(heap, buf, out, block=1024):
        n = buf.numel()
        grid = (triton.cdiv(n, block),)
        allreduce_kernel[grid](heap.bases, heap.offset(buf), out, n, WORLD=heap.world_size,
                               BLOCK=block)
    _kernel = launch
    return launch


def torch_oneshot(heap, buf, out):
    """The same reduction without a GPU: each rank's copy through the table
    (heap.peer is bases[r] + offset as a tensor)."""
    torch.sum(torch.stack([heap.peer(buf, r) for r in range(heap.world_size)]), 0, out=out)


def barrier(heap, cuda):
    if cuda:
        torch.cuda.current_stream().synchronize()   # the collect is a barrier of the CPUs
    heap.collect()


def run(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available() and not args.cpu
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    ref_backend = args.ref_backend or (
        "nccl" if cuda and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", world))
        else "gloo")
    dist.init_process_group(ref_backend)
    heap = heapd.Heap.from_env(socket=args.socket, chunk_size=args.chunk, device=dev)
    if set(heap.local_ranks()) != set(range(world)):
        raise SystemExit("allreduce_triton.py: a one-shot all-reduce through the pointer table "
                         "needs every rank on this node")
    n = args.elements
    buf = heap.empty(n, dtype=torch.float32)               # the symmetric input buffer
    out = torch.empty(n, dtype=torch.float32, device=dev)
    reduce = (lambda: triton_kernel()(heap, buf, out)) if cuda else \
        (lambda: torch_oneshot(heap, buf, out))
    g = torch.Generator().manual_seed(1000 + rank)
    mine = torch.randn(n, generator=g).to(dev)
    want = sum(torch.randn(n, generator=torch.Generator().manual_seed(1000 + r))
               for r in range(world)).to(dev)
    # Correctness: the kernel's sum, a local sum and torch.distributed.all_reduce agree.
    buf.copy_(mine)
    barrier(heap, cuda)
    reduce()
    barrier(heap, cuda)
    ref = mine.clone() if ref_backend == "nccl" or not cuda else mine.cpu()
    dist.all_reduce(ref)
    ok = torch.allclose(out, want, rtol=1e-4, atol=1e-4) and \
        torch.allclose(out.cpu(), ref.cpu(), rtol=1e-4, atol=1e-4)
    # Timing: a call = fill, barrier, reduce, barrier (the buffer may be refilled after).
    def one():
        buf.copy_(mine)
        barrier(heap, cuda)
        reduce()
        barrier(heap, cuda)

    def timed(fn):
        for _ in range(args.warmup):
            fn()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / args.iters * 1e6

    us = timed(one)
    x = mine.clone() if ref_backend == "nccl" or not cuda else mine.cpu()

    def ref_one():
        x.copy_(mine)
        dist.all_reduce(x)
        if cuda and ref_backend == "nccl":
            torch.cuda.current_stream().synchronize()
    ref_us = timed(ref_one)
    print(f"rank {rank}/{world}: one-shot all-reduce of {n} float32 on {dev.type} "
          f"({'triton' if cuda else 'torch'} over heap.bases): "
          f"{'correct' if ok else 'WRONG'}", flush=True)
    if rank == 0:
        print(f"allreduce_triton: {n * 4} bytes, {world} ranks: heap one-shot {us:.1f} us per "
              f"call, torch.distributed.all_reduce ({ref_backend}) {ref_us:.1f} us per call",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    del buf
    heap.close()
    return 0 if ok else 1


def _spawned(r, world, port, argv):
    os.environ.update({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    sys.exit(run(parse(argv)))


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=0, help="spawn N ranks here (no torchrun)")
    ap.add_argument("--elements", type=int, default=1 << 20, help="float32 elements (default 1M)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--socket", default=None, help="heapd's socket (default $HEAPD_SOCKET)")
    ap.add_argument("--chunk", default="64M", help="heap chunk size")
    ap.add_argument("--cpu", action="store_true", help="no GPU: torch over peer views, gloo")
    ap.add_argument("--ref-backend", default=None, help="torch.distributed backend of the "
                    "reference (default nccl with a GPU per rank, else gloo)")
    return ap.parse_args(argv)


def main(argv):
    args = parse(argv)
    if "RANK" in os.environ:
        return run(args)
    nproc = args.nproc or 2
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spawned, args=(r, nproc, port, argv)) for r in range(nproc)]
    for p in procs:
        p.start()
    rc = 0
    for r, p in enumerate(procs):
        p.join()
        if p.exitcode != 0:
            print(f"allreduce_triton.py: rank {r} exited with {p.exitcode}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
