"""ctypes bindings of libheapc (client/heapc.h) and of the NCCL preload
library when it is loaded. Function pointers are looked up once, at import.

Which libheapc: when libheapc_nccl_preload.so is in the process (LD_PRELOAD),
its copy (it carries libheapc, exported) - one copy of libheapc per process,
so the preload's probe reads the page of the heap this package attached.
Otherwise $HEAPD_LIB (or its old name $HEAPC_LIB; a path), then a libheapc.so
inside the package (a pip install that bundled one), then the build tree of
the checkout this package lies in (build/, build-gpu/), then the system's
libheapc.so.0. At import the struct layouts are checked against the
library's (heapc_abi_version, heapc_sizeof): a libheapc of another layout
raises ImportError instead of being read as garbage."""
import ctypes
import os
from ctypes import (POINTER, Structure, byref, c_char_p, c_double, c_int, c_int32, c_int64, c_size_t,
                    c_uint32, c_uint64, c_void_p)

_here = os.path.dirname(os.path.abspath(__file__))
_root = os.path.dirname(os.path.dirname(_here))


def _find():
    tried = []
    glob = ctypes.CDLL(None)
    if hasattr(glob, "hnccl_preload_bind") and hasattr(glob, "heapc_connect"):
        return glob, "the LD_PRELOAD'ed libheapc_nccl_preload.so", None
    var = "HEAPD_LIB" if os.environ.get("HEAPD_LIB") else "HEAPC_LIB"
    env = os.environ.get(var)
    if env:
        try:
            return ctypes.CDLL(env), env, None
        except OSError as e:
            raise ImportError(f"heapd: {var}={env} cannot be loaded: {e}; point {var} "
                              "at a libheapc.so built for this machine (make, or make STATIC=1 "
                              "on a machine without libprotobuf-c)") from None
    # A libheapc.so shipped inside the package (pip install with HEAPD_BUNDLE_LIB)
    p = os.path.join(_here, "libheapc.so")
    if os.path.exists(p):
        try:
            return ctypes.CDLL(p), p, None
        except OSError as e:
            tried.append(f"{p}: {e}")
    for b in ("build", "build-gpu"):
        p = os.path.join(_root, b, "libheapc.so")
        if os.path.exists(p):
            try:
                return ctypes.CDLL(p), p, None
            except OSError as e:
                tried.append(f"{p}: {e}")
    for name in ("libheapc.so.0", "libheapc.so"):
        try:
            return ctypes.CDLL(name), name, None
        except OSError as e:
            tried.append(f"{name}: {e}")
    raise ImportError("heapd: libheapc not found; tried " + "; ".join(tried) +
                      ". Build it (make), install it (make install; ldconfig), or set HEAPC_LIB "
                      "to its path")


lib, path, _ = _find()


# HEAPC_STATE_* (issue 30): a heap's memory; heapc_state's and the status page's.
STATES = ("active", "releasing", "released", "restoring")
RELEASE_DISCARD, RELEASE_HOST, RELEASE_KEEP = 0, 1, 0x100


def state_name(v):
    """HEAPC_STATE_* v as its name ("unknown" for a newer heapd's), as heapctl's."""
    return STATES[v] if 0 <= v < len(STATES) else "unknown"


class Params(Structure):
    _fields_ = [("chunk_size", c_uint64), ("initial_size", c_uint64), ("va_size", c_uint64),
                ("min_block", c_uint64), ("policy", c_int), ("collect_timeout_ms", c_uint32),
                ("device_uuid", c_char_p), ("local_size", c_uint32), ("job", c_char_p),
                ("persist_s", c_int32), ("reclaim", c_int),
                ("grow_ahead", c_int32),   # issue 27
                ("trim_threshold", c_int64),   # issue 30
                ("extent_bound", c_int32),   # issue 32
                ("local_every", c_int32)]    # issue 28


