#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs one of deploy/tools' checks with node; 77 (skipped) without node or
# without deploy/tools/node_modules (scripts/deps.sh test installs both).
# Usage: node-check.sh SOURCE_DIR SCRIPT [ARGS...]
SRC=${1:?source dir}
shift
command -v node >/dev/null || { echo "SKIP: no node"; exit 77; }
[ -d "$SRC/deploy/tools/node_modules/kubernetes-models" ] || {
	echo "SKIP: no deploy/tools/node_modules (scripts/deps.sh test)"
	exit 77
}
cd "$SRC/deploy/tools" && exec node "$@"
