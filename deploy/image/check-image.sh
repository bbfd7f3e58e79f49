#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Checks the image build-image.sh made (`make image` runs it after the
# build):
# 1. umoci unpacks it as a runtime would: the process runs as 10001:10001,
#    the entrypoint is kvbroker, KVB_SOCKET is set;
# 2. the files the Kubernetes manifests' init containers copy out of it
#    (deploy/kubernetes, the commands of containers with image kvbroker:*)
#    exist at those paths;
# 3. in the unpacked root (chroot, as uid 10001, only /proc and /dev from
#    the host): kvbroker starts with the image's defaults, `kvbctl stats`
#    answers, the Python package moves 1 MiB through it and checks it,
#    SIGTERM stops it with exit status 0;
# 4. where podman runs containers: the same with `podman load`,
#    `podman run` (the image's own user and entrypoint) and `podman exec`.
#
# Usage: check-image.sh OCI_LAYOUT_DIR TAG SOURCE_DIR
set -eu
OCI=$(realpath "${1:?OCI layout}")
TAG=${2:?tag}
SRC=$(realpath "${3:?source dir}")
[ "$(id -u)" = 0 ] || { echo "check-image.sh: needs root (umoci unpack, chroot)"; exit 1; }
# in a mount namespace of its own: the bind mounts below go away with it
if [ -z "${KVB_CHECK_IMAGE_NS:-}" ]; then
	KVB_CHECK_IMAGE_NS=1 exec unshare --mount --propagation private -- "$0" "$@"
fi
T=$(mktemp -d /tmp/kvb-image-check.XXXXXX)
MNT=
BPID=
cleanup() {
	set +e
	[ -n "$BPID" ] && kill "$BPID" 2>/dev/null
	for m in $MNT; do umount "$m" 2>/dev/null || umount -l "$m"; done
	# never through a mount that is still there
	if grep -qF " $T/" /proc/self/mountinfo; then
		echo "check-image.sh: $T still has mounts: left in place"
	else
		rm -rf --one-file-system "$T"
	fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$T/broker.log" ] && tail -20 "$T/broker.log"; exit 1; }
ok() { echo "  ok: $*"; }

umoci unpack --image "$OCI:$TAG" "$T/bundle" >/dev/null || fail "umoci unpack"
R=$T/bundle/rootfs
python3 - "$T/bundle/config.json" <<'EOF' || fail "the image's configuration"
import json, sys
c = json.load(open(sys.argv[1]))["process"]
assert (c["user"]["uid"], c["user"]["gid"]) == (10001, 10001), c["user"]
assert c["args"][0] == "/usr/bin/kvbroker", c["args"]
assert "KVB_SOCKET=/run/kvbroker/kvbroker.sock" in c["env"], c["env"]
EOF
ok "runs as 10001:10001, entrypoint /usr/bin/kvbroker, KVB_SOCKET=/run/kvbroker/kvbroker.sock"

for f in /usr/bin/kvbroker /usr/bin/kvbctl /usr/bin/python3 /bin/sh \
	/usr/lib/python3/dist-packages/kvbroker/__init__.py; do
	[ -e "$R$f" ] || fail "the image lacks $f"
done
ok "kvbroker, kvbctl, python3, sh and the Python package are there"
python3 - "$SRC/deploy/kubernetes" "$R" <<'EOF' || fail "paths the manifests use"
import os, re, sys
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "..", "tests", "deploy"))
import podsim
objs = podsim.load_kustomization(sys.argv[1])
n = 0
for o in objs:
    spec = o.get("spec", {}).get("template", {}).get("spec")
    if not spec:
        continue
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        if not c.get("image", "").startswith("kvbroker:"):
            continue
        for a in c.get("command", []) + c.get("args", []):
            for p in re.findall(r"(?<![\w=])(/usr/[\w./-]+)", a):
                n += 1
                assert os.path.exists(sys.argv[2] + p), "%s %s: %s not in the image" % (o["metadata"]["name"], c["name"], p)
                print("    %s: %s" % (c["name"], p))
assert n, "no image paths found in the manifests"
EOF
ok "the paths the manifests' init containers copy exist in the image"

# 3. chroot as the image's user
for d in proc dev; do
	mount --bind /$d "$R/$d" && MNT="$R/$d $MNT"
done
mount -t tmpfs tmpfs "$R/tmp" && MNT="$R/tmp $MNT"
IN="chroot $R env -i PATH=/usr/bin:/bin KVB_SOCKET=/run/kvbroker/kvbroker.sock setpriv --reuid=10001 --regid=10001 --clear-groups"
$IN kvbroker --version || fail "kvbroker --version in the image"
$IN kvbroker >"$T/broker.log" 2>&1 &
BPID=$!
i=0
until $IN kvbctl stats >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 100 ] || fail "kvbctl stats never answered"
	kill -0 $BPID 2>/dev/null || fail "the broker exited"
	sleep 0.1
done
ok "the broker listens on /run/kvbroker/kvbroker.sock as uid 10001; kvbctl stats answers"
$IN python3 -c '
import os, kvbroker
with kvbroker.Client(role="P") as c:
    src, dst = c.alloc(1 << 20, key=0), c.alloc(1 << 20, key=1)
    pat = os.urandom(1 << 20)
    src.buffer[:] = pat
    h = c.open("image-check")
    c.submit_write([kvbroker.Desc(transfer=h, region=src.id, peer_region=dst.id, len=1 << 20, tag=1)])
    c.seal(h, 1, tag=2)
    done = c.wait_min(2, timeout_ms=10000)
    assert len(done) == 2 and all(x.ok for x in done), done
    assert bytes(dst.buffer) == pat
    print("    python3", kvbroker.library_path())
' || fail "the Python package in the image"
ok "the image's Python package moved 1 MiB through its broker, bytes checked"
kill -TERM $BPID
wait $BPID || fail "the broker's exit status after SIGTERM: $?"
BPID=
ok "SIGTERM: exit status 0"

# 4. podman
if ! command -v podman >/dev/null; then
	echo "  podman not installed: not run in a container runtime"
	exit 0
fi
ARCHIVE=$T/image.tar
skopeo copy --quiet "oci:$OCI:$TAG" "oci-archive:$ARCHIVE:kvbroker:$TAG"
P="podman --root $T/podman/root --runroot $T/podman/run --storage-driver vfs --cgroup-manager cgroupfs --events-backend none"
if ! $P load -i "$ARCHIVE" >"$T/podman.log" 2>&1; then
	echo "  podman load failed here, not run in a container runtime: $(tail -1 "$T/podman.log")"
	exit 0
fi
if ! $P run --rm --network none "kvbroker:$TAG" --version >"$T/podman.log" 2>&1; then
	echo "  podman cannot run containers here: $(tail -1 "$T/podman.log")"
	exit 0
fi
ok "podman run kvbroker:$TAG --version: $(tail -1 "$T/podman.log")"
$P run -d --name kvb-image-check --network none "kvbroker:$TAG" >/dev/null || fail "podman run -d"
i=0
until $P exec kvb-image-check kvbctl stats >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 100 ] || fail "podman exec kvbctl stats never answered: $($P logs kvb-image-check 2>&1 | tail -5)"
	sleep 0.1
done
ok "podman: the broker runs as $($P exec kvb-image-check id -u) with the image's defaults; podman exec kvbctl stats answers"
$P stop -t 10 kvb-image-check >/dev/null
st=$($P inspect -f '{{.State.ExitCode}}' kvb-image-check)
$P rm kvb-image-check >/dev/null
[ "$st" = 0 ] || fail "podman stop: exit status $st"
ok "podman stop (SIGTERM): exit status 0"
