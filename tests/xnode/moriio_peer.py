#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A vLLM MoRIIO D instance, as far as P's broker can tell (docs/protocol.md).

Run in node B's namespace against the P workers of node A (TP = --p-tp,
transfers "<prefix>-<i>", layers 0..LAYERS-1). Real D workers on B own the
regions the data lands in; this script only speaks the notify protocol.

  write: P opened <prefix>-0..3 (WRITE, --notify-override MY_HOST:MY_PORT)
    and deferred their layers. 2 is aborted by a typed release, 3 by a
    plain-string release, both before any remote_blocks; 0 gets a typed
    remote_blocks, 1 one without "type" (req_id present). Each P rank r
    must then send exactly one write_done per finished transfer, a map with
    exactly {type: "write_done", transfer_id: <verbatim>}, to
    MY_PORT + off(0, r) (equal TP sizes: P rank r writes D rank r), and
    none for the aborted ones. remote_blocks for an aborted transfer is
    rejected (counted) by each P rank.
  read: P opened <prefix>-0..3 (READ, sealed with 0): 0 gets a typed
    release with consumer_tp_size = P's TP, 1 a plain-string transfer_id,
    2 the "<id>:tp<rank>" variant; all must complete. 3 gets typed releases
    with consumer_tp_size = 2 x P's TP: P waits for two ACKs, so after the
    first one it must still be active, after the second it completes.

usage: moriio_peer.py write|read KVBCTL A_SOCK P_HOST P_PORT MY_HOST MY_PORT
                      PREFIX LAYERS [P_TP]
