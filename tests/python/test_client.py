# SPDX-License-Identifier: MIT
"""kvbroker.Client against a real broker: every call doing its work
(attach, memory, lookup, KV geometry, transfers, submission, completion,
stats), with the bytes checked. Error paths: test_errors.py."""
import errno
import os
import threading
import time

import pytest

import kvbroker
from kvbroker import CompKind, Desc, KVGeometry

SIZE = 1 << 20


def pattern(n, seed):
    """n bytes of a pattern that differs per seed and per position."""
    return bytes(((i * 131) ^ (i >> 8) ^ seed) & 0xFF for i in range(n))


def test_attach_close(broker):
    c = kvbroker.Client(broker.sock, role="D", dp_rank=1, tp_rank=1, tp_size=2)
    assert not c.closed
    assert c.worker_id != 0
    assert c.role is kvbroker.Role.D
    assert c.socket == broker.sock
    assert f"worker {c.worker_id:#x}" in repr(c)
    assert broker.stats()["workers"] == 1
    c.close()
    assert c.closed
    c.close()  # idempotent
    assert broker.wait_stat("workers", 0) == 0


def test_context_manager(broker):
    with kvbroker.Client(broker.sock) as c:
        assert not c.closed
        r = c.alloc(4096)
        assert not r.freed
    assert c.closed
    assert r.freed  # close() frees every region
    assert broker.wait_stat("regions", 0) == 0


def test_default_socket(broker, monkeypatch):
    monkeypatch.setenv("KVB_SOCKET", broker.sock)
    assert kvbroker.default_socket() == broker.sock
    with kvbroker.Client() as c:  # socket=None: $KVB_SOCKET
        assert c.socket == broker.sock


def test_del_detaches(broker):
    c = kvbroker.Client(broker.sock)
    c.alloc(4096)
    assert broker.stats()["workers"] == 1
    del c
    assert broker.wait_stat("workers", 0) == 0
    assert broker.wait_stat("regions", 0) == 0


def test_alloc_buffer(client, broker):
    r = client.alloc(SIZE, flags=kvbroker.MEM_REMOTE_WRITE, key=42)
    assert r.size == SIZE and r.key == 42 and not r.gpu
    assert r.flags == kvbroker.MEM_REMOTE_WRITE
    assert r.addr and r.addr % 4096 == 0
    b = r.buffer
    assert len(b) == SIZE and not b.readonly
    b[:5] = b"hello"
    assert bytes(r.buffer[:5]) == b"hello"
    assert r in client.regions()
    assert broker.stats()["regions"] == 1
    del b
    r.free()
    assert r.freed
    r.free()  # idempotent
    assert r not in client.regions()
    assert broker.stats()["regions"] == 0
    with pytest.raises(ValueError):
        r.buffer


def test_as_numpy(client):
    np = pytest.importorskip("numpy")
    r = client.alloc(SIZE)
    a = r.as_numpy(np.float32, (256, 1024))
    assert a.shape == (256, 1024) and a.dtype == np.float32
    a[3, :] = 1.5
    b = r.as_numpy(np.float32, 1024, offset=3 * 4096)
    assert (b == 1.5).all()
    assert r.as_numpy().nbytes == SIZE  # shape None: the whole region
    # zero-copy: the array's memory is the region's
    assert a.__array_interface__["data"][0] == r.addr


def test_as_torch(client):
    torch = pytest.importorskip("torch")
    r = client.alloc(SIZE)
    t = r.as_torch(torch.bfloat16, (2, 16, 16, 8, 128))
    assert t.shape == (2, 16, 16, 8, 128) and t.dtype == torch.bfloat16
    assert t.data_ptr() == r.addr
    t[1, 3].fill_(2.0)
    u = r.as_torch(torch.bfloat16, (16, 8, 128), offset=(16 + 3) * 16 * 8 * 128 * 2)
    assert bool((u == 2.0).all())
    # region_for maps a tensor's data_ptr back to its region
    sub = t[1, 3]
    got = client.region_for(sub.data_ptr(), sub.numel() * sub.element_size())
    assert got is r
    assert r.offset_of(sub.data_ptr()) == (16 + 3) * 16 * 8 * 128 * 2


