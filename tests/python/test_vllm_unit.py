# SPDX-License-Identifier: MIT
"""KVBrokerConnector piece by piece: geometry from shapes and strides,
kv_transfer_params and config checks, the scheduler half's bookkeeping (no
broker), and register_kv_caches against a local broker (what it accepts,
what it refuses and why)."""

from __future__ import annotations

import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_doubles as vd  # noqa: E402

from kvbroker.vllm import (  # noqa: E402
    HAVE_VLLM,
    KVBrokerConnector,
    KVBrokerMetadata,
    LayoutError,
    VLLM_INTERFACE,
)
from kvbroker.vllm._compat import KVConnectorRole  # noqa: E402
from kvbroker.vllm._layout import (  # noqa: E402
    BLOCK_FIRST, KV_FIRST, PACKED, derive, derive_view, view_layout)
from kvbroker.vllm._params import Config, ParamsError, parse_request  # noqa: E402

torch = pytest.importorskip("torch")


def dense(shape, order):
    """Strides of a dense tensor whose dims lie in memory in `order`."""
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return strides


# ------------------------------------------------------------ geometry


@pytest.mark.parametrize("shape,order,layout,hnd", [
    ((2, 10, 16, 4, 64), (0, 1, 2, 3, 4), KV_FIRST, False),  # FA, NHD
    ((2, 10, 16, 4, 64), (0, 1, 3, 2, 4), KV_FIRST, True),  # FA, HND
    ((10, 2, 16, 4, 64), (0, 1, 2, 3, 4), BLOCK_FIRST, False),  # FlashInfer
    ((10, 2, 16, 4, 64), (0, 1, 3, 2, 4), BLOCK_FIRST, True),
    ((2, 10, 16, 4, 64), (1, 0, 2, 3, 4), BLOCK_FIRST, False),  # stride order
    ((10, 2, 16, 4, 64), (1, 0, 3, 2, 4), KV_FIRST, True),
])
def test_layout_from_strides(shape, order, layout, hnd):
    lay = derive(shape, dense(shape, order), 2)
    assert (lay.layout, lay.hnd) == (layout, hnd)
    nb = shape[1] if shape[0] == 2 else shape[0]
    assert (lay.num_blocks, lay.block_size, lay.num_heads, lay.head_dim,
            lay.elem_size) == (nb, 16, 4, 64, 2)
    assert lay.nbytes == 2 * nb * 16 * 4 * 64 * 2


def test_layout_matches_torch_views():
    t = torch.zeros(2, 8, 4, 16, 32, dtype=torch.bfloat16)  # HND memory
    v = t.permute(0, 1, 3, 2, 4)  # vLLM's logical NHD view of it
    lay = derive(v.shape, v.stride(), v.element_size())
    assert lay.hnd and lay.layout == KV_FIRST and lay.block_size == 16
    one_head = torch.zeros(2, 8, 1, 16, 32).permute(0, 1, 3, 2, 4)
    lay = derive(one_head.shape, one_head.stride(), 4)
    assert lay.num_heads == 1  # a size-1 dim's stride does not matter


def test_layout_mla():
    """An MLA latent cache [num_blocks, block_size, latent]: one PACKED
    head of latent_dim elements."""
    lay = derive((10, 16, 576), dense((10, 16, 576), (0, 1, 2)), 2)
    assert (lay.layout, lay.num_blocks, lay.block_size, lay.num_heads,
            lay.head_dim, lay.form) == (PACKED, 10, 16, 1, 576, "MLA")
    assert lay.nbytes == 10 * 16 * 576 * 2


@pytest.mark.parametrize("shape,strides,why", [
    ((10, 16, 576), (16 * 640, 640, 1), "MLA shape"),  # padded latent
    ((32, 2, 10, 16, 4, 64), None, "cross-layer"),
    ((3, 10, 16, 4, 64), None, "no K/V dimension"),
    ((2, 10, 16, 4, 64), (10 * 16 * 4 * 128, 16 * 4 * 128, 4 * 128, 128, 1),
     "not dense"),  # padded heads
    ((2, 10, 16, 4, 64), (64, 2 * 64, 20 * 64, 320 * 64, 1), "not dense"),
])
def test_layout_refused(shape, strides, why):
    if strides is None:
        strides = dense(shape, tuple(range(len(shape))))
    with pytest.raises(LayoutError, match=why):
        derive(shape, strides, 2, "layer x")


