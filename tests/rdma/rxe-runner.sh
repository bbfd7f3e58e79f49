#!/bin/bash
# SPDX-License-Identifier: MIT
#
# rxe-runner.sh - run one command inside a short-lived qemu (TCG) guest that
# has a soft-RoCE verbs device, and return the command's exit status.
#
#   tests/rdma/rxe-runner.sh [--] command [args...]
#
# The guest runs a Debian kernel (fetched once with `apt-get download`, cached
# under /var/tmp) and a tiny busybox initramfs that loads rdma_rxe, rdma_ucm
# and the 9p modules, mounts the host's / read-only and KVB_RXE_RW read-write at the same
# path, creates dummy0 = 192.0.2.1/24 with rxe0 on top, then runs the command
# from the caller's working directory.
#
# Exit status: the command's; 77 (skip) when qemu, the kernel package or a
# tool to build the initramfs is unavailable; 124 when the guest ran past
# KVB_RXE_TIMEOUT; 125 when the guest never reported a status.
#
# Environment:
#   KVB_RXE_RW       directory shared read-write (default: $PWD); ctest needs
#                    its build directory here
#   KVB_RXE_CACHE    cache directory (default /var/tmp/kvb-rxe)
#   KVB_RXE_KPKG     kernel package (default linux-image-6.12-amd64;
#                    linux-image-amd64 for the distribution's 6.1)
#   KVB_RXE_TIMEOUT  seconds before the guest is killed (default 840)
#   KVB_RXE_SMP      vCPUs (default 2: one vCPU makes polling collapse)
#   KVB_RXE_MEM      MiB of guest memory (default 2048)
#   KVB_RXE_MTU      MTU of dummy0 (default: kernel default 1500)
#   KVB_RXE_BOOTS    boots before giving up on a guest that dies before the
#                    command starts (default 3)
set -uo pipefail

prog=${0##*/}
skip() {
	echo "" >&2
	echo "*** $prog: SKIPPED: $* ***" >&2
	echo "*** soft-RoCE tests did not run; see docs/rdma.md ***" >&2
	exit 77
}
die() {
	echo "$prog: $*" >&2
	exit "${2:-125}"
}

[ "${1:-}" = -- ] && shift
[ $# -ge 1 ] || die "usage: $prog [--] command [args...]" 2

qemu=$(command -v qemu-system-x86_64) || skip "qemu-system-x86_64 not installed"
cache=${KVB_RXE_CACHE:-/var/tmp/kvb-rxe}
kpkg=${KVB_RXE_KPKG:-linux-image-6.12-amd64}
limit=${KVB_RXE_TIMEOUT:-840}
rw=$(readlink -f "${KVB_RXE_RW:-$PWD}") || die "bad KVB_RXE_RW"
cwd=$(pwd -P)
for tool in busybox cpio gzip depmod modprobe apt-get apt-cache dpkg flock \
	timeout; do
	command -v $tool >/dev/null || skip "$tool not installed"
done
busybox=$(command -v busybox)
# The guest runs host binaries in a chroot of the host's /; those need these.
for tool in ip rdma; do
	command -v $tool >/dev/null || skip "$tool (iproute2) not installed"
done
case "$rw$cwd" in
*[[:space:]]*) die "paths with blanks are not supported: $rw $cwd" 2 ;;
esac

mkdir -p "$cache" || skip "cannot create $cache"

# --- 1. kernel image and modules, once per kernel version -------------------
# Two runners on one machine would race on the cache: serialise preparation.
exec 9>"$cache/.lock"
flock 9

kimg=$(apt-cache depends "$kpkg" 2>/dev/null |
	awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
if [ -z "$kimg" ]; then
	# Already a versioned package name, or apt lists missing.
	if apt-cache show "$kpkg" >/dev/null 2>&1; then
		kimg=$kpkg
	else
		skip "kernel package $kpkg unknown to apt (apt-get update?)"
	fi
fi
kdir=$cache/$kimg
if [ ! -e "$kdir/.complete" ]; then
	echo "$prog: fetching $kimg into $cache (first run only)" >&2
	rm -rf "$kdir" "$cache/dl"
	mkdir -p "$kdir" "$cache/dl"
	if ! (cd "$cache/dl" && apt-get download "$kimg" >/dev/null 2>&1); then
		rm -rf "$kdir" "$cache/dl"
		skip "apt-get download $kimg failed (offline?)"
	fi
	dpkg-deb -x "$cache"/dl/*.deb "$kdir" || die "cannot unpack $kimg"
	rm -rf "$cache/dl"
	kver=$(ls "$kdir/lib/modules" | head -n1)
	depmod -b "$kdir" "$kver" || die "depmod failed for $kver"
	touch "$kdir/.complete"
fi
kver=$(ls "$kdir/lib/modules" | head -n1)
vmlinuz=$kdir/boot/vmlinuz-$kver
[ -r "$vmlinuz" ] || die "no kernel image in $kdir"

# --- 2. initramfs: busybox, modules in dependency order, /init --------------
initrd=$cache/initramfs-$kver-v5.cpio.gz
if [ ! -e "$initrd" ]; then
	root=$(mktemp -d) || die "mktemp failed"
	trap 'rm -rf "$root"' EXIT
	mkdir -p "$root"/{bin,dev,proc,sys,mnt,mods}
	cp "$busybox" "$root/bin/busybox"
	# Relative links: `busybox --install -s` would point at this host path.
	for a in $("$busybox" --list); do
		[ "$a" = busybox ] || ln -s busybox "$root/bin/$a"
	done
	# crc32 providers first: rdma_rxe asks the crypto API for "crc32" and
	# nothing in the initramfs could autoload it.
	# rdma_ucm: /dev/infiniband/rdma_cm for librdmacm (address resolution)
	for m in crc32_generic crc32-pclmul dummy virtio_pci 9pnet_virtio 9p \
		ib_uverbs rdma_rxe rdma_ucm; do
		modprobe -d "$kdir" -S "$kver" --show-depends "$m" 2>/dev/null |
			awk '$1 == "insmod" { print $2 }'
	done | awk '!seen[$0]++' >"$root/order.tmp"
	grep -q rdma_rxe "$root/order.tmp" || die "rdma_rxe missing in $kimg"
	while read -r path; do
		name=${path##*/}
		name=${name%.xz}
		name=${name%.zst}
		case $path in
		*.xz) xz -dc "$path" ;;
		*.zst) zstd -qdc "$path" ;;
		*) cat "$path" ;;
		esac >"$root/mods/$name" || die "cannot unpack $path"
		echo "$name" >>"$root/mods/order"
	done <"$root/order.tmp"
	rm -f "$root/order.tmp"
	cat >"$root/init" <<'EOF'
