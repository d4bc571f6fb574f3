"""Issue 31, item 4: the allocation calls follow torch.empty's signature:
empty/zeros/ones/full/*_like(*size, dtype=None, device=None,
requires_grad=False), the default dtype is torch.get_default_dtype(), and a
bad size is refused before an allocation number is consumed."""
import pytest
import torch

import heapd


def test_sizes_as_torch(sock, heapname):
    with heapd.Heap(heapname, 0, 1, sock) as h:
        assert h.zeros(2, 3).shape == (2, 3)              # 3 is a size, not a dtype
        assert h.empty((2, 3)).shape == (2, 3)
        assert h.empty([4]).shape == (4,)
        assert h.empty(torch.Size([5, 2])).shape == (5, 2)
        assert h.ones(3).tolist() == [1.0, 1.0, 1.0]
        assert h.zeros(0).shape == (0,)
        assert h.empty(()).shape == ()
        x = h.zeros(2, 3, dtype=torch.int16)
        assert x.dtype == torch.int16 and int(x.abs().sum()) == 0
        assert h.empty(torch.tensor(3)).shape == (3,)     # anything with __index__
        assert h.empty(2, 3, device="cpu").device.type == "cpu"
        assert h.empty(2, device=torch.device("cpu")).shape == (2,)


def test_default_dtype_follows_torch(sock, heapname):
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        with heapd.Heap(heapname, 0, 1, sock) as h:
            assert h.empty(4).dtype == torch.float64
            assert h.zeros(4).dtype == torch.float64
            assert h.full((2,), 1.5).dtype == torch.float64
    finally:
        torch.set_default_dtype(old)


def test_full_and_like(sock, heapname):
    with heapd.Heap(heapname, 0, 1, sock) as h:
        f = h.full((2, 2), 7)
        assert f.dtype == torch.int64 and f.tolist() == [[7, 7], [7, 7]]   # as torch.full
        assert h.full((3,), True).dtype == torch.bool
        assert h.full(3, 2.5, dtype=torch.float16).tolist() == [2.5, 2.5, 2.5]
        src = torch.arange(6, dtype=torch.int32).view(2, 3).t()           # not contiguous
        e = h.empty_like(src)
        assert e.shape == (3, 2) and e.dtype == torch.int32 and h.offset(e) >= 0
        z = h.zeros_like(src, dtype=torch.float32)
        assert z.dtype == torch.float32 and float(z.abs().sum()) == 0
        assert h.ones_like(src).sum().item() == 6
        assert h.full_like(src, 4).tolist() == [[4, 4]] * 3


def test_requires_grad(sock, heapname):
    with heapd.Heap(heapname, 0, 1, sock) as h:
        w = h.zeros(3, requires_grad=True)
        assert w.requires_grad and w.is_leaf
        (w * 2).sum().backward()
        assert w.grad.tolist() == [2.0, 2.0, 2.0]
        assert h.empty_like(w).requires_grad is False
        assert h.ones(2, requires_grad=True).requires_grad


def test_bad_sizes_refused_without_an_allocation(sock, heapname):
    with heapd.Heap(heapname, 0, 1, sock) as h:
        before = h.status().allocs
        with pytest.raises(ValueError, match="negative dimension -1"):
            h.zeros(-1)
        with pytest.raises(ValueError, match="negative dimension -2"):
            h.empty(3, -2)
        with pytest.raises(TypeError, match="size must be integers"):
            h.empty(2.5)
        with pytest.raises(TypeError, match="size must be integers"):
            h.empty("4")
        with pytest.raises(TypeError, match="dtype=torch.float32"):
            h.empty((4,), torch.float32)                   # torch takes dtype as a keyword
        with pytest.raises(TypeError, match="not a torch.dtype"):
            h.empty(4, dtype="float32")
        with pytest.raises(ValueError, match="serves 'cpu' memory"):
            h.empty(4, device="cuda")
        assert h.status().allocs == before, "a refused call consumed an allocation number"
        t = h.empty(4)
        assert h.offset(t) == 0, "the next allocation is still allocation 0"
