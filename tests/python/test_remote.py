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


def test_open_remote_batch(pair):
    """open_remote_batch: by the peer's address, no peer_connect; D's wait
    for the handshake (A not known to B yet), one call for all; a live id
    opened again is refused (EEXIST) and the first goes on."""
    A, a, B, b = pair
    P, D, pr, dr = workers(A, B)
    with P, D:
        plan = [("tx-pb0", [0, 1], [2, 3]), ("tx-pb1", [4], [0]), ("tx-pb2", [5, 6], [6, 7])]
        got = D.open_remote_batch([
            dict(transfer_id=t, host="127.0.0.1", port=a, mode="write", blocks=dblk,
                 remote_dp_rank=0) for t, _, dblk in plan])
        assert [s for s, _ in got] == [0, 0, 0] and all(h for _, h in got)
        for i, (_, h) in enumerate(got):
            D.seal(h, 1, tag=100 + i)
        got = P.open_remote_batch([
            dict(transfer_id=t, host="127.0.0.1", port=b, blocks=np.array(pblk))
            for t, pblk, _ in plan] + [dict(transfer_id="tx-pb0", host="127.0.0.1", port=b,
                                           blocks=[0, 1])])
        assert [s for s, _ in got] == [0, 0, 0, -errno.EEXIST]
        assert got[3][1] == 0
        hs = [h for _, h in got[:3]]
        for l in range(LAYERS):
            assert P.submit_layers(hs, [10 * l + i for i in range(3)], layer=l,
                                   flags=kvbroker.DESC_UNSIGNALED) == 3
        for i, h in enumerate(hs):
            P.seal(h, LAYERS, tag=200 + i)
        got = P.wait_min(3, timeout_ms=20000)
        assert sorted((c.kind, c.tag, c.status) for c in got) == [
            (CompKind.TRANSFER, 200 + i, 0) for i in range(3)]
        got = D.wait_min(3, timeout_ms=20000)
        assert sorted((c.tag, c.status) for c in got) == [(100 + i, 0) for i in range(3)]
        check_blocks(pr, dr, [0, 1, 4, 5, 6], [2, 3, 0, 6, 7])
        assert P.stats()["remote"]["duplicate_opens"] == 1
        assert D.stats()["remote"]["opens_waiting"] == 3
        # bad entries: each alone; Python-side mistakes raise
        got = D.open_remote_batch([
            dict(transfer_id="tx-pbx", host="192.0.2.9", port=6301, blocks=[1]),
            dict(transfer_id="tx-pby", host="127.0.0.1", port=a, mode="read", blocks=[1],
                 release_only=True)])
        assert got == [(-errno.EACCES, 0), (-errno.EINVAL, 0)]
        with pytest.raises(TypeError):
            D.open_remote_batch([dict(transfer_id="t", host="h", port=1, bogus=1)])
        with pytest.raises(ValueError):
            D.open_remote_batch([dict(transfer_id="t", host="h", port=1, mode="up")])
        assert D.open_remote_batch([]) == []


def test_open_remote_batch_release_only(pair):
    """release_only: D releases an id it never loaded; P's transfer (its
    layers waiting for remote_blocks) ends at once with ECANCELED, D's
    completes with 0 at its seal."""
    A, a, B, b = pair
    P, D, pr, dr = workers(A, B)
    with P, D:
        ((s, hp),) = P.open_remote_batch([dict(transfer_id="tx-rel", host="127.0.0.1", port=b,
                                               blocks=[1, 2])])
        assert s == 0
        for l in range(LAYERS):
            P.submit_layer(hp, l, tag=l)
        P.seal(hp, LAYERS, tag=300)
        assert kvbroker.XFER_F_RELEASE_ONLY == 0x4
        ((s, hd),) = D.open_remote_batch([dict(transfer_id="tx-rel", host="127.0.0.1", port=a,
                                               remote_dp_rank=0, release_only=True)])
        assert s == 0
        D.seal(hd, 0, tag=400)
        got = P.wait_min(LAYERS + 1, timeout_ms=5000)
        assert sorted((c.kind, c.tag, c.status) for c in got) == sorted(
            [(CompKind.DESC, l, -errno.ECANCELED) for l in range(LAYERS)]
            + [(CompKind.TRANSFER, 300, -errno.ECANCELED)])
        (c,) = D.wait_min(1, timeout_ms=5000)
        assert (c.kind, c.tag, c.status) == (CompKind.TRANSFER, 400, 0)
        assert D.stats()["remote"]["release_only_sent"] == 1


