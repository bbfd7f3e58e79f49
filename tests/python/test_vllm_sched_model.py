# SPDX-License-Identifier: MIT
"""The vLLM model's scheduler, KV cache forms and runner orders, without a
broker or root: first the model against what vLLM's source says (a
recording connector, scripted), then KVBrokerConnector's scheduler half
under the model (no broker needed for that half)."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from kvbroker.vllm._compat import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm_model import versions  # noqa: E402
from vllm_model.engine import InstanceSpec  # noqa: E402
from vllm_model.objects import (  # noqa: E402
    KVConnectorOutput,
    ModelRunnerOutput,
    Request,
    RequestStatus,
)
from vllm_model.scheduler import EngineDead, Scheduler  # noqa: E402

BS = 16


class Meta(KVConnectorMetadata):
    def __init__(self, so):
        self.step = so.step


class Recorder(KVConnectorBase_V1):
    """A connector that answers as scripted and records every call."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.calls: list[tuple] = []
        self.ext: dict[str, tuple] = {}  # req -> (tokens, async)
        self.delay: set[str] = set()
        self.push = False

    def _rec(self, *a):
        self.calls.append(a)

    def start_load_kv(self, forward_context, **kwargs):
        self._rec("start_load_kv")

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        self._rec("wait_for_save")

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self._rec("matched", request.request_id, num_computed_tokens)
        n, a = self.ext.get(request.request_id, (0, False))
        n = max(0, n - num_computed_tokens) if n else 0
        return n, a and n > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._rec("alloc", request.request_id, blocks.get_block_ids()[0],
                  num_external_tokens, blocks.get_unhashed_block_ids())

    def build_connector_meta(self, scheduler_output):
        return Meta(scheduler_output)

    def request_finished(self, request, block_ids):
        self._rec("finished", request.request_id, list(block_ids),
                  request.status.name)
        return request.request_id in self.delay, None

    def has_pending_push_work(self):
        return self.push


def make_sched(version="0.32", role="D", runner=None, **kw):
    spec = InstanceSpec(role, version, runner=runner, **kw)
    cfg = spec.vllm_config()
    conn = Recorder(cfg, KVConnectorRole.SCHEDULER)
    v = versions.get(version)
    return Scheduler(cfg, v, conn, runner or v.default_runner), conn


def out_for(so, kvo=None):
    """The model's output for a step: a token for every request that is
    not a prefill chunk after this step."""
    ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[7] for _ in ids], kv_connector_output=kvo)


def run_step(s, kvo=None):
    so = s.schedule()
    out = out_for(so, kvo)
    for i, rid in enumerate(out.req_ids):
        r = s.requests.get(rid)
        if r is not None and r.is_prefill_chunk:
            out.sampled_token_ids[i] = []
    s.update_from_output(so, out)
    return so


def prompt(n, base=1):
    return [base + i for i in range(n)]


# ------------------------------------------------------- the model itself


def test_versions_table_complete():
    assert versions.ALL == ("0.25", "0.26", "0.27", "0.28", "0.29", "0.30",
                            "0.31", "0.32")
    for v in versions.VERSIONS.values():
        assert v.sources or v.unverified, v.name
        assert v.start_load in ("before", "after")
    assert versions.get("0.28").kv_form == "5d"
    assert versions.get("0.29").kv_form == "views"
    assert versions.get("0.29").default_runner == "v2"
    assert not versions.get("0.29").transfer_results
    assert versions.get("0.32").transfer_results
    assert "0.25" in versions.table()


def test_async_load_blocks_not_hashed_until_received():
    """test_remote_prefill_lifecycle: blocks allocated, not hashed, not hit
    by another request; after finished_recving the full prompt's last
    token is recomputed (num_tokens - 1)."""
    s, c = make_sched()
    s.add_request(Request("a", prompt(48), 2, {"x": 1}))
    c.ext["a"] = (48, True)
    so = run_step(s)
    a = s.requests["a"]
    assert a.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert so.total_num_scheduled_tokens == 0  # an empty step
    alloc = [x for x in c.calls if x[0] == "alloc"][0]
    assert alloc[3] == 48 and alloc[4] == alloc[2]  # all unhashed
    s.add_request(Request("b", prompt(48), 1))
    run_step(s)
    assert ("matched", "b", 0) in c.calls  # no spurious prefix hit
    run_step(s, KVConnectorOutput(finished_recving={"a"}))
    so = run_step(s)
    assert so.num_scheduled_tokens.get("a") == 1  # the last token again
    s.add_request(Request("c", prompt(48), 1))
    run_step(s)
    assert ("matched", "c", 32) in c.calls  # now hashed; cap num_tokens-1


