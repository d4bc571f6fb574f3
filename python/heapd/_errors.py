"""heapd's errors: HeapdError and its subclasses, raised from libheapc's
codes with heapd's message."""
from . import _lib as L

class HeapdError(RuntimeError):
    """An error of libheapc or heapd: .code (HEAPC_E*, negative), .name
    ("ERR_ASYMMETRY"), and heapd's message as str(e)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.name = L.errname(code).decode()


class AsymmetryError(HeapdError):
    """Ranks disagree on the n-th allocation's size (or on a collect point).
    For an allocation heapd poisons the heap: every rank's next call on it
    raises this same error. .n (the allocation number), .ranks and .sizes
    (ranks[i] asked for sizes[i] bytes, in the order they asked: ranks[0]
    decided n) come from heapd's error fields (libheapc's
    heapc_last_asymmetry), never from the message; .rank/.size name the rank
    that differed (ranks[-1]), .other_rank/.other_size the one that decided
    (ranks[0]). None and [] for an asymmetric collect. Issue 29: .names,
    when ranks named the n-th allocation differently (names[i] is ranks[i]'s;
    the heap is then not poisoned), else None."""

    def __init__(self, code, message, asym=None, names=None):
        super().__init__(code, message)
        self.names = list(names) if names else None
        n, ranks, sizes = asym if asym else (None, [], [])
        self.n, self.ranks, self.sizes = n, list(ranks), list(sizes)
        self.rank, self.size = (ranks[-1], sizes[-1]) if ranks else (None, None)
        self.other_rank, self.other_size = (ranks[0], sizes[0]) if ranks else (None, None)


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


class BadFdError(HeapdError):
    """heapd (or whatever answers on its socket) sent an fd that is not a
    sealed memfd of the size needed, or a ring doorbell that is no eventfd:
    refused, so that nothing it sent can fault this process."""


_BY_CODE = {-5: AsymmetryError, -7: PeerGoneError, -6: CollectiveTimeoutError,
            -103: CollectiveTimeoutError, -100: HeapdConnectionError, -15: HeapdConnectionError,
            -12: NotHeldError, -8: OutOfMemoryError, -9: OutOfMemoryError, -17: OutOfMemoryError,
            -102: OutOfMemoryError, -11: StateError, -4: MismatchError, -106: BadFdError}


def _raise(c, rc):
    msg = L.errstr(c).decode(errors="replace") or L.errname(rc).decode()
    if rc == -5:
        raise AsymmetryError(rc, msg, L.asymmetry(c), L.asymmetry_names(c))
    raise _BY_CODE.get(rc, HeapdError)(rc, msg)
