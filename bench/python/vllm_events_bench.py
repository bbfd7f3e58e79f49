#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""How long the vLLM connector takes to end requests when something goes
away, under the vLLM model (tests/python/vllm_model): a P and a D vLLM
instance (vLLM 0.32's contract) on two network namespaces, a broker in each
over tcp. Needs root and ip(8).

- p_broker_death: the proxy sends each request to P and D at once (D's
  loads wait for P's prefill, so they are in flight); P's broker is
  SIGKILLed while D waits for >= 4 loads. Measured: from the kill to the
  step in which D's scheduler holds no request waiting for remote KV any
  more (each reported as a failed load), and how many there were.
- d_drop_before_scheduled: D runs one request at a time, so the requests
  P finished queue at D; one of them is aborted at D before D scheduled it.
  D's connector sends P a release (a release-only open); measured: from
  the abort to the step in which P's scheduler freed that request's blocks
  (finished_sending).
- d_abort_while_loading: D aborts a request whose load runs (D's
  scheduler holds it in WAITING_FOR_REMOTE_KVS, P still holds its
  blocks): D's connector aborts the load, its broker releases the
  transfer at P; measured: from the abort to the step in which P's
  scheduler freed the request's blocks.

    sudo bench/python/vllm_events_bench.py [--build build] [--tries 5]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))


def env(build):
    os.environ.setdefault("KVB_BROKER_BIN",
                          os.path.join(build, "broker", "kvbroker"))
    os.environ.setdefault("KVBROKER_LIB",
                          os.path.join(build, "client", "libkvbroker.so"))


def specs(nodes, **kw):
    from vllm_model.engine import InstanceSpec

    p = dict(socket=nodes.sock("a"), host_ip="192.0.2.1")
    d = dict(socket=nodes.sock("b"), host_ip="192.0.2.2")
    p.update(kw.pop("p", {}))
    d.update(kw.pop("d", {}))
    p.update(kw)
    d.update(kw)
    return InstanceSpec("P", "0.32", **p), InstanceSpec("D", "0.32", **d)


def waiting_for_kv(h):
    from vllm_model.objects import RequestStatus

    return [r for r, q in h.D.sched.requests.items()
            if q.status == RequestStatus.WAITING_FOR_REMOTE_KVS]


def p_broker_death(Nodes, Harness, make_prompt):
    nodes = Nodes()
    h = None
    try:
        ps, ds = specs(nodes, p=dict(max_num_batched_tokens=32,
                                     long_prefill_token_threshold=32),
                       d=dict(transfer_timeout_s=90.0))
        h = Harness(ps, ds, proxy="concurrent")
        rng = random.Random(1)
        for i in range(12):
            h.submit("r%d" % i, make_prompt(rng, 160))
        killed = {}

        def kill(h):
            killed["t"] = time.monotonic()
            killed["waiting"] = len(waiting_for_kv(h))
            nodes.kill_broker("a")

        h.at(lambda h: len(waiting_for_kv(h)) >= 4, kill)

        seen: dict[str, float] = {}  # waiting at or after the kill
        ends: dict[str, float] = {}  # ... seconds from the kill to its end

        def done(h):
            if "t" not in killed:
                return False
            now = time.monotonic()
            w = set(waiting_for_kv(h))
            for r in w:
                seen.setdefault(r, now)
            for r in seen:
                if r not in w and r not in ends:
                    ends[r] = round(now - killed["t"], 3)
            return not w

        h.run(120, until=done)
        took = time.monotonic() - killed["t"]
        res = h.d_results()
        errs = sum(1 for v in res.values() if v == "load_error")
        return {"waiting_at_kill": killed["waiting"], "s": round(took, 3),
                "ends": sorted(ends.values()),
                "waiting_after_kill": sum(1 for r, t in seen.items()
                                          if t > killed["t"] + 0.05),
                "load_errors": errs, "ok": sum(1 for v in res.values()
                                               if v == "ok")}
    finally:
        if h is not None:
            h.close()
        nodes.close()


def d_drop_before_scheduled(Nodes, Harness, make_prompt):
    nodes = Nodes()
    h = None
    try:
        ps, ds = specs(nodes, d=dict(max_num_seqs=1))
        h = Harness(ps, ds)
        rng = random.Random(2)
        for i in range(6):
            h.submit("r%d" % i, make_prompt(rng, 64), d_max_tokens=40)
        from vllm_model.objects import RequestStatus

        got = {}

        def queued(h):
            r = h.D.sched.requests.get("d-r5")
            return r is not None and r.status == RequestStatus.WAITING and \
                "r5" in h.P.sched.requests

        def drop(h):
            got["t"] = time.monotonic()
            h.D.abort(["d-r5"])

        h.at(queued, drop)

        def freed(h):
            if "t" in got and "freed" not in got and \
                    "r5" not in h.P.sched.requests:
                got["freed"] = time.monotonic()
            return False

        h.run(120, until=freed)
        if "freed" not in got:
            raise RuntimeError("r5 never queued at D while P held it")
        return {"s": round(got["freed"] - got["t"], 4)}
    finally:
        if h is not None:
            h.close()
        nodes.close()


def d_abort_while_loading(Nodes, Harness, make_prompt):
    nodes = Nodes()
    h = None
    try:
        ps, ds = specs(nodes)
        h = Harness(ps, ds)
        rng = random.Random(3)
        for i in range(6):
            h.submit("r%d" % i, make_prompt(rng, 480), d_max_tokens=4)
        from vllm_model.objects import RequestStatus

        got = {}

        def loading(h):
            r = h.D.sched.requests.get("d-r4")
            return r is not None and \
                r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and \
                "r4" in h.P.sched.requests

        def drop(h):
            got["t"] = time.monotonic()
            h.D.abort(["d-r4"])

        h.at(loading, drop)

        def freed(h):
            if "t" in got and "freed" not in got and \
                    "r4" not in h.P.sched.requests:
                got["freed"] = time.monotonic()
            return False

        h.run(120, until=freed)
        if "freed" not in got:
            raise RuntimeError("r4 never loading at D while P held it")
        return {"s": round(got["freed"] - got["t"], 4)}
    finally:
        if h is not None:
            h.close()
        nodes.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    env(a.build)
    import pytest  # noqa: F401  (test_vllm_xnode skips through it)

    from test_vllm_xnode import Nodes
    from vllm_model.engine import Harness, make_prompt

    cases = ("p_broker_death", "d_drop_before_scheduled",
             "d_abort_while_loading")
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for name in cases:
        out[name] = []
    for k in range(a.tries):
        for name in cases:
            out[name].append(globals()[name](Nodes, Harness, make_prompt))
        print("try %d: %s" % (k, " / ".join(str(out[n][-1]) for n in cases)),
              flush=True)
    for name in cases:
        v = sorted(x["s"] for x in out[name])
        print("%s: p50 %.3f s, max %.3f s over %d tries" % (
            name, v[len(v) // 2], v[-1], len(v)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
