#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Broker CPU per descriptor against the number of P workers.

One `kvbench rate --workers W --seconds S` per W (tiny unsignaled writes,
as fast as the rings take them). The figure is the broker process's own
CPU time over the measured window (/proc/<pid>/stat: user + system, all its
threads) divided by the descriptors it completed in that window (its
STATS): the broker's cost per descriptor, not the machine's. The goal is
flat: every W within +-20% of the 1-worker figure.

Writes OUT.json and OUT.md (the table and the command).

  /usr/bin/python3 bench/rate_workers.py [--build build] [--out bench/results/rate-workers]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

GOAL = 0.20


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
            js = os.path.join(tmp, f"{w}.json")
            cmd = [kvbench, "rate", "--workers", str(w), "--seconds",
                   str(a.seconds), "--json", js]
            s0 = time.monotonic()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True,
                                   timeout=a.timeout)
                rc, err = p.returncode, p.stderr.strip()
            except subprocess.TimeoutExpired:
                rc, err = "timeout", f"no end within {a.timeout:g} s"
            took = time.monotonic() - s0
            row = {"workers": w, "rc": rc, "run_s": took}
            if rc == 0:
                r = json.load(open(js))["rate"]
                row.update(descs=r["descriptors"], mps=r["msg_rate_mps"],
                           broker_cpu_s=r["broker_cpu_s"],
                           window_s=r["seconds"],
                           ns_per_desc=r["broker_cpu_s"] * 1e9 /
                           r["descriptors"] if r["descriptors"] else None,
                           ring_full=r["ring_full"])
            else:
                row["error"] = err.splitlines()[-1:] if err else []
            rows.append(row)
            print(json.dumps(row), flush=True)
    took = time.monotonic() - t0
    base = rows[0].get("ns_per_desc") if rows else None
    lines = [
        "## Broker CPU per descriptor, 1 to 64 workers\n",
        f"`bench/rate_workers.py`, {started} UTC, {took:.0f} s in all, on "
        f"this {ncpu}-CPU VM shared with other jobs. One `kvbench rate "
        f"--workers W --seconds {a.seconds}` per W: W P worker processes "
        "submit 64-byte unsignaled writes in bursts of 64 as fast as their "
        "rings take them. cpu/desc = the broker process's own CPU time in "
        "the measured window (/proc/<pid>/stat, all its threads) / the "
        "descriptors it completed in that window. Goal: flat, within "
        f"+-{int(GOAL * 100)}% of the 1-worker figure.\n",
        "| workers | Mdesc/s | broker CPU [s] | cpu/desc [ns] | vs 1 worker "
        "| ring full (EAGAIN) |",
        "|---|---|---|---|---|---|"]
    for r in rows:
        if r["rc"] != 0:
            lines.append(f"| {r['workers']} | run failed ({r['rc']}: "
                         f"{' '.join(r.get('error', []))}) | | | | |")
            continue
        dev = (r["ns_per_desc"] / base - 1) if base else 0
        mark = "" if abs(dev) <= GOAL else " (outside)"
        lines.append(f"| {r['workers']} | {r['mps']:.2f} | "
                     f"{r['broker_cpu_s']:.2f} | {r['ns_per_desc']:.1f} | "
                     f"{dev * 100:+.0f}%{mark} | {r['ring_full']} |")
    lines += ["", "```",
              "/usr/bin/python3 " + " ".join(
                  shlex.quote(x) for x in ["bench/rate_workers.py"] +
                  sys.argv[1:]),
              "# each W: build/bench/kvbench/kvbench rate --workers W "
              f"--seconds {a.seconds} --json FILE", "```", ""]
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump({"started": started, "seconds": took, "rows": rows}, f,
                  indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print(f"rate_workers: wrote {a.out}.json, .md in {took:.0f} s")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
