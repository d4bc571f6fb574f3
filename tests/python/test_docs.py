"""Issue 31: every `python` example of docs/python.md runs (2 rank
processes, host backend; "job42" becomes a unique heap name; a block that
uses torch.distributed gets a gloo group first). `python cuda` blocks need a
GPU: they are compiled only."""
import os
import re
import socket

import pytest

from conftest import ROOT, ok, run_ranks


def _blocks():
    doc = open(os.path.join(ROOT, "docs/python.md")).read()
    return re.findall(r"^```(python[^\n]*)\n(.*?)^```$", doc, re.M | re.S)


BLOCKS = _blocks()
RUN = [code for info, code in BLOCKS if info.strip() == "python"]


def test_docs_have_examples():
    assert len(RUN) >= 3, "docs/python.md lost its runnable examples"
    for info, code in BLOCKS:
        compile(code, f"docs/python.md ({info})", "exec")


def _run_block(rank, world, code, name, port):
    os.environ.pop("RANK", None)
    if "dist." in code:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
    g = {"rank": rank, "world_size": world, "__name__": "__doc_example__"}
    exec(compile(code.replace('"job42"', repr(name)), "docs/python.md", "exec"), g)
    return True


@pytest.mark.parametrize("i", range(len(RUN)))
def test_doc_example_runs(sock, heapname, i):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_ranks(_run_block, 2, RUN[i], heapname, port,
                    env={"HEAPD_SOCKET": sock, "OMP_NUM_THREADS": "1"})[0]
    assert ok(res) == [True, True], RUN[i]
