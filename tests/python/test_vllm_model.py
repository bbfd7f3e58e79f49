# SPDX-License-Identifier: MIT
"""KVBrokerConnector under the vLLM model (tests/python/vllm_model), P and D
on two "nodes" (network namespaces, a broker in each, tcp between them).

Each test runs one P and one D vLLM instance as vLLM 0.25 .. 0.32 drive a
connector (versions.py: runner call order, KV cache form, scheduler), with
every byte D received checked against what P's forward wrote, D's own prefix
cache checked untouched, vLLM's scheduler asserts kept (a connector that
reports an unknown or freed request id fails as vLLM's engine would), and at
the end nothing left behind: no request in either scheduler, every block
free, both brokers' transfer tables empty. Needs root and ip(8).
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_vllm_xnode import Nodes, pytestmark  # noqa: E402,F401
from vllm_model import versions  # noqa: E402
from vllm_model.engine import Harness, InstanceSpec, make_prompt  # noqa: E402
from vllm_model.objects import RequestStatus  # noqa: E402

BUILD = os.environ.get("KVB_BUILD_DIR", os.path.join(os.path.dirname(
    os.path.dirname(HERE)), "build"))
KVBCTL = os.environ.get("KVBCTL_BIN") or os.path.join(BUILD, "broker",
                                                      "kvbctl")
if not os.environ.get("KVB_BROKER_BIN"):
    os.environ["KVB_BROKER_BIN"] = os.path.join(BUILD, "broker", "kvbroker")
if not os.environ.get("KVBROKER_LIB"):
    os.environ["KVBROKER_LIB"] = os.path.join(BUILD, "client",
                                              "libkvbroker.so")
torch = pytest.importorskip("torch")

OLD, NEW = "0.28", "0.32"  # the two KV cache forms / runner contracts


@pytest.fixture
def nodes():
    n = Nodes()
    try:
        yield n
    finally:
        n.close()


def harness(nodes, version, *, p=None, d=None, runner=None,
            proxy="sequential", **common):
    ps = dict(socket=nodes.sock("a"), host_ip="192.0.2.1", runner=runner)
    ds = dict(socket=nodes.sock("b"), host_ip="192.0.2.2", runner=runner)
    ps.update(common)
    ds.update(common)
    ps.update(p or {})
    ds.update(d or {})
    return Harness(InstanceSpec("P", version, **ps),
                   InstanceSpec("D", version, **ds), proxy=proxy)


@pytest.fixture
def make(nodes):
    made = []

    def mk(version, **kw):
        h = harness(nodes, version, **kw)
        made.append(h)
        return h

    yield mk
    for h in made:
        h.close()


def broker_transfers(nodes, n: str) -> int:
    out = subprocess.run([KVBCTL, "--socket", nodes.sock(n), "stats",
                          "--json"], capture_output=True, text=True,
                         timeout=10)
    if out.returncode:
        return -1  # broker gone
    import json

    st = json.loads(out.stdout)
    # what a peer's message created for an id no worker opened (a P's
    # kvb_write_failed for a request D refused) is held until a worker
    # opens it or --unopened-timeout (60 s) ends it: not a transfer yet
    held = int((st.get("remote") or {}).get("unopened_held", 0))
    return int(st.get("transfers_active", 0)) - held


def assert_no_leak(h, nodes, brokers=("a", "b"), wait=6.0):
    for name, inst in (("P", h.P), ("D", h.D)):
        if inst.dead:
            continue
        s = inst.sched
        assert not s.requests, "%s holds requests at the end: %s" % (
            name, h.state(inst))
        assert s.num_free_blocks() == inst.spec.num_blocks - 1, \
            "%s: %d of %d blocks free at the end" % (
                name, s.num_free_blocks(), inst.spec.num_blocks - 1)
        assert not s.connector.has_pending_push_work(), name
    end = time.monotonic() + wait
    left = {}
    for n in brokers:
        while True:
            left[n] = broker_transfers(nodes, n)
            if left[n] <= 0 or time.monotonic() > end:
                break
            time.sleep(0.05)
    assert all(v <= 0 for v in left.values()), \
        "transfers left in the brokers' tables: %s" % left


def assert_all_ok(h, n=None):
    res = h.d_results()
    if n is not None:
        assert len(res) == n, "D got %d of %d requests: not handed %s" % (
            len(res), n, h.not_handed)
    bad = {k: v for k, v in res.items() if v != "ok"}
    assert not bad, "D loads not intact: %s" % dict(list(bad.items())[:6])


def submit_many(h, n, rng, lo=17, hi=200, d_max_tokens=2):
    for i in range(n):
        h.submit("r%d" % i, make_prompt(rng, rng.randint(lo, hi)),
                 d_max_tokens=d_max_tokens)


# ---------------------------------------------------------------- basic


@pytest.mark.parametrize("version", versions.ALL)
def test_basic(make, nodes, version):
    """12 requests P -> D, every byte of every layer checked at D."""
    h = make(version)
    submit_many(h, 12, random.Random(1))
    h.run(40)
    assert_all_ok(h, 12)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version,kv_form", [(OLD, None), (NEW, "5d")])
def test_concurrent_proxy(make, nodes, version, kv_form):
    """A WRITE-mode proxy sends the request to P and D at once (D's params
    from the proxy, not from P's request_finished): D announces its blocks
    before P computed anything; every byte arrives. (0.32 with 5-D caches:
    the newer contract apart from the KV cache form.)"""
    h = make(version, proxy="concurrent", kv_form=kv_form)
    submit_many(h, 8, random.Random(15))
    h.run(40)
    assert_all_ok(h, 8)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version,kw", [
    (OLD, dict(tp=2, layout="HND", backend="flashinfer")),
    (NEW, dict(tp=2, layout="BLNHC")),
    (NEW, dict(kernel_block_size=8)),
], ids=["0.28-tp2-flashinfer-HND", "0.32-tp2-BLNHC", "0.32-kernel-block-8"])
def test_forms(make, nodes, version, kw):
    """Other KV cache forms: TP 2, FlashInfer blocks-first with HND; the
    block-major BLNHC views; kernel blocks half a block (B = 2 x blocks)."""
    h = make(version, **kw)
    submit_many(h, 8, random.Random(2))
    h.run(40)
    assert_all_ok(h, 8)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version,ptp,dtp", [
    (OLD, 2, 1), (NEW, 1, 2), (NEW, 4, 2), (OLD, 2, 4)],
    ids=["0.28-2to1", "0.32-1to2", "0.32-4to2", "0.28-2to4"])
def test_heterogeneous_tp(make, nodes, version, ptp, dtp):
    """P and D with different TP sizes, the same 8 KV heads in all: each D
    rank's heads come from the P ranks that hold them (P TP larger: each P
    rank writes its heads into the D rank holding them, D waits for every
    writer; smaller: each P rank writes a slice of its heads into each D
    rank). NHD 5-D caches (0.28) and LBNHC views (0.32); every byte checked
    on every D rank."""
    h = make(version, p=dict(tp=ptp, heads=8 // ptp),
             d=dict(tp=dtp, heads=8 // dtp))
    submit_many(h, 6, random.Random(24), lo=20, hi=120)
    h.run(90)
    assert_all_ok(h, 6)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version", [OLD, NEW])
def test_heterogeneous_tp_hnd_refused(make, nodes, version):
    """HND pages (heads outside the tokens) cannot be split between TP
    sizes: D refuses each load (a load error, recomputed at D) and says
    why; P's blocks are freed (a release); nothing hangs or leaks."""
    layout = "HND" if version == OLD else "LBHNC"
    h = make(version, layout=layout, p=dict(tp=2, heads=2),
             d=dict(tp=1, heads=4))
    submit_many(h, 3, random.Random(25), lo=20, hi=80)
    h.run(60)
    res = h.d_results()
    assert len(res) == 3 and all(v == "load_error" for v in res.values()), \
        res
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version,sched", [("0.29", "sync"),
                                           (NEW, "sync"), (NEW, "async")])
