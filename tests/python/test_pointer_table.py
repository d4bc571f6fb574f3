"""Issue 31, items 13 and 14 (their CPU part): heap.bases is every rank's
base address on heap.device, bases[r] + offset is rank r's copy, across
growths; examples/allreduce_triton.py's one-shot all-reduce over the table
is correct (torch over peer views, gloo; the Triton kernel runs in the GPU
script)."""
import os
import subprocess
import sys

import torch

import heapd
from conftest import ROOT, ok, run_ranks


def _table(rank, world, sock, name):
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="1M") as h:
        b = h.bases
        assert b.dtype == torch.int64 and b.shape == (world,) and b.device == h.device
        x = h.zeros(1000, dtype=torch.float32)
        big = h.zeros(3 << 20, dtype=torch.uint8)        # grows the heap
        assert h.bases is b and h.status().growths >= 1
        out = []
        for t in (x, big):
            for r in range(world):
                assert int(b[r]) + h.offset(t) == h.peer(t, r).data_ptr()
            out.append(h.offset(t))
        return out, [int(v) != 0 for v in b]


def test_bases_table(sock, heapname):
    res = ok(run_ranks(_table, 3, sock, heapname)[0])
    assert all(r == res[0] for r in res)
    assert res[0][1] == [True, True, True]


def test_allreduce_example_cpu(sock):
    env = dict(os.environ, HEAPD_SOCKET=sock, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples/allreduce_triton.py"),
                        "--nproc", "2", "--cpu", "--elements", "5000", "--iters", "3",
                        "--warmup", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("correct") == 2, p.stdout
    assert "heap one-shot" in p.stdout and "torch.distributed.all_reduce (gloo)" in p.stdout
