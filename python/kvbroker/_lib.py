# SPDX-License-Identifier: MIT
"""Finding and binding libkvbroker with ctypes (private).

The structures mirror client/include/kvbroker/kvbroker.h field by field;
tests/python/test_layout.py compares their sizes and offsets with the C
compiler's (tests/python/layout.c).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sysconfig
import threading
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_int,
    c_int32,
    c_uint,
    c_uint16,
    c_uint32,
    c_uint64,
    c_ulong,
    c_void_p,
)
from pathlib import Path
from typing import List, Optional, Tuple

SONAME = "libkvbroker.so.0"
TRANSFER_ID_MAX = 255
OPEN_BATCH_MAX = 64


class AttachOpts(Structure):
    _fields_ = [
        ("socket_path", c_char_p),
        ("role", c_int),  # enum kvb_role
        ("dp_rank", c_uint32),
        ("tp_rank", c_uint32),
        ("tp_size", c_uint32),
        ("sq_entries", c_uint32),
        ("cq_entries", c_uint32),
        ("timeout_ms", c_int),
    ]


class CRegion(Structure):
    _fields_ = [
        ("id", c_uint32),
        ("flags", c_uint32),
        ("addr", c_void_p),
        ("size", c_uint64),
        ("gpu", c_uint32),
        ("alias", c_uint32),
    ]


class CRemoteRegion(Structure):
    _fields_ = [("id", c_uint32), ("flags", c_uint32), ("size", c_uint64)]


class CDesc(Structure):
    _fields_ = [
        ("transfer", c_uint32),
        ("layer", c_uint16),
        ("flags", c_uint16),
        ("region", c_uint32),
        ("peer_region", c_uint32),
        ("offset", c_uint64),
        ("peer_offset", c_uint64),
        ("len", c_uint64),
        ("tag", c_uint64),
        ("peer", c_uint32),
    ]


class CKVGeometry(Structure):
    _fields_ = [
        ("layout", c_uint32),
        ("num_blocks", c_uint32),
        ("block_size", c_uint32),
        ("num_heads", c_uint32),
        ("head_dim", c_uint32),
        ("elem_size", c_uint32),
    ]


class CRemoteXfer(Structure):
    _fields_ = [
        ("peer", c_uint32),
        ("mode", c_uint32),
        ("flags", c_uint32),
        ("remote_dp_rank", c_uint32),
        ("blocks", c_void_p),  # const uint32_t *
        ("nblocks", c_uint32),
        ("remote_blocks", c_void_p),  # const uint32_t *
        ("nremote", c_uint32),
        ("notify_host", c_char_p),
        ("notify_port", c_uint16),
    ]


class CRemoteOpen(Structure):
    _fields_ = [
        ("transfer_id", c_char_p),
        ("host", c_char_p),
        ("port", c_uint16),
        ("pad", c_uint16),
        ("mode", c_uint32),
        ("flags", c_uint32),
        ("remote_dp_rank", c_uint32),
        ("blocks", c_void_p),  # const uint32_t *
        ("nblocks", c_uint32),
        ("remote_blocks", c_void_p),  # const uint32_t *
        ("nremote", c_uint32),
    ]


class CCompletion(Structure):
    _fields_ = [
        ("tag", c_uint64),
        ("bytes", c_uint64),
        ("status", c_int32),
        ("transfer", c_uint32),
        ("kind", c_uint32),
    ]


STRUCTS = {
    "kvb_attach_opts": AttachOpts,
    "kvb_region": CRegion,
    "kvb_remote_region": CRemoteRegion,
    "kvb_desc": CDesc,
    "kvb_kv_geometry": CKVGeometry,
    "kvb_remote_xfer": CRemoteXfer,
    "kvb_remote_open": CRemoteOpen,
    "kvb_completion": CCompletion,
}

_P = c_void_p  # struct kvb_ctx *

# name: (restype, argtypes, required)
_PROTOS = {
    "kvb_default_socket": (c_int, [c_char_p, c_ulong], True),
    "kvb_attach": (c_int, [POINTER(AttachOpts), POINTER(c_void_p)], True),
    "kvb_detach": (c_int, [_P], True),
    "kvb_worker_id": (c_uint32, [_P], True),
    "kvb_mem_alloc": (c_int, [_P, c_uint64, c_uint32, c_uint64, POINTER(CRegion)], True),
    "kvb_mem_register_fd": (
        c_int,
        [_P, c_int, c_uint64, c_uint64, c_uint32, c_uint64, POINTER(CRegion)],
        True,
    ),
    "kvb_mem_register_gpu": (
        c_int,
        [_P, c_void_p, c_uint64, c_int, c_uint32, c_uint64, POINTER(CRegion)],
        True,
    ),
    "kvb_mem_free": (c_int, [_P, POINTER(CRegion)], True),
    "kvb_mem_lookup": (
        c_int,
        [_P, c_int, c_uint32, c_uint32, c_uint64, POINTER(CRemoteRegion)],
        True,
    ),
    "kvb_transfer_open": (c_int, [_P, c_char_p, POINTER(c_uint32)], True),
    "kvb_transfer_open_batch": (
        c_int,
        [_P, POINTER(c_char_p), c_uint, POINTER(c_uint32), POINTER(c_int)],
        False,
    ),
    "kvb_submit_write": (c_int, [_P, c_void_p, c_uint], True),
    "kvb_submit_read": (c_int, [_P, c_void_p, c_uint], True),
    "kvb_transfer_seal": (c_int, [_P, c_uint32, c_uint32, c_uint64], True),
    "kvb_transfer_abort": (c_int, [_P, c_uint32, c_uint64], True),
    "kvb_transfer_set_timeouts": (
        c_int,
        [_P, c_uint32, c_uint32, c_uint32, c_uint32],
        False,
    ),
    "kvb_mem_set_kv": (c_int, [_P, c_uint32, c_uint32, POINTER(CKVGeometry)], True),
    "kvb_peer_connect": (c_int, [_P, c_char_p, c_uint16, POINTER(c_uint32)], True),
    "kvb_transfer_open_remote": (
        c_int,
        [_P, c_char_p, POINTER(CRemoteXfer), POINTER(c_uint32)],
        True,
    ),
    "kvb_transfer_open_remote_batch": (
        c_int,
        [_P, POINTER(CRemoteOpen), c_uint, POINTER(c_uint32), POINTER(c_int32)],
        False,
    ),
    "kvb_transfer_seal_many": (
        c_int,
        [_P, POINTER(c_uint32), POINTER(c_uint32), POINTER(c_uint64), c_uint],
        False,
    ),
    "kvb_transfer_expect": (
        c_int,
        [_P, POINTER(c_char_p), c_uint, c_uint, POINTER(c_int32)],
        False,
    ),
    "kvb_mem_alias": (
        c_int,
        [_P, POINTER(CRegion), c_uint64, c_uint64, c_uint32, c_uint64, POINTER(CRegion)],
        False,
    ),
    "kvb_submit_layer": (c_int, [_P, c_uint32, c_uint16, c_uint64, c_uint32], True),
    "kvb_submit_layers": (
        c_int,
        [_P, POINTER(c_uint32), POINTER(c_uint64), c_uint, c_uint16, c_uint32],
        False,
    ),
    "kvb_poll": (c_int, [_P, c_void_p, c_uint], True),
    "kvb_wait": (c_int, [_P, c_void_p, c_uint, c_int], True),
    "kvb_wait_min": (c_int, [_P, c_void_p, c_uint, c_uint, c_int], False),
    "kvb_stats": (c_int, [_P, c_int, c_void_p, c_ulong], False),
    "kvb_strerror": (c_char_p, [c_int], True),
}


class Lib:
    """libkvbroker, loaded, with its functions' prototypes set."""

    def __init__(self, cdll: ctypes.CDLL, path: str):
        self.cdll = cdll
        self.path = path
        missing = []
        for name, (res, args, required) in _PROTOS.items():
            try:
                fn = getattr(cdll, name)
            except AttributeError:
                if required:
                    missing.append(name)
                setattr(self, name, None)
                continue
            fn.restype = res
            fn.argtypes = args
            setattr(self, name, fn)
        if missing:
            raise OSError(f"{path}: not libkvbroker (no {', '.join(missing)})")

    def has(self, name: str) -> bool:
        """Does this library have `name` (newer calls are optional)?"""
        return getattr(self, name, None) is not None