def test_block_aligned_local_hit_and_cap():
    s, c = make_sched()
    s.add_request(Request("a", prompt(40), 1))
    run_step(s)
    run_step(s)
    s.add_request(Request("b", prompt(40) + [99] * 10, 1))
    run_step(s)
    assert ("matched", "b", 32) in c.calls  # 2 full blocks of 40 tokens


def test_scheduler_asserts_kill_the_engine():
    s, c = make_sched()
    s.add_request(Request("a", prompt(20), 5))
    run_step(s)
    with pytest.raises(EngineDead, match="finished_recving.*'zz'"):
        run_step(s, KVConnectorOutput(finished_recving={"zz"}))
    s, c = make_sched()
    s.add_request(Request("a", prompt(20), 5))
    run_step(s)
    with pytest.raises(EngineDead, match="is_finished"):
        run_step(s, KVConnectorOutput(finished_recving={"a"}))
    s, c = make_sched(role="P")
    s.add_request(Request("a", prompt(20), 1))
    c.delay.add("a")
    run_step(s)
    assert "a" in s.requests  # held for the send
    run_step(s, KVConnectorOutput(finished_sending={"a"}))
    assert "a" not in s.requests
    with pytest.raises(EngineDead, match="finished_sending.*'a'"):
        run_step(s, KVConnectorOutput(finished_sending={"a"}))


def test_request_finished_gets_computed_blocks_with_partial_tail():
    s, c = make_sched(role="P")
    s.add_request(Request("a", prompt(37), 1))
    run_step(s)
    fin = [x for x in c.calls if x[0] == "finished"][0]
    assert len(fin[2]) == 3  # 37 tokens: 2 full blocks and the tail


def test_abort_waiting_for_remote_kvs_delays_free():
    s, c = make_sched()
    s.add_request(Request("a", prompt(40), 2, {"x": 1}))
    c.ext["a"] = (40, True)
    run_step(s)
    free0 = s.num_free_blocks()
    s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert [x for x in c.calls if x[0] == "finished"][0][3] == \
        "FINISHED_ABORTED"
    assert "a" in s.requests and s.num_free_blocks() == free0
    assert s.has_requests()  # kept alive until the connector reports
    run_step(s, KVConnectorOutput(finished_recving={"a"}))
    assert "a" not in s.requests and not s.has_requests()


def test_abort_after_load_reported_frees_at_once():
    s, c = make_sched()
    s.add_request(Request("a", prompt(40), 2, {"x": 1}))
    c.ext["a"] = (40, True)
    run_step(s)
    run_step(s, KVConnectorOutput(finished_recving={"a"}))
    s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert "a" not in s.requests  # a second report would kill the engine


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_preemption_resume_forms(runner):
    """V1: resumed_req_ids, new_block_ids = the whole new list; V2: the
    request in scheduled_new_reqs with all its blocks and tokens. Both:
    get_num_new_matched_tokens asked again."""
    s, c = make_sched(runner=runner, role="P", max_num_batched_tokens=32,
                      long_prefill_token_threshold=16)
    s.add_request(Request("a", prompt(80), 1))
    s.add_request(Request("b", prompt(80, 500), 1))
    run_step(s)
    run_step(s)
    assert s.preempt("b")
    for _ in range(12):
        so = run_step(s)
        if "b" in so.num_scheduled_tokens:
            break
    assert sum(1 for x in c.calls if x[:2] == ("matched", "b")) == 2
    ids = s.kv_cache_manager.get_block_ids("b")[0]
    if runner == "v2":
        nr = [n for n in so.scheduled_new_reqs if n.req_id == "b"]
        assert nr and nr[0].block_ids[0] == ids and \
            nr[0].all_token_ids is not None
    else:
        cd = so.scheduled_cached_reqs
        assert "b" in cd.resumed_req_ids
        assert cd.new_block_ids[cd.req_ids.index("b")][0] == ids


