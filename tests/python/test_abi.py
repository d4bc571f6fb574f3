"""Issue 31, items 7, 8 and the smaller ones: one size parser (libheapc's),
the struct layouts checked at import, __version__, stats' shapes and
booleans, a peer rank that does not exist."""
import os
import re

import pytest
import torch

import heapd
from heapd import _lib as L
from conftest import ROOT


@pytest.mark.parametrize("text", ["1.5G", "64MB", "64Mi", "-1", " 4", "4 ", "", "0x10", "1e6"])
def test_python_refuses_what_c_refuses(text):
    import ctypes
    out = ctypes.c_uint64()
    assert L.parse_size(text.encode(), ctypes.byref(out)) != 0, f"C takes {text!r}"
    with pytest.raises(ValueError, match="is not a size"):
        heapd._size(text)


@pytest.mark.parametrize("text,want", [("4096", 4096), ("64M", 64 << 20), ("64MiB", 64 << 20),
                                       ("256 MiB", 256 << 20), ("3g", 3 << 30), ("1T", 1 << 40)])
def test_sizes_as_c(text, want):
    assert heapd._size(text) == want


def test_bad_size_in_heap_params(sock, heapname):
    with pytest.raises(ValueError, match="1.5G"):
        heapd.Heap(heapname, 0, 1, sock, chunk_size="1.5G")


class _FakeLib:
    def __init__(self, version=L.ABI_VERSION, sizes=None, symbols=True):
        import ctypes
        real = {n: ctypes.sizeof(t) for n, t in L._STRUCTS.items()}
        real.update(sizes or {})
        if symbols:
            self.heapc_abi_version = lambda: version
            self.heapc_sizeof = lambda name: real.get(name.decode(), 0)


def test_layout_checked_at_import():
    L.check_abi()                                        # the real one matches
    L.check_abi(_FakeLib(), "fake")
    newer = L.ABI_VERSION + 1
    with pytest.raises(ImportError, match=f"struct layout {newer}"):
        L.check_abi(_FakeLib(version=newer), "newer")
    with pytest.raises(ImportError, match="heapc_status_t is 144 bytes there"):
        L.check_abi(_FakeLib(sizes={"heapc_status_t": 144}), "grown")
    with pytest.raises(ImportError, match="predates heapc_abi_version"):
        L.check_abi(_FakeLib(symbols=False), "older")


def test_version():
    proj = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert re.search(r'^version = "([^"]+)"', proj, re.M).group(1) == heapd.__version__


def test_stats_shapes_and_booleans(sock, heapname):
    with heapd.Heap(heapname, 0, 1, sock) as h:
        x = h.zeros(10)
        mine = h.stats()
        top = heapd.stats(heapname, sock)
        every = heapd.stats(socket=sock)
        assert isinstance(top, dict) and isinstance(every, list)
        assert set(mine) - {"client"} == set(top), "heap.stats() and heapd.stats(name) differ"
        assert top["name"] == heapname and any(d["name"] == heapname for d in every)
        assert top["ranks"][0]["attached"] is True
        assert isinstance(top["collect_pending"], bool)
        del x


def test_peer_rank_that_does_not_exist(sock, heapname):
    with heapd.Heap(heapname, 0, 1, sock) as h:
        x = h.zeros(4)
        with pytest.raises(ValueError, match="rank 1 does not exist.*world size 1"):
            h.peer(x, 1)
        with pytest.raises(ValueError, match="rank -1 does not exist"):
            h.peer(x, -1)
        assert torch.equal(h.peer(x, 0), x)


def test_stats_fields_as_heapctl_json(sock, heapname):
    """Python's stats use heapctl --json's field names and types."""
    import json
    import subprocess
    from conftest import BUILD
    with heapd.Heap(heapname, 0, 1, sock) as h:
        x = h.zeros(10)
        p = subprocess.run([os.path.join(BUILD, "heapctl"), "--socket", sock, "--json", "stats",
                            heapname], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        jh = j["heaps"][0] if "heaps" in j else j
        py = heapd.stats(heapname, sock)
        for k, v in jh.items():
            assert k in py, f"heapctl's {k!r} is missing from heapd.stats()"
            if k == "params":
                for pk, pv in v.items():
                    assert py["params"][pk] == pv, pk
            elif k == "ranks":
                for pk, pv in v[0].items():
                    assert type(py["ranks"][0][pk]) is type(pv), pk
            else:
                assert type(py[k]) is type(v), k
        del x


def test_every_client_code_has_its_name():
    """Issue 33 item 7: ERR_BADFD (-106) is known, with its own class."""
    assert L.errname(-106).decode() == "ERR_BADFD"
    assert heapd._errors._BY_CODE[-106] is heapd.BadFdError
    assert issubclass(heapd.BadFdError, heapd.HeapdError)
