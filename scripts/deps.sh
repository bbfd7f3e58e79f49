#!/bin/sh
# Install the Debian packages kvbroker needs, in layers (docs/service.md):
#   build  compiling kvbroker and running the demo (`make build`, `make run`)
#   test   what the tests use besides (`make test`, test-asan, test-tsan)
#   bench  what `make bench` uses besides
#   fuzz   the libFuzzer build (`make fuzz`)
#   deb    building and checking the Debian package (`make deb`)
#   image  building and checking the container image (`make image`)
#   all    every layer (the default; CI)
# The test layer also installs deploy/tools' npm packages (the manifest and
# dashboard checks, docs/deploy.md) with `npm ci`, from its lock file.
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
# python3-yaml: the pod simulation of deploy/kubernetes (pod_boundary)
TEST_PKGS="libcmocka-dev python3 python3-zmq python3-msgpack python3-pytest \
python3-numpy python3-torch python3-cffi python3-pip python3-setuptools python3-yaml \
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
# deploy/image: the root filesystem (mmdebstrap), the OCI image (umoci,
# skopeo) and the check that runs it (podman, where it can run containers)
IMAGE_PKGS="mmdebstrap umoci skopeo podman"

check=
layers=
for a in "$@"; do
	case $a in
	--check) check=1 ;;
	build | test | bench | fuzz | deb | image | all) layers="$layers $a" ;;
	*)
		echo "deps.sh: unknown layer '$a' (build, test, bench, fuzz, deb, image, all)" >&2
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
	image) PKGS="$PKGS $IMAGE_PKGS" ;;
	all) PKGS="$PKGS $BUILD_PKGS $TEST_PKGS $BENCH_PKGS $FUZZ_PKGS $DEB_PKGS $IMAGE_PKGS" ;;
	esac
done
# Node.js for deploy/tools: a node already on the PATH (any source) will
# do, else Debian's nodejs and npm
npm_tools=
case " $layers " in *" test "* | *" all "*) npm_tools=1 ;; esac
if [ -n "$npm_tools" ] && ! { command -v node >/dev/null && command -v npm >/dev/null; }; then
	PKGS="$PKGS nodejs npm"
fi
TOOLS=$(dirname "$0")/../deploy/tools

# deploy/tools/node_modules from package-lock.json (npm ci), when missing
# or older than the lock file
npm_deps() {
	[ -n "$npm_tools" ] || return 0
	# shellcheck disable=SC3013 # dash's test has -nt
	if [ -f "$TOOLS/node_modules/.package-lock.json" ] &&
		[ ! "$TOOLS/package-lock.json" -nt "$TOOLS/node_modules/.package-lock.json" ]; then
		return 0
	fi
	if [ -n "$check" ]; then
		echo "missing: deploy/tools/node_modules (npm ci --prefix deploy/tools)"
		return 1
	fi
	echo "deps.sh: npm ci in deploy/tools"
	npm ci --prefix "$TOOLS" --no-audit --no-fund --loglevel=error >/dev/null
}

missing=""
for p in $PKGS; do
	case " $missing " in *" $p "*) continue ;; esac
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing="$missing $p"
	fi
done
if [ -z "$missing" ]; then
	npm_deps
	exit
fi
[ -n "$check" ] && { echo "missing:$missing"; npm_deps; exit 1; }
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
npm_deps
