#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Everything GPU in one run on a lent GPU machine (which has gcc and the
# CUDA or HIP runtime, but none of cmocka/zmq/ibverbs/msgpack):
#  1. scripts/device-gpu-check.sh: the gpu transport on its own, two
#     processes sharing device memory by IPC handle, byte-verified, and copy
#     bandwidth against plain cudaMemcpy/hipMemcpy;
#  2. the whole path through the broker: kvbroker --transport gpu built here
#     with gcc, a P and a D worker process registering device memory with
#     kvb_mem_register_gpu(), P writing scattered blocks into D through the
#     broker, D checking every byte (tests/gpu/gpu_broker_test.c).
# Run from the repository root. Output to stdout and $OUT/device-check.log.
set -u
cd "$(dirname "$0")/.." || exit 1
if [ -n "${OUT:-}" ]; then
	mkdir -p "$OUT"
	exec > >(tee "$OUT/device-check.log") 2>&1
fi
BACKEND=${1:-auto}
B=$(mktemp -d "${TMPDIR:-/tmp}/kvb-dev.XXXXXX")
trap 'rm -rf "$B"' EXIT
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib /usr/local/cuda-*/lib64 /opt/rocm/lib; do
	[ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"

echo "=== part 1: gpu transport (scripts/device-gpu-check.sh)"
OUT= bash scripts/device-gpu-check.sh --backend "$BACKEND"
rc1=$?

echo "=== part 2: through the broker"
CF="-std=gnu11 -O2 -g -D_GNU_SOURCE -DKVB_HAVE_GPU=1 -Wall -Wno-unused-parameter -Ishm -Iclient -Iclient/include -Ibridge -Ibroker"
# shellcheck disable=SC2086
gcc $CF shm/ring.c shm/segment.c client/ctl.c bridge/local/local.c bridge/gpu/*.c \
	broker/log.c broker/options.c broker/regions.c broker/xfer.c broker/worker.c \
	broker/engine.c broker/stats.c broker/gpu.c broker/main.c \
	-ldl -lpthread -o "$B/kvbroker" || { echo "RESULT2: BUILD-FAILED (broker)"; exit 1; }
# shellcheck disable=SC2086
gcc $CF tests/gpu/gpu_broker_test.c client/kvbroker.c client/ctl.c shm/ring.c \
	shm/segment.c bridge/gpu/*.c -ldl -lpthread -o "$B/gpu_broker_test" ||
	{ echo "RESULT2: BUILD-FAILED (test)"; exit 1; }
echo "--- host backend (the test's own logic)"
timeout 60 "$B/gpu_broker_test" "$B/kvbroker" host
echo "host backend exit $?"
echo "--- $BACKEND backend"
timeout 120 "$B/gpu_broker_test" "$B/kvbroker" "$BACKEND"
rc2=$?
echo "RESULT1 (transport): exit $rc1; RESULT2 (broker): exit $rc2"
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]
