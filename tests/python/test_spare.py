"""Issue 27, growth ahead of need: heapd keeps grow_ahead spare chunks per
rank, made after the attach and after each growth; a growth takes them. A
real heapd (host backend, tests/it_python.sh's heapd.conf: the default
grow_ahead 1) and real rank processes."""

import pytest
import torch

import heapd
from conftest import ok, run_ranks, wait_for
from test_release import _ctl

MIB = 1 << 20


_wait = wait_for


def _grow(rank, world, sock, name):
    """Waits for the spares, grows the heap (a tensor past the first chunk),
    and waits for the refill; the offsets and what Stats showed."""
    with heapd.Heap(name, rank, world, sock, chunk_size="1M", initial_size="1M", grow_ahead=2) as h:
        _wait(lambda: h.stats()["spare_bytes"] == 2 * world * MIB, "the spares after the attach")
        st = h.stats()
        before = (h.grow_ahead, st["grow_ahead"], st["params"]["grow_ahead"], st["mapped"])
        h.collect()                          # a barrier: both ranks read before either grows
        ts = [h.empty(768 << 10, dtype=torch.uint8) for _ in range(3)]   # 3 x 768 KiB: 3 MiB mapped
        for t in ts:
            t.fill_(rank + 1)
        mapped = h.stats()["mapped"]
        _wait(lambda: h.stats()["spare_bytes"] == 2 * world * MIB, "the refill after the growth")
        return before, mapped, [h.offset(t) for t in ts], h.stats()["growths"]


def test_spares_made_taken_refilled(sock, heapname):
    res = ok(run_ranks(_grow, 2, sock, heapname)[0])
    for before, mapped, offs, growths in res:
        assert before == (2, 2, 2, MIB)
        assert mapped == 3 * MIB and growths >= 1
        assert offs == res[0][2], "offsets differ between ranks"


def test_grow_ahead_zero_means_none(sock, heapname):
    with heapd.Heap(heapname, 0, 1, sock, chunk_size="1M", grow_ahead=0) as h:
        t = h.empty(3 * MIB, dtype=torch.uint8)       # a growth, served without spares
        st = h.stats()
        assert (h.grow_ahead, st["grow_ahead"], st["spare_bytes"]) == (0, 0, 0)
        assert st["mapped"] >= 3 * MIB
        del t
    with pytest.raises(ValueError, match="grow_ahead"):
        heapd.Heap(heapname, 0, 1, sock, grow_ahead=17)


def test_heapctl_shows_spares(sock, heapname):
    """heapctl stats' SPARE, --json's spare_bytes, heapd_heap_spare_bytes;
    the spares go with the heap's last client."""
    with heapd.Heap(heapname, 0, 1, sock, chunk_size="1M") as h:
        _wait(lambda: h.stats()["spare_bytes"] == MIB, "the default grow_ahead's spare")
        text = _ctl(sock, "stats", heapname)
        assert "SPARE" in text and "GROW_AHEAD" in text, text
        j = _ctl(sock, "--json", "stats", heapname)
        jh = j["heaps"][0] if "heaps" in j else j
        assert (jh["spare_bytes"], jh["grow_ahead"]) == (MIB, 1)
        prom = _ctl(sock, "metrics")
        lab = '{heap="%s"' % heapname
        rows = {ln.split(lab)[0]: ln.rsplit(" ", 1)[1] for ln in prom.splitlines() if lab in ln}
        assert float(rows["heapd_heap_spare_bytes"]) == MIB, rows
        assert float(rows["heapd_heap_chunk_bytes"]) == 2 * MIB, rows   # the quotas count the spare