def test_newer_contract_on_5d_caches(make, nodes, version, sched):
    """Not a vLLM configuration: the >= 0.29 runner contract (V2,
    start_load_kv after the forward, wait_for_save on empty steps,
    get_transfer_results, handle_preemptions before bind) with the <= 0.28
    5-D KV caches, to tell failures of the call order from failures of the
    KV cache form. 12 requests, one aborted at D during its load."""
    h = make(version, kv_form="5d", async_scheduling=sched == "async")
    submit_many(h, 12, random.Random(14), d_max_tokens=3)
    h.at(_d_state("waiting_for_remote_kvs"), lambda h: h.D.abort(["d-r2"]))
    h.run(60)
    res = h.d_results()
    others = {k: v for k, v in res.items() if k != "d-r2"}
    assert len(others) == 11 and all(v == "ok" for v in others.values()), \
        res
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version", [OLD, "0.30"])
def test_empty_steps(make, nodes, version):
    """Steps without tokens (D waiting for its loads, P waiting for its
    sends) run the version's runner order, wait_for_save included where the
    version calls it; the connector copes with every one of them."""
    h = make(version)
    submit_many(h, 4, random.Random(3))
    h.run(40)
    assert_all_ok(h, 4)
    v = versions.get(version)
    for inst in (h.P, h.D):
        assert inst.empty_steps > 0
        wfs = v.wait_for_save_empty(inst.runner)
        for calls in inst.calls:
            if "start_load_kv" in calls and "wait_for_save" not in calls:
                assert not wfs, calls
    assert_no_leak(h, nodes)


