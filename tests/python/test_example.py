"""examples/train_torch.py runs (gloo on CPU, 2 spawned ranks, real heapd)."""
import os
import subprocess
import sys

from conftest import ROOT


def test_train_torch_example(sock):
    env = dict(os.environ, HEAPD_SOCKET=sock)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples/train_torch.py"), "--nproc",
                        "2", "--steps", "20", "--cpu"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0/2: 20 steps" in p.stdout and "rank 1/2: 20 steps" in p.stdout
    assert "peer checks 20" in p.stdout
    assert "heapd stats: heap 'torch-spawn" in p.stdout and "backend host" in p.stdout