def test_preempted_ids_in_next_output():
    s, c = make_sched(role="P", max_num_batched_tokens=32,
                      long_prefill_token_threshold=16)
    s.add_request(Request("a", prompt(80), 1))
    s.add_request(Request("b", prompt(80, 500), 1))
    run_step(s)
    s.preempt("b")
    so = s.schedule()
    assert so.preempted_req_ids == {"b"}


def test_pending_push_work_keeps_engine_alive():
    s, c = make_sched(role="P")
    assert not s.has_requests()
    c.push = True
    assert s.has_requests()


def test_invalid_blocks_recompute_and_fail():
    for policy, final in (("recompute", None),
                          ("fail", RequestStatus.FINISHED_ERROR)):
        s, c = make_sched(kv_load_failure_policy=policy)
        s.add_request(Request("a", prompt(48), 2, {"x": 1}))
        c.ext["a"] = (48, True)
        run_step(s)
        ids = s.kv_cache_manager.get_block_ids("a")[0]
        run_step(s, KVConnectorOutput(finished_recving={"a"},
                                      invalid_block_ids={ids[1]}))
        if final is None:
            run_step(s)
            assert s.requests["a"].num_computed_tokens > 16
            assert s.requests["a"].status == RequestStatus.RUNNING
        else:
            assert s.finished["a"] == final


def test_failed_recving_recomputes_from_zero():
    s, c = make_sched("0.32")
    s.add_request(Request("a", prompt(48), 2, {"x": 1}))
    c.ext["a"] = (48, True)
    run_step(s)
    del c.ext["a"]
    run_step(s, KVConnectorOutput(finished_recving={"a"},
                                  failed_recving={"a"}))
    run_step(s)
    assert sum(1 for x in c.calls if x[:2] == ("matched", "a")) == 2
    assert s.requests["a"].status == RequestStatus.RUNNING


def test_defer_block_free_for_consumers_with_async_scheduling():
    s, _ = make_sched(async_scheduling=True)
    assert s.defer_block_free
    s, _ = make_sched(role="P", async_scheduling=True)
    assert not s.defer_block_free


# --------------------------------------------------------- KV cache forms


class _Region:
    def __init__(self, n):
        import torch

        self.t = torch.zeros(n, dtype=torch.uint8)

    def as_torch(self, dtype, shape):
        return self.t.view(dtype)[:shape[0]]


class _Client:
    def alloc(self, size, flags, key):
        return _Region(size)


@pytest.mark.parametrize("layout,kbs", [("LBNHC", 16), ("LBHNC", 16),
                                        ("BLNHC", 16), ("BHLNC", 16),
                                        ("LBNHC", 8), ("LBHNC", 4)])
def test_views_geometry(layout, kbs):
    """create_kv_cache_views: block b of layer l starts at
    l*layer_stride + b*block_stride; [B, H, N, C] with K|V packed in C;
    B = num_blocks * block_size / kernel_block_size."""
    torch = pytest.importorskip("torch")
    from vllm_model.worker import LAYOUT_ORDER, KVCaches, layout_strides

    spec = dict(form="views", layout=layout, layers=3, num_blocks=6,
                block_size=16, heads=4, head_dim=32, kernel_block_size=kbs)
    kv = KVCaches(torch, _Client(), spec)
    L, NB, H, N, Cb = 3, 6, 4, 16, 128
    ms = layout_strides((L, NB, H, N, Cb), LAYOUT_ORDER[layout])
    ratio = 16 // kbs
    base = kv.regions[0].t.data_ptr()
    for li in range(L):
        v = kv.caches["model.layers.%d.self_attn.attn" % li]
        assert tuple(v.shape) == (NB * ratio, H, kbs, 64)
        assert v.dtype == torch.int16
        for b in range(NB):
            off = v[b * ratio].data_ptr() - base
            assert off == li * ms[0] + b * ms[1]
        assert v.data_ptr() - base == li * ms[0]
        if layout.startswith("L"):
            assert (li * ms[0]) % 4096 == 0
    # writes land where the read finds them, and nowhere else
    vals = torch.arange(2 * 4 * 64, dtype=torch.int16).view(2, 4, 64)
    kv.write(1, torch.tensor([2, 5]), torch.tensor([3, 15]), vals)
    assert torch.equal(kv.read(1, torch.tensor([2, 5]),
                               torch.tensor([3, 15])), vals)
    assert int((kv.regions[0].t != 0).sum()) <= 2 * 4 * 128


