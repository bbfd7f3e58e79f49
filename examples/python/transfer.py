#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Two processes move a block through the broker: a D worker offers a
region (remote write), a P worker writes its bytes into it; D checks them.
Usage: transfer.py [SOCKET] [SIZE]   (SOCKET: default kvbroker socket)"""
import hashlib
import multiprocessing as mp
import os
import sys

import kvbroker

SOCK = sys.argv[1] if len(sys.argv) > 1 else None
SIZE = int(sys.argv[2]) if len(sys.argv) > 2 else 4 << 20


def receiver(pipe):
    with kvbroker.Client(SOCK, role="D") as d:
        dst = d.alloc(SIZE, flags=kvbroker.MEM_REMOTE_WRITE, key=7)
        pipe.send("ready")
        want = pipe.recv()  # P's digest, once its transfer completed
        pipe.send(hashlib.sha256(dst.buffer).hexdigest() == want)


def main():
    here, there = mp.Pipe()
    child = mp.get_context("fork").Process(target=receiver, args=(there,))
    child.start()  # fork before attaching: a context is not shared
    with kvbroker.Client(SOCK, role="P") as p:
        assert here.recv() == "ready"
        peer = p.lookup("D", 0, 0, 7)
        src = p.alloc(SIZE)
        src.buffer[:] = os.urandom(SIZE)
        h = p.open("tx-example")
        p.submit_write([kvbroker.Desc(transfer=h, region=src.id, peer_region=peer.id,
                                      len=SIZE, tag=1)])
        p.seal(h, 1, tag=2)
        done = p.wait_min(2, timeout_ms=10000)
        assert len(done) == 2 and all(c.ok for c in done), done
        here.send(hashlib.sha256(src.buffer).hexdigest())
        ok = here.recv()
    child.join(10)
    print(f"moved {SIZE} bytes P -> D: {'bytes match' if ok else 'MISMATCH'}")
    return 0 if ok and child.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