#!/bin/sh
# kvbroker rxe guest init: modules, host root, rxe0, the job, poweroff.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /mods/order); do
	insmod /mods/$m || echo "kvb-rxe: insmod $m failed"
done
param() { tr ' ' '\n' </proc/cmdline | sed -n "s/^kvb\.$1=//p"; }
RW=$(param rw)
JOB=$(param job)
H=/mnt
o=trans=virtio,version=9p2000.L,msize=524288
bye() { echo "KVB-RXE-STATUS=$1"; sync; poweroff -f; }
mount -t 9p -o $o,ro host $H || bye 125
for d in proc sys dev; do mount --bind /$d $H/$d; done
mount -t tmpfs tmpfs $H/tmp
mount -t tmpfs tmpfs $H/run
mount -t tmpfs tmpfs $H/var/tmp
[ -d $H/dev/shm ] || mkdir $H/dev/shm
mount -t tmpfs tmpfs $H/dev/shm
# the rw folder may sit under a path shadowed by the tmpfs mounts above
# (a build under /tmp): make its mount point in the tmpfs then
[ -d $H$RW ] || mkdir -p $H$RW
mount -t 9p -o $o rw $H$RW || bye 125
E="/usr/bin/env -i HOME=/tmp PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
chroot $H $E /bin/sh -c "
	ip link set lo up &&
	{ [ -e /sys/class/net/dummy0 ] || ip link add dummy0 type dummy; } &&
	{ [ -z '$(param mtu)' ] || ip link set dummy0 mtu '$(param mtu)'; } &&
	ip addr add 192.0.2.1/24 dev dummy0 &&
	ip link set dummy0 up &&
	rdma link add rxe0 type rxe netdev dummy0" || echo "kvb-rxe: rxe0 setup failed"
chroot $H $E KVB_RXE_GUEST=1 /bin/sh $JOB/run.sh
rc=$?
echo $rc >$H$JOB/status
bye $rc
EOF
	chmod 755 "$root/init"
	(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) \
		>"$initrd.tmp" && mv "$initrd.tmp" "$initrd" ||
		die "cannot build the initramfs"
	rm -rf "$root"
	trap - EXIT
fi
flock -u 9

# --- 3. the job: a script in the shared directory ---------------------------
job=$(mktemp -d "$rw/.kvb-rxe.XXXXXX") || die "cannot write to $rw"
trap 'rm -rf "$job"' EXIT
{
	# the marker says the command started (see the boot loop below)
	echo ": >$(printf %q "$job/started")"
	echo "cd $(printf %q "$cwd") || exit 125"
	printf 'exec'
	printf ' %q' "$@"
	echo
} >"$job/run.sh"

# A guest that dies before the command starts (its kernel oopsed while
# booting under TCG: seen once, "Oops: int3" in sched_clock_cpu, 2026-12-01)
# is booted again, up to KVB_RXE_BOOTS times in all (default 3); a command
# that started is never run twice.
boots=${KVB_RXE_BOOTS:-3}
for boot in $(seq 1 "$boots"); do
	echo "$prog: booting $kver (TCG, ${KVB_RXE_SMP:-2} vCPUs, limit ${limit}s)" >&2
	timeout -k 10 "$limit" "$qemu" -accel tcg -cpu max \
		-smp "${KVB_RXE_SMP:-2}" -m "${KVB_RXE_MEM:-2048}" \
		-nodefaults -no-user-config -display none -serial stdio -no-reboot \
		-nic none -kernel "$vmlinuz" -initrd "$initrd" \
		-virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
		-virtfs local,path="$rw",mount_tag=rw,security_model=none,multidevs=remap \
		-append "console=ttyS0 quiet panic=-1 kvb.rw=$rw kvb.job=$job kvb.mtu=${KVB_RXE_MTU:-}" \
		</dev/null | tr -d '\r'
	qrc=${PIPESTATUS[0]}
	if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
		die "guest ran past ${limit}s and was killed" 124
	fi
	[ -e "$job/started" ] || [ -s "$job/status" ] && break
	echo "$prog: the guest died before the command started (boot $boot of $boots)" >&2
done
[ -s "$job/status" ] || die "guest reported no exit status (qemu rc=$qrc)"
exit "$(cat "$job/status")"
