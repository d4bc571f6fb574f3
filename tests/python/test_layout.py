"""The Python package's ctypes structs against C: every class that mirrors a
struct of heapc.h or heapc_nccl.h has the C struct's size and, field by
field in declaration order, its names, offsets and sizes. The C side is
printed by $BUILD/tests/prog_layout (tests/prog_layout.c: sizeof and
offsetof), so a field added, moved or resized on one side only fails here
instead of corrupting memory."""
import ctypes
import json
import os
import subprocess

import pytest

from conftest import BUILD

import heapd._lib as L
import heapd.torch as ht

# Each ctypes class and the C struct it mirrors.
MIRRORS = [
    (L.Params, "heapc_params"),
    (L.Status, "heapc_status_t"),
    (L.Counters, "heapc_counters"),
    (L.RankStats, "heapc_rank_stats"),
    (L.Hist, "heapc_hist"),
    (L.HeapStats, "heapc_heap_stats"),
    (L.DaemonStats, "heapc_daemon_stats"),
    (L.Block, "heapc_block"),
    (ht.ProbeInfo, "hnccl_probe_info"),
    (ht.NcclCounters, "hnccl_counters"),
    (ht.WindowStats, "hnccl_window_stats"),
]


@pytest.fixture(scope="module")
def c_layout():
    prog = os.path.join(BUILD, "tests", "prog_layout")
    if not os.path.exists(prog):
        pytest.fail(f"{prog} is missing: build heapd first (make)")
    out = subprocess.run([prog], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


@pytest.mark.parametrize("cls,cname", MIRRORS, ids=[c for _, c in MIRRORS])
def test_struct_matches_c(c_layout, cls, cname):
    c = c_layout[cname]
    py = [(n, getattr(cls, n).offset, getattr(cls, n).size) for n, _ in cls._fields_]
    cf = [tuple(f) for f in c["fields"]]
    assert [f[0] for f in py] == [f[0] for f in cf], \
        f"{cls.__name__} and {cname} do not have the same fields in the same order"
    for p, q in zip(py, cf):
        assert p == q, f"{cls.__name__}.{p[0]}: offset {p[1]} size {p[2]} in Python, " \
                       f"offset {q[1]} size {q[2]} in C ({cname})"
    assert ctypes.sizeof(cls) == c["size"], \
        f"sizeof {cls.__name__} is {ctypes.sizeof(cls)} in Python, {c['size']} in C ({cname})"


def test_every_c_struct_is_checked(c_layout):
    assert sorted(c_layout) == sorted(c for _, c in MIRRORS)