# vLLM >= 0.29: the logical [L, B, H, N, C] under each KVCacheLayout's
# stride permutation (vllm/v1/kv_cache_layout.py), a layer's view [B, H, N, C]
VIEW_ORDERS = {"LBNHC": (0, 1, 3, 2, 4), "LBHNC": (0, 1, 2, 3, 4),
               "BLNHC": (1, 0, 3, 2, 4), "BLHNC": (1, 0, 2, 3, 4),
               "LHBNC": (0, 2, 1, 3, 4), "BHLNC": (1, 2, 0, 3, 4)}


def view_strides(shape5, layout):
    st, cur = [0] * 5, 1
    for d in reversed(VIEW_ORDERS[layout]):
        st[d] = cur
        cur *= shape5[d]
    return st[1:]


@pytest.mark.parametrize("layout,kbs,nhc,rows", [
    ("LBNHC", 16, True, 1), ("LBNHC", 8, True, 1), ("LBHNC", 16, False, 1),
    ("LBHNC", 4, False, 1), ("BLNHC", 16, True, 3), ("BLHNC", 16, False, 3)])
def test_views_to_packed(layout, kbs, nhc, rows):
    """A 4-D view: 10 blocks of 16 tokens, 4 heads, C = 2 x 64 (K and V
    packed), 3 layers; kernel blocks of kbs tokens (B = 10 x 16 / kbs)."""
    b = 10 * 16 // kbs
    shape5 = (3, b, 4, kbs, 128)
    v = derive_view(shape5[1:], view_strides(shape5, layout), 2, 16)
    assert (v.nhc, v.num_blocks, v.block_size, v.heads, v.cdim) == (
        nhc, 10, 16, 4, 128)
    assert v.block_stride == rows * v.page
    lay = view_layout(v, rows, layout)
    assert lay.layout == PACKED and lay.num_blocks == 10
    assert lay.nbytes == 10 * rows * 16 * 4 * 128 * 2  # the rows, whole
    assert lay.kv_heads == 4 and lay.hnd == (not nhc)
    assert (lay.num_heads, lay.block_size) == (
        (4, 16 * rows) if nhc else (1, 16 * rows))


@pytest.mark.parametrize("layout", ["LHBNC", "BHLNC"])
def test_views_heads_outside_blocks_refused(layout):
    shape5 = (3, 10, 4, 16, 128)
    with pytest.raises(LayoutError, match="VLLM_KV_CACHE_LAYOUT=LBNHC"):
        derive_view(shape5[1:], view_strides(shape5, layout), 2, 16, "l")


def test_views_bad_kernel_blocks_refused():
    shape5 = (3, 30, 4, 6, 128)  # 6 tokens per kernel block, blocks of 16
    with pytest.raises(LayoutError, match="do not divide"):
        derive_view(shape5[1:], view_strides(shape5, "LBNHC"), 2, 16)


# ------------------------------------------------------------ params


def test_config_defaults_and_errors():
    c = Config.parse({"host_ip": "10.0.0.1"})
    assert (c.handshake_port, c.notify_port, c.transfer_timeout_s) == \
        (6301, 61005, 90.0)
    for bad in ({"handshake_port": 0}, {"notify_port": "x"},
                {"transfer_timeout_s": "soon"}, {"broker_socket": 3},
                {"timeout_ms": True}):
        with pytest.raises(ParamsError):
            Config.parse(dict(bad, host_ip="10.0.0.1"))


GOOD_D = {"do_remote_prefill": True, "transfer_id": "tx-1",
          "remote_host": "192.0.2.1", "remote_handshake_port": 6301,
          "remote_tp_size": 2, "remote_dp_rank": 0}


@pytest.mark.parametrize("change,key", [
    ({"transfer_id": None}, "transfer_id"),
    ({"transfer_id": "x" * 256}, "transfer_id"),
    ({"transfer_id": "a\nb"}, "transfer_id"),
    ({"remote_host": 12}, "remote_host"),
    ({"remote_handshake_port": "p"}, "remote_handshake_port"),
    ({"remote_handshake_port": 70000}, "remote_handshake_port"),
    ({"remote_tp_size": -1}, "remote_tp_size"),
    ({"remote_dp_rank": 1.5}, "remote_dp_rank"),
])
def test_params_refused(change, key):
    p = dict(GOOD_D, **change)
    if change.get(key, 0) is None:
        del p[key]
    with pytest.raises(ParamsError, match=key):
        parse_request(p, "r", producer=False)
    with pytest.raises(ParamsError):
        parse_request("not a dict", "r", producer=False)


