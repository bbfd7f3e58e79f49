# SPDX-License-Identifier: MIT
"""Every error path of the binding: each -errno as kvbroker.Error (errno,
strerror, call), refused descriptors as completion statuses, a full ring,
a closed client, the broker going away (no hang), and nothing leaked."""
import errno
import os
import pickle
import signal
import time

import pytest

import kvbroker
from conftest import fd_count
from kvbroker import CompKind, Desc, KVGeometry

SIZE = 1 << 16


def test_error_class():
    e = kvbroker.Error(-errno.EPIPE, call="kvb_poll")
    assert isinstance(e, OSError)
    assert e.errno == errno.EPIPE and e.call == "kvb_poll"
    assert e.strerror == "broker is gone"  # kvb_strerror's text
    assert str(e) == "kvb_poll: broker is gone (EPIPE)"
    e2 = pickle.loads(pickle.dumps(e))
    assert (type(e2), e2.errno, e2.strerror, e2.call) == (kvbroker.Error, e.errno, e.strerror, e.call)
    assert issubclass(kvbroker.BrokerGone, kvbroker.Error)
    assert issubclass(kvbroker.RingFull, kvbroker.Error)
    assert kvbroker.strerror(-errno.EFAULT) == "descriptor out of bounds of its region"
    assert kvbroker.strerror(-errno.ENOENT) == os.strerror(errno.ENOENT)
    # -EACCES: kvb_attach's untrusted broker, or a completion's refused access
    acc = kvbroker.strerror(-errno.EACCES)
    assert "broker not trusted" in acc and "remote side refused" in acc


def test_no_broker(tmp_path):
    with pytest.raises(kvbroker.Error) as e:
        kvbroker.Client(str(tmp_path / "none.sock"), timeout_ms=1000)
    assert e.value.errno == errno.ENOENT and e.value.call == "kvb_attach"
    # a path that is no socket
    p = tmp_path / "file"
    p.write_text("x")
    with pytest.raises(kvbroker.Error) as e:
        kvbroker.Client(str(p), timeout_ms=1000)
    assert e.value.errno in (errno.ECONNREFUSED, errno.ENOTSOCK)
    with pytest.raises(kvbroker.Error) as e:
        kvbroker.Client("/tmp/" + "x" * 200, timeout_ms=1000)
    assert e.value.errno == errno.ENAMETOOLONG


def test_bad_attach_args(broker):
    with pytest.raises(ValueError):
        kvbroker.Client(broker.sock, role="X")
    with pytest.raises(kvbroker.Error) as e:
        kvbroker.Client(broker.sock, tp_rank=2, tp_size=2)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(kvbroker.Error) as e:
        kvbroker.Client(broker.sock, sq_entries=3)  # not a power of two
    assert e.value.errno == errno.EINVAL
    assert broker.stats()["workers"] == 0


def test_max_workers(broker_factory):
    b = broker_factory("--max-workers", "1")
    with kvbroker.Client(b.sock) as c:
        with pytest.raises(kvbroker.Error) as e:
            kvbroker.Client(b.sock, tp_rank=1, tp_size=2, timeout_ms=2000)
        assert e.value.errno == errno.ECONNREFUSED
        with pytest.raises(kvbroker.Error) as e:  # the same identity
            kvbroker.Client(b.sock, timeout_ms=2000)
        assert e.value.errno in (errno.ECONNREFUSED, errno.EADDRINUSE)
        assert c.stats()["workers"] == 1  # its own socket: still answers


def test_closed_client(broker):
    c = kvbroker.Client(broker.sock)
    r = c.alloc(4096)
    h = c.open("tx-closed")
    c.close()
    calls = [
        lambda: c.alloc(4096), lambda: c.open("x"), lambda: c.open_batch(["x"]),
        lambda: c.submit_write([Desc(transfer=h, len=1)]), lambda: c.submit_read([Desc(len=1)]),
        lambda: c.submit_layer(h, 0), lambda: c.seal(h, 1), lambda: c.abort(h),
        lambda: c.poll(), lambda: c.wait(timeout_ms=10), lambda: c.wait_min(1, 4, 10),
        lambda: c.stats(), lambda: c.lookup("P", 0, 0, 1), lambda: c.peer_connect("127.0.0.1", 1),
        lambda: c.set_kv(1, 0, KVGeometry("kv_first", 1, 1, 1, 1, 2)),
        lambda: c.open_remote("x", 1, blocks=[1]), lambda: c.register_gpu(0x1000, 1, 0),
        lambda: c.register_fd(0, 4096, map=False),
    ]
    for call in calls:
        with pytest.raises(kvbroker.Error) as e:
            call()
        assert e.value.errno == errno.EBADF, e.value
    assert r.freed
    r.free()  # no error: already given back


