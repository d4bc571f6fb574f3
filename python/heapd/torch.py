"""heapd.torch: torch's allocator on the heap, and collectives with the
status-page probe.

- use_heap(heap): torch allocations inside `with` land on the symmetric heap
  (CUDA only; install_allocator() must run before the first CUDA tensor).
- wrap_collectives(probe=[...], skip=[...], threshold="3G", on_low=...):
  torch.distributed's collectives probe the status page (no LD_PRELOAD).
- preload(): the LD_PRELOAD'ed libheapc_nccl_preload.so (None without it):
  its counters, policy and release callback.
- register(heap, pg): the heap as NCCL symmetric windows of pg's
  communicator (issue 32, NCCL >= 2.27): heap tensors take NCCL's symmetric
  kernels with no per-tensor registration.
"""
import contextlib
import ctypes
import os
import threading

import torch

from . import Heap, HeapdError, _lib as L, _size
from ._windows import NcclError, Registration, WindowStats, register

__all__ = ["use_heap", "install_allocator", "allocator_counters", "wrap_collectives",
           "preload", "Preload", "OPS", "op_of", "register", "Registration", "WindowStats",
           "NcclError"]

# ---- ops and their names (as client/heapc_nccl.h's table) -------------------
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
       "send", "recv", "group_start", "group_end")
_ALIASES = {
    "all_reduce": ("all_reduce", "allreduce"),
    "all_gather": ("all_gather", "all_gather_into_tensor", "allgather", "_allgather_base",
                   "allgather_into_tensor_coalesced", "_all_gather_base"),
    "reduce_scatter": ("reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
                       "reduce_scatter_tensor_coalesced"),
    "broadcast": ("broadcast",),
    "reduce": ("reduce",),
    "all_to_all": ("all_to_all", "all_to_all_single", "alltoall", "alltoall_base"),
    "send": ("send", "isend"),
    "recv": ("recv", "irecv"),
    "group_start": ("group_start",),
    "group_end": ("group_end",),
}
_NAME2OPS = {}
for _op, _names in _ALIASES.items():
    for _n in _names:
        _NAME2OPS.setdefault(_n, set()).add(_op)
_NAME2OPS["batch_isend_irecv"] = {"send", "recv"}


def op_of(name):
    """The ops a name means (an op, a torch.distributed or c10d name, "all",
    "none" -> empty); ValueError naming the valid names otherwise."""
    if name == "all":
        return set(OPS)
    if name == "none":
        return set()
    if name not in _NAME2OPS:
        raise ValueError(f"heapd.torch: unknown op name {name!r}; valid: all, none, "
                         + ", ".join(sorted(_NAME2OPS)))
    return set(_NAME2OPS[name])


def _names(v):
    if v is None:
        return []
    if isinstance(v, str):
        return [x for x in v.replace(",", " ").split() if x]
    return list(v)


# ---- the LD_PRELOAD library ---------------------------------------------------

class ProbeInfo(ctypes.Structure):
    _fields_ = [("op", ctypes.c_int), ("op_name", ctypes.c_char_p), ("source", ctypes.c_int),
                ("device_free", ctypes.c_uint64), ("device_total", ctypes.c_uint64),
                ("threshold", ctypes.c_uint64), ("below", ctypes.c_int),
                ("cuda_queried", ctypes.c_int), ("have_page", ctypes.c_int), ("page", L.Status)]


class NcclCounters(ctypes.Structure):
    _fields_ = [("calls", ctypes.c_uint64 * len(OPS))] + [
        (n, ctypes.c_uint64) for n in ("probes", "probe_errors", "below", "callbacks",
                                       "cuda_queries", "cuda_reused", "nccl_errors")]


_RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ProbeInfo))