def test_kernel_split_needs_dense_pages():
    torch = pytest.importorskip("torch")
    from vllm_model.worker import KVCaches

    spec = dict(form="views", layout="BLNHC", layers=2, num_blocks=4,
                block_size=16, heads=2, head_dim=32, kernel_block_size=8)
    with pytest.raises(ValueError, match="dense"):
        KVCaches(torch, _Client(), spec)


# ------------------------------------------------------ runner call orders


class WorkerRecorder(Recorder):
    broker_client = _Client()

    def get_finished(self, finished_req_ids):
        self._rec("get_finished")
        return None, None

    def handle_preemptions(self, meta):
        self._rec("handle_preemptions")

    def bind_connector_metadata(self, meta):
        self._rec("bind")
        super().bind_connector_metadata(meta)

    def clear_connector_metadata(self):
        self._rec("clear")
        super().clear_connector_metadata()

    def finish_forward(self):
        self._rec("finish_forward")


@pytest.mark.parametrize("version,runner,empty,want", [
    ("0.28", "v1", False, "handle_preemptions bind start_load_kv "
     "wait_for_save get_finished clear"),
    ("0.28", "v1", True, "handle_preemptions bind start_load_kv "
     "get_finished clear"),
    ("0.28", "v2", False, "bind handle_preemptions start_load_kv "
     "wait_for_save get_finished clear"),
    ("0.29", "v2", False, "handle_preemptions bind finish? start_load_kv "
     "wait_for_save get_finished clear"),
    ("0.29", "v2", True, "handle_preemptions bind start_load_kv "
     "get_finished clear"),
    ("0.32", "v2", False, "handle_preemptions bind finish_forward "
     "start_load_kv wait_for_save get_finished clear"),
    ("0.32", "v2", True, "handle_preemptions bind finish_forward "
     "start_load_kv wait_for_save get_finished clear"),
    ("0.32", "v1", True, "handle_preemptions bind start_load_kv "
     "wait_for_save get_finished clear"),
], ids=lambda x: ("empty" if x else "tokens") if isinstance(x, bool) else
   "order" if isinstance(x, str) and " " in x else x)
def test_runner_call_order(version, runner, empty, want):
    """The worker model's connector calls per version, runner and step kind
    (get_finished reached through get_transfer_results where the version
    calls that)."""
    pytest.importorskip("torch")
    from vllm_model.worker import Worker

    spec_obj = InstanceSpec("P", version, runner=runner, layers=2,
                            num_blocks=8)
    v = versions.get(version)
    spec = {"version": version, "runner": runner, "salt": 1,
            "form": v.kv_form, "layout": v.default_layout, "layers": 2,
            "num_blocks": 8, "block_size": 16, "heads": 2, "head_dim": 32,
            "vllm_config_factory": spec_obj.vllm_config,
            "connector_cls": WorkerRecorder}
    w = Worker(spec, 0)
    s, _ = make_sched(version, runner=runner, role="P", num_blocks=8)
    if not empty:
        s.add_request(Request("a", prompt(20), 1))
    so = s.schedule()
    w.conn.calls = []
    w.execute(so)
    got = " ".join(x[0] for x in w.conn.calls)
    assert got == want.replace("finish? ", ""), got


# ------------------------ KVBrokerConnector's scheduler half in the model


def broker_sched(role="D", version="0.32", runner=None, **kw):
    from kvbroker.vllm import KVBrokerConnector

    spec = InstanceSpec(role, version, runner=runner, socket="/nonexistent",
                        host_ip="192.0.2.1"
                        if role == "P" else "192.0.2.2", **kw)
    cfg = spec.vllm_config()
    conn = KVBrokerConnector(cfg, KVConnectorRole.SCHEDULER, None)
    v = versions.get(version)
    return Scheduler(cfg, v, conn, runner or v.default_runner), conn


