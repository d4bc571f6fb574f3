#!/usr/bin/env python3
"""train_torch.py - a small model trained with torch.distributed, its
communication buffers on heapd's symmetric heap.

    python3 -m torch.distributed.run --nproc_per_node=2 --standalone --redirects 1 --tee 1 examples/train_torch.py
                                                              # NCCL on GPUs, gloo on CPUs
    python3 examples/train_torch.py --nproc 2                 # no torchrun: spawns the ranks

Each step: forward/backward of an MLP on synthetic data; the gradients are
packed into a flat buffer on the heap and all-reduced (dist.all_reduce on a
heap tensor); each rank then reads the next rank's buffer through a peer view
(heap.peer, between two heap.collect() barriers) and checks that it holds the
same reduced gradients; a per-step scratch tensor is allocated and freed (in
a different order on each rank), and the heap collects every --collect-every steps. heapd's stats are printed
at the end. HEAPD_SOCKET names heapd's socket (default /run/heapd/heapd.sock).
Exit 0 when every rank trained and every check held.
"""
import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import heapd  # noqa: E402


def train(args):
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available() and not args.cpu
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    heap = heapd.Heap.from_env(name=args.heap, socket=args.socket, chunk_size=args.chunk,
                               device=dev)           # --cpu on a GPU node: host memory on purpose
    if (heap.backend == "cuda") != cuda:
        raise SystemExit(f"rank {rank}: heapd's backend is {heap.backend!r} but this rank runs "
                         f"on {dev.type}: use a cuda heapd with GPUs, a host heapd with --cpu")

    torch.manual_seed(1234)                         # same model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    grads = heap.zeros(n, dtype=torch.float32)        # the all-reduce buffer, on the heap
    lossbuf = heap.zeros(1, dtype=torch.float32)
    local = heap.local_ranks()
    nxt = (rank + 1) % world
    g = torch.Generator().manual_seed(rank)
    w_true = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    rng = random.Random(rank)
    scratch = []
    peer_checks = 0
    first = last = None
    t0 = time.time()
    for step in range(args.steps):
        x = torch.randn(64, 32, generator=g)
        y = x @ w_true + 0.01 * torch.randn(64, 1, generator=g)
        x, y = x.to(dev), y.to(dev)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        off = 0
        for p in params:                             # pack
            grads[off:off + p.numel()].copy_(p.grad.reshape(-1))
            off += p.numel()
        dist.all_reduce(grads)
        grads.div_(world)
        lossbuf.fill_(loss.item())
        dist.all_reduce(lossbuf)
        if nxt in local and nxt != rank:
            if cuda:                                 # the collect is a barrier of the CPUs,
                torch.cuda.current_stream().synchronize()   # not of the devices (issue 18)
            heap.collect()                           # every rank's buffer is reduced
            peer = heap.peer(grads, nxt)
            if not torch.allclose(peer.to(dev), grads):
                raise SystemExit(f"rank {rank}: step {step}: rank {nxt}'s reduced gradients "
                                 "differ from this rank's")
            peer_checks += 1
            heap.collect()                           # read before anyone overwrites
        off = 0
        for p in params:                             # unpack
            p.grad.copy_(grads[off:off + p.numel()].view_as(p))
            off += p.numel()
        opt.step()
        # Scratch on the heap, freed in a rank-dependent order (deferred).
        scratch.append(heap.empty(256, 64, dtype=torch.float32))
        if len(scratch) >= 4:
            rng.shuffle(scratch)
            for t in scratch:
                heap.free(t)
            scratch = []
        if (step + 1) % args.collect_every == 0:
            heap.collect()
        lv = float(lossbuf) / world
        first = lv if first is None else first
        last = lv
    if cuda:
        torch.cuda.synchronize()
    heap.collect()
    st = heap.stats()
    dt = time.time() - t0
    print(f"rank {rank}/{world}: {args.steps} steps in {dt:.2f} s on {dev.type}, loss "
          f"{first:.4f} -> {last:.4f}, peer checks {peer_checks}", flush=True)
    if rank == 0:
        print(f"heapd stats: heap {st['name']!r} backend {st['backend']} mapped {st['mapped']} "
              f"live {st['live_bytes']} released {st['released_bytes']} free {st['free_bytes']} "
              f"collects {st['collects']} growths {st['growths']} allocations {st['next_seq']}; "
              f"client {st['client']}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    heap.close()
    if not last < first:
        raise SystemExit(f"rank {rank}: the loss did not go down ({first} -> {last})")
    return 0


def _spawned(r, world, port, argv):
    os.environ.update({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": f"spawn{port}"})
    sys.exit(train(parse(argv)))


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=0, help="spawn N ranks here (no torchrun)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--collect-every", type=int, default=10)
    ap.add_argument("--socket", default=None, help="heapd's socket (default $HEAPD_SOCKET)")
    ap.add_argument("--heap", default=None, help="heap name (default from the launcher)")
    ap.add_argument("--chunk", default="8M", help="heap chunk size")
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU even with a GPU")
    return ap.parse_args(argv)


def main(argv):
    args = parse(argv)
    if "RANK" in os.environ or args.nproc == 0:
        if "RANK" not in os.environ:
            print("train_torch.py: not under torchrun and no --nproc: running 1 rank",
                  file=sys.stderr)
            args.nproc = 1
        else:
            return train(args)
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spawned, args=(r, args.nproc, port, argv)) for r in range(args.nproc)]
    for p in procs:
        p.start()
    rc = 0
    for r, p in enumerate(procs):
        p.join()
        if p.exitcode != 0:
            print(f"train_torch.py: rank {r} exited with {p.exitcode}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