def test_params_good():
    m = parse_request(GOOD_D, "r1", producer=False)
    assert (m.transfer_id, m.host, m.port, m.remote_tp_size) == \
        ("tx-1", "192.0.2.1", 6301, 2)
    m = parse_request({"transfer_id": "t", "remote_host": "h",
                       "remote_handshake_port": "6301", "tp_size": 4},
                      "r", producer=True)
    assert m.port == 6301 and m.remote_tp_size == 4


# ------------------------------------------------------------ scheduler


def sched(role, **extra):
    cfg = vd.make_config(role, dict({"host_ip": "192.0.2.1"}, **extra),
                         tp_size=2)
    return KVBrokerConnector(cfg, KVConnectorRole.SCHEDULER, None)


def test_interface_and_refused_roles():
    assert "003df29" in VLLM_INTERFACE and not HAVE_VLLM
    assert KVBrokerConnector.requires_piecewise_for_cudagraph({}) is False
    assert KVBrokerConnector.get_required_kvcache_layout(None) == "NHD"
    with pytest.raises(ValueError, match="kv_both"):
        sched("kv_both")
    with pytest.raises(ValueError, match="handshake_port"):
        sched("kv_producer", handshake_port="x")
    # MoRIIO's two modes; anything else is refused, not run as WRITE
    assert sched("kv_consumer", mode="read")._cfg.read is True
    assert sched("kv_consumer", mode="WRITE")._cfg.read is False
    for bad in ("pull", 1, None):
        with pytest.raises(ValueError, match="mode"):
            sched("kv_consumer", mode=bad)
    for bad in (0, "60", True):
        with pytest.raises(ValueError, match="read_lease_s"):
            sched("kv_producer", mode="read", read_lease_s=bad)
    assert sched("kv_consumer", mode="WRITE")._producer is False
    for role in ("kv_producer", "kv_consumer"):
        cfg = vd.make_config(role, {"host_ip": "192.0.2.1"}, tp_size=2)
        cfg.parallel_config.pipeline_parallel_size = 2
        for r in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
            with pytest.raises(ValueError, match="pipeline parallelism"):
                KVBrokerConnector(cfg, r, None)


def test_producer_saves_on_last_chunk_and_returns_params():
    c = sched("kv_producer")
    r = vd.Request("a", 40, {"do_remote_decode": True, "transfer_id": "tx-a",
                             "remote_host": "192.0.2.2",
                             "remote_handshake_port": 6301})
    assert c.get_num_new_matched_tokens(r, 0) == (0, False)
    c.update_state_after_alloc(r, vd.KVCacheBlocks([7, 3]), 0)
    # first chunk: 32 of 40 tokens, nothing to save yet
    m = c.build_connector_meta(vd.SchedulerOutput({"a": 32}))
    assert isinstance(m, KVBrokerMetadata) and not m.reqs_to_save
    r.num_computed_tokens = 32
    so = vd.SchedulerOutput({"a": 8}, vd.CachedRequestData(["a"], [([9],)]))
    m = c.build_connector_meta(so)
    assert [(x.req_id, x.transfer_id, x.block_ids) for x in m.reqs_to_save] \
        == [("a", "tx-a", [7, 3, 9])]
    assert c.has_pending_push_work()
    r.status = vd.RequestStatus.FINISHED_LENGTH_CAPPED
    delay, p = c.request_finished(r, [7, 3, 9])
    assert delay is True
    assert p["do_remote_prefill"] and not p["do_remote_decode"]
    assert p["remote_block_ids"] == [7, 3, 9] and p["transfer_id"] == "tx-a"
    assert (p["remote_host"], p["remote_handshake_port"],
            p["remote_notify_port"], p["remote_tp_size"],
            p["remote_dp_size"]) == ("192.0.2.1", 6301, 61005, 2, 1)
    # nothing to abort for a request that finished normally
    assert not c.build_connector_meta(vd.SchedulerOutput()).reqs_to_abort
    c.update_connector_output(vd.KVConnectorOutput(finished_sending={"a"}))
    assert not c.has_pending_push_work()


