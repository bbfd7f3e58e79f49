#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Two kvbroker daemons on one RDMA device (soft-RoCE rxe0 in the guest of
# rxe-runner.sh), real RC queue pairs between them, P workers on broker A and
# D workers on broker B (tests/xnode/xnode_worker: every byte checked at D).
#
#   broker-pair.sh BUILD_DIR CASE
#   CASE: write | read | wcerr | gpu_write | port_events | write_split | nics
#         | nics_failover
#
# wcerr: D replaces one layer's region while P writes: P's RDMA writes to the
# old region fail with a remote access error, exactly the transfers that hit
# it fail, the queue pairs reset and reconnect, a fresh handshake brings the
# new region, and the last transfers succeed.
# gpu_write: the KV regions on both sides are GPU memory of the host gpu
# backend (kvb_mem_register_gpu; memfd "device memory"): the brokers import
# them and register them with the NIC (no dmabuf there: by address).
# write_split: WRITE TP 2 -> TP 4 with the KV heads split (a P rank holds 4
# heads, a D rank 2): one RDMA WRITE per token of each block, bytes checked.
# port_events: the interface under rxe0 goes down and up between two good
# runs: both brokers read the device's PORT_ERR and PORT_ACTIVE events,
# log them and show the port's state in `kvbctl stats`.
# nics: both brokers drive two NICs, --rdma-dev rxe0,rxe1 (rxe1 on dummy1,
# 192.0.2.3/32, made here and removed at the end; only in the rxe guest):
# WRITE and READ byte-checked, each broker's regions homed on both NICs
# (logged) and both NICs carried bytes (the peer's keys and nearest NIC of
# each region come in the handshake).
# nics_failover: the same two NICs; a WRITE run of 160 transfers (4 at a
# time, back to back) during which dummy1 (rxe1) goes down 1 s after the
# queue pairs connected: every transfer ends, the last ones succeed (every
# byte of the ones that succeed checked at D), A moved chains to rxe0
# (`moved`), and A did not re-handshake during the run: a queue pair that
# failed on rxe1 (if one had chains in flight there) was parked alone
# (`qp_parked`, printed) instead of resetting the endpoint. Then dummy1
# comes back up, and a second run all succeeds with rxe1 carrying bytes
# again (the endpoint, idle, was re-handshaken and the parked pair
# connected).
# Exits 77 without an RDMA device or without root.
set -u
BUILD=${1:?build dir}
CASE=${2:?case}
BROKER=$BUILD/broker/kvbroker
KVBCTL=$BUILD/broker/kvbctl
WORKER=$BUILD/tests/xnode/xnode_worker
IP=${KVB_PAIR_IP:-192.0.2.1}

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root"
ls /sys/class/infiniband/ 2>/dev/null | grep -q . || skip "no RDMA device"
[ -x "$WORKER" ] || skip "xnode_worker not built"
ip addr show 2>/dev/null | grep -q "inet $IP/" || skip "no interface with $IP"
ip link set lo up 2>/dev/null