def test_views_keep_mapping_after_free(client, broker):
    np = pytest.importorskip("numpy")
    r = client.alloc(SIZE)
    a = r.as_numpy(np.uint8)
    a[:4] = [1, 2, 3, 4]
    r.free()  # the broker lets go; our view still reads mapped memory
    assert broker.stats()["regions"] == 0
    assert list(a[:4]) == [1, 2, 3, 4]
    a[5] = 9  # and writes it (no crash: the mapping lives while a does)


def test_region_for(client):
    a = client.alloc(SIZE, key=1)
    b = client.alloc(SIZE, key=2)
    assert client.region_for(a.addr) is a
    assert client.region_for(b.addr + SIZE - 8, 8) is b
    assert client.region_for(a.addr + SIZE - 8, 16) is None or a.addr + SIZE == b.addr
    assert client.region_for(a.addr - 1) in (None, b)
    assert client.region_for(0x10) is None
    a.free()
    assert client.region_for(a.addr) is None


def test_register_fd(client, broker):
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 3 * 4096)
        os.pwrite(fd, b"xyz", 4096)
        r = client.register_fd(fd, 8192, offset=4096, key=5)
        assert r.size == 8192 and r.key == 5
        assert bytes(r.buffer[:3]) == b"xyz"  # mapped at the offset
        r2 = client.register_fd(fd, 4096, map=False)
        assert r2.addr is None
        with pytest.raises(ValueError):
            r2.buffer
        assert broker.stats()["regions"] == 2
        r.free()
        r2.free()
    finally:
        os.close(fd)


def test_lookup(broker):
    with kvbroker.Client(broker.sock, role="D", dp_rank=0, tp_rank=1, tp_size=2) as d, \
            kvbroker.Client(broker.sock, role="P") as p:
        r = d.alloc(SIZE, flags=kvbroker.MEM_REMOTE_WRITE | kvbroker.MEM_REMOTE_READ, key=77)
        rr = p.lookup("D", 0, 1, 77)
        assert isinstance(rr, kvbroker.RemoteRegion)
        assert (rr.id, rr.size) == (r.id, SIZE)
        assert rr.flags == r.flags
        assert p.lookup(kvbroker.Role.D, 0, 1, 77) == rr


def test_set_kv(client):
    g = KVGeometry("kv_first", num_blocks=8, block_size=16, num_heads=1, head_dim=64, elem_size=2)
    r = client.alloc(g.nbytes)
    client.set_kv(r, 0, g)
    g2 = KVGeometry(kvbroker.KV_BLOCK_FIRST, 8, 16, 1, 64, 2)
    r2 = client.alloc(g2.nbytes)
    client.set_kv(r2.id, 1, g2)  # a region id does too


def test_write_and_read(broker):
    with kvbroker.Client(broker.sock, role="D") as d, kvbroker.Client(broker.sock) as p:
        dst = d.alloc(SIZE, flags=kvbroker.MEM_REMOTE_WRITE | kvbroker.MEM_REMOTE_READ, key=9)
        src = p.alloc(SIZE)
        back = p.alloc(SIZE)
        data = pattern(SIZE, 3)
        src.buffer[:] = data
        peer = p.lookup("D", 0, 0, 9)
        h = p.open("tx-wr")
        half = SIZE // 2
        # Desc, a plain tuple in Desc's order
        n = p.submit_write([
            Desc(transfer=h, region=src.id, peer_region=peer.id, len=half, tag=1),
            (h, 0, 0, src.id, peer.id, half, half, half, 2, 0),
        ])
        assert n == 2
        p.seal(h, 2, tag=3)
        got = p.wait_min(3, timeout_ms=10000)
        assert sorted((c.kind, c.tag) for c in got) == [
            (CompKind.DESC, 1), (CompKind.DESC, 2), (CompKind.TRANSFER, 3)]
        assert all(c.ok and c.error is None and c.transfer == h for c in got)
        assert sum(c.bytes for c in got if c.kind == CompKind.DESC) == SIZE
        assert bytes(dst.buffer) == data
        # READ: the peer's region into ours, through a reused desc_array
        h2 = p.open("tx-rd")
        arr = p.desc_array(4)
        arr[0] = Desc(transfer=h2, region=back.id, peer_region=peer.id, len=SIZE, tag=4)
        assert p.submit_read(arr, 1) == 1
        p.seal(h2, 1, tag=5)
        got = p.wait_min(2, timeout_ms=10000)
        assert {c.tag for c in got} == {4, 5} and all(c.ok for c in got)
        assert bytes(back.buffer) == data