def test_bad_arguments(client):
    with pytest.raises(kvbroker.Error) as e:
        client.alloc(0)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(kvbroker.Error) as e:
        client.alloc(4096, flags=0x80)
    assert e.value.errno == errno.EINVAL
    for bad in ("", "x" * 256, "a\0b"):
        with pytest.raises(ValueError):
            client.open(bad)
        with pytest.raises(ValueError):
            client.open_batch(["ok", bad])
    with pytest.raises(TypeError):
        client.submit_write([("not", "numbers")])
    with pytest.raises(ValueError):
        client.poll(0)
    with pytest.raises(ValueError):
        client.wait_min(5, 4)
    with pytest.raises(ValueError):
        client.open_remote("tx", 1, mode="sideways", blocks=[1])
    with pytest.raises(kvbroker.Error) as e:
        client.peer_connect("127.0.0.1", 0)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(kvbroker.Error) as e:
        client.lookup("D", 0, 0, 12345)
    assert e.value.errno == errno.ENOENT and e.value.call == "kvb_mem_lookup"


def test_register_fd_errors(client):
    # a memfd that cannot be sealed: the broker refuses it (EPERM)
    fd = os.memfd_create("nosealing", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 8192)
        with pytest.raises(kvbroker.Error) as e:
            client.register_fd(fd, 4096, map=False)
        assert e.value.errno == errno.EPERM
    finally:
        os.close(fd)
    fd = os.memfd_create("short", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 4096)
        with pytest.raises(kvbroker.Error) as e:  # past the end of the file
            client.register_fd(fd, 8192, map=False)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(kvbroker.Error) as e:  # mapping past the end too
            client.register_fd(fd, 4096, offset=4096)
        assert e.value.call == "kvb_mem_register_fd"
    finally:
        os.close(fd)
    assert client.stats()["regions"] == 0


def test_bad_geometry(client):
    g = KVGeometry("kv_first", num_blocks=8, block_size=16, num_heads=1, head_dim=64, elem_size=2)
    small = client.alloc(4096)
    with pytest.raises(kvbroker.Error) as e:  # the tensor does not fit
        client.set_kv(small, 0, g)
    assert e.value.errno == errno.EINVAL and e.value.call == "kvb_mem_set_kv"
    r = client.alloc(g.nbytes)
    with pytest.raises(ValueError):
        client.set_kv(r, 0, KVGeometry("sideways", 8, 16, 1, 64, 2))
    with pytest.raises(ValueError):
        client.set_kv(r, 0, KVGeometry(7, 8, 16, 1, 64, 2))
    with pytest.raises(kvbroker.Error) as e:  # unknown region
        client.set_kv(0xFFFF, 0, g)
    assert e.value.errno == errno.ENOENT
    client.set_kv(r, 0, g)
    r2 = client.alloc(g.nbytes)
    with pytest.raises(kvbroker.Error) as e:  # layer declared twice
        client.set_kv(r2, 0, g)
    assert e.value.errno == errno.EEXIST


def test_refused_descriptors(client, broker):
    a = client.alloc(SIZE)
    b = client.alloc(SIZE)
    h = client.open("tx-bad")
    d = [
        Desc(transfer=h, region=0x7777, peer_region=b.id, len=16, tag=1),  # unknown region
        Desc(transfer=h, region=a.id, peer_region=b.id, offset=SIZE, len=16, tag=2),  # out of bounds
        Desc(transfer=h, region=a.id, peer_region=a.id, len=64, peer_offset=32, tag=3),  # overlap
        Desc(transfer=h, region=a.id, peer_region=b.id, len=16, tag=4),  # fine
    ]
    assert client.submit_write(d) == 4
    got = {c.tag: c for c in client.wait_min(4, 8, timeout_ms=5000)}
    assert got[1].status == -errno.EINVAL and got[1].error.errno == errno.EINVAL
    assert got[2].status == -errno.EFAULT and not got[2].ok
    assert got[3].status in (-errno.EINVAL, -errno.EFAULT)
    assert got[4].ok and got[4].bytes == 16
    assert broker.stats()["descriptors_refused"] == 3
    # the worker keeps working
    h2 = client.open("tx-after")
    assert client.submit_write([Desc(transfer=h2, region=a.id, peer_region=b.id, len=8, tag=9)]) == 1
    assert client.wait(timeout_ms=5000)[0].ok


