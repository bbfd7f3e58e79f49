# SPDX-License-Identifier: MIT
"""KVBrokerConnector with a hybrid model under the vLLM model
(tests/python/vllm_model): vLLM's hybrid KV cache manager (SupportsHMA), a
layout shaped like gpt-oss (even layers sliding-window attention, odd layers
full attention, two KV cache groups over one block pool, a sliding layer and
a full one sharing each KV cache tensor), window 128 tokens, block_size 16.

vLLM frees a sliding-window group's out-of-window blocks (null block 0) in P
before request_finished_all_groups and in D when it allocates the load; the
connector moves every full-attention block and only the in-window
sliding-window blocks. Every byte D will read is checked on every layer (and
the null block untouched); the bytes moved are checked against that count.
Needs root and ip(8), as test_vllm_model.py.
"""

from __future__ import annotations

import os
import random
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_vllm_model import (  # noqa: E402,F401
    NEW,
    assert_all_ok,
    assert_no_leak,
    harness,
    make,
    nodes,
    pytestmark,
)
from test_vllm_xnode import Nodes  # noqa: E402
from vllm_model.engine import make_prompt  # noqa: E402
from vllm_model.objects import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    RequestStatus,
    SlidingWindowSpec,
)

torch = pytest.importorskip("torch")

W, BS = 128, 16
HYBRID = dict(sliding_window=W, layers=4, block_size=BS, num_blocks=160)
# prompts below, at and well past the window
LENGTHS = (17, 100, 127, 128, 129, 200, 333, 600)


