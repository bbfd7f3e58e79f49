#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Everything GPU in one run on a lent GPU machine (gcc, cmake, the CUDA or
# HIP runtime; none of cmocka/zmq/ibverbs/msgpack, maybe no pkg-config):
#  0. one CMake build of its own (the build of the tree, with what that
#     machine lacks left out: -DKVB_SKIP_ZMQ=ON, so no cross-node module,
#     bridge/xnode; -DKVB_SKIP_RDMA=ON; -DKVB_SKIP_TCP=ON where libsodium
#     is not found; -DKVB_GPU_TESTS_ONLY=ON: tests/gpu's plain-C tests
#     only), its targets kvbroker, kvbench and the gpu tests;
#  1. the gpu-labelled tests (`ctest -L gpu`): gpu_ipc_test (the gpu
#     transport on its own, two processes sharing device memory by IPC
#     handle, byte-verified, copy bandwidth against plain
#     cudaMemcpy/hipMemcpy), gpu_broker (P and D worker processes with
#     device memory, P writing scattered blocks into D through
#     `kvbroker --transport gpu`, every byte checked), tcp_gpu (GPU memory
#     over the tcp transport's host staging buffers, WRITE and READ over
#     127.0.0.1, every byte checked, GB/s); and `kvbroker --host-ip`
#     refused by that broker (built without the cross-node module);
#  2. kvbench: `workload --transport gpu --verify` (direct and broker,
#     every byte checked at D), the small- and large-block gpu cases of
#     `make bench` (fewer steps), and the large-block `local` case on this
#     machine's cores (--iters-total: the same bytes at every worker count,
#     as `make bench`). JSON to $OUT.
#
# Usage: scripts/device-check.sh [BACKEND]   (auto, cuda, hip; host: the
#        same steps on the host backend, memfd "device memory", no GPU)
# QUICK=1: tiny sizes, seconds per step (CTest's device_check_host runs
# `QUICK=1 ... host`, so that this script keeps building and running where
# no GPU is). JOBS: build jobs (default: the CPUs).
# Run from the repository root. Output to stdout and $OUT/device-check.log.
# Exit 0 when every part passed, 77 when there is no GPU (or no runtime)
# for a backend other than host, 1 when a part failed or did not build.
set -u
cd "$(dirname "$0")/.." || exit 1
if [ -n "${OUT:-}" ]; then
	mkdir -p "$OUT"
	exec > >(tee "$OUT/device-check.log") 2>&1
fi
BACKEND=${1:-auto}
QUICK=${QUICK:-0}
JOBS=${JOBS:-$(nproc)}
J=${OUT:-}
case $BACKEND in
auto | cuda | hip | host) ;;
*)
	echo "usage: $0 [auto|cuda|hip|host]" >&2
	exit 1
	;;
esac
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm), $(nproc) CPUs, backend $BACKEND, QUICK=$QUICK"

