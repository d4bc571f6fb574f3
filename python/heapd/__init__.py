"""heapd: PyTorch tensors on heapd's symmetric heap.

    import heapd, torch
    with heapd.Heap.from_env() as heap:          # torchrun / srun: no arguments
        x = heap.zeros(1024, dtype=torch.float32)  # as torch.zeros; same offset on every rank
        y = heap.peer(x, (heap.rank + 1) % heap.world_size)   # the next rank's x
        del x, y                                 # frees the block (deferred; heap.free(x) too)
        heap.collect()                           # collective: reuse what all freed

empty/zeros/ones/full/empty_like/zeros_like/ones_like/full_like follow
torch's signatures (*size, dtype=None, device=None, requires_grad=False).
The n-th allocation must have the same size on every rank; a rank that
differs gets AsymmetryError (.n, .ranks, .sizes) and the heap is poisoned:
every rank's next call on it raises the same error. A tensor holds its heap:
the heap is detached when it is closed and no tensor (or peer view) of it is
left; a tensor's block is freed when its last reference goes. With the cuda
backend tensors are CUDA tensors on the rank's GPU (set it, e.g.
torch.cuda.set_device(LOCAL_RANK), before attaching); with the host backend
they are CPU tensors in shared memory. Heap.from_group(pg): one heap per
torch.distributed process group.

Errors are HeapdError subclasses carrying heapd's message (`.code`,
`.name`, `str(e)`). Threads: one Heap may be used from several threads
(libheapc serialises the calls; address and status reads are lock-free).
Fork: a forked child (a DataLoader worker) never uses its parent's
connection; its allocations raise StateError. `with heap.released("host"):`
gives the heap's memory back and restores it, content and addresses, at
the end (issue 30: release, restore, state). See docs/python.md.
"""
import ctypes
import os
import threading
import weakref

from . import _lib as L

__version__ = "0.1.0"

__all__ = ["__version__", "Heap", "HeapdError", "AsymmetryError", "PeerGoneError", "CollectiveTimeoutError",
           "HeapdConnectionError", "NotHeldError", "OutOfMemoryError", "StateError",
           "MismatchError", "BadFdError", "Status", "library_path", "stats"]

library_path = L.path
Status = L.Status

from ._errors import (_BY_CODE, AsymmetryError, BadFdError, CollectiveTimeoutError,  # noqa: F401
                      HeapdConnectionError, HeapdError, MismatchError, NotHeldError,
                      OutOfMemoryError, PeerGoneError, StateError, _raise)
from ._stats import _stats_of, stats  # noqa: F401
from ._args import _size_args
from ._release import _Release
from ._resume import _Resume


def _size(v):
    """An int, or a size string as heapd.conf takes it ("3G", "512M", "64KiB"),
    parsed by libheapc (heapc_parse_size): Python refuses what C refuses."""
    if v is None:
        return 0
    if isinstance(v, bool):
        raise TypeError(f"heapd: size {v!r}: want an int or a size string such as \"64M\"")
    if isinstance(v, int):
        if v < 0:
            raise ValueError(f"heapd: size {v}: negative")
        return v
    out = ctypes.c_uint64()
    if not isinstance(v, str) or L.parse_size(v.encode(), ctypes.byref(out)):
        raise ValueError(f"heapd: size {v!r} is not a size: want decimal digits and an "
                         "optional binary unit (K, M, G, T, KiB, MiB, GiB, TiB, B), e.g. "
                         "\"64M\" or \"1536M\", as heapd.conf takes it (no fraction, no \"MB\")")
    return out.value


def _torch_sees_cuda():
    import torch
    return torch.cuda.is_available()


def _device_mismatch(name, backend, device, socket):
    """Why heapd's memory is not what the caller gets tensors for, or None:
    a CUDA job on a host-memory heapd (backend = auto fell back: the driver
    was not ready when heapd started) unless device="cpu" asks for it."""
    import torch
    want = torch.device(device).type if device is not None else None
    where = socket or os.environ.get("HEAPD_SOCKET") or "/run/heapd/heapd.sock"
    if backend == "host" and (want == "cuda" or (want is None and _torch_sees_cuda())):
        return (f"heap {name!r}: torch sees CUDA but heapd at {where} serves host memory "
                "(backend host: heapd.conf says backend = host, or backend = auto found no "
                "ready CUDA driver when heapd started), so tensors would be CPU tensors; set "
                "backend = cuda in heapd.conf on GPU nodes and restart heapd, or pass "
                "device=\"cpu\" to use host memory on purpose")
    if backend == "cuda" and want == "cpu":
        return (f"heap {name!r}: device=\"cpu\", but heapd at {where} serves CUDA memory "
                "(backend cuda): use a host-backend heapd for CPU tensors")
    return None


