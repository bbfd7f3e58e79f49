#!/usr/bin/env bash
# `make bench`: the standard kvbench sweep (about 10 minutes on a 2-core
# machine). Writes bench/results/*.json, *.txt and *.png and regenerates
# BENCHMARKS.md with the tables, the plots, the machine, the date and the
# exact commands.
#
# Environment: BUILD (default build), QUICK=1 (a short version, about a
# minute: fewer steps, fewer samples), ITERS_SMALL (steps per worker of the
# small-block case on `local`), ITERS_LARGE_TOTAL (steps of the large-block
# case on `local`, split among the workers: kvbench --iters-total, so every
# worker count copies the same bytes and no trial is a fraction of a second
# long), ITERS_TCP_SMALL / ITERS_TCP_LARGE_TOTAL (the same on `tcp`),
# ITERS_RDMA_SMALL / ITERS_RDMA_LARGE
# (the two cases on `rdma`), ITERS_GPU_SMALL / ITERS_GPU_LARGE (the same on `gpu`), KVBENCH
# (the binary), RDMA=0 (skip the rdma step), RDMA_QPS (the rdma brokers'
# --qp-per-transfer, default 8), GPU=0 (skip the gpu step), REPEAT_LARGE
# (kvbench --repeat of the large-block cases, default 3: direct and broker
# alternate, ABBA, and the figures are the medians, so that a drift in this
# shared machine's load does not land on one mode only; QUICK=1: 1).
#
# tcp: kvbench places P and D in two network namespaces joined by a veth
# pair when run as root with `ip netns` (it makes and deletes them itself),
# else on loopback; the tables say which. Skipped when kvbench was built
# without the tcp transport.
#
# rdma: one boot of the soft-RoCE guest (tests/rdma/rxe-runner.sh, qemu TCG,
# rxe0 on 192.0.2.1) runs every rdma case; the guest sees the host's / read
# only, so the cases write under $BUILD/bench-rdma and the results are copied
# to bench/results afterwards. Skipped, with a line saying why, without qemu
# (or the kernel package), or when kvbench was built without libibverbs.
# Soft-RoCE under TCG is ~1000x slower than a NIC: few steps, and the
# large-block case scaled down (64 KiB x 8 layers x 2 requests; the local
# one, 256 KiB x 32 layers x 4, takes minutes per step there).
#
# gpu: only where `kvbench workload --transport gpu --gpu-backend auto` finds
# a device (a tiny probe run; exit 77 = no GPU): then a correctness pass and
# the two cases in device memory. Else skipped, with the probe's reason in
# BENCHMARKS.md. The host backend (memfd "device memory") is never used here:
# it measures the host copy path, not a GPU (ctest kvbench_gpu_host runs it).
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
KVBENCH=${KVBENCH:-$BUILD/bench/kvbench/kvbench}
RES=bench/results
QUICK=${QUICK:-0}
QNOTE=
if [ "$QUICK" = 1 ]; then QNOTE=", QUICK=1: the short version"; fi

if [ "$QUICK" = 1 ]; then
	ITERS_SMALL=${ITERS_SMALL:-30}
	ITERS_LARGE_TOTAL=${ITERS_LARGE_TOTAL:-24}
	ITERS_TCP_SMALL=${ITERS_TCP_SMALL:-20}
	ITERS_TCP_LARGE_TOTAL=${ITERS_TCP_LARGE_TOTAL:-8}
	ITERS_RDMA_SMALL=${ITERS_RDMA_SMALL:-2}
	ITERS_RDMA_LARGE=${ITERS_RDMA_LARGE:-2}
	ITERS_GPU_SMALL=${ITERS_GPU_SMALL:-10}
	ITERS_GPU_LARGE=${ITERS_GPU_LARGE:-4}
	REPEAT_LARGE=${REPEAT_LARGE:-1}
	RATE_S=2
	LAT_N=100000
	RING_S=1
else
	ITERS_SMALL=${ITERS_SMALL:-1500}
	ITERS_LARGE_TOTAL=${ITERS_LARGE_TOTAL:-400}
	ITERS_TCP_SMALL=${ITERS_TCP_SMALL:-600}
	ITERS_TCP_LARGE_TOTAL=${ITERS_TCP_LARGE_TOTAL:-36}
	ITERS_RDMA_SMALL=${ITERS_RDMA_SMALL:-20}
	ITERS_RDMA_LARGE=${ITERS_RDMA_LARGE:-4}
	ITERS_GPU_SMALL=${ITERS_GPU_SMALL:-200}
	ITERS_GPU_LARGE=${ITERS_GPU_LARGE:-20}
	REPEAT_LARGE=${REPEAT_LARGE:-3}
	RATE_S=5
	LAT_N=300000
	RING_S=2
fi

if [ ! -x "$KVBENCH" ]; then
	echo "bench: building kvbench in $BUILD"
	cmake --build "$BUILD" -j"${JOBS:-2}" --target kvbench kvbroker_daemon
