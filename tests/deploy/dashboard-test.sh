#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The Grafana dashboard against a running broker: a broker with
# --metrics-listen, a worker moving bytes through it (so that the
# per-worker and transfer series exist), one scrape of /metrics; then
# deploy/tools/check-dashboard.mjs with that scrape (every metric the
# dashboard names is in it, or is a per-NIC rdma series) and, where
# promtool is installed, PromQL parsing of every query. 77 without node or
# deploy/tools/node_modules.
# Usage: dashboard-test.sh SOURCE_DIR BUILD_DIR
set -u
SRC=${1:?source dir}
BUILD=${2:?build dir}
command -v node >/dev/null || { echo "SKIP: no node"; exit 77; }
[ -d "$SRC/deploy/tools/node_modules/@grafana/schema" ] || {
	echo "SKIP: no deploy/tools/node_modules (scripts/deps.sh test)"
	exit 77
}
T=$(mktemp -d /tmp/kvb-dash.XXXXXX)
BPID=
WPID=
cleanup() {
	[ -n "$WPID" ] && kill "$WPID" 2>/dev/null
	[ -n "$BPID" ] && kill "$BPID" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -20 "$T/broker.log" "$T/worker.log" 2>/dev/null; exit 1; }

"$BUILD/broker/kvbroker" --socket "$T/kvbroker.sock" \
	--metrics-listen 127.0.0.1:0 --log-format text >"$T/broker.log" 2>&1 &
BPID=$!
URL=
i=0
while [ -z "$URL" ]; do
	i=$((i + 1))
	[ $i -lt 200 ] || fail "the broker never said where its metrics are"
	kill -0 $BPID 2>/dev/null || fail "the broker exited"
	URL=$(sed -n 's|.*metrics on \(http://[^ ]*/metrics\).*|\1|p' "$T/broker.log")
	sleep 0.05
done
PYTHONPATH=$SRC/python KVBROKER_LIB=$BUILD/client/libkvbroker.so.0 \
	/usr/bin/python3 "$SRC/tests/deploy/pod_worker.py" "$T/kvbroker.sock" loop 30 \
	>"$T/worker.log" 2>&1 &
WPID=$!
i=0
until [ "$(grep -c '"ok"' "$T/worker.log")" -ge 3 ]; do
	i=$((i + 1))
	[ $i -lt 200 ] || fail "the worker moved nothing"
	sleep 0.05
done
/usr/bin/python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" \
	"$URL" >"$T/scrape.txt" || fail "no scrape from $URL"
echo "scraped $(grep -c '^kvbroker_' "$T/scrape.txt") series from $URL"
set -- --scrape "$T/scrape.txt"
if command -v promtool >/dev/null; then
	set -- "$@" --promtool "$(command -v promtool)"
fi
cd "$SRC/deploy/tools" && node check-dashboard.mjs "$@"
