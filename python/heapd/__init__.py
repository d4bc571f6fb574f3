"""heapd: PyTorch tensors on heapd's symmetric heap.

    import heapd, torch
    with heapd.Heap.from_env() as heap:          # torchrun / srun: no arguments
        x = heap.zeros((1024,), torch.float32)   # same offset on every rank
        y = heap.peer(x, (heap.rank + 1) % heap.world_size)   # the next rank's x
        heap.free(x)                             # deferred: any order on any rank
        heap.collect()                           # collective: reuse what all freed

The n-th allocation (empty, zeros) must have the same size on every rank; a
rank that differs gets AsymmetryError naming n and both sizes. A tensor holds
its heap: the heap is detached when it is closed and no tensor (or peer view)
of it is left. With the cuda backend tensors are CUDA tensors on the rank's
GPU (set it, e.g. torch.cuda.set_device(LOCAL_RANK), before attaching); with
the host backend they are CPU tensors in shared memory.

Errors are HeapdError subclasses carrying heapd's message (`.code`,
`.name`, `str(e)`). Threads: one Heap may be used from several threads
(libheapc serialises the calls; address and status reads are lock-free).
"""
import ctypes
import os
import threading

from . import _lib as L

__all__ = ["Heap", "HeapdError", "AsymmetryError", "PeerGoneError", "CollectiveTimeoutError",
           "HeapdConnectionError", "NotHeldError", "OutOfMemoryError", "StateError",
           "MismatchError", "Status", "library_path", "stats"]

library_path = L.path
Status = L.Status


# ---- errors ------------------------------------------------------------------

class HeapdError(RuntimeError):
    """An error of libheapc or heapd: .code (HEAPC_E*, negative), .name
    ("ERR_ASYMMETRY"), and heapd's message as str(e)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.name = L.errname(code).decode()


class AsymmetryError(HeapdError):
    """Ranks disagree on the n-th allocation's size (or a collect point).
    .n, .rank, .size, .other_rank, .other_size when heapd's message names
    them (an allocation), else None."""

    def __init__(self, code, message):
        super().__init__(code, message)
        import re
        m = re.search(r"asymmetric allocation (\d+) .*?rank (\d+) asked for (\d+) bytes, "
                      r"rank (\d+) for (\d+)", message)
        g = [int(v) for v in m.groups()] if m else [None] * 5
        self.n, self.rank, self.size, self.other_rank, self.other_size = g


class PeerGoneError(HeapdError):
    """A rank disconnected during a collective; the message names it."""


class CollectiveTimeoutError(HeapdError, TimeoutError):
    """A collective timed out (the message names the ranks that never came),
    or no reply came within Heap(timeout_ms=...)."""


class HeapdConnectionError(HeapdError, ConnectionError):
    """heapd cannot be reached or closed the connection."""


class NotHeldError(HeapdError):
    """Free of a block this rank does not hold (double free)."""


class OutOfMemoryError(HeapdError, MemoryError):
    """The backend could not create a chunk, the heap's va_size or a quota is exhausted."""


class StateError(HeapdError):
    """Not valid now (not attached, rank taken, heap closed)."""


class MismatchError(HeapdError):
    """Attach parameters differ from the heap's."""


_BY_CODE = {-5: AsymmetryError, -7: PeerGoneError, -6: CollectiveTimeoutError,
            -103: CollectiveTimeoutError, -100: HeapdConnectionError, -15: HeapdConnectionError,
            -12: NotHeldError, -8: OutOfMemoryError, -9: OutOfMemoryError, -17: OutOfMemoryError,
            -102: OutOfMemoryError, -11: StateError, -4: MismatchError}


def _raise(c, rc):
    msg = L.errstr(c).decode(errors="replace") or L.errname(rc).decode()
    raise _BY_CODE.get(rc, HeapdError)(rc, msg)


def _size(v):
    """An int, or a size string as heapd.conf takes it: "3G", "512M", "64K"."""
    if v is None:
        return 0
    if isinstance(v, int):
        return v
    s = str(v).strip().upper().rstrip("B").rstrip("I")
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if s and s[-1] in mul:
        return int(float(s[:-1]) * mul[s[-1]])
    return int(s)


def _policies():
    """{name: wire value}: libheapc's names (heapc_policy_name), 0 the default."""
    d, v = {None: 0}, 0
    while (n := L.policy_name(v)) != b"unknown":
        d[n.decode()], v = v, v + 1
    return d


_POLICY = _policies()
_esize = {}


def _element_size(dtype):
    e = _esize.get(dtype)
    if e is None:
        import torch
        e = _esize[dtype] = torch.empty((), dtype=dtype).element_size()
    return e