def cdiv(a, b):
    return -(-a // b)


def expected_bytes(h, lengths, hybrid: bool) -> int:
    """Bytes a D rank receives: per request, every block of the prompt in
    the full-attention layers, the blocks the window reaches in the
    sliding ones (all blocks in every layer without the hybrid manager)."""
    s = h.D.spec
    per_layer_block = BS * s.heads * 2 * s.head_dim * 2  # int16 K and V
    full = s.layers // 2
    total = 0
    for n in lengths:
        nb = cdiv(n, BS)
        if hybrid:
            skip = max(0, n - W + 1) // BS
            total += per_layer_block * (full * nb + (s.layers - full) *
                                        (nb - skip))
        else:
            total += per_layer_block * s.layers * nb
    return total


def moved_bytes(inst) -> int:
    """What the connector's workers say they moved (its stats, every rank
    aggregated as vLLM does)."""
    return sum(sum(d.get("bytes_transferred", ())) for d in inst.kv_stats_data)


def hybrid_on(h) -> None:
    """vLLM's hybrid KV cache manager is on at both ends (two groups):
    it is only for a connector that implements SupportsHMA."""
    for inst in (h.P, h.D):
        assert inst.sched.num_kv_cache_groups == 2, \
            "vLLM's hybrid KV cache manager is off (connector not HMA?)"


def run(make, version, lengths, seed, **kw):
    h = make(version, **kw)
    hybrid_on(h)
    rng = random.Random(seed)
    for i, n in enumerate(lengths):
        h.submit("r%d" % i, make_prompt(rng, n))
    h.run(90)
    return h


@pytest.mark.parametrize("version,sched", [(NEW, "sync"), ("0.30", "sync"),
                                           (NEW, "async")])
def test_hybrid_basic(make, nodes, version, sched):
    """P TP 1 -> D TP 1: two KV cache groups in use at both ends, every
    in-window byte of every layer intact at D, exactly the in-window blocks
    moved (a sliding-window group's skipped blocks are not), nothing left
    behind. Sync and async scheduling."""
    h = run(make, version, LENGTHS, 31, async_scheduling=sched == "async",
            **HYBRID)
    assert_all_ok(h, len(LENGTHS))
    assert moved_bytes(h.D) == expected_bytes(h, LENGTHS, True)
    # P's params name the groups and each group's blocks
    for rid, params in h.handed.items():
        assert params["kv_cache_groups"] == [0, W]
        n = len(h.prompts[rid])
        full, sw = params["remote_block_ids"]
        assert len(full) == cdiv(n, BS)
        assert len(sw) == cdiv(n, BS) - max(0, n - W + 1) // BS
        assert 0 not in full and 0 not in sw
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("ptp,dtp", [(2, 1), (1, 2)], ids=["2to1", "1to2"])
def test_hybrid_heterogeneous_tp(make, nodes, ptp, dtp):
    """P TP 2 -> D TP 1 and 1 -> 2 (8 KV heads in all): each group's part
    splits heads as a one-group transfer does; every byte checked on every
    D rank."""
    lengths = (40, 150, 300)
    h = run(make, NEW, lengths, 32, p=dict(tp=ptp, heads=8 // ptp),
            d=dict(tp=dtp, heads=8 // dtp), **HYBRID)
    assert_all_ok(h, len(lengths))
    assert_no_leak(h, nodes)


def test_hybrid_chunked_prefill_and_preempt_p(make, nodes):
    """P prefills in chunks of 32 tokens (its sliding-window group frees
    blocks between chunks) and one request is preempted mid-prefill (V2:
    it comes back in scheduled_new_reqs with all its groups' blocks): the
    save follows every group's list; D gets every in-window byte."""
    h = make(NEW, p=dict(max_num_batched_tokens=40,
                         long_prefill_token_threshold=32), **HYBRID)
    hybrid_on(h)
    rng = random.Random(33)
    lengths = (180, 260, 300)
    for i, n in enumerate(lengths):
        h.submit("r%d" % i, make_prompt(rng, n))

    def mid_chunk(h):
        r = h.P.sched.requests.get("r1")
        return r is not None and r.status == RequestStatus.RUNNING and \
            r.is_prefill_chunk and r.num_computed_tokens >= 160

    h.at(mid_chunk, lambda h: h.P.sched.preempt("r1"))
    h.run(90)
    assert any(e[0] == "preempt" and e[2] == "r1" for e in h.P.sched.events)
    assert_all_ok(h, 3)
    assert moved_bytes(h.D) == expected_bytes(h, lengths, True)
    assert_no_leak(h, nodes)


def test_hybrid_abort_at_d_during_load(make, nodes):
    """D drops a request while its two group parts are in flight: it is
    reported once (vLLM frees its blocks then), the others load intact."""
    h = make(NEW, **HYBRID)
    hybrid_on(h)
    rng = random.Random(34)
    for i in range(4):
        h.submit("r%d" % i, make_prompt(rng, 150 + 40 * i), d_max_tokens=4)

    def loading(h):
        r = h.D.sched.requests.get("d-r2")
        return r is not None and \
            r.status == RequestStatus.WAITING_FOR_REMOTE_KVS

    h.at(loading, lambda h: h.D.abort(["d-r2"]))
    h.run(60)
    assert h.D.sched.finished.get("d-r2") == RequestStatus.FINISHED_ABORTED
    res = h.d_results()
    others = {k: v for k, v in res.items() if k != "d-r2"}
    assert others and all(v == "ok" for v in others.values()), others
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_hybrid_p_dies(make, nodes, policy):
    """P's broker is SIGKILLed while loads are in flight. With two KV cache
    groups vLLM cannot take failed block ids (the model raises as vLLM does):
    D reports failed loads per request (failed_recving), its engine lives,
    the requests end (recomputed, or FINISHED_ERROR), nothing leaks."""
    h = make(NEW, d=dict(transfer_timeout_s=3.0,
                         kv_load_failure_policy=policy), **HYBRID)
    hybrid_on(h)
    rng = random.Random(35)
    for i in range(8):
        h.submit("r%d" % i, make_prompt(rng, rng.randint(60, 300)))
    h.at(lambda h: len(h.handed) >= 3, lambda h: nodes.kill_broker("a"))
    h.run(60)
    assert not h.D.dead, h.D.dead
    res = h.d_results()
    assert res and all(v in ("ok", "load_error") for v in res.values()), res
    assert any(v == "load_error" for v in res.values()), res
    assert not any(e[0] == "invalid_blocks" for e in h.D.sched.events)
    assert any(e[0] == "failed_recving" for e in h.D.sched.events)
    assert not h.D.sched.requests
    assert h.D.sched.num_free_blocks() == h.D.spec.num_blocks - 1
    want = (RequestStatus.FINISHED_ERROR if policy == "fail" else
            RequestStatus.FINISHED_LENGTH_CAPPED)
    for rid, v in res.items():
        if v == "load_error":
            assert h.D.sched.finished.get(rid) == want, (rid, policy)


def test_hybrid_saving(capsys):
    """The figure: bytes a D rank receives for the same prompts with the
    hybrid KV cache manager (sliding-window layers move only their window)
    and without it (vLLM's all-layers-full-attention fallback: every block
    of every layer). Both intact; hybrid moves exactly the in-window count,
    less than the fallback. (Fresh nodes for each: workers of the same
    ranks attaching again to the same brokers are not what this tests.)"""
    lengths = (256, 1024, 2048)
    kw = dict(HYBRID, num_blocks=300)
    got = {}
    for hybrid in (True, False):
        n = Nodes()
        h = None
        try:
            h = harness(n, NEW, disable_hybrid_kv_cache_manager=not hybrid,
                        **kw)
            rng = random.Random(36)
            for i, k in enumerate(lengths):
                h.submit("r%d" % i, make_prompt(rng, k))
            h.run(90)
            assert h.D.sched.num_kv_cache_groups == (2 if hybrid else 1)
            assert_all_ok(h, len(lengths))
            got[hybrid] = moved_bytes(h.D)
            assert got[hybrid] == expected_bytes(h, lengths, hybrid)
            assert_no_leak(h, n)
        finally:
            if h is not None:
                h.close()
            n.close()
    assert got[True] < got[False]
    with capsys.disabled():
        print("\nhybrid-bytes: prompts %s tokens, window %d, block %d, %d "
              "layers (half sliding): hybrid %d bytes, all-full %d bytes, "
              "ratio %.3f" % (list(lengths), W, BS, kw["layers"], got[True],
                              got[False], got[True] / got[False]))


def test_checker_catches_unmoved_sliding_layers(make, nodes):
    """The test's own check: with P's sliding-window layer ops dropped but
    the last, D's other sliding layers do not hold P's bytes and the
    verification says so. (One op is kept: a part with no layer op at all
    may end at P before D's announcement arrives, and D then fails its
    load instead of receiving too little, depending on timing.)"""
    from kvbroker.vllm import KVBrokerConnector

    class Broken(KVBrokerConnector):
        def register_kv_caches(self, kv_caches):
            super().register_kv_caches(kv_caches)
            w = self._worker
            if w is not None and w.producer:
                keep = [p for p in w._pairs if p[0] == 1][-1]
                w._pairs = [p for p in w._pairs if p[0] == 0 or p == keep]
                orig = w._submit

                def submit(group, layer):
                    if group == 0 or (group, layer) == keep:
                        orig(group, layer)
                w._submit = submit

    h = make(NEW, p=dict(connector_cls=Broken), **HYBRID)
    hybrid_on(h)
    rng = random.Random(37)
    h.submit("r0", make_prompt(rng, 200))
    h.run(60)
    res = h.d_results()
    assert res["d-r0"] not in ("ok", "unchecked", "load_error"), res
    assert "layer 0 (group 1)" in res["d-r0"], res


# ------------------------------------------------------- configuration


def _cfg(role):
    from vllm_model.engine import InstanceSpec

    return InstanceSpec(role, NEW, socket="/nonexistent",
                        host_ip="127.0.0.1").vllm_config(0)


@pytest.mark.parametrize("role", ["P", "D"])
def test_mamba_group_refused(role):
    """A Mamba (linear-attention state) group: the connector refuses at
    construction, in the scheduler and in a worker, saying what is missing;
    so does chunked local attention's kind of unknown group."""
    from kvbroker.vllm import KVBrokerConnector
    from kvbroker.vllm._compat import KVConnectorRole

    kcc = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["model.layers.0.self_attn.attn"],
                         FullAttentionSpec(block_size=16, num_kv_heads=4,
                                           head_size=32, dtype="int16")),
        KVCacheGroupSpec(["model.layers.1.mixer"],
                         MambaSpec(block_size=16, shapes=((4, 64),),
                                   dtypes=("int16",)))])
    for r in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        with pytest.raises(ValueError, match="Mamba / linear-attention") \
                as ei:
            KVBrokerConnector(_cfg(role), r, kcc)
        assert "MambaSpec" in str(ei.value)
        assert "not supported" in str(ei.value)


def test_groups_parsed():
    """Full attention (with or without a sliding_window left by the
    all-full fallback) moves every block; SlidingWindowSpec only its
    window; the connector implements SupportsHMA on this interface."""
    from kvbroker.vllm import KVBrokerConnector
    from kvbroker.vllm._compat import supports_hma
    from kvbroker.vllm._groups import parse_groups, skipped_blocks

    kw = dict(block_size=16, num_kv_heads=4, head_size=32, dtype="int16")
    g = parse_groups(KVCacheConfig(64, [], [
        KVCacheGroupSpec(["a"], FullAttentionSpec(**kw, sliding_window=128)),
        KVCacheGroupSpec(["b"], SlidingWindowSpec(**kw, sliding_window=128))]))
    assert [x.window for x in g] == [0, 128]
    assert parse_groups(None) == []
    assert skipped_blocks(128, 2048, 16) == 120
    assert skipped_blocks(128, 128, 16) == 0
    assert skipped_blocks(128, 144, 16) == 1
    assert skipped_blocks(0, 2048, 16) == 0
    assert supports_hma(KVBrokerConnector)


def _hybrid_kcc(names=("model.layers.0.self_attn.attn",
                       "model.layers.1.self_attn.attn")):
    kw = dict(block_size=16, num_kv_heads=4, head_size=32, dtype="int16")
    return KVCacheConfig(64, [], [
        KVCacheGroupSpec([names[1]], FullAttentionSpec(**kw)),
        KVCacheGroupSpec([names[0]], SlidingWindowSpec(**kw,
                                                       sliding_window=W))])


class _Blocks:
    def __init__(self, groups):
        self.groups = groups

    def get_block_ids(self):
        return tuple(list(g) for g in self.groups)


def test_scheduler_d_refuses_other_groups():
    """D refuses (logged, counted, computed locally) a request whose P
    names other KV cache groups, or none (a P that moves one group)."""
    from kvbroker.vllm import KVBrokerConnector
    from kvbroker.vllm._compat import KVConnectorRole
    from vllm_model.objects import Request

    c = KVBrokerConnector(_cfg("D"), KVConnectorRole.SCHEDULER,
                          _hybrid_kcc())
    base = {"do_remote_prefill": True, "transfer_id": "t",
            "remote_host": "192.0.2.1", "remote_handshake_port": 6301}
    for i, groups in enumerate(([0], [0, 64], None, "x")):
        p = dict(base, transfer_id="t%d" % i)
        if groups is not None:
            p["kv_cache_groups"] = groups
        r = Request("d%d" % i, list(range(1, 200)), 2, p)
        assert c.get_num_new_matched_tokens(r, 0) == (0, False)
    assert c.connector_stats()["bad_params"] == 4
    ok = Request("ok", list(range(1, 200)), 2,
                 dict(base, transfer_id="tok", kv_cache_groups=[0, W]))
    assert c.get_num_new_matched_tokens(ok, 0) == (199, True)
    # its load: every full-attention block, the in-window sliding ones
    # (null blocks skipped)
    nb = cdiv(199, BS)
    skip = (199 - W + 1) // BS
    full = list(range(100, 100 + nb))
    sw = [0] * skip + list(range(200, 200 + nb - skip))
    c.update_state_after_alloc(ok, _Blocks([full, sw]), 199)
    meta = c.build_connector_meta(type("SO", (), {})())
    (m,) = meta.reqs_to_load
    assert m.group_block_ids == [full, sw[skip:]]
    assert m.block_ids == full


def test_scheduler_p_saves_in_window_and_checks_finish():
    """P saves, per group, every full-attention block and the sliding
    blocks the window of the prompt's next token reaches; if vLLM freed a
    block the save reads before request_finished_all_groups, nothing is
    handed to D and the save is aborted."""
    from kvbroker.vllm import KVBrokerConnector
    from kvbroker.vllm._compat import KVConnectorRole
    from vllm_model.objects import (CachedRequestData, Request,
                                    SchedulerOutput)

    c = KVBrokerConnector(_cfg("P"), KVConnectorRole.SCHEDULER,
                          _hybrid_kcc())
    n = 300
    nb, skip = cdiv(n, BS), (n - W + 1) // BS
    params = {"do_remote_decode": True, "remote_host": "192.0.2.2",
              "remote_handshake_port": 6301}
    reqs = {}
    for rid in ("a", "b"):
        r = Request(rid, list(range(1, n + 1)), 1,
                    dict(params, transfer_id="tx-" + rid))
        c.on_new_request(r)
        reqs[rid] = r
        off = 1000 if rid == "a" else 2000
        full = list(range(off, off + nb))
        sw = list(range(off + 500, off + 500 + nb))
        c.update_state_after_alloc(r, _Blocks([full, sw]), 0)
    so = SchedulerOutput([], CachedRequestData(), {"a": n, "b": n}, 2 * n)
    meta = c.build_connector_meta(so)
    assert sorted(meta.expect) == ["tx-a", "tx-a#g1", "tx-b", "tx-b#g1"]
    saves = {m.req_id: m for m in meta.reqs_to_save}
    sw_a = list(range(1500 + skip, 1500 + nb))
    assert saves["a"].group_block_ids == [list(range(1000, 1000 + nb)),
                                          sw_a]
    for r in reqs.values():
        r.num_computed_tokens = n
    # a: vLLM nulled exactly the out-of-window blocks: params for D
    full_a = list(range(1000, 1000 + nb))
    held_a = [0] * skip + sw_a
    delay, p = c.request_finished_all_groups(reqs["a"], (full_a, held_a))
    assert delay is True and p["remote_block_ids"] == [full_a, sw_a]
    assert p["kv_cache_groups"] == [0, W]
    # b: one block its save reads is gone: no params, the save aborts
    full_b = list(range(2000, 2000 + nb))
    held_b = [0] * (skip + 1) + list(range(2500 + skip + 1, 2500 + nb))
    delay, p = c.request_finished_all_groups(reqs["b"], (full_b, held_b))
    assert delay is True and p is None
    meta = c.build_connector_meta(SchedulerOutput([], CachedRequestData(),
                                                  {}, 0))
    assert meta.reqs_to_abort == ["b"]


def test_no_hma_without_failed_recving():
    """A vLLM without KVConnectorTransferResults (0.25 - 0.29): the class
    does not implement SupportsHMA (vLLM turns its hybrid manager off) and
    refuses several groups at construction, saying why."""
    code = r"""
import sys
sys.path.insert(0, %r)
import importlib
import kvbroker.vllm._compat as C
import kvbroker.vllm.connector as M
C.KVConnectorTransferResults = None  # as under vLLM 0.25 - 0.29
M = importlib.reload(M)  # the class is defined anew against it
KVBrokerConnector, hma_supported = M.KVBrokerConnector, M.hma_supported
from test_vllm_hybrid import _cfg, _hybrid_kcc
assert not hma_supported()
assert not C.supports_hma(KVBrokerConnector)
try:
    KVBrokerConnector(_cfg("P"), C.KVConnectorRole.SCHEDULER, _hybrid_kcc())
except ValueError as e:
    assert "failed_recving" in str(e), e
    print("refused:", e)
else:
    raise SystemExit("not refused")
""" % HERE
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60, cwd=HERE)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused:" in out.stdout


