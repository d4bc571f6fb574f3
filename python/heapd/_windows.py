"""Issue 32: a heap as NCCL windows (heapd.torch.register): libheapc_nccl's
hnccl_register_heap through ctypes. The heap's mapped extent, then every
growth as the rank maps it, is registered with the communicator as
NCCL_WIN_COLL_SYMMETRIC windows, so heap tensors passed to collectives take
NCCL's symmetric kernels (NCCL >= 2.27) with no per-tensor registration;
release, trim and close deregister first (docs/python.md)."""
import ctypes
import os

from . import _lib as L
from ._errors import HeapdError, StateError

__all__ = ["register", "Registration", "WindowStats", "NcclError"]


_HNCCL_NAMES = {-1: "ERR_INVAL", -2: "ERR_LOAD", -3: "ERR_SOURCE", -4: "ERR_OOM"}
_NCCL_NAMES = ("ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
               "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress")


class NcclError(HeapdError):
    """hnccl_register_heap failed: .code is NCCL's ncclResult_t (> 0) or a
    negative HNCCL_E* code (-2 ERR_LOAD: no libheapc_nccl, no libnccl.so.2,
    or one before 2.27; -1 ERR_INVAL); .name as hnccl_errname."""

    def __init__(self, code, message):
        RuntimeError.__init__(self, message)
        self.code = code
        self.name = (_HNCCL_NAMES.get(code) if code < 0 else
                     _NCCL_NAMES[code] if code < len(_NCCL_NAMES) else None) or "ERR_UNKNOWN"


class WindowStats(ctypes.Structure):
    """hnccl_window_stats (client/heapc_nccl.h)."""
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "registered_bytes", "windows", "extents", "registrations", "deregistrations",
        "register_errors", "overlaps_skipped")] + [("registered", ctypes.c_int)]


def _nccl_lib():
    """libheapc_nccl's functions, from the libheapc copy the package uses:
    the LD_PRELOAD library carries them; else libheapc_nccl.so beside
    libheapc.so (which it links: the same library, so the same contexts)."""
    if hasattr(L.lib, "hnccl_register_heap"):
        return L.lib
    tried = []
    names = ["libheapc_nccl.so.0", "libheapc_nccl.so"]
    if L.path and os.sep in L.path:
        d = os.path.dirname(L.path)
        names = [os.path.join(d, "libheapc_nccl.so.0"), os.path.join(d, "libheapc_nccl.so")] + names
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError as e:
            tried.append(f"{n}: {e}")
    raise NcclError(-2, "heapd.torch.register: libheapc_nccl not found; tried " + "; ".join(tried) +
                    ". Build it (make) beside libheapc.so, or install it (make install)")


def _bind(lib):
    sig = {
        "hnccl_new": (ctypes.c_void_p, [ctypes.c_void_p]),
        "hnccl_free": (None, [ctypes.c_void_p]),
        "hnccl_errstr": (ctypes.c_char_p, [ctypes.c_void_p]),
        "hnccl_register_heap": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
        "hnccl_deregister_heap": (ctypes.c_int, [ctypes.c_void_p]),
        "hnccl_get_window_stats": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(WindowStats)]),
    }
    out = {}
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
        out[name] = f
    return out


def _comm_ptr(pg):
    """The ncclComm_t of pg: an int is taken as the pointer itself; a torch
    ProcessGroup gives its NCCL backend's _comm_ptr() (ProcessGroupNCCL,
    torch 2.3 and later)."""
    if isinstance(pg, int) and not isinstance(pg, bool):
        if pg <= 0:
            raise ValueError(f"heapd.torch.register: communicator pointer {pg:#x} is not one")
        return pg
    backend = pg
    get = getattr(pg, "_get_backend", None)
    if get is not None:
        import torch
        try:
            backend = get(torch.device("cuda"))
        except Exception as e:  # noqa: BLE001 - torch raises RuntimeError or ValueError
            raise TypeError(f"heapd.torch.register: process group {type(pg).__name__} has no NCCL "
                            f"backend ({e}); create it with backend='nccl'") from None
    f = getattr(backend, "_comm_ptr", None)
    if f is None:
        raise TypeError(f"heapd.torch.register: {type(backend).__name__} has no _comm_ptr() (a "
                        "ProcessGroupNCCL of torch 2.3 or later has it); pass the ProcessGroup of "
                        "an NCCL group, or the ncclComm_t as an int")
    ptr = int(f())
    if not ptr:
        raise StateError(-11, "heapd.torch.register: the NCCL communicator is not created yet "
                         "(torch makes it at the group's first collective, or with eager init: "
                         "init_process_group(device_id=...)); run a collective first")
    return ptr


class Registration:
    """A heap registered as NCCL windows: .stats() (registered_bytes,
    windows, extents, registrations, deregistrations, register_errors,
    overlaps_skipped, registered), .close() (deregisters: collective over the
    communicator). The heap keeps it (heap.nccl_windows) until it closes."""

    def __init__(self, heap, comm):
        self._f = _bind(_nccl_lib())
        self._pid = os.getpid()   # a forked child (a DataLoader worker) never touches it
        self._heap = heap
        self._x = self._f["hnccl_new"](heap._c)
        if not self._x:
            raise MemoryError("hnccl_new: out of memory")
        rc = self._f["hnccl_register_heap"](self._x, ctypes.c_void_p(comm), heap._c)
        if rc:
            msg = (self._f["hnccl_errstr"](self._x) or b"").decode(errors="replace")
            self._f["hnccl_free"](self._x)
            self._x = None
            raise NcclError(rc, msg)

    def stats(self):
        st = WindowStats()
        if self._x:
            self._f["hnccl_get_window_stats"](self._x, ctypes.byref(st))
        d = {n: getattr(st, n) for n, _ in WindowStats._fields_}
        d["registered"] = bool(d["registered"])
        return d

    def close(self):
        """Deregisters every window (collective: every rank closes) and
        frees the context. The heap's close does it too."""
        x, self._x = self._x, None
        if x and os.getpid() != self._pid:
            return   # the parent's context and communicator: leave them alone
        if x:
            rc = self._f["hnccl_deregister_heap"](x)
            msg = (self._f["hnccl_errstr"](x) or b"").decode(errors="replace")
            self._f["hnccl_free"](x)
            if rc:
                raise NcclError(rc, msg)

    def __del__(self):
        x, self._x = getattr(self, "_x", None), None
        if x and os.getpid() == getattr(self, "_pid", None):
            self._f["hnccl_free"](x)   # a forked child's copy frees nothing (NCCL calls there may hang)


def register(heap, pg):
    """Registers heap (a Heap, attached) with the NCCL communicator of pg (a
    ProcessGroupNCCL, or the ncclComm_t as an int) as symmetric windows.
    Collective: every rank of the communicator registers its heap at the
    same point. Returns the Registration (also heap.nccl_windows). Raises
    NcclError (NCCL refused, or no NCCL 2.27), StateError (heap closed,
    already registered), TypeError (no NCCL communicator)."""
    if heap.closed:
        raise StateError(-11, "heapd.torch.register: the heap is closed; attach it again")
    if getattr(heap, "nccl_windows", None) is not None:
        raise StateError(-11, "heapd.torch.register: this heap is registered already "
                         "(heap.nccl_windows); close that registration first")
    reg = Registration(heap, _comm_ptr(pg))
    heap.nccl_windows = reg
    return reg