def test_producer_abort_and_unsaved():
    c = sched("kv_producer")
    params = {"do_remote_decode": True, "transfer_id": "t",
              "remote_host": "h", "remote_handshake_port": 1}
    r = vd.Request("a", 16, dict(params))
    c.update_state_after_alloc(r, vd.KVCacheBlocks([1]), 0)
    c.build_connector_meta(vd.SchedulerOutput({"a": 16}))
    r.status = vd.RequestStatus.FINISHED_ABORTED
    assert c.request_finished(r, [1])[0] is True
    assert c.build_connector_meta(vd.SchedulerOutput()).reqs_to_abort == ["a"]
    # finished before its last chunk ran: nothing in flight, free now
    r2 = vd.Request("b", 64, dict(params))
    c.update_state_after_alloc(r2, vd.KVCacheBlocks([2, 3, 4, 5]), 0)
    assert c.request_finished(r2, [2, 3, 4, 5]) == (False, None)
    # no params, or bad ones: computed, not sent, counted
    assert c.request_finished(vd.Request("c", 5), [6]) == (False, None)
    bad = vd.Request("d", 5, {"do_remote_decode": True})
    c.update_state_after_alloc(bad, vd.KVCacheBlocks([6]), 0)
    assert c.connector_stats()["bad_params"] == 1
    assert not c.build_connector_meta(
        vd.SchedulerOutput({"d": 5})).reqs_to_save


def test_consumer_loads_prompt_once():
    c = sched("kv_consumer")
    r = vd.Request("a", 33, dict(GOOD_D))
    assert c.get_num_new_matched_tokens(r, 0) == (33, True)
    assert c.get_num_new_matched_tokens(r, 16) == (17, True)
    c.update_state_after_alloc(r, vd.KVCacheBlocks([4, 5, 6, 8]), 33)
    m = c.build_connector_meta(vd.SchedulerOutput())
    assert [(x.transfer_id, x.block_ids, x.remote_tp_size)
            for x in m.reqs_to_load] == [("tx-1", [4, 5, 6], 2)]
    # one transfer per request: vLLM asks again after the load
    assert c.get_num_new_matched_tokens(r, 33) == (0, False)
    assert not c.build_connector_meta(vd.SchedulerOutput()).reqs_to_load
    c.update_connector_output(vd.KVConnectorOutput(finished_recving={"a"}))
    assert c.request_finished(r, [4, 5, 6, 8]) == (False, None)


def test_consumer_bad_params_and_abort():
    c = sched("kv_consumer")
    bad = vd.Request("b", 20, dict(GOOD_D, remote_handshake_port="x"))
    assert c.get_num_new_matched_tokens(bad, 0) == (0, False)
    assert c.get_num_new_matched_tokens(bad, 0) == (0, False)
    assert c.connector_stats()["bad_params"] == 1  # once per request
    r = vd.Request("a", 16, dict(GOOD_D))
    c.get_num_new_matched_tokens(r, 0)
    c.update_state_after_alloc(r, vd.KVCacheBlocks([1]), 16)
    r.status = vd.RequestStatus.FINISHED_ABORTED
    # dropped before its load went out: it still goes (P is not left
    # waiting) and is aborted; vLLM itself holds the blocks of a request
    # dropped in WAITING_FOR_REMOTE_KVS until the workers report it in
    # finished_recving, so the connector asks for no delay
    assert c.request_finished(r, [1]) == (False, None)
    m = c.build_connector_meta(vd.SchedulerOutput())
    assert [x.req_id for x in m.reqs_to_load] == ["a"]
    assert m.reqs_to_abort == ["a"]


# ------------------------------------------------------------ worker


def worker(broker, role="kv_consumer", **extra):
    cfg = vd.make_config(role, dict({"broker_socket": broker.sock,
                                     "host_ip": "127.0.0.1"}, **extra))
    return KVBrokerConnector(cfg, KVConnectorRole.WORKER, None)


def test_register_kv_caches(broker):
    import kvbroker

    c = worker(broker)
    cl = c.broker_client
    flags = kvbroker.MEM_REMOTE_WRITE | kvbroker.MEM_REMOTE_READ
    caches = {}
    for i in (1, 0):  # out of order: layers are numbered by name
        r = cl.alloc(2 * 8 * 16 * 2 * 32 * 2, flags, i)
        t = r.as_torch(torch.float16, (2, 8, 2, 16, 32))
        caches["model.layers.%d.self_attn.attn" % i] = t.permute(0, 1, 3, 2, 4)
    c.register_kv_caches(caches)
    w = c._worker
    assert w.layer_of == {"model.layers.0.self_attn.attn": 0,
                          "model.layers.1.self_attn.attn": 1}
    assert w.hnd and w.local_heads == 2
    c.shutdown()


