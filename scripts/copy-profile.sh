#!/usr/bin/env bash
# Where the CPU goes in a large-block `local` run, direct and broker mode:
# `perf record -a` (software cpu-clock, so it works in a VM without hardware
# counters) during one kvbench run per mode, then, over the steady part of
# the run (100 ms buckets where copying dominates and page faults do not,
# i.e. after the warm-up), how many cores were copying (memmove/memcpy, or
# the local transport's streaming copy_nt), the copy rate per copying core
# (kvbench's BW / those cores), and the other
# processes and functions that took CPU.
#
# Usage: scripts/copy-profile.sh [-w WORKERS] [-i ITERS] [-r ROUNDS]
#   -w WORKERS  kvbench --workers (default 2)
#   -i ITERS    kvbench --iters, steps per worker (default 200: ~2 s of
#               copying per mode on a 2-core VM)
#   -r ROUNDS   direct/broker pairs to run, alternating (default 1)
# Environment: BUILD (default build), KVBENCH (the binary), TOP (rows of
# the by-function table, default 8).
# Needs perf (Debian: linux-perf) and python3; as root, or with
# kernel.perf_event_paranoid <= 0 for system-wide recording.
#
# The per-core rate divides a whole-run BW by the steady window's cores, so
# compare modes within one run, as for every figure on a shared machine.
set -euo pipefail

cd "$(dirname "$0")/.."
W=2
ITERS=200
ROUNDS=1
while getopts "w:i:r:h" o; do
	case $o in
	w) W=$OPTARG ;;
	i) ITERS=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	h)
		sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "usage: $0 [-w WORKERS] [-i ITERS] [-r ROUNDS]" >&2
		exit 2
		;;
	esac
done
TOP=${TOP:-8}
for v in "$W" "$ITERS" "$ROUNDS" "$TOP"; do
	case $v in
	'' | *[!0-9]* | 0)
		echo "copy-profile: -w, -i, -r and TOP take a positive integer, not '$v'" >&2
		exit 2
		;;
	esac
done
BUILD=${BUILD:-build}
KVBENCH=${KVBENCH:-$BUILD/bench/kvbench/kvbench}
command -v perf >/dev/null || {
	echo "copy-profile: perf is missing (apt-get install linux-perf)" >&2
	exit 1
}
command -v python3 >/dev/null || {
	echo "copy-profile: python3 is missing" >&2
	exit 1
}
[ -x "$KVBENCH" ] || {
	echo "copy-profile: no kvbench at $KVBENCH (build it, or set KVBENCH)" >&2
	exit 1
}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvb-prof.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

FREQ=2000 # perf samples per second per CPU

# analyse PERF_DATA BW_GBPS: the steady window's figures
analyse() {
	perf script -i "$1" -F comm,tid,time,ip,sym 2>/dev/null |
		python3 -c '
import collections, sys
bw, freq, top = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
def is_copy(s):
    return any("memmove" in x or "memcpy" in x or x.startswith("copy_nt")
               for x in s)
samples = []
for block in sys.stdin.read().split("\n\n"):
    lines = [l.strip() for l in block.strip().split("\n") if l.strip()]
    if not lines:
        continue
    head = lines[0].split()
    syms = [l.split(None, 1)[1] if len(l.split(None, 1)) > 1 else "?"
            for l in lines[1:]]
    samples.append((float(head[2].rstrip(":")), head[0], syms[:4]))
if not samples:
    sys.exit("copy-profile: perf recorded no samples")
t0 = samples[0][0]
def bucket(t):
    return int((t - t0) * 10)
tot, mm, pf = (collections.Counter() for _ in range(3))
for t, comm, s in samples:
    tot[bucket(t)] += 1
    mm[bucket(t)] += is_copy(s)
    pf[bucket(t)] += any("page_fault" in x for x in s)
steady = [k for k in sorted(tot)
          if mm[k] > tot[k] / 2 and pf[k] < tot[k] * 0.03]
if len(steady) < 5:
    sys.exit("copy-profile: no steady copying phase found (run longer: -i)")
lo, hi = steady[1], steady[-2]  # drop the partial edge buckets
secs = (hi - lo + 1) / 10
n = copy = 0
other, procs = collections.Counter(), collections.Counter()
for t, comm, s in samples:
    if not lo <= bucket(t) <= hi:
        continue
    n += 1
    procs[(comm, is_copy(s))] += 1
    if is_copy(s):
        copy += 1
    else:
        other[(comm, s[0] if s else "?")] += 1
cores = copy / (freq * secs)
print(f"  steady window {lo / 10:.1f}-{(hi + 1) / 10:.1f} s: "
      f"{n / (freq * secs):.2f} CPUs busy, {cores:.2f} copying "
      f"({100 * copy / n:.1f} % of samples)")
print(f"  copy rate per copying core: {bw / cores:.1f} GB/s "
      f"(BW {bw:.2f} GB/s / {cores:.2f})")
print("  by process (% of the samples): " + ", ".join(
    f"{comm} {100 * v / n:.1f} %" + (" copying" if c else " other")
    for (comm, c), v in procs.most_common(6)))
print("  the rest, by process and function (% of the samples):")
for (comm, sym), v in other.most_common(top):
    print(f"    {100 * v / n:5.1f} %  {comm:<10} {sym}")
' "$2" "$FREQ" "$TOP"
}

for r in $(seq 1 "$ROUNDS"); do
	for mode in direct broker; do
		echo "== round $r, $mode: kvbench workload --workers $W --iters $ITERS (256 KiB blocks)"
		perf record -q -F "$FREQ" -a -g -o "$TMP/$mode.data" -- \
			"$KVBENCH" workload --transport local --layers 32 \
			--blocks 4 --block-bytes 256K --requests 4 --no-verify \
			--mode "$mode" --iters "$ITERS" --workers "$W" \
			>"$TMP/$mode.txt" 2>&1 || {
			cat "$TMP/$mode.txt" >&2
			echo "copy-profile: the $mode run failed" >&2
			exit 1
		}
		bw=$(awk -v m="$mode" '$1 == m && $2 ~ /^[0-9]+$/ { print $9 }' "$TMP/$mode.txt")
		[ -n "$bw" ] || {
			cat "$TMP/$mode.txt" >&2
			echo "copy-profile: no $mode row in kvbench's output" >&2
			exit 1
		}
		analyse "$TMP/$mode.data" "$bw"
	done
done
