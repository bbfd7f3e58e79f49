# SPDX-License-Identifier: MIT
"""The stand-in KVConnectorBase_V1 (python/kvbroker/vllm/_compat.py) against
vLLM's newest base class, vllm/distributed/kv_transfer/kv_connector/v1/
base.py at vllm-project/vllm 00f4240ee6458263d76cf51ca7901ce1350bb4d1:
every member with its signature (a drift in either shows here), and the
default behaviours a connector relies on."""

from __future__ import annotations

import inspect

import pytest

from kvbroker.vllm import _compat as C

pytestmark = pytest.mark.skipif(C.HAVE_VLLM, reason="vLLM's own classes")

# name -> (kind, parameters after self/cls); kind: m method, a abstract,
# p property, c classmethod. Written from base.py@00f4240ee645.
MEMBERS = {
    "supports_divergent_local_hybrid_hits": ("p", None),
    "requires_kv_delivery": ("p", None),
    "__init__": ("m", "vllm_config, role, kv_cache_config"),
    "role": ("p", None),
    "get_mem_pool_context": ("m", ""),
    "bind_connector_metadata": ("m", "connector_metadata"),
    "clear_connector_metadata": ("m", ""),
    "_get_connector_metadata": ("m", ""),
    "has_connector_metadata": ("m", ""),
    "register_kv_caches": ("m", "kv_caches"),
    "set_host_xfer_buffer_ops": ("m", "copy_operation"),
    "finish_forward": ("m", ""),
    "reset_capture_state": ("m", ""),
    "handle_preemptions": ("m", "kv_connector_metadata"),
    "start_load_kv": ("a", "forward_context, **kwargs"),
    "wait_for_layer_load": ("a", "layer_name"),
    "save_kv_layer": ("a", "layer_name, kv_layer, attn_metadata, **kwargs"),
    "wait_for_save": ("a", ""),
    "get_finished": ("m", "finished_req_ids"),
    "get_transfer_results": ("m", "finished_req_ids"),
    "get_block_ids_with_load_errors": ("m", ""),
    "shutdown": ("m", ""),
    "get_kv_connector_stats": ("m", ""),
    "get_kv_connector_kv_cache_events": ("m", ""),
    "get_handshake_metadata": ("m", ""),
    "build_connector_worker_meta": ("m", ""),
    "bind_kv_cache_manager": ("m", "kv_cache_manager"),
    "bind_gpu_block_pool": ("m", "gpu_block_pool"),
    "get_num_new_matched_tokens": ("a", "request, num_computed_tokens"),
    "update_state_after_alloc": ("a", "request, blocks, num_external_tokens"),
    "build_connector_meta": ("a", "scheduler_output"),
    "on_new_request": ("m", "request"),
    "update_connector_output": ("m", "connector_output"),
    "can_load_prefix_replay_checkpoint": (
        "m", "request, num_local_tokens, num_external_tokens"),
    "consume_prefix_replay_checkpoint": ("m", "request, num_hit_tokens"),
    "request_finished": ("m", "request, block_ids"),
    "register_finished_partial_tail": (
        "m", "request, block_ids, partial_tail_offloads"),
    "take_events": ("m", ""),
    "has_pending_block_frees": ("m", ""),
    "has_pending_push_work": ("m", ""),
    "get_required_kvcache_layout": ("c", "vllm_config"),
    "requires_piecewise_for_cudagraph": ("c", "extra_config"),
    "get_finished_count": ("m", ""),
    "build_kv_connector_stats": ("c", "data=None"),
    "set_xfer_handshake_metadata": ("m", "metadata"),
    "set_xfer_handshake_metadata_pp_aware": ("m", "metadata"),
    "build_prom_metrics": (
        "c", "vllm_config, metric_types, labelnames, per_engine_labelvalues"),
    "reset_cache": ("m", ""),
}

MODULE = ("KVConnectorTransferResults", "SupportsHMA", "supports_hma",
          "KVConnectorRole", "KVConnectorHandshakeMetadata",
          "KVConnectorMetadata", "KVConnectorWorkerMetadata", "CopyBlocksOp",
          "KVConnectorBase_V1")


def _params(fn) -> str:
    sig = inspect.signature(fn)
    out = []
    for p in list(sig.parameters.values()):
        if p.name in ("self", "cls"):
            continue
        s = ("**" if p.kind == p.VAR_KEYWORD else "") + p.name
        if p.default is not p.empty:
            s += "=%r" % (p.default,)
        out.append(s)
    return ", ".join(out)