fi
command -v gnuplot >/dev/null || {
	echo "bench: gnuplot is missing (apt-get install gnuplot-nox)" >&2
	exit 1
}
mkdir -p "$RES"

CMDS=()
# run NAME ARGS...: kvbench ARGS, table to $RES/NAME.txt and the terminal
run() {
	local name=$1 t0
	shift
	echo
	echo "== $name: kvbench $*"
	t0=$(date +%s)
	"$KVBENCH" "$@" | tee "$RES/$name.txt"
	CMDS+=("$KVBENCH $*    # $(($(date +%s) - t0)) s")
}

TCP=0
if "$KVBENCH" workload --transport tcp --help >/dev/null 2>&1; then
	TCP=1
fi
# rdma: kvbench built with it, the guest runner's qemu there
RDMA_WHY=
if [ "${RDMA:-1}" = 0 ]; then
	RDMA_WHY="RDMA=0"
elif ! "$KVBENCH" workload --transport rdma --help >/dev/null 2>&1; then
	RDMA_WHY="kvbench built without the rdma transport (libibverbs)"
elif ! command -v qemu-system-x86_64 >/dev/null; then
	RDMA_WHY="qemu-system-x86_64 not installed (scripts/deps.sh): no soft-RoCE guest"
fi
# gpu: kvbench built with it, and a device there (a tiny probe run, exit 77
# without a GPU; its first line of stderr says why)
GPU_WHY=
if [ "${GPU:-1}" = 0 ]; then
	GPU_WHY="GPU=0"
elif ! "$KVBENCH" workload --transport gpu --help >/dev/null 2>&1; then
	GPU_WHY="kvbench built without the gpu transport (bridge/gpu)"
