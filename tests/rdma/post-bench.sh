#!/bin/sh
# SPDX-License-Identifier: MIT
# Run inside the soft-RoCE guest (see docs/rdma.md):
#   tests/rdma/rxe-runner.sh tests/rdma/post-bench.sh BUILD_DIR [bench args]
# perftest's ib_write_bw (before and after) and rdma_post_bench on the same
# rxe0 in the same boot: compare ratios, the absolute speed of an emulated
# CPU shifts with the host's load.
set -u
bdir=${1:?usage: post-bench.sh BUILD_DIR [rdma_post_bench args]}
shift
size=65536
iters=1000
dev=${KVB_RDMA_DEV:-rxe0}
ibv_devices | grep -q "$dev" || { echo "no $dev: not in the guest?" >&2; exit 77; }

# ib_write_bw's average MB/s (server in the background, client on loopback)
perftest() {
	# bounded: a server whose client never came would wait forever
	timeout 120 ib_write_bw -d "$dev" -x 1 -s $size -n $iters -F >/tmp/bw-server.log 2>&1 &
	srv=$!
	sleep 1
	timeout 120 ib_write_bw -d "$dev" -x 1 -s $size -n $iters -F 127.0.0.1 >/tmp/bw-client.log 2>&1
	wait $srv
	awk '$1 == '$size' && NF >= 5 { print $4; exit }' /tmp/bw-client.log
}

p1=$(perftest)
echo "== ib_write_bw -d $dev -x 1 -s $size -n $iters: $p1 MB/s"
echo "== rdma_post_bench -S $size -N $iters $*"
"$bdir/tests/rdma/rdma_post_bench" -S $size -N $iters "$@" | tee /tmp/bench.log
rc=$?
p2=$(perftest)
echo "== ib_write_bw -d $dev -x 1 -s $size -n $iters: $p2 MB/s"
ours=$(awk '$1 == '$size' && $2 == '$iters' { print $3; exit }' /tmp/bench.log)
echo "== large writes: kvbroker rdma $ours MB/s, ib_write_bw $p1 / $p2 MB/s," \
	"ratio to their mean $(awk "BEGIN { m = ($p1 + $p2) / 2; if (m > 0) printf \"%.2f\", $ours / m }")"
exit $rc