def test_register_refuses_what_the_broker_cannot_reach(broker):
    c = worker(broker)
    with pytest.raises(LayoutError, match="not memory the broker maps"):
        c.register_kv_caches({"l.0": torch.zeros(2, 4, 16, 2, 32)})
    r = c.broker_client.alloc(1 << 20)
    # a layer 128 bytes into a region gets a region of its own (an alias)
    t = r.as_torch(torch.int16, 2 * 4 * 16 * 2 * 32 + 64)
    inner = t[64:].view(2, 4, 16, 2, 32)
    c.register_kv_caches({"l.0": inner})
    (reg,) = c._worker.regions
    assert reg.addr == r.addr + 128 and reg.size == 2 * 4 * 16 * 2 * 32 * 2
    c.shutdown()


def test_worker_fails_open_without_host_ip(broker):
    """A broker without --host-ip cannot reach peers: the load fails with
    its blocks reported as load errors, at once, not at a timeout."""
    import kvbroker

    c = worker(broker)
    r = c.broker_client.alloc(2 * 4 * 16 * 2 * 32 * 2,
                              kvbroker.MEM_REMOTE_WRITE)
    c.register_kv_caches({"l.0": r.as_torch(torch.int16, (2, 4, 16, 2, 32))})
    s = sched("kv_consumer")
    req = vd.Request("a", 20, dict(GOOD_D))
    s.get_num_new_matched_tokens(req, 0)
    s.update_state_after_alloc(req, vd.KVCacheBlocks([2, 3]), 20)
    c.bind_connector_metadata(s.build_connector_meta(vd.SchedulerOutput()))
    c.start_load_kv(None)
    c.wait_for_save()
    assert c.get_finished(set()) == (None, {"a"})
    assert c.get_block_ids_with_load_errors() == {2, 3}
    assert c.get_block_ids_with_load_errors() == set()
    c.clear_connector_metadata()
    assert c.connector_stats()["open_errors"] == 1
    c.shutdown()


def test_broker_death_ends_everything(broker_factory):
    """The broker dies with a P transfer in flight (never announced by a
    D): the worker reports it finished at its next get_finished."""
    import kvbroker

    peer = broker_factory("--host-ip", "127.0.0.1", "--handshake-port",
                          "16391", "--notify-port", "16400")
    b = broker_factory("--host-ip", "127.0.0.2", "--handshake-port", "16392",
                       "--notify-port", "16500")
    c = worker(b, "kv_producer")
    r = c.broker_client.alloc(2 * 4 * 16 * 2 * 32 * 2,
                              kvbroker.MEM_REMOTE_READ)
    c.register_kv_caches({"l.0": r.as_torch(torch.int16, (2, 4, 16, 2, 32))})
    s = sched("kv_producer")
    req = vd.Request("a", 20, {"do_remote_decode": True, "transfer_id": "t1",
                               "remote_host": "127.0.0.1",
                               "remote_handshake_port": 16391})
    s.update_state_after_alloc(req, vd.KVCacheBlocks([2, 3]), 0)
    c.bind_connector_metadata(s.build_connector_meta(
        vd.SchedulerOutput({"a": 20})))
    c.start_load_kv(None)
    c.save_kv_layer("l.0", None, None)
    c.wait_for_save()
    assert c.get_finished({"a"}) == (None, None)  # waiting for D
    assert c.connector_stats()["live"] == 1
    b.kill()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3:  # vLLM's steps
        sending, _ = c.get_finished(set())
        if sending:
            break
        time.sleep(0.01)
    assert sending == {"a"}
    assert time.monotonic() - t0 < 1.0  # LIVENESS_S + a step
    assert "EPIPE" in c.connector_stats()["broker_gone"]
    c.shutdown()
    peer.stop()


def test_hnd_refused_for_a_heads_split(broker):
    """An HND cache cannot be split by heads: a load from a P with another
    TP size (and so other heads per rank) fails at once with that reason,
    its blocks reported as load errors; one from the same TP is opened."""
    import kvbroker

    c = worker(broker, total_num_kv_heads=4)  # TP 1 here: 4 heads
    r = c.broker_client.alloc(2 * 4 * 16 * 4 * 32 * 2,
                              kvbroker.MEM_REMOTE_WRITE)
    t = r.as_torch(torch.int16, (2, 4, 4, 16, 32)).permute(0, 1, 3, 2, 4)
    c.register_kv_caches({"l.0": t})
    s = sched("kv_consumer")
    req = vd.Request("a", 20, dict(GOOD_D, remote_tp_size=2))
    s.get_num_new_matched_tokens(req, 0)
    s.update_state_after_alloc(req, vd.KVCacheBlocks([2, 3]), 20)
    c.bind_connector_metadata(s.build_connector_meta(vd.SchedulerOutput()))
    c.start_load_kv(None)
    assert c.get_finished(set()) == (None, {"a"})
    assert c.get_block_ids_with_load_errors() == {2, 3}
    assert c.connector_stats()["opened"] == 0  # refused before opening
    assert c._worker.remote_heads(2) == 2
    assert "HND" in c._worker._check(_meta_for(GOOD_D, 2))
    assert c._worker._check(_meta_for(GOOD_D, 1)) == ""
    c.shutdown()