# ----------------------------------------------------------- chunked / P


@pytest.mark.parametrize("version", [OLD, NEW])
def test_chunked_prefill_p(make, nodes, version):
    """P prefills long prompts in chunks of 32 tokens (token budget 48):
    the save spans several steps, D gets every byte."""
    h = make(version, p=dict(max_num_batched_tokens=48,
                             long_prefill_token_threshold=32))
    submit_many(h, 6, random.Random(4), lo=90, hi=260)
    h.run(60)
    assert_all_ok(h, 6)
    assert any(len(c) for c in h.P.calls)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version,runner", [(OLD, "v1"), (OLD, "v2"),
                                            (NEW, "v2"), (NEW, "v1")])
def test_preempt_p_during_chunked_prefill(make, nodes, version, runner):
    """P preempts a request in the middle of its chunked prefill (as block
    pressure does: blocks freed, num_computed_tokens 0, back to waiting);
    it resumes (V1: resumed_req_ids with its new block list; V2: in
    scheduled_new_reqs), is asked get_num_new_matched_tokens again, and its
    KV still reaches D intact."""
    preempt_p_mid_chunk(make, nodes, version, runner, 5)


def preempt_p_mid_chunk(make, nodes, version, runner, seed, **kw):
    """test_preempt_p_during_chunked_prefill's scenario (kw: the
    instances' further settings)."""
    h = make(version, runner=runner,
             p=dict(max_num_batched_tokens=40,
                    long_prefill_token_threshold=32), **kw)
    rng = random.Random(seed)
    for i in range(3):
        h.submit("r%d" % i, make_prompt(rng, 150 + 20 * i))

    def mid_chunk(h):
        r = h.P.sched.requests.get("r1")
        return r is not None and r.status == RequestStatus.RUNNING and \
            r.is_prefill_chunk and r.num_computed_tokens >= 64

    h.at(mid_chunk, lambda h: h.P.sched.preempt("r1"))
    h.run(60)
    assert any(e[0] == "preempt" and e[2] == "r1" for e in h.P.sched.events)
    assert [c for c in h.P.sched.matched_calls if c[0] == "r1"].__len__() \
        >= 2
    assert_all_ok(h, 3)
    assert_no_leak(h, nodes)


# ------------------------------------------------------------------ D side


@pytest.mark.parametrize("version", [OLD, NEW])
def test_preempt_d_under_block_pressure(make, nodes, version):
    """D runs out of blocks while its loaded requests decode: vLLM preempts
    the newest (blocks freed, recomputed later; get_num_new_matched_tokens
    asked again for a request whose load already happened). Every load is
    intact, every request ends, nothing leaks."""
    h = make(version, d=dict(num_blocks=26))
    rng = random.Random(6)
    for i in range(6):
        h.submit("r%d" % i, make_prompt(rng, 40), d_max_tokens=70)
    h.run(90)
    assert any(e[0] == "preempt" for e in h.D.sched.events), \
        "no preemption at D"
    assert_all_ok(h, 6)
    assert all(st == RequestStatus.FINISHED_LENGTH_CAPPED
               for r, st in h.D.sched.finished.items())
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("hit", ["partial", "full"])
@pytest.mark.parametrize("version", [OLD, NEW])
def test_prefix_hit_at_d(make, nodes, version, hit):
    """D already holds the prompt's first blocks in its prefix cache (from
    requests it computed itself). vLLM hands the connector the block-aligned
    local hit; only D's unhashed blocks may be filled: D's cached blocks
    must come out unchanged, the rest must be P's bytes. partial: 3 of 6
    blocks cached; full: every full block cached, one token to load."""
    h = make(version)
    rng = random.Random(7)
    prefix = make_prompt(rng, 48)
    h.submit_d_local("local", prefix + make_prompt(rng, 30))
    h.run(30)
    if hit == "partial":
        prompt = prefix + make_prompt(rng, 43)
    else:
        prompt = prefix + make_prompt(rng, 1)
    h.submit("r0", prompt)
    h.run(30)
    loads = [e for e in h.D.sched.events if e[0] == "async_load"]
    assert loads and loads[0][3] == 48, loads  # 3 local blocks presented
    assert_all_ok(h, 1)
    assert_no_leak(h, nodes)