def _default_release(info):
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class Preload:
    """libheapc_nccl_preload.so in this process: its process-wide context."""

    def __init__(self, lib):
        self.lib = lib
        f = lambda n, r, *a: _set(getattr(lib, n), r, a)  # noqa: E731
        self._ctx = f("hnccl_preload_ctx", ctypes.c_void_p)()
        self._counters = f("hnccl_get_counters", ctypes.c_int, ctypes.c_void_p,
                           ctypes.POINTER(NcclCounters))
        self._reset = f("hnccl_reset_counters", ctypes.c_int, ctypes.c_void_p)
        self._set_cb = f("hnccl_set_release_cb", ctypes.c_int, ctypes.c_void_p, _RELEASE_FN,
                         ctypes.c_void_p)
        self._set_thr = f("hnccl_set_threshold", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64)
        self._set_pol = f("hnccl_set_policy", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p,
                          ctypes.c_int)
        self._errstr = f("hnccl_errstr", ctypes.c_char_p, ctypes.c_void_p)
        self._perr = f("hnccl_preload_errstr", ctypes.c_char_p)
        self._missing = f("hnccl_preload_missing", ctypes.c_char_p)
        self._mask = f("hnccl_probe_mask", ctypes.c_uint32, ctypes.c_void_p)
        self._cb = None
        self.py_callbacks = 0

    def counters(self):
        """{'calls': {op: n}, 'probes', 'probe_errors', 'below', 'callbacks',
        'nccl_errors', ...}: what the intercepted NCCL calls did."""
        k = NcclCounters()
        self._counters(self._ctx, ctypes.byref(k))
        d = {n: getattr(k, n) for n, _ in k._fields_ if n != "calls"}
        d["calls"] = dict(zip(OPS, list(k.calls)))
        return d

    def reset_counters(self):
        self._reset(self._ctx)

    def probe_ops(self):
        m = self._mask(self._ctx)
        return [op for i, op in enumerate(OPS) if m & (1 << i)]

    def set_policy(self, names, probe=True):
        """hnccl_set_policy: names (list or "a,b") probe (probe=True) or skip."""
        s = ",".join(_names(names)).encode()
        if self._set_pol(self._ctx, s, 1 if probe else 0):
            raise ValueError(self._errstr(self._ctx).decode())

    def set_threshold(self, threshold):
        self._set_thr(self._ctx, _size(threshold))

    def set_release_callback(self, fn=_default_release):
        """fn(info) runs (on the NCCL-calling thread) when a probe finds free
        memory below the threshold; info has device_free, device_total,
        threshold, op_name, page. Default: torch.cuda.empty_cache. None
        removes it."""
        if fn is None:
            self._cb = None
            self._set_cb(self._ctx, _RELEASE_FN(), None)
            return

        def tramp(_arg, info):
            self.py_callbacks += 1
            try:
                fn(info.contents)
            except Exception:  # noqa: BLE001 - never unwind through NCCL's caller
                pass
        self._cb = _RELEASE_FN(tramp)
        self._set_cb(self._ctx, self._cb, None)

    def last_error(self):
        """The last intercepted failure with the memory state, or the
        environment's error, or ""."""
        return self._perr().decode()

    def missing(self):
        return self._missing().decode()


def _set(f, res, args):
    f.restype = res
    f.argtypes = list(args)
    return f


_preload = None


def preload():
    """The Preload object when libheapc_nccl_preload.so is in the process
    (LD_PRELOAD), else None. The first call installs the default release
    callback (torch.cuda.empty_cache)."""
    global _preload
    if _preload is None:
        g = ctypes.CDLL(None)
        if not hasattr(g, "hnccl_preload_ctx"):
            return None
        _preload = Preload(g)
        _preload.set_release_callback()
    return _preload


# ---- wrap_collectives: the same policy at the Python level -------------------

_WRAPPABLE = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
              "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast",
              "reduce", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
              "batch_isend_irecv")


