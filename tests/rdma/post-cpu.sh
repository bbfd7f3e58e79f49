#!/bin/sh
# SPDX-License-Identifier: MIT
# Run inside the soft-RoCE guest (see docs/rdma.md, BENCHMARKS.md "rdma: CPU
# inside ibv_post_send per WR"):
#   KVB_RXE_RW=$PWD tests/rdma/rxe-runner.sh tests/rdma/post-cpu.sh BUILD_DIR [OUT]
# What a user-space doorbell costs on this kernel's rxe, in one boot:
#  1. which threads run rxe's requester (ftrace: the posting process, inline
#     in the post system call, or rxe's workqueue);
#  2. rdma_post_bench on one QP, 512 B writes, chains of 16 and of 256;
#  3. kvbench at 8 workers, 512 B blocks, direct and broker alternating
#     (3 trials each), its JSON in OUT.json (default
#     bench/results/post-cpu-rdma.json).
# kvbench's post_cpu is the thread's CPU time inside ibv_post_send on 1
# doorbell in 16 per WR of those (stats post_cpu_ns / post_cpu_wrs), its
# JSON post_wall_us_per_wr the wall time of every call per WR.
set -u
bdir=${1:?usage: post-cpu.sh BUILD_DIR [OUT]}
out=${2:-bench/results/post-cpu-rdma}
dev=${KVB_RDMA_DEV:-rxe0}
ibv_devices | grep -q "$dev" || { echo "no $dev: not in the guest?" >&2; exit 77; }
pb=$bdir/tests/rdma/rdma_post_bench
echo "== kernel $(uname -r), $(nproc) vCPUs, clocksource" \
	"$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"

echo "== 1. who runs rxe's requester (ftrace, a short rdma_post_bench)"
T=/sys/kernel/tracing
[ -e $T/set_ftrace_filter ] || mount -t tracefs nodev $T 2>/dev/null
if [ -w $T/set_ftrace_filter ]; then
	: >$T/set_ftrace_filter
	for f in rxe_post_send rxe_sched_task rxe_run_task rxe_sender \
		rxe_requester rxe_completer rxe_receiver; do
		echo $f >>$T/set_ftrace_filter 2>/dev/null
	done
	echo 20000 >$T/buffer_size_kb
	: >$T/trace
	echo function >$T/current_tracer
	echo 1 >$T/tracing_on
	timeout 60 "$pb" -w 2 -l 4 -r 4 -s 512 -b 16 -n 1 -N 10 -S 4096 >/dev/null
	echo 0 >$T/tracing_on
	echo "calls  thread  function <- caller"
	grep -v '^#' $T/trace | awk '{
		c = $1; sub(/-[0-9]+$/, "", c); sub(/:[0-9]+$/, "", c)
		f = $0; sub(/.*: /, "", f); n[c "  " f]++
	} END { for (k in n) print n[k], k }' | sort -k2
	echo nop >$T/current_tracer
	: >$T/set_ftrace_filter
else
	echo "(no tracefs: skipped)"
fi

echo "== 2. rdma_post_bench, one QP, 512 B writes: chains of 16, of 256"
for b in 16 256; do
	timeout 120 "$pb" -s 512 -b $b -N 20 -n 3 | grep -v '^JSON'
done

echo "== 3. kvbench, 8 workers, 512 B blocks, direct and broker alternating"
timeout 420 "$bdir/bench/kvbench/kvbench" workload --transport rdma \
	--workers 8 --layers 32 --blocks 16 --block-bytes 512 --requests 8 \
	--no-verify --mode both --repeat 3 --iters 10 \
	--broker-opts --qp-per-transfer=8 --json "$out.json" 2>"$out.err"
rc=$?
# progress lines: not for the log
tr '\r' '\n' <"$out.err" | sed 's/\x1b\[K//g' | grep -av 'requests .* s$' |
	grep -av '^$' | head -20
rm -f "$out.err"
exit $rc
