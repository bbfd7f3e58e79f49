#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""
The include graph between kvbroker's layers, from the #include lines of its
C sources: each folder belongs to one layer, and a file may include only
files of its own layer or of the layers below it. Prints the graph (one
line per layer edge, with how many #include lines make it) and fails
(exit 1) on an edge to a later layer, naming every offending line.

Layers, from the bottom:
  0 shm        shared-memory rings and segments, the control protocol
  1 common     transport interface, GPU runtime and IPC export, KV geometry
  2 client     the client library (libkvbroker) and its control socket
  3 transports bridge/ transports: local, gpu, tcp, rdma
  4 engine     broker/: the node's engine (rings, merge, flush, credits)
  5 xnode      bridge/zmq (MoRIIO protocol) and bridge/xnode (cross-node)
  6 daemon     broker/main.c, broker/kvbctl.c, bench/: the daemon and tools

Besides: the engine includes no particular transport's header (it reaches
transports through common/transport.h only). With the order above, no
engine file includes a cross-node one, so the two cannot form a cycle.

Usage: scripts/check-layers.py [REPO_ROOT]
"""
import os
import re
import sys

LAYERS = ["shm", "common", "client", "transports", "engine", "xnode", "daemon"]

# (path prefix, layer): the longest prefix that matches wins
PLACES = [
    ("shm/", "shm"),
    ("common/", "common"),
    ("client/", "client"),
    ("bridge/", "transports"),
    ("bridge/zmq/", "xnode"),
    ("bridge/xnode/", "xnode"),
    ("broker/", "engine"),
    ("broker/main.c", "daemon"),
    ("broker/kvbctl.c", "daemon"),
    ("bench/", "daemon"),
]

# where a quoted include is looked up: the includer's folder, then these
# (the include directories the CMake targets give)
SEARCH = ["", "shm", "common", "client", "client/include", "bridge", "broker"]

INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    best = None
    for prefix, layer in PLACES:
        if path.startswith(prefix) and (best is None or
                                        len(prefix) > len(best[0])):
            best = (prefix, layer)
    return best[1] if best else None


def resolve(root, includer, name):
    here = os.path.dirname(includer)
    for d in [here] + SEARCH[1:]:
        cand = os.path.normpath(os.path.join(d, name))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    root = os.path.abspath(root)
    edges = {}
    bad = []
    for top in ("shm", "common", "client", "bridge", "broker", "bench"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root)
                src = layer_of(path)
                if src is None:
                    continue
                with open(os.path.join(root, path), errors="replace") as fh:
                    for no, line in enumerate(fh, 1):
                        m = INC.match(line)
                        if not m:
                            continue
                        dst_path = resolve(root, path, m.group(1))
                        dst = layer_of(dst_path) if dst_path else None
                        if dst is None:
                            continue
                        key = (src, dst)
                        edges[key] = edges.get(key, 0) + 1
                        if src == "engine" and dst == "transports":
                            bad.append("%s:%d: the engine includes a "
                                       "transport's header %s" %
                                       (path, no, dst_path))
                        elif LAYERS.index(dst) > LAYERS.index(src):
                            bad.append("%s:%d: %s (%s) includes %s (%s)" %
                                       (path, no, path, src, dst_path, dst))
    print("include graph between layers (from -> to: #include lines):")
    for (s, d), n in sorted(edges.items(),
                            key=lambda e: (LAYERS.index(e[0][0]),
                                           LAYERS.index(e[0][1]))):
        if s != d:
            print("  %-10s -> %-10s %4d" % (s, d, n))
    if bad:
        print("upward includes (a layer including a later one) and engine -> transport:")
        for b in bad:
            print("  " + b)
        return 1
    print("no include to a later layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
