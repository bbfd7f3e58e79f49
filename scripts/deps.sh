#!/bin/sh
# Install the Debian packages kvbroker needs, in layers (docs/service.md):
#   build  compiling kvbroker and running the demo (`make build`, `make run`)
#   test   what the tests use besides (`make test`, test-asan, test-tsan)
#   bench  what `make bench` uses besides
#   fuzz   the libFuzzer build (`make fuzz`)
#   deb    building and checking the Debian package (`make deb`)
#   all    every layer (the default; CI)
# As root: installs what is missing with apt-get. Otherwise: prints the exact
# apt-get line and fails.
# Usage: scripts/deps.sh [--check] [LAYER...]
set -eu
BUILD_PKGS="build-essential cmake pkg-config libibverbs-dev librdmacm-dev \
libzmq3-dev libmsgpack-dev libsodium-dev libsystemd-dev"
# the soft-RoCE guest of the rdma tests and benchmarks (rxe-runner.sh):
# qemu, its initramfs tools, rdma-core and the ibverbs tools
GUEST_PKGS="qemu-system-x86 busybox-static cpio kmod xz-utils zstd rdma-core \
ibverbs-providers ibverbs-utils rdmacm-utils"
# python3-*: the pytest suites and their MoRIIO/vLLM stand-ins; iproute2 and
# iperf3: the network namespace tests; mandoc, systemd (systemd-analyze)
# and dpkg-dev: the man page, unit and package tests; libamdhip64-dev: the
# HIP ABI check; prometheus: promtool and a Prometheus server for
# test_metrics_prom (it skips without them)
TEST_PKGS="libcmocka-dev python3 python3-zmq python3-msgpack python3-pytest \
python3-numpy python3-torch python3-cffi python3-pip python3-setuptools \
iproute2 iperf3 procps libamdhip64-dev mandoc systemd dpkg-dev prometheus \
$GUEST_PKGS"
# scripts/bench.sh: the guest (rdma), network namespaces and iperf3 (tcp),
# perftest (ib_write_bw), dpdk-dev (kvbench ring against rte_ring),
# libucx-dev (kvbench workload --mode ucx) and ucx-utils (ucx_info: the
# transports and devices UCX sees), gnuplot, python3 (the summary tables)
BENCH_PKGS="perftest dpdk-dev libucx-dev ucx-utils gnuplot-nox iperf3 \
iproute2 python3 $GUEST_PKGS"
FUZZ_PKGS="clang"
DEB_PKGS="dpkg-dev lintian"

check=
layers=
for a in "$@"; do
	case $a in
	--check) check=1 ;;
	build | test | bench | fuzz | deb | all) layers="$layers $a" ;;
	*)
		echo "deps.sh: unknown layer '$a' (build, test, bench, fuzz, deb, all)" >&2
		exit 2
		;;
	esac
done
[ -n "$layers" ] || layers=all
PKGS=
for l in $layers; do
	case $l in
	build) PKGS="$PKGS $BUILD_PKGS" ;;
	test) PKGS="$PKGS $TEST_PKGS" ;;
	bench) PKGS="$PKGS $BENCH_PKGS" ;;
	fuzz) PKGS="$PKGS $FUZZ_PKGS" ;;
	deb) PKGS="$PKGS $DEB_PKGS" ;;
	all) PKGS="$PKGS $BUILD_PKGS $TEST_PKGS $BENCH_PKGS $FUZZ_PKGS $DEB_PKGS" ;;
	esac
done

missing=""
for p in $PKGS; do
	case " $missing " in *" $p "*) continue ;; esac
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing="$missing $p"
	fi
done
[ -z "$missing" ] && exit 0
[ -n "$check" ] && { echo "missing:$missing"; exit 1; }
if [ "$(id -u)" != 0 ]; then
	echo "kvbroker needs these Debian packages; run as root:" >&2
	echo "  apt-get install -y --no-install-recommends$missing" >&2
	exit 1
fi
echo "deps.sh: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
# Debian's prometheus package enables and starts a system Prometheus on
# :9090; the tests start their own: stop the one this script just installed
case " $missing " in
*" prometheus "*)
	if command -v systemctl >/dev/null 2>&1; then
		systemctl disable --now prometheus >/dev/null 2>&1 || true
	fi
	;;
esac
