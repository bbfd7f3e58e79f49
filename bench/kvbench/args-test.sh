#!/bin/sh
# kvbench's command line: bad arguments are refused with exit 2 and a
# message naming the option; --iters-total splits the steps among the
# workers; --repeat N runs N trials of each mode,
# direct and broker alternating (ABBA), and writes each trial to the JSON;
# strings in the JSON are escaped. rate and lat leave no broker socket or
# process on a signal; lat gives up on a stalled broker (--timeout).
# Usage: args-test.sh KVBENCH
set -u
K=$1
fail=0
tmp=$(mktemp -d /tmp/kvb-args.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# refuse_in SUB WANT ARGS...: kvbench SUB ARGS... exits 2, stderr holds WANT
refuse_in() {
	sub=$1
	want=$2
	shift 2
	"$K" "$sub" "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" != 2 ] || ! grep -qF -- "$want" "$tmp/err"; then
		echo "FAIL: kvbench $sub $*: exit $rc, stderr:" >&2
		cat "$tmp/err" >&2
		fail=1
	fi
}
# refuse WANT ARGS...: the same for kvbench workload
refuse() {
	refuse_in workload "$@"
}

refuse "--repeat: '0' is not a whole number in [1, 15]" --repeat 0
refuse "--repeat: '16' is not a whole number in [1, 15]" --repeat 16
refuse "--repeat: 'x' is not a whole number" --repeat x
refuse "--workers: '0' is not a whole number in [1, 64]" --workers 0
refuse "--block-bytes: 12 is not a multiple of 8" --block-bytes 12
refuse "--mode: 'sideways' is not direct, broker, ucx, both or all" --mode sideways
refuse "--mode: empty" --mode ,
refuse "--ucx-tls goes with --mode ucx or all" --ucx-tls tcp
refuse "--transport: 'pigeon' is not one of" --transport pigeon
refuse "unknown option '--bogus'" --bogus
refuse "--iters and --iters-total: give one of them" --iters 3 --iters-total 5
refuse "--iters-total: '0' is not a whole number" --iters-total 0
refuse "unknown option '-x'" -xy
refuse "--help takes no value" --help=1
refuse "ambiguous option '--ite'" --ite 3
refuse "--rdma-ip: 'foo' is not an IPv4 address" --rdma-ip foo
refuse "--rdma-ip goes with --transport rdma" --rdma-ip 10.0.0.1
refuse "--workers and --sweep-workers: give one of them" --workers 2 \
	--sweep-workers 1,2
# W x layers x region bytes past 2^64: still the memory refusal
refuse "more than half of this machine's memory" --mode direct --workers 64 \
	--layers 1024 --blocks 4096 --block-bytes 64M --requests 1024 --iters 512
refuse_in lat "kvbench lat: --workers is a \`kvbench rate\` option" --workers=2
refuse_in lat "kvbench lat: --burst is a \`kvbench rate\` option" --burst 4
refuse_in rate "kvbench rate: --samples is a \`kvbench lat\` option" \
	--samples=3
refuse_in rate "kvbench rate: --timeout is a \`kvbench lat\` option" \
	--timeout 3
refuse_in rate "unknown option '-q'" -q
refuse_in lat "--timeout: '0' is not a whole number" --timeout 0

# every string in the JSON escaped (--broker-opts: quote, backslash)
if ! "$K" workload --mode direct --workers 1 --layers 1 --iters 1 \
	--requests 1 --blocks 1 --broker-opts 'a"b\c' \
	--json "$tmp/e.json" >"$tmp/out" 2>&1; then
	echo "FAIL: --broker-opts run:" >&2
	cat "$tmp/out" >&2
	fail=1
fi
grep -qF '"broker_opts":"a\"b\\c"' "$tmp/e.json" || {
	echo "FAIL: --broker-opts not escaped in the JSON:" >&2
	cat "$tmp/e.json" >&2
	fail=1
}

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
# alive PID: running, not a zombie
alive() {
	st=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${st#Z}" = "$st" ]
}
# gone PID...: each ends within 5 s
gone() {
	for p in "$@"; do
		i=0
		while alive "$p" && [ $i -lt 50 ]; do
			sleep 0.1
			i=$((i + 1))
		done
		alive "$p" && return 1
	done
	return 0
}
# broker_of PID: kvbench PID's broker, once it listens (10 s at most)
broker_of() {
	i=0
	while [ $i -lt 100 ]; do
		if ls /tmp/kvbench-"$1"-*.sock >/dev/null 2>&1; then
			pgrep -P "$1" -x kvbroker && return 0
		fi
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}

if command -v pgrep >/dev/null && command -v ps >/dev/null; then
	# rate and lat on SIGTERM/SIGINT/SIGHUP: no broker socket left, the
	# broker and the workers die with kvbench
	for sig in TERM INT HUP; do
		"$K" rate --seconds 60 >"$tmp/out" 2>&1 &
		kp=$!
		if ! broker_of $kp >/dev/null; then
			echo "FAIL: kvbench rate: no broker within 10 s" >&2
			kill -KILL $kp
			fail=1
			continue
		fi
		sleep 0.5
		kids=$(pgrep -P $kp)
		kill -$sig $kp
		wait $kp 2>/dev/null
		ls /tmp/kvbench-$kp-* >/dev/null 2>&1 && {
			echo "FAIL: kvbench rate, SIG$sig: left" \
				/tmp/kvbench-$kp-* >&2
			rm -f /tmp/kvbench-$kp-*
			fail=1
		}
		# shellcheck disable=SC2086
		gone $kids || {
			echo "FAIL: kvbench rate, SIG$sig: left processes" \
				"among $kids" >&2
			fail=1
		}
	done
	# lat with a stalled broker (SIGSTOP): gives up after --timeout,
	# exit 1, and stops the broker anyway
	"$K" lat --samples 20000000 --warmup 0 --timeout 2 >"$tmp/out" \
		2>"$tmp/err" &
	kp=$!
	bp=$(broker_of $kp)
	if [ -z "$bp" ]; then
		echo "FAIL: kvbench lat: no broker within 10 s" >&2
		kill -KILL $kp
		fail=1
	else
		sleep 0.5
		kill -STOP "$bp"
		i=0
		while alive $kp && [ $i -lt 300 ]; do
			sleep 0.1
			i=$((i + 1))
		done
		if alive $kp; then
			echo "FAIL: kvbench lat: still running 30 s after" \
				"its broker stopped" >&2
			kill -KILL $kp
			kill -CONT "$bp"
			fail=1
		fi
		wait $kp 2>/dev/null
		rc=$?
		if [ $rc != 1 ] ||
			! grep -q "no completion within 2 s" "$tmp/err"; then
			echo "FAIL: kvbench lat, broker stopped: exit $rc:" >&2
			cat "$tmp/err" >&2
			fail=1
		fi
		gone "$bp" || {
			echo "FAIL: kvbench lat: broker $bp left" >&2
			kill -KILL "$bp"
			fail=1
		}
	fi
fi
[ "$fail" = 0 ] && echo "kvbench arguments: ok"
exit "$fail"