# -------------------------------------------------------------------- aborts


def _p_state(state):
    def when(h):
        r = h.P.sched.requests.get("r2")
        if state == "waiting":
            return r is not None
        if state == "running_chunk":
            return r is not None and r.status == RequestStatus.RUNNING and \
                r.num_computed_tokens > 0
        if state == "finished_sending":
            return "r2" in h.handed
        return False
    return when


def _d_state(state):
    def when(h):
        r = h.D.sched.requests.get("d-r2")
        if r is None:
            return False
        if state == "waiting_for_remote_kvs":
            return r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        if state == "load_finished":
            return (r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and
                    "d-r2" in h.D.sched.finished_recving_kv_req_ids)
        if state == "running":
            return r.status == RequestStatus.RUNNING
        return False
    return when


@pytest.mark.parametrize("sched", ["sync", "async"])
@pytest.mark.parametrize("state", ["waiting", "running_chunk",
                                   "finished_sending"])
@pytest.mark.parametrize("version", [OLD, NEW])
def test_abort_at_p(make, nodes, version, state, sched):
    """The client goes away while P holds the request (waiting, in the
    middle of its chunked prefill, or finished with its KV on the way):
    nothing is reported for an id vLLM no longer holds, the other requests
    load intact, nothing leaks."""
    abort_at_p(make, nodes, version, state, 8,
               async_scheduling=sched == "async")


def abort_at_p(make, nodes, version, state, seed, **kw):
    """test_abort_at_p's scenario (kw: the instances' further settings)."""
    h = make(version, p=dict(max_num_batched_tokens=48,
                             long_prefill_token_threshold=32), **kw)
    submit_many(h, 4, random.Random(seed), lo=80, hi=160)
    h.at(_p_state(state), lambda h: h.P.abort(["r2"]))
    h.run(60)
    res = h.d_results()
    others = {k: v for k, v in res.items() if k != "d-r2"}
    assert all(v == "ok" for v in others.values()), others
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("sched", ["sync", "async"])
@pytest.mark.parametrize("state", ["waiting_for_remote_kvs", "load_finished",
                                   "running"])
@pytest.mark.parametrize("version", [OLD, NEW])
def test_abort_at_d(make, nodes, version, state, sched):
    """The client goes away while D holds the request: its load in flight
    (WAITING_FOR_REMOTE_KVS: vLLM delays the free until the connector reports
    it in finished_recving), its load just reported (not to be reported
    again), or decoding. No assert of vLLM's scheduler fails, the others load
    intact, nothing leaks at D or P."""
    h = make(version, async_scheduling=sched == "async")
    submit_many(h, 4, random.Random(9), lo=40, hi=120, d_max_tokens=6)
    h.at(_d_state(state), lambda h: h.D.abort(["d-r2"]))
    h.run(60)
    assert h.D.sched.finished.get("d-r2") == RequestStatus.FINISHED_ABORTED
    res = h.d_results()
    others = {k: v for k, v in res.items() if k != "d-r2"}
    assert all(v == "ok" for v in others.values()), others
    assert_no_leak(h, nodes)


# ----------------------------------------------------------------- others


@pytest.mark.parametrize("version", [OLD, NEW])
def test_same_transfer_id(make, nodes, version):
    """Two requests carry the same transfer_id (a proxy bug, or a replay):
    neither may load the other's bytes as its own, nothing hangs or leaks."""
    h = make(version)
    rng = random.Random(10)
    h.submit("r0", make_prompt(rng, 64), transfer_id="tx-same")
    h.submit("r1", make_prompt(rng, 80), transfer_id="tx-same")
    h.submit("r2", make_prompt(rng, 50))
    h.run(60)
    res = h.d_results()
    assert res.get("d-r2") == "ok", res
    for k in ("d-r0", "d-r1"):
        assert res.get(k, "ok") in ("ok", "load_error", "unchecked"), res
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version,kv_form", [(OLD, None), (NEW, None),
                                              (NEW, "5d")])