# ---- tensors over heap memory -----------------------------------------------

class _Handle:
    """The connection and attachment; shared by the Heap and every tensor made
    on it, detached when the last of them is gone (or at close when none is)."""
    __slots__ = ("c", "lock", "__weakref__")

    def __init__(self, c):
        self.c = c
        self.lock = threading.Lock()

    def release(self):
        with self.lock:
            c, self.c = self.c, None
        if c:
            for hook in _release_hooks:
                hook(c)
            if L.rank(c) != 0xFFFFFFFF:
                L.detach(c)
            L.free_ctx(c)

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# Called with the heapc context before it is detached and released (the
# allocator route unregisters it from its shim).
_release_hooks = []


class _HostMem:
    """numpy's view of nbytes of heap memory; holds the handle."""
    __slots__ = ("__array_interface__", "_h")

    def __init__(self, h, ptr, nbytes):
        self._h = h
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (ptr, False), "version": 3}


class _CudaMem:
    """torch's view (__cuda_array_interface__) of nbytes of device memory; holds the handle."""
    __slots__ = ("__cuda_array_interface__", "_h")

    def __init__(self, h, ptr, nbytes):
        self._h = h
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 2, "strides": None}


def _bytes_tensor(h, cuda, ptr, nbytes):
    import torch
    if cuda:
        # No device argument: torch takes the memory's own device (a peer's
        # copy may lie on another GPU); device="cuda" would copy it to the
        # current one.
        return torch.as_tensor(_CudaMem(h, ptr, nbytes))
    import numpy
    return torch.from_numpy(numpy.asarray(_HostMem(h, ptr, nbytes)))


