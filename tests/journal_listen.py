#!/usr/bin/python3
"""journal_listen.py SOCKET OUT - a stand-in for journald's native socket:
binds a Unix datagram socket at SOCKET, decodes every datagram of the
journal's native protocol (KEY=VALUE lines, and KEY\\n<le64 size><bytes>\\n
for binary-safe values; a datagram carrying a memfd instead, as for large
entries, is read from the fd) and appends each entry to OUT as one JSON
object per line (values decoded as UTF-8, strictly: a field that is not
UTF-8 is an error). Runs until SIGTERM. Protocol:
https://systemd.io/JOURNAL_NATIVE_PROTOCOL/"""
import array
import json
import os
import signal
import socket
import struct
import sys

path, out = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))


def parse(data):
    entry, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            i = nl + 1
        else:
            k = line
            (n,) = struct.unpack("<Q", data[nl + 1:nl + 9])
            v = data[nl + 9:nl + 9 + n]
            if data[nl + 9 + n:nl + 10 + n] != b"\n":
                raise ValueError("binary field %r not followed by a newline" % k)
            i = nl + 10 + n
        entry[k.decode("ascii")] = v.decode("utf-8")
    return entry


with open(out, "a", encoding="utf-8") as f:
    while True:
        fds = array.array("i")
        data, anc, flags, _ = s.recvmsg(1 << 20, socket.CMSG_SPACE(4 * fds.itemsize))
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds.frombytes(cdata[:len(cdata) - (len(cdata) % fds.itemsize)])
        for fd in fds:
            data = os.pread(fd, 1 << 24, 0)
            os.close(fd)
        try:
            e = parse(data)
        except Exception as ex:  # a malformed datagram is a test failure
            e = {"PARSE_ERROR": repr(ex)}
        f.write(json.dumps(e) + "\n")
        f.flush()
