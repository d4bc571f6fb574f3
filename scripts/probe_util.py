"""probe_util.py - what the GPU anchor probes (torch_probe.py,
torch_symm_probe.py) share: the median of a call's wall time."""
import time


def median_us(fn, n):
    """Median wall time of n calls of fn, in microseconds."""
    ts = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t)
    ts.sort()
    return ts[len(ts) // 2] / 1000.0
