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

And the cross-node module's state stays its own: the engine's structs
(struct kvb_worker in broker/broker.h, struct kvb_region_ent in
broker/regions.h) declare none of its fields (MODULE_FIELDS), no file
outside bridge/xnode/ touches them by those names, and bridge/xnode/ does
not count ops on the engine's transfers itself (no kvb_xfer_account call,
no write to a transfer's counters or to a region's refs): the engine does,
through kvb_op_complete, kvb_xfer_peer_done and the hooks' results
(docs/design.md, "Structure").

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

# fields of the cross-node module's state: never in these engine structs
MODULE_FIELDS = ["notify", "kv_layer", "nkv", "grant", "ngrant", "has_kv",
                 "tcp_reg", "rdma_reg", "layer", "geom"]
ENGINE_STRUCTS = [("broker/broker.h", "kvb_worker"),
                  ("broker/regions.h", "kvb_region_ent")]
# ... and by these names (unambiguous ones) nowhere outside bridge/xnode/
MODULE_ACCESS = re.compile(
    r"->\s*(kv_layer|nkv|has_kv|tcp_reg|rdma_reg|ngrant)\b|\bw->notify\b")
# what bridge/xnode/ must not do to the engine's transfers and regions
ACCOUNTING = [
    (re.compile(r"\bkvb_xfer_account\s*\("),
     "calls kvb_xfer_account (the engine counts the module's ops)"),
    (re.compile(r"\b(?!rx->)\w+->(completed|failed|inbound|fence_ns|"
                r"first_err|progress)\s*(\+\+|--|[-+|]?=(?!=))"),
     "writes a transfer's counters (the engine's)"),
    (re.compile(r"->\s*refs\s*(\+\+|--|[-+]?=(?!=))"),
     "writes a region's refs (kvb_region_hold)"),
]


def struct_fields(text, name):
    m = re.search(r"struct\s+%s\s*\{(.*?)\n\};" % name, text, re.S)
    if not m:
        return None
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    return set(re.findall(r"\b(\w+)\s*(?:\[[^]]*\])?\s*[;,]", body))


def module_state(root):
    """Where the module's state leaks into the engine: messages."""
    bad = []
    for path, name in ENGINE_STRUCTS:
        with open(os.path.join(root, path), errors="replace") as fh:
            fields = struct_fields(fh.read(), name)
        if fields is None:
            bad.append("%s: struct %s not found" % (path, name))
            continue
        for f in MODULE_FIELDS:
            if f in fields:
                bad.append("%s: struct %s has the module's field %s" %
                           (path, name, f))
    for path, no, line in source_lines(root):
        inside = path.startswith("bridge/xnode/")
        code = line.split("//")[0]
        if not inside and MODULE_ACCESS.search(code):
            bad.append("%s:%d: the module's state outside bridge/xnode/: %s"
                       % (path, no, line.strip()))
        if not inside:
            continue
        for rx, why in ACCOUNTING:
            if rx.search(code):
                bad.append("%s:%d: %s: %s" % (path, no, why, line.strip()))
    return bad


def source_lines(root):
    """(path relative to root, line number, line) of every C source and
    header of the layered folders."""
    for top in ("shm", "common", "client", "bridge", "broker", "bench"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root)
                with open(os.path.join(root, path), errors="replace") as fh:
                    for no, line in enumerate(fh, 1):
                        yield path, no, line


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
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    root = os.path.abspath(root)
    if not os.path.isfile(os.path.join(root, "broker", "broker.h")):
        print("check-layers.py: %s is not a kvbroker source tree "
              "(no broker/broker.h)" % root, file=sys.stderr)
        return 2
    edges = {}
    bad = []
    for path, no, line in source_lines(root):
        src = layer_of(path)
        m = INC.match(line)
        if src is None or not m:
            continue
        dst_path = resolve(root, path, m.group(1))
        dst = layer_of(dst_path) if dst_path else None
        if dst is None:
            continue
        key = (src, dst)
        edges[key] = edges.get(key, 0) + 1
        if src == "engine" and dst == "transports":
            bad.append("%s:%d: the engine includes a transport's header %s"
                       % (path, no, dst_path))
        elif LAYERS.index(dst) > LAYERS.index(src):
            bad.append("%s:%d: %s (%s) includes %s (%s)" %
                       (path, no, path, src, dst_path, dst))
    print("include graph between layers (from -> to: #include lines):")
    for (s, d), n in sorted(edges.items(),
                            key=lambda e: (LAYERS.index(e[0][0]),
                                           LAYERS.index(e[0][1]))):
        if s != d:
            print("  %-10s -> %-10s %4d" % (s, d, n))
    state = module_state(root)
    if bad:
        print("upward includes (a layer including a later one) and engine -> transport:")
        for b in bad:
            print("  " + b)
    else:
        print("no include to a later layer, no transport header in the engine")
    if state:
        print("the cross-node module's state or accounting across the line:")
        for b in state:
            print("  " + b)
    else:
        print("the module's state stays in bridge/xnode/ (%s); it counts "
              "nothing on the engine's transfers" % ", ".join(MODULE_FIELDS))
    return 1 if bad or state else 0


if __name__ == "__main__":
    sys.exit(main())
