"""heapd's statistics as dicts (heapc_stats), shaped and named as heapctl
--json's. Issue 30: "state" ("active", "releasing", "released",
"restoring"), "resident_bytes", "host_copy_bytes", "releases", "restores".
Issue 27: "eager_reclaims", and params["reclaim"] ("eager" or "collect").
Issue 30 (trim): "trims", "trimmed_bytes" (every local rank's chunk bytes)."""
import ctypes
import os

from . import _lib as L
from ._errors import _raise


def stats(name=None, socket=None):
    """heapd's statistics without attaching: of heap `name` a dict shaped as
    Heap.stats() (without "client"); with no name, a list of such dicts, one
    per heap this user may see. ERR_NOT_FOUND raises HeapdError."""
    c = L.connect(os.fsencode(socket) if socket else None)
    if not c:
        raise MemoryError("heapc_connect: out of memory")
    try:
        if L.err(c):
            _raise(c, L.err(c))
        st = _stats_of(c, name)
        return st[0] if name is not None and st else st
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
                        "collect_timeout_ms", "local_size", "persist_s", "grow_ahead",
                        "trim_threshold", "local_every")}   # issue 28: local_every
        d["params"]["extent_bound"] = bool(hs.params.extent_bound)   # issue 32
        d["params"]["policy"] = (L.policy_name(hs.params.policy) or b"").decode()
        d["params"]["reclaim"] = "eager" if hs.params.reclaim == 1 else "collect"   # issue 27
        d["collect_pending"] = bool(hs.collect_pending)
        d["state"] = L.state_name(hs.state)     # issue 30: as heapctl --json's
        d["ranks"] = [{f: (bool(v) if f == "attached" else v) for f, v in
                       ((f, getattr(hs.ranks[j], f)) for f, _ in L.RankStats._fields_)}
                      for j in range(hs.nranks)]
        res.append(d)
    return res
