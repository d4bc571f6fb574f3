#!/usr/bin/env python3
"""train_resume.py - training whose whole state lives on heapd's heap, so that
a job killed on every rank resumes from its last committed step (issue 29).

    RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=r1 python3 examples/train_resume.py &
    RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=r1 python3 examples/train_resume.py
    python3 examples/train_resume.py --nproc 2          # the same: spawns the ranks
    torchrun --nproc_per_node=2 examples/train_resume.py

Kill every rank (SIGKILL) and start them again the same way: heapd kept the
heap (persist=), heapd.Heap.from_env re-attaches to it, .resumed is True, the
named tensors come back with heap.tensor(name) and the job goes on from
heap.committed("step") with the same loss curve.

The state: an MLP's weights and its Adam moments, in two slots on the heap
("state0", "state1": weights, first and second moments, flat), the step s's
state in slot s % 2. Step s reads slot s % 2 and writes slot (s + 1) % 2, so
a kill halfway through a step leaves step s intact. Each step: forward and
backward on the rank's batch (drawn from the step and the rank), the
gradients (and the loss) into the rank's "grad" block, a collect (a barrier
of the ranks), every rank averages the local ranks' gradients through peer
views of "grad", the Adam update into the other slot, then
heap.commit("step", s + 1): every rank has written step s + 1. Output, rank
0: `loss S VALUE` (the mean loss of the forward pass on step S's state),
`step S` (committed), `resumed from step S (generation G)`, `initial loss V`.
HEAPD_SOCKET names heapd's socket. No torch.distributed: the heap is the
communication (the ranks of one node). Exit 0 when every step was made.
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

import heapd  # noqa: E402

LR, B1, B2, EPS = 0.01, 0.9, 0.999, 1e-8


def model_of():
    torch.manual_seed(1234)                          # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def batch(step, rank):
    g = torch.Generator().manual_seed(100003 * step + rank)
    x = torch.randn(256, 32, generator=g)
    w = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    return x, x @ w + 0.01 * torch.randn(256, 1, generator=g)


def attach(args, n):
    """The heap (created, or re-attached) and its named tensors."""
    dev = torch.device("cuda", torch.cuda.current_device()) if args.cuda else torch.device("cpu")
    heap = heapd.Heap.from_env(name=args.heap, socket=args.socket, chunk_size=args.chunk,
                               persist=args.persist, device=dev)
    if heap.resumed:
        slots = [heap.tensor(f"state{i}", (3, n), torch.float32) for i in (0, 1)]
        grad = heap.tensor("grad", (n + 1,), torch.float32)
        if heap.committed("step") is not None:
            return heap, slots, grad, heap.committed("step")
    else:                                            # a new heap
        slots = [heap.zeros(3, n, dtype=torch.float32, name=f"state{i}") for i in (0, 1)]
        grad = heap.zeros(n + 1, dtype=torch.float32, name="grad")
    m = model_of()
    slots[0][0].copy_(torch.nn.utils.parameters_to_vector(m.parameters()).to(slots[0].device))
    heap.commit("step", 0)
    return heap, slots, grad, None


def await_peers(heap, limit_s=120):
    """A collect that waits for the ranks still gone: heapd fails a collect
    at once (PeerGoneError, naming the rank) while a rank of the heap has no
    client, so a re-attached rank retries until every rank is back."""
    t0 = time.time()
    while True:
        try:
            return heap.collect()
        except heapd.PeerGoneError:
            if time.time() - t0 > limit_s:
                raise
            time.sleep(0.05)


def train(args):
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    model = model_of()
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    heap, slots, grad, resumed_at = attach(args, n)
    local = heap.local_ranks()
    say = print if rank == 0 else (lambda *a, **k: None)
    step = 0
    if heap.resumed:
        await_peers(heap)
    if resumed_at is not None:
        step = resumed_at
        say(f"resumed from step {step} (generation {heap.generation})", flush=True)
    while step < args.steps:
        cur, nxt = slots[step % 2], slots[(step + 1) % 2]
        torch.nn.utils.vector_to_parameters(cur[0].cpu(), params)
        x, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        model.zero_grad()
        loss.backward()
        flat = torch.nn.utils.parameters_to_vector([p.grad for p in params])
        grad[:n].copy_(flat.to(grad.device))
        grad[n] = loss.item()
        if args.cuda:
            torch.cuda.synchronize()                 # the collect is a barrier of the CPUs only
        heap.collect()                               # every rank's gradients are written
        tot = torch.zeros(n + 1, device=grad.device)
        for r in local:
            tot += heap.peer(grad, r) if r != rank else grad
        tot /= len(local)
        if step == 0:
            say(f"initial loss {float(tot[n]):.6f}", flush=True)
        say(f"loss {step} {float(tot[n]):.6f}", flush=True)
        g = tot[:n]
        t = step + 1                                 # Adam, into the other slot
        nxt[1].copy_(cur[1]).mul_(B1).add_(g, alpha=1 - B1)
        nxt[2].copy_(cur[2]).mul_(B2).addcmul_(g, g, value=1 - B2)
        mhat = nxt[1] / (1 - B1 ** t)
        vhat = nxt[2] / (1 - B2 ** t)
        nxt[0].copy_(cur[0]).sub_(LR * mhat / (vhat.sqrt() + EPS))
        if args.cuda:
            torch.cuda.synchronize()
        heap.commit("step", t)                       # every rank wrote step t's state
        step = t
        say(f"step {step}", flush=True)
        if args.step_ms:
            time.sleep(args.step_ms / 1000)
    heap.close()
    return 0


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=0, help="spawn N ranks here (no launcher)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=0, help="sleep after each step (for demos, tests)")
    ap.add_argument("--socket", default=None, help="heapd's socket (default $HEAPD_SOCKET)")
    ap.add_argument("--heap", default=None, help="heap name (default $HEAPD_HEAP, else from the launcher)")
    ap.add_argument("--chunk", default="1M", help="heap chunk size")
    ap.add_argument("--persist", type=int, default=600, help="seconds heapd keeps the heap once every rank is gone")
    ap.add_argument("--cpu", action="store_true", help="host memory even with a GPU")
    a = ap.parse_args(argv)
    a.cuda = torch.cuda.is_available() and not a.cpu
    if a.cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return a


def main(argv):
    args = parse(argv)
    if args.nproc:
        run = os.environ.get("TORCHELASTIC_RUN_ID", f"resume{os.getpid()}")
        kids = []
        for r in range(args.nproc):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.nproc),
                       LOCAL_WORLD_SIZE=str(args.nproc), TORCHELASTIC_RUN_ID=run)
            rest = [a for i, a in enumerate(argv) if not a.startswith("--nproc")
                    and not (i and argv[i - 1] == "--nproc")]
            kids.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + rest, env=env))
        return max(k.wait() for k in kids)
    return train(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