def d_params(tid="tx-a"):
    return {"do_remote_prefill": True, "do_remote_decode": False,
            "transfer_id": tid, "remote_host": "192.0.2.1",
            "remote_handshake_port": 6301, "remote_tp_size": 1}


def p_params(tid="tx-a"):
    return {"do_remote_decode": True, "transfer_id": tid,
            "remote_host": "192.0.2.2", "remote_handshake_port": 6301,
            "remote_tp_size": 1}


def test_broker_d_prefix_hit_loads_only_unhashed_blocks():
    """D holds the first 3 blocks in its prefix cache: the load may only
    target D's unhashed blocks (as vLLM's push connectors register
    get_unhashed_block_ids), never the cached ones other requests share."""
    s, c = broker_sched("D")
    s.add_request(Request("local", prompt(60), 1))
    run_step(s)
    run_step(s)
    s.add_request(Request("a", prompt(48) + prompt(30, 900), 2, d_params()))
    so = s.schedule()
    ids = s.kv_cache_manager.get_block_ids("a")[0]
    unhashed = s.kv_cache_manager.get_blocks("a").get_unhashed_block_ids()
    loads = so.kv_connector_metadata.reqs_to_load
    assert len(loads) == 1
    assert loads[0].block_ids == unhashed, (
        "D's load targets %s (cached: %s); only %s are D's to fill" % (
            loads[0].block_ids, ids[:3], unhashed))


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_broker_p_resumed_request_saves_its_current_blocks(runner):
    """P preempted a request mid chunked prefill; once resumed (V1: its
    new_block_ids replace the list; V2: as a new request) the save on its
    last chunk must name the blocks it holds now, not the freed ones."""
    s, c = broker_sched("P", runner=runner, max_num_batched_tokens=32,
                        long_prefill_token_threshold=16)
    s.add_request(Request("a", prompt(80), 1, p_params("tx-a")))
    s.add_request(Request("b", prompt(80, 500), 1, p_params("tx-b")))
    run_step(s)
    run_step(s)
    assert s.preempt("b")
    saved = {}
    for _ in range(20):
        so = s.schedule()
        for m in so.kv_connector_metadata.reqs_to_save:
            saved[m.req_id] = (list(m.block_ids), list(
                s.kv_cache_manager.get_block_ids(m.req_id)[0]))
        out = out_for(so)
        for i, rid in enumerate(out.req_ids):
            if s.requests[rid].is_prefill_chunk:
                out.sampled_token_ids[i] = []
        s.update_from_output(so, out)
        if "b" in saved:
            break
    assert "b" in saved
    got, held = saved["b"]
    assert got == held[:5], "P saves b from %s but b holds %s" % (got, held)


def test_broker_params_not_a_dict_do_not_kill_the_engine():
    """kv_transfer_params from a client that is not a dict: vLLM's engine
    core must not die in the connector (a refusal, logged)."""
    s, c = broker_sched("P")
    s.add_request(Request("a", prompt(20), 1, ["not", "a", "dict"]))
    run_step(s)


def test_broker_d_abort_while_loading_holds_blocks():
    s, c = broker_sched("D")
    s.add_request(Request("a", prompt(40), 2, d_params()))
    run_step(s)
    assert s.requests["a"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert "a" in s.requests  # P may still write: held until reported


def test_broker_matched_tokens_side_effect_free_and_after_preemption():
    s, c = broker_sched("D")
    r = Request("a", prompt(40), 50, d_params())
    assert c.get_num_new_matched_tokens(r, 0) == \
        c.get_num_new_matched_tokens(r, 0)
    s.add_request(r)
    run_step(s)
    run_step(s, KVConnectorOutput(finished_recving={"a"}))
    run_step(s)
    assert s.requests["a"].status == RequestStatus.RUNNING
    # a later preemption recomputes: the load is not asked for again
    s.preempt("a")
    assert c.get_num_new_matched_tokens(r, 0) == (0, False)


def test_broker_metadata_pickles():
    import pickle

    s, c = broker_sched("D")
    s.add_request(Request("a", prompt(40), 2, d_params()))
    so = s.schedule()
    m = pickle.loads(pickle.dumps(so.kv_connector_metadata))
    assert [x.req_id for x in m.reqs_to_load] == ["a"]