class Wrapped:
    """What wrap_collectives installed: .counters (calls per function, probes,
    below, callbacks, errors), .unwrap()."""

    def __init__(self):
        self.originals = {}
        self.counters = {"calls": {}, "probes": 0, "below": 0, "callbacks": 0, "errors": 0,
                         "probe_errors": 0}
        self.lock = threading.Lock()

    def unwrap(self):
        import torch.distributed as dist
        for n, f in self.originals.items():
            setattr(dist, n, f)
        self.originals.clear()


def _memory_state(heap):
    try:
        s = heap.status()
    except Exception as e:  # noqa: BLE001
        return f"memory: unknown ({e})"
    g = lambda b: f"{b / (1 << 30):.2f} GiB"  # noqa: E731
    return (f"memory (heapd status page, rank {heap.rank}): device free {g(s.device_free)} of "
            f"{g(s.device_total)}; heap mapped {g(s.mapped)}, live {g(s.live)}, released "
            f"{g(s.released)}, free {g(s.free)}; this rank holds {g(s.rank_held)}")


def _resolve(probe, skip):
    """The ops that probe: "all"/"none" in either list apply first (in probe:
    every op / no op probes; in skip: the opposite), then the named ops."""
    mask = set()
    for lst, on in ((probe, True), (skip, False)):
        for n in lst:
            if n == "all":
                mask = set(OPS) if on else set()
            elif n == "none":
                mask = set() if on else set(OPS)
    named_p = {o for n in probe if n not in ("all", "none") for o in op_of(n)}
    named_s = {o for n in skip if n not in ("all", "none") for o in op_of(n)}
    if named_p & named_s:
        raise ValueError(f"heapd.torch.wrap_collectives: op(s) {sorted(named_p & named_s)} "
                         "named in both probe and skip")
    return (mask | named_p) - named_s


def wrap_collectives(heap=None, probe=("all_gather_into_tensor",), skip=(), threshold="3G",
                     on_low=None, module=None):
    """Replaces torch.distributed's collective functions (in `module`,
    default torch.distributed) by wrappers that, for the ops named in
    `probe`, read free device memory from heap's status page (a few loads)
    and call on_low(info) when it is below `threshold`, then call the
    original. Ops in `skip`, and ops named nowhere, do not probe. Names as
    heapc_nccl.h's table: torch.distributed names (all_gather_into_tensor),
    c10d names (_allgather_base), op names (all_gather), "all", "none". An
    exception of the original gets the memory state added (as a note).
    on_low default: torch.cuda.empty_cache. Code that imported a function
    before the call (from torch.distributed import all_reduce) keeps the
    original. Returns a Wrapped (.counters, .unwrap())."""
    import torch.distributed as dist
    mod = module or dist
    if heap is None:
        from . import _current
        heap = _current()
    if heap is None:
        raise ValueError("heapd.torch.wrap_collectives: no heap: pass heap=, or attach one first")
    pro = _resolve(_names(probe), _names(skip))
    thr = _size(threshold)
    cb = on_low if on_low is not None else _default_release
    w = Wrapped()
    status = L.status
    cptr = heap._c
    st = L.Status()
    byref = ctypes.byref(st)

    def make(name, orig, probes):
        w.counters["calls"][name] = 0

        def wrapper(*a, **kw):
            w.counters["calls"][name] += 1
            if probes:
                if status(cptr, byref) == 0:
                    w.counters["probes"] += 1
                    if st.device_free < thr:
                        w.counters["below"] += 1
                        w.counters["callbacks"] += 1
                        cb({"op": name, "device_free": st.device_free,
                            "device_total": st.device_total, "threshold": thr,
                            "page": st.as_dict()})
                else:
                    w.counters["probe_errors"] += 1
            try:
                return orig(*a, **kw)
            except Exception as e:
                w.counters["errors"] += 1
                note = f"heapd: {name} failed; {_memory_state(heap)}"
                if hasattr(e, "add_note"):
                    e.add_note(note)
                    raise
                raise RuntimeError(f"{e}; {note}") from e
        wrapper.__name__ = name
        wrapper.__wrapped__ = orig
        wrapper.heapd_probes = probes
        return wrapper

    for name in _WRAPPABLE:
        orig = getattr(mod, name, None)
        if orig is None:
            continue
        orig = getattr(orig, "__wrapped__", orig) if getattr(orig, "heapd_probes", None) is not None else orig
        ops = op_of(name) if name in _NAME2OPS else set()
        w.originals[name] = orig
        setattr(mod, name, make(name, orig, bool(ops & pro)))
    return w


