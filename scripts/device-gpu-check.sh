#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# GPU check for a lent machine (NVIDIA H200; works on AMD with HIP too).
# Builds only what the gpu transport needs with plain gcc (no cmake, cmocka,
# zmq, ibverbs or msgpack), then runs tests/gpu/gpu_ipc_test: two processes,
# CUDA/HIP IPC handle, copies through the gpu transport, every byte checked,
# then bandwidth of transport copies vs plain cudaMemcpy (1/4/16 MiB).
#
# Run from the repository root:  scripts/device-gpu-check.sh [--backend cuda]
# (QUICK=1 with --backend host: the host backend's quick run only.)
# Output goes to stdout and, if $OUT is set, to $OUT/gpu-check.log.
# Exit: 0 pass, 3 IPC between processes unavailable (sandbox; one-process
# copies and bandwidth still measured), 77 no GPU, other = failure.
set -u

BACKEND=auto
if [ "${1:-}" = "--backend" ] && [ -n "${2:-}" ]; then
	BACKEND=$2
fi

cd "$(dirname "$0")/.." || exit 1
if [ -n "${OUT:-}" ]; then
	mkdir -p "$OUT"
	exec > >(tee "$OUT/gpu-check.log") 2>&1
fi

BUILD=$(mktemp -d "${TMPDIR:-/tmp}/kvb-gpu-check.XXXXXX")
trap 'rm -rf "$BUILD"' EXIT

echo "== kvbroker gpu check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
echo "== devices"
if command -v nvidia-smi >/dev/null 2>&1; then
	nvidia-smi -L || echo "nvidia-smi -L failed"
	nvidia-smi --query-gpu=name,driver_version,memory.total \
		--format=csv,noheader 2>/dev/null || true
else
	echo "nvidia-smi: not installed"
fi
command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -n 2

# The runtimes are dlopen'd: make a toolkit outside the loader's path
# visible (libcudart.so under /usr/local/cuda*, libamdhip64 under rocm).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib \
	/usr/local/cuda-*/lib64 /opt/rocm/lib; do
	if [ -d "$d" ]; then
		LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
	fi
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"

echo "== build (gcc, -ldl -lpthread)"
CFLAGS="-std=gnu11 -O2 -g -D_GNU_SOURCE -Wall -Wextra -Wshadow \
-Wmissing-prototypes -Wstrict-prototypes -Wno-unused-parameter"
# shellcheck disable=SC2086
if ! gcc $CFLAGS -Icommon -Ibridge -I. common/*.c common/gpu/*.c bridge/gpu/*.c tests/gpu/gpu_ipc_test.c \
	-ldl -lpthread -o "$BUILD/gpu_ipc_test"; then
	echo "RESULT: BUILD-FAILED"
	exit 1
fi
echo "built $BUILD/gpu_ipc_test"

echo "== host backend (logic of the test itself, 32 MiB)"
timeout 60 "$BUILD/gpu_ipc_test" --backend host --quick
rc=$?
echo "host backend exit $rc"
if [ "$BACKEND" = host ] && [ "${QUICK:-0}" = 1 ]; then
	# QUICK=1 (scripts/device-check.sh under CTest): that run was the check
	[ $rc -eq 0 ] && echo "RESULT: PASS (host backend, QUICK=1)" ||
		echo "RESULT: FAIL (exit $rc)"
	exit $rc
fi

echo "== $BACKEND backend: two processes, IPC, verify, bandwidth"
timeout 240 "$BUILD/gpu_ipc_test" --backend "$BACKEND"
rc=$?
case $rc in
0) echo "RESULT: PASS (two-process IPC copies byte-verified; bandwidth above)" ;;
3) echo "RESULT: IPC-UNAVAILABLE (IPC between processes refused, likely" \
	"a sandbox; copies verified and bandwidth measured in one process)" ;;
77) echo "RESULT: SKIPPED (no GPU or runtime)" ;;
124) echo "RESULT: TIMEOUT" ;;
*) echo "RESULT: FAIL (exit $rc)" ;;
esac
exit $rc
