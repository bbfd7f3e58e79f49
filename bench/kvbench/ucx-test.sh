#!/bin/sh
# kvbench workload --mode ucx, tiny: on tcp between two network namespaces
# (UCX_TLS=tcp on the veth ends) D verifies every byte, the lanes UCX used
# are reported (tcp on the P veth end) and land in the JSON; then on local,
# --mode all --repeat 2: the three modes in ABBA order (d b u, u b d), the
# three ratio rows. Exit 77 (skipped) when this kvbench has no UCX or the
# namespaces cannot be made (not root, no `ip netns`).
# Usage: ucx-test.sh KVBENCH
set -u
K=$1
tmp=$(mktemp -d /tmp/kvb-ucx.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0

# show_fail WHAT FILE: say what failed, with the output
show_fail() {
	echo "FAIL: $1:" >&2
	cat "$2" >&2
	fail=1
}

"$K" workload --mode ucx --transport tcp --net netns --workers 2 \
	--layers 2 --blocks 4 --block-bytes 512 --requests 2 --iters 3 \
	--verify --json "$tmp/t.json" >"$tmp/out" 2>&1
rc=$?
if grep -q "built without UCX" "$tmp/out"; then
	echo "SKIP: kvbench was built without UCX (libucx-dev)"
	exit 77
fi
if grep -q "cannot make the namespaces" "$tmp/out"; then
	echo "SKIP: no network namespaces here:"
	cat "$tmp/out"
	exit 77
fi
cat "$tmp/out"
[ "$rc" = 0 ] || show_fail "tcp run exited $rc" "$tmp/out"
grep -Eq '^ucx +2 +512 +96 .* ok$' "$tmp/out" ||
	show_fail "no verified ucx row of 2 x 3 x 2 x 2 x 4 puts" "$tmp/out"
grep -Eq "^ucx: P0's endpoint used tcp/kvbbp[0-9]+" "$tmp/out" ||
	show_fail "UCX did not report tcp on the P veth end" "$tmp/out"
for key in '"tls_set":"tcp"' '"p0_lanes":"tcp/kvbbp' \
	'"ucx":\{"wrs":96,' '"bad_bytes":0'; do
	grep -Eq "$key" "$tmp/t.json" ||
		show_fail "no '$key' in the JSON" "$tmp/t.json"
done

"$K" workload --mode all --workers 1 --layers 2 --blocks 2 --requests 1 \
	--iters 2 --verify --repeat 2 --json "$tmp/r.json" >"$tmp/out" 2>&1 ||
	show_fail "local --mode all --repeat 2 exited $?" "$tmp/out"
cat "$tmp/out"
order=$(awk '$1 ~ /^[dbu]#[0-9]+$/ {printf "%s ", $1}' "$tmp/out")
if [ "$order" != "d#1 b#1 u#1 u#2 b#2 d#2 " ]; then
	echo "FAIL: trial order '$order', want 'd#1 b#1 u#1 u#2 b#2 d#2 '" >&2
	fail=1
fi
for row in '^direct ' '^broker ' '^ucx ' '^ratio ' '^b/ucx ' '^ucx/d ' \
	'BW broker / ucx per trial pair: [0-9.]+ [0-9.]+$'; do
	grep -Eq "$row" "$tmp/out" ||
		show_fail "no line matching '$row'" "$tmp/out"
done
for key in '"ratio_broker_ucx":\{' '"ratio_ucx_direct":\{' \
	'"ucx":\{"wrs":8,.*"trials":\{'; do
	grep -Eq "$key" "$tmp/r.json" ||
		show_fail "no '$key' in the JSON" "$tmp/r.json"
done
exit $fail