# No GPU device node: nothing to check (before minutes of building)
if [ "$BACKEND" != host ]; then
	shopt -s nullglob
	devs=(/dev/nvidia[0-9]* /dev/kfd)
	shopt -u nullglob
	if [ ${#devs[@]} -eq 0 ]; then
		echo "no GPU here (no /dev/nvidia<N>, no /dev/kfd): nothing to" \
			"check; \`$0 host\` runs the same steps on the host backend"
		echo "RESULT: SKIPPED (no GPU)"
		exit 77
	fi
	echo "devices: ${devs[*]}"
	if command -v nvidia-smi >/dev/null 2>&1; then
		nvidia-smi --query-gpu=name,driver_version,memory.total \
			--format=csv,noheader 2>/dev/null || true
	fi
fi
for tool in cmake gcc; do
	if ! command -v $tool >/dev/null 2>&1; then
		echo "RESULT: BUILD-FAILED ($tool not found: the build needs cmake and gcc)"
		exit 1
	fi
done

B=$(mktemp -d "${TMPDIR:-/tmp}/kvb-dev.XXXXXX")
trap 'rm -rf "$B"' EXIT
[ -n "$J" ] || J=$B
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib /usr/local/cuda-*/lib64 /opt/rocm/lib; do
	[ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"

echo "=== part 0: CMake build"
CM=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON -DKVB_GPU_TESTS_ONLY=ON
	-DKVB_SKIP_ZMQ=ON -DKVB_SKIP_RDMA=ON -DKVB_DPDK=OFF -DKVB_SYSTEMD=OFF)
TARGETS=(kvbroker_daemon kvbench gpu_ipc_test gpu_broker_test)
if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libsodium; then
	TARGETS+=(tcp_gpu_check)
else
	echo "libsodium not found (or no pkg-config): no tcp transport, no tcp_gpu test"
	CM+=(-DKVB_SKIP_TCP=ON)
fi
if ! cmake -S . -B "$B" "${CM[@]}" >"$B/configure.log" 2>&1; then
	cat "$B/configure.log"
	echo "RESULT: BUILD-FAILED (cmake configure)"
	exit 1
fi
if ! cmake --build "$B" -j"$JOBS" --target "${TARGETS[@]}" >"$B/build.log" 2>&1; then
	tail -n 60 "$B/build.log"
	echo "RESULT: BUILD-FAILED (cmake --build: ${TARGETS[*]})"
	exit 1
fi
echo "built: ${TARGETS[*]} in $B"
KVBROKER=$B/broker/kvbroker

echo "=== part 1: gpu tests (ctest)"
if [ "$BACKEND" = host ]; then
	# the same tests on the host backend: the tests' own logic
	SEL=(-R '^(gpu_ipc_host|gpu_broker_host|tcp_gpu_host)$')
else
	SEL=(-L gpu)
fi
ctest --test-dir "$B" "${SEL[@]}" -V --no-tests=error >"$B/ctest.log" 2>&1
rc1=$?
cat "$B/ctest.log"
nrun=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$B/ctest.log")
nskip=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*Skipped' "$B/ctest.log")
if [ "$BACKEND" != host ] && [ "$nrun" -gt 0 ] && [ "$nskip" -eq "$nrun" ]; then
	echo "no GPU: every gpu test skipped (no usable device, or no" \
		"runtime: libcudart / libamdhip64)"
	echo "RESULT: SKIPPED (no GPU)"
	exit 77
fi
echo "--- --host-ip: refused by a broker built without the cross-node module"
if timeout 10 "$KVBROKER" --host-ip 127.0.0.1 --socket "$B/refuse.sock" \
	2>"$B/refuse.log"; then
	echo "kvbroker --host-ip started and exited 0: expected a refusal"
	rc1=1
elif grep -q "built without the cross-node layer" "$B/refuse.log"; then
	echo "refused, as expected"
else
	cat "$B/refuse.log"
	echo "kvbroker --host-ip: no refusal message"
	rc1=1
fi
echo "part 1 exit $rc1"

echo "=== part 2: kvbench (local and gpu transports)"
if [ "$QUICK" = 1 ]; then
	VL=4 GS=2 GL=1 LLT=4 REP=1 SW=1,2 SWC=2
else
	VL=32 GS=${ITERS_GPU_SMALL:-20} GL=${ITERS_GPU_LARGE:-10}
	LLT=${ITERS_LARGE_TOTAL:-300} REP=3 SW=1,2,4,8,16 SWC=8,16
fi
SMALL=(--layers 32 --blocks 16 --block-bytes 512 --requests 8 --no-verify --mode both)
LARGE=(--layers 32 --blocks 4 --block-bytes 256K --requests 4 --no-verify --mode both)
rc2=0
# kb NAME ARGS...: one kvbench run, bounded (KB_TIMEOUT s, default 120);
# a failure's exit status goes to rc2
kb() {
	local name=$1 rc
	shift
	echo "--- $name: kvbench $*"
	timeout "${KB_TIMEOUT:-120}" "$B/bench/kvbench/kvbench" "$@" \
		--broker "$KVBROKER" --json "$J/$name.json"
	rc=$?
	echo "$name exit $rc"
	[ $rc -eq 0 ] || rc2=$rc
}
# most wanted first: a lease can end before the last one
kb verify-gpu workload --transport gpu --gpu-backend "$BACKEND" --workers 2 \
	--layers "$VL" --iters 2 --mode both --verify
vg=$rc2 # the gpu cases only after a verified pass
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
echo "RESULT1 (gpu tests): exit $rc1; RESULT2 (kvbench): exit $rc2"
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]