@pytest.mark.parametrize("role", ["P", "D"])
def test_transfer_id_room_for_groups(role):
    """With two groups a transfer id must leave room for the sub-transfer
    suffix and must not look like another request's part: refused (logged,
    counted; D computes the prompt itself, matching no tokens)."""
    from kvbroker.vllm import KVBrokerConnector
    from kvbroker.vllm._compat import KVConnectorRole
    from vllm_model.objects import Request

    c = KVBrokerConnector(_cfg(role), KVConnectorRole.SCHEDULER,
                          _hybrid_kcc())
    key = "do_remote_decode" if role == "P" else "do_remote_prefill"
    for i, tid in enumerate(("x" * 254, "a#g1")):
        r = Request("r%d" % i, list(range(1, 100)), 1,
                    {key: True, "transfer_id": tid, "kv_cache_groups": [0, W],
                     "remote_host": "192.0.2.9",
                     "remote_handshake_port": 6301})
        if role == "D":
            assert c.get_num_new_matched_tokens(r, 0) == (0, False)
        else:
            c.update_state_after_alloc(r, _Blocks([[1] * 7, [2] * 7]), 0)
    assert c.connector_stats()["bad_params"] == 2
    ok = Request("ok", list(range(1, 100)), 1,
                 {key: True, "transfer_id": "x" * 252,
                  "kv_cache_groups": [0, W], "remote_host": "192.0.2.9",
                  "remote_handshake_port": 6301})
    if role == "D":
        assert c.get_num_new_matched_tokens(ok, 0) == (99, True)
    else:
        c.update_state_after_alloc(ok, _Blocks([[1] * 7, [2] * 7]), 0)
    assert c.connector_stats()["bad_params"] == 2


