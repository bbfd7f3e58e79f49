#!/bin/sh
# `make run`: start a broker with the local transport on a private socket,
# run the demo workload (P and D worker processes, per-layer KV blocks),
# print the summary and the broker's counters, stop the broker cleanly.
set -u
BUILD=${BUILD:-build}
dir=$(mktemp -d /tmp/kvbroker-run.XXXXXX)
sock=$dir/kvbroker.sock
"$BUILD"/broker/kvbroker --socket "$sock" --transport local --log-level warn &
bpid=$!
trap 'kill -TERM $bpid 2>/dev/null; rm -rf "$dir"' EXIT
i=0
until [ -S "$sock" ]; do
	i=$((i + 1))
	if [ $i -gt 100 ] || ! kill -0 $bpid 2>/dev/null; then
		echo "run: the broker did not start" >&2
		exit 1
	fi
	sleep 0.05
done
echo "kvbroker running (pid $bpid, socket $sock, transport local)"
"$BUILD"/bench/demo/kvb-demo --socket "$sock" --p 2 --d 2 --layers 32 \
	--blocks 16 --block-bytes 4096 --requests 64 "$@"
rc=$?
echo
echo "broker counters (kvbctl stats):"
"$BUILD"/broker/kvbctl --socket "$sock" stats || rc=1
kill -TERM $bpid
wait $bpid || { echo "run: broker exited with an error" >&2; rc=1; }
trap 'rm -rf "$dir"' EXIT
[ -e "$sock" ] && { echo "run: socket left behind" >&2; rc=1; }
exit $rc
