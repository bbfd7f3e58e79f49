#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Bad input on the notify ports of a live broker, as a vLLM MoRIIO peer
could send it. Each message must be rejected: logged, counted in
`kvbctl stats` messages_rejected (exactly one more per message), dropped,
and the listener must keep serving (the next message is handled too).

usage: bad_input.py KVBCTL A_SOCK B_SOCK P_HOST P_PORT D_HOST D_PORT
P_* is a P worker's notify port (it holds transfers hold-0 and hold-1, and
hold-0 was opened with 24 blocks); D_* a D worker's notify port.
"""
import json
import os
import subprocess
import sys
import time

import msgpack
import zmq

kvbctl, a_sock, b_sock, p_host, p_port, d_host, d_port = sys.argv[1:8]


def stats(sock):
    out = subprocess.run([kvbctl, "stats", "--json"], check=True,
                         capture_output=True, text=True,
                         env=dict(os.environ, KVB_SOCKET=sock)).stdout
    return json.loads(out)


def rejected(sock):
    return stats(sock)["messages_rejected"]


ctx = zmq.Context()


def dealer(host, port):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 500)
    s.connect(f"tcp://{host}:{port}")
    return s


P = dealer(p_host, p_port)
D = dealer(d_host, d_port)
failures = 0


def expect(sock_name, sock, payload, what, rejected_delta=1):
    global failures
    path = a_sock if sock_name == "P" else b_sock
    before = rejected(path)
    sock.send(payload)
    deadline = time.time() + 3
    now = before
    while time.time() < deadline:
        now = rejected(path)
        if now >= before + rejected_delta:
            break
        time.sleep(0.05)
    time.sleep(0.1)
    now = rejected(path)
    ok = now == before + rejected_delta
    print(f"{'ok ' if ok else 'BAD'} {what}: messages_rejected "
          f"{before} -> {now} (want +{rejected_delta})")
    if not ok:
        failures += 1


def m(**kw):
    return msgpack.packb(kw, use_bin_type=True)


blocks24 = list(range(24))
expect("P", P, b"\xc1\xff\x00\x13", "garbage bytes")
expect("P", P, b"\xff\xfe\xfdabc", "non-UTF-8 bytes")
expect("P", P, m(type="bogus", transfer_id="hold-0"), "unknown type")
expect("P", P, m(type="remote_blocks", transfer_id="hold-0", req_id="r",
                 block_notify_list=[], decode_rank=0),
       "empty block_notify_list")
expect("P", P, m(type="remote_blocks", transfer_id="hold-0", req_id="r",
                 block_notify_list=[100000 + i for i in range(24)],
                 decode_rank=0),
       "block ids past the peer's num_blocks")
expect("P", P, m(type="release", transfer_id="hold-0", consumer_tp_size=0),
       "consumer_tp_size 0")
expect("P", P, m(type="write_done", transfer_id="hold-0"),
       "write_done sent to a P worker (other role)")
expect("D", D, m(type="remote_blocks", transfer_id="hold-0", req_id="r",
                 block_notify_list=blocks24, decode_rank=0),
       "remote_blocks sent to a D worker (other role)")
# a good release aborts hold-0 (accepted), then the transfer is terminal
expect("P", P, m(type="release", transfer_id="hold-0"),
       "typed release (abort): accepted", rejected_delta=0)
expect("P", P, m(type="release", transfer_id="hold-0"),
       "release for a terminal transfer")
expect("P", P, b"hold-0", "plain-string release for a terminal transfer")
expect("P", P, m(type="remote_blocks", transfer_id="hold-0", req_id="r",
                 block_notify_list=blocks24, decode_rank=0),
       "remote_blocks for a terminal transfer")
P.close()
D.close()
ctx.term()
print("bad_input:", "all rejected as expected" if not failures
      else f"{failures} check(s) failed")
sys.exit(1 if failures else 0)