def _meta_for(params, tp):
    return parse_request(dict(params, remote_tp_size=tp), "x", False)


def test_p_abort_ends_the_save(broker_factory):
    """P's request is aborted while its save waits for D: the transfer is
    aborted at the next step and reported sent (blocks freed) at once."""
    import kvbroker

    broker_factory("--host-ip", "127.0.0.1", "--handshake-port", "16393",
                   "--notify-port", "16600")
    b = broker_factory("--host-ip", "127.0.0.2", "--handshake-port", "16394",
                       "--notify-port", "16700")
    c = worker(b, "kv_producer")
    r = c.broker_client.alloc(2 * 4 * 16 * 2 * 32 * 2,
                              kvbroker.MEM_REMOTE_READ)
    c.register_kv_caches({"l.0": r.as_torch(torch.int16, (2, 4, 16, 2, 32)),
                          "l.1": r.as_torch(torch.int16, (2, 4, 16, 2, 32))})
    s = sched("kv_producer")
    req = vd.Request("a", 20, {"do_remote_decode": True, "transfer_id": "t2",
                               "remote_host": "127.0.0.1",
                               "remote_handshake_port": 16393})
    s.update_state_after_alloc(req, vd.KVCacheBlocks([2, 3]), 0)
    c.bind_connector_metadata(s.build_connector_meta(
        vd.SchedulerOutput({"a": 20})))
    c.start_load_kv(None)
    for name in ("l.0", "l.1", "l.0"):  # a layer twice: queued once
        c.save_kv_layer(name, None, None)
    c.wait_for_save()
    c.clear_connector_metadata()
    req.status = vd.RequestStatus.FINISHED_ABORTED
    assert s.request_finished(req, [2, 3])[0] is True
    c.bind_connector_metadata(s.build_connector_meta(vd.SchedulerOutput()))
    c.start_load_kv(None)
    t0 = time.monotonic()
    sending = None
    while not sending and time.monotonic() - t0 < 5:
        sending, _ = c.get_finished({"a"})
        time.sleep(0.01)
    assert sending == {"a"}
    st = c.connector_stats()
    assert (st["aborted"], st["failed"], st["live"]) == (1, 1, 0)
    assert st["layer_errors"] <= 2  # its held layer ops fail with it
    c.shutdown()


def test_required_layout_in_the_asking_vllms_words():
    """vLLM >= 0.29 names layouts LBNHC..., earlier ones NHD / HND: the
    connector asks for the head-splittable one in the vocabulary it meets
    (without vLLM installed: the cache_config's own layout name tells)."""
    from types import SimpleNamespace as NS

    new = NS(cache_config=NS(kv_cache_layout="BLNHC"))
    old = NS(cache_config=NS(kv_cache_layout="HND"))
    assert KVBrokerConnector.get_required_kvcache_layout(new) == "LBNHC"
    assert KVBrokerConnector.get_required_kvcache_layout(old) == "NHD"
    assert KVBrokerConnector.get_required_kvcache_layout(NS()) == "NHD"


def test_d_refuses_another_kv_layout():
    """P's params name its vLLM KV cache layout; a D with another one
    refuses the request (logged, counted once: the bytes would land in
    the wrong order) and computes it locally; the same layout loads."""
    c = sched("kv_consumer")
    c._sched.kv_layout = "LBNHC"  # what vLLM >= 0.29 puts in cache_config
    other = vd.Request("x", 32, dict(GOOD_D, kv_cache_layout="BLNHC"))
    assert c.get_num_new_matched_tokens(other, 0) == (0, False)
    assert c.get_num_new_matched_tokens(other, 0) == (0, False)
    assert c.connector_stats()["bad_params"] == 1
    same = vd.Request("y", 32, dict(GOOD_D, transfer_id="tx-2",
                                    kv_cache_layout="LBNHC"))
    assert c.get_num_new_matched_tokens(same, 0) == (32, True)
    c.update_state_after_alloc(same, vd.KVCacheBlocks([4, 5]), 32)
    m = c.build_connector_meta(vd.SchedulerOutput())
    assert [x.req_id for x in m.reqs_to_load] == ["y"]
    assert m.reqs_to_load[0].block_ids == [4, 5]


