#!/bin/sh
# kvbench workload's command line: bad arguments are refused with exit 2 and
# a message naming the option; --iters-total splits the steps among the
# workers; --repeat N runs N trials of each mode,
# direct and broker alternating (ABBA), and writes each trial to the JSON.
# Usage: args-test.sh KVBENCH
set -u
K=$1
fail=0
tmp=$(mktemp -d /tmp/kvb-args.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# refuse ARGS... WANT: exit 2, first line of stderr contains WANT
refuse() {
	want=$1
	shift
	"$K" workload "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" != 2 ] || ! grep -qF -- "$want" "$tmp/err"; then
		echo "FAIL: kvbench workload $*: exit $rc, stderr:" >&2
		cat "$tmp/err" >&2
		fail=1
	fi
}

refuse "--repeat: '0' is not a whole number in [1, 15]" --repeat 0
refuse "--repeat: '16' is not a whole number in [1, 15]" --repeat 16
refuse "--repeat: 'x' is not a whole number" --repeat x
refuse "--workers: '0' is not a whole number in [1, 64]" --workers 0
refuse "--block-bytes: 12 is not a multiple of 8" --block-bytes 12
refuse "--mode: 'sideways' is not direct, broker or both" --mode sideways
refuse "--transport: 'pigeon' is not one of" --transport pigeon
refuse "unknown option '--bogus'" --bogus
refuse "--iters and --iters-total: give one of them" --iters 3 --iters-total 5
refuse "--iters-total: '0' is not a whole number" --iters-total 0

# --iters-total 5 over W = 1, 2: 5 and 3 steps per worker; D verifies every
# byte, so the WR counts are what was written: W x steps x 1 x 2 x 2
if ! "$K" workload --layers 2 --blocks 2 --requests 1 --iters-total 5 \
	--sweep-workers 1,2 --verify --json "$tmp/t.json" >"$tmp/out" 2>&1; then
	echo "FAIL: --iters-total run:" >&2
	cat "$tmp/out" >&2
	fail=1
fi
for key in '"iters":null,"iters_total":5' \
	'"workers":1,"iters":5,"direct":\{"wrs":20,' \
	'"workers":2,"iters":3,"direct":\{"wrs":24,'; do
	grep -Eq "$key" "$tmp/t.json" || {
		echo "FAIL: no '$key' in the JSON:" >&2
		cat "$tmp/t.json" >&2
		fail=1
	}
done
grep -q "5 steps in all (W workers: 5/W each, rounded up)" "$tmp/out" || {
	echo "FAIL: --iters-total not said in the header:" >&2
	cat "$tmp/out" >&2
	fail=1
}

# --repeat 2: d#1 b#1, then b#2 d#2 (ABBA), medians, the pair ratios, JSON
if ! "$K" workload --workers 1 --layers 2 --blocks 2 --requests 1 \
	--iters 2 --verify --repeat 2 --json "$tmp/r.json" >"$tmp/out" 2>&1; then
	echo "FAIL: --repeat 2 run:" >&2
	cat "$tmp/out" >&2
	fail=1
fi
order=$(awk '$1 ~ /^[db]#[0-9]+$/ {printf "%s ", $1}' "$tmp/out")
if [ "$order" != "d#1 b#1 b#2 d#2 " ]; then
	echo "FAIL: trial order '$order', want 'd#1 b#1 b#2 d#2 '" >&2
	fail=1
fi
for row in '^direct ' '^broker ' '^ratio ' 'BW ratio per trial pair: [0-9.]+ [0-9.]+$'; do
	grep -Eq "$row" "$tmp/out" || {
		echo "FAIL: no line matching '$row' in:" >&2
		cat "$tmp/out" >&2
		fail=1
	}
done
for key in '"repeat":2' '"trials":{"wrs":\[[0-9.e+]+,[0-9.e+]+\]'; do
	grep -Eq "$key" "$tmp/r.json" || {
		echo "FAIL: no '$key' in the JSON:" >&2
		cat "$tmp/r.json" >&2
		fail=1
	}
done
[ "$fail" = 0 ] && echo "kvbench arguments: ok"
exit "$fail"