class Status(Structure):
    """A snapshot of this rank's status page (heapc_status_t); fields in bytes."""
    _fields_ = [(n, c_uint64) for n in (
        "mapped", "live", "released", "free", "rank_held", "rank_released", "collects",
        "growths", "allocs", "epoch", "device_free", "device_total", "device_sampled_ns",
        "updates", "collects_skipped", "stream_waiting", "device_waits_avoided",
        # issue 30: heapd's HEAPC_STATE_* of the heap on this node, this rank's
        # chunk bytes backed by memory now, releases and restores so far
        "state", "resident", "releases", "restores")]

    @property
    def state_name(self):
        """state as a name: "active", "releasing", "released", "restoring"."""
        return state_name(self.state)

    def as_dict(self):
        return {n: getattr(self, n) for n, _ in self._fields_}

    def __repr__(self):
        return "Status(" + ", ".join(f"{k}={v}" for k, v in self.as_dict().items()) + ")"


class Counters(Structure):
    _fields_ = [(n, c_uint64) for n in (
        "allocs", "frees", "free_batches", "collects", "collects_needed", "chunks_mapped",
        "heap_collects", "last_reclaimed_blocks", "last_reclaimed_bytes", "queued_frees",
        "stream_waiting", "stream_markers", "device_waits_avoided",
        "stream_early", "stream_in_flight", "stream_reuse_waits",
        "local_allocs", "replica_lost")]                              # issue 28


class RankStats(Structure):
    _fields_ = [("rank", c_uint32), ("attached", c_int), ("live_bytes", c_uint64),
                ("released_bytes", c_uint64), ("next_seq", c_uint64), ("pid", c_uint32),
                ("stream_waiting", c_uint64), ("device_waits_avoided", c_uint64)]


class Hist(Structure):
    """heapc_hist: a latency histogram (counts not cumulative, the last +Inf)."""
    _fields_ = [("nbounds", c_size_t), ("bounds", c_double * 16), ("counts", c_uint64 * 16),
                ("count", c_uint64), ("sum_seconds", c_double)]

    def as_dict(self):
        n = self.nbounds
        return {"bounds": list(self.bounds[:n]), "counts": list(self.counts[:n + 1]),
                "count": self.count, "sum_seconds": self.sum_seconds}


class HeapStats(Structure):
    _fields_ = [("name", c_char_p), ("world_size", c_uint32), ("params", Params),
                ("mapped", c_uint64), ("live_bytes", c_uint64), ("released_bytes", c_uint64),
                ("free_bytes", c_uint64), ("collects", c_uint64), ("growths", c_uint64),
                ("clients", c_uint32), ("next_seq", c_uint64), ("epoch", c_uint64),
                ("pending_collect_seq", c_uint64), ("device_free", c_uint64),
                ("device_total", c_uint64), ("nranks", c_size_t),
                ("ranks", POINTER(RankStats)), ("collects_skipped", c_uint64),
                ("collect_pending", c_int),
                ("owner_uid", c_uint32), ("collect_wait", Hist), ("growth", Hist),
                ("bookkeeping_bytes", c_uint64),
                # issue 29
                ("persist_s", c_uint32), ("detached_ms", c_uint64), ("generation", c_uint64),
                ("markers", c_uint32),
                # issue 30
                ("state", c_uint32), ("resident_bytes", c_uint64), ("host_copy_bytes", c_uint64),
                ("releases", c_uint64), ("restores", c_uint64),
                # issue 27
                ("eager_reclaims", c_uint64), ("spare_bytes", c_uint64), ("grow_ahead", c_uint32),
                # issue 30: trim
                ("trims", c_uint64), ("trimmed_bytes", c_uint64)]


class Block(Structure):
    """heapc_block: a block the attach reply listed (issue 29)."""
    _fields_ = [("seq", c_uint64), ("offset", c_uint64), ("size", c_uint64),
                ("block_size", c_uint64), ("name", c_char_p)]


