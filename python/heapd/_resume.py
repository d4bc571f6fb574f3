"""Issue 29 on heapd.Heap: heaps that outlive their ranks. Named blocks
(Heap.empty(..., name=) and the other creation calls), found again after a
re-attach (tensor, tensors), commit markers (commit, committed), the heap's
generation and whether this attach resumed an earlier one. A mixin of
heapd.Heap (libheapc's heapc_alloc_named, heapc_lookup, heapc_live,
heapc_commit, heapc_committed, heapc_generation, heapc_resumed)."""
import ctypes

from . import _lib as L
from ._errors import _raise

_ENOTFOUND = -10


class _Resume:
    """The named blocks, markers and generation of a Heap (heapd.Heap's
    mixin: it uses the Heap's context, handle and device)."""

    @staticmethod
    def _persist_s(persist, h):
        """Heap(persist=) as heapc_params.persist_s: None 0 (heapd's
        default), 0 -1 (none), seconds as they are."""
        if persist is None:
            return 0
        if isinstance(persist, bool) or not isinstance(persist, (int, float)) or persist < 0:
            h.release()
            raise ValueError(f"heapd.Heap: persist={persist!r}: want seconds (an int >= 0; 0: "
                             "none) or None (heapd.conf's persist)")
        return min(int(persist), 0x7FFFFFFF) if persist else -1

    def _name_arg(self, name):
        """A block's name for libheapc (None: unnamed); remembered for tensors()."""
        if name is None:
            return None
        if not isinstance(name, str) or not name:
            raise TypeError(f"heapd.Heap: name={name!r}: want a non-empty str")
        b = name.encode()
        if len(b) > 255:
            raise ValueError(f"heapd.Heap: name {name[:40]!r}...: {len(b)} bytes of UTF-8, "
                             "at most 255")
        self.__dict__.setdefault("_names", set()).add(name)
        return b

    def _named_owner(self, name):
        """What a named block's tensors hold: the handle (the heap stays
        attached while they live), not a _Block (the block is not freed when
        they are gone)."""
        return self._h

    def _await_peers(self, h):
        """_await_ranks when this attach resumed; h released if it fails."""
        if not self.resumed:
            return
        try:
            self._await_ranks()
        except BaseException:
            h.release()
            raise

    def _await_ranks(self):
        """A re-attach to a heap that had formed returns at once (heapd's
        rendezvous is the first attach's), and a collective fails while a
        local peer has not re-attached yet (PeerGoneError naming it). So a
        resumed Heap waits, as the first attach did, until every local rank
        that was not attached when it came has attached (or came and went:
        its pid changed), at most the heap's collect_timeout_ms, then
        CollectiveTimeoutError naming them."""
        import time
        from ._stats import _stats_of
        p = L.Params()
        L.get_params(self._c, ctypes.byref(p))
        limit = (p.collect_timeout_ms or 30000) / 1000.0
        start, pause = time.monotonic(), 0.001
        local, gone = set(self.local_ranks()), None
        while True:
            st = _stats_of(self._c, self.name)
            now = {r["rank"]: (r["attached"], r["pid"]) for r in (st[0]["ranks"] if st else [])}
            if gone is None:
                gone = {q: now.get(q, (False, 0))[1] for q in local if not now.get(q, (False,))[0]}
            missing = sorted(q for q, pid in gone.items()
                             if q in now and not now[q][0] and now[q][1] == pid)
            if not missing:
                return
            if time.monotonic() - start > limit:
                from ._errors import CollectiveTimeoutError
                raise CollectiveTimeoutError(-6, f"heap {self.name!r}: rank {self.rank} re-attached, "
                                             f"but rank(s) {missing} did not within "
                                             f"{limit:g} s (collect_timeout_ms): restart them too")
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def _lookup(self, name):
        """(offset, size) of the named block this rank holds, or None."""
        c = self._cx()
        off, size = ctypes.c_uint64(), ctypes.c_uint64()
        rc = L.lookup(c, name.encode(), ctypes.byref(off), ctypes.byref(size))
        if rc == _ENOTFOUND:
            return None
        if rc:
            _raise(c, rc)
        return off.value, size.value

    def live(self):
        """The live set the attach gave (what this rank held when it
        re-attached; [] on a first attach), ascending allocation number: a
        list of dicts seq, offset, size, block_size, name ("" for none)."""
        c = self._cx()
        n = L.live(c, None, 0)
        a = (L.Block * n)()
        n = min(L.live(c, a, n), n)
        return [{"seq": b.seq, "offset": b.offset, "size": b.size, "block_size": b.block_size,
                 "name": (b.name or b"").decode(errors="replace")} for b in a[:n]]

    def _tensor_at(self, off, nbytes):
        from . import _bytes_tensor
        return _bytes_tensor(self._h, self._cuda, L.ptr(self._c, off), max(nbytes, 1))[:nbytes]

    def tensor(self, name, shape=None, dtype=None):
        """The block named `name` that this rank holds (allocated with name=,
        by this process or before a re-attach) as a tensor of `shape` (ints
        or a tuple; None: 1-D, as many elements as fit) and `dtype` (default
        torch.get_default_dtype()), over its first bytes: a view, no copy.
        KeyError when the rank holds no block of that name; ValueError when
        shape and dtype need more bytes than the block was allocated with.
        Same name on several blocks: the latest."""
        import torch
        from . import _element_size
        from ._args import _size_args
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"heapd.Heap.tensor(): dtype={dtype!r} is not a torch.dtype")
        found = self._lookup(name)
        if found is None:
            raise KeyError(f"heap {self.name!r}: rank {self.rank} holds no block named {name!r} "
                           f"(named blocks held: {list(self._held())[:8]!r}); allocate it "
                           "with name=, e.g. heap.empty(..., name=...)")
        off, size = found
        es = _element_size(dtype)
        if shape is None:
            shape = (size // es,)
        shape = _size_args("tensor", shape if isinstance(shape, (tuple, list)) else (shape,))
        n = es
        for d in shape:
            n *= d
        if n > size:
            raise ValueError(f"heap {self.name!r}: block {name!r} has {size} bytes; shape "
                             f"{tuple(shape)} of {dtype} needs {n}")
        return self._tensor_at(off, n).view(dtype).view(shape)

    def _held(self):
        """{name: (offset, size)} of the named blocks this rank holds: the
        attach's live set and this process's named allocations, less what
        was freed (heapc_lookup of each)."""
        c = self._cx()
        n = L.live(c, None, 0)
        a = (L.Block * n)()
        n = min(L.live(c, a, n), n)
        names = {b.name.decode(errors="replace") for b in a[:n] if b.name}
        names |= self.__dict__.get("_names", set())
        held = {nm: self._lookup(nm) for nm in sorted(names)}
        return {nm: v for nm, v in held.items() if v is not None}

    def tensors(self):
        """{name: uint8 tensor of the block's bytes} of every named block
        this rank holds (the attach's live set and this process's named
        allocations, less what was freed)."""
        return {nm: self._tensor_at(off, size) for nm, (off, size) in self._held().items()}

    def commit(self, tag, value):
        """Collective: every rank commits the same int `value` (0 to 2^64-1)
        under `tag` at the same point of its allocation sequence; heapd keeps
        it as the heap's marker, which a job that re-attaches reads with
        committed(tag). Queued frees are sent first; device work is not
        waited for (synchronize first when the value says that the device's
        writes are complete). AsymmetryError when ranks disagree."""
        c = self._cx()
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
            raise ValueError(f"heapd.Heap.commit(): value={value!r}: want an int in [0, 2^64)")
        rc = L.commit(c, tag.encode(), value)
        if rc:
            _raise(c, rc)

    def committed(self, tag, default=None):
        """The value committed under tag (as of the attach, or this
        process's last commit of it), else default."""
        c = self._cx()
        v = ctypes.c_uint64()
        rc = L.committed(c, tag.encode(), ctypes.byref(v))
        if rc == _ENOTFOUND:
            return default
        if rc:
            _raise(c, rc)
        return v.value

    @property
    def generation(self):
        """How many times the heap's ranks re-attached since it was created
        (0: none), as of the attach (or the last commit)."""
        return L.generation(self._c)

    @property
    def resumed(self):
        """True when this attach found this rank's earlier one (a re-attach:
        its named blocks are there, tensor(name))."""
        return bool(L.resumed(self._c))
