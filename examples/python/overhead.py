#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What the Python binding costs per call, on one node: a 64-byte write's
round trip (submit, wait), batches of 64 writes from a list of Desc and
from a reused desc_array, and an empty poll().
Usage: overhead.py SOCKET [ROUNDS]   (a broker must run on SOCKET)"""
import sys
import time

import kvbroker
from kvbroker import Desc


def main():
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    with kvbroker.Client(sys.argv[1]) as c:
        a, b = c.alloc(1 << 20), c.alloc(1 << 20)
        h = c.open("tx-overhead")
        one = [Desc(transfer=h, region=a.id, peer_region=b.id, len=64, tag=1)]
        t0 = time.perf_counter()
        for _ in range(rounds):
            c.submit_write(one)
            while not c.wait(1, timeout_ms=1000):
                pass
        dt = time.perf_counter() - t0
        print(f"round trip of one 64 B write: {dt / rounds * 1e6:.1f} us")
        batch = [Desc(transfer=h, region=a.id, peer_region=b.id, offset=i * 64,
                      peer_offset=i * 64, len=64, tag=i) for i in range(64)]
        arr = c.desc_array(64)
        for i, d in enumerate(batch):
            arr[i] = d
        for name, descs in (("list of Desc", batch), ("reused desc_array", arr)):
            t0 = time.perf_counter()
            for _ in range(rounds // 10):
                n = c.submit_write(descs)
                got = 0
                while got < n:
                    got += len(c.wait_min(n - got, 64, timeout_ms=1000))
            dt = time.perf_counter() - t0
            print(f"batches of 64 writes, {name}: {dt / (rounds // 10 * 64) * 1e6:.2f} us a write")
        t0 = time.perf_counter()
        for _ in range(rounds):
            c.poll()
        dt = time.perf_counter() - t0
        print(f"empty poll(): {dt / rounds * 1e6:.2f} us")


if __name__ == "__main__":
    main()