else
	set +e
	gout=$("$KVBENCH" workload --transport gpu --gpu-backend auto \
		--workers 1 --layers 1 --blocks 1 --requests 1 --iters 1 \
		--mode direct 2>&1 >/dev/null)
	grc=$?
	set -e
	gout=$(printf '%s\n' "$gout" | head -n 1)
	if [ "$grc" = 77 ]; then
		GPU_WHY=${gout#kvbench: --transport gpu: }
	elif [ "$grc" != 0 ]; then
		GPU_WHY="the gpu probe run failed (status $grc): ${gout:-no message}"
	fi
fi
start=$(date +%s)
TRS=local
[ "$TCP" = 1 ] || TRS="$TRS (kvbench built without tcp)"
[ "$TCP" = 0 ] || TRS="$TRS, tcp"
[ -n "$RDMA_WHY" ] || TRS="$TRS, rdma (soft-RoCE guest)"
[ -n "$GPU_WHY" ] || TRS="$TRS, gpu"
echo "bench: transports $TRS"
if [ -n "$RDMA_WHY" ]; then
	echo "bench: rdma skipped: $RDMA_WHY"
fi
if [ -n "$GPU_WHY" ]; then
	echo "bench: gpu skipped: $GPU_WHY"
fi

# 0. correctness first: every byte checked at D, both modes
run verify workload --workers 2 --layers 32 --iters 2 --mode both --verify \
	--json "$RES/verify.json"

# 1. small blocks: message-rate bound (512 B, 32 layers x 16 blocks)
SMALL=(--layers 32 --blocks 16 --block-bytes 512 --requests 8 --no-verify
	--mode both)
run workload-small workload "${SMALL[@]}" --iters "$ITERS_SMALL" \
	--sweep-workers 1,2,4,8 \
	--json "$RES/workload-small.json" --plot "$RES/workload-small.png"

# 2. large blocks: bandwidth bound (256 KiB, 32 layers x 4 blocks)
LARGE=(--layers 32 --blocks 4 --block-bytes 256K --requests 4 --no-verify
	--mode both --repeat "$REPEAT_LARGE")
run workload-large workload "${LARGE[@]}" --iters-total "$ITERS_LARGE_TOTAL" \
	--sweep-workers 1,2,4,8 \
	--json "$RES/workload-large.json" --plot "$RES/workload-large.png"

# 3. tcp, two nodes: the same two cases (fewer steps: the wire is slower),
#    after a correctness pass
if [ "$TCP" = 1 ]; then
	run verify-tcp workload --transport tcp --workers 2 --layers 32 \
		--iters 2 --mode both --verify --json "$RES/verify-tcp.json"
	run workload-tcp-small workload --transport tcp "${SMALL[@]}" \
		--iters "$ITERS_TCP_SMALL" --sweep-workers 1,2,4,8 \
		--json "$RES/workload-tcp-small.json" \
		--plot "$RES/workload-tcp-small.png"
	run workload-tcp-large workload --transport tcp "${LARGE[@]}" \
		--iters-total "$ITERS_TCP_LARGE_TOTAL" --sweep-workers 1,2,4,8 \
		--json "$RES/workload-tcp-large.json" \
		--plot "$RES/workload-tcp-large.png"
else
	rm -f "$RES"/verify-tcp.* "$RES"/workload-tcp-*
fi

# 4. rdma, in one boot of the soft-RoCE guest: a correctness pass, then the
#    small-block sweep and a large-block one scaled down to what emulated
#    soft-RoCE moves in a minute (64 KiB blocks, 8 layers, 2 requests)
SMALL_RDMA=(--layers 32 --blocks 16 --block-bytes 512 --requests 8
	--no-verify --mode both)
LARGE_RDMA=(--layers 8 --blocks 4 --block-bytes 64K --requests 2
	--no-verify --mode both --repeat "$REPEAT_LARGE")
# The brokers get RDMA_QPS queue pairs per peer (--qp-per-transfer, default
# 8; direct has one per worker): soft-RoCE serves a QP on one kernel thread,
# so one QP caps a node pair at about 45 MB/s in this guest whatever the
# worker count (measured: broker bandwidth 0.043-0.047 GB/s at W = 1..8
# with 1 QP); a NIC's QP is not bound that way.
RDMA_QPS=${RDMA_QPS:-8}
RQ="--broker-opts '--qp-per-transfer $RDMA_QPS'"
RDMA_CASES=(
	"verify-rdma workload --transport rdma --workers 2 --layers 32 --iters 2 --mode both --verify $RQ"
	"workload-rdma-small workload --transport rdma ${SMALL_RDMA[*]} --iters $ITERS_RDMA_SMALL --sweep-workers 1,2,4,8 $RQ"
	"workload-rdma-large workload --transport rdma ${LARGE_RDMA[*]} --iters $ITERS_RDMA_LARGE --sweep-workers 1,2,4,8 $RQ"
)
RDMA_OK=0
rm -f "$RES"/verify-rdma.* "$RES"/workload-rdma-*
if [ -z "$RDMA_WHY" ]; then
	JOB=$(readlink -f "$BUILD")/bench-rdma
	KVB_ABS=$(readlink -f "$KVBENCH")
	rm -rf "$JOB" && mkdir -p "$JOB"
	# the guest's job: every case, output under $JOB (the guest's only
	# writable host folder)
	{
		echo '#!/bin/sh'
		echo "# scripts/bench.sh: the rdma cases, inside the soft-RoCE guest"
		echo "rc=0"
		for c in "${RDMA_CASES[@]}"; do
			name=${c%% *}
			plot=
			[ "$name" = verify-rdma ] || plot=" --plot $JOB/$name.png"
			echo "t0=\$(date +%s)"
			echo "$KVB_ABS ${c#* } --json $JOB/$name.json$plot \\"
			echo "	>$JOB/$name.txt 2>$JOB/$name.err || rc=1"
			echo "echo \$((\$(date +%s) - t0)) >$JOB/$name.time"
		done
		# shellcheck disable=SC2016 # $rc belongs to the guest's script
		echo 'exit $rc'
	} >"$JOB/run.sh"
	chmod +x "$JOB/run.sh"
	echo
	echo "== rdma: one soft-RoCE guest boot: tests/rdma/rxe-runner.sh $JOB/run.sh"
	t0=$(date +%s)
	set +e
	KVB_RXE_RW="$JOB" KVB_RXE_TIMEOUT=${KVB_RXE_TIMEOUT:-600} \
		tests/rdma/rxe-runner.sh "$JOB/run.sh" >"$JOB/guest.log" 2>&1
	grc=$?
	set -e
	if [ "$grc" = 77 ]; then
		RDMA_WHY="the soft-RoCE guest cannot start here: $(grep -m1 SKIPPED "$JOB/guest.log" | sed 's/^[* ]*//; s/[* ]*$//')"
		echo "bench: rdma skipped: $RDMA_WHY"
	else
		for c in "${RDMA_CASES[@]}"; do
			name=${c%% *}
			[ -s "$JOB/$name.txt" ] || continue
			plot=
			[ "$name" = verify-rdma ] || plot=" --plot $RES/$name.png"
			echo
			echo "== $name (in the guest): kvbench ${c#* }"
			cat "$JOB/$name.txt"
			cp "$JOB/$name.txt" "$RES/"
			for ext in json png; do
				[ ! -e "$JOB/$name.$ext" ] || cp "$JOB/$name.$ext" "$RES/"
			done
			CMDS+=("$KVBENCH ${c#* } --json $RES/$name.json$plot    # in the guest, $(cat "$JOB/$name.time" 2>/dev/null || echo '?') s")
		done
		CMDS+=("# the rdma runs above, in one guest: KVB_RXE_RW=$JOB tests/rdma/rxe-runner.sh $JOB/run.sh    # $(($(date +%s) - t0)) s with the boot")
		if [ "$grc" = 0 ]; then
			RDMA_OK=1
		else
			echo "bench: the rdma step failed (guest status $grc): see $JOB/guest.log and $JOB/*.err" >&2
			tail -n 20 "$JOB/guest.log" >&2
			cat "$JOB"/*.err >&2 2>/dev/null || true
			RDMA_WHY="the rdma step failed (guest status $grc)"
		fi
	fi
fi

# 5. gpu, device memory on one node (a real GPU only): a correctness pass,
#    then the same two cases
rm -f "$RES"/verify-gpu.* "$RES"/workload-gpu-*
GPU_NAME=
if [ -z "$GPU_WHY" ]; then
	run verify-gpu workload --transport gpu --gpu-backend auto --workers 2 \
		--layers 32 --iters 2 --mode both --verify \
		--json "$RES/verify-gpu.json"
	GPU_NAME=$(sed -n '1s/^kvbench workload: transport gpu, //p' "$RES/verify-gpu.txt")
	run workload-gpu-small workload --transport gpu --gpu-backend auto \
		"${SMALL[@]}" --iters "$ITERS_GPU_SMALL" --sweep-workers 1,2,4,8 \
		--json "$RES/workload-gpu-small.json" \
		--plot "$RES/workload-gpu-small.png"
	run workload-gpu-large workload --transport gpu --gpu-backend auto \
		"${LARGE[@]}" --iters "$ITERS_GPU_LARGE" --sweep-workers 1,2,4,8 \
		--json "$RES/workload-gpu-large.json" \
		--plot "$RES/workload-gpu-large.png"
fi

# 6. the broker's own limits
run rate rate --workers 1 --burst 64 --bytes 64 --seconds "$RATE_S" \
	--json "$RES/rate.json"
run rate2 rate --workers 2 --burst 64 --bytes 64 --seconds "$RATE_S" \
	--json "$RES/rate2.json"
run lat lat --samples "$LAT_N" --json "$RES/lat.json"

# 7. the ring against DPDK's rte_ring
# (kvbench exits 2 there: capture first, pipefail would hide grep's match)
rh=$("$KVBENCH" ring --help 2>&1 || true)
case $rh in
*'built without'*)
	echo "bench: kvbench ring not built, skipped" | tee "$RES/ring.txt"
	;;
*)
	run ring ring --seconds "$RING_S" --json "$RES/ring.json"
	;;
esac

elapsed=$(($(date +%s) - start))

# --- BENCHMARKS.md --------------------------------------------------------
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)
# huge pages for shmem (the regions are memfds) move the local figures
thp=$(sed -n 's/.*\[\(.*\)\].*/\1/p' \
	/sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null)
table() { sed 's/^/    /' "$RES/$1.txt"; }
# sections TR SUFFIX LARGE [VERIFY_MORE] [LARGE_NOTE]: a transport's three
# BENCHMARKS.md sections (verify$SUFFIX, workload$SUFFIX-small, -large)
sections() {
	cat <<EOF
## $1: correctness pass (every byte verified at D${4:-})

$(table "verify$2")

## $1: small blocks (512 B), message rate

![$1 small blocks](bench/results/workload$2-small.png)

$(table "workload$2-small")

## $1: large blocks ($3), bandwidth
${5:+
$5
}
![$1 large blocks](bench/results/workload$2-large.png)

$(table "workload$2-large")

EOF
}
# the tcp placement kvbench reported ("network namespaces ..." / "loopback")
where=
if [ "$TCP" = 1 ]; then
	where=$(sed -n '1s/^kvbench workload: transport tcp, //p' "$RES/verify-tcp.txt")
fi
# broker/direct ratios of every workload sweep, one markdown table
ratios() {
	command -v python3 >/dev/null || {
		echo "(python3 missing: see the tables below)"
		return
	}
	python3 - "$RES" <<'PY'
import json, os, sys
res = sys.argv[1]
cases = [("local", "small", "workload-small"), ("local", "large", "workload-large"),
         ("tcp", "small", "workload-tcp-small"), ("tcp", "large", "workload-tcp-large"),
         ("rdma", "small", "workload-rdma-small"), ("rdma", "large", "workload-rdma-large"),
         ("gpu", "small", "workload-gpu-small"), ("gpu", "large", "workload-gpu-large")]
cols = [("doorbells", "doorbells"), ("wr_per_doorbell", "WR/db"),
        ("msg_rate_mps", "MsgRate"), ("bw_gbps", "BW"), ("lat_p50_us", "p50"),
        ("lat_p99_us", "p99"), ("lat_p999_us", "p99.9"), ("cpu_s", "cpu"),
        ("post_cpu_us_per_wr", "post_cpu")]
print("| transport | blocks | W | " + " | ".join(c[1] for c in cols) +
      " | BW, trial pairs |")
print("|---|---|---|" + "---|" * (len(cols) + 1))
for tr, blk, name in cases:
    path = os.path.join(res, name + ".json")
    if not os.path.exists(path):
        continue
    d = json.load(open(path))
    where = d["config"].get("placement", "")
    if where == "rdma":
        where = "soft-RoCE %s" % d["config"].get("device", "")
    if tr == "gpu":
        where = d["config"].get("gpu_backend", "")
    for pt in d.get("sweep", []):
        r = pt.get("ratio")
        if not r:
            continue
        cells = ["n/a" if r.get(k) is None else "%.2f" % r[k] for k, _ in cols]
        # with --repeat: the spread of the per-pair bandwidth ratios
        tb = [x for x in r.get("trials", {}).get("bw_gbps", []) if x is not None]
        cells.append("%.2f-%.2f (%d)" % (min(tb), max(tb), len(tb)) if tb else "one trial")
        label = tr + (" (%s)" % where if where else "")
        print("| %s | %s | %d | %s |" % (label, blk, pt["workers"], " | ".join(cells)))
PY
}
{
	cat <<EOF
# kvbroker benchmarks

Generated by \`make bench\` (here: \`BUILD=$BUILD scripts/bench.sh\`${QNOTE}; steps per worker, or in all
for the *_TOTAL ones (split among the W workers):
ITERS_SMALL=$ITERS_SMALL, ITERS_LARGE_TOTAL=$ITERS_LARGE_TOTAL on \`local\`,
ITERS_TCP_SMALL=${ITERS_TCP_SMALL}, ITERS_TCP_LARGE_TOTAL=${ITERS_TCP_LARGE_TOTAL} on
\`tcp\`, ITERS_RDMA_SMALL=${ITERS_RDMA_SMALL}, ITERS_RDMA_LARGE=${ITERS_RDMA_LARGE} on \`rdma\`, ITERS_GPU_SMALL=${ITERS_GPU_SMALL},
ITERS_GPU_LARGE=${ITERS_GPU_LARGE} on \`gpu\`) on $(date -u '+%Y-%m-%d %H:%M UTC') in ${elapsed} s. Do not edit by
hand: run \`make bench\` again.

- Machine: $(nproc) CPUs, ${cpu:-unknown CPU}, ${mem}, Linux $(uname -r);
  transparent huge pages for shmem: ${thp:-unknown}.
  Shared with other jobs: figures are noisy; compare the ratios of one run.
- Transports: \`local\` (one node, the broker's memcpy path)${where:+,
  \`tcp\` (two nodes: ${where})}$(if [ "$RDMA_OK" = 1 ]; then
		echo ", \`rdma\` (RC queue pairs on soft-RoCE rxe0 in a"
		echo "  qemu TCG guest: compare ratios only, absolute figures are far below a NIC's)"
	else
		echo ". \`rdma\`: not run here (${RDMA_WHY})"
	fi)$(if [ -z "$GPU_WHY" ]; then
		echo ". \`gpu\`: device memory on one node (${GPU_NAME})"
	else
		echo ". \`gpu\`: not run here (${GPU_WHY})"
	fi).
- Raw results: \`bench/results/*.json\` (one object per run: \`direct\`,
  \`broker\`, \`ratio\` = broker/direct; null = not measurable) and \`*.txt\`
  (the tables below).

## At a glance: broker / direct

Each cell is the broker's figure divided by direct's at the same worker
count W (below 1: the broker has less of it; for MsgRate and BW, above 1
is better). The large-block cases run REPEAT_LARGE=${REPEAT_LARGE} trials of each
mode per W, direct and broker alternating (ABBA): their cells are the
median broker figure over the median direct one, and the last column gives
the lowest and highest bandwidth ratio of the single trial pairs (how much
one run moves on this shared machine).

$(ratios)

## What is measured

\`kvbench workload\` runs W P worker processes and W D worker processes
(P rank i writes into D rank i, as TP ranks pair up). Each P worker runs steps
of R concurrent requests; per step, for every layer, for every request, it
writes that request's B blocks of that layer: the order a forward pass
produces them. Blocks land at scattered D offsets, so no two writes merge:
one descriptor = one WR in both modes.

- **direct**: every worker drives its own transport instance, one
  \`post()\` (one doorbell) per (request, layer) chain: what vLLM's MoRIIO
  connector does per worker today.
- **broker**: the same writes go through kvbroker; the workers open each
  step's requests in one round trip (\`kvb_transfer_open_batch\`), submit
  into their rings, seal each request, and D workers seal expecting their
  P writer (write_done). Both sides sleep in \`kvb_wait_min\` until a step's
  worth of requests is done (one wakeup per step; a direct D worker is
  woken by each of its P writer's write_done messages). P's latency of a
  request is taken when P reaps its step's completions, so it includes up
  to the gap between the first and the last request of a step ending.

On \`local\` (one node) kvbench starts one broker on a private socket and
direct workers copy into the D workers' memory.

On \`tcp\` (two nodes) the P side and the D side each have their own network
stack: two namespaces joined by a veth pair when kvbench runs as root, else
loopback (the tables' first line says which).

- **direct**: every P worker opens its own \`tcp\` transport and its own
  socket to its D peer and posts one chain per (request, layer); every D
  worker is a receiver process with its own \`tcp\` transport and its layer
  regions registered (one receiver per D worker). A request is done when its
  last WR is acked (the bytes landed in D's memory).
- **broker**: two kvbrokers (\`--transport tcp --host-ip\`: the P node's and
  the D node's; the default \`--tcp-conns 4\`: four connections to the
  peer, each chain on the one with the least in flight, where direct has a
  socket per worker); workers declare one KV region per layer
  (\`kvb_mem_set_kv\`), meet with \`kvb_peer_connect\`, and run MoRIIO's WRITE
  path: D opens each request with its block ids (\`remote_blocks\` to P) and
  seals expecting one \`write_done\`; P opens it, calls \`kvb_submit_layer\`
  per layer and seals with the layer count. Figures are the P broker's
  (\`kvbctl stats --json\`: per_transport \`tcp\`, remote \`layer_ops\`).

Columns: \`WR/db\` = WRs per doorbell (transport counters; broker: its STATS;
on \`tcp\` a doorbell is a \`sendmsg\` carrying WRs); \`post_cpu\` = CPU per WR
inside post() (direct: thread CPU time of one \`post()\` in 16, chosen at
random, less the two clock reads' own cost measured at start; **broker: the
broker process's whole CPU time / WRs, an upper bound** that also counts
draining rings, validation, completions and idle spinning; **n/a on \`tcp\`**:
sending goes on in \`poll()\` after \`post()\` returns, so no post-only figure
exists; **on \`rdma\`: wall time inside \`ibv_post_send\` per
WR in both modes**, not CPU time: see "rdma: CPU inside ibv_post_send per WR"); \`MsgRate\` = descriptors/s; \`BW\` in GB/s (1e9 B); latency from a
request's first write to its write_done; \`cpu\` = CPU seconds of the P
workers, plus the broker's in broker mode (\`tcp\`: P workers + D side, the
receivers or D workers, verification excluded, + both brokers);
\`ratio\` = broker / direct.

Defaults of \`kvbench workload\` model Llama-3-70B at TP=8: 80 layers; 16-token
blocks; 8 KV heads / TP 8 = 1 head per rank; head dim 128; bf16; K and V:
block bytes per rank per layer = 2 x 16 x 1 x 128 x 2 = **8192**. The sweep
below uses 32 layers and two block sizes to separate the two regimes.

## local: correctness pass (every byte verified at D)

$(table verify)

## local: small blocks (512 B), message rate

![small blocks](bench/results/workload-small.png)

$(table workload-small)

## local: large blocks (256 KiB), bandwidth

![large blocks](bench/results/workload-large.png)

$(table workload-large)

EOF
	if [ "$TCP" = 1 ]; then
		sections tcp -tcp "256 KiB"
	fi
	if [ "$RDMA_OK" = 1 ]; then
		sections rdma -rdma "64 KiB, 8 layers x 4 blocks, 2 requests" "" \
			"Scaled down from the 256 KiB x 32 layers case: emulated soft-RoCE moves a
few tens of MB/s. Compare the ratio only."
	fi
	if [ -z "$GPU_WHY" ]; then
		sections gpu -gpu "256 KiB" ", read back from the device"
	fi
	cat <<EOF
## Broker limits (foundation issue, Speed)

Descriptors per second, tiny unsignaled writes (target >= 10 M/s):

$(table rate)

$(table rate2)

Round trip with busy polling (targets p50 <= 2 us, p99 <= 20 us):

$(table lat)

## Ring vs DPDK rte_ring

$(table ring)

## How to read this on the \`local\` transport

On \`local\` the broker *is* the copy engine. Small chains are copied by
the broker thread inside the post; a chain of 512 KiB or more is cut into
256 KiB pieces copied by \`--copy-threads\` threads (auto: min(4, CPUs - 1),
so 1 here: runs of up to 1 MiB from the chain's front) and by the broker
thread (the chain's last part, runs of up to 2 MiB per loop round, so a
transfer open is answered within ~150 us of copying, not a chain's). With
W = 1 the broker copies on two cores where the direct worker copies on
one: broker ahead. From W = 2 on, direct mode keeps both cores of this
machine copying in W processes and the broker copies on the same two
cores, which it shares with its own loop and the W worker processes'
wake-ups. \`scripts/copy-profile.sh -r 2\` (perf record -a over the
steady part of a W = 2 large-block run of each mode, 2026-12-01) measured
where: both modes copy at the same rate per core inside memmove (13.1 /
13.6 and 13.8 / 13.2 GB/s per memmove-core, direct / broker), but memmove
had 89.5 and 88.5 % of both cores' samples in direct mode against 81.6
and 77.7 % in broker mode. Outside memmove, direct mode spent 9.6 / 9.5 %
(the workers' posts, timestamps, the D processes); broker mode 17.5 /
19.6 %: the broker's loop and kernel time (reschedule IPIs when a woken
worker preempts a copier, control replies, eventfd wake-ups, lock
hand-offs between its threads) and the P and D workers opening,
sealing and waiting for their transfers. On a machine with cores to spare
that work does not take from copying; here it does. (An earlier estimate
that timed every memcpy call in a temporary build had the broker's
copies slower per second; the profile does not show that.) With each step's requests opened in one round trip
(\`kvb_transfer_open_batch\`, 2026-12-01, the same script, two rounds) the
broker's own share outside memmove fell from 10.2-12.3 % to 7.1 / 6.4 %,
and memmove had 85.1 / 84.2 % of the samples against 90.4 / 89.6 % for
direct mode.
Completing a run of pieces in one batch (one lock, one drain of the
copies' stores per run instead of per 256 KiB piece, 2026-12-01) took the
broker's non-copy share from 9.4 to 7.7 % of the samples in one profile
each.

How far one trial pair moves here: separate kvbench runs of each mode,
interleaved, W = 2 large blocks (the case below), 2026-12-01: 12 pairs,
broker / direct median 1.01 (0.91-1.08); 10 pairs at W = 4, 0.96
(0.88-1.15); 10 at W = 8, 0.97 (0.82-1.30); 8 more at W = 2 an hour
later, 1.05 (0.97-1.14). This machine is a 2-vCPU VM on a shared host
where a context switch costs ~12 us (\`perf bench sched pipe\`: a 25 us
round trip), a syscall 1.1 us, a thread-CPU clock read 1.3-1.6 us
(kvbench takes two around one post in 16 in both modes, for post_cpu;
until 2026-12-01 it took them around every post, which was most of the
workers' CPU with small blocks: direct local 7.4 Mdesc/s at W = 8 then,
35 without), and the first
touch of memfd memory ~3.6 s per GiB (so setup, not the timed part,
dominates a W = 8 trial). A W = 2 broker-mode run switched contexts
7 976 times against direct's 4 737 (\`perf record -e sched:sched_switch\`,
setup included): the broker waking P workers waiting on their transfers,
which direct workers, copying inline, never do.
Huge pages: the regions (memfds) ask for them (MADV_HUGEPAGE); with
\`/sys/kernel/mm/transparent_hugepage/shmem_enabled\` at \`advise\`
instead of Debian's \`never\`, 8 interleaved pairs at W = 2 gave direct
29.4 and broker 30.3 GB/s (medians; 26.8 and 28.7 at \`never\`, the
same hour): both faster, broker / direct 1.03 against 1.05.
Small blocks: one broker thread drains, validates, copies and
completes for all W workers, about 0.1 us of its CPU per 512-byte
descriptor, while a direct worker on \`local\` only copies its own 512
bytes in process (about 0.05 us of worker CPU per descriptor, on both
cores): the broker's message rate on \`local\` is a fraction of direct's,
and there is no doorbell on \`local\` for it to save. The broker still
cuts doorbells by its drain burst (chains of up to \`--burst\` WRs per
destination instead of B per (request, layer)). The doorbell and
CPU-per-WR figures are what carries over to RDMA, where a doorbell is an
\`ibv_post_send\` + MMIO and the NIC does the copies (the \`tcp\` rows,
where a doorbell is a \`sendmsg\`, have the broker ahead at small blocks;
on soft-RoCE the "NIC" is the guest's own CPUs).

EOF
	if [ "$TCP" = 1 ]; then
		cat <<'EOF'
## How to read this on the `tcp` transport

In direct mode each worker's (request, layer) chain of B WRs is one
`sendmsg` on its own socket (a few more when a socket fills up): WR/db stays
near B. The P broker sends the chains of all its workers to the one peer
node over one connection, up to 1024 iovecs per `sendmsg` (about 510 WRs
with their headers), so WR/db grows with what queues up while a `sendmsg`
is in flight. Both modes move the same bytes through the same kernel TCP
stack and the same (virtual) link. On this 2-core machine the worker
processes, receivers and brokers all share the two cores: CPU seconds and
latencies include waiting for a core. Broker-mode latency also carries
MoRIIO's control path (`remote_blocks` from D before P's layers go,
`write_done` over ZMQ after the last ack).

EOF
	fi
	if [ "$RDMA_OK" = 1 ]; then
		cat <<'EOF'
## How to read this on the `rdma` transport

Everything runs in one soft-RoCE guest (qemu TCG, 2 vCPUs, `rxe0` on
`dummy0` = 192.0.2.1): P and D share one verbs device, and every WRITE is
real RC traffic through the kernel's rxe driver, emulated in software on
an emulated CPU. Compare the ratios; the absolute rates are far below a
NIC's.

- **direct**: every P worker opens its own `rdma` transport (device
  context, PD, CQ) and one RC queue pair to a receiver process per D
  worker, which holds the registered regions and answers the QP handshake
  (`connect`/`kvb_rdma_ep_info` offer and answer, over a socketpair between
  the two processes). One `ibv_post_send` per (request, layer) chain:
  WR/db = B. `post_cpu` = the thread's CPU time inside `ibv_post_send`
  on a random 1 doorbell in 16 (`kvb_rdma_time_posts`, stats
  `post_cpu_ns`) per WR of those: on soft-RoCE the post is a syscall into
  the rxe driver, on a NIC it is a doorbell write. A worker with nothing
  to reap spins 20 us, then arms the CQ (`ops->arm`) and sleeps on its
  completion channel, as the broker does.
- **broker**: two kvbrokers `--transport rdma --host-ip 192.0.2.1` on the
  one device, each with its own handshake and notify ports (as
  `tests/rdma/broker-pair.sh`), the workers on MoRIIO's WRITE path as on
  `tcp`. The P broker gathers every worker's chains to the peer node onto
  its `--qp-per-transfer` QPs (8 here, `RDMA_QPS`; direct has one QP per
  worker) and posts up to a QP's send-queue credit per `ibv_post_send`:
  WR/db is several times direct's. With one QP the brokers' bandwidth
  stayed at 0.043-0.047 GB/s from W = 1 to 8 (soft-RoCE serves a QP on
  one kernel thread), so 1 QP would measure rxe, not the broker. Figures from the P broker's stats
  (per_transport `rdma`); `post_cpu` = CPU time inside `ibv_post_send`
  (one doorbell in 16) per WR of those, in the workers' transports
  (direct) or in the P broker (stats `post_cpu_ns` / `post_cpu_wrs`); the
  wall time of every call per WR is in the JSON (`post_wall_us_per_wr`).
  On soft-RoCE (kernel 6.12) `ibv_post_send` writes the WQEs into the
  send queue and makes one system call that only queues the QP's work on
  rxe's workqueue (kernel threads run the requester): see "rdma: CPU
  inside ibv_post_send per WR".
- Message rate and latency are bound by the rxe kernel threads, which
  share the guest's two vCPUs with every worker, receiver and broker;
  broker-mode latency also carries the control path (`remote_blocks`,
  `write_done`). With several QPs the broker spreads a chain of more
  than 256 KiB over them by bytes in flight, so large-block chains take
  several doorbells (WR/db falls toward direct's there); before that, one
  whole chain (up to 5 MiB) sat on one QP, one rxe kernel thread, and the
  broker's large-block bandwidth was 0.75-0.83x direct's at 2-8 workers
  (2026-12-01).

EOF
	fi
	if [ -z "$GPU_WHY" ]; then
		cat <<'EOF'
## How to read this on the `gpu` transport

One node, regions in device memory (device 0), the GPU runtime picked by
`--gpu-backend auto` (HIP, then CUDA).

- **direct**: every P worker opens its own `gpu` transport (its own streams
  and events) and imports its D peer's layer regions (IPC handles, sent over
  a socketpair); one `post()` per (request, layer) chain = one copy batch
  (a doorbell), each block one asynchronous copy (a WR). D workers allocate
  and export their regions and, when verifying, copy each request back to
  the host to check it.
- **broker**: one `kvbroker --transport gpu`; the workers register their
  device memory with `kvb_mem_register_gpu` (the broker imports it) and
  submit as on `local`. The broker batches the copies of all workers per
  device pair, merged where contiguous, over its stream pool: WR/db grows
  with what queues up.

EOF
	fi
	# measured by hand (bench/python/save_kv_layer_bench.py --md): kept
	# across runs of this script
	if [ -f bench/results/save_kv_layer.md ]; then
		cat bench/results/save_kv_layer.md
		echo
	fi
	# measured by hand too (bench/rate_sweep.py, bench/rate_workers.py,
	# tests/rdma/post-cpu.sh, kvbench --mode all against UCX on tcp and,
	# in the soft-RoCE guest, on rdma with perftest)
	for f in bench/results/rate-sweep.md bench/results/rate-workers.md \
		bench/results/post-cpu-rdma.md bench/results/peer-death.md \
		bench/results/vllm-read.md \
		bench/results/against-peers.md \
		bench/results/against-peers-rdma.md \
		bench/results/ring-vs-plain.md; do
		if [ -f "$f" ]; then
			cat "$f"
			echo
		fi
	done
	cat <<EOF
## Commands

\`\`\`
EOF
	for c in "${CMDS[@]}"; do
		echo "$c"
	done
	echo '```'
} >BENCHMARKS.md
echo
echo "bench: wrote $RES/*.json, $RES/*.png and BENCHMARKS.md in ${elapsed} s"
