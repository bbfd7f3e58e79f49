# SPDX-License-Identifier: MIT
"""Cross-node calls through the binding, two brokers on loopback (both
--host-ip 127.0.0.1, own handshake and notify ports): peer_connect,
set_kv, open_remote in WRITE mode (P pushes layers into D's blocks) and in
READ mode (D pulls P's blocks), submit_layer, seal; the KV blocks checked
element by element, the blocks not named left untouched."""
import errno
import os
import socket

import pytest

import kvbroker
from kvbroker import CompKind, KVGeometry

np = pytest.importorskip("numpy")

G = KVGeometry("kv_first", num_blocks=8, block_size=16, num_heads=2, head_dim=64, elem_size=2)
SHAPE = (2, 8, 16, 2, 64)  # kv_first: [2, blocks, block_size, heads, head_dim]
LAYERS = 3


def free_ports(n):
    """A base port with n free ports after it (loopback, TCP and UDP)."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base, base + n):
            try:
                t = socket.socket()
                t.bind(("127.0.0.1", p))
                t.close()
            except OSError:
                ok = False
                break
        if ok:
            return base
    pytest.skip("no free loopback ports")


@pytest.fixture
def pair(broker_factory):
    """Brokers A (the P node) and B (the D node): their sockets and handshake ports."""
    a, b = free_ports(8), None
    while b is None or abs(b - a) < 8:
        b = free_ports(8)
    A = broker_factory("--host-ip", "127.0.0.1", "--handshake-port", str(a),
                       "--notify-port", str(a + 1), "--trusted-hosts", "127.0.0.1")
    B = broker_factory("--host-ip", "127.0.0.1", "--handshake-port", str(b),
                       "--notify-port", str(b + 1), "--trusted-hosts", "127.0.0.1")
    yield A, a, B, b
    for x in (A, B):
        assert x.stop() == 0, x.log()


def workers(A, B):
    P = kvbroker.Client(A.sock, role="P", timeout_ms=15000)
    D = kvbroker.Client(B.sock, role="D", timeout_ms=15000)
    flags = kvbroker.MEM_REMOTE_READ | kvbroker.MEM_REMOTE_WRITE
    pr = [P.alloc(G.nbytes, flags=flags, key=l) for l in range(LAYERS)]
    dr = [D.alloc(G.nbytes, flags=flags, key=l) for l in range(LAYERS)]
    for l in range(LAYERS):
        P.set_kv(pr[l], l, G)
        D.set_kv(dr[l], l, G)
        pr[l].buffer[:] = os.urandom(G.nbytes)
    return P, D, pr, dr


def check_blocks(pr, dr, pblocks, dblocks):
    for l in range(LAYERS):
        a = pr[l].as_numpy(np.uint16, SHAPE)
        b = dr[l].as_numpy(np.uint16, SHAPE)
        assert (a[:, pblocks] == b[:, dblocks]).all(), f"layer {l}"
        others = [i for i in range(G.num_blocks) if i not in dblocks]
        assert (b[:, others] == 0).all(), f"layer {l}: a block not named was written"


def test_write_mode(pair):
    A, a, B, b = pair
    P, D, pr, dr = workers(A, B)
    with P, D:
        pp = P.peer_connect("127.0.0.1", b)
        dp = D.peer_connect("127.0.0.1", a)
        assert pp > 0 and dp > 0
        assert P.peer_connect("127.0.0.1", b) == pp  # cached: the same number
        hd = D.open_remote("tx-w", dp, "write", blocks=[4, 5, 6], remote_dp_rank=0)
        D.seal(hd, 1, tag=100)
        hp = P.open_remote("tx-w", pp, kvbroker.XferMode.WRITE, blocks=np.array([0, 1, 2]))
        for l in range(LAYERS):
            assert P.submit_layer(hp, l, tag=l) == 1
        P.seal(hp, LAYERS, tag=200)
        got = P.wait_min(LAYERS + 1, timeout_ms=20000)
        assert sorted(c.tag for c in got) == [0, 1, 2, 200], got
        assert all(c.ok for c in got), got
        assert sum(c.bytes for c in got if c.kind == CompKind.DESC) == LAYERS * 3 * 2 * 16 * 2 * 64 * 2
        (dc,) = D.wait_min(1, timeout_ms=20000)
        assert (dc.kind, dc.tag, dc.status) == (CompKind.TRANSFER, 100, 0)
        check_blocks(pr, dr, [0, 1, 2], [4, 5, 6])
        # a layer submitted twice is refused in its completion
        assert P.submit_layer(hp, 0, tag=9) == 1
        (c,) = P.wait(timeout_ms=5000)
        assert c.tag == 9 and c.status in (-errno.EEXIST, -errno.ESTALE, -errno.EINVAL)


def test_write_mode_many_transfers(pair):
    """submit_layers: one call per layer queues the layer of every transfer."""
    A, a, B, b = pair
    P, D, pr, dr = workers(A, B)
    with P, D:
        pp = P.peer_connect("127.0.0.1", b)
        dp = D.peer_connect("127.0.0.1", a)
        plan = [("tx-m0", [0, 1], [2, 3]), ("tx-m1", [4], [0]), ("tx-m2", [5, 6], [6, 7])]
        for i, (tid, _, dblk) in enumerate(plan):
            D.seal(D.open_remote(tid, dp, "write", blocks=dblk), 1, tag=100 + i)
        hs = [P.open_remote(tid, pp, "write", blocks=pblk) for tid, pblk, _ in plan]
        for l in range(LAYERS):
            assert P.submit_layers(hs, [10 * l + i for i in range(len(hs))], layer=l,
                                   flags=kvbroker.DESC_UNSIGNALED) == len(hs)
        for i, h in enumerate(hs):
            P.seal(h, LAYERS, tag=200 + i)
        got = P.wait_min(len(hs), timeout_ms=20000)
        assert sorted((c.kind, c.tag, c.status) for c in got) == [
            (CompKind.TRANSFER, 200 + i, 0) for i in range(len(hs))]
        got = D.wait_min(len(hs), timeout_ms=20000)
        assert sorted((c.tag, c.status) for c in got) == [(100 + i, 0) for i in range(len(hs))]
        check_blocks(pr, dr, [0, 1, 4, 5, 6], [2, 3, 0, 6, 7])


def test_read_mode(pair):
    A, a, B, b = pair
    P, D, pr, dr = workers(A, B)
    with P, D:
        pp = P.peer_connect("127.0.0.1", b)
        dp = D.peer_connect("127.0.0.1", a)
        hp = P.open_remote("tx-r", pp, "read", blocks=[3, 7])
        P.seal(hp, 0, tag=300)  # ends with D's release
        hd = D.open_remote("tx-r", dp, "read", blocks=[1, 2], remote_blocks=[3, 7])
        for l in range(LAYERS):
            assert D.submit_layer(hd, l, tag=10 + l, flags=kvbroker.DESC_UNSIGNALED) == 1
        D.seal(hd, LAYERS, tag=400)
        got = D.wait_min(1, timeout_ms=20000)
        assert [(c.kind, c.tag, c.status) for c in got] == [(CompKind.TRANSFER, 400, 0)]
        (pc,) = P.wait_min(1, timeout_ms=20000)
        assert (pc.kind, pc.tag, pc.status) == (CompKind.TRANSFER, 300, 0)
        check_blocks(pr, dr, [3, 7], [1, 2])


def test_remote_errors(pair):
    A, a, B, b = pair
    with kvbroker.Client(A.sock, role="P", timeout_ms=15000) as P:
        with pytest.raises(kvbroker.Error) as e:  # an unknown peer number
            P.open_remote("tx-e", 77, blocks=[1])
        assert e.value.errno == errno.ENOENT and e.value.call == "kvb_transfer_open_remote"
        pp = P.peer_connect("127.0.0.1", b)
        with pytest.raises(kvbroker.Error) as e:  # bad flags
            P.open_remote("tx-e", pp, blocks=[1], flags=0x80)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(kvbroker.Error) as e:  # block lists larger than one message
            P.open_remote("tx-e", pp, blocks=range(20000))
        assert e.value.errno == errno.E2BIG
        with pytest.raises(kvbroker.Error) as e:
            P.open_remote("tx-e", pp, blocks=[1], notify_host="h" * 300)
        assert e.value.errno == errno.EINVAL