def _multiarch() -> Optional[str]:
    return sysconfig.get_config_var("MULTIARCH") or None


def _prefix_of_package() -> Optional[Path]:
    """<prefix> when this package lies in <prefix>/lib*/python*/(site|dist)-packages."""
    pkg = Path(__file__).resolve().parent
    sp = pkg.parent
    if sp.name not in ("site-packages", "dist-packages"):
        return None
    # <prefix>/<libdir>/<pythonX[.Y]>/<site-packages>/kvbroker; libdir may
    # be lib/<multiarch> (never for Python, but be lenient)
    for anc in sp.parents:
        if anc.name.startswith("lib"):
            return anc.parent
    return None


def candidates() -> List[Tuple[str, str]]:
    """The places tried, in order: (what, path or name)."""
    out: List[Tuple[str, str]] = []
    env = os.environ.get("KVBROKER_LIB")
    if env:
        p = Path(env)
        if p.is_dir():
            out.append(("$KVBROKER_LIB", str(p / SONAME)))
            out.append(("$KVBROKER_LIB", str(p / "libkvbroker.so")))
        else:
            out.append(("$KVBROKER_LIB", env))
    prefix = _prefix_of_package()
    if prefix is not None:
        dirs = [prefix / "lib"]
        ma = _multiarch()
        if ma:
            dirs.append(prefix / "lib" / ma)
        dirs.append(prefix / "lib64")
        for d in dirs:
            out.append(("package prefix", str(d / SONAME)))
    out.append(("system loader", SONAME))
    found = ctypes.util.find_library("kvbroker")
    if found and found != SONAME:
        out.append(("system loader (find_library)", found))
    out.append(("system loader", "libkvbroker.so"))
    return out


_lock = threading.Lock()
_lib: Optional[Lib] = None


def load() -> Lib:
    """The library, loaded on first use (kvbroker.LibraryNotFound if none loads)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried: List[str] = []
        for what, path in candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(f"{path} ({what}): no such file")
                continue
            try:
                _lib = Lib(ctypes.CDLL(path), path)
                return _lib
            except OSError as e:
                tried.append(f"{path} ({what}): {e}")
        from .errors import LibraryNotFound

        raise LibraryNotFound(tried)