def test_unsignaled(client):
    a = client.alloc(SIZE)
    b = client.alloc(SIZE)
    a.buffer[:] = pattern(SIZE, 11)
    h = client.open("tx-unsig")
    d = [Desc(transfer=h, flags=kvbroker.DESC_UNSIGNALED, region=a.id, peer_region=b.id,
              offset=i * 4096, peer_offset=i * 4096, len=4096, tag=100 + i) for i in range(8)]
    assert client.submit_write(d) == 8
    client.seal(h, 8, tag=7)
    got = client.wait(timeout_ms=10000)
    assert [(c.kind, c.tag) for c in got] == [(CompKind.TRANSFER, 7)]  # no DESC ones
    assert bytes(b.buffer[:8 * 4096]) == bytes(a.buffer[:8 * 4096])


def test_open_and_batch(client):
    h = client.open("tx-a")
    assert h == client.open(b"tx-a")  # the same id: the same handle
    res = client.open_batch(["tx-a", "tx-b", "tx-c"])
    assert [r.ok for r in res] == [True] * 3
    assert res[0].handle == h and len({r.handle for r in res}) == 3
    # more than one batch's worth: split into round trips
    ids = [f"many-{i}" for i in range(kvbroker.TRANSFER_OPEN_BATCH_MAX * 2 + 5)]
    res = client.open_batch(ids)
    assert len(res) == len(ids) and all(r.ok for r in res)
    assert len({r.handle for r in res}) == len(ids)
    assert client.open_batch([]) == []


def test_open_batch_per_id_status(client):
    h = client.open("tx-ended")
    client.abort(h, tag=1)
    (c,) = client.wait(timeout_ms=5000)
    assert c.kind == CompKind.TRANSFER and c.status == -errno.ECANCELED
    assert isinstance(c.error, kvbroker.Error) and c.error.errno == errno.ECANCELED
    res = client.open_batch(["tx-fresh", "tx-ended", "tx-fresh2"])
    assert [r.status for r in res] == [0, -errno.ESTALE, 0]
    assert res[1].handle == 0 and res[1].error.errno == errno.ESTALE
    with pytest.raises(kvbroker.Error) as e:
        client.open("tx-ended")
    assert e.value.errno == errno.ESTALE and e.value.call == "kvb_transfer_open"


def test_set_timeouts(client):
    # a 300 ms deadline ends a transfer nothing happens to (docs/deadlines.md)
    h = client.open("tx-deadline")
    t0 = time.monotonic()
    client.set_timeouts(h, deadline_ms=300)
    client.seal(h, 1, tag=5)
    (c,) = client.wait(timeout_ms=5000)
    assert c.tag == 5 and c.status == -errno.ETIMEDOUT
    assert 0.29 <= time.monotonic() - t0 < 0.3 + 2.0
    with pytest.raises(kvbroker.Error) as e:
        client.set_timeouts(h, deadline_ms=300)
    assert e.value.errno == errno.ESTALE
    h = client.open("tx-defer")
    with pytest.raises(kvbroker.Error) as e:  # no defer clock on one node
        client.set_timeouts(h, defer_ms=1000)
    assert e.value.errno == errno.EINVAL
    client.abort(h, tag=6)
    (c,) = client.wait(timeout_ms=5000)
    assert c.tag == 6 and c.status == -errno.ECANCELED