def test_d_refuses_a_transfer_id_already_loading():
    """Two D requests with one transfer_id: the second is computed
    locally (counted), the first loads; nothing is released for the
    second (P's broker refuses its duplicate save itself)."""
    c = sched("kv_consumer")
    a = vd.Request("a", 32, dict(GOOD_D))
    b = vd.Request("b", 32, dict(GOOD_D))
    assert c.get_num_new_matched_tokens(a, 0) == (32, True)
    c.update_state_after_alloc(a, vd.KVCacheBlocks([1, 2]), 32)
    assert c.get_num_new_matched_tokens(b, 0) == (0, False)
    c.update_state_after_alloc(b, vd.KVCacheBlocks([3, 4]), 0)
    m = c.build_connector_meta(vd.SchedulerOutput())
    assert [x.req_id for x in m.reqs_to_load] == ["a"]
    assert m.reqs_to_release == []
    assert c.connector_stats()["duplicate_ids"] == 1


@pytest.mark.parametrize("how", ["kill", "term"])
def test_attach_again_after_the_broker_restarts(broker_factory, how):
    """P's broker goes away (SIGKILL, or stopped with SIGTERM) with a save
    in flight: the save is reported at once; while no broker answers the
    step hooks stay fast and try to attach every 0.25 s at most (no attach
    storm), a save opened meanwhile ends at once; a new broker on the same
    socket is attached again within a few steps, with the same memory (one
    region holding both layers, each an alias of it, as vLLM >= 0.29 hands
    them) and the same geometry, and saves open on it again. A second
    restart while the worker is idle is noticed at the next step's start,
    before its opens. No descriptor is left behind."""
    import types

    import kvbroker
    from conftest import fd_count

    broker_factory("--host-ip", "127.0.0.1", "--handshake-port", "16395",
                   "--notify-port", "16800")
    b = broker_factory("--host-ip", "127.0.0.2", "--handshake-port", "16396",
                       "--notify-port", "16900")
    c = worker(b, "kv_producer")
    w = c._worker
    layer = 2 * 4 * 16 * 2 * 32
    r = c.broker_client.alloc(4096 + 2 * layer * 2, kvbroker.MEM_REMOTE_READ)
    t = r.as_torch(torch.int16, (4096 + 2 * layer * 2) // 2)
    c.register_kv_caches({
        "l.%d" % i: t[2048 + i * layer:2048 + (i + 1) * layer].view(
            2, 4, 16, 2, 32) for i in range(2)})
    assert b.stats()["regions"] == 3  # the memory and a layer alias each
    attempts = []

    class Counting:  # kvbroker.Client, counted
        def __new__(cls, *a, **kw):
            attempts.append(time.monotonic())
            return kvbroker.Client(*a, **kw)

    w._kvb = types.SimpleNamespace(**dict(vars(kvbroker), Client=Counting))
    s = sched("kv_producer")
    n = [0]

    def step(new=()):
        """One of vLLM's steps: (sending, its slowest hook in s)."""
        for rid in new:
            n[0] += 1
            req = vd.Request(rid, 20, {
                "do_remote_decode": True, "transfer_id": "t-" + rid,
                "remote_host": "127.0.0.1", "remote_handshake_port": 16395})
            s.update_state_after_alloc(req, vd.KVCacheBlocks([2, 3]), 0)
        slow = 0.0
        t0 = time.monotonic()
        c.bind_connector_metadata(s.build_connector_meta(
            vd.SchedulerOutput({rid: 20 for rid in new})))
        c.start_load_kv(None)
        slow = max(slow, time.monotonic() - t0)
        for name in ("l.0", "l.1"):
            c.save_kv_layer(name, None, None)
        t0 = time.monotonic()
        c.wait_for_save()
        sending, _ = c.get_finished(set(new))
        c.clear_connector_metadata()
        return sending or set(), max(slow, time.monotonic() - t0)

    step(["a"])
    assert c.connector_stats()["live"] == 1  # waits for D's announcement
    fds = fd_count()
    if how == "kill":
        b.kill()
    else:
        assert b.stop() == 0
    t0 = time.monotonic()
    sending = set()
    while "a" not in sending and time.monotonic() - t0 < 3:
        sending |= step()[0]
    assert sending == {"a"}, "the save did not end with the broker"
    # no broker: a second of steps (thousands), fast, few attach tries
    sending, _ = step(["b"])  # refused at once: reported sent
    hooks = []
    t1 = time.monotonic()
    while time.monotonic() - t1 < 1.0:
        done, took = step()
        sending |= done
        hooks.append(took)
    assert sending == {"b"}
    st = c.connector_stats()
    assert st["broker_gone"] and st["live"] == 0 and \
        st.get("reattached", 0) == 0
    hooks.sort()
    # (a shared machine preempts now and then: the slowest is loose; a
    # hook that waited for an attach would take timeout_ms, 10 s)
    assert len(hooks) > 100 and hooks[len(hooks) * 99 // 100] < 0.002 and \
        hooks[-1] < 2.0, (len(hooks), hooks[len(hooks) * 99 // 100],
                          hooks[-1])
    assert 3 <= len(attempts) <= 6, ["%.3f" % (x - t1) for x in attempts]
    assert min(y - x for x, y in zip(attempts, attempts[1:])) >= 0.24
    # a new broker on the same socket: attached within REATTACH_S
    b.start()
    up = time.monotonic()
    while c.connector_stats().get("reattached", 0) == 0 and \
            time.monotonic() - up < 3:
        step()
    took = time.monotonic() - up
    st = c.connector_stats()
    assert st.get("reattached", 0) == 1 and not st["broker_gone"], st
    assert took < 0.6, took
    bs = b.stats()
    assert (bs["workers"], bs["regions"]) == (1, 3), bs
    assert fd_count() == fds  # the gone client's socket, eventfds, memfds
    step(["c"])
    st = c.connector_stats()
    assert st["live"] == 1 and st["open_errors"] == 0, st
    # restarted again while this worker has nothing in flight: noticed at
    # the next step's start (another socket file), before its opens
    del attempts[:]
    time.sleep(0.3)
    b.kill()
    b.start()
    time.sleep(0.3)
    step(["d"])
    st = c.connector_stats()
    assert st.get("reattached", 0) == 2 and st["open_errors"] == 0, st
    assert len(attempts) == 1
    assert b.stats()["regions"] == 3
    c.shutdown()
    assert fd_count() < fds
    assert b.wait_stat("workers", 0) == 0


READ_D = dict(GOOD_D, mode="read", remote_block_ids=[7, 8, 9],
              lease_until=4e9)


@pytest.mark.parametrize("change,why", [
    ({"mode": "write"}, "P runs WRITE mode"),
    ({"remote_block_ids": [7, 8]}, "remote_block_ids"),
    ({"remote_block_ids": [7, -1, 9]}, "remote_block_ids"),
    ({"remote_block_ids": [7, True, 9]}, "remote_block_ids"),
    ({"remote_block_ids": "7,8,9"}, "remote_block_ids"),
    ({"lease_until": None}, "lease_until"),
    ({"lease_until": 0}, "lease_until"),
], ids=["mode", "short", "negative", "bool", "str", "no-lease", "lease-0"])
def test_read_d_refuses_bad_params(change, why, caplog):
    """D in READ mode: params a READ P did not make (another mode, too few
    of P's blocks for the prompt, no lease) are refused before the load is
    promised: computed at D, counted once, logged with the reason."""
    c = sched("kv_consumer", mode="read")
    r = vd.Request("a", 40, dict(READ_D, **change))
    assert c.get_num_new_matched_tokens(r, 0) == (0, False)
    assert c.get_num_new_matched_tokens(r, 0) == (0, False)
    assert c.connector_stats()["bad_params"] == 1
    assert why in caplog.text


def test_read_d_pairs_positions():
    """D in READ mode with a 1-block local hit: it reads P's blocks at the
    positions it fills (P's second and third), into its own."""
    c = sched("kv_consumer", mode="read")
    r = vd.Request("a", 40, dict(READ_D))
    assert c.get_num_new_matched_tokens(r, 16) == (24, True)
    c.update_state_after_alloc(r, vd.KVCacheBlocks([3, 4, 5]), 24)
    m = c.build_connector_meta(vd.SchedulerOutput())
    (x,) = m.reqs_to_load
    assert (x.block_ids, x.remote_block_ids, x.lease_until) == \
        ([4, 5], [8, 9], 4e9)
