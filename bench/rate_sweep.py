#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Offered-load sweep of `kvbench workload --rate`: direct vs broker.

For each transport (local, tcp) and each offered load (requests/s over all
P workers), one `kvbench workload --mode both --repeat N` run: N trials of
each mode at the same offered load, direct and broker alternating (ABBA),
so the two modes of a point see the same machine; figures are the medians. Requests arrive on a fixed schedule (open loop: an
arrival never waits for a completion); a request that arrives while its
worker is busy waits, up to --requests of them join the worker's next step,
and the wait counts in its latency (kvbench measures from the scheduled
arrival). Past the knee the achieved rate stays at the capacity and p99
grows with the backlog: the run's length then bounds it, so each point is
short (about --seconds at the offered load).

Writes OUT.json (every point), OUT.md (the table, the knees, the command)
and OUT.png (one plot: p99 and achieved vs offered, gnuplot).

  /usr/bin/python3 bench/rate_sweep.py [--build build] [--out bench/results/rate-sweep]
"""
import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time

# offered loads (requests/s, all workers), from well below the knee of the
# slower mode to past the faster one's (probed on the 2-core dev VM)
POINTS = {
    "local": [500, 1000, 2000, 3000, 4000, 6000, 8000, 12000, 16000],
    "tcp": [100, 200, 300, 400, 600, 800, 1000, 1200, 1600, 2400],
}
KNEE_FRACTION = 0.95  # achieved >= this x offered: keeping up


def run_point(a, transport, offered, tmp):
    per_worker = offered / a.workers
    want = per_worker * a.seconds  # requests per worker
    iters = max(2, math.ceil(want / a.requests))
    js = os.path.join(tmp, f"{transport}-{offered}.json")
    cmd = [a.kvbench, "workload", "--transport", transport,
           "--workers", str(a.workers), "--layers", str(a.layers),
           "--blocks", str(a.blocks), "--block-bytes", str(a.block_bytes),
           "--requests", str(a.requests), "--iters", str(iters),
           "--rate", f"{per_worker:g}", "--no-verify", "--mode", "both",
           "--repeat", str(a.repeat), "--json", js]
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, timeout=a.timeout)
    took = time.monotonic() - t0
    rows = []
    d = json.load(open(js)) if p.returncode == 0 and os.path.exists(js) else {}
    for mode in ("direct", "broker"):
        f = d.get(mode)
        row = {"transport": transport, "mode": mode, "offered": offered,
               "requests": iters * a.requests * a.workers, "run_s": took,
               "rc": p.returncode}
        if f:
            descs_per_req = a.layers * a.blocks
            row.update(
                achieved=f["descs"] / descs_per_req / f["elapsed_s"],
                p50_ms=f["lat_p50_us"] / 1e3, p99_ms=f["lat_p99_us"] / 1e3,
                failed=f.get("failed", 0), elapsed_s=f["elapsed_s"])
        else:
            row.update(achieved=None, p50_ms=None, p99_ms=None, failed=None,
                       error=p.stderr.strip().splitlines()[-1:])
        rows.append(row)
    return rows, " ".join(shlex.quote(c) for c in cmd)


def knee(rows):
    """Highest offered load kept up with; None when not even the first."""
    k = None
    for r in sorted(rows, key=lambda r: r["offered"]):
        if r["achieved"] is None or r["failed"]:
            break
        if r["achieved"] < KNEE_FRACTION * r["offered"]:
            break
        k = r
    return k


def plot(rows, png):
    series = []
    for t in POINTS:
        for m in ("direct", "broker"):
            pts = [r for r in rows if r["transport"] == t and r["mode"] == m
                   and r["achieved"] is not None]
            if pts:
                series.append((f"{t} {m}", sorted(pts,
                                                  key=lambda r: r["offered"])))
    if not series:
        return "no points"
    data = tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False)
    for _, pts in series:
        for r in pts:
            data.write(f"{r['offered']} {r['p99_ms']} {r['achieved']} "
                       f"{r['p50_ms']}\n")
        data.write("\n\n")
    data.close()
    style = {"direct": "lw 2 dt 2", "broker": "lw 2"}
    colour = {"local": "#1f77b4", "tcp": "#d62728"}

    def plots(col):
        return ", ".join(
            f"'{data.name}' index {i} using 1:{col} with linespoints "
            f"{style[name.split()[1]]} lc rgb '{colour[name.split()[0]]}' "
            f"title '{name}'" for i, (name, _) in enumerate(series))

    script = f"""
