#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The man pages: `mandoc -Tlint` finds nothing at warning level or above,
# and every option the programs' --help texts list is documented in their
# page (kvbroker(8), kvbctl(8), kvb-demo(1), kvbench(1) for workload, rate
# and lat). 77 without mandoc.
#
# Usage: man-test.sh SOURCE_DIR BUILD_DIR
set -u
SRC=${1:?source dir}
BUILD=${2:?build dir}
command -v mandoc >/dev/null || { echo "SKIP: no mandoc (apt-get install mandoc)"; exit 77; }
MAN=$SRC/man
rc=0
fail() { echo "FAIL: $*"; rc=1; }

pages="$MAN/kvbroker.8 $MAN/kvbctl.8 $MAN/kvbench.1 $MAN/kvb-demo.1 $MAN/libkvbroker.3"
for p in $pages; do [ -f "$p" ] || fail "missing $p"; done
# shellcheck disable=SC2086
out=$(mandoc -Tlint -Wwarning $pages 2>&1)
lrc=$?
echo "mandoc -Tlint -Wwarning: exit $lrc"
[ -n "$out" ] && echo "$out"
[ $lrc -eq 0 ] && [ -z "$out" ] || fail "mandoc -Tlint"

# options of a --help text that the page lacks (".Fl -name" or a list of
# them: ".Fl -json , -transport")
undocumented() { # page, help text on stdin
	grep -o -- '--[a-z][a-z0-9-]*' | sort -u | while read -r o; do
		# mdoc writes --name as "Fl -name" (or ", -name" in a list)
		grep -Eq -- "(Fl |, )-${o#--}( |$)" "$1" || echo "$o"
	done
}
check() { # page, program args...
	page=$1
	shift
	help=$("$@" --help 2>&1) || [ -n "$help" ] || { fail "$* --help"; return; }
	miss=$(echo "$help" | undocumented "$page")
	n=$(echo "$help" | grep -o -- '--[a-z][a-z0-9-]*' | sort -u | wc -l)
	if [ -n "$miss" ]; then
		fail "$(basename "$page"): not documented from '$* --help':" $miss
	else
		echo "$(basename "$page"): all $n options of '$(basename "$1") ${2:-}${2:+ }--help'"
	fi
}
check "$MAN/kvbroker.8" "$BUILD/broker/kvbroker"
check "$MAN/kvbctl.8" "$BUILD/broker/kvbctl"
check "$MAN/kvb-demo.1" "$BUILD/bench/demo/kvb-demo"
for sub in workload rate lat; do
	check "$MAN/kvbench.1" "$BUILD/bench/kvbench/kvbench" $sub
done
[ $rc -eq 0 ] && echo "PASS: man pages lint clean, every option documented"
exit $rc
