# SPDX-License-Identifier: MIT
"""The ctypes mirrors of kvbroker.h's structures have the C compiler's
sizes, field offsets and field sizes (tests/python/layout.c prints them),
and the binding's constants are the header's."""
import ctypes
import json
import os
import subprocess

import pytest

import kvbroker
from kvbroker import _lib


@pytest.fixture(scope="module")
def c_layout():
    exe = os.environ.get("KVB_LAYOUT_BIN")
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip("KVB_LAYOUT_BIN names no layout helper")
    return json.loads(subprocess.check_output([exe], text=True))


@pytest.mark.parametrize("name", sorted(_lib.STRUCTS))
def test_struct(c_layout, name):
    cls = _lib.STRUCTS[name]
    c = c_layout[name]
    assert ctypes.sizeof(cls) == c["size"], name
    py_fields = [f[0] for f in cls._fields_]
    # every C field mirrored, in the C order
    assert py_fields == list(c["fields"]), name
    for field, (off, size) in c["fields"].items():
        d = getattr(cls, field)
        assert (d.offset, d.size) == (off, size), f"{name}.{field}"


def test_every_header_struct_checked(c_layout):
    assert set(_lib.STRUCTS) == set(k for k in c_layout if k != "constants")


def test_constants(c_layout):
    k = c_layout["constants"]
    assert kvbroker.MEM_REMOTE_WRITE == k["MEM_REMOTE_WRITE"]
    assert kvbroker.MEM_REMOTE_READ == k["MEM_REMOTE_READ"]
    assert kvbroker.DESC_UNSIGNALED == k["DESC_UNSIGNALED"]
    assert kvbroker.XFER_F_NO_ANNOUNCE == k["XFER_F_NO_ANNOUNCE"]
    assert kvbroker.XFER_F_PLAIN_RELEASE == k["XFER_F_PLAIN_RELEASE"]
    assert kvbroker.XFER_F_RELEASE_ONLY == k["XFER_F_RELEASE_ONLY"]
    assert kvbroker.REMOTE_OPEN_BATCH_MAX == k["REMOTE_OPEN_BATCH_MAX"]
    assert kvbroker.KV_KV_FIRST == k["KV_KV_FIRST"]
    assert kvbroker.KV_BLOCK_FIRST == k["KV_BLOCK_FIRST"]
    assert kvbroker.TRANSFER_OPEN_BATCH_MAX == k["TRANSFER_OPEN_BATCH_MAX"]
    assert _lib.OPEN_BATCH_MAX == k["TRANSFER_OPEN_BATCH_MAX"]
    assert kvbroker.Role.P == k["ROLE_P"] and kvbroker.Role.D == k["ROLE_D"]
    assert kvbroker.XferMode.WRITE == k["XFER_WRITE"]
    assert kvbroker.XferMode.READ == k["XFER_READ"]
    assert kvbroker.CompKind.DESC == k["COMP_DESC"]
    assert kvbroker.CompKind.TRANSFER == k["COMP_TRANSFER"]
    assert kvbroker.CompKind.SHUTDOWN == k["COMP_SHUTDOWN"]


def test_desc_fields_match_c_order():
    # a Desc (or a tuple in its order) becomes a struct kvb_desc as is
    assert kvbroker.Desc._fields == tuple(f[0] for f in _lib.CDesc._fields_)
    d = kvbroker.Desc(transfer=1, layer=2, flags=3, region=4, peer_region=5,
                      offset=6, peer_offset=7, len=8, tag=9, peer=10)
    c = (_lib.CDesc * 1)(d)[0]
    assert tuple(getattr(c, f) for f in kvbroker.Desc._fields) == tuple(d)


def test_every_exported_function_bound():
    """The binding knows every function the version script exports."""
    with open(os.path.join(os.environ.get("KVB_SRC_DIR", "."), "client", "libkvbroker.map")) as f:
        text = f.read()
    exported = set()
    for block in text.split("global:")[1:]:
        for line in block.split(";"):
            name = line.strip().split()[-1] if line.strip() else ""
            if name.startswith("kvb_"):
                exported.add(name)
            if "local:" in line or "}" in line:
                break
    assert exported, "no kvb_ symbol found in libkvbroker.map"
    assert set(_lib._PROTOS) == exported
    lib = _lib.load()
    for name in exported:  # and this build's library has them all
        assert lib.has(name), name
