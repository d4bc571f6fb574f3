"""Issue 30 on heapd.Heap: release a heap's memory and restore it at the same
offsets. release(mode, keep), restore(), released(mode, keep) (the `with`
form), state, and trim() (give back the heap's wholly free chunks: at the
top and below a live block). A mixin of heapd.Heap (libheapc's heapc_release, heapc_restore,
heapc_state, heapc_trim).

Between release and restore the heap's chunks are unmapped in this process
and their memory given back (the device's free memory grows by it), while
offsets, the allocator's state, live blocks, names, and this rank's address
reservation stay: every tensor made before is valid again after restore (the
addresses do not change). Touching one while released is the caller's error:
a segmentation fault (host backend) or a device fault (cuda), as any
unmapped address."""
import contextlib

from . import _lib as L
from ._errors import HeapdError, StateError, _raise

_MODES = {"discard": L.RELEASE_DISCARD, "host": L.RELEASE_HOST}
_ESTATE = -11
_RELEASED = L.STATES.index("released")


def _need(fn, what):
    if fn is None:
        raise HeapdError(-1, f"heapd: the libheapc at {L.path} has no {what} (a build before "
                         "issue 30): rebuild libheapc of this version (make)")
    return fn


class _Release:
    """release/restore/released/state of a Heap (heapd.Heap's mixin: it uses
    the Heap's context, name and device)."""

    def _sync_device(self):
        """The caller's device work on the heap is complete before heapd takes
        the memory away (torch.cuda.synchronize when torch's CUDA state exists)."""
        import torch
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize(self.device if self._cuda else None)

    def release(self, mode="host", keep=False, names=None):
        """Collective (every rank of the heap calls it): the heap's memory is
        given back - on every local rank its chunks are unmapped and freed
        (cudaMemGetInfo's free grows by them) - while offsets, live blocks,
        names and addresses stay, so every tensor made before is valid again
        after restore(). mode "host": heapd copies the content into host
        memory it owns (it outlives this process) and restore() puts it back
        bit for bit; "discard": dropped, restore() gives zeros. keep=True
        (host mode): the host copy stays allocated and pinned after
        restore(), so the next host release costs only the copy. Queued
        frees are sent first and, when torch's CUDA state is initialised,
        the device is synchronized first. While released: allocations raise
        StateError; free, collect, tensor(name), stats work; touching the
        heap's tensors is a segmentation fault (host backend) or a device
        fault (cuda). StateError when already released; ValueError for a
        bad mode; PeerGoneError / CollectiveTimeoutError when a rank does
        not come (nothing released).

        names (a list of the names tensors were allocated with, the same on
        every rank): only the chunks that lie wholly inside those live blocks
        are given back (and saved in host mode); every other tensor of the
        heap stays mapped and usable while released (a named block's part
        that shares a chunk with another block stays too). HeapdError
        (.name "ERR_NOT_FOUND") when no live block has one of the names
        (nothing released)."""
        c = self._cx()
        if mode not in _MODES:
            raise ValueError(f"heapd.Heap.release(): mode={mode!r}: want \"host\" (the content "
                             "kept in host memory, back at restore) or \"discard\" (restore "
                             "gives zeros)")
        if keep and mode != "host":
            raise ValueError("heapd.Heap.release(): keep=True keeps the host copy: it needs "
                             "mode=\"host\"")
        if isinstance(names, (str, bytes)):
            raise TypeError("heapd.Heap.release(): names=: want a list of block names, not one string")
        enc = [n.encode() if isinstance(n, str) else bytes(n) for n in (names or ())]
        if any(not n for n in enc):
            raise ValueError("heapd.Heap.release(): names=: an empty block name")
        flags = _MODES[mode] | (L.RELEASE_KEEP if keep else 0)
        if enc:
            import ctypes
            fn = _need(L.release_named, "heapc_release_named")
            self._sync_device()
            rc = fn(c, flags, (ctypes.c_char_p * len(enc))(*enc), len(enc))
        else:
            fn = _need(L.release, "heapc_release")
            self._sync_device()
            rc = fn(c, flags)
        if rc:
            _raise(c, rc)

    def restore(self):
        """Collective: the heap's chunks are created again, refilled from the
        host copy (mode "host"; zeros after "discard") and mapped at the
        addresses they had: tensors made before the release are valid again
        and allocations work. StateError when not released; OutOfMemoryError
        when the device has no room (the heap stays released: free memory
        and try again); PeerGoneError / CollectiveTimeoutError (it stays
        released)."""
        c = self._cx()
        rc = _need(L.restore, "heapc_restore")(c)
        if rc:
            _raise(c, rc)

    def trim(self):
        """Collective (every rank of the heap calls it): every whole chunk
        that holds no block - none live, none freed whose stream work is
        still pending - is given back on every local rank (unmapped here and
        in every peer, their memory freed): those at the top leave the
        extent, one below a live block becomes a hole. Returns the bytes
        each rank gave back (0: nothing to trim). Offsets, live tensors and
        their content stay; a later allocation that needs the room grows
        the heap again at the same offsets, holes first. No device sync: a
        tensor freed on a stream whose work has not completed still holds
        its chunk. Policy "seed" trims only the top. Under reclaim
        "collect", collect() first. StateError while
        released; PeerGoneError / CollectiveTimeoutError naming the rank
        (nothing trimmed); HeapdError (ERR_INVALID) on a heap that spans
        nodes. With trim_threshold (Heap(trim_threshold=)) an allocation
        runs this trim by itself once that many bytes would go."""
        import ctypes
        c = self._cx()
        out = ctypes.c_uint64(0)
        rc = _need(L.trim, "heapc_trim")(c, ctypes.byref(out))
        if rc:
            _raise(c, rc)
        return out.value

    @contextlib.contextmanager
    def released(self, mode="host", keep=False, names=None):
        """`with heap.released(mode="host"):` release() on entry, restore() on
        exit - also when the block raises. Collective: every rank enters and
        leaves it together. Inside, the memory the heap had is free for
        other use (a big temporary tensor, another phase of the job); the
        heap's tensors must not be touched. Yields the heap."""
        self.release(mode, keep, names)
        try:
            yield self
        finally:
            self.restore()

    @property
    def reclaim(self):
        """Issue 27: "eager" (a block every rank freed is reused at once) or
        "collect" (at the next collect): what heapd gave the heap."""
        import ctypes
        p = L.Params()
        L.get_params(self._c, ctypes.byref(p))
        return {1: "eager", 2: "collect"}.get(p.reclaim, "collect")

    def set_stream_reuse(self, on):
        """Issue 27 (heapc_set_stream_reuse; on unless $HEAPC_STREAM_REUSE=0):
        on, a block freed on a stream is released to heapd at once and may be
        reused while that stream's work still runs - by an allocation on the
        same stream with no wait, by any other after waiting for it; off, it
        is released only once its stream's work completed (issue 18)."""
        c = self._cx()
        rc = L.set_stream_reuse(c, 1 if on else 0)
        if rc:
            _raise(c, rc)

    @property
    def extent_bound(self):
        """Issue 32: True when no block of the heap straddles two extents
        (Heap(extent_bound=True))."""
        import ctypes
        p = L.Params()
        L.get_params(self._c, ctypes.byref(p))
        return bool(p.extent_bound)

    @property
    def local_every(self):
        """Issue 28: every how many allocations a rank of the heap asks heapd
        (its replica decides the others); 0: heapd decides every one."""
        import ctypes
        p = L.Params()
        L.get_params(self._c, ctypes.byref(p))
        return p.local_every

    @property
    def grow_ahead(self):
        """Issue 27: the spare chunks heapd keeps per rank for the heap (0:
        none)."""
        import ctypes
        p = L.Params()
        L.get_params(self._c, ctypes.byref(p))
        return max(p.grow_ahead, 0)

    @property
    def trim_threshold(self):
        """Issue 30: the automatic trim's threshold of the heap in bytes (0:
        none): an allocation that finds this many bytes of wholly free
        chunks trims first, on every rank."""
        import ctypes
        p = L.Params()
        L.get_params(self._c, ctypes.byref(p))
        return max(p.trim_threshold, 0)

    @property
    def state(self):
        """The heap's memory as this rank knows it: "active", or "released"
        (after release(), or an attach to a heap released on this node,
        until restore()); None once closed. heapd's view, "releasing" and
        "restoring" included, is status().state_name and stats()["state"]."""
        if self.closed or not self._c:
            return None
        v = _need(L.state, "heapc_state")(self._c)
        return None if v < 0 else L.state_name(v)

    def _alloc_failed(self, c, rc):
        """Raises an allocation's error; while released, a StateError that
        says so and names the fix."""
        if rc == _ESTATE and L.state is not None and L.state(c) == _RELEASED:
            msg = L.errstr(c).decode(errors="replace")
            raise StateError(rc, f"heap {self.name!r}: its memory is released (heap.release): "
                             "no allocation until heap.restore() on every rank, or allocate "
                             f"after the `with heap.released():` block ({msg})")
        _raise(c, rc)
