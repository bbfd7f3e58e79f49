#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The kvbroker container image, from Debian packages only (`make image`,
# docs/deploy.md "Container image"):
#
# 1. mmdebstrap builds a Debian root filesystem (variant essential: the
#    Essential packages, no apt; perl and usrmerge, which the bootstrap
#    pulls in, removed again: /usr is merged, usr-is-merged says so) with the
#    project's .deb (`make deb`) and what it depends on, plus
#    ibverbs-providers (the NICs' user-space drivers), without man pages,
#    docs other than copyright files and locales; a user kvbroker,
#    uid/gid 10001; /run/kvbroker owned by it, mode 0700.
# 2. umoci turns the tarball into one layer of an OCI image and writes its
#    configuration: user 10001:10001, entrypoint kvbroker,
#    KVB_SOCKET=/run/kvbroker/kvbroker.sock, the ports, labels.
# 3. skopeo writes it as an OCI archive (podman load, skopeo copy to a
#    registry) and a docker archive (docker load, kind load image-archive).
#
# 4. check-image.sh checks it (KVB_IMAGE_NO_CHECK=1: not).
#
# Usage: build-image.sh DEB OUTDIR
# Environment: KVB_IMAGE_SUITE (bookworm), KVB_IMAGE_SOURCES (apt sources
# files for the image's packages; default: this host's Debian sources, so
# the image comes from the mirror this host's apt uses), SOURCE_DATE_EPOCH
# (file times in the layer; default: the package's).
set -eu
DEB=$(realpath "${1:?the .deb of make deb}")
OUT=${2:?output directory}
SUITE=${KVB_IMAGE_SUITE:-bookworm}
for t in mmdebstrap umoci skopeo dpkg-deb; do
	command -v $t >/dev/null || {
		echo "build-image.sh: no $t (scripts/deps.sh image)" >&2
		exit 1
	}
done
VERSION=$(dpkg-deb -f "$DEB" Version)
ARCH=$(dpkg-deb -f "$DEB" Architecture)
NAME=kvbroker
TAG=$NAME:$VERSION
UID_=10001
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(dpkg-deb --fsys-tarfile "$DEB" | tar -tv --full-time 2>/dev/null |
		awk 'NR == 1 { print $4 " " $5 }' | xargs -I{} date -u -d {} +%s)
	export SOURCE_DATE_EPOCH
fi
if [ -z "${KVB_IMAGE_SOURCES:-}" ]; then
	KVB_IMAGE_SOURCES=
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
		/etc/apt/sources.list.d/*.sources; do
		[ -s "$f" ] && grep -qs '^[^#]*debian' "$f" &&
			KVB_IMAGE_SOURCES="$KVB_IMAGE_SOURCES $f"
	done
fi

mkdir -p "$OUT"
OUT=$(realpath "$OUT")
# the downloaded packages, kept for the next build
CACHE=$OUT/.apt-cache
mkdir -p "$CACHE"
T=$(mktemp -d "$OUT/.image.XXXXXX")
trap 'rm -rf "$T"' EXIT

echo "== root filesystem: Debian $SUITE essential + $(basename "$DEB")"
# shellcheck disable=SC2086
mmdebstrap --variant=essential --architectures="$ARCH" \
	--hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
	--include="$DEB" --include=ibverbs-providers --include=usr-is-merged \
	--setup-hook='mkdir -p "$1"/var/cache/apt/archives' \
	--setup-hook="sync-in \"$CACHE\" /var/cache/apt/archives/" \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-include=/usr/share/locale/locale.alias' \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--dpkgopt='path-exclude=/usr/share/lintian/*' \
	--customize-hook="echo $NAME:x:$UID_:$UID_:kvbroker:/nonexistent:/usr/sbin/nologin >>\"\$1/etc/passwd\"" \
	--customize-hook="echo $NAME:x:$UID_: >>\"\$1/etc/group\"" \
	--customize-hook='find "$1/run" -mindepth 1 -maxdepth 1 -exec rm -rf --one-file-system {} +' \
	--customize-hook="install -d -m 0700 -o $UID_ -g $UID_ \"\$1/run/kvbroker\"" \
	--skip=cleanup/run \
	--customize-hook="sync-out /var/cache/apt/archives \"$CACHE\"" \
	--customize-hook='chroot "$1" dpkg --purge usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl libperl5.36 perl-modules-5.36 libgdbm-compat4' \
	--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/* "$1"/var/cache/ldconfig/aux-cache' \
	--customize-hook="chroot \"\$1\" dpkg-query -W -f='\${Package} \${Version} \${Installed-Size}\n' >\"$T/packages.txt\"" \
	"$SUITE" "$T/rootfs.tar" $KVB_IMAGE_SOURCES
mv "$T/packages.txt" "$OUT/${NAME}_${VERSION}_${ARCH}.packages.txt" 2>/dev/null || true

echo "== OCI image $TAG"
umoci init --layout "$T/oci"
umoci new --image "$T/oci:$VERSION"
umoci raw add-layer --image "$T/oci:$VERSION" "$T/rootfs.tar"
umoci config --image "$T/oci:$VERSION" \
	--os linux --architecture "$ARCH" \
	--created "$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)" \
	--author "kvbroker" \
	--config.user "$UID_:$UID_" \
	--config.workingdir / \
	--config.entrypoint /usr/bin/kvbroker \
	--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--config.env KVB_SOCKET=/run/kvbroker/kvbroker.sock \
	--config.exposedports 19476/tcp --config.exposedports 6301/tcp \
	--config.exposedports 6302/tcp --config.exposedports 61005/tcp \
	--config.volume /run/kvbroker \
	--config.stopsignal SIGTERM \
	--config.label org.opencontainers.image.title=kvbroker \
	--config.label org.opencontainers.image.description="KV-cache transfer broker for disaggregated LLM serving" \
	--config.label org.opencontainers.image.version="$VERSION" \
	--config.label org.opencontainers.image.licenses=MIT \
	--config.label org.opencontainers.image.base.name="debian:$SUITE (mmdebstrap essential)" \
	--history.created_by "mmdebstrap --variant=essential $SUITE + $(basename "$DEB") (deploy/image/build-image.sh)"
umoci gc --layout "$T/oci"

BASE=$OUT/${NAME}_${VERSION}_${ARCH}
rm -rf "$BASE.oci" "$BASE.oci.tar" "$BASE.docker.tar"
cp -a "$T/oci" "$BASE.oci"
skopeo copy --quiet "oci:$BASE.oci:$VERSION" "oci-archive:$BASE.oci.tar:$TAG"
skopeo copy --quiet "oci:$BASE.oci:$VERSION" "docker-archive:$BASE.docker.tar:$TAG"
echo "== $TAG"
echo "  $BASE.oci/ (OCI layout, tag $VERSION)"
echo "  $BASE.oci.tar ($(du -h "$BASE.oci.tar" | cut -f1): podman load -i / skopeo copy oci-archive:...)"
echo "  $BASE.docker.tar ($(du -h "$BASE.docker.tar" | cut -f1): docker load -i / kind load image-archive)"
echo "  root filesystem $(du -h "$T/rootfs.tar" | cut -f1) uncompressed, $(wc -l <"$BASE.packages.txt") packages ($BASE.packages.txt)"
[ -n "${KVB_IMAGE_NO_CHECK:-}" ] && exit 0
echo "== checking $TAG"
"$(dirname "$0")/check-image.sh" "$BASE.oci" "$VERSION" "$(realpath "$(dirname "$0")/../..")"
