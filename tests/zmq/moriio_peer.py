#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A vLLM MoRIIO decode (D) worker, as far as the notify port goes.

Driven by moriio_peer_driver.c, which runs kvbroker's notify endpoint for
the prefill (P) side. This peer, like MoRIIO's D side:
  - binds a ROUTER on notify_port + dp_rank * tp_size + tp_rank per D rank,
  - sends remote_blocks to every P TP rank, typed and untyped (old senders),
  - receives write_done and checks its fields and the port it arrived on,
  - sends releases: typed (with and without consumer_tp_size), the plain
    transfer_id string, and the READ variant "<transfer_id>:tp<rank>",
  - sends one malformed message (which would kill a vLLM listener thread),
  - ends with a typed release of "tx-bye" to every P rank.

usage: moriio_peer.py HOST P_BASE P_TP D_BASE D_DP D_TP
exit 0 when every check passed, 1 otherwise, 77 when pyzmq/msgpack are missing.
"""
import sys

try:
    import msgpack
    import zmq
except ImportError as e:
    print("moriio_peer: skip:", e)
    sys.exit(77)


def fail(why):
    print("moriio_peer: FAIL:", why, flush=True)
    sys.exit(1)


def main():
    host, p_base, p_tp, d_base, d_dp, d_tp = sys.argv[1:7]
    p_base, p_tp, d_base, d_dp, d_tp = map(int, (p_base, p_tp, d_base,
                                                 d_dp, d_tp))
    ctx = zmq.Context()

    # D's notify listeners
    routers = {}
    for r in range(d_tp):
        port = d_base + d_dp * d_tp + r
        s = ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.LINGER, 0)
        s.bind("tcp://%s:%d" % (host, port))
        routers[s] = (r, port)

    # one cached DEALER per P path, as MoRIIO does
    dealers = []
    for r in range(p_tp):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 1000)
        s.connect("tcp://%s:%d" % (host, p_base + r))
        dealers.append(s)

    def send(rank, obj):
        data = obj if isinstance(obj, bytes) else msgpack.dumps(obj)
        dealers[rank].send(data)

    transfers = ["tx-typed-6c1f", "tx-untyped-9a2e"]
    for r in range(p_tp):
        send(r, {"type": "remote_blocks", "transfer_id": transfers[0],
                 "req_id": "cmpl-%d-0" % r,
                 "block_notify_list": [1, 2, 3, 300], "decode_rank": d_dp})
        # old senders: no type, req_id present
        send(r, {"req_id": "cmpl-%d-1" % r, "transfer_id": transfers[1],
                 "block_notify_list": [70000], "decode_rank": d_dp})

    # every P rank sends write_done for every transfer to D's rank port
    want = {(t, port): 0 for t in transfers for (_, port) in
            routers.values()}
    poller = zmq.Poller()
    for s in routers:
        poller.register(s, zmq.POLLIN)
    got = 0
    expected = len(transfers) * p_tp
    while got < expected:
        ready = dict(poller.poll(10000))
        if not ready:
            fail("timed out waiting for write_done (%d/%d)" % (got,
                                                               expected))
        for s in ready:
            frames = s.recv_multipart()
            if len(frames) != 2:
                fail("write_done in %d frames" % len(frames))
            msg = msgpack.loads(frames[1])
            if not isinstance(msg, dict):
                fail("write_done is not a map: %r" % (msg,))
            if set(msg) != {"type", "transfer_id"}:
                fail("write_done fields: %r" % (sorted(msg),))
            if msg["type"] != "write_done":
                fail("unexpected type %r" % (msg["type"],))
            key = (msg["transfer_id"], routers[s][1])
            if key not in want:
                fail("write_done %r on port %d" % key[::-1])
            want[key] += 1
            got += 1
    # docs/protocol.md rank mapping: P rank r writes to D rank r (equal TP),
    # r * (D/P) (D larger), r // (P/D) (D smaller): one write_done per
    # (transfer, mapped D port), none elsewhere.
    def mapped(r):
        if d_tp == p_tp:
            return r
        return r * (d_tp // p_tp) if d_tp > p_tp else r // (p_tp // d_tp)

    ports = {d_base + d_dp * d_tp + mapped(r) for r in range(p_tp)}
    for (t, port), n in want.items():
        if n != (1 if port in ports else 0):
            fail("write_done %s on port %d: %d times" % (t, port, n))

    # releases, every form MoRIIO peers send
    send(0, {"type": "release", "transfer_id": transfers[0],
             "consumer_tp_size": d_tp})
    send(0, b"\xff\xfe not utf-8")  # malformed: must be dropped, not fatal
    send(0, transfers[1].encode())   # plain string: one release ACK
    if p_tp > 1:
        send(1, {"type": "release", "transfer_id": transfers[0]})
        send(1, ("%s:tp%d" % (transfers[1], 1)).encode())  # READ variant
    for r in range(p_tp):
        send(r, {"type": "release", "transfer_id": "tx-bye"})

    # nothing may come back on the notify sockets
    if poller.poll(300):
        fail("unexpected extra message on a notify socket")
    for s in dealers + list(routers):
        s.close()
    ctx.term()
    print("moriio_peer: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
