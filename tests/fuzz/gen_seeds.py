#!/usr/bin/env python3
"""gen_seeds.py - writes the seed corpus of the fuzz targets (tests/fuzz/corpus/).

Run from the source tree: python3 tests/fuzz/gen_seeds.py. The seeds are
committed; this script documents how they were made (input layouts: see the
comments at the top of fuzz_wire.c and fuzz_alloc.c).
"""
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- a minimal protobuf encoder (heapd.proto field numbers) -------------------
def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def fv(field, v):  # varint field
    return varint(field << 3) + varint(v)


def fb(field, b):  # length-delimited field
    return varint(field << 3 | 2) + varint(len(b)) + b


def frame(id_, body_field, body):
    return fv(1, id_) + fb(body_field, body)


HELLO = frame(1, 10, fv(1, 1) + fb(2, b"seed"))
PARAMS = fv(1, 65536) + fv(2, 65536) + fv(3, 1 << 20) + fv(4, 512) + fv(5, 1) + fv(6, 2000)
ATTACH = frame(2, 12, fb(1, b"job") + fv(2, 0) + fv(3, 2) + fb(4, PARAMS) + fb(5, b""))
ALLOC = frame(3, 14, fv(1, 0) + fv(2, 4096))
FREE = frame(4, 16, fb(1, varint(0) + varint(4096) + varint(1 << 20)))  # packed
COLLECT = frame(5, 18, fv(1, 1))
STATS = frame(6, 20, fb(1, b""))
FORCE = frame(7, 22, fb(1, b"job"))
DETACH = frame(8, 24, b"")
CHUNK = fv(1, 0) + fv(2, 0) + fv(3, 0)
ATTACH_REPLY = frame(2, 13, fb(1, PARAMS) + fv(2, 2) + fb(3, varint(0) + varint(1)) + fv(4, 65536)
                     + fb(5, CHUNK) + fb(5, fv(1, 1) + fv(3, 1)) + fv(6, 0xFFFFFFFF) + fv(7, 0)
                     + fb(8, b"host") + fv(9, 1))
RANK = fv(1, 1) + fv(2, 1) + fv(3, 4096) + fv(5, 3) + fv(6, 1234)
HEAP = fb(1, b"job") + fv(2, 2) + fb(3, PARAMS) + fv(4, 65536) + fb(12, RANK) + fb(12, RANK) + fv(17, 1)
STATS_REPLY = frame(6, 21, fb(1, HEAP) + fb(2, b"host") + fv(3, 2) + fb(4, b"0.1.0"))
ERROR = frame(9, 30, fv(1, 12) + fb(2, b"free of offset 7: not held"))


def hdr(payload, nfds=0):
    return struct.pack("<II", len(payload), nfds)


def ctl(framed, first_fds, seed):
    return struct.pack("<I", (framed & 1) | (first_fds & 3) << 1 | seed << 3)


def write(kind, name, data):
    d = os.path.join(HERE, "corpus", kind)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def wire_seeds():
    session = b"".join(hdr(m) + m for m in (HELLO, ATTACH, ALLOC, FREE, COLLECT, STATS, FORCE, DETACH))
    write("wire", "raw-session", ctl(0, 0, 1) + session)
    write("wire", "raw-hello-2fds", ctl(0, 2, 2) + hdr(HELLO, 2) + HELLO)
    write("wire", "raw-empty-frames", ctl(0, 0, 3) + hdr(b"") * 3)
    write("wire", "raw-over-cap", ctl(0, 0, 4) + struct.pack("<II", (4 << 20) + 1, 0) + b"\x08\x01")
    write("wire", "raw-too-many-fds", ctl(0, 1, 5) + struct.pack("<II", 2, 1025) + b"\x08\x01")
    write("wire", "raw-fds-mismatch", ctl(0, 3, 6) + hdr(STATS, 1) + STATS + hdr(ALLOC) + ALLOC)
    write("wire", "framed-attach", ctl(1, 0, 7) + ATTACH)
    write("wire", "framed-attach-reply-2fds", ctl(1, 2, 8) + ATTACH_REPLY)
    write("wire", "framed-stats-reply", ctl(1, 0, 9) + STATS_REPLY)
    write("wire", "framed-error", ctl(1, 0, 10) + ERROR)
    write("wire", "framed-free", ctl(1, 1, 11) + FREE)


# ---- alloc: 4 parameter bytes, then operations (see fuzz_alloc.c) ------------
def alloc_op(sel, v):
    return bytes([0, sel & 0xFF]) + struct.pack("<H", v & 0xFFFF)


def free_op(rank, idx):
    return bytes([3, rank]) + struct.pack("<H", idx)


