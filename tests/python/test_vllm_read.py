# SPDX-License-Identifier: MIT
"""KVBrokerConnector in READ mode (``"mode": "read"`` on both sides, as
MoRIIO names it) under the vLLM model (tests/python/vllm_model), P and D on
two "nodes" as in test_vllm_model.py: P computes and, when its request
finishes, keeps the prompt's blocks (request_finished returns True) and
hands D their ids; D's workers read them into D's unhashed blocks from
start_load_kv and release P's, whose workers then report them in
finished_sending. Every byte D read is checked against what P's forward
wrote, D's prefix-cached blocks checked untouched; at the end nothing is
left (requests, blocks, broker transfers). Needs root and ip(8).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_vllm_model import (  # noqa: E402,F401
    KVBCTL,
    NEW,
    OLD,
    _d_state,
    abort_at_p,
    assert_all_ok,
    assert_no_leak,
    make,
    nodes,
    preempt_p_mid_chunk,
    pytestmark,
    submit_many,
)
from vllm_model import versions  # noqa: E402
from vllm_model.engine import make_prompt  # noqa: E402
from vllm_model.objects import RequestStatus  # noqa: E402

READ = {"mode": "read"}


def remote(nodes, n: str) -> dict:
    out = subprocess.run([KVBCTL, "--socket", nodes.sock(n), "stats",
                          "--json"], capture_output=True, text=True,
                         timeout=10, check=True)
    return json.loads(out.stdout).get("remote") or {}


def read(make, version, **kw):
    return make(version, extra=dict(READ), **kw)


@pytest.mark.parametrize("version", [OLD, "0.29", NEW])
def test_read_basic(make, nodes, version):
    """12 requests, D reads every layer of each from P; P's broker hears
    no announcement (D announces nothing in READ mode) but a release per
    request, and P's scheduler frees each request's blocks only after it."""
    before = remote(nodes, "a")
    h = read(make, version)
    submit_many(h, 12, random.Random(41))
    h.run(40)
    assert_all_ok(h, 12)
    assert_no_leak(h, nodes)
    after = remote(nodes, "a")
    assert after.get("remote_blocks_received", 0) == \
        before.get("remote_blocks_received", 0)
    assert after["releases_received"] - \
        before.get("releases_received", 0) == 12, after
    b = remote(nodes, "b")
    assert b.get("write_done_received", 0) == 0, b
    print_figures(h, "READ %s" % version)


def print_figures(h, what):
    """D's transfers as vLLM's stats see them (open to end, per request)."""
    from kvbroker.vllm import KVBrokerConnector

    acc = None
    for data in h.D.kv_stats_data:
        st = KVBrokerConnector.build_kv_connector_stats(data)
        acc = st if acc is None else acc.aggregate(st)
    t = sorted(acc.data["transfer_duration"])
    nb = sum(acc.data["bytes_transferred"])
    sys.stderr.write(
        "%s: %d requests, %.2f MiB read and checked, transfer time p50 "
        "%.1f ms p99 %.1f ms\n" % (what, len(t), nb / 2**20,
                                  1e3 * t[len(t) // 2],
                                  1e3 * t[min(len(t) - 1,
                                              int(0.99 * len(t)))]))


@pytest.mark.parametrize("hit", ["partial", "full"])
def test_read_prefix_hit_at_d(make, nodes, hit):
    """D holds the prompt's first 3 blocks in its prefix cache: D reads
    only P's blocks at the positions after them (partial), or nothing and
    releases P's blocks (full); D's cached blocks come out unchanged."""
    h = read(make, NEW)
    rng = random.Random(7)
    prefix = make_prompt(rng, 48)
    h.submit_d_local("local", prefix + make_prompt(rng, 30))
    h.run(30)
    h.submit("r0", prefix + make_prompt(rng, 43 if hit == "partial" else 1))
    h.run(30)
    loads = [e for e in h.D.sched.events if e[0] == "async_load"]
    assert loads and loads[0][3] == 48, loads
    assert_all_ok(h, 1)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version,ptp,dtp,mla", [
    (OLD, 1, 2, False), (NEW, 2, 4, False), (NEW, 2, 1, False),
    (OLD, 4, 2, False), (NEW, 2, 1, True), (OLD, 1, 2, True),
    (NEW, 4, 2, True)],
    ids=["0.28-1to2", "0.32-2to4", "0.32-2to1", "0.28-4to2",
         "0.32-mla-2to1", "0.28-mla-1to2", "0.32-mla-4to2"])
def test_read_tp(make, nodes, version, ptp, dtp, mla):
    """TP sizes that differ, 8 KV heads in all: D TP larger, each D rank
    reads its slice of its P rank's heads (P's rank waits for the release
    of each of its D ranks); P TP larger, each D rank gathers its heads
    from its P ranks (a slice from each) and releases them all; MLA (the
    same latent on every rank), any ratio: each D rank reads the latent
    from one P rank and the P ranks no D rank reads are released. Every
    byte checked on every D rank."""
    if mla:
        h = read(make, version, mla=True, heads=1, p=dict(tp=ptp),
                 d=dict(tp=dtp))
    else:
        h = read(make, version, p=dict(tp=ptp, heads=8 // ptp),
                 d=dict(tp=dtp, heads=8 // dtp))
    submit_many(h, 6, random.Random(43), lo=20, hi=120)
    h.run(90)
    assert_all_ok(h, 6)
    assert_no_leak(h, nodes)


def test_read_hnd_split_refused(make, nodes):
    """READ with HND pages (heads outside the tokens) and heads split
    differently on the two sides (P TP 2 -> D TP 1): not a split the
    broker makes; D refuses each load (a load error, computed at D) and
    says why, and releases P's blocks at once."""
    h = read(make, NEW, layout="LBHNC", p=dict(tp=2, heads=4),
             d=dict(tp=1, heads=8))
    submit_many(h, 3, random.Random(44), lo=20, hi=80)
    t0 = time.monotonic()
    h.run(60)
    res = h.d_results()
    assert len(res) == 3 and all(v == "load_error" for v in res.values()), \
        res
    assert_no_leak(h, nodes)
    assert time.monotonic() - t0 < 20


