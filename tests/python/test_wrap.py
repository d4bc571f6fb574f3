"""heapd.torch.wrap_collectives with torch.distributed over gloo (CPU), real
rank processes, tensors on a real heap: the policy by torch/c10d names, the
status-page probe, on_low, failures annotated with the memory state."""
import copy

import torch.distributed as dist

import heapd
import heapd.torch as ht
from conftest import ok, run_ranks


def _wrap(rank, world, sock, name, pgfile):
    dist.init_process_group("gloo", init_method=f"file://{pgfile}", rank=rank, world_size=world)
    try:
        with heapd.Heap(name, rank, world, sock) as h:
            low = []
            w = ht.wrap_collectives(h, probe=["allreduce", "all_gather_into_tensor"],
                                    skip=["broadcast"], threshold=1 << 62, on_low=low.append)
            x = h.zeros(8)
            x.fill_(rank + 1)
            dist.all_reduce(x)
            outs = [h.zeros(8) for _ in range(world)]
            dist.all_gather(outs, x)
            dist.broadcast(x, 0)
            assert float(x[0]) == sum(range(1, world + 1))
            assert all(float(o[0]) == float(x[0]) for o in outs)
            c = copy.deepcopy(w.counters)
            seen = [(i["op"], i["threshold"], i["device_free"] > 0) for i in low]
            err = None
            try:
                dist.broadcast(x, world + 5)          # an invalid root: the call fails
            except Exception as e:  # noqa: BLE001
                err = str(e) + " " + " ".join(getattr(e, "__notes__", []))
            errors = w.counters["errors"]
            w.unwrap()
            restored = getattr(dist.all_reduce, "heapd_probes", None) is None
            w2 = ht.wrap_collectives(h, probe="all", threshold=1, on_low=low.append)
            dist.all_reduce(x)
            c2 = copy.deepcopy(w2.counters)
            w2.unwrap()
            dist.barrier()
            return c, seen, err, errors, restored, c2, len(low)
    finally:
        dist.destroy_process_group()


def test_wrap_collectives_gloo(sock, heapname, tmp_path):
    res = ok(run_ranks(_wrap, 2, sock, heapname, str(tmp_path / "pg"))[0])
    for c, seen, err, errors, restored, c2, nlow in res:
        assert c["calls"]["all_reduce"] == 1 and c["calls"]["all_gather"] == 1
        assert c["calls"]["broadcast"] == 1
        assert c["probes"] == 2 and c["below"] == 2 and c["callbacks"] == 2
        assert seen == [("all_reduce", 1 << 62, True), ("all_gather", 1 << 62, True)]
        assert err is not None and "heapd: broadcast failed; memory (heapd status page" in err, err
        assert errors == 1 and restored
        assert c2["probes"] == 1 and c2["below"] == 0 and nlow == 2


def test_wrap_names_checked(sock, heapname):
    def one(rank, world, sock, name):
        with heapd.Heap(name, rank, world, sock) as h:
            msgs = []
            for kw in ({"probe": ["frobnicate"]}, {"probe": ["allreduce"], "skip": ["all_reduce"]}):
                try:
                    ht.wrap_collectives(h, **kw)
                except ValueError as e:
                    msgs.append(str(e))
            return msgs
    (msgs,) = ok(run_ranks(one, 1, sock, heapname)[0])
    assert "frobnicate" in msgs[0] and "all_gather_into_tensor" in msgs[0]
    assert "both" in msgs[1] and "all_reduce" in msgs[1]


def test_allocator_route_needs_cuda(sock, heapname):
    def one(rank, world, sock, name):
        with heapd.Heap(name, rank, world, sock) as h:
            try:
                with ht.use_heap(h):
                    pass
            except RuntimeError as e:
                return str(e)
            return "no error"
    (msg,) = ok(run_ranks(one, 1, sock, heapname)[0])
    assert "needs CUDA" in msg and "host" in msg
