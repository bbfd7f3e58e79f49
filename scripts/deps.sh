#!/bin/sh
# Install the Debian packages kvbroker's build and tests need.
# As root: installs what is missing with apt-get. Otherwise: prints the exact
# apt-get line and fails. Usage: scripts/deps.sh [--check]
set -eu
PKGS="build-essential cmake pkg-config libibverbs-dev librdmacm-dev \
libzmq3-dev libmsgpack-dev libcmocka-dev libamdhip64-dev libsodium-dev \
python3 python3-zmq python3-msgpack python3-pytest python3-numpy \
python3-torch python3-cffi python3-pip python3-setuptools iproute2 iperf3 gnuplot-nox \
qemu-system-x86 busybox-static cpio kmod xz-utils zstd rdma-core \
ibverbs-providers ibverbs-utils rdmacm-utils perftest dpdk-dev procps"
# test-only: promtool and a Prometheus server for test_metrics_prom (it
# skips without them); only the binaries are used, see below
TEST_PKGS="prometheus"
PKGS="$PKGS $TEST_PKGS"

missing=""
for p in $PKGS; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing="$missing $p"
	fi
done
[ -z "$missing" ] && exit 0
[ "${1:-}" = "--check" ] && { echo "missing:$missing"; exit 1; }
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