def test_poll_and_wait_timeouts(client):
    assert client.poll() == []
    t0 = time.monotonic()
    assert client.wait(timeout_ms=150) == []
    dt = time.monotonic() - t0
    assert 0.14 <= dt < 0.15 + 2.0
    t0 = time.monotonic()
    assert client.wait_min(2, 8, timeout_ms=0) == []
    assert time.monotonic() - t0 < 2.0
    h = client.open("tx-poll")
    client.abort(h, tag=9)
    t0 = time.monotonic()
    while not (got := client.poll(1)):
        assert time.monotonic() - t0 < 5
    assert got[0].tag == 9


def test_wait_min_returns_what_it_has(client):
    h = client.open("tx-wm")
    client.abort(h, tag=1)
    t0 = time.monotonic()
    got = client.wait_min(3, 8, timeout_ms=300)  # only one will come
    assert [c.tag for c in got] == [1]
    assert time.monotonic() - t0 >= 0.29


@pytest.mark.parametrize("forever", [None, -1])
def test_wait_unbounded_ends_on_completion(client, forever):
    h = client.open("tx-unb")
    out = []
    th = threading.Thread(target=lambda: out.append(client.wait(timeout_ms=forever)))
    th.start()
    time.sleep(0.3)
    assert th.is_alive()  # nothing yet
    client.abort(h, tag=5)
    th.join(5)
    assert not th.is_alive() and out[0][0].tag == 5


def test_close_ends_a_waiting_thread(broker):
    c = kvbroker.Client(broker.sock)
    out = []

    def waiter():
        try:
            out.append(c.wait(timeout_ms=None))
        except kvbroker.Error as e:
            out.append(e)

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    c.close()  # waits for the wait's slice to end, then detaches
    th.join(5)
    assert not th.is_alive()
    assert time.monotonic() - t0 < 2.0
    assert out == [[]]


def test_stats(client, broker):
    s = client.stats()
    assert s["workers"] == 1 and s["regions"] == 0
    client.alloc(4096)
    assert client.stats()["regions"] == 1
    text = client.stats_text()
    assert "workers" in text and not text.startswith("{")


def test_submit_layer_local_transfer(client):
    # a layer op on a same-node transfer: queued (1), refused in its completion
    h = client.open("tx-layer")
    assert client.submit_layer(h, 0, tag=42) == 1
    (c,) = client.wait(timeout_ms=5000)
    assert c.tag == 42 and c.kind == CompKind.DESC and c.status == -errno.EINVAL


def test_remote_without_host_ip(client):
    with pytest.raises(kvbroker.Error) as e:
        client.peer_connect("127.0.0.1", 16399)
    assert e.value.errno == errno.ENOTCONN and e.value.call == "kvb_peer_connect"
    with pytest.raises(kvbroker.Error) as e:
        client.open_remote("tx-r", peer=1, blocks=[0, 1])
    assert e.value.errno in (errno.ENOTCONN, errno.ENOENT)


def test_register_gpu(client):
    torch = None
    try:
        import torch
    except ImportError:
        pass
    if torch is not None and torch.cuda.is_available():
        t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        r = client.register_gpu(t, key=3)
        assert r.gpu and r.addr == t.data_ptr() and r.size == t.numel()
        assert client.region_for(t.data_ptr() + 100, 100) is r
        with pytest.raises(ValueError):
            r.buffer
        r.free()
    else:
        with pytest.raises(kvbroker.Error) as e:
            client.register_gpu(0x7F0000000000, 1 << 20, 0)
        assert e.value.errno in (errno.ENODEV, errno.EINVAL, errno.ENOENT)
        assert e.value.call == "kvb_mem_register_gpu"


