#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Broker CPU per descriptor against the number of P workers.

One `kvbench rate --workers W --seconds S` per W (tiny unsignaled writes,
as fast as the rings take them). The figure is the broker process's own
CPU time over the measured window (/proc/<pid>/stat: user + system, all its
threads) divided by the descriptors it completed in that window (its
STATS): the broker's cost per descriptor, not the machine's. The goal is
flat: every W within +-20% of the median over W. Each W runs against
two brokers in turn: the default one and one with --busy-poll-us 0 (no
idle spinning counted in its CPU).

Writes OUT.json and OUT.md (the table and the command).

  /usr/bin/python3 bench/rate_workers.py [--build build] [--out bench/results/rate-workers]
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

GOAL = 0.20
VARIANTS = ["", "--busy-poll-us 0"]  # the default broker, one that never spins


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="bench/results/rate-workers")
    ap.add_argument("--workers", default="1,2,4,8,16,32,64")
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=180,
                    help="seconds one kvbench run may take")
    a = ap.parse_args()
    kvbench = os.path.join(a.build, "bench/kvbench/kvbench")
    if not os.access(kvbench, os.X_OK):
        sys.exit(f"rate_workers: no {kvbench} (make build)")
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    ncpu = os.cpu_count()
    t0 = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for w in [int(x) for x in a.workers.split(",")]:
            # the two brokers alternate, W by W
            for v, opts in enumerate(VARIANTS):
                rows.append(run(a, kvbench, tmp, w, v, opts))
                print(json.dumps(rows[-1]), flush=True)
    took = time.monotonic() - t0
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump({"started": started, "seconds": took, "rows": rows}, f,
                  indent=1)
    with open(a.out + ".md", "w") as f:
        f.write(render(a, rows, started, took, ncpu))
    print(f"rate_workers: wrote {a.out}.json, .md in {took:.0f} s")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


def run(a, kvbench, tmp, w, v, opts):
    js = os.path.join(tmp, f"{w}-{v}.json")
    cmd = [kvbench, "rate", "--workers", str(w), "--seconds", str(a.seconds),
           "--json", js]
    if opts:
        cmd += ["--broker-opts", opts]
    s0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=a.timeout)
        rc, err = p.returncode, p.stderr.strip()
    except subprocess.TimeoutExpired:
        rc, err = "timeout", f"no end within {a.timeout:g} s"
    row = {"workers": w, "variant": v, "broker_opts": opts, "rc": rc,
           "run_s": time.monotonic() - s0}
    if rc == 0:
        r = json.load(open(js))["rate"]
        row.update(descs=r["descriptors"], mps=r["msg_rate_mps"],
                   broker_cpu_s=r["broker_cpu_s"], window_s=r["seconds"],
                   ns_per_desc=r["broker_cpu_s"] * 1e9 / r["descriptors"]
                   if r["descriptors"] else None, ring_full=r["ring_full"])
    else:
        row["error"] = err.splitlines()[-1:] if err else []
    return row


def render(a, rows, started, took, ncpu):
    med = {}
    for v in range(len(VARIANTS)):
        x = [r["ns_per_desc"] for r in rows if r["variant"] == v
             and r.get("ns_per_desc")]
        med[v] = statistics.median(x) if x else None

    def cell(r):
        if not r or r["rc"] != 0:
            return f"run failed ({r['rc'] if r else '-'})", ""
        dev = r["ns_per_desc"] / med[r["variant"]] - 1
        mark = "" if abs(dev) <= GOAL else " (outside)"
        return (f"{r['mps']:.2f} | {r['broker_cpu_s']:.2f} | "
                f"{r['ns_per_desc']:.1f}", f"{dev * 100:+.0f}%{mark}")

    lines = [
        "## Broker CPU per descriptor, 1 to 64 workers\n",
        f"`bench/rate_workers.py`, {started} UTC, {took:.0f} s in all, on "
        f"this {ncpu}-CPU VM shared with other jobs. One `kvbench rate "
        f"--workers W --seconds {a.seconds}` per W and broker: W P worker "
        "processes submit 64-byte unsignaled writes in bursts of 64 as fast "
        "as their rings take them. cpu/desc = the broker process's own CPU "
        "time in the measured window (/proc/<pid>/stat, all its threads) / "
        "the descriptors it completed in that window: the broker's cost, "
        "not the machine's. Two brokers, alternating W by W: the default "
        "(it spins --busy-poll-us 50 idle before sleeping) and "
        "`--busy-poll-us 0` (it sleeps at once: no idle spinning in its "
        "CPU time). Goal: flat, within +-20% of the median over W.\n",
        "| workers | default: Mdesc/s | broker CPU [s] | cpu/desc [ns] | vs "
        "median | no spin: Mdesc/s | broker CPU [s] | cpu/desc [ns] | vs "
        "median |",
        "|---|---|---|---|---|---|---|---|---|"]
    for w in [int(x) for x in a.workers.split(",")]:
        cells = []
        for v in range(len(VARIANTS)):
            r = next((r for r in rows if r["workers"] == w and
                      r["variant"] == v), None)
            cells += list(cell(r))
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Medians: " + ", ".join(
        f"{'default' if v == 0 else 'no spin'} {m:.1f} ns"
        for v, m in med.items() if m))
    lines += ["", "```",
              "/usr/bin/python3 " + " ".join(
                  shlex.quote(x) for x in ["bench/rate_workers.py"] +
                  sys.argv[1:]),
              "# each W: build/bench/kvbench/kvbench rate --workers W "
              f"--seconds {a.seconds} --json FILE [--broker-opts "
              "'--busy-poll-us 0']", "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