def _own_members(cls) -> set[str]:
    return {n for n in vars(cls) if not (n.startswith("__") and
                                         n != "__init__")} - {
        "_abc_impl"}


def test_module_level_names():
    for name in MODULE:
        assert hasattr(C, name), name
    assert "00f4240ee645" in C.VLLM_INTERFACE
    assert [r.name for r in C.KVConnectorRole] == ["SCHEDULER", "WORKER"]
    assert [r.value for r in C.KVConnectorRole] == [0, 1]
    tr = C.KVConnectorTransferResults()
    assert (tr.finished_sending, tr.finished_recving, tr.failed_recving,
            tr.prefix_replay_checkpoints) == (set(), set(), set(), {})
    assert inspect.isabstract(C.KVConnectorWorkerMetadata)
    assert inspect.isabstract(C.SupportsHMA)


def test_every_member_and_signature():
    cls = C.KVConnectorBase_V1
    assert _own_members(cls) == set(MEMBERS), (
        "missing %s, extra %s" % (sorted(set(MEMBERS) - _own_members(cls)),
                                  sorted(_own_members(cls) - set(MEMBERS))))
    abstract = set(cls.__abstractmethods__)
    for name, (kind, params) in MEMBERS.items():
        raw = vars(cls)[name]
        if kind == "p":
            assert isinstance(raw, property), name
            continue
        if kind == "c":
            assert isinstance(raw, classmethod), name
        assert (name in abstract) == (kind == "a"), name
        assert _params(getattr(cls, name)) == params, (
            name, _params(getattr(cls, name)))


class _Conn(C.KVConnectorBase_V1):
    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return C.KVConnectorMetadata.__new__(C.KVConnectorMetadata)


class _Cfg:
    def __init__(self, role):
        class T:
            kv_role = role
            is_kv_producer = role in ("kv_producer", "kv_both")
        self.kv_transfer_config = T()


def test_default_behaviour():
    with pytest.raises(ValueError, match="kv_transfer_config"):
        _Conn(type("V", (), {"kv_transfer_config": None})(),
              C.KVConnectorRole.WORKER, None)
    p = _Conn(_Cfg("kv_producer"), C.KVConnectorRole.SCHEDULER, "kvcc")
    d = _Conn(_Cfg("kv_consumer"), C.KVConnectorRole.WORKER, None)
    assert p.requires_kv_delivery is True and d.requires_kv_delivery is False
    assert p.supports_divergent_local_hybrid_hits is False
    assert p.role == C.KVConnectorRole.SCHEDULER and p._kv_cache_config == \
        "kvcc" and p._kv_cache_manager is None
    # get_transfer_results wraps get_finished
    d.get_finished = lambda ids: ({"a"}, None)
    tr = d.get_transfer_results({"a"})
    assert tr.finished_sending == {"a"} and tr.finished_recving == set()
    assert tr.failed_recving == set()
    # bind_kv_cache_manager stores the manager and binds its block pool
    seen = []
    p.bind_gpu_block_pool = seen.append
    mgr = type("M", (), {"block_pool": "pool"})()
    p.bind_kv_cache_manager(mgr)
    assert p._kv_cache_manager is mgr and seen == ["pool"]
    # metadata binding
    assert not d.has_connector_metadata()
    d.bind_connector_metadata("m")
    assert d._get_connector_metadata() == "m"
    d.clear_connector_metadata()
    assert not d.has_connector_metadata()
    assert d.get_block_ids_with_load_errors() == set()
    assert p.request_finished(None, [1]) == (False, None)
    assert p.has_pending_push_work() is False
    assert p.has_pending_block_frees() is False
    assert p.take_events() == ()
    assert p.get_finished_count() is None
    assert p.reset_cache() is None
    with pytest.raises(TypeError):
        C.KVConnectorBase_V1.get_required_kvcache_layout(None)
    assert _Conn.get_required_kvcache_layout(None) is None
    with pytest.raises(ValueError, match="pp_rank"):
        p.set_xfer_handshake_metadata_pp_aware({(1, 0): None})
    got = []
    p.set_xfer_handshake_metadata = got.append
    p.set_xfer_handshake_metadata_pp_aware({(0, 3): "m3"})
    assert got == [{3: "m3"}]
    assert C.supports_hma(_Conn) is False


def test_connector_is_a_v1_connector():
    from kvbroker.vllm import KVBrokerConnector

    assert issubclass(KVBrokerConnector, C.KVConnectorBase_V1)
    assert not inspect.isabstract(KVBrokerConnector)