def test_full_cudagraph(make, nodes, version, kv_form):
    """CUDAGraphMode.FULL: the connector does not ask vLLM for piecewise
    graphs, so the layer hooks never run (graph replay) and P's
    wait_for_save queues every layer after the forward: every byte
    arrives, chunked prefill included, nothing leaks."""
    from kvbroker.vllm import KVBrokerConnector

    assert KVBrokerConnector.requires_piecewise_for_cudagraph({}) is False
    h = make(version, kv_form=kv_form, cudagraph="full",
             p=dict(max_num_batched_tokens=48,
                    long_prefill_token_threshold=32))
    submit_many(h, 8, random.Random(23), lo=20, hi=140)
    h.run(60)
    assert_all_ok(h, 8)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version,ptp,dtp", [
    (OLD, 2, 1), (NEW, 1, 2), (NEW, 4, 2), (OLD, 1, 2)],
    ids=["0.28-2to1", "0.32-1to2", "0.32-4to2", "0.28-1to2"])
def test_mla(make, nodes, version, ptp, dtp):
    """An MLA model: one latent cache per layer ([num_blocks, block_size,
    latent] up to 0.28, [B, 1, N, C] views from 0.29), the same on every TP
    rank, while the model config names 16 KV heads. WRITE must fill the
    latent of every D rank: P TP larger, one P rank of each group writes
    (the others' transfers end with nothing to write); P TP smaller, each P
    rank writes its whole latent into each of its D ranks. Every byte
    checked on every D rank; each D rank receives the whole latent."""
    from kvbroker.vllm import KVBrokerConnector

    h = make(version, mla=True, heads=1, p=dict(tp=ptp), d=dict(tp=dtp))
    submit_many(h, 6, random.Random(27), lo=20, hi=120)
    h.run(90)
    assert_all_ok(h, 6)
    assert_no_leak(h, nodes)
    acc = None
    for data in h.D.kv_stats_data:
        st = KVBrokerConnector.build_kv_connector_stats(data)
        acc = st if acc is None else acc.aggregate(st)
    # every D rank loaded every request (6 per rank)
    assert acc.reduce()["Num successful transfers"] == 6 * dtp


@pytest.mark.parametrize("version,proxy", [(OLD, "sequential"),
                                           (NEW, "concurrent")])
def test_data_parallel(make, nodes, version, proxy):
    """DP 2 on each side, TP 2, on the same two brokers: P's DP rank 0
    feeds D's DP rank 1 and P's rank 1 D's rank 0 (the params carry
    remote_dp_rank; each engine's workers sit on the notify ports base +
    dp_rank * tp + tp_rank, MoRIIO's formula). Every byte checked on every
    D rank of both engines; nothing leaks."""
    from vllm_model.engine import run_all

    hs = []
    for pdp, ddp in ((0, 1), (1, 0)):
        hs.append(make(version, proxy=proxy, tp=2, heads=2,
                       p=dict(dp_rank=pdp, dp_size=2),
                       d=dict(dp_rank=ddp, dp_size=2)))
    for k, h in enumerate(hs):
        rng = random.Random(28 + k)
        for i in range(4):
            h.submit("dp%d-r%d" % (k, i), make_prompt(rng, rng.randint(20,
                                                                       120)))
    run_all(hs, 90)
    for h in hs:
        assert_all_ok(h, 4)
    for h in hs:
        assert_no_leak(h, nodes)


class _Metric:
    """prometheus_client's Gauge / Counter / Histogram, as vLLM hands
    their classes to build_prom_metrics (metric_types): children by label
    values, observations and increments kept."""
    made: dict = {}

    def __init__(self, name, documentation, labelnames, buckets=None):
        self.name, self.labelnames = name, list(labelnames)
        self.children: dict = {}
        _Metric.made[name] = self

    def labels(self, *values):
        assert len(values) == len(self.labelnames), (self.name, values)
        return self.children.setdefault(tuple(values), _Child())


class _Child:
    def __init__(self):
        self.obs, self.total = [], 0.0

    def observe(self, v):
        self.obs.append(v)

    def inc(self, n=1):
        self.total += n