Exit 0 = every check passed; otherwise the first mismatch is printed.
"""
import json
import os
import subprocess
import sys
import time

import msgpack
import zmq

if len(sys.argv) < 10:
    sys.exit(__doc__)
mode, kvbctl, a_sock, p_host = sys.argv[1:5]
p_port = int(sys.argv[5])
my_host, my_port, prefix = sys.argv[6], int(sys.argv[7]), sys.argv[8]
layers = int(sys.argv[9])
p_tp = int(sys.argv[10]) if len(sys.argv) > 10 else 2
d_tp = p_tp  # this D instance has P's TP size (rank r <- rank r)
NXFER = 4
PER_XFER, NBLOCKS = 24, 256  # xnode_worker's defaults


def die(msg):
    print(f"moriio_peer {mode}: FAIL: {msg}", flush=True)
    sys.exit(1)


def log(msg):
    print(f"moriio_peer {mode}: {msg}", flush=True)


def off(dp, tp, tp_size):  # get_port_offset (dp * tp_size + tp)
    return dp * tp_size + tp


def blocks_of(i, side_d, n=PER_XFER, nb=NBLOCKS):
    """xnode_worker.c blocks_of(): the block ids of transfer i."""
    base = (i * n * (3 if side_d else 5)) % nb
    out = [(base + ((j + 7) if side_d and j % 3 == 2 else j)) % nb
           for j in range(n)]
    for j in range(n):
        k = 0
        while k < j:
            if out[k] == out[j]:
                out[j] = (out[j] + 1) % nb
                k = 0
            else:
                k += 1
    return out


def stats():
    try:
        out = subprocess.run([kvbctl, "stats", "--json"], check=True,
                             capture_output=True, text=True, timeout=10,
                             env=dict(os.environ, KVB_SOCKET=a_sock)).stdout
    except (subprocess.SubprocessError, OSError) as e:
        die(f"kvbctl stats on A: {e}")
    return json.loads(out)


def counters():
    s = stats()
    return {"active": s["transfers_active"],
            "rejected": s["messages_rejected"],
            "deferred": s["remote"]["layers_deferred"],
            "releases": s["remote"]["releases_received"],
            "remote_blocks": s["remote"]["remote_blocks_received"],
            "write_done_sent": s["remote"]["write_done_sent"]}


def wait_for(what, pred, timeout=10.0):
    deadline = time.time() + timeout
    c = counters()
    while not pred(c):
        if time.time() > deadline:
            die(f"timed out ({timeout:.0f} s) waiting for {what}: A has {c}")
        time.sleep(0.05)
        c = counters()
    return c


ctx = zmq.Context()
P = []  # DEALER to P rank r's notify port (cached, as vLLM does)
for r in range(p_tp):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 1000)
    s.connect(f"tcp://{p_host}:{p_port + off(0, r, p_tp)}")
    P.append(s)


def to_p(r, payload):
    if P[r].poll(3000, zmq.POLLOUT) == 0:
        die(f"cannot send to P rank {r} ({p_host}:{p_port + r})")
    P[r].send(payload, zmq.DONTWAIT)


def pack(d):
    return msgpack.packb(d, use_bin_type=True)


def xid(i):
    return f"{prefix}-{i}"


def run_write():
    routers = []
    poller = zmq.Poller()
    for t in range(d_tp):
        s = ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.LINGER, 0)
        s.bind(f"tcp://{my_host}:{my_port + off(0, t, d_tp)}")
        routers.append(s)
        poller.register(s, zmq.POLLIN)
    # every P rank opened the 4 transfers and submitted (deferred) layers
    c0 = wait_for(f"{p_tp} x {NXFER} open transfers with deferred layers",
                  lambda c: c["active"] == p_tp * NXFER and
                  c["deferred"] >= p_tp * NXFER * layers, 20)
    time.sleep(0.3)  # the seals follow the layers on the same ring
    log(f"A: {c0['active']} transfers open, {c0['deferred']} layers "
        "deferred")

    # WRITE-mode aborts before remote_blocks: typed and plain string
    for r in range(p_tp):
        to_p(r, pack({"type": "release", "transfer_id": xid(2)}))
        to_p(r, xid(3).encode())
    c = wait_for("the aborted transfers to end on every P rank",
                 lambda c: c["active"] == p_tp * (NXFER - 2), 5)
    if c["releases"] - c0["releases"] != 2 * p_tp:
        die(f"releases_received grew by {c['releases'] - c0['releases']}, "
            f"want {2 * p_tp}")
    if c["rejected"] != c0["rejected"]:
        die(f"a release was rejected (messages_rejected {c0['rejected']} "
            f"-> {c['rejected']})")
    log("typed and plain-string releases aborted 2 and 3 on every P rank")

    # remote_blocks for a transfer already ended (the P workers are still
    # attached: 0 and 1 wait for theirs): rejected by each rank
    db = [blocks_of(i, 1) for i in range(NXFER)]
    for r in range(p_tp):
        to_p(r, pack({"type": "remote_blocks", "transfer_id": xid(2),
                      "req_id": "late", "block_notify_list": db[2],
                      "decode_rank": 0}))
    c1 = wait_for("the late remote_blocks to be rejected",
                  lambda c: c["rejected"] >= c0["rejected"] + p_tp, 5)
    time.sleep(0.2)
    c1 = counters()
    if c1["rejected"] != c0["rejected"] + p_tp or \
            c1["active"] != p_tp * (NXFER - 2):
        die(f"late remote_blocks for aborted {xid(2)}: A has {c1}, want "
            f"{p_tp} more rejected and {p_tp * (NXFER - 2)} active")
    log(f"late remote_blocks for aborted {xid(2)}: rejected by every rank")

    for r in range(p_tp):
        to_p(r, pack({"type": "remote_blocks", "transfer_id": xid(0),
                      "req_id": f"req-{xid(0)}-d", "block_notify_list": db[0],
                      "decode_rank": 0}))
        to_p(r, pack({"transfer_id": xid(1), "req_id": f"req-{xid(1)}-d",
                      "block_notify_list": db[1], "decode_rank": 0}))

    got = {}  # (transfer_id, port index) -> count
    want = {(xid(i), t) for i in (0, 1) for t in range(d_tp)}

    def receive(until):
        extras = False
        while True:
            if not extras and all(got.get(k, 0) for k in want):
                extras = True  # all there: a short look for extras
                until = min(until, time.time() + 0.6)
            left = until - time.time()
            if left <= 0:
                return
            ev = dict(poller.poll(max(1, int(left * 1000))))
            for t, s in enumerate(routers):
                if s not in ev:
                    continue
                frames = s.recv_multipart(copy=False)
                port = my_port + off(0, t, d_tp)
                if len(frames) != 2:
                    die(f"port {port}: {len(frames)} frames, want "
                        "[identity][payload]")
                addr = frames[1].get("Peer-Address")
                if addr != p_host:
                    die(f"port {port}: message from {addr}, want {p_host}")
                raw = frames[1].bytes
                try:
                    m = msgpack.unpackb(raw, raw=False)
                except Exception as e:  # noqa: BLE001
                    die(f"port {port}: not msgpack ({e}): {raw!r}")
                if not isinstance(m, dict):
                    die(f"port {port}: not a msgpack map: {m!r}")
                if set(m) != {"type", "transfer_id"}:
                    die(f"port {port}: fields {sorted(m)}, want exactly "
                        f"['transfer_id', 'type']: {m!r}")
                if m["type"] != "write_done":
                    die(f"port {port}: type {m['type']!r}: {m!r}")
                tid = m["transfer_id"]
                if not isinstance(tid, str) or tid not in \
                        {xid(i) for i in range(NXFER)}:
                    die(f"port {port}: transfer_id {tid!r} is none of ours")
                if tid in (xid(2), xid(3)):
                    die(f"port {port}: write_done for aborted {tid}")
                got[(tid, t)] = got.get((tid, t), 0) + 1
                if got[(tid, t)] > 1:
                    die(f"port {port}: write_done for {tid} twice")
                log(f"write_done {tid} on port {port} from {addr}")

    receive(time.time() + 10)
    missing = sorted(k for k in want if got.get(k, 0) != 1)
    if missing:
        die("write_done missing for (transfer_id, D rank): "
            f"{missing}; got {got}")
    c = wait_for("every transfer to end on A",
                 lambda c: c["active"] == 0, 5)
    receive(time.time() + 0.3)  # nothing more may come
    if c["rejected"] != c1["rejected"]:
        die(f"messages_rejected {c1['rejected']} -> {c['rejected']}")
    if c["write_done_sent"] - c0["write_done_sent"] != len(want):
        die(f"A sent {c['write_done_sent'] - c0['write_done_sent']} "
            f"write_done, want {len(want)}")
    log(f"write_done: one per P rank for {xid(0)} (typed remote_blocks) "
        f"and {xid(1)} (untyped), each on its D rank's port")


def run_read():
    c0 = wait_for(f"{p_tp} x {NXFER} open READ transfers",
                  lambda c: c["active"] == p_tp * NXFER, 20)
    time.sleep(0.3)  # their seals
    for r in range(p_tp):
        to_p(r, pack({"type": "release", "transfer_id": xid(0),
                      "consumer_tp_size": d_tp}))
        to_p(r, xid(1).encode())
        to_p(r, f"{xid(2)}:tp{r}".encode())
    c = wait_for("transfers 0-2 to complete on every P rank",
                 lambda c: c["active"] == p_tp, 5)
    if c["rejected"] != c0["rejected"]:
        die(f"a release was rejected (messages_rejected {c0['rejected']} "
            f"-> {c['rejected']})")
    log("typed (consumer_tp_size), plain and ':tp<rank>' releases: done")

    # consumer TP = 2 x producer TP: two ACKs per P rank
    for r in range(p_tp):
        to_p(r, pack({"type": "release", "transfer_id": xid(3),
                      "consumer_tp_size": 2 * p_tp}))
    c1 = wait_for("the first ACK of transfer 3",
                  lambda c: c["releases"] >= c0["releases"] +
                  3 * p_tp + p_tp, 5)
    time.sleep(0.3)
    c1 = counters()
    if c1["active"] != p_tp:
        die(f"{xid(3)} ended after 1 of 2 ACKs (consumer_tp_size "
            f"{2 * p_tp}, P TP {p_tp}): transfers_active {c1['active']}")
    log(f"{xid(3)}: still active after 1 of 2 ACKs")
    for r in range(p_tp):
        to_p(r, pack({"type": "release", "transfer_id": xid(3),
                      "consumer_tp_size": 2 * p_tp}))
    c = wait_for("transfer 3 to complete after its second ACK",
                 lambda c: c["active"] == 0, 5)
    if c["rejected"] != c0["rejected"]:
        die(f"messages_rejected {c0['rejected']} -> {c['rejected']}")
    log(f"{xid(3)}: complete after 2 of 2 ACKs")


if mode == "write":
    run_write()
elif mode == "read":
    run_read()
else:
    sys.exit(__doc__)
for s in P:
    s.close()
ctx.term()
log("all checks passed")