# ---- the allocator route -------------------------------------------------------

_alloc_lock = threading.Lock()
_shim = None
_pluggable = None


def _shim_path():
    env = os.environ.get("HEAPD_TORCH_LIB") or os.environ.get("HEAPC_TORCH_LIB")
    if env:
        return env
    p = os.path.join(os.path.dirname(L.path) if os.path.isabs(L.path) else "", "libheapc_torch.so")
    if os.path.isabs(p) and os.path.exists(p):
        return p
    from ._lib import _root
    for b in ("build", "build-gpu"):
        q = os.path.join(_root, b, "libheapc_torch.so")
        if os.path.exists(q):
            return q
    return "libheapc_torch.so"


def install_allocator():
    """Makes torch allocate CUDA memory through heapd's shim
    (CUDAPluggableAllocator + change_current_allocator). Must run before
    anything initialises torch's CUDA state in the process (the first CUDA
    tensor, torch.cuda.set_device, creating a heapd.Heap with CUDA). Outside use_heap the shim uses the CUDA
    driver's stream-ordered allocator (cuMemAllocAsync); inside, the heap.
    Idempotent. RuntimeError without CUDA, or when torch's allocator has
    already been used."""
    global _shim, _pluggable
    with _alloc_lock:
        if _pluggable is not None:
            return _pluggable
        if not torch.cuda.is_available():
            raise RuntimeError("heapd.torch: the allocator route needs CUDA (torch sees no GPU); "
                               "on the host backend use Heap.empty/zeros")
        path = _shim_path()
        shim = ctypes.CDLL(path)
        addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
        _set(shim.heapc_torch_init, ctypes.c_int, [ctypes.c_void_p] * 7)
        asym = addr(L.last_asymmetry) if L.last_asymmetry is not None else None
        if shim.heapc_torch_init(addr(L.alloc_async), addr(L.free_async), addr(L.errstr), addr(L.base),
                                 addr(L.rank), addr(L.mapped), asym):
            raise RuntimeError("heapd.torch: heapc_torch_init failed")
        from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator
        pl = CUDAPluggableAllocator(path, "heapc_torch_alloc", "heapc_torch_free")
        try:
            change_current_allocator(pl)
        except RuntimeError as e:
            raise RuntimeError(
                "heapd.torch.install_allocator: torch's CUDA allocator is already in use in this "
                "process (" + str(e) + "); call heapd.torch.install_allocator() before the first "
                "CUDA tensor, torch.cuda.set_device or heapd.Heap, e.g. right after "
                "`import heapd.torch`") from None
        _set(shim.heapc_torch_register, ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64])
        _set(shim.heapc_torch_unregister, ctypes.c_int, [ctypes.c_void_p])
        _set(shim.heapc_torch_set_current, ctypes.c_void_p, [ctypes.c_void_p])
        _set(shim.heapc_torch_last_error, ctypes.c_char_p, [])
        _set(shim.heapc_torch_last_code, ctypes.c_int, [])
        if hasattr(shim, "heapc_torch_last_asymmetry"):  # a shim of before issue 31: no figures
            _set(shim.heapc_torch_last_asymmetry, ctypes.c_size_t,
                 [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32),
                  ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t])
        _set(shim.heapc_torch_counters, None, [ctypes.c_uint64 * 6])
        _shim, _pluggable = shim, pl
        return pl