def test_hybrid_block_major_refused(make, nodes):
    """Block-major views (BLNHC: a block row holds every layer's page) with
    two groups: one group's block ids would move the other's pages of the
    row; the worker refuses at register_kv_caches, saying what to set
    (here the shared tensors already break the row's page order)."""
    from vllm_model.engine import WorkerDied

    with pytest.raises(WorkerDied, match=r"LayoutError: .*block-major.*"
                       r"\(set VLLM_KV_CACHE_LAYOUT=LBNHC\)"):
        make(NEW, layout="BLNHC", **HYBRID)


def test_hybrid_prefix_hit_at_d(make, nodes):
    """D already holds the prompt's first blocks in its prefix cache, in
    both groups (from a request it computed itself): the hit is cut to what
    the sliding-window group still serves (its window's blocks before the
    hit's end); only D's unhashed blocks of each group are filled (P writes
    its last ones into them), D's own blocks come out unchanged."""
    prefix_hit_at_d(make, nodes, 38)


def prefix_hit_at_d(make, nodes, seed, **kw):
    """test_hybrid_prefix_hit_at_d's scenario (kw: the instances' further
    settings)."""
    h = make(NEW, **HYBRID, **kw)
    hybrid_on(h)
    rng = random.Random(seed)
    prefix = make_prompt(rng, 200)
    h.submit_d_local("local", prefix + make_prompt(rng, 30))
    h.run(30)
    prompt = prefix + make_prompt(rng, 100)
    h.submit("r0", prompt, d_max_tokens=3)
    h.run(60)
    assert h.D.sched.local_hits.get("d-r0") == 192, h.D.sched.local_hits
    assert_all_ok(h, 1)
    n, nloc = len(prompt), 192 // BS
    skip = max(0, n - W + 1) // BS
    s = h.D.spec
    per_layer_block = BS * s.heads * 2 * s.head_dim * 2
    want = per_layer_block * (2 * (cdiv(n, BS) - nloc) +
                              2 * (cdiv(n, BS) - max(nloc, skip)))
    assert moved_bytes(h.D) == want
    assert_no_leak(h, nodes)
