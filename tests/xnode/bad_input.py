#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Bad input on the notify ports of a live broker, as a vLLM MoRIIO peer
could send it. Each message must be rejected: logged, counted in
`kvbctl stats` messages_rejected (exactly one more per message), dropped,
and the listener must keep serving (the next message is handled too).

usage: bad_input.py KVBCTL A_SOCK B_SOCK P_HOST P_PORT D_HOST D_PORT [HS_PORT]
P_* is a P worker's notify port (it holds transfers hold-0 and hold-1, and
hold-0 was opened with 24 blocks); D_* a D worker's notify port. HS_PORT
(default 6301) is the handshake port of P_HOST's broker (A): garbage and a
descriptor of another version must be refused with a reply
[int32 LE status][reason] and counted in messages_rejected.
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

kvbctl, a_sock, b_sock, p_host, p_port, d_host, d_port = sys.argv[1:8]
hs_port = int(sys.argv[8]) if len(sys.argv) > 8 else 6301


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
    deadline = time.time() + 15
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


def expect_hs(payload, what, want_status, want_in_reason):
    """Send one handshake request to A; check the refusal and its count."""
    global failures
    before = rejected(a_sock)
    s = dealer(p_host, hs_port)
    s.send(payload)
    frames = s.recv_multipart() if s.poll(15000) else None
    s.close()
    problems = []
    if frames is None:
        problems.append("no reply within 15 s")
    elif len(frames) != 2 or len(frames[0]) != 4:
        problems.append(f"reply frames {[len(f) for f in frames]}, "
                        "want [4 bytes][reason]")
    else:
        status = struct.unpack("<i", frames[0])[0]
        reason = frames[1].decode("utf-8", "replace")
        if status != want_status:
            problems.append(f"status {status}, want {want_status}")
        if want_in_reason not in reason:
            problems.append(f"reason {reason!r} lacks {want_in_reason!r}")
    deadline = time.time() + 15
    now = rejected(a_sock)
    while now < before + 1 and time.time() < deadline:
        time.sleep(0.05)
        now = rejected(a_sock)
    time.sleep(0.1)
    now = rejected(a_sock)
    if now != before + 1:
        problems.append(f"messages_rejected {before} -> {now} (want +1)")
    print(f"{'BAD' if problems else 'ok '} handshake port, {what}: "
          f"{'; '.join(problems) if problems else 'refused as expected'}")
    if frames is not None and len(frames) == 2 and len(frames[0]) == 4:
        print(f"    reply: status {struct.unpack('<i', frames[0])[0]}, "
              f"reason {frames[1].decode('utf-8', 'replace')!r}, "
              f"messages_rejected {before} -> {now}")
    if problems:
        failures += 1


expect_hs(b"\xc1\xff\x00\x13garbage", "garbage bytes", -errno.EBADMSG, "")
expect_hs(m(kvb="engine", version=2, node_id="other:6301",
            host="192.0.2.2", hs_port=6301, notify_port=61005, workers=[]),
          "descriptor of handshake version 2", -errno.EPROTONOSUPPORT,
          "version")
ctx.term()
print("bad_input:", "all rejected as expected" if not failures
      else f"{failures} check(s) failed")
sys.exit(1 if failures else 0)