def test_expect(pair):
    """expect: P declares the ids it will open; D's announcement of an id
    P withdrew fails at once (ECANCELED); an expected one is held and
    lands when P opens it; bad ids and a library call's limits."""
    A, a, B, b = pair
    P, D, pr, dr = workers(A, B)
    with P, D:
        assert P.expect(["tx-e1", "tx-e2"]) == [0, 0]
        assert P.expect(["tx-e2"], withdraw=True) == [0]
        got = D.open_remote_batch([
            dict(transfer_id=t, host="127.0.0.1", port=a, blocks=[i])
            for i, t in enumerate(("tx-e1", "tx-e2"))])
        assert [s for s, _ in got] == [0, 0]
        for i, (_, h) in enumerate(got):
            D.seal(h, 1, tag=500 + i)
        (c,) = D.wait_min(1, timeout_ms=5000)
        assert (c.kind, c.tag, c.status) == (CompKind.TRANSFER, 501, -errno.ECANCELED)
        ((s, hp),) = P.open_remote_batch([dict(transfer_id="tx-e1", host="127.0.0.1", port=b,
                                               blocks=[3])])
        assert s == 0
        for l in range(LAYERS):
            P.submit_layer(hp, l, tag=l, flags=kvbroker.DESC_UNSIGNALED)
        P.seal(hp, LAYERS, tag=600)
        (c,) = P.wait_min(1, timeout_ms=10000)
        assert (c.tag, c.status) == (600, 0)
        (c,) = D.wait_min(1, timeout_ms=10000)
        assert (c.tag, c.status) == (500, 0)
        check_blocks(pr, dr, [3], [0])
        r = P.stats()["remote"]
        assert (r["expects"], r["withdraws"], r["withdrawn_told"]) == (2, 1, 1)
        assert P.expect([]) == []
        with pytest.raises(ValueError):
            P.expect([""])
        assert P.expect(["tx-e1"]) == [-errno.ESTALE]  # ended
        assert kvbroker.EXPECT_MAX == 1024


def test_alias_regions(pair):
    """One backing buffer per side, a region alias per layer at odd byte
    offsets: P writes D's blocks through them; nothing else of D's buffer
    changes; as_numpy / as_torch see the alias's bytes; the parent cannot
    be freed before its aliases."""
    A, a, B, b = pair
    P = kvbroker.Client(A.sock, role="P", timeout_ms=15000)
    D = kvbroker.Client(B.sock, role="D", timeout_ms=15000)
    with P, D:
        size = 7 + LAYERS * (G.nbytes + 3)
        pb = P.alloc(size, flags=kvbroker.MEM_REMOTE_READ, key=100)
        db = D.alloc(size, flags=kvbroker.MEM_REMOTE_WRITE, key=100)
        pb.buffer[:] = os.urandom(size)
        db.buffer[:] = b"\xa5" * size
        offs = [7 + l * (G.nbytes + 3) for l in range(LAYERS)]
        doffs = [size - (l + 1) * (G.nbytes + 3) + 1 for l in range(LAYERS)]
        pa = [pb.alias(o, G.nbytes, flags=kvbroker.MEM_REMOTE_READ, key=l)
              for l, o in enumerate(offs)]
        da = [D.alias(db, o, G.nbytes, flags=kvbroker.MEM_REMOTE_WRITE, key=l)
              for l, o in enumerate(doffs)]
        for l in range(LAYERS):
            P.set_kv(pa[l], l, G)
            D.set_kv(da[l], l, G)
            assert pa[l].addr == pb.addr + offs[l]
            assert bytes(pa[l].buffer[:16]) == bytes(pb.buffer[offs[l]:offs[l] + 16])
        with pytest.raises(kvbroker.Error) as e:
            pb.free()
        assert e.value.errno == errno.EBUSY and not pb.freed
        ((s, hd),) = D.open_remote_batch([dict(transfer_id="tx-al", host="127.0.0.1", port=a,
                                               blocks=[3, 5])])
        D.seal(hd, 1, tag=1)
        ((s, hp),) = P.open_remote_batch([dict(transfer_id="tx-al", host="127.0.0.1", port=b,
                                               blocks=[6, 0])])
        for l in range(LAYERS):
            P.submit_layer(hp, l, tag=l, flags=kvbroker.DESC_UNSIGNALED)
        P.seal(hp, LAYERS, tag=2)
        assert [(c.tag, c.status) for c in P.wait_min(1, timeout_ms=20000)] == [(2, 0)]
        assert [(c.tag, c.status) for c in D.wait_min(1, timeout_ms=20000)] == [(1, 0)]
        want = bytearray(b"\xa5" * size)
        for l in range(LAYERS):
            src = pa[l].as_numpy(np.uint16, SHAPE)
            dst = da[l].as_numpy(np.uint16, SHAPE)
            assert (dst[:, [3, 5]] == src[:, [6, 0]]).all()
            w = np.frombuffer(want, dtype=np.uint8, count=G.nbytes, offset=doffs[l])
            w = w.view(np.uint16).reshape(SHAPE)
            w[:, [3, 5]] = src[:, [6, 0]]
        assert bytes(db.buffer) == bytes(want), "a byte outside the named blocks changed"
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            t = da[0].as_torch(torch.uint8)
            assert t.numel() == G.nbytes and bytes(t[:8].numpy()) == bytes(db.buffer[doffs[0]:doffs[0] + 8])
        for r in pa:
            r.free()
        pb.free()
        assert pb.freed
