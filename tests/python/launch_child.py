"""Run by test_launch.py under torchrun: attach with Heap.from_env(), say so
in $LAUNCH_DIR, wait until $LAUNCH_WANT ranks (of every job) have, print the
heap's name, detach."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import heapd  # noqa: E402

d, want = os.environ["LAUNCH_DIR"], int(os.environ["LAUNCH_WANT"])
with heapd.Heap.from_env() as h:
    t = h.zeros(16)
    open(os.path.join(d, f"{os.getpid()}"), "w").write(h.name)
    deadline = time.monotonic() + 120                 # hang guard; we wait for the state
    while len(os.listdir(d)) < want and time.monotonic() < deadline:
        time.sleep(0.01)
    h.collect()
    print(f"attached rank {h.rank}/{h.world_size} heap {h.name}", flush=True)
