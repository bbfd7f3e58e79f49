#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""What KVBrokerConnector.save_kv_layer costs in Python, against live brokers.

A P worker connector (32 layers of KV cache in broker memory) saves
`--requests` requests of `--blocks` blocks each per step, as vLLM calls it:
start_load_kv (opens the step's transfers), save_kv_layer once per layer
(timed: one layer op per request goes into the submission ring; no copy),
wait_for_save (seals). The broker is real; its peer is a second broker on
loopback that no D worker announces to, so the layer ops wait in P's broker
(deferred, --defer-timeout 300) and are aborted after each step: what is
measured is the Python side, not the network.

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--no-burst", action="store_true",
                    help="one binding call per request (no kvb_submit_layers)")
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
        per_call, opens = [], []
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
            w.bind_connector_metadata(meta)
            t0 = time.perf_counter()
            w.start_load_kv(None)
            opens.append(time.perf_counter() - t0)
            for name in names:
                t0 = time.perf_counter_ns()
                w.save_kv_layer(name, kv[name], None)
                per_call.append((time.perf_counter_ns() - t0) / 1000.0)
            w.wait_for_save()
            w.clear_connector_metadata()
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
        warm = per_call[len(names):]  # the first step warms caches up
        res = {
            "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
            "requests": a.requests, "blocks": a.blocks, "layers": a.layers,
            "steps": a.steps, "samples": len(warm),
            "save_kv_layer_us": {"min": min(warm), "p50": pct(warm, 0.5),
                                 "p99": pct(warm, 0.99)},
            "per_request_us_p50": pct(warm, 0.5) / a.requests,
            "start_load_kv_ms_p50": pct(opens, 0.5) * 1000,
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
            "request); start_load_kv (opens %d transfers) p50 %.1f ms; goal "
            "%.0f us: %s" % ("[--no-burst] " if a.no_burst else "",
                             a.requests, a.blocks, a.layers, a.steps,
                             us["min"], us["p50"], us["p99"],
                             res["per_request_us_p50"], a.requests,
                             res["start_load_kv_ms_p50"], GOAL_US,
                             "met" if us["p50"] <= GOAL_US else "MISSED"))
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write("| date | requests x blocks | save_kv_layer min / p50 / "
                    "p99 (us) | per request (us) | start_load_kv p50 (ms) "
                    "|\n|---|---|---|---|---|\n| %s%s | %d x %d | %.1f / "
                    "%.1f / %.1f | %.2f | %.1f |\n" % (
                        res["date"], " (--no-burst)" if a.no_burst else "",
                        a.requests, a.blocks, us["min"],
                        us["p50"], us["p99"], res["per_request_us_p50"],
                        res["start_load_kv_ms_p50"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