class Heap:
    """One rank's attachment to a heap (collective: every rank of the heap
    attaches before any returns).

    Heap(name, rank, world_size, socket=None, chunk_size=, initial_size=,
         va_size=, min_block=, policy="coalesce"|"seed", collect_timeout_ms=,
         device_uuid=None, local_size=0, job=None, timeout_ms=None)
    Sizes take ints or strings ("64M"). socket: $HEAPD_SOCKET, else
    /run/heapd/heapd.sock. timeout_ms bounds the wait for any one reply
    (CollectiveTimeoutError), default unbounded (heapd bounds collectives).
    """

    def __init__(self, name, rank, world_size, socket=None, *, chunk_size=0, initial_size=0,
                 va_size=0, min_block=0, policy=None, collect_timeout_ms=0, device_uuid=None,
                 local_size=0, job=None, timeout_ms=None, _from_env=False):
        self._prepare_device()
        c = L.connect(os.fsencode(socket) if socket else None)
        if not c:
            raise MemoryError("heapc_connect: out of memory")
        h = _Handle(c)
        if L.err(c):
            rc = L.err(c)
            try:
                _raise(c, rc)
            finally:
                h.release()
        if timeout_ms is not None:
            L.set_timeout(c, int(timeout_ms))
        if policy not in _POLICY:
            h.release()
            want = " or ".join(repr(k) for k in _POLICY if k not in (None, "default"))
            raise ValueError(f"heapd.Heap: policy {policy!r}: want {want}")
        self._keep = (os.fsencode(device_uuid) if device_uuid else None,
                      job.encode() if job else None)
        p = L.Params(_size(chunk_size), _size(initial_size), _size(va_size), _size(min_block),
                     _POLICY[policy], int(collect_timeout_ms), self._keep[0], int(local_size),
                     self._keep[1])
        if _from_env:
            rc = L.attach_env(c, name.encode() if name else None, ctypes.byref(p))
        else:
            rc = L.attach(c, name.encode(), int(rank), int(world_size), ctypes.byref(p))
        if rc:
            try:
                _raise(c, rc)
            finally:
                h.release()
        self._h = h
        self._c = c
        self.name = L.heap_name(c).decode()
        self.rank = L.rank(c)
        self.world_size = L.world_size(c)
        self.backend = L.backend(c).decode()
        self._cuda = self.backend == "cuda"
        self._base = L.base(c, self.rank)
        self._status = L.Status()
        self._ptr = ctypes.c_void_p()
        self._off = ctypes.c_uint64()
        self.closed = False
        _notify_preload(self)

    @classmethod
    def from_env(cls, name=None, socket=None, **kw):
        """Attach as the launcher says (heapc_attach_env): torchrun's RANK,
        WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID, or Slurm's
        SLURM_PROCID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_JOB_ID.
        name: $HEAPD_HEAP, else "torch-<run id>" / "slurm-<job>.<step>".
        With CUDA, the device is set to LOCAL_RANK (SLURM_LOCALID) first.
        Raises HeapdError (code ERR_INVAL) naming a missing variable."""
        return cls(name, 0, 0, socket, _from_env=True, **kw)

    @staticmethod
    def _prepare_device():
        # On the cuda backend libheapc uses the calling thread's current CUDA
        # context; make torch's (the primary context of the current device)
        # current first. No-op without CUDA.
        import torch
        if torch.cuda.is_available():
            lr = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID"))
            if lr is not None and torch.cuda.device_count() > int(lr):
                torch.cuda.set_device(int(lr))
            torch.cuda.current_stream().synchronize()

    # ---- context manager ----
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """No more allocations through this object. The heap is detached now
        when no tensor of it is left, else when the last one is collected."""
        if self.closed:
            return
        self.closed = True
        _notify_preload(self, closing=True)
        h, self._h = self._h, None
        del h  # tensors hold their own reference

    def _cx(self):
        if self.closed:
            raise StateError(-11, f"heap {self.name!r}: closed")
        return self._c

    # ---- allocation ----
    def _alloc(self, nbytes):
        c = self._cx()
        rc = L.alloc(c, max(int(nbytes), 1), ctypes.byref(self._ptr), ctypes.byref(self._off))
        if rc:
            _raise(c, rc)
        return self._ptr.value

    def empty(self, shape, dtype=None, *, nbytes=None):
        """A tensor of `shape` and `dtype` (default torch.float32) on the heap:
        the rank's next allocation. Contents: whatever the block held."""
        import torch
        dtype = dtype or torch.float32
        if isinstance(shape, int):
            shape = (shape,)
        n = 1
        for d in shape:
            n *= int(d)
        nb = n * _element_size(dtype)
        p = self._alloc(nb)
        t = _bytes_tensor(self._h, self._cuda, p, max(nb, 1))[:nb]
        return t.view(dtype).view(tuple(shape))

    def zeros(self, shape, dtype=None):
        """empty(), then zeroed."""
        return self.empty(shape, dtype).zero_()

    def _offset(self, t):
        """Offset of t's first element, checking that it is this heap's own copy."""
        p = t.data_ptr()
        if not self._base or not (self._base <= p < self._base + L.mapped(self._c)):
            raise ValueError(f"heap {self.name!r}: the tensor (data_ptr {p:#x}) is not on "
                             f"rank {self.rank}'s copy of this heap")
        return p - self._base

    def offset(self, t):
        """The heap offset of tensor t's first element (identical on every rank
        for the same allocation)."""
        return self._offset(t)

    def peer(self, t, rank):
        """The same elements of t on local peer `rank`'s copy, as a tensor of
        t's shape, dtype and strides (a view: writes go to the peer)."""
        import torch
        c = self._cx()
        st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        s0 = st.data_ptr()
        soff = self._offset_of_ptr(s0)
        pp = L.peer_ptr(c, int(rank), soff)
        if not pp:
            raise ValueError(f"heap {self.name!r}: rank {rank} is not served by this node's "
                             f"heapd (or offset {soff} is beyond the mapped extent)")
        nbytes = st.nbytes() if callable(getattr(st, "nbytes", None)) else st.size() * t.element_size()
        raw = _bytes_tensor(self._h, self._cuda, pp, nbytes)
        return torch.as_strided(raw.view(t.dtype), t.size(), t.stride(), t.storage_offset())

    def _offset_of_ptr(self, p):
        if not self._base or not (self._base <= p < self._base + L.mapped(self._c)):
            raise ValueError(f"heap {self.name!r}: pointer {p:#x} is not on rank {self.rank}'s "
                             "copy of this heap")
        return p - self._base

    def free(self, t, stream=None):
        """Releases the block t lies in (deferred until a collect that follows
        every rank's release; any order on any rank). Stream-ordered: a CUDA
        tensor's block is released once the work queued so far on `stream`
        (default: torch's current stream of t's device, the stream t was
        used on) completed; nobody waits for it (heapc_free_async). t must
        not be used after the free. NotHeldError for a double free."""
        c = self._cx()
        st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        off = self._offset_of_ptr(st.data_ptr())
        if stream is None and getattr(t, "is_cuda", False):
            import torch
            stream = torch.cuda.current_stream(t.device)
        if stream is not None:
            rc = L.free_async(c, off, int(getattr(stream, "cuda_stream", stream)) or None)
        else:
            rc = L.free(c, off)
        if rc:
            _raise(c, rc)

    def free_offset(self, offset):
        c = self._cx()
        rc = L.free(c, int(offset))
        if rc:
            _raise(c, rc)

    def flush(self):
        """Sends the queued frees now."""
        c = self._cx()
        rc = L.flush(c)
        if rc:
            _raise(c, rc)

    def collect(self):
        """Collective: every rank calls it at the same point of its allocation
        sequence. Sends the queued frees (a CUDA tensor's once its stream's
        work completed; no device sync); blocks released by every rank become
        reusable. Also a barrier of the heap's ranks (not of the device)."""
        c = self._cx()
        rc = L.collect(c)
        if rc:
            _raise(c, rc)

    # ---- addresses and state ----
    def ptr(self, offset, rank=None):
        """The address of offset on this rank's (or local peer rank's) copy."""
        return (L.ptr(self._c, offset) if rank is None else L.peer_ptr(self._c, rank, offset)) or None

    @property
    def mapped(self):
        return L.mapped(self._c)

    def local_ranks(self):
        n = L.local_ranks(self._c, None, 0)
        a = (ctypes.c_uint32 * n)()
        L.local_ranks(self._c, a, n)
        return list(a)

    def status(self):
        """The status page (a Status: mapped, live, released, free, rank_held,
        rank_released, collects, growths, allocs, epoch, device_free,
        device_total, ...): a few loads, no syscall."""
        s = L.Status()
        if L.status(self._c, ctypes.byref(s)):
            raise StateError(-11, f"heap {self.name!r}: no status page (not attached)")
        return s

    def device_free(self):
        """Free device memory (host backend: MemAvailable) from the status page."""
        s = self._status
        L.status(self._c, ctypes.byref(s))
        return s.device_free

    def counters(self):
        k = L.Counters()
        L.get_counters(self._c, ctypes.byref(k))
        return {n: getattr(k, n) for n, _ in k._fields_}

    def stats(self):
        """heapd's statistics of this heap (a dict; 'ranks' a list of dicts)
        plus this client's counters under 'client'."""
        st = self.stats_all(self.name)
        d = st[0] if st else {}
        d["client"] = self.counters()
        return d

    def stats_all(self, name=None):
        return _stats_of(self._cx(), name)

    def __repr__(self):
        return (f"heapd.Heap({self.name!r}, rank={self.rank}, world_size={self.world_size}, "
                f"backend={self.backend!r}{', closed' if self.closed else ''})")