def test_read_lease_over(make, nodes):
    """P holds a finished request's blocks for read_lease_s only (here 1 s,
    shorter than D's 2 s margin): D never reads a block P may have freed
    (each load fails at once and is computed at D), and P frees the blocks
    when the lease ends though D never released them... or at D's release.
    Nothing hangs or leaks."""
    h = make(NEW, p=dict(extra=dict(READ, read_lease_s=1)),
             d=dict(extra=dict(READ)))
    submit_many(h, 4, random.Random(45), lo=20, hi=80)
    h.run(60)
    res = h.d_results()
    assert len(res) == 4 and all(v == "load_error" for v in res.values()), \
        res
    assert_no_leak(h, nodes)


def test_read_lease_expires_at_p(make, nodes):
    """D never reads nor releases (it runs WRITE mode: a configuration
    error D refuses and says; the request is computed at D): P frees the
    blocks when its lease (2 s) ends, reported in finished_sending."""
    h = make(NEW, p=dict(extra=dict(READ, read_lease_s=2)))
    submit_many(h, 3, random.Random(46), lo=20, hi=80)
    t0 = time.monotonic()
    h.run(60)
    res = h.d_results()
    assert all(v in ("unchecked",) for v in res.values()), res
    assert h.D.sched.connector._sched.bad_params == 3
    assert_no_leak(h, nodes)
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("state", ["waiting_for_remote_kvs", "running"])
@pytest.mark.parametrize("sched", ["sync", "async"])
def test_read_abort_at_d(make, nodes, state, sched):
    """The client goes away while D reads (WAITING_FOR_REMOTE_KVS: vLLM
    waits for finished_recving) or decodes: no vLLM assert fails, the other
    requests load intact, P's blocks are freed, nothing leaks."""
    h = read(make, NEW, async_scheduling=sched == "async")
    submit_many(h, 4, random.Random(47), lo=40, hi=120, d_max_tokens=6)
    h.at(_d_state(state), lambda h: h.D.abort(["d-r2"]))
    h.run(60)
    assert h.D.sched.finished.get("d-r2") == RequestStatus.FINISHED_ABORTED
    res = h.d_results()
    others = {k: v for k, v in res.items() if k != "d-r2"}
    assert all(v == "ok" for v in others.values()), others
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version,runner", [(OLD, "v1"), (NEW, "v2")])
def test_read_preempt_p_during_chunked_prefill(make, nodes, version, runner):
    """P prefills in chunks and preempts a request mid-prefill: the hold
    opens only with its last chunk, from the blocks it holds then (the
    list followed through the preemption), and D reads every byte."""
    preempt_p_mid_chunk(make, nodes, version, runner, 53, extra=dict(READ))


@pytest.mark.parametrize("state", ["waiting", "running_chunk",
                                   "finished_sending"])
