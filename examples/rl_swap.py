#!/usr/bin/env python3
"""rl_swap.py - an RL-style job that gives its heap's memory back between
training phases and gets it back at the same addresses (issue 30).

    python3 examples/rl_swap.py --nproc 2 --cpu         # spawns 2 ranks (host backend)
    RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=r1 python3 examples/rl_swap.py &
    RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=r1 python3 examples/rl_swap.py
    torchrun --nproc_per_node=2 --standalone examples/rl_swap.py

The training state lives on heapd's heap: an MLP's weights and momentum, the
rank's gradient block (averaged across the node's ranks through peer views)
and a big buffer of the rank's samples. Each round trains --steps steps,
then

    with heap.released(mode="host"):
        ...   # the rollout phase: the heap's memory is free for other use

heapd copies the heap's content into host memory it owns and gives the
chunks back (cudaMemGetInfo's free grows by them on a GPU; on the host
backend the shared memory goes), the phase allocates a plain tensor as big
as the heap was (the inference engine's KV cache, say) and uses it, and at
the end of the block heapd refills the chunks and maps them where they
were. Training goes on with the same tensor objects: every rank checks that
their content is bit for bit what it was before the release. Rank 0
prints `round R step S loss L`, `released: resident 0 of N bytes, host copy
H bytes`, `rollout: B bytes of plain memory`, and every rank `rank R:
restored, content unchanged (K tensors, N bytes)`; at the end `final loss
L (initial I)` and heapd's `releases X restores Y`. HEAPD_SOCKET names
heapd's socket. Exit 0 when every check held.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

import heapd  # noqa: E402

LR, MOM = 0.05, 0.9


def model_of():
    torch.manual_seed(1234)                          # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))


def batch(step, rank, dev):
    g = torch.Generator().manual_seed(100003 * step + rank)
    x = torch.randn(128, 32, generator=g)
    w = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    return x.to(dev), (x @ w).tanh().to(dev)


def train_step(heap, model, params, w, mom, grad, samples, step, rank, local):
    """One step: the rank's batch into the sample buffer, forward/backward,
    the node's gradients averaged through peer views, momentum SGD on the
    heap's weights. Returns the node's mean loss."""
    n = w.numel()
    torch.nn.utils.vector_to_parameters(w, params)
    x, y = batch(step, rank, w.device)
    slot = samples[step % samples.shape[0]]
    slot[:x.numel()].copy_(x.flatten())              # the buffer is used, not just held
    loss = torch.nn.functional.mse_loss(model(slot[:x.numel()].view_as(x)), y)
    model.zero_grad()
    loss.backward()
    grad[:n].copy_(torch.nn.utils.parameters_to_vector([p.grad for p in params]))
    grad[n] = loss.detach()
    if heap.device.type == "cuda":
        torch.cuda.synchronize()                     # the collect is a barrier of the CPUs only
    heap.collect()                                   # every rank's gradient is written
    tot = sum(heap.peer(grad, r) if r != rank else grad for r in local) / len(local)
    heap.collect()                                   # every rank read every gradient
    mom.mul_(MOM).add_(tot[:n])
    w.sub_(LR * mom)
    return float(tot[n])


def rollout(heap, nbytes, say):
    """The phase that needs the memory: a plain tensor as big as the heap was,
    written and read (on a GPU the driver gives it the memory the heap gave
    back)."""
    free0 = torch.cuda.mem_get_info()[0] if heap.device.type == "cuda" else None
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=heap.device)
    buf.fill_(1.5)
    total = float(buf[::4096].sum())
    say(f"rollout: {nbytes} bytes of plain memory (checksum {total:g})"
        + (f", device free before it {free0}" if free0 is not None else ""), flush=True)
    del buf


def run(args):
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    dev = torch.device("cuda", torch.cuda.current_device()) if args.cuda else torch.device("cpu")
    heap = heapd.Heap.from_env(name=args.heap, socket=args.socket, chunk_size=args.chunk, device=dev)
    say = print if rank == 0 else (lambda *a, **k: None)
    model = model_of()
    if args.cuda:
        model = model.to(dev)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    w = heap.zeros(n, dtype=torch.float32, name="w")
    mom = heap.zeros(n, dtype=torch.float32, name="momentum")
    grad = heap.zeros(n + 1, dtype=torch.float32)
    samples = heap.zeros(args.buffer // (4 * 128 * 32), 128 * 32, dtype=torch.float32)
    w.copy_(torch.nn.utils.parameters_to_vector(params))
    local = heap.local_ranks()
    ours = {"w": w, "momentum": mom, "grad": grad, "samples": samples}
    step, first, loss, ok = 0, None, None, True
    for rnd in range(args.rounds):
        for _ in range(args.steps):
            loss = train_step(heap, model, params, w, mom, grad, samples, step, rank, local)
            first = loss if first is None else first
            step += 1
        say(f"round {rnd} step {step} loss {loss:.6f}", flush=True)
        if rnd == args.rounds - 1:
            break
        before = {k: t.clone() for k, t in ours.items()}     # plain memory, for the check
        ptrs = {k: t.data_ptr() for k, t in ours.items()}
        was = heap.status().resident
        with heap.released(mode="host"):
            s, st = heap.status(), heapd.stats(heap.name, args.socket)
            say(f"released: resident {s.resident} of {was} bytes, host copy "
                f"{st['host_copy_bytes']} bytes, state {st['state']}", flush=True)
            rollout(heap, max(was, 1 << 20), say)
        same = all(torch.equal(t, before[k]) and t.data_ptr() == ptrs[k] for k, t in ours.items())
        nb = sum(t.numel() * t.element_size() for t in ours.values())
        print(f"rank {rank}: restored, {'content unchanged' if same else 'CONTENT CHANGED'} "
              f"({len(ours)} tensors, {nb} bytes)", flush=True)
        ok = ok and same
    st = heapd.stats(heap.name, args.socket)
    say(f"final loss {loss:.6f} (initial {first:.6f}); releases {st['releases']} "
        f"restores {st['restores']}", flush=True)
    heap.collect()
    heap.close()
    return 0 if ok and loss < first else 1


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=0, help="spawn N ranks here (no launcher)")
    ap.add_argument("--rounds", type=int, default=3, help="training phases (a release between two)")
    ap.add_argument("--steps", type=int, default=20, help="steps per round")
    ap.add_argument("--buffer", type=int, default=16 << 20, help="bytes of the heap's sample buffer")
    ap.add_argument("--socket", default=None, help="heapd's socket (default $HEAPD_SOCKET)")
    ap.add_argument("--heap", default=None, help="heap name (default $HEAPD_HEAP, else from the launcher)")
    ap.add_argument("--chunk", default="4M", help="heap chunk size")
    ap.add_argument("--cpu", action="store_true", help="host memory even with a GPU")
    a = ap.parse_args(argv)
    a.cuda = torch.cuda.is_available() and not a.cpu
    if a.cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return a


def main(argv):
    args = parse(argv)
    if args.nproc:
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", f"rlswap{os.getpid()}")
        rest = [a for i, a in enumerate(argv) if not a.startswith("--nproc")
                and not (i and argv[i - 1] == "--nproc")]
        kids = []
        for r in range(args.nproc):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.nproc),
                       LOCAL_WORLD_SIZE=str(args.nproc), TORCHELASTIC_RUN_ID=run_id)
            kids.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + rest, env=env))
        return max(k.wait() for k in kids)
    return run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