def test_full_ring(broker):
    # 2 submission slots, 4 completion slots, nothing reaped: the broker
    # stops taking descriptors once it cannot complete them, and the ring
    # stays full
    with kvbroker.Client(broker.sock, sq_entries=2, cq_entries=4) as c:
        a = c.alloc(SIZE)
        b = c.alloc(SIZE)
        h = c.open("tx-full")
        d = Desc(transfer=h, region=a.id, peer_region=b.id, len=64)
        queued = sealed = 0
        full_seen = seal_refused = False
        t0 = time.monotonic()
        while not (full_seen and seal_refused) and time.monotonic() - t0 < 10:
            n = c.submit_write([d._replace(tag=queued + i) for i in range(8)])
            assert 0 <= n <= 2
            queued += n
            if n == 0:
                full_seen = True
                probe = c.open(f"tx-probe-{sealed}")
                try:
                    c.seal(probe, 0, tag=1000 + sealed)  # completes at once
                    sealed += 1  # the broker made room in between
                except kvbroker.RingFull as e:
                    assert e.errno == errno.EAGAIN and e.call == "kvb_transfer_seal"
                    seal_refused = True
        assert full_seen and seal_refused
        # everything queued completes once reaped
        descs = transfers = 0
        t0 = time.monotonic()
        while (descs < queued or transfers < sealed) and time.monotonic() - t0 < 10:
            for x in c.wait(16, timeout_ms=500):
                assert x.ok, x
                descs += x.kind == CompKind.DESC
                transfers += x.kind == CompKind.TRANSFER
        assert (descs, transfers) == (queued, sealed)


def test_broker_killed(broker):
    c = kvbroker.Client(broker.sock, timeout_ms=3000)
    a = c.alloc(SIZE)
    b = c.alloc(SIZE)
    h = c.open("tx-dead")
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait()
    t0 = time.monotonic()
    # control calls: EPIPE at once
    with pytest.raises(kvbroker.BrokerGone) as e:
        c.open("tx-after-death")
    assert e.value.errno == errno.EPIPE
    with pytest.raises(kvbroker.BrokerGone):
        c.stats()
    # wait (unbounded too) sees the hang-up, no hang
    with pytest.raises(kvbroker.BrokerGone):
        c.wait(timeout_ms=None)
    with pytest.raises(kvbroker.BrokerGone):
        c.poll()
    # submissions: EPIPE once a call has seen it (within the ring's room)
    with pytest.raises(kvbroker.BrokerGone):
        for _ in range(10000):
            c.submit_write([Desc(transfer=h, region=a.id, peer_region=b.id, len=8)])
    assert time.monotonic() - t0 < 3.0
    c.close()  # no error, no hang
    assert c.closed


def test_broker_stopped_shutdown(broker):
    c = kvbroker.Client(broker.sock)
    assert broker.stop() == 0
    got = []
    t0 = time.monotonic()
    with pytest.raises(kvbroker.BrokerGone):
        while time.monotonic() - t0 < 5:
            got += c.wait(timeout_ms=500)
    # a SHUTDOWN completion came first, when the broker said goodbye
    assert all(x.kind == CompKind.SHUTDOWN for x in got)
    c.close()


def test_nothing_leaked(broker):
    np = pytest.importorskip("numpy")
    # warm up whatever the binding caches process-wide (library, numpy)
    with kvbroker.Client(broker.sock) as c:
        c.alloc(4096).as_numpy(np.uint8)[0] = 1
    before = fd_count()
    maps_before = len(open("/proc/self/maps").readlines())
    for _ in range(5):
        with kvbroker.Client(broker.sock) as c:
            rs = [c.alloc(SIZE, key=i) for i in range(4)]
            rs[0].as_numpy(np.uint8)[:4] = 1
            rs[1].free()
            h = c.open("tx-leak")
            c.submit_write([Desc(transfer=h, region=rs[0].id, peer_region=rs[2].id, len=64, tag=1)])
            c.seal(h, 1, tag=2)
            assert len(c.wait_min(2, 4, timeout_ms=5000)) == 2
            assert c.stats()["regions"] == 3
        del rs
    assert fd_count() == before
    # every ring and region mapping went too (allow a stray allocator arena)
    assert len(open("/proc/self/maps").readlines()) <= maps_before + 2
    assert broker.wait_stat("workers", 0) == 0
    assert broker.wait_stat("regions", 0) == 0


def test_alloc_too_large(client):
    before = fd_count()
    with pytest.raises(kvbroker.Error) as e:  # beyond what a file can hold
        client.alloc(1 << 63)
    assert e.value.call == "kvb_mem_alloc" and e.value.errno in (errno.EFBIG, errno.EINVAL, errno.ENOMEM)
    assert fd_count() == before
    assert client.stats()["regions"] == 0
