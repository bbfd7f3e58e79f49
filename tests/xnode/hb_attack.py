#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Heartbeats that must be refused (netns-test.sh case `hb_attack`).

A runs with --trusted-hosts 192.0.2.2 (B) and knows B as a peer (a
transfer ran before). At A's handshake port:

1. a well-formed ping from 192.0.2.9 (not trusted): -EACCES
2. from B's address: a ping of the wrong size: -EBADMSG
3. a ping declaring a peer A never hand-shook with: -ENOENT
4. a ping declaring B, with instance numbers that are not A's and B's
   (an older life): -ESTALE
5. a ping declaring B with both right instance numbers (read from
   handshakes) and a MAC not made with the pair's key: -EACCES
6. the same with a MAC copied from nothing (all zero): -EACCES

Each is answered with its status, never with a pong, and counted
(remote.heartbeats_refused +6, heartbeats_served +0); A loses no peer.

usage: hb_attack.py KVBCTL A_SOCK
"""
import errno
import json
import os
import struct
import subprocess
import sys

import msgpack
import zmq

kvbctl, a_sock = sys.argv[1:3]
A, B, OUT = "192.0.2.1", "192.0.2.2", "192.0.2.9"
failures = 0
ctx = zmq.Context()


def stats():
    out = subprocess.run([kvbctl, "stats", "--json"], check=True,
                         capture_output=True, text=True,
                         env=dict(os.environ, KVB_SOCKET=a_sock)).stdout
    return json.loads(out)["remote"]


def check(ok, what):
    global failures
    print(f"{'ok ' if ok else 'BAD'} {what}")
    if not ok:
        failures += 1


def sock(src=None):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{src}:0;{A}:6301" if src else f"tcp://{A}:6301")
    return s


def ask(frames, src=None):
    s = sock(src)
    s.send_multipart(frames)
    r = s.recv_multipart() if s.poll(5000) else None
    s.close()
    return r


def instance_of(host, declared_port):
    """A handshake to host declaring a made-up peer: its instance."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{host}:6301")
    s.send(msgpack.packb(dict(kvb="engine", version=1, node_id="probe",
                              host=B, hs_port=declared_port,
                              notify_port=61005, instance=7,
                              transports=[], workers=[]),
                         use_bin_type=True))
    r = s.recv_multipart() if s.poll(5000) else None
    s.close()
    if not r or struct.unpack("<i", r[0])[0] != 0:
        raise SystemExit(f"BAD handshake to {host} failed: {r}")
    return msgpack.unpackb(r[1], raw=False)["instance"]


def ping(host, port, frm, to, mac=b"\x11" * 32):
    return struct.pack("<64sIIQQQ", host.encode(), port, 1, frm, to, 1) + mac


def status_of(r):
    if not r or len(r) != 3 or r[1] != b"hb":
        return None
    return struct.unpack("<i", r[0])[0]


ia = instance_of(A, 6398)
ib = instance_of(B, 6397)
s0 = stats()
cases = [
    ("a ping from 192.0.2.9 (not in --trusted-hosts)",
     ask([b"hb", ping(OUT, 6301, 1, ia)], src=OUT), -errno.EACCES),
    ("a ping of 127 bytes", ask([b"hb", bytes(127)]), -errno.EBADMSG),
    ("a ping declaring a peer A does not know (192.0.2.2:6399)",
     ask([b"hb", ping(B, 6399, ib, ia)]), -errno.ENOENT),
    ("a ping declaring B with other instance numbers",
     ask([b"hb", ping(B, 6301, ib ^ 1, ia)]), -errno.ESTALE),
    ("a ping declaring B, right instances, a made-up MAC",
     ask([b"hb", ping(B, 6301, ib, ia)]), -errno.EACCES),
    ("a ping declaring B, right instances, a zero MAC",
     ask([b"hb", ping(B, 6301, ib, ia, bytes(32))]), -errno.EACCES),
]
for what, r, want in cases:
    check(status_of(r) == want,
          f"{what}: answered {status_of(r) if r else 'nothing'} "
          f"(want {want}, no pong)")
s1 = stats()
check(s1["heartbeats_refused"] - s0["heartbeats_refused"] == len(cases),
      f"heartbeats_refused {s0['heartbeats_refused']} -> "
      f"{s1['heartbeats_refused']} (want +{len(cases)})")
check(s1["heartbeats_served"] == s0["heartbeats_served"],
      f"heartbeats_served {s0['heartbeats_served']} -> "
      f"{s1['heartbeats_served']} (want +0)")
check(s1["peers_lost"] == 0, f"peers_lost {s1['peers_lost']} (want 0)")
sys.exit(1 if failures else 0)
