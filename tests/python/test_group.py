"""Issue 31, items 12 and 6: one heap per torch.distributed process group
(Heap.from_group, sub-groups included), and a CUDA job is not handed host
memory silently."""
import os
import socket

import pytest
import torch

import heapd
from conftest import ok, run_ranks


def _groups(rank, world, port):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    tps = [dist.new_group([0, 1]), dist.new_group([2, 3])]   # every rank makes every group
    tp = tps[rank // 2]
    hw = heapd.Heap.from_group()                 # the world
    ht = heapd.Heap.from_group(tp)               # this rank's tensor-parallel pair
    x = ht.zeros(8)
    x.fill_(rank)
    w = hw.zeros(4, dtype=torch.int64)
    ht.collect()
    other = ht.peer(x, 1 - ht.rank)
    seen = float(other[0])
    hw.collect()
    res = (hw.name, hw.rank, hw.world_size, ht.name, ht.rank, ht.world_size, seen,
           ht.offset(x), hw.offset(w))
    ht.close()
    hw.close()
    dist.destroy_process_group()
    return res


def test_from_group_world_and_sub_groups(sock):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = ok(run_ranks(_groups, 4, port, env={"HEAPD_SOCKET": sock, "OMP_NUM_THREADS": "1"})[0])
    wnames = {r[0] for r in res}
    assert len(wnames) == 1, "the world group's ranks disagree on its heap"
    assert [r[1:3] for r in res] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert res[0][3] == res[1][3] and res[2][3] == res[3][3] and res[0][3] != res[2][3]
    assert res[0][3] not in wnames
    assert [r[4:6] for r in res] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [r[6] for r in res] == [1.0, 0.0, 3.0, 2.0], "peer views within the sub-group"


def test_from_group_needs_torch_distributed():
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialised in this process")
    with pytest.raises(heapd.StateError, match="init_process_group"):
        heapd.Heap.from_group()


def _cuda_on_host(rank, world, sock, name, device):
    heapd._torch_sees_cuda = lambda: True        # as on a GPU node
    try:
        with heapd.Heap(name, 0, 1, sock, device=device) as h:
            return h.device.type
    except heapd.MismatchError as e:
        return str(e)


def test_cuda_job_on_host_heapd_refused(sock, heapname):
    (msg,) = ok(run_ranks(_cuda_on_host, 1, sock, heapname, None)[0])
    assert "torch sees CUDA" in msg and "backend = cuda" in msg and 'device="cpu"' in msg, msg
    (msg,) = ok(run_ranks(_cuda_on_host, 1, sock, heapname + "c", "cuda")[0])
    assert "serves host memory" in msg
    assert ok(run_ranks(_cuda_on_host, 1, sock, heapname + "d", "cpu")[0]) == ["cpu"]
    with pytest.raises(heapd.HeapdError) as e:
        heapd.stats(heapname, sock)                # the refused attach left nothing behind
    assert e.value.name == "ERR_NOT_FOUND"