def test_torch_view_keeps_mapping_after_free(client):
    torch = pytest.importorskip("torch")
    r = client.alloc(SIZE)
    t = r.as_torch(torch.int32, (SIZE // 4,))
    t[:3] = torch.tensor([5, 6, 7], dtype=torch.int32)
    r.free()
    client.close()
    assert t[:3].tolist() == [5, 6, 7]  # still mapped: no crash
    t[10] = 1


def test_ctrl_c_interrupts_unbounded_wait(broker):
    code = (
        "import kvbroker, sys, time\n"
        "c = kvbroker.Client(sys.argv[1])\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        "    print('waiting', flush=True)\n"
        "    c.wait(timeout_ms=None)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted after %.2f s' % (time.monotonic() - t0), flush=True)\n"
        "    c.close()\n"
        "    sys.exit(3)\n"
    )
    import subprocess
    import sys
    import signal
    p = subprocess.Popen([sys.executable, "-c", code, broker.sock], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "waiting"
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=10)
    assert p.returncode == 3, out
    assert time.monotonic() - t0 < 0.2 + 2.0
    assert "interrupted" in out


def test_fork_child_leaves_parent_attached(client, broker):
    r = client.alloc(4096)
    r.buffer[0] = 7
    pid = os.fork()
    if pid == 0:  # child: the context is the parent's; closing it is a no-op
        code = 1
        try:
            try:
                client.open("tx-child")
            except kvbroker.Error as e:
                if e.errno == errno.EBADF and "parent" in e.strerror:
                    code = 0
            client.close()
            assert r.buffer[0] == 7  # the inherited mapping still reads
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert client.open("tx-parent") > 0  # the parent is still attached
    assert broker.stats()["workers"] == 1


def test_submit_layers_local_transfers(client):
    # layer ops for three transfers in one call: each refused in its own
    # completion (same-node transfers), tags as given
    hs = [client.open(f"tx-layers-{i}") for i in range(3)]
    assert client.submit_layers(hs, [10, 11, 12], layer=0) == 3
    got = client.wait_min(3, 8, timeout_ms=5000)
    assert sorted(c.tag for c in got) == [10, 11, 12]
    assert all(c.kind == CompKind.DESC and c.status == -errno.EINVAL for c in got)
    h_arr, t_arr = client.layer_arrays(hs, [20, 21, 22])  # built once, reused
    assert client.submit_layers(h_arr, t_arr, layer=1) == 3
    assert sorted(c.tag for c in client.wait_min(3, 8, timeout_ms=5000)) == [20, 21, 22]
    assert client.submit_layers([], [], layer=0) == 0
    with pytest.raises(ValueError):
        client.submit_layers(hs, [1], layer=0)
    with pytest.raises(kvbroker.Error) as e:
        client.submit_layers(hs, [1, 2, 3], layer=0, flags=0x80)
    assert e.value.errno == errno.EINVAL and e.value.call == "kvb_submit_layers"


def test_fallbacks_without_newer_calls(client, monkeypatch):
    # a library older than kvb_submit_layers / kvb_wait_min / open_batch /
    # kvb_stats: the binding does the same with the older calls
    for name in ("kvb_submit_layers", "kvb_wait_min", "kvb_transfer_open_batch", "kvb_stats"):
        monkeypatch.setattr(client._lib, name, None)
    hs = [client.open(f"tx-old-{i}") for i in range(2)]
    assert client.submit_layers(hs, [1, 2], layer=0) == 2
    got = client.wait_min(2, 8, timeout_ms=5000)  # kvb_wait until 2 came
    assert sorted(c.tag for c in got) == [1, 2]
    h = client.open("tx-old-end")
    client.abort(h)
    client.wait(timeout_ms=5000)
    res = client.open_batch(["tx-old-0", "tx-old-end", "tx-old-new"])
    assert [r.status for r in res] == [0, -errno.ESTALE, 0] and res[0].handle == hs[0]
    with pytest.raises(kvbroker.Error) as e:
        client.stats()
    assert e.value.errno == errno.ENOSYS
