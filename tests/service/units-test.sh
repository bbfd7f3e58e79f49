#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The systemd units as installed: `cmake --install` into a temporary prefix,
# ExecStart pointed at the prefix's kvbroker (the units name the configured
# prefix's), then `systemd-analyze verify` on kvbroker.service and an
# instance of kvbroker@.service, with the installed man pages on MANPATH
# (Documentation=man:kvbroker(8)). Any complaint fails, warnings included.
# Also: what the units promise (Type=notify, the socket directory, the
# config). 77 without systemd-analyze.
#
# Usage: units-test.sh BUILD_DIR
set -u
BUILD=${1:?build dir}
command -v systemd-analyze >/dev/null || { echo "SKIP: no systemd-analyze"; exit 77; }
T=$(mktemp -d /tmp/kvb-units.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$BUILD" --prefix "$T/p" >"$T/install.log" 2>&1 ||
	fail "cmake --install: $(tail -5 "$T/install.log")"
UNITS=$T/p/lib/systemd/system
[ -f "$UNITS/kvbroker.service" ] && [ -f "$UNITS/kvbroker@.service" ] ||
	fail "units not installed in lib/systemd/system"
bin=$(sed -n 's/^ExecStart=\([^ ]*\) .*/\1/p' "$UNITS/kvbroker.service")
case $bin in /*/kvbroker) ;; *) fail "ExecStart names '$bin'" ;; esac
mkdir "$T/u"
sed "s#$bin#$T/p/bin/kvbroker#" "$UNITS/kvbroker.service" >"$T/u/kvbroker.service"
sed "s#$bin#$T/p/bin/kvbroker#" "$UNITS/kvbroker@.service" >"$T/u/kvbroker@.service"
cp "$T/u/kvbroker@.service" "$T/u/kvbroker@test.service"
cat "$T/u/kvbroker.service"

out=$(MANPATH=$T/p/share/man SYSTEMD_LOG_COLOR=0 systemd-analyze verify \
	"$T/u/kvbroker.service" "$T/u/kvbroker@test.service" 2>&1)
rc=$?
echo "systemd-analyze verify: exit $rc${out:+, said:}"
[ -n "$out" ] && echo "$out"
[ $rc -eq 0 ] && [ -z "$out" ] || fail "systemd-analyze verify"

# a broken unit is caught (the check can fail)
sed 's/^Type=notify/Type=notify\nNoSuchKey=1/' "$T/u/kvbroker.service" >"$T/u/bad.service"
bad=$(MANPATH=$T/p/share/man systemd-analyze verify "$T/u/bad.service" 2>&1)
echo "$bad" | grep -q "NoSuchKey" || fail "a bad key went unnoticed: $bad"

for want in "Type=notify" "RuntimeDirectory=kvbroker" "RuntimeDirectoryMode=0700" \
	"LimitMEMLOCK=infinity" "NoNewPrivileges=yes" "ProtectSystem=strict" \
	"ProtectHome=yes" "PrivateTmp=yes" "WatchdogSec=" "RestartPreventExitStatus=2"; do
	grep -q "^$want" "$T/u/kvbroker.service" || fail "kvbroker.service lacks $want"
	grep -q "^$want" "$T/u/kvbroker@.service" ||
		[ "$want" = "RuntimeDirectory=kvbroker" ] || fail "kvbroker@.service lacks $want"
done
grep -q "^ExecStart=.* --config .*/kvbroker/kvbroker.conf$" "$T/u/kvbroker.service" ||
	fail "kvbroker.service: ExecStart without --config .../kvbroker/kvbroker.conf"
grep -q "^ExecStart=.* --config .*/kvbroker/%i.conf --socket /run/kvbroker-%i/kvbroker.sock$" \
	"$T/u/kvbroker@.service" || fail "kvbroker@.service: ExecStart"
grep -q "^RuntimeDirectory=kvbroker-%i$" "$T/u/kvbroker@.service" ||
	fail "kvbroker@.service: RuntimeDirectory"
# the config the unit reads is installed, and the broker takes it as is
[ -f "$T/p/etc/kvbroker/kvbroker.conf" ] || fail "etc/kvbroker/kvbroker.conf not installed"
"$T/p/bin/kvbroker" --config "$T/p/etc/kvbroker/kvbroker.conf" --socket "$T/b.sock" \
	--log-format text >"$T/b.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$T/b.sock" ] && break; sleep 0.05; done
[ -S "$T/b.sock" ] || { cat "$T/b.log"; fail "the installed broker did not start on the installed config"; }
"$T/p/bin/kvbctl" --socket "$T/b.sock" stats >/dev/null || fail "kvbctl stats"
kill "$pid"; wait "$pid" || fail "broker exit status $?"
echo "PASS: units verified, installed config accepted"
