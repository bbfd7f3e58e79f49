#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Attacks on a broker's tcp data port (netns-test.sh tcp_outsider,
tcp_fdflood). Only the 192.0.2.0/24 test addresses the script is given.

  tcp_attack.py frames SRC DST PORT   READ 1 byte of region ids 1..256 and
                                      65537..65792, then WRITE 18 bytes into
                                      each, no handshake;
                                      pass: closed, not a byte answered
  tcp_attack.py silent SRC DST PORT   connect, send nothing; pass: closed
                                      within 5 s (prints the ms)
  tcp_attack.py flood SRC DST PORT N HOLD_S
                                      N idle connections held HOLD_S s;
                                      prints how many the broker closed
Bounded: every wait has a deadline; the script stops by itself.
"""
import errno
import resource
import select
import socket
import struct
import sys
import time

HDR = struct.Struct("<IBBH8xQ")  # magic, version, type, count, payload
REC = struct.Struct("<QIiQQ")    # seq, region, status, off, len
MAGIC = 0x464B5654


def attack_bytes():
    # region ids: 1..256, and 256 from 65537 (a broker numbers a worker's
    # regions from its slot << 16: the first worker's)
    ids = list(range(1, 257)) + list(range(65537, 65537 + 256))
    n = len(ids)
    out = [HDR.pack(MAGIC, 1, 2, n, 0)]
    out += [REC.pack(i, r, 0, 0, 1) for i, r in enumerate(ids)]
    for i, r in enumerate(ids):
        out.append(HDR.pack(MAGIC, 1, 1, 1, 18))
        out.append(REC.pack(n + i, r, 0, 0, 18))
        out.append(b"A" * 18)
    return b"".join(out)


def dial(src, dst, port, block=True):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    if block:
        s.settimeout(5)
        s.connect((dst, port))
    else:
        s.setblocking(False)
        s.connect_ex((dst, port))
    return s


def until_closed(s, limit=5.0):
    """(ms until the peer closed or -1, bytes received meanwhile)"""
    t0 = time.monotonic()
    got = 0
    s.setblocking(False)
    while time.monotonic() - t0 < limit:
        r, _, _ = select.select([s], [], [], 0.05)
        if not r:
            continue
        try:
            d = s.recv(65536)
        except ConnectionResetError:
            return (time.monotonic() - t0) * 1000, got
        except BlockingIOError:
            continue
        if not d:
            return (time.monotonic() - t0) * 1000, got
        got += len(d)
    return -1, got


def frames(src, dst, port):
    s = dial(src, dst, port)
    data = attack_bytes()
    try:
        s.sendall(data)
        sent = len(data)
    except OSError as e:  # closed under us: what went is what counts
        sent = -e.errno
    ms, got = until_closed(s)
    s.close()
    print(f"frames from {src}: {sent} bytes sent, closed after {ms:.1f} ms,"
          f" {got} bytes answered")
    return 0 if ms >= 0 and got == 0 else 1


def silent(src, dst, port):
    s = dial(src, dst, port)
    ms, got = until_closed(s)
    s.close()
    print(f"silent connection from {src}: closed after {ms:.0f} ms, "
          f"{got} bytes answered")
    return 0 if ms >= 0 and got == 0 else 1


def flood(src, dst, port, n, hold):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, n + 256) if hard != resource.RLIM_INFINITY else n + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    socks = []
    t0 = time.monotonic()
    for _ in range(n):
        try:
            socks.append(dial(src, dst, port, block=False))
        except OSError as e:
            print(f"flood: dial failed: {e}")
            break
    opened = len(socks)
    closed = set()
    byfd = {s.fileno(): s for s in socks}
    pl = select.poll()  # select() stops at descriptor 1024
    for fd in byfd:
        pl.register(fd, select.POLLIN)
    end = t0 + hold
    while time.monotonic() < end and len(closed) < opened:
        for fd, ev in pl.poll(100):
            try:
                d = byfd[fd].recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                d = b""
            if not d:
                closed.add(fd)
                pl.unregister(fd)
    print(f"flood from {src}: {opened} connections opened, "
          f"{len(closed)} closed by the broker within {hold} s, "
          f"{opened - len(closed)} still open at the end")
    for s in socks:
        s.close()
    return 0 if opened == n else 1


def main():
    mode = sys.argv[1]
    src, dst, port = sys.argv[2], sys.argv[3], int(sys.argv[4])
    for a in (src, dst):
        if not a.startswith("192.0.2."):
            sys.exit("only 192.0.2.0/24 test addresses")
    if mode == "frames":
        return frames(src, dst, port)
    if mode == "silent":
        return silent(src, dst, port)
    if mode == "flood":
        return flood(src, dst, port, int(sys.argv[5]), float(sys.argv[6]))
    sys.exit("mode: frames | silent | flood")


if __name__ == "__main__":
    sys.exit(main())
