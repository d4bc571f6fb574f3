"""Issue 31, items 1 and 3: two torchrun jobs on one node get two heaps
(torchrun's run id "none" is not a name), a launch without a unique id is
refused naming the remedies, and docs/python.md's torchrun command runs with
the torch make check installs (Debian's 1.13 on Python 3.11)."""
import os
import re
import socket
import subprocess
import sys
import tempfile

from conftest import ROOT, ok, run_ranks

import heapd


def _env(rank, world, sock, hold):
    with heapd.Heap.from_env(socket=sock) as h:
        h.zeros(4)
        if hold is not None:
            hold.wait(60)                           # every rank of both jobs is attached
        return h.name, h.rank


def test_run_id_none_is_unset(sock):
    """Two jobs, run id "none", different MASTER_PORT, attached at once."""
    import multiprocessing as mp
    hold = mp.get_context("fork").Barrier(4)
    port = 20000 + os.getpid() % 20000
    env = lambda r: {"RANK": str(r % 2), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",  # noqa: E731
                     "LOCAL_RANK": str(r % 2), "TORCHELASTIC_RUN_ID": "none",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port + r // 2)}
    res = ok(run_ranks(_env, 4, sock, hold, env=env)[0])
    assert res == [(f"torch-127.0.0.1-{port}", 0), (f"torch-127.0.0.1-{port}", 1),
                   (f"torch-127.0.0.1-{port + 1}", 0), (f"torch-127.0.0.1-{port + 1}", 1)]


def test_no_unique_id_refused_naming_remedies(sock):
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "none"}
    for k in ("MASTER_ADDR", "MASTER_PORT", "HEAPD_HEAP"):
        os.environ.pop(k, None)
    res, _ = run_ranks(_env, 1, sock, None, env=env)
    kind, (cls, msg, extra, _tb) = res[0]
    assert kind == "raised" and extra["name"] == "ERR_INVALID", res[0]
    for remedy in ("--rdzv-id", "--standalone", "HEAPD_HEAP"):
        assert remedy in msg, msg
    name = f"py-heapd-heap-{os.getpid()}"
    res = ok(run_ranks(_env, 1, sock, None, env=dict(env, HEAPD_HEAP=name))[0])
    assert res == [(name, 0)]


def test_from_env_outside_a_launcher_names_heap_call(sock):
    for k in ("RANK", "SLURM_PROCID"):
        os.environ.pop(k, None)
    res, _ = run_ranks(_env, 1, sock, None)
    assert "heapd.Heap(name, rank, world_size)" in res[0][1][1]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_env(sock, **kw):
    env = dict(os.environ, HEAPD_SOCKET=sock, OMP_NUM_THREADS="1", **kw)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID",
              "MASTER_ADDR", "MASTER_PORT", "HEAPD_HEAP"):
        env.pop(k, None)
    return env


# The command docs/python.md gives, for torch 1.13 on Python 3.11 as for newer
# torch: --nproc_per_node (1.13 has no --nproc-per-node) and --redirects 1
# --tee 1 (its default "0" hits a bug in torch.distributed.elastic on 3.11).
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
            "--redirects", "1", "--tee", "1"]


def test_two_torchrun_jobs_on_one_node(sock):
    """Two real torchrun jobs without --rdzv-id (run id "none") at once."""
    with tempfile.TemporaryDirectory() as d:
        env = _torchrun_env(sock, LAUNCH_DIR=d, LAUNCH_WANT="4")
        child = os.path.join(ROOT, "tests/python/launch_child.py")
        ps = [subprocess.Popen(TORCHRUN + [f"--master_port={_free_port()}", child], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for _ in range(2)]
        outs = [p.communicate(timeout=300)[0] for p in ps]
        for p, out in zip(ps, outs):
            assert p.returncode == 0, out
        names = [set(re.findall(r"heap (torch-\S+)", out)) for out in outs]
        assert all(len(n) == 1 for n in names) and names[0] != names[1], outs


def _doc_command():
    """The torchrun line of docs/python.md's launcher section."""
    doc = open(os.path.join(ROOT, "docs/python.md")).read()
    m = re.search(r"^HEAPD_SOCKET=\S+ (python3 -m torch\.distributed\.run [^\n]*"
                  r"examples/train_torch\.py[^\n]*)$", doc, re.M)
    assert m, "docs/python.md has no torchrun command for examples/train_torch.py"
    return m.group(1).split()


def test_documented_torchrun_command(sock):
    argv = _doc_command()
    assert argv[:5] == ["python3", "-m", "torch.distributed.run", "--nproc_per_node=2",
                        "--standalone"] or "--standalone" in argv, argv
    argv = [sys.executable] + argv[1:] + ["--cpu", "--steps", "10"]
    p = subprocess.run(argv, env=_torchrun_env(sock), cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0/2: 10 steps" in p.stdout and "rank 1/2: 10 steps" in p.stdout, p.stdout