def _policies():
    """{name: wire value}: libheapc's names (heapc_policy_name), 0 the default."""
    d, v = {None: 0}, 0
    while (n := L.policy_name(v)) != b"unknown":
        d[n.decode()], v = v, v + 1
    return d


_POLICY = _policies()
_RECLAIM = {None: 0, "default": 0, "eager": 1, "collect": 2}  # heapc_reclaim
_esize = {}


def _element_size(dtype):
    e = _esize.get(dtype)
    if e is None:
        import torch
        e = _esize[dtype] = torch.empty((), dtype=dtype).element_size()
    return e


# ---- tensors over heap memory -----------------------------------------------

_PID = os.getpid()   # this process; a forked child gets its own (below)


def _after_fork():
    global _PID
    _PID = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


class _Handle:
    """The connection and attachment; shared by the Heap and every tensor made
    on it, detached when the last of them is gone (or at close when none is).
    Only the process that attached uses it: in a forked child (a DataLoader
    worker) it is never detached, freed on or collected on (.pid)."""
    __slots__ = ("c", "lock", "pid", "owned", "__weakref__")

    def __init__(self, c):
        self.c = c
        self.lock = threading.RLock()
        self.pid = _PID
        self.owned = weakref.WeakValueDictionary()   # offset -> _Block not yet freed

    def mine(self):
        """The context when this process may use it, else None."""
        return self.c if self.pid == _PID else None

    def release(self):
        if self.pid != _PID:
            self.c = None           # the parent's: leave its connection alone
            return
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


class _Block:
    """One allocation of this rank: frees it (deferred, on the stream it was
    allocated on) when the last tensor over it is gone, unless Heap.free did."""
    __slots__ = ("h", "off", "stream", "__weakref__")

    def __init__(self, h, off, stream):
        self.h, self.off, self.stream = h, off, stream
        with h.lock:
            h.owned[off] = self

    def __del__(self):
        off, self.off = self.off, None
        h = self.h
        if off is None or h.pid != _PID:
            return
        try:
            with h.lock:
                c = h.c
                if not c:
                    return
                if self.stream is not None:
                    L.free_async(c, off, int(getattr(self.stream, "cuda_stream", self.stream)) or None)
                else:
                    L.free(c, off)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# Called with the heapc context before it is detached and released (the
# allocator route unregisters it from its shim).
_release_hooks = []


class _HostMem:
    """numpy's view of nbytes of heap memory; holds its owner (the handle, or
    the _Block of an own allocation)."""
    __slots__ = ("__array_interface__", "_h")

    def __init__(self, h, ptr, nbytes):
        self._h = h
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (ptr, False), "version": 3}


class _CudaMem:
    """torch's view (__cuda_array_interface__) of nbytes of device memory; holds its owner."""
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