def test_read_abort_at_p(make, nodes, state):
    """The client goes away while P holds the request (waiting, mid
    prefill, or finished with its blocks held for D): nothing is reported
    for an id vLLM no longer holds, the others load intact, nothing
    leaks."""
    abort_at_p(make, nodes, NEW, state, 54, extra=dict(READ))


def test_read_full_cudagraph(make, nodes):
    """A FULL CUDA graph (no layer hooks run): READ mode needs none, P does
    nothing per layer and D reads from start_load_kv."""
    h = read(make, NEW, cudagraph="full")
    submit_many(h, 6, random.Random(48))
    h.run(40)
    assert_all_ok(h, 6)
    assert_no_leak(h, nodes)


@pytest.mark.parametrize("version", [OLD, NEW])
def test_read_preempt_d(make, nodes, version):
    """D short of blocks: requests wait and are preempted while others
    read; every load that ran is intact and nothing leaks."""
    h = read(make, version, d=dict(num_blocks=24))
    submit_many(h, 8, random.Random(49), lo=40, hi=150, d_max_tokens=8)
    h.run(90)
    res = h.d_results()
    assert res and all(v in ("ok", "load_error") for v in res.values()), res
    assert sum(v == "ok" for v in res.values()) >= 4, res
    assert_no_leak(h, nodes)


# ------------------------------------------------------------ hybrid models


def _hybrid():
    import test_vllm_hybrid as th

    return th


@pytest.mark.parametrize("ptp,dtp,sched", [(1, 1, "sync"), (1, 1, "async"),
                                           (1, 2, "sync"), (2, 1, "sync")],
                         ids=["1to1", "1to1-async", "1to2", "2to1"])
def test_read_hybrid(make, nodes, ptp, dtp, sched):
    """A gpt-oss-like hybrid model (full attention + sliding window
    groups, vLLM's hybrid KV cache manager on) in READ mode: P hands D each
    group's in-window blocks, D reads each group's part into its own blocks
    at the same prompt positions; exactly the in-window bytes move and
    every one is checked on every D rank."""
    th = _hybrid()
    kw = dict(th.HYBRID)
    if ptp != 1 or dtp != 1:
        kw.update(p=dict(tp=ptp, heads=8 // ptp), d=dict(tp=dtp,
                                                          heads=8 // dtp))
    h = th.run(make, NEW, th.LENGTHS, 51, extra=dict(READ),
               async_scheduling=sched == "async", **kw)
    assert_all_ok(h, len(th.LENGTHS))
    if dtp == 1:
        assert th.moved_bytes(h.D) == th.expected_bytes(h, th.LENGTHS, True)
    for rid, params in h.handed.items():
        assert params["mode"] == "read" and params["lease_until"] > 0
        n = len(h.prompts[rid])
        full, sw = params["remote_block_ids"]
        assert len(full) == th.cdiv(n, th.BS)
        assert len(sw) == th.cdiv(n, th.BS) - max(0, n - th.W + 1) // th.BS
    assert_no_leak(h, nodes)
    print_figures(h, "READ hybrid %d->%d %s" % (ptp, dtp, sched))


def test_read_hybrid_prefix_hit_at_d(make, nodes):
    """READ, hybrid: D holds the prompt's first 12 blocks in both groups;
    it reads only the positions after them (in the sliding group, those
    the window reaches), D's own blocks come out unchanged."""
    _hybrid().prefix_hit_at_d(make, nodes, 52, extra=dict(READ))


@pytest.mark.parametrize("what", ["broker", "worker"])
def test_read_p_dies(make, nodes, what):
    """READ mode, P's broker (or a P worker process) SIGKILLed while D
    reads: D's requests still end within the bound (read or load error,
    recomputed), D's engine lives and leaks nothing."""
    h = read(make, OLD, d=dict(transfer_timeout_s=3.0))
    submit_many(h, 8, random.Random(55), lo=60, hi=160)

    def kill(h):
        if what == "broker":
            nodes.kill_broker("a")
        else:
            h.P.kill_worker(0)

    h.at(lambda h: len(h.handed) >= 3, kill)
    t0 = time.monotonic()
    h.run(60)
    assert not h.D.dead, h.D.dead
    res = h.d_results()
    assert res and all(v in ("ok", "load_error") for v in res.values()), res
    assert not h.D.sched.requests
    assert h.D.sched.num_free_blocks() == h.D.spec.num_blocks - 1
    assert time.monotonic() - t0 < 30