def allocator_counters():
    """The shim's counters: heap_allocs, heap_frees, heap_failures,
    driver_allocs, driver_frees, unknown_frees."""
    if _shim is None:
        return None
    a = (ctypes.c_uint64 * 6)()
    _shim.heapc_torch_counters(a)
    return dict(zip(("heap_allocs", "heap_frees", "heap_failures", "driver_allocs",
                     "driver_frees", "unknown_frees"), list(a)))


_registered = set()


def _unregister(c):
    if _shim is not None and c in _registered:
        _shim.heapc_torch_unregister(c)
        _registered.discard(c)


import heapd as _heapd  # noqa: E402
_heapd._release_hooks.append(_unregister)


@contextlib.contextmanager
def use_heap(heap):
    """Every torch CUDA allocation inside the block (any thread of the
    process) is an allocation of `heap` of exactly the requested size; every
    free of such a tensor, whenever it happens, is a deferred heap free. So
    the n-th allocation has the same offset on every rank whatever order the
    ranks free in. An allocation heapd refuses (a rank whose allocation
    sequence differs: ERR_ASYMMETRY) is served by the driver instead - torch's
    pluggable allocator cannot take a failure - and the block's end raises
    the HeapdError (AsymmetryError, ...) with heapd's message. Not nested
    across heaps. Needs CUDA and
    install_allocator() before the first CUDA tensor (called here if that is
    still possible)."""
    if not isinstance(heap, Heap):
        raise TypeError("heapd.torch.use_heap: want a heapd.Heap")
    if not torch.cuda.is_available() or heap.backend != "cuda":
        raise RuntimeError(f"heapd.torch.use_heap: needs CUDA and a cuda-backend heapd (torch "
                           f"CUDA available: {torch.cuda.is_available()}, heap backend: "
                           f"{heap.backend!r}); on the host backend use heap.empty/zeros")
    install_allocator()
    key = heap._c
    if key not in _registered:
        va = L.Params()
        L.get_params(heap._c, ctypes.byref(va))
        if _shim.heapc_torch_register(heap._c, va.va_size):
            raise RuntimeError("heapd.torch.use_heap: too many heaps registered (16)")
        _registered.add(key)
    prev = _shim.heapc_torch_set_current(heap._c)
    if prev and prev != heap._c:
        _shim.heapc_torch_set_current(prev)
        raise RuntimeError("heapd.torch.use_heap: another heap is current; use_heap blocks of "
                           "different heaps do not nest")
    failures = allocator_counters()["heap_failures"]
    try:
        yield heap
    finally:
        _shim.heapc_torch_set_current(prev)
    n = allocator_counters()["heap_failures"] - failures
    if n:
        raise _refusal(_shim, n)


def _refusal(shim, n):
    """The HeapdError of a use_heap block whose n allocations heapd refused:
    the last refusal's code and message, and for an asymmetric allocation
    heapd's figures (AsymmetryError's n, ranks, sizes)."""
    from . import _BY_CODE, AsymmetryError
    code = shim.heapc_torch_last_code()
    msg = (f"heapd.torch.use_heap: {n} allocation(s) in the block were refused by heapd and "
           f"came from the driver instead (not on the heap); the last: "
           f"{shim.heapc_torch_last_error().decode()}")
    if code == -5 and hasattr(shim, "heapc_torch_last_asymmetry"):
        an = ctypes.c_uint64()
        ranks, sizes = (ctypes.c_uint32 * L.ASYM_MAX)(), (ctypes.c_uint64 * L.ASYM_MAX)()
        k = min(shim.heapc_torch_last_asymmetry(ctypes.byref(an), ranks, sizes, L.ASYM_MAX), L.ASYM_MAX)
        return AsymmetryError(code, msg, (an.value, list(ranks[:k]), list(sizes[:k])) if k else None)
    return _BY_CODE.get(code, HeapdError)(code, msg)


def allocator_last_error():
    return _shim.heapc_torch_last_error().decode() if _shim else ""
