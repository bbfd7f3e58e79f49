#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""What KVBrokerConnector.save_kv_layer costs in Python, against live brokers.

A P worker connector (32 layers of KV cache in broker memory) saves
`--requests` requests of `--blocks` blocks each per step, as vLLM calls it:
bind_connector_metadata (opens the step's transfers, one round trip),
start_load_kv (nothing left to do for P), save_kv_layer once per layer (one
layer op per request goes into the submission ring; no copy), wait_for_save
(seals). Each call is timed. The broker is real; its peer is a second
broker on loopback that no D worker announces to, so the layer ops wait in
P's broker (deferred, --defer-timeout 300) and are aborted after each step:
what is measured is the Python side, not the network. An empty step (bind,
start_load_kv, wait_for_save with nothing to do) is timed too.

Then a D worker connector loads `--requests` requests per step from a P
broker that does not answer (127.0.0.3, nobody listening): its
start_load_kv (which opens D's loads) must not wait for the handshake.

    bench/python/save_kv_layer_bench.py [--build build] [--steps 30]
        [--requests 64] [--blocks 16] [--json out.json] [--md out.md]

Prints min / p50 / p99 of one save_kv_layer call and per request.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

GOAL_US = 20.0


def start_broker(build, tmp, name, ip, hs, notify):
    sock = os.path.join(tmp, name + ".sock")
    log = open(os.path.join(tmp, name + ".log"), "wb")
    p = subprocess.Popen(
        [os.path.join(build, "broker", "kvbroker"), "--socket", sock,
         "--host-ip", ip, "--transport", "tcp", "--handshake-port", str(hs),
         "--notify-port", str(notify), "--defer-timeout", "300",
         "--transfer-timeout", "300", "--busy-poll-us", "20"],
        stdout=log, stderr=log)
    end = time.monotonic() + 20
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > end:
            raise SystemExit("broker %s did not start (%s)" % (name, tmp))
        time.sleep(0.05)
    return p, sock


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def d_loads_from_dead_peer(a, sock, vd, Connector, Role, torch, kvbroker):
    """D: --requests loads per step from 127.0.0.3:16399 (no broker there)
    for 5 steps; the time bind_connector_metadata + start_load_kv take, and
    when the last load was reported (failed: the handshake gets no answer)."""
    extra = {"broker_socket": sock, "host_ip": "127.0.0.1",
             "handshake_port": 16331, "notify_port": 16340,
             "transfer_timeout_s": 300}
    cfg = vd.make_config("kv_consumer", extra)
    w = Connector(cfg, Role.WORKER, None)
    s = Connector(cfg, Role.SCHEDULER, None)
    nb = a.requests * 4
    r = w.broker_client.alloc(2 * nb * 16 * 64 * 2, kvbroker.MEM_REMOTE_WRITE)
    w.register_kv_caches({"model.layers.0.attn": r.as_torch(
        torch.int16, (2, nb, 16, 1, 64))})
    times, binds, want, got = [], [], set(), set()
    t_start = time.monotonic()
    for step in range(5):
        for i in range(a.requests):
            rid = "d%d-r%d" % (step, i)
            req = vd.Request(rid, 64, {
                "do_remote_prefill": True, "transfer_id": "tx-" + rid,
                "remote_host": "127.0.0.3", "remote_handshake_port": 16399})
            s.get_num_new_matched_tokens(req, 0)
            s.update_state_after_alloc(req, vd.KVCacheBlocks(
                list(range(i * 4, i * 4 + 4))), 64)
            want.add(rid)
        meta = s.build_connector_meta(vd.SchedulerOutput())
        t0 = time.perf_counter()
        w.bind_connector_metadata(meta)
        t1 = time.perf_counter()
        w.start_load_kv(None)
        binds.append(t1 - t0)
        times.append(time.perf_counter() - t1)
        _, recv = w.get_finished(set())
        got |= recv or set()
        w.clear_connector_metadata()
    end = time.monotonic() + 30
    while got != want and time.monotonic() < end:
        _, recv = w.get_finished(set())
        got |= recv or set()
        time.sleep(0.005)
    assert got == want, "%d of %d loads reported" % (len(got), len(want))
    errs = w.get_block_ids_with_load_errors()
    assert errs, "the failed loads' blocks are not load errors"
    took = time.monotonic() - t_start
    w.shutdown()
    return {"open_ms_p50": pct(times, 0.5) * 1000,
            "open_ms_max": max(times) * 1000,
            "bind_ms_p50": pct(binds, 0.5) * 1000, "all_failed_s": took}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--no-burst", action="store_true",
                    help="one binding call per request (no kvb_submit_layers)")
    ap.add_argument("--full-graph", action="store_true",
                    help="no save_kv_layer calls (a FULL CUDA graph replay "
                    "skips the hooks): wait_for_save queues every layer")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    os.environ.setdefault("KVBROKER_LIB", os.path.join(
        a.build, "client", "libkvbroker.so.0"))

    import torch

    import kvbroker
    import vllm_doubles as vd
    from kvbroker.vllm import KVBrokerConnector
    from kvbroker.vllm._compat import KVConnectorRole

    tmp = tempfile.mkdtemp(prefix="kvb-slb.")
    procs = []
    try:
        pa, sock_a = start_broker(a.build, tmp, "a", "127.0.0.1", 16331, 16340)
        procs.append(pa)
        pb, _ = start_broker(a.build, tmp, "b", "127.0.0.2", 16332, 16440)
        procs.append(pb)
        extra = {"broker_socket": sock_a, "host_ip": "127.0.0.1",
                 "handshake_port": 16331, "notify_port": 16340,
                 "transfer_timeout_s": 300}
        cfg = vd.make_config("kv_producer", extra)
        w = KVBrokerConnector(cfg, KVConnectorRole.WORKER, None)
        s = KVBrokerConnector(cfg, KVConnectorRole.SCHEDULER, None)
        nb = a.requests * a.blocks
        shape = (2, nb, 16, 1, 64)  # 2 KiB per block and K/V
        kv = {}
        for li in range(a.layers):
            r = w.broker_client.alloc(2 * nb * 16 * 64 * 2,
                                      kvbroker.MEM_REMOTE_READ, li)
            kv["model.layers.%d.attn" % li] = r.as_torch(torch.int16, shape)
        w.register_kv_caches(kv)
        if a.no_burst:
            w._worker._burst = None
        names = list(kv)
        per_call, opens, starts, waits, empty = [], [], [], [], []
        saves_step = []  # per step: all save_kv_layer calls + wait_for_save
        for step in range(a.steps):
            reqs = []
            for i in range(a.requests):
                rid = "s%d-r%d" % (step, i)
                r = vd.Request(rid, 16 * a.blocks, {
                    "do_remote_decode": True, "transfer_id": "tx-" + rid,
                    "remote_host": "127.0.0.2",
                    "remote_handshake_port": 16332})
                s.update_state_after_alloc(r, vd.KVCacheBlocks(
                    list(range(i * a.blocks, (i + 1) * a.blocks))), 0)
                reqs.append(r)
            meta = s.build_connector_meta(vd.SchedulerOutput(
                {r.request_id: r.num_prompt_tokens for r in reqs}))
            t0 = time.perf_counter()
            w.bind_connector_metadata(meta)
            opens.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            w.start_load_kv(None)
            starts.append(time.perf_counter() - t0)
            hooks_us = 0.0
            for name in names if not a.full_graph else ():
                t0 = time.perf_counter_ns()
                w.save_kv_layer(name, kv[name], None)
                per_call.append((time.perf_counter_ns() - t0) / 1000.0)
                hooks_us += per_call[-1]
            t0 = time.perf_counter()
            w.wait_for_save()
            waits.append(time.perf_counter() - t0)
            saves_step.append(hooks_us / 1e6 + waits[-1])
            w.clear_connector_metadata()
            t0 = time.perf_counter()  # an empty step
            w.bind_connector_metadata(s.build_connector_meta(
                vd.SchedulerOutput()))
            w.start_load_kv(None)
            w.wait_for_save()
            w.clear_connector_metadata()
            empty.append(time.perf_counter() - t0)
            for r in reqs:  # end them: aborted by the scheduler
                r.status = vd.RequestStatus.FINISHED_ABORTED
                s.request_finished(r, [])
            w.bind_connector_metadata(s.build_connector_meta(
                vd.SchedulerOutput()))
            w.start_load_kv(None)
            w.clear_connector_metadata()
            end = time.monotonic() + 30
            done = set()
            while len(done) < a.requests and time.monotonic() < end:
                sent, _ = w.get_finished({r.request_id for r in reqs})
                done |= sent or set()
                time.sleep(0.001)
            assert len(done) == a.requests, "transfers did not end"
        st = w.connector_stats()
        assert st["failed"] == st["aborted"] == a.steps * a.requests, st
        warm = per_call[len(names):] or [0.0]  # the first step warms up
        dead = d_loads_from_dead_peer(a, sock_a, vd, KVBrokerConnector,
                                      KVConnectorRole, torch, kvbroker)
        res = {
            "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
            "requests": a.requests, "blocks": a.blocks, "layers": a.layers,
            "steps": a.steps, "samples": len(warm),
            "save_kv_layer_us": {"min": min(warm), "p50": pct(warm, 0.5),
                                 "p99": pct(warm, 0.99)},
            "per_request_us_p50": pct(warm, 0.5) / a.requests,
            "bind_ms_p50": pct(opens[1:], 0.5) * 1000,
            "start_load_kv_ms_p50": pct(starts[1:], 0.5) * 1000,
            "wait_for_save_ms_p50": pct(waits[1:], 0.5) * 1000,
            "empty_step_ms_p50": pct(empty[1:], 0.5) * 1000,
            "saving_per_step_ms_p50": pct(saves_step[1:], 0.5) * 1000,
            "full_graph": a.full_graph,
            "d_dead_peer": dead,
            "goal_us": GOAL_US, "python": sys.version.split()[0],
            "burst": not a.no_burst,
            "cpus": os.cpu_count(),
        }
        w.shutdown()
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    us = res["save_kv_layer_us"]
    line = ("%ssave_kv_layer, %d requests x %d blocks, %d layers x %d steps: "
            "min %.1f us, p50 %.1f us, p99 %.1f us per call (%.2f us per "
            "request); goal %.0f us: %s\n"
            "P, per step of %d saves, p50: bind_connector_metadata (opens) "
            "%.3f ms, start_load_kv %.3f ms, wait_for_save (seals) %.3f ms; "
            "an empty step %.3f ms\n"
            "D, per step of %d loads from a P broker that does not answer, "
            "p50: bind_connector_metadata %.3f ms, start_load_kv (opens) "
            "%.3f ms (max %.3f); every load reported failed after %.2f s" % (
                "[--no-burst] " if a.no_burst else "", a.requests, a.blocks,
                a.layers, a.steps, us["min"], us["p50"], us["p99"],
                res["per_request_us_p50"], GOAL_US,
                "met" if us["p50"] <= GOAL_US else "MISSED", a.requests,
                res["bind_ms_p50"], res["start_load_kv_ms_p50"],
                res["wait_for_save_ms_p50"], res["empty_step_ms_p50"],
                a.requests, dead["bind_ms_p50"], dead["open_ms_p50"],
                dead["open_ms_max"], dead["all_failed_s"]))
    print(line)
    print("P, saving per step (every save_kv_layer + wait_for_save), p50: "
          "%.3f ms%s" % (res["saving_per_step_ms_p50"],
                         " (FULL graph: no hooks, wait_for_save queues every "
                         "layer)" if a.full_graph else " (layer hooks)"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write("| date | requests x blocks | save_kv_layer min / p50 / "
                    "p99 (us) | P bind / start_load_kv / wait_for_save / "
                    "empty step p50 (ms) | D start_load_kv (opens), dead "
                    "peer, p50 / max (ms) |\n|---|---|---|---|---|\n"
                    "| %s%s | %d x %d | %.1f / %.1f / %.1f | %.3f / %.3f / "
                    "%.3f / %.3f | %.3f / %.3f |\n" % (
                        res["date"], " (--no-burst)" if a.no_burst else "",
                        a.requests, a.blocks, us["min"], us["p50"],
                        us["p99"], res["bind_ms_p50"],
                        res["start_load_kv_ms_p50"],
                        res["wait_for_save_ms_p50"],
                        res["empty_step_ms_p50"], dead["open_ms_p50"],
                        dead["open_ms_max"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