set terminal pngcairo size 1200,480 font ',10'
set output '{png}'
set multiplot layout 1,2 title 'kvbench workload --rate: offered load sweep ({time.strftime('%Y-%m-%d', time.gmtime())})'
set logscale xy
set grid
set key top left
set xlabel 'offered load [requests/s]'
set ylabel 'p99 latency from arrival [ms]'
plot {plots(2)}
set ylabel 'achieved [requests/s]'
plot {plots(3)}, x with lines lc rgb '#999999' dt 3 title 'achieved = offered'
unset multiplot
"""
    p = subprocess.run(["gnuplot"], input=script, text=True,
                       capture_output=True)
    os.unlink(data.name)
    return None if p.returncode == 0 else p.stderr.strip()


def write_md(a, rows, knees, cmds, started, took, out_png, argv):
    w = []
    w.append("## Offered load: where the knee is\n")
    w.append(
        f"`bench/rate_sweep.py`, {started} UTC, {took:.0f} s in all; the "
        "2-core dev VM shared with other jobs (figures are noisy: compare "
        "the modes of one run). Requests arrive on a fixed schedule (open "
        "loop), spread evenly over the P workers; latency counts from a "
        "request's scheduled arrival, so waiting behind earlier requests "
        "shows. Each point is one `kvbench workload --mode both --repeat "
        f"{a.repeat}` run: {a.repeat} trials of each mode, direct and broker "
        "alternating (ABBA), and the figures are the medians of the trials. "
        f"{a.workers} P + {a.workers} D workers, {a.layers} layers x "
        f"{a.blocks} blocks x {a.block_bytes} B per request "
        f"({a.layers * a.blocks * a.block_bytes // 1024} KiB, "
        f"{a.layers * a.blocks} descriptors), at most {a.requests} "
        "waiting requests per step, about "
        f"{a.seconds:g} s of arrivals per point. tcp: two network "
        "namespaces joined by a veth pair (loopback when not root).\n")
    w.append(f"![offered load sweep]({out_png})\n")
    w.append("Knee = the highest offered load achieved to within "
             f"{int(KNEE_FRACTION * 100)}% with no failed request, every "
             "lower point too; past it the achieved rate stays near the "
             "capacity and p99 grows with the backlog (bounded here by each "
             "point's length). A point above the knee that kept up all the "
             "same shows in the next column: the other jobs' load moves "
             "single points.\n")
    w.append("| transport | mode | knee [req/s] | p50 / p99 there [ms] | "
             "highest point kept up with [req/s] | most achieved [req/s] |")
    w.append("|---|---|---|---|---|---|")
    for (t, m), k in knees.items():
        pts = [r for r in rows if r["transport"] == t and r["mode"] == m
               and r["achieved"] is not None]
        best = max((r["achieved"] for r in pts), default=0)
        kept = max((r["offered"] for r in pts if not r["failed"] and
                    r["achieved"] >= KNEE_FRACTION * r["offered"]),
                   default=None)
        if k:
            w.append(f"| {t} | {m} | {k['offered']} | {k['p50_ms']:.1f} / "
                     f"{k['p99_ms']:.1f} | {kept} | {best:.0f} |")
        else:
            w.append(f"| {t} | {m} | below {POINTS[t][0]} | | {kept} | "
                     f"{best:.0f} |")
    w.append("")
    w.append("| transport | offered [req/s] | mode | achieved [req/s] | "
             "p50 [ms] | p99 [ms] | failed |")
    w.append("|---|---|---|---|---|---|---|")
    for r in rows:
        if r["achieved"] is None:
            w.append(f"| {r['transport']} | {r['offered']} | {r['mode']} | "
                     f"run failed (rc {r['rc']}) | | | |")
            continue
        w.append(f"| {r['transport']} | {r['offered']} | {r['mode']} | "
                 f"{r['achieved']:.0f} | {r['p50_ms']:.1f} | "
                 f"{r['p99_ms']:.1f} | {r['failed']} |")
    w.append("")
    w.append("```")
    w.append("/usr/bin/python3 " + " ".join(shlex.quote(x) for x in argv))
    w.append("# each point, e.g.:")
    w.append(cmds[0] if cmds else "")
    w.append("```\n")
    return "\n".join(w)


def rerender(a):
    d = json.load(open(a.from_json))
    cfg = argparse.Namespace(**d["config"])
    rows = d["points"]
    transports = list(dict.fromkeys(r["transport"] for r in rows))
    for t in list(POINTS):
        if t not in transports:
            del POINTS[t]
    for t in transports:
        POINTS[t] = sorted({r["offered"] for r in rows
                            if r["transport"] == t})
    knees = {(t, m): knee([r for r in rows if r["transport"] == t and
                           r["mode"] == m])
             for t in transports for m in ("direct", "broker")}
    png = a.out + ".png"
    err = plot(rows, png)
    if err:
        print(f"rate_sweep: plot: {err}", file=sys.stderr)
    cmds = [d.get("first_cmd", "")]
    with open(a.out + ".md", "w") as f:
        f.write(write_md(cfg, rows, knees, cmds, d["started"], d["seconds"],
                         png, d.get("argv", ["bench/rate_sweep.py"])))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="bench/results/rate-sweep")
    ap.add_argument("--transports", default="local,tcp")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--block-bytes", type=int, default=8192)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3,
                    help="trials of each mode per point, alternating (ABBA);"
                    " the figures are the medians")
    ap.add_argument("--seconds", type=float, default=1.0,
                    help="arrivals per point, in seconds at its load")
    ap.add_argument("--timeout", type=float, default=120,
                    help="seconds one kvbench run may take")
    ap.add_argument("--points", default="",
                    help="offered loads for every transport, comma-separated"
                    " (default: per transport, built in)")
    ap.add_argument("--from-json", default="",
                    help="no runs: redraw OUT.png and rewrite OUT.md from "
                    "this earlier OUT.json")
    a = ap.parse_args()
    if a.from_json:
        return rerender(a)
    a.kvbench = os.path.join(a.build, "bench/kvbench/kvbench")
    if not os.access(a.kvbench, os.X_OK):
        sys.exit(f"rate_sweep: no {a.kvbench} (make build)")
    transports = [t for t in a.transports.split(",") if t]
    if a.points:
        pts = [int(x) for x in a.points.split(",")]
        for t in transports:
            POINTS[t] = pts
    for t in list(POINTS):
        if t not in transports:
            del POINTS[t]
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    t0 = time.monotonic()
    rows, cmds = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for t in transports:
            for off in POINTS[t]:
                r, cmd = run_point(a, t, off, tmp)
                rows += r
                cmds.append(cmd)
                for x in r:
                    print(f"{t:5} {off:6} {x['mode']:6} " + (
                        f"achieved {x['achieved']:7.0f}  p50 "
                        f"{x['p50_ms']:8.1f} ms  p99 {x['p99_ms']:8.1f} ms  "
                        f"failed {x['failed']}" if x["achieved"] is not None
                        else f"failed: rc {x['rc']} {x.get('error')}"),
                        flush=True)
    took = time.monotonic() - t0
    knees = {}
    for t in transports:
        for m in ("direct", "broker"):
            knees[(t, m)] = knee([r for r in rows if r["transport"] == t
                                  and r["mode"] == m])
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    png = a.out + ".png"
    err = plot(rows, png)
    if err:
        print(f"rate_sweep: plot: {err}", file=sys.stderr)
    with open(a.out + ".json", "w") as f:
        json.dump({"started": started, "seconds": took, "config": {
            k: v for k, v in vars(a).items()}, "points": rows,
            "first_cmd": cmds[0] if cmds else "",
            "argv": ["bench/rate_sweep.py"] + sys.argv[1:]}, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write(write_md(a, rows, knees, cmds, started, took, png,
                         ["bench/rate_sweep.py"] + sys.argv[1:]))
    for (t, m), k in knees.items():
        print(f"knee {t} {m}: " + (f"{k['offered']} req/s (p99 "
                                   f"{k['p99_ms']:.1f} ms)" if k else "none"))
    print(f"rate_sweep: wrote {a.out}.json, .md, .png in {took:.0f} s")
    return 1 if any(r["achieved"] is None for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
