#!/bin/bash
# SPDX-License-Identifier: MIT
#
# resolve-guest.sh BUILD - address resolution on a real verbs device (the
# soft-RoCE guest of rxe-runner.sh): rdma_where must name, for the guest's
# address, the device whose netdev holds it and the GID index whose gid
# file holds ::ffff:<address> with type "RoCE v2" (read here from sysfs
# with the shell, not with the code under test). In the guest it also adds
# a second device (rxe1 on dummy1, 192.0.2.2/32 and 192.0.2.3/32) and
# checks that its addresses resolve to rxe1, each to its own GID index,
# that a peer address on dummy0's subnet resolves through rxe0, and that a
# broker started with --host-ip 192.0.2.3 and no --gid-index / --rdma-dev
# says it took rxe1 and 192.0.2.3's GID (not the first IPv4 one, the
# transport's own default). The topology module lists both devices from
# the real sysfs. Exit 77 without a device or rdma_cm.
set -u
BUILD=${1:?build dir}
WHERE=$BUILD/tests/rdma/rdma_where
BROKER=$BUILD/broker/kvbroker
IP1=${KVB_PAIR_IP:-192.0.2.1}
IP2=192.0.2.2
IP3=192.0.2.3
PEER=192.0.2.9

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root"
ls /sys/class/infiniband/ 2>/dev/null | grep -q . || skip "no RDMA device"
[ -e /dev/infiniband/rdma_cm ] || skip "no /dev/infiniband/rdma_cm (rdma_ucm)"
[ -x "$WHERE" ] || skip "rdma_where not built"

# netdev holding an IPv4 address, then the RDMA device/port on it
netdev_of() { ip -o -4 addr show | awk -v a="$1" '{ split($4, p, "/"); if (p[1] == a) print $2 }'; }
rdma_of() { rdma link show | awk -v n="$1" '$NF == n { print $2 }'; }
# index of the RoCE v2 entry holding ::ffff:$3 in $1 port $2, "" if none
want_index() {
	local hex f i
	hex=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' \
		$(echo "$3" | tr . ' '))
	# one grep over the table (rxe has 1024 entries: a cat each is slow
	# in an emulated guest), then the type of the few that match
	for f in $(grep -lx "$hex" /sys/class/infiniband/$1/ports/$2/gids/* \
		2>/dev/null); do
		i=${f##*/}
		[ "$(cat "/sys/class/infiniband/$1/ports/$2/gid_attrs/types/$i" \
			2>/dev/null)" = "RoCE v2" ] && { echo "$i"; return; }
	done
}
# field $2 of rdma_where's first line $1
field() { echo "$1" | head -n1 | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# check IP [TIMEOUT]: rdma_where's answer against sysfs; sets DEV, GID
check() {
	local out nd link dev port want
	out=$("$WHERE" "$@") || fail "rdma_where $*: exit $?"
	echo "$out"
	nd=$(netdev_of "$(field "$out" local)")
	link=$(rdma_of "$nd")
	[ -n "$link" ] || fail "no RDMA device on $nd"
	dev=${link%/*}
	port=${link#*/}
	want=$(want_index "$dev" "$port" "$(field "$out" local)")
	[ -n "$want" ] || fail "no RoCE v2 GID of $(field "$out" local) on $link"
	echo "sysfs: $(field "$out" local) on $nd -> $dev port $port, RoCE v2 GID index $want"
	[ "$(field "$out" dev)" = "$dev" ] || fail "device $(field "$out" dev), want $dev"
	[ "$(field "$out" port)" = "$port" ] || fail "port $(field "$out" port), want $port"
	[ "$(field "$out" gid_index)" = "$want" ] || fail "GID index $(field "$out" gid_index), want $want"
	[ "$(field "$out" gid_type)" = v2 ] || fail "GID type not v2"
	DEV=$dev
	GID=$want
}

ip addr show | grep -q "inet $IP1/" || skip "no interface with $IP1"
echo "== $IP1 (the guest's address)"
check "$IP1"
DEV1=$DEV

if [ "${KVB_RXE_GUEST:-}" != 1 ]; then
	echo "second device: only in the rxe guest (KVB_RXE_GUEST=1)"
	exit 0
fi
T=$(mktemp -d /tmp/kvb-resolve.XXXXXX)
BPID=
cleanup() {
	[ -n "$BPID" ] && kill -9 "$BPID" 2>/dev/null && wait "$BPID" 2>/dev/null
	rdma link delete rxe1 2>/dev/null
	ip link del dummy1 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
ip link add dummy1 type dummy && ip addr add $IP2/32 dev dummy1 &&
	ip link set dummy1 up && rdma link add rxe1 type rxe netdev dummy1 ||
	fail "cannot add rxe1 on dummy1"
for _ in $(seq 200); do # the GID table fills asynchronously
	[ -n "$(want_index rxe1 1 $IP2)" ] && break
	sleep 0.1
done
ip addr add $IP3/32 dev dummy1 || fail "cannot add $IP3"
for _ in $(seq 200); do
	[ -n "$(want_index rxe1 1 $IP3)" ] && break
	sleep 0.1
done
echo "== $IP2 (on rxe1)"
check "$IP2"
[ "$DEV" = rxe1 ] || fail "$IP2 resolved to $DEV, not rxe1"
GID2=$GID
echo "== $IP3 (on rxe1 too, after $IP2)"
check "$IP3"
[ "$DEV" = rxe1 ] || fail "$IP3 resolved to $DEV, not rxe1"
GID3=$GID
[ "$GID3" != "$GID2" ] || fail "$IP2 and $IP3 share GID index $GID2"
echo "== $IP1 again (still $DEV1 with rxe1 there)"
check "$IP1"
[ "$DEV" = "$DEV1" ] || fail "$IP1 moved to $DEV"
echo "== $PEER (a peer on dummy0's subnet: the route's device)"
"$WHERE" $PEER && fail "$PEER resolved without a timeout (not ours)"
check $PEER 2000
[ "$DEV" = "$DEV1" ] || fail "$PEER resolved through $DEV, not $DEV1"

echo "== topology on the guest's sysfs: rxe devices have no PCI parent"
out=$("$WHERE" --numa 0) || fail "rdma_where --numa 0: exit $?"
echo "$out"
for d in "$DEV1" rxe1; do
	echo "$out" | grep -qx "nic=$d pci= numa=-1 ports=1:active:eth" ||
		fail "topology: no line for $d"
done
echo "$out" | grep -qx "pick=$DEV1 port=1" || fail "topology: pick"

echo "== broker --host-ip $IP3, no --rdma-dev / --gid-index"
"$BROKER" --socket "$T/b.sock" --host-ip $IP3 --transport rdma \
	--handshake-port 6511 --notify-port 61511 >"$T/broker.log" 2>&1 &
BPID=$!
# the control socket comes before the transports: wait for rdma's verdict
for _ in $(seq 1200); do # 60 s: the emulated guest is slow
	grep -q "transport rdma ready\|transport rdma: unavailable" \
		"$T/broker.log" && break
	kill -0 $BPID 2>/dev/null || break
	sleep 0.05
done
grep "transport rdma" "$T/broker.log"
grep -q "transport rdma ready" "$T/broker.log" ||
	{ cat "$T/broker.log"; fail "broker did not open rdma"; }
grep -q "transport rdma: $IP3: rxe1 port 1 GID index $GID3 (RoCE v2)" \
	"$T/broker.log" || fail "broker did not log rxe1 GID index $GID3"
grep -q "transport rdma ready (rxe1," "$T/broker.log" ||
	fail "broker did not open rxe1"
echo "PASS"