def alloc_seeds():
    # 2 ranks, min_block 64, chunk 4 x 64, 1 chunk initial, va +5 chunks
    ops = b""
    for i in range(12):
        ops += alloc_op(0x50 + i * 16, 100 + 37 * i)
    for i in range(12):
        ops += free_op(0, i) + free_op(1, i)
    ops += bytes([5])
    for i in range(6):
        ops += alloc_op(0x30 + i * 16, 500 + i)
    write("alloc", "alloc-free-collect", bytes([1, 2, 3, 1 + 3 * 5]) + ops)
    # 4 ranks, partial frees, collect_apply subsets, a grow, bogus frees
    ops = b""
    for i in range(20):
        ops += alloc_op(0x25 + i * 16, 7 * i + 1)
    for i in range(0, 20, 2):
        for r in range(4):
            ops += free_op(r, i)
    ops += bytes([6, 0x55]) + bytes([4 | 8, 1]) + struct.pack("<H", 3) + bytes([7 | 8 * 2]) + bytes([6 | 8, 0xff])
    write("alloc", "apply-grow-bogus", bytes([3, 1, 7, 2]) + ops)
    # edge sizes: 0, > va, 2^64-1, 2^63, va
    ops = alloc_op(0, 0) + alloc_op(1, 5) + alloc_op(2, 9) + alloc_op(3, 0) + alloc_op(4, 1) + free_op(0, 0)
    write("alloc", "edge-sizes", bytes([0, 5, 0, 3 * 2]) + ops)
    # seeded random sequences
    rnd = random.Random(8)
    for n in range(3):
        ops = bytearray()
        for _ in range(150):
            k = rnd.random()
            if k < 0.45:
                ops += alloc_op(rnd.randrange(5, 256), rnd.randrange(65536))
            elif k < 0.85:
                ops += free_op(rnd.randrange(8), rnd.randrange(65536))
            elif k < 0.92:
                ops += bytes([5])
            elif k < 0.97:
                ops += bytes([6 | 8 * rnd.randrange(1, 4), rnd.randrange(256)])
            else:
                ops += bytes([7 | 8 * rnd.randrange(5)])
        write("alloc", "random-%d" % n, bytes(rnd.randrange(256) for _ in range(4)) + bytes(ops))


# ---- heap and dispatch: request steps (fuzz_wing.h, fuzz_heap.c, fuzz_dispatch.c)
def w_attach(name=0, world=2, rank=0, params=None, local=0):
    # name byte (< 224: "a", "b", "job.7"), world byte (1 + b % 4), rank
    # byte, params byte (bit 0: present; then the fields it selects), local
    b = bytes([name, (world - 1) % 4, rank])
    if params is None:
        return b + bytes([0, local])
    return b + params + bytes([local])


def w_req(kind, args, id_=1):
    return bytes([id_]) + args


def heap_steps(world, rounds, timeout=False, dispatch=False, local=0):
    """Clients 0..world-1 attach heap "a", then rounds of allocations,
    frees, collects, stats, a forced collect, detach. local: the attach's
    local byte (200..249: the heap asks for local_every 2..16, issue 28)."""
    out = bytearray()

    def step(peer, kind, args):
        if dispatch:
            # op 0: a request; kind byte; the request's bytes; m = 0 (whole)
            out.extend(bytes([peer << 4, kind]) + w_req(kind, args) + bytes([0]))
        else:
            out.extend(bytes([peer << 4 | kind]) + w_req(kind, args))

    if dispatch:
        for p in range(world):
            step(p, 7, bytes([0]))  # Hello, the protocol's version
    for p in range(world):
        params = bytes([0x41, 0]) if timeout else None  # 1 ms collect timeout
        step(p, 0, w_attach(0, world, p, params, local))
    for r in range(rounds):
        size_b = [0x83, 0x40 | 20, 0x81, 0x40 | 12][r % 4]
        args = bytes([size_b, 1 if size_b & 0x40 else 0, 0])
        out.extend(bytes([(5 if dispatch else 10)]) + (args if size_b & 0x40 else bytes([size_b, 0])))
        if r % 2:
            for p in range(world):
                step(p, 2, bytes([1, r % 3]))  # free one of its offsets
        if r % 3 == 2:
            for p in range(world):
                step(p, 3, bytes([0, 0, 0]))  # collect at its next number
    step(0, 6, bytes([0]))          # stats, every heap
    step(1 % world, 4, bytes([0]))  # force collect of "a"
    if timeout:
        step(0, 3, bytes([0, 0, 0]))  # rank 0 alone in a collect
        out.extend(bytes([3 if dispatch else 9]))  # tick: the 1 ms timeout fires
    for p in range(world):
        step(p, 5, b"")
    return bytes(out)


def heap_seeds():
    write("heap", "two-ranks", bytes([0]) + heap_steps(2, 8))
    write("heap", "three-ranks-seed-policy", bytes([0x40]) + heap_steps(3, 12))
    write("heap", "timeout", bytes([0x30]) + heap_steps(2, 4, timeout=True))
    write("heap", "quota", bytes([0x31]) + heap_steps(4, 6))
    # two ranks, then a burst (op 11) of 4200 rounds of 256 bytes, frees every 64
    two = heap_steps(2, 0)
    attach_only = two[: two.index(bytes([0x06]))]  # up to the stats step
    write("heap", "burst", bytes([0]) + attach_only + bytes([11, 0x40 | 8, 1, 0xF0]) + struct.pack("<H", 4200) + bytes([6]))
    # an fd budget of 4 + 2: chunk and status page creation fail
    write("heap", "fd-budget", bytes([0x80, 2]) + heap_steps(3, 4))
    # issue 28: a heap whose ranks decide (local_every 13): records, rounds
    write("heap", "local-every", bytes([0]) + heap_steps(3, 40, local=206))


def dispatch_seeds():
    write("dispatch", "two-ranks", bytes([0]) + heap_steps(2, 8, dispatch=True))
    write("dispatch", "three-ranks", bytes([0x40]) + heap_steps(3, 6, dispatch=True))
    write("dispatch", "timeout", bytes([0x30]) + heap_steps(2, 3, timeout=True, dispatch=True))
    write("dispatch", "local-every", bytes([0]) + heap_steps(2, 8, dispatch=True, local=206))
    # no Hello first; then a raw 5-byte frame
    write("dispatch", "no-hello", bytes([0, 0x00, 0, 1]) + w_attach() + bytes([0]) + bytes([0x01, 5, 0]) + b"\x08\x01\x12\x00\xff")


if __name__ == "__main__":
    wire_seeds()
    alloc_seeds()
    heap_seeds()
    dispatch_seeds()