@pytest.mark.parametrize("version,ptp", [(OLD, 1), (NEW, 2)])
def test_stats(make, nodes, version, ptp):
    """vLLM's connector stats path: each worker's
    get_kv_connector_stats, aggregated over the TP ranks (as
    KVOutputAggregator does), its .data rebuilt by
    build_kv_connector_stats and aggregated over the steps (as vLLM's
    logging process does), reduce() logged; and build_prom_metrics' object
    fed the same data. Every transfer counted once per rank, bytes and
    blocks as moved; a transfer that fails is counted by reason."""
    from kvbroker.vllm import KVBrokerConnector

    h = make(version, p=dict(tp=ptp, heads=4 // ptp), d=dict(heads=4))
    submit_many(h, 6, random.Random(26), lo=20, hi=120)
    h.run(60)
    assert_all_ok(h, 6)
    for inst in (h.P, h.D):
        acc = None
        for data in inst.kv_stats_data:
            st = KVBrokerConnector.build_kv_connector_stats(data)
            acc = st if acc is None else acc.aggregate(st)
        r = acc.reduce()
        ranks = inst.spec.tp
        assert r["Num successful transfers"] == 6 * ranks, (inst.spec.role, r)
        assert r["Num failed transfers"] == 0, r
        assert r["Avg post time (ms)"] > 0 and r["Avg xfer time (ms)"] > 0
        # bytes: every rank's share of the blocks it named, all layers
        sp = inst.spec
        per_block = 2 * sp.block_size * sp.heads * sp.head_dim * 2 * \
            sp.layers
        assert sum(acc.data["bytes_transferred"]) == \
            per_block * sum(acc.data["num_blocks"]), r
        _Metric.made.clear()
        prom = KVBrokerConnector.build_prom_metrics(
            inst.spec.vllm_config(), {"Gauge": _Metric, "Counter": _Metric,
                                      "Histogram": _Metric},
            ["model_name", "engine"], {0: ["m", "0"]})
        for data in inst.kv_stats_data:
            prom.observe(data, 0)
        xt = _Metric.made["vllm:kvbroker_xfer_time_seconds"]
        assert len(xt.children[("m", "0")].obs) == 6 * ranks
        assert not _Metric.made[
            "vllm:kvbroker_num_failed_transfers"].children
    # a failure, counted by reason: D loads from an id P never opens
    st = KVBrokerConnector.build_kv_connector_stats(None)
    assert st.is_empty() and st.reduce()["Num successful transfers"] == 0
    st.record_failed(-errno.ENOENT)
    st2 = KVBrokerConnector.build_kv_connector_stats(st.data)
    assert st2.reduce()["Failed (ENOENT)"] == 1


def _d_ended(h, did):
    return did in h.D.sched.finished or (
        did in h.D.verified and did not in h.D.sched.requests)


@pytest.mark.parametrize("version", [OLD, NEW])
def test_transfer_id_p_never_opens(make, nodes, version):
    """D gets a request whose transfer_id P never gets (a proxy that lost
    the P half, a stale id): P's workers declare the ids they will open,
    so P's broker holds D's announcement of this one --unknown-timeout (5
    s), not --unopened-timeout (60 s), and tells D: D's load fails (the
    prompt is recomputed), the others load intact."""
    h = make(version, proxy="concurrent")
    rng = random.Random(21)
    submit_many(h, 4, rng, lo=30, hi=90)
    h.prompts["ghost"] = make_prompt(rng, 64)
    h.d_max_tokens["ghost"] = 2
    h._to_d("ghost", {
        "do_remote_prefill": True, "do_remote_decode": False,
        "transfer_id": "tx-ghost", "remote_host": h.p_ip,
        "remote_handshake_port": 6301, "remote_tp_size": h.P.spec.tp,
        "remote_dp_rank": 0})
    t0 = time.monotonic()
    h.run(40, until=lambda h: _d_ended(h, "d-ghost") and not h.busy())
    took = time.monotonic() - t0
    res = h.d_results()
    assert res.get("d-ghost") == "load_error", res
    assert took < 15, "D's load of an id P never opened ended after %.1f s" \
        % took
    others = {k: v for k, v in res.items() if k != "d-ghost"}
    assert len(others) == 4 and all(v == "ok" for v in others.values()), res
    h.run(30)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version", [OLD, NEW])
def test_abort_at_p_before_scheduled_concurrent(make, nodes, version):
    """A WRITE-mode proxy sent the request to P and D at once; the client
    goes away while P still queues it: P withdraws its transfer id and D's
    load fails at once (not after P's broker's --unopened-timeout)."""
    h = make(version, proxy="concurrent", p=dict(max_num_seqs=1))
    rng = random.Random(22)
    submit_many(h, 4, rng, lo=60, hi=120)
    got = {}

    def abort(h):
        got["t"] = time.monotonic()
        h.P.abort(["r3"])

    h.at(lambda h: "r3" in h.P.sched.requests and
         h.P.sched.requests["r3"].status == RequestStatus.WAITING and
         "d-r3" in h.D.sched.requests and
         h.D.sched.requests["d-r3"].status ==
         RequestStatus.WAITING_FOR_REMOTE_KVS, abort)

    def ended(h):
        if "t" in got and "end" not in got and _d_ended(h, "d-r3"):
            got["end"] = time.monotonic()
        return "end" in got and not h.busy()

    h.run(40, until=ended)
    assert "end" in got, "P never aborted r3 while D waited for it"
    took = got["end"] - got["t"]
    assert took < 3, "D's load ended %.1f s after P's abort" % took
    res = h.d_results()
    assert res.get("d-r3") == "load_error", res
    others = {k: v for k, v in res.items() if k != "d-r3"}
    assert len(others) == 3 and all(v == "ok" for v in others.values()), res
    h.run(30)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version,sched", [(OLD, "sync"), (NEW, "async")])
def test_200_requests_no_leak(make, nodes, version, sched):
    """200 requests of random lengths (1 to 300 tokens): all intact, both
    schedulers empty and both brokers' transfer tables at 0 afterwards."""
    h = make(version, async_scheduling=sched == "async", num_blocks=400,
             max_num_batched_tokens=512)
    submit_many(h, 200, random.Random(11), lo=1, hi=300)
    h.run(120)
    assert_all_ok(h, 200)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version", [OLD, NEW])
def test_malformed_params(make, nodes, version):
    """Bad kv_transfer_params: at P (no transfer_id, not a dict), at D (no
    transfer_id, a port that is no number, a host that is no string). vLLM's
    engine must not die; the requests end; nothing leaks."""
    h = make(version)
    rng = random.Random(12)
    submit_many(h, 6, rng, lo=30, hi=90)
    h.submit("bad-p0", make_prompt(rng, 40),
             params={"do_remote_decode": True, "remote_host": "192.0.2.2",
                     "remote_handshake_port": 6301})
    h.submit("bad-p1", make_prompt(rng, 40), params=["not", "a", "dict"])
    for i in range(3):
        h.submit("bad-d%d" % i, make_prompt(rng, 40))

    def corrupt(rid, params):
        if rid == "bad-d0":
            params.pop("transfer_id", None)
        elif rid == "bad-d1":
            params["remote_handshake_port"] = "not-a-port"
        elif rid == "bad-d2":
            params["remote_host"] = 12
        return params

    h.transform_params = corrupt
    h.run(60)
    res = h.d_results()
    good = {k: v for k, v in res.items() if not k.startswith("d-bad")}
    assert len(good) == 6 and all(v == "ok" for v in good.values()), res
    for rid in ("bad-p0", "bad-p1"):
        assert h.P.sched.finished.get(rid) == \
            RequestStatus.FINISHED_LENGTH_CAPPED
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("what,policy", [("broker", "recompute"),
                                         ("worker", "fail")])
def test_p_dies(make, nodes, what, policy):
    """P's broker (or a P worker process) is SIGKILLed while loads are in
    flight: D's requests still end (load errors: recomputed, or
    FINISHED_ERROR under kv_load_failure_policy "fail"), D's engine lives,
    D leaks nothing."""
    h = make(OLD, d=dict(transfer_timeout_s=3.0,
                         kv_load_failure_policy=policy))
    submit_many(h, 8, random.Random(13), lo=60, hi=160)

    def kill(h):
        if what == "broker":
            nodes.kill_broker("a")
        else:
            h.P.kill_worker(0)

    h.at(lambda h: len(h.handed) >= 3, kill)
    h.run(60)
    assert not h.D.dead, h.D.dead
    res = h.d_results()
    assert res and all(v in ("ok", "load_error") for v in res.values()), res
    assert not h.D.sched.requests
    assert h.D.sched.num_free_blocks() == h.D.spec.num_blocks - 1
    errors = {r for r, v in res.items() if v == "load_error"}
    for rid in errors:
        want = (RequestStatus.FINISHED_ERROR if policy == "fail" else
                RequestStatus.FINISHED_LENGTH_CAPPED)
        assert h.D.sched.finished.get(rid) == want, (rid, policy)


def _broker_answers(nodes, n, timeout=10.0):
    end = time.monotonic() + timeout
    while broker_transfers(nodes, n) < 0:
        assert time.monotonic() < end, "broker %s did not come back" % n
        time.sleep(0.01)


@pytest.mark.parametrize("node,how", [("a", "kill"), ("b", "kill"),
                                      ("a", "term")])
def test_broker_restart(make, nodes, node, how):
    """P's broker (node a) or D's (b) goes away mid-run, SIGKILLed or
    stopped (SIGTERM), and a new one starts 0.5 s later on the same socket
    path and ports. The requests in flight end (D: load errors, recomputed;
    P: sent, blocks freed); the workers attach again to the new broker
    (same memory, same geometry) within a few steps of it answering; later
    requests load intact, every byte checked at D; nothing leaks.

    From the moment the new broker answers, a request is sent every 0.2 s
    until one loads intact: how long after the new broker answered is
    printed. After D's restart, a save P's broker opens toward the old D
    before its heartbeat notices the restart fails; D's announcement of it
    is then answered at once (kvb_write_failed), so such a probe ends as a
    load error within the run's bounds, it does not wait for a clock."""
    h = make(NEW)
    rng = random.Random(31)
    submit_many(h, 8, rng, lo=60, hi=160)
    got = {}
    inst = h.P if node == "a" else h.D

    def stop(h):
        p = nodes.brokers[node]
        p.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
        p.wait(10)
        got["gone"] = time.monotonic()

    def start(h):
        nodes.start_broker(node)
        _broker_answers(nodes, node)
        got["up"] = time.monotonic()

    def probe(h):
        if "ok" in got or got.get("probes", 0) >= 20:
            return  # (an event left would keep the run going)
        got.setdefault("sent", time.monotonic())
        got["probes"] = got.get("probes", 0) + 1
        h.submit("probe%d" % got["probes"], make_prompt(rng, 100))
        h.at(lambda h: "ok" in got or
             time.monotonic() - got["sent"] >= 0.2 * got["probes"], probe)

    def first_ok(h):
        if "sent" in got and "ok" not in got and "ok" in [
                v for k, v in h.d_results().items()
                if k.startswith("d-probe")]:
            got["ok"] = time.monotonic()
        return False

    h.at(lambda h: len(h.handed) >= 3, stop)
    h.at(lambda h: "gone" in got and time.monotonic() - got["gone"] > 0.5,
         start)
    h.at(lambda h: "up" in got, probe)
    h.run(60, until=first_ok)
    ended = time.monotonic()
    assert "sent" in got, "the broker was never restarted"
    assert not h.D.dead and not h.P.dead, (h.D.dead, h.P.dead)
    res = h.d_results()
    first = {k: v for k, v in res.items() if k.startswith("d-r")}
    assert first and all(v in ("ok", "load_error") for v in first.values()), \
        res
    assert ended - got["gone"] < 20, \
        "the run took %.1f s after the loss: %s, %s, %s" % (
            ended - got["gone"], res, nodes.logs(),
            {k: round(v - got["gone"], 2) if isinstance(v, float) else v
             for k, v in got.items()})
    assert inst.worker_stats and all(
        st.get("reattached", 0) == 1 and not st["broker_gone"]
        for st in inst.worker_stats), inst.worker_stats
    # requests after the restart: every byte checked at D
    for i in range(6):
        h.submit("s%d" % i, make_prompt(rng, rng.randint(30, 150)))
    h.run(40)
    res = h.d_results()
    later = {k: v for k, v in res.items() if k.startswith("d-s")}
    assert len(later) == 6 and all(v == "ok" for v in later.values()), res
    assert "ok" in got, "no request loaded intact after the restart: %s" % res
    assert_no_leak(h, nodes)
    print("\nbroker %s %s: requests sent from %.2f s after the new broker "
          "answered, the first intact load %.2f s after it answered (%d "
          "sent)" % (node, how, got["sent"] - got["up"], got["ok"] -
                     got["up"], got["probes"]))