T=$(mktemp -d /tmp/kvb-pair.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$T"
	if [ -n "${RXE1:-}" ]; then
		rdma link delete rxe1 2>/dev/null
		ip link del dummy1 2>/dev/null
	fi
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	for f in "$T"/*.log; do
		echo "---- $f (tail)"
		tail -n 30 "$f"
	done
	exit 1
}
TTO=${KVB_PAIR_TTO:-8}
start_broker() { # name hs_port notify_port
	"$BROKER" --socket "$T/$1.sock" --host-ip "$IP" --transport rdma \
		--handshake-port "$2" --notify-port "$3" \
		--transfer-timeout "$TTO" --defer-timeout "$TTO" ${BROKER_ARGS:-} \
		>>"$T/broker-$1.log" 2>&1 &
	PIDS+=($!)
	eval "BPID_$1=$!"
	for _ in $(seq 1200); do # 60 s: the emulated guest is slow
		[ -S "$T/$1.sock" ] && return 0
		sleep 0.05
	done
	fail "broker $1 did not start"
}
stats() { KVB_SOCKET="$T/$1.sock" "$KVBCTL" stats --json; }

# run MODE P_TP D_TP [worker args...]
run() {
	local mode=$1 ptp=$2 dtp=$3 rc=0 wp=()
	shift 3
	rm -rf "$T/bar" && mkdir -p "$T/bar"
	for ((r = 0; r < ptp; r++)); do
		"$WORKER" --role P --socket "$T/a.sock" --peer "$IP:6401" \
			--mode "$mode" --tp $r --tp-size "$ptp" --peer-tp-size "$dtp" \
			--barrier "$T/bar" --timeout $((TTO * 4)) "$@" ${PARGS:-} \
			>>"$T/worker-P$r.log" 2>&1 &
		wp+=($!)
	done
	for ((r = 0; r < dtp; r++)); do
		"$WORKER" --role D --socket "$T/b.sock" --peer "$IP:6301" \
			--mode "$mode" --tp $r --tp-size "$dtp" --peer-tp-size "$ptp" \
			--barrier "$T/bar" --timeout $((TTO * 4)) "$@" ${DARGS:-} \
			>>"$T/worker-D$r.log" 2>&1 &
		wp+=($!)
	done
	for p in "${wp[@]}"; do wait "$p" || rc=1; done
	grep -h '^xnode_worker' "$T"/worker-*.log | sort
	return $rc
}

# GPU regions: the brokers open the host gpu backend too
[ "$CASE" = gpu_write ] && export KVB_GPU_BACKEND=host
# two NICs: rxe1 on dummy1 next to the guest's rxe0
if [ "$CASE" = nics ] || [ "$CASE" = nics_failover ]; then
	[ "${KVB_RXE_GUEST:-}" = 1 ] || skip "nics: only in the rxe guest"
	[ -e /sys/class/infiniband/rxe1 ] && skip "rxe1 exists already"
	RXE1=1
	ip link add dummy1 type dummy && ip addr add 192.0.2.3/32 dev dummy1 &&
		ip link set dummy1 up && rdma link add rxe1 type rxe netdev dummy1 ||
		fail "cannot add rxe1 on dummy1"
	for _ in $(seq 200); do # the GID table fills asynchronously
		grep -qx '0000:0000:0000:0000:0000:ffff:c000:0203' \
			/sys/class/infiniband/rxe1/ports/1/gids/* 2>/dev/null && break
		sleep 0.1
	done
	BROKER_ARGS="--rdma-dev rxe0,rxe1"
fi
start_broker a 6301 61005
start_broker b 6401 62005

case "$CASE" in
write) run write 2 2 --layers 8 --xfers 6 --conc 3 || fail "WRITE over rdma" ;;
read) run read 2 2 --layers 8 --xfers 6 --conc 3 || fail "READ over rdma" ;;
wcerr)
	# P writes a layer every 50 ms, one transfer at a time; D swaps layer
	# 3's region as soon as its 3rd transfer ended: the 4th transfer's
	# layer 3 write hits the old region
	DARGS="--swap-layer 3 --swap-after-xfers 3" run write 1 1 --layers 8 \
		--xfers 8 --conc 1 --layer-delay-ms 50 --expect-some-fail ||
		fail "a work-completion error did not fail just the transfers that hit it"
	;;
gpu_write)
	run write 2 2 --layers 8 --xfers 6 --conc 3 --gpu host ||
		fail "WRITE of GPU regions over rdma"
	n=$(grep -c "GPU memory registered with the NIC" "$T/broker-a.log" "$T/broker-b.log" |
		awk -F: '{s += $2} END {print s}')
	[ "$n" -ge 32 ] || fail "$n GPU regions registered with the NIC, expected 32"
	;;
write_split)
	PARGS="--heads 4" DARGS="--heads 2 --peer-heads 4" \
		run write 2 4 --layers 4 --xfers 4 --conc 2 ||
		fail "WRITE over rdma, heads split"
	;;
port_events)
	run write 1 1 --layers 4 --xfers 2 --conc 2 --prefix before ||
		fail "WRITE before the port went down"
	dev=$(ip -o -4 addr show | awk -v ip="$IP" 'index($4, ip "/") == 1 {print $2; exit}')
	[ -n "$dev" ] || fail "no interface holds $IP"
	port_state() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["remote"]["rdma_device"]["port"])' "$(stats "$1")"; }
	wait_log() { # what: until both brokers logged it (20 s)
		for _ in $(seq 200); do
			grep -q "$1" "$T/broker-a.log" && grep -q "$1" "$T/broker-b.log" && return 0
			sleep 0.1
		done
		fail "the brokers did not both log '$1'"
	}
	ip link set "$dev" down || fail "ip link set $dev down"
	wait_log "rdma: port 1 down"
	[ "$(port_state a)" = down ] || fail "A's stats: port $(port_state a), not down"
	ip link set "$dev" up || fail "ip link set $dev up"
	wait_log "port 1 active again" # "rdma: <dev> port 1 active again"
	[ "$(port_state a)" = active ] || fail "A's stats: port $(port_state a), not active"
	run write 1 1 --layers 4 --xfers 2 --conc 2 --prefix after ||
		fail "WRITE after the port came back"
	;;
nics)
	run write 2 2 --layers 8 --xfers 6 --conc 3 ||
		fail "WRITE over two NICs"
	run read 2 2 --layers 8 --xfers 4 --conc 2 --prefix rd ||
		fail "READ over two NICs"
	for side in a b; do
		python3 - "$(stats $side)" "$side" <<'PY' || fail "broker $side: NICs"
import json, sys
d = json.loads(sys.argv[1])
nics = d["nics"]
for n in nics:
    print(f"broker {sys.argv[2]} {n['name']}: {n['regions']} regions, "
          f"{n['qps']} QPs, {n['bytes']} bytes in {n['doorbells']} "
          f"doorbells, {n['moved']} moved")
assert len(nics) == 2, "not two NICs"
assert all(n["bytes"] > 0 for n in nics), "a NIC carried no bytes"
PY
		# the workers' regions (gone with them now) went to both NICs
		for d in rxe0 rxe1; do
			grep -q "): NIC $d" "$T/broker-$side.log" ||
				fail "broker $side: no region homed on $d"
		done
	done
	;;
nics_failover)
	nic_field() { # side nic field
		python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print([n for n in d["nics"] if n["name"] == sys.argv[2]][0][sys.argv[3]])' "$(stats "$1")" "$2" "$3"
	}
	ready_lines() { grep -c "rdma queue pairs ready" "$T/broker-a.log"; }
	run write 2 2 --layers 8 --xfers ${FO_XFERS:-160} --conc 4 \
		--allow-fail --timeout 240 --prefix fo &
	rp=$!
	for _ in $(seq 600); do # 60 s: until data moves
		[ "$(ready_lines)" -ge 1 ] && break
		sleep 0.1
	done
	sleep "${FO_SLEEP:-1}"
	t0=$(date +%s.%N)
	ip link set dummy1 down || fail "ip link set dummy1 down"
	wait "$rp" || fail "the WRITE run across rxe1 going down: a transfer did not end, or the last ones failed"
	t1=$(date +%s.%N)
	echo "failover: the run ended $(python3 -c "print(round($t1 - $t0, 2))") s after dummy1 went down"
	grep -h "failed: parked" "$T/broker-a.log" | head -n 2
	parked=$(nic_field a rxe1 qp_parked)
	moved=$(nic_field a rxe0 moved)
	echo "broker a: rxe1 qp_parked $parked, rxe0 moved $moved"
	python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("broker a: transfers done", d["transfers_done"], "failed", d["transfers_failed"])' "$(stats a)"
	[ "$moved" -ge 1 ] || fail "broker a moved no chain to rxe0"
	# a queue pair that failed on rxe1 was parked alone: no reset of the
	# endpoint, no second handshake during the run
	[ "$(ready_lines)" = 1 ] ||
		fail "broker a re-handshook during the run ($(ready_lines) 'queue pairs ready')"
	b1=$(nic_field a rxe1 bytes)
	ip link set dummy1 up || fail "ip link set dummy1 up"
	for _ in $(seq 200); do # 20 s
		grep -q "rxe1 port 1 active again" "$T/broker-a.log" && break
		sleep 0.1
	done
	grep -q "rxe1 port 1 active again" "$T/broker-a.log" ||
		fail "broker a did not see rxe1 active again"
	run write 2 2 --layers 8 --xfers 4 --conc 2 --prefix back ||
		fail "WRITE after rxe1 came back"
	b2=$(nic_field a rxe1 bytes)
	echo "broker a: rxe1 carried $((b2 - b1)) bytes after it came back"
	[ "$b2" -gt "$b1" ] || fail "rxe1 carried nothing after it came back"
	;;
bench)
	# not a test: 8 P workers x 32 layers through one broker pair
	run write 8 8 --layers 32 --xfers ${PAIR_XFERS:-4} --conc 2 \
		--no-verify >/dev/null || fail "8x32 run"
	;;
*) echo "unknown case $CASE"; exit 2 ;;
esac
s=$(stats a) || fail "stats"
python3 - "$s" <<'PY' || true
import json, sys
d = json.loads(sys.argv[1])
for t in d["per_transport"]:
    if t["name"] == "rdma":
        print(f"broker A rdma: {t['wrs']} WRs in {t['doorbells']} doorbells "
              f"({t['wrs']/max(t['doorbells'],1):.1f} per doorbell), "
              f"{t['cqes']} CQEs, {t['errors']} errors")
print("broker A: done", d["transfers_done"], "failed", d["transfers_failed"])
PY
# the broker times its ibv_post_send calls (kvbench's broker post_cpu)
python3 - "$s" <<'PY' || fail "rdma post_ns missing or 0 after doorbells"
import json, sys
d = json.loads(sys.argv[1])
t = [t for t in d["per_transport"] if t["name"] == "rdma"]
sys.exit(0 if t and (t[0]["doorbells"] == 0 or t[0]["post_ns"] > 0) else 1)
PY
KVB_SOCKET="$T/a.sock" "$KVBCTL" stats | grep -E "^peer|^  qp|^wr_per_doorbell|^doorbells|^wrs|^rdma port"
grep -h "rdma queue pairs ready\|refused\|rdma: port" "$T"/broker-*.log | grep -v "GPU regions will be refused" | head -n 12
kill -TERM "$BPID_a" "$BPID_b"
wait "$BPID_a" || fail "broker a exit status"
echo "PASS: rdma $CASE"
