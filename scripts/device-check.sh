#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Everything GPU in one run on a lent GPU machine (which has gcc and the
# CUDA or HIP runtime, but none of cmocka/zmq/ibverbs/msgpack):
#  1. scripts/device-gpu-check.sh: the gpu transport on its own, two
#     processes sharing device memory by IPC handle, byte-verified, and copy
#     bandwidth against plain cudaMemcpy/hipMemcpy;
#  2. the whole path through the broker: kvbroker --transport gpu built here
#     with gcc (without the cross-node module, bridge/xnode: no zmq
#     there), a P and a D worker process registering device memory with
#     kvb_mem_register_gpu(), P writing scattered blocks into D through the
#     broker, D checking every byte (tests/gpu/gpu_broker_test.c);
#  2b. GPU memory over the tcp transport (two transports over 127.0.0.1,
#     device regions on both sides, WRITE and READ through the host staging
#     buffers, every byte checked, GB/s; tests/gpu/tcp_gpu_check.c);
#  3. kvbench built with gcc (local and gpu transports): `workload
#     --transport gpu --verify` (direct and broker, every byte checked at
#     D), the small- and large-block gpu cases of `make bench` (fewer
#     steps), and the large-block `local` case on this machine's cores
#     (--iters-total: the same bytes at every worker count, as `make bench`)
#     (the 2-core dev VM cannot say whether the broker keeps up with direct
#     workers when cores are to spare). JSON to $OUT.
#
# Usage: scripts/device-check.sh [BACKEND]   (auto, cuda, hip; host: the
#        same steps on the host backend, memfd "device memory", no GPU)
# QUICK=1: tiny sizes, seconds per step (CTest runs `QUICK=1 ... host` so
# that this script keeps building and running where no GPU is).
# Run from the repository root. Output to stdout and $OUT/device-check.log.
# Exit 0 when every part passed.
set -u
cd "$(dirname "$0")/.." || exit 1
if [ -n "${OUT:-}" ]; then
	mkdir -p "$OUT"
	exec > >(tee "$OUT/device-check.log") 2>&1
fi
BACKEND=${1:-auto}
QUICK=${QUICK:-0}
J=${OUT:-}
B=$(mktemp -d "${TMPDIR:-/tmp}/kvb-dev.XXXXXX")
trap 'rm -rf "$B"' EXIT
[ -n "$J" ] || J=$B
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib /usr/local/cuda-*/lib64 /opt/rocm/lib; do
	[ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm), $(nproc) CPUs, backend $BACKEND, QUICK=$QUICK"

echo "=== part 1: gpu transport (scripts/device-gpu-check.sh)"
OUT='' bash scripts/device-gpu-check.sh --backend "$BACKEND"
rc1=$?