def stats(name=None, socket=None):
    """heapd's statistics of heap `name` (None: every heap this user may see),
    without attaching: a list of dicts like Heap.stats(). ENOTFOUND raises
    HeapdError."""
    c = L.connect(os.fsencode(socket) if socket else None)
    if not c:
        raise MemoryError("heapc_connect: out of memory")
    try:
        if L.err(c):
            _raise(c, L.err(c))
        return _stats_of(c, name)
    finally:
        L.free_ctx(c)


def _stats_of(c, name):
    """heapc_stats on context c: the list of dicts; heapd's errors raise."""
    out = ctypes.POINTER(L.DaemonStats)()
    rc = L.stats(c, name.encode() if name else None, ctypes.byref(out))
    if rc:
        _raise(c, rc)
    try:
        return _stats_list(out)
    finally:
        L.stats_free(out)


def _stats_list(out):
    res = []
    for i in range(out.contents.nheaps):
        hs = out.contents.heaps[i]
        d = {f: getattr(hs, f) for f, _ in hs._fields_
             if f not in ("params", "ranks", "nranks", "collect_wait", "growth")}
        d["collect_wait"] = hs.collect_wait.as_dict()
        d["growth"] = hs.growth.as_dict()
        d["name"] = hs.name.decode()
        d["backend"] = out.contents.backend.decode()
        d["params"] = {f: getattr(hs.params, f) for f in
                       ("chunk_size", "initial_size", "va_size", "min_block",
                        "collect_timeout_ms", "local_size")}
        d["ranks"] = [{f: getattr(hs.ranks[j], f) for f, _ in L.RankStats._fields_}
                      for j in range(hs.nranks)]
        res.append(d)
    return res


_last = None


def _current():
    """The Heap attached last in this process and not closed, or None."""
    h = _last() if _last else None
    return h if h is not None and not h.closed else None


def _notify_preload(heap, closing=False):
    """Remembers the heap (wrap_collectives' default) and binds the NCCL
    preload library, when loaded, to its status page."""
    global _last
    import weakref
    if not closing:
        _last = weakref.ref(heap)
    f = getattr(L.lib, "hnccl_preload_bind", None)
    if f is None:
        return
    global _bound
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p]
    if not closing:
        from . import torch as _t
        _t.preload()          # installs the default release callback once
        _bound = heap._c
        f(heap._c)
    elif _bound == heap._c:
        _bound = None
        f(None)


_bound = None
