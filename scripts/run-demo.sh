#!/bin/sh
# `make run`: start a broker with the local transport on a private socket,
# run the demo workload (P and D worker processes, per-layer KV blocks),
# print the summary and the broker's counters, stop the broker cleanly.
# Killed (INT, TERM, HUP), it stops the demo and the broker and removes its
# directory before it goes.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
bpid=
dpid=

# Is process $1 running (a zombie is not)?
alive() {
	s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	s=${s##*") "}
	[ "${s%% *}" != Z ]
}

# SIGTERM child $1, SIGKILL it if still there 10 s later; returns its exit
# status.
stop() {
	[ -n "$1" ] || return 0
	kill -TERM "$1" 2>/dev/null
	n=0
	while alive "$1" && [ "$n" -lt 200 ]; do
		n=$((n + 1))
		sleep 0.05
	done
	if alive "$1"; then
		echo "run: pid $1 still there 10 s after SIGTERM: SIGKILL" >&2
		kill -KILL "$1"
	fi
	wait "$1" 2>/dev/null
}

dir=$(mktemp -d /tmp/kvbroker-run.XXXXXX) || exit 1
# the demo's workers die with it (PR_SET_PDEATHSIG)
trap 'stop "$dpid"; stop "$bpid"; rm -rf "$dir"' EXIT
# dash runs the EXIT trap on exit only: turn these signals into one
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
sock=$dir/kvbroker.sock
"$BUILD"/broker/kvbroker --socket "$sock" --transport local --log-level warn &
bpid=$!
i=0
until [ -S "$sock" ]; do
	i=$((i + 1))
	if [ $i -gt 100 ] || ! alive $bpid; then
		echo "run: the broker did not start" >&2
		exit 1
	fi
	sleep 0.05
done
echo "kvbroker running (pid $bpid, socket $sock, transport local)"
# in the background: a trapped signal interrupts `wait`, not a foreground job
"$BUILD"/bench/demo/kvb-demo --socket "$sock" --p 2 --d 2 --layers 32 \
	--blocks 16 --block-bytes 4096 --requests 64 "$@" &
dpid=$!
wait $dpid
rc=$?
dpid=
[ $rc -eq 2 ] && exit 2 # arguments refused, the reason printed
echo
echo "broker counters (kvbctl stats):"
"$BUILD"/broker/kvbctl --socket "$sock" stats || rc=1
stop $bpid || { echo "run: broker exited with an error" >&2; rc=1; }
bpid=
[ -e "$sock" ] && { echo "run: socket left behind" >&2; rc=1; }
exit $rc
