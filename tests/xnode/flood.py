#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Floods from an unknown sender at broker A (netns-test.sh case `flood`).
Each part checks that the broker refuses what it cannot keep, counts it,
keeps serving, and does not let the sender take what workers need:

1. 4-frame messages of 2 x 256 KiB on the handshake port: each gets a
   -EBADMSG reply and is counted; A's RSS must not grow by their size
   (every frame kept used to leak).
2. 70 handshakes declaring 70 different (host, hs_port): the peer table
   (63 slots) must not fill for good (netns-test.sh then connects a real
   peer); one declares node_id 'a","x":"' and `kvbctl stats --json` must
   still be JSON.
3. N remote_blocks with fresh transfer ids at a P worker's notify port:
   at most a quarter of the transfer table is kept for them, the oldest
   dropped for newer ones (counted: remote.unopened_evicted); netns-test.sh
   then runs transfers between A and B, which must succeed whichever side
   opens or announces first.

usage: flood.py KVBCTL A_SOCK A_HOST P_NOTIFY_PORT HS_PORT A_PID [N]
"""
import errno
import json
import os
import struct
import subprocess
import sys
import time

import msgpack
import zmq

kvbctl, a_sock, host, p_port, hs_port, a_pid = sys.argv[1:7]
n_junk = int(sys.argv[7]) if len(sys.argv) > 7 else 16500
UNOPENED_MAX = 16384 // 4
failures = 0


def stats():
    out = subprocess.run([kvbctl, "stats", "--json"], check=True,
                         capture_output=True, text=True,
                         env=dict(os.environ, KVB_SOCKET=a_sock)).stdout
    try:
        return json.loads(out)
    except ValueError as e:
        raise SystemExit(f"BAD kvbctl stats --json is not JSON ({e}): "
                         f"{out[:2000]}")


def rss_kib():
    with open(f"/proc/{a_pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def check(ok, what):
    global failures
    print(f"{'ok ' if ok else 'BAD'} {what}")
    if not ok:
        failures += 1


def wait_rejected(want, secs=60, get=lambda d: d["messages_rejected"]):
    now = get(stats())
    deadline = time.time() + secs
    while now < want and time.time() < deadline:
        time.sleep(0.2)
        now = get(stats())
    return now


ctx = zmq.Context()

# 1. too many frames on the handshake port
N4 = 400
big = bytes(256 * 1024)
rej0 = stats()["messages_rejected"]
r0 = rss_kib()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.setsockopt(zmq.SNDHWM, 0)
s.connect(f"tcp://{host}:{hs_port}")
replies = 0
for i in range(N4):
    s.send_multipart([big, big, b"x", b"y"])
    while s.poll(0):
        f = s.recv_multipart()
        replies += len(f) == 2 and struct.unpack("<i", f[0])[0] == \
            -errno.EBADMSG
deadline = time.time() + 30
while replies < N4 and s.poll(max(0, int((deadline - time.time()) * 1000))):
    f = s.recv_multipart()
    replies += len(f) == 2 and struct.unpack("<i", f[0])[0] == -errno.EBADMSG
s.close()
rej1 = wait_rejected(rej0 + N4)
r1 = rss_kib()
check(replies == N4, f"4-frame handshake requests: {replies}/{N4} "
      "-EBADMSG replies")
check(rej1 == rej0 + N4, f"4-frame handshake requests: messages_rejected "
      f"{rej0} -> {rej1} (want +{N4})")
grow = (r1 - r0) // 1024
check(grow < 64, f"4-frame handshake requests ({N4 * 512 // 1024} MiB "
      f"sent): broker RSS {r0 // 1024} -> {r1 // 1024} MiB (+{grow}, "
      "want < 64)")

# 2. handshakes from self-declared peers: one whose node_id holds quotes,
# then 70 more
def handshake(i, node):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{host}:{hs_port}")
    s.send(msgpack.packb(dict(kvb="engine", version=1, node_id=node,
                              host=f"10.9.{i // 200}.{i % 200 + 1}",
                              hs_port=20000 + i, notify_port=61005,
                              instance=i + 1, transports=[], workers=[]),
                         use_bin_type=True))
    ok = False
    if s.poll(15000):
        f = s.recv_multipart()
        ok = len(f) == 2 and struct.unpack("<i", f[0])[0] == 0
    s.close()
    return ok


ODD = 'a","x":"'
check(handshake(999, ODD), "handshake of a peer with node_id 'a\",\"x\":\"'")
st = stats()  # exits when not JSON
nodes = [p["node"] for p in st["remote"]["peers"]]
check(ODD in nodes, f"stats --json with a node_id holding quotes: "
      f"{len(nodes)} peers, the odd one read back intact")
NPEERS = 70
got = sum(handshake(i, f"fake-{i}") for i in range(NPEERS))
check(got == NPEERS, f"{NPEERS} handshakes of made-up peers: {got} served")
nodes = [p["node"] for p in stats()["remote"]["peers"]]
check(f"fake-{NPEERS - 1}" in nodes, f"the last made-up peer got a slot "
      f"(idle ones reused): {len(nodes)} peers")

# 3. remote_blocks for fresh transfer ids
def evicted(d):
    return d["remote"]["unopened_evicted"]


ev0 = evicted(stats())
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 2000)
s.setsockopt(zmq.SNDHWM, 0)
s.connect(f"tcp://{host}:{p_port}")
t0 = time.time()
for i in range(n_junk):
    s.send(msgpack.packb(dict(type="remote_blocks", transfer_id=f"junk-{i}",
                              req_id="r", block_notify_list=[1],
                              decode_rank=0), use_bin_type=True))
want = ev0 + n_junk - UNOPENED_MAX
ev1 = wait_rejected(want, get=evicted)
s.close()
check(ev1 == want, f"{n_junk} remote_blocks for fresh ids: "
      f"unopened_evicted {ev0} -> {ev1} (want +{want - ev0}: at most "
      f"{UNOPENED_MAX} kept, the oldest dropped) in {time.time() - t0:.1f} s")
ctx.term()
print("flood:", "all as expected" if not failures
      else f"{failures} check(s) failed")
sys.exit(1 if failures else 0)
