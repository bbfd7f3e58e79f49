#!/bin/bash
# SPDX-License-Identifier: MIT
#
# nics-guest.sh BUILD [bench MIB | small N] - the rdma transport over two verbs
# devices in the soft-RoCE guest of rxe-runner.sh: adds rxe1 on dummy1
# (192.0.2.3/32; rxe0 on dummy0 is the guest's), runs rdma_nics_test
# (regions on each NIC, WRITE/READ byte-checked, then `ip link set dummy1
# down` mid-run), and removes rxe1 and dummy1 again.
# With "bench MIB": MIB MiB of large writes over rxe0 alone (1 QP, then 2
# QPs) and over rxe0,rxe1 (1 QP per NIC pair), one run each.
# With "small N": N small writes per region over rxe0 alone, rxe1 alone
# and rxe0,rxe1 (one region homed on each NIC), then over both regions.
# Exit 77 outside the guest (KVB_RXE_GUEST=1) or without rxe0.
set -u
BUILD=${1:?build dir}
MODE=${2:-test}
MIB=${3:-512}
PROG=$BUILD/tests/rdma/rdma_nics_test
IP=192.0.2.3

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root"
[ "${KVB_RXE_GUEST:-}" = 1 ] || skip "only in the rxe guest (KVB_RXE_GUEST=1)"
[ -e /sys/class/infiniband/rxe0 ] || skip "no rxe0"
[ -x "$PROG" ] || skip "rdma_nics_test not built"

# index of the RoCE v2 GID holding ::ffff:$2 on $1 port 1, "" if none
want_index() {
	local hex f
	hex=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' \
		$(echo "$2" | tr . ' '))
	for f in $(grep -lx "$hex" /sys/class/infiniband/$1/ports/1/gids/* \
		2>/dev/null); do
		[ "$(cat "/sys/class/infiniband/$1/ports/1/gid_attrs/types/${f##*/}" \
			2>/dev/null)" = "RoCE v2" ] && { echo "${f##*/}"; return; }
	done
}
cleanup() {
	rdma link delete rxe1 2>/dev/null
	ip link del dummy1 2>/dev/null
}
trap cleanup EXIT
cleanup
ip link add dummy1 type dummy && ip addr add $IP/32 dev dummy1 &&
	ip link set dummy1 up && rdma link add rxe1 type rxe netdev dummy1 ||
	fail "cannot add rxe1 on dummy1"
for _ in $(seq 200); do # the GID table fills asynchronously
	[ -n "$(want_index rxe1 $IP)" ] && break
	sleep 0.1
done
[ -n "$(want_index rxe1 $IP)" ] || fail "no RoCE v2 GID of $IP on rxe1"

if [ "$MODE" = bench ]; then
	"$PROG" bench rxe0 "$MIB" 1 || fail "bench rxe0"
	"$PROG" bench rxe0 "$MIB" 2 || fail "bench rxe0, 2 QPs"
	"$PROG" bench rxe0,rxe1 "$MIB" 1 || fail "bench rxe0,rxe1"
	exit 0
fi
if [ "$MODE" = small ]; then
	for d in rxe0 rxe1 rxe0,rxe1; do
		"$PROG" small $d "$MIB" || fail "small $d"
	done
	exit 0
fi
KVB_RDMA_DEVS=rxe0,rxe1 KVB_NICS_DOWN="ip link set dummy1 down" \
	timeout 240 "$PROG"
rc=$?
[ $rc = 0 ] || fail "rdma_nics_test: exit $rc"
echo PASS