class Heap(_Resume, _Release):
    """One rank's attachment to a heap (collective: every rank of the heap
    attaches before any returns).

    Heap(name, rank, world_size, socket=None, chunk_size=, initial_size=,
         va_size=, min_block=, policy="coalesce"|"seed", collect_timeout_ms=,
         device_uuid=None, local_size=0, job=None, timeout_ms=None, persist=None)
    Sizes take ints or strings ("64M"). socket: $HEAPD_SOCKET, else
    /run/heapd/heapd.sock. timeout_ms bounds the wait for any one reply
    (CollectiveTimeoutError), default unbounded (heapd bounds collectives).
    persist (issue 29): seconds the heap stays, content and all, once every
    rank is gone, so that a restarted job re-attaches to it (the same call:
    .resumed, .generation, tensor(name), committed(tag)); None: heapd.conf's
    persist (from_env: $HEAPD_PERSIST first), 0: none. A re-attach waits
    until every local rank of the heap is attached again, as the first
    attach does (at most collect_timeout_ms). reclaim (issue 27): "eager"
    (a block every rank freed is reused at once, no collect) or "collect"
    (at the next collect); None: heapd.conf's (eager). A heap spanning
    nodes, or under policy "seed", is always "collect": .reclaim says.
    grow_ahead (issue 27): spare chunks heapd keeps per rank, created ahead
    of need so that a growth only passes and maps them (offsets do not
    depend on it); None: heapd.conf's (1), 0: none, at most 16;
    .grow_ahead says what the heap got.
    trim_threshold (issue 30): automatic trim, a heap on one node; when the
    wholly free chunks (what trim() would give back) reach this many bytes
    (an int or a size string, "1G") at an allocation, that allocation runs
    the collective trim first on every rank, with no trim() call; None:
    heapd.conf's (default off), 0: none; .trim_threshold says what the heap
    got (0: none).
    extent_bound (issue 32): True keeps every block inside one extent (the
    initial chunks, or one run a growth mapped), so that each lies in one
    NCCL window when heapd.torch.register(heap, pg) registers the heap;
    coalesce policy only. .extent_bound says what the heap got.
    decide (issue 28): "local" makes each rank decide its allocations with a
    replica of the heap's allocator, no message to heapd but every
    decide_every-th (default 64; 2..4096); "daemon": heapd decides this
    rank's; None: $HEAPD_DECIDE, else the heap's way.
    """

    def __init__(self, name, rank, world_size, socket=None, *, chunk_size=0, initial_size=0,
                 va_size=0, min_block=0, policy=None, collect_timeout_ms=0, device_uuid=None,
                 local_size=0, job=None, timeout_ms=None, device=None, persist=None,
                 reclaim=None, grow_ahead=None, trim_threshold=None, extent_bound=False, decide=None,
                 decide_every=64, _from_env=False):
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
        if reclaim not in _RECLAIM:
            h.release()
            raise ValueError(f"heapd.Heap: reclaim {reclaim!r}: want 'eager' or 'collect'")
        if decide not in (None, "local", "daemon") or (decide == "local" and not 2 <= int(decide_every) <= 4096):
            h.release()
            raise ValueError(f"heapd.Heap: decide {decide!r}, decide_every {decide_every!r}: want 'local' "
                             "(decide_every 2 to 4096), 'daemon' or None")
        if grow_ahead is not None and not 0 <= int(grow_ahead) <= 16:
            h.release()
            raise ValueError(f"heapd.Heap: grow_ahead {grow_ahead!r}: want 0 (none) to 16 spare chunks")
        try:
            trim = -1 if trim_threshold is not None and _size(trim_threshold) == 0 else _size(trim_threshold)
        except (TypeError, ValueError):
            h.release()
            raise
        self._keep = (os.fsencode(device_uuid) if device_uuid else None,
                      job.encode() if job else None)
        p = L.Params(_size(chunk_size), _size(initial_size), _size(va_size), _size(min_block),
                     _POLICY[policy], int(collect_timeout_ms), self._keep[0], int(local_size),
                     self._keep[1], self._persist_s(persist, h), _RECLAIM[reclaim],
                     0 if grow_ahead is None else int(grow_ahead) or -1,   # heapc: 0 default, < 0 none
                     trim,                                                 # issue 30, the same
                     1 if extent_bound else 0,                             # issue 32
                     {None: 0, "daemon": -1}.get(decide, int(decide_every)))  # issue 28
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
        err = _device_mismatch(self.name, self.backend, device, socket)
        if err:
            h.release()
            raise MismatchError(-4, err)
        self._cuda = self.backend == "cuda"
        self._base = L.base(c, self.rank)
        self._status = L.Status()
        import torch
        self.device = (torch.device("cuda", torch.cuda.current_device()) if self._cuda
                       else torch.device("cpu"))
        self._bases = None
        self.closed = False
        self._await_peers(h)     # a re-attach: until every local rank is back (issue 29)
        _notify_preload(self)

    @classmethod
    def from_env(cls, name=None, socket=None, **kw):
        """Attach as the launcher says (heapc_attach_env): torchrun's RANK,
        WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID, or Slurm's
        SLURM_PROCID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_JOB_ID.
        name: $HEAPD_HEAP, else "torch-<run id>" / "slurm-<job>.<step>".
        With CUDA, the device is set to LOCAL_RANK (SLURM_LOCALID) first.
        A restarted job re-attaches to the heap its ranks left (persist=, or
        $HEAPD_PERSIST, or heapd.conf's persist kept it): the same call,
        then .resumed is True and tensor(name) / committed(tag) give back
        what it had.
        Raises HeapdError (code ERR_INVALID) naming a missing variable, and
        outside a launcher naming heapd.Heap(name, rank, world_size)."""
        try:
            return cls(name, 0, 0, socket, _from_env=True, **kw)
        except HeapdError as e:
            if "no launcher environment" not in str(e):
                raise
            raise HeapdError(e.code, str(e).replace(
                "call heapc_attach with the rank and world size",
                "create heapd.Heap(name, rank, world_size) with them")) from None

    @classmethod
    def from_group(cls, group=None, name=None, socket=None, **kw):
        """Attach one heap per torch.distributed process group (collective
        over the group: every rank of it calls from_group with it). Rank and
        world size are the group's (dist.get_rank(group), .get_world_size);
        the name is group rank 0's, broadcast to the group: `name`, else
        $HEAPD_HEAP plus the group's ranks when not the whole world, else a
        fresh unique one ("pg<n>-<hex>"). The ranks of the group on this node
        (by hostname) give local_size, so a group may span nodes. group None:
        the default (world) group. Several heaps per process: one per group,
        e.g. a tensor-parallel sub-group beside the world. nccl_windows=True
        (issue 32): extent_bound, and heapd.torch.register(heap, group)."""
        import socket as _so
        import uuid

        import torch.distributed as dist
        if not dist.is_initialized():
            raise StateError(-11, "heapd.Heap.from_group: torch.distributed is not initialised: "
                                  "call dist.init_process_group first, or use Heap.from_env()")
        g = group if group is not None else dist.group.WORLD
        rank, world = dist.get_rank(g), dist.get_world_size(g)
        if rank < 0:
            raise ValueError("heapd.Heap.from_group: this process is not a member of the group")
        ranks = dist.get_process_group_ranks(g)
        if rank == 0:
            env = os.environ.get("HEAPD_HEAP")
            if name:
                mine = name
            elif env:
                whole = world == dist.get_world_size()
                mine = env if whole else f"{env}-g{'.'.join(map(str, ranks))}"
            else:
                mine = f"pg{world}-{uuid.uuid4().hex[:16]}"
        else:
            mine = None
        obj = [mine]
        dist.broadcast_object_list(obj, src=ranks[0], group=g)
        hosts = [None] * world
        dist.all_gather_object(hosts, _so.gethostname(), group=g)
        local = hosts.count(_so.gethostname())
        kw.setdefault("local_size", 0 if local == world else local)
        kw.setdefault("job", obj[0])
        windows = kw.pop("nccl_windows", False)
        h = cls(obj[0], rank, world, socket, **dict(kw, extent_bound=True) if windows else kw)
        return _register_or_close(h, g) if windows else h

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
        if self._h is not None and self._h.pid != _PID:
            raise StateError(-11, f"heap {self.name!r}: this process (pid {os.getpid()}) is a "
                             f"forked child of pid {self._h.pid}, which attached the heap; a "
                             "child (a DataLoader worker) cannot allocate, free or collect on "
                             "its parent's heap: allocate in the parent, or attach a Heap of "
                             "its own in the child")
        if self.closed:
            raise StateError(-11, f"heap {self.name!r}: closed")
        return self._c

    # ---- allocation ----
    def _alloc(self, nbytes, name=None):
        """The rank's next allocation: (pointer, offset). Outputs per call: a
        Heap is used from several threads."""
        c = self._cx()
        ptr, off = ctypes.c_void_p(), ctypes.c_uint64()
        if name is None and self.device.type == "cuda":  # issue 27: on torch's current stream, so a
            import torch                                  # block freed there is reused with no wait
            s = torch.cuda.current_stream(self.device).cuda_stream
            rc = L.alloc_async(c, max(int(nbytes), 1), s or None, ctypes.byref(ptr), ctypes.byref(off))
        else:
            rc = L.alloc_named(c, max(int(nbytes), 1), self._name_arg(name), ctypes.byref(ptr),
                               ctypes.byref(off))
        if rc:
            self._alloc_failed(c, rc)
        return ptr.value, off.value

    def _check_device(self, what, device):
        if device is None:
            return
        import torch
        d = torch.device(device)
        if d.type != self.device.type or (d.index is not None and d.index != self.device.index):
            raise ValueError(f"heapd.Heap.{what}(): device={str(d)!r}, but heap {self.name!r} "
                             f"serves {str(self.device)!r} memory (backend {self.backend!r}); "
                             "leave device out, or pass the heap's device")

    def _new(self, what, size, dtype, device, requires_grad, name=None):
        import torch
        shape = _size_args(what, size)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"heapd.Heap.{what}(): dtype={dtype!r} is not a torch.dtype")
        self._check_device(what, device)
        n = 1
        for d in shape:
            n *= d
        nb = n * _element_size(dtype)
        # Checked before this point: an error consumes no allocation number.
        p, off = self._alloc(nb, name)
        stream = torch.cuda.current_stream(self.device) if self._cuda else None
        # A named block stays until Heap.free (a restarted job finds it).
        owner = self._named_owner(name) if name else _Block(self._h, off, stream)
        t = _bytes_tensor(owner, self._cuda, p, max(nb, 1))[:nb]
        t = t.view(dtype).view(shape)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def empty(self, *size, dtype=None, device=None, requires_grad=False, name=None):
        """As torch.empty: a tensor of `size` (ints, or one tuple) and `dtype`
        (default torch.get_default_dtype()) on the heap, the rank's next
        allocation. device: None or the heap's (Heap.device). Contents:
        whatever the block held. Freed when its last tensor is gone, unless
        it has a name (issue 29; every creation call takes name=): a named
        block stays until Heap.free, and a job that re-attaches finds it
        with tensor(name)."""
        return self._new("empty", size, dtype, device, requires_grad, name)

    def zeros(self, *size, dtype=None, device=None, requires_grad=False, name=None):
        """As torch.zeros: empty(), then zeroed."""
        t = self._new("zeros", size, dtype, device, False, name)
        t.zero_()
        return t.requires_grad_(True) if requires_grad else t

    def ones(self, *size, dtype=None, device=None, requires_grad=False, name=None):
        """As torch.ones."""
        t = self._new("ones", size, dtype, device, False, name)
        t.fill_(1)
        return t.requires_grad_(True) if requires_grad else t

    def full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False, name=None):
        """As torch.full: dtype from fill_value when not given (bool, int64,
        the default float dtype, complex)."""
        import torch
        if dtype is None:
            dtype = torch.full((), fill_value).dtype
        t = self._new("full", (size,) if isinstance(size, (tuple, list)) else (size,),
                      dtype, device, False, name)
        t.fill_(fill_value)
        return t.requires_grad_(True) if requires_grad else t

    def _like(self, what, t, dtype, device, requires_grad, name=None):
        return self._new(what, (tuple(t.shape),), t.dtype if dtype is None else dtype, device,
                         requires_grad, name)

    def empty_like(self, t, *, dtype=None, device=None, requires_grad=False, name=None):
        """As torch.empty_like, on the heap (contiguous; t's shape and dtype)."""
        return self._like("empty_like", t, dtype, device, requires_grad, name)

    def zeros_like(self, t, *, dtype=None, device=None, requires_grad=False, name=None):
        x = self._like("zeros_like", t, dtype, device, False, name)
        x.zero_()
        return x.requires_grad_(True) if requires_grad else x

    def ones_like(self, t, *, dtype=None, device=None, requires_grad=False, name=None):
        x = self._like("ones_like", t, dtype, device, False, name)
        x.fill_(1)
        return x.requires_grad_(True) if requires_grad else x

    def full_like(self, t, fill_value, *, dtype=None, device=None, requires_grad=False,
                  name=None):
        x = self._like("full_like", t, dtype, device, False, name)
        x.fill_(fill_value)
        return x.requires_grad_(True) if requires_grad else x

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
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"heap {self.name!r}: rank {rank!r} does not exist: the heap has "
                             f"world size {self.world_size} (ranks 0 to {self.world_size - 1})")
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
        self._disarm(off)           # freed here, not again when its tensors are gone
        if stream is None and getattr(t, "is_cuda", False):
            import torch
            stream = torch.cuda.current_stream(t.device)
        if stream is not None:
            rc = L.free_async(c, off, int(getattr(stream, "cuda_stream", stream)) or None)
        else:
            rc = L.free(c, off)
        if rc:
            _raise(c, rc)

    def _disarm(self, off):
        """The block at off is freed explicitly: its owner must not free it again."""
        h = self._h
        if h is not None:
            with h.lock:
                b = h.owned.pop(off, None)
            if b is not None:
                b.off = None

    def free_offset(self, offset):
        """free() by the block's offset (heapc_free)."""
        c = self._cx()
        self._disarm(int(offset))
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
    def bases(self):
        """The device pointer table: an int64 tensor of world_size entries on
        heap.device, entry r the address of rank r's copy of offset 0 in this
        process (0 for a rank served by another node's heapd). A kernel
        (Triton, CUDA) reaches rank r's copy of a block at bases[r] +
        heap.offset(t) - as iris's heap_bases and torch's buffer_ptrs_dev.
        Every rank's extent is reserved at attach, so the table stays current
        across growths (an offset an allocation returned is mapped for every
        local rank)."""
        if self._bases is None:
            import torch
            b = [L.base(self._c, r) or 0 for r in range(self.world_size)]
            self._bases = torch.tensor(b, dtype=torch.int64, device=self.device)
        return self._bases

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
        device_total, ..., state (.state_name), resident, releases,
        restores): a few loads, no syscall."""
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


_last = None


def _register_or_close(h, group):
    from ._windows import register
    try:
        register(h, group)
    except BaseException:
        h.close()
        raise
    return h


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
