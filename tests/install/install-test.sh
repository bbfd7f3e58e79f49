#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# What a user of the installed kvbroker gets: `cmake --install` into a
# temporary prefix, then tests/install/consumer.c built outside the tree
# with `pkg-config --cflags --libs kvbroker` (shared) and against
# libkvbroker.a with `pkg-config --static` (static), both run against the
# installed kvbroker binary. Everything in a temporary directory, removed.
#
# Usage: install-test.sh BUILD_DIR
set -u
BUILD=${1:?build dir}
SRC=$(cd "$(dirname "$0")" && pwd)
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }
CC=${CC:-cc}
T=$(mktemp -d /tmp/kvb-install.XXXXXX)
BPID=
cleanup() {
	[ -n "$BPID" ] && kill "$BPID" 2>/dev/null && wait "$BPID" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$T/broker.log" ] && tail -20 "$T/broker.log"; exit 1; }

cmake --install "$BUILD" --prefix "$T/prefix" >"$T/install.log" 2>&1 ||
	fail "cmake --install: $(tail -5 "$T/install.log")"
PC=$(find "$T/prefix" -name kvbroker.pc | head -1)
[ -n "$PC" ] || fail "no kvbroker.pc installed"
export PKG_CONFIG_PATH=$(dirname "$PC")
LIBDIR=$(pkg-config --variable=libdir kvbroker)
[ -f "$LIBDIR/libkvbroker.a" ] && [ -e "$LIBDIR/libkvbroker.so" ] ||
	fail "pkg-config's libdir $LIBDIR holds no libkvbroker.a / .so"
echo "pkg-config: $(pkg-config --cflags --libs kvbroker) | static: $(pkg-config --static --libs kvbroker)"

# shellcheck disable=SC2046
"$CC" -O1 -o "$T/consumer-shared" "$SRC/consumer.c" \
	$(pkg-config --cflags --libs kvbroker) -Wl,-rpath,"$LIBDIR" ||
	fail "build against the shared library"
# shellcheck disable=SC2046
"$CC" -O1 -o "$T/consumer-static" "$SRC/consumer.c" \
	$(pkg-config --cflags kvbroker) "$LIBDIR/libkvbroker.a" \
	$(pkg-config --static --libs-only-l kvbroker | sed 's/-lkvbroker//') ||
	fail "build against the static library"
ldd "$T/consumer-static" | grep -q libkvbroker && fail "the static build loads libkvbroker.so"
ldd "$T/consumer-shared" | grep -q "$LIBDIR/libkvbroker.so" ||
	fail "the shared build does not load the installed libkvbroker.so"

"$T/prefix/bin/kvbroker" --socket "$T/b.sock" >"$T/broker.log" 2>&1 &
BPID=$!
for _ in $(seq 200); do [ -S "$T/b.sock" ] && break; sleep 0.05; done
[ -S "$T/b.sock" ] || fail "the installed kvbroker did not start"
timeout 60 "$T/consumer-shared" "$T/b.sock" || fail "consumer (shared)"
timeout 60 "$T/consumer-static" "$T/b.sock" || fail "consumer (static)"
echo "PASS: install, pkg-config, shared and static consumers"
