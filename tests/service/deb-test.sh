#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The Debian package, with no change to the system: CPack packs this build
# (the same generator settings as `make deb`, for this build's prefix) into
# a temporary directory, `dpkg-deb -x` unpacks it into a temporary root, and
# from there: the package holds every program, the man pages, the units and
# the config; the programs run without LD_LIBRARY_PATH (RPATH); the
# unpacked broker starts, and tests/install/consumer.c, built against the
# unpacked header and library (the unpacked kvbroker.pc), moves and checks
# 1 MiB through it; the unpacked Python package loads the unpacked library. 77 without dpkg-deb, dpkg-shlibdeps or cpack.
#
# Usage: deb-test.sh SOURCE_DIR BUILD_DIR
set -u
SRC=${1:?source dir}
BUILD=${2:?build dir}
for t in dpkg-deb dpkg-shlibdeps cpack pkg-config; do
	command -v $t >/dev/null || { echo "SKIP: no $t"; exit 77; }
done
CC=${CC:-cc}
T=$(mktemp -d /tmp/kvb-deb.XXXXXX)
BPID=
cleanup() {
	[ -n "$BPID" ] && kill "$BPID" 2>/dev/null && wait "$BPID" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$T/broker.log" ] && tail -20 "$T/broker.log"; exit 1; }

(cd "$T" && cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$T/pkg") \
	>"$T/cpack.log" 2>&1 || fail "cpack: $(tail -20 "$T/cpack.log")"
DEB=$(ls "$T"/pkg/kvbroker_*.deb 2>/dev/null | head -1)
[ -n "$DEB" ] || fail "no .deb made: $(tail -5 "$T/cpack.log")"
echo "package: $(basename "$DEB"), $(du -k "$DEB" | cut -f1) KiB"
dpkg-deb -I "$DEB" control | sed 's/^/  /'
dpkg-deb -I "$DEB" control | grep -q "^Depends:.*libzmq5" ||
	fail "Depends lacks the shared libraries' packages (dpkg-shlibdeps)"
dpkg-deb -x "$DEB" "$T/root" || fail "dpkg-deb -x"
dpkg-deb -c "$DEB" >"$T/list"

# where this build installs: the package's prefix
PFX=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")
R=$T/root$PFX
for f in bin/kvbroker bin/kvbctl bin/kvbench bin/kvb-demo include/kvbroker/kvbroker.h; do
	[ -f "$R/$f" ] || fail "the package lacks $PFX/$f"
done
for f in man8/kvbroker.8 man8/kvbctl.8 man1/kvbench.1 man1/kvb-demo.1 man3/libkvbroker.3; do
	grep -q "share/man/$f" "$T/list" || fail "the package lacks man page $f"
done
for f in lib/systemd/system/kvbroker.service lib/systemd/system/kvbroker@.service \
	kvbroker/kvbroker.conf doc/kvbroker/copyright dist-packages/kvbroker/client.py \
	libkvbroker.so.0 pkgconfig/kvbroker.pc; do
	grep -q "$f\$" "$T/list" || fail "the package lacks .../$f"
done

# the unpacked programs, as they are: no LD_LIBRARY_PATH
unset LD_LIBRARY_PATH
"$R/bin/kvbroker" --version || fail "the unpacked kvbroker does not run"
"$R/bin/kvbctl" --help >/dev/null || fail "the unpacked kvbctl does not run"
"$R/bin/kvb-demo" --help >/dev/null || fail "the unpacked kvb-demo does not run"

# a consumer against the unpacked header and library, found with the
# unpacked kvbroker.pc (relocatable: its prefix follows the file)
PC=$(find "$T/root" -name kvbroker.pc | head -1)
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$PC")
LIBDIR=$(pkg-config --variable=libdir kvbroker)
case $LIBDIR in "$T/root"/*) ;; *) fail "kvbroker.pc points outside the unpacked root: $LIBDIR" ;; esac
# shellcheck disable=SC2046
"$CC" -O1 -o "$T/consumer" "$SRC/tests/install/consumer.c" \
	$(pkg-config --cflags --libs kvbroker) -Wl,-rpath,"$LIBDIR" ||
	fail "build against the unpacked library"
ldd "$T/consumer" | grep -q "$LIBDIR/libkvbroker.so" ||
	fail "the consumer does not load the unpacked libkvbroker.so"

"$R/bin/kvbroker" --config "$(find "$T/root" -path '*kvbroker/kvbroker.conf')" \
	--socket "$T/b.sock" --log-format text >"$T/broker.log" 2>&1 &
BPID=$!
for _ in $(seq 200); do [ -S "$T/b.sock" ] && break; sleep 0.05; done
[ -S "$T/b.sock" ] || fail "the unpacked kvbroker did not start"
timeout 60 "$T/consumer" "$T/b.sock" || fail "consumer"
"$R/bin/kvbctl" --socket "$T/b.sock" stats | grep -E "^(transfers_done|bytes) " ||
	fail "kvbctl stats"
# the unpacked Python package finds the unpacked library (its prefix's)
if [ -x /usr/bin/python3 ]; then
	PYDIR=$(dirname "$(find "$T/root" -path '*dist-packages/kvbroker/__init__.py' | head -1)")
	lib=$(cd / && PYTHONPATH=$(dirname "$PYDIR") /usr/bin/python3 -c \
		'import kvbroker; print(kvbroker.library_path())') ||
		fail "the unpacked Python package: import or library not found"
	case $lib in "$T/root"/*) echo "python: kvbroker loads $lib" ;;
	*) fail "the unpacked Python package loaded $lib, not the package's" ;; esac
fi
echo "PASS: the package unpacked, its broker, library and Python package work"