echo "=== part 2: through the broker"
CF="-std=gnu11 -O2 -g -D_GNU_SOURCE -DKVB_HAVE_GPU=1 -Wall -Wno-unused-parameter -Ishm -Iclient -Iclient/include -Icommon -Ibridge -Ibroker -DKVB_HAVE_GPU_TRANSPORT=1"
# shellcheck disable=SC2086
gcc $CF shm/ring.c shm/segment.c client/ctl.c common/*.c common/gpu/*.c bridge/local/local.c bridge/transports.c bridge/gpu/*.c \
	broker/log.c broker/options.c broker/config.c broker/sdnotify.c broker/regions.c broker/xfer.c broker/worker.c \
	broker/engine.c broker/finish.c broker/quota.c broker/grants.c broker/stats.c broker/gpu.c broker/ext.c broker/main.c \
	broker/metrics.c broker/http.c broker/views.c broker/nics.c \
	-ldl -lpthread -o "$B/kvbroker" || { echo "RESULT2: BUILD-FAILED (broker)"; exit 1; }
# shellcheck disable=SC2086
gcc $CF tests/gpu/gpu_broker_test.c client/*.c shm/ring.c \
	shm/segment.c common/*.c common/gpu/*.c bridge/gpu/*.c -ldl -lpthread -o "$B/gpu_broker_test" ||
	{ echo "RESULT2: BUILD-FAILED (test)"; exit 1; }
if [ "$BACKEND" != host ]; then
	echo "--- host backend (the test's own logic)"
	timeout 60 "$B/gpu_broker_test" "$B/kvbroker" host
	echo "host backend exit $?"
fi
echo "--- $BACKEND backend"
timeout 120 "$B/gpu_broker_test" "$B/kvbroker" "$BACKEND"
rc2=$?
echo "--- --host-ip: refused by a broker built without the cross-node layer"
if timeout 10 "$B/kvbroker" --host-ip 127.0.0.1 --socket "$B/refuse.sock" \
	2>"$B/refuse.log"; then
	echo "kvbroker --host-ip started and exited 0: expected a refusal"
	rc2=1
elif grep -q "built without the cross-node layer" "$B/refuse.log"; then
	echo "refused, as expected"
else
	cat "$B/refuse.log"
	echo "kvbroker --host-ip: no refusal message"
	rc2=1
fi

echo "=== part 2b: GPU memory over the tcp transport (host staging buffers)"
# shellcheck disable=SC2086
if gcc $CF tests/gpu/tcp_gpu_check.c bridge/tcp/*.c common/*.c common/gpu/*.c bridge/gpu/*.c \
	-lsodium -ldl -lpthread -o "$B/tcp_gpu_check"; then
	if [ "$QUICK" = 1 ]; then TG=(--mib 16 --block-kib 64); else TG=(--mib 1024 --block-kib 256); fi
	if [ "$BACKEND" = host ]; then
		KVB_GPU_HOST_OPAQUE=1 timeout 120 "$B/tcp_gpu_check" --backend host "${TG[@]}"
	else
		timeout 120 "$B/tcp_gpu_check" --backend "$BACKEND" "${TG[@]}"
	fi
	rc2b=$?
else
	echo "RESULT2B: BUILD-FAILED (tcp_gpu_check)"
	rc2b=1
fi
echo "part 2b exit $rc2b"

echo "=== part 3: kvbench (gcc build: local and gpu transports)"
# shellcheck disable=SC2086
# every source of kvbench (all of bench/kvbench/*.c: a list here went stale
# twice when files were added)
gcc $CF bench/kvbench/*.c \
	client/*.c shm/ring.c shm/segment.c bridge/local/local.c \
	common/*.c common/gpu/*.c bridge/gpu/*.c -ldl -lpthread -lm -o "$B/kvbench" ||
	{ echo "RESULT3: BUILD-FAILED (kvbench)"; exit 1; }
if [ "$QUICK" = 1 ]; then
	VL=4 GS=2 GL=1 LLT=4 REP=1 SW=1,2 SWC=2
else
	VL=32 GS=${ITERS_GPU_SMALL:-20} GL=${ITERS_GPU_LARGE:-10}
	LLT=${ITERS_LARGE_TOTAL:-300} REP=3 SW=1,2,4,8,16 SWC=8,16
fi
SMALL=(--layers 32 --blocks 16 --block-bytes 512 --requests 8 --no-verify --mode both)
LARGE=(--layers 32 --blocks 4 --block-bytes 256K --requests 4 --no-verify --mode both)
rc3=0
# kb NAME ARGS...: one kvbench run, bounded (KB_TIMEOUT s, default 120);
# a failure's exit status goes to rc3
kb() {
	local name=$1 rc
	shift
	echo "--- $name: kvbench $*"
	timeout "${KB_TIMEOUT:-120}" "$B/kvbench" "$@" --broker "$B/kvbroker" --json "$J/$name.json"
	rc=$?
	echo "$name exit $rc"
	[ $rc -eq 0 ] || rc3=$rc
}
# most wanted first: a lease can end before the last one
kb verify-gpu workload --transport gpu --gpu-backend "$BACKEND" --workers 2 \
	--layers "$VL" --iters 2 --mode both --verify
vg=$rc3 # the gpu cases only after a verified pass
if [ $vg -eq 0 ]; then
	kb workload-gpu-large workload --transport gpu --gpu-backend "$BACKEND" \
		"${LARGE[@]}" --iters "$GL" --repeat "$REP" --sweep-workers "${SW%,16}"
fi
kb workload-local-large workload "${LARGE[@]}" --iters-total "$LLT" --repeat "$REP" \
	--sweep-workers "$SW"
if [ $vg -eq 0 ]; then
	kb workload-gpu-small workload --transport gpu --gpu-backend "$BACKEND" \
		"${SMALL[@]}" --iters "$GS" --sweep-workers "${SW%,16}"
fi
kb workload-local-large-ct8 workload "${LARGE[@]}" --iters-total "$LLT" \
	--repeat "$REP" --sweep-workers "$SWC" --broker-opts "--copy-threads 8"
echo "RESULT1 (transport): exit $rc1; RESULT2 (broker): exit $rc2; RESULT2B (tcp staging): exit $rc2b; RESULT3 (kvbench): exit $rc3"
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc2b -eq 0 ] && [ $rc3 -eq 0 ]
