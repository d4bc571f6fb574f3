"""Argument checks of the torch-shaped calls (heapd.Heap.empty and the others)."""
import operator


def _size_args(what, size):
    """torch.empty's size: ints, or one tuple/list/torch.Size of ints; a
    tuple of non-negative ints, or TypeError/ValueError naming the call."""
    for d in size:
        if type(d).__module__ == "torch" and type(d).__name__ == "dtype":
            raise TypeError(f"heapd.Heap.{what}(): size must be integers, got {d!r}; pass "
                            f"the dtype as a keyword, as torch.{what} takes it: dtype={d}")
    if len(size) == 1 and isinstance(size[0], (tuple, list)):   # torch.Size is a tuple
        size = tuple(size[0])
    out = []
    for d in size:
        if isinstance(d, bool) or not hasattr(type(d), "__index__"):
            raise TypeError(f"heapd.Heap.{what}(): size must be integers, got {d!r} "
                            f"({type(d).__name__}) in {tuple(size)!r}")
        d = operator.index(d)
        if d < 0:
            raise ValueError(f"heapd.Heap.{what}(): negative dimension {d} in size "
                             f"{tuple(size)!r}")
        out.append(d)
    return tuple(out)