class DaemonStats(Structure):
    _fields_ = [("version", c_char_p), ("backend", c_char_p), ("clients", c_uint32),
                ("nheaps", c_size_t), ("heaps", POINTER(HeapStats)), ("uptime_ms", c_uint64),
                ("store", c_char_p), ("store_connected", c_int), ("quota_heap", c_uint64),
                ("quota_uid", c_uint64)]


def _fn(name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


H = c_void_p
connect = _fn("heapc_connect", H, c_char_p)
free_ctx = _fn("heapc_free_ctx", None, H)
err = _fn("heapc_err", c_int, H)
errstr = _fn("heapc_errstr", c_char_p, H)
errname = _fn("heapc_errname", c_char_p, c_int)
policy_name = _fn("heapc_policy_name", c_char_p, c_int)
backend = _fn("heapc_backend", c_char_p, H)
server = _fn("heapc_server", c_char_p, H)
set_timeout = _fn("heapc_set_timeout", c_int, H, c_int)
attach = _fn("heapc_attach", c_int, H, c_char_p, c_uint32, c_uint32, POINTER(Params))
attach_env = _fn("heapc_attach_env", c_int, H, c_char_p, POINTER(Params))
get_params = _fn("heapc_get_params", c_int, H, POINTER(Params))
detach = _fn("heapc_detach", c_int, H)
alloc = _fn("heapc_alloc", c_int, H, c_size_t, POINTER(c_void_p), POINTER(c_uint64))
free = _fn("heapc_free", c_int, H, c_uint64)
free_async = _fn("heapc_free_async", c_int, H, c_uint64, c_void_p)
alloc_async = _fn("heapc_alloc_async", c_int, H, c_size_t, c_void_p, POINTER(c_void_p), POINTER(c_uint64))
set_stream_reuse = _fn("heapc_set_stream_reuse", c_int, H, c_int)
flush = _fn("heapc_flush", c_int, H)
set_free_batch = _fn("heapc_set_free_batch", c_int, H, c_size_t)
collect = _fn("heapc_collect", c_int, H)
ptr = _fn("heapc_ptr", c_void_p, H, c_uint64)
peer_ptr = _fn("heapc_peer_ptr", c_void_p, H, c_uint32, c_uint64)
base = _fn("heapc_base", c_void_p, H, c_uint32)
mapped = _fn("heapc_mapped", c_uint64, H)
heap_name = _fn("heapc_heap_name", c_char_p, H)
rank = _fn("heapc_rank", c_uint32, H)
world_size = _fn("heapc_world_size", c_uint32, H)
local_ranks = _fn("heapc_local_ranks", c_size_t, H, POINTER(c_uint32), c_size_t)
next_seq = _fn("heapc_next_seq", c_uint64, H)
status = _fn("heapc_status", c_int, H, POINTER(Status))
get_counters = _fn("heapc_get_counters", c_int, H, POINTER(Counters))
stats = _fn("heapc_stats", c_int, H, c_char_p, POINTER(POINTER(DaemonStats)))
stats_free = _fn("heapc_stats_free", None, POINTER(DaemonStats))
force_collect = _fn("heapc_force_collect", c_int, H, c_char_p, POINTER(c_uint64))
drop = _fn("heapc_drop", c_int, H, c_char_p, POINTER(c_uint64))
# Issue 29: names, live sets, commit markers.
alloc_named = _fn("heapc_alloc_named", c_int, H, c_size_t, c_char_p, POINTER(c_void_p),
                  POINTER(c_uint64))
lookup = _fn("heapc_lookup", c_int, H, c_char_p, POINTER(c_uint64), POINTER(c_uint64))
commit = _fn("heapc_commit", c_int, H, c_char_p, c_uint64)
committed = _fn("heapc_committed", c_int, H, c_char_p, POINTER(c_uint64))
generation = _fn("heapc_generation", c_uint64, H)
resumed = _fn("heapc_resumed", c_int, H)
live = _fn("heapc_live", c_size_t, H, POINTER(Block), c_size_t)
last_asymmetry_name = _fn("heapc_last_asymmetry_name", c_char_p, H, c_size_t)


def _opt(name, res, *args):
    """A function of libheapc that a build may lack (the call then raises)."""
    return _fn(name, res, *args) if hasattr(lib, name) else None


# Issue 30: release and restore a heap's memory at the same offsets.
release = _opt("heapc_release", c_int, H, c_int)
release_named = _opt("heapc_release_named", c_int, H, c_int, POINTER(c_char_p), c_size_t)
restore = _opt("heapc_restore", c_int, H)
state = _opt("heapc_state", c_int, H)
trim = _opt("heapc_trim", c_int, H, POINTER(c_uint64))

# ---- the layout check (issue 31 item 8) ----
ABI_VERSION = 7   # client/heapc.h's HEAPC_ABI_VERSION that these structs copy
_STRUCTS = {"heapc_params": Params, "heapc_status_t": Status, "heapc_counters": Counters,
            "heapc_rank_stats": RankStats, "heapc_hist": Hist, "heapc_heap_stats": HeapStats,
            "heapc_daemon_stats": DaemonStats, "heapc_block": Block}


def check_abi(lib=lib, where=path):
    """ImportError unless `lib`'s struct layouts are the ones copied here."""
    if not hasattr(lib, "heapc_abi_version") or not hasattr(lib, "heapc_sizeof"):
        raise ImportError(f"heapd: the libheapc at {where} predates heapc_abi_version (an "
                          "older build): its struct layouts cannot be checked; rebuild or "
                          "reinstall libheapc of this version")
    ver = lib.heapc_abi_version
    ver.restype, ver.argtypes = c_uint32, []
    v = ver()
    if v != ABI_VERSION:
        raise ImportError(f"heapd: the libheapc at {where} has struct layout {v}, this package "
                          f"copies layout {ABI_VERSION}: install the heapd package of the same "
                          "version as libheapc")
    sz = getattr(lib, "heapc_sizeof")
    sz.restype, sz.argtypes = c_size_t, [c_char_p]
    bad = [f"{n} is {sz(n.encode())} bytes there, {ctypes.sizeof(t)} here"
           for n, t in _STRUCTS.items() if sz(n.encode()) != ctypes.sizeof(t)]
    if bad:
        raise ImportError(f"heapd: the libheapc at {where} does not match this package's "
                          "struct layouts (" + "; ".join(bad) + "): install the heapd package "
                          "of the same version as libheapc")


check_abi()
parse_size = _fn("heapc_parse_size", c_int, c_char_p, POINTER(c_uint64))
# An asymmetric allocation's figures (issue 31); None in a libheapc before them.
last_asymmetry = (_fn("heapc_last_asymmetry", c_size_t, H, POINTER(c_uint64), POINTER(c_uint32),
                      POINTER(c_uint64), c_size_t)
                  if hasattr(lib, "heapc_last_asymmetry") else None)
ASYM_MAX = 16


def asymmetry(c):
    """The last call's asymmetric allocation on context c, as heapd sent it:
    (n, ranks, sizes) with ranks[i] asking for sizes[i] bytes in the order
    they asked; None when the last call did not fail so."""
    if last_asymmetry is None or not c:
        return None
    n, ranks, sizes = c_uint64(), (c_uint32 * ASYM_MAX)(), (c_uint64 * ASYM_MAX)()
    k = min(last_asymmetry(c, byref(n), ranks, sizes, ASYM_MAX), ASYM_MAX)
    return (n.value, list(ranks[:k]), list(sizes[:k])) if k else None


def asymmetry_names(c):
    """The names of the last call's name asymmetry (issue 29), in the order
    of asymmetry(c)'s ranks; None when heapd sent none."""
    if not c:
        return None
    names = []
    while (nm := last_asymmetry_name(c, len(names))) is not None:
        names.append(nm.decode(errors="replace"))
    return names or None

__all__ = ["lib", "path", "byref"]
