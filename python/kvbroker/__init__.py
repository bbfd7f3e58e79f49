# SPDX-License-Identifier: MIT
"""kvbroker: Python binding of libkvbroker (ctypes, no compiled extension).

    import kvbroker
    with kvbroker.Client(role="P") as c:
        src = c.alloc(1 << 20, key=1)
        dst = c.alloc(1 << 20, key=2)
        h = c.open("tx-1")
        c.submit_write([kvbroker.Desc(transfer=h, region=src.id,
                                      peer_region=dst.id, len=1 << 20, tag=1)])
        c.seal(h, 1, tag=2)
        done = c.wait_min(2, timeout_ms=5000)

See docs/python.md.
"""
from ._lib import load as load_library
from .client import Client, Region, default_socket
from .errors import BrokerGone, Error, LibraryNotFound, RingFull, strerror
from .types import (
    DESC_UNSIGNALED,
    EXPECT_MAX,
    EXPECT_WITHDRAW,
    KV_BLOCK_FIRST,
    KV_PACKED,
    KV_KV_FIRST,
    MEM_REMOTE_READ,
    MEM_REMOTE_WRITE,
    TRANSFER_ID_MAX,
    TRANSFER_OPEN_BATCH_MAX,
    XFER_F_NO_ANNOUNCE,
    XFER_F_PLAIN_RELEASE,
    XFER_F_RELEASE_ONLY,
    REMOTE_OPEN_BATCH_MAX,
    CompKind,
    Completion,
    Desc,
    KVGeometry,
    OpenResult,
    RemoteRegion,
    Role,
    XferMode,
)

__version__ = "0.1.0"


def library_path() -> str:
    """Where the loaded libkvbroker came from (loads it if needed)."""
    return load_library().path


__all__ = [
    "Client", "Region", "default_socket", "load_library", "library_path",
    "Error", "BrokerGone", "RingFull", "LibraryNotFound", "strerror",
    "Desc", "Completion", "CompKind", "KVGeometry", "OpenResult", "RemoteRegion",
    "Role", "XferMode",
    "MEM_REMOTE_WRITE", "MEM_REMOTE_READ", "DESC_UNSIGNALED",
    "XFER_F_NO_ANNOUNCE", "XFER_F_PLAIN_RELEASE", "XFER_F_RELEASE_ONLY",
    "REMOTE_OPEN_BATCH_MAX", "KV_KV_FIRST", "KV_BLOCK_FIRST", "KV_PACKED",
    "TRANSFER_OPEN_BATCH_MAX", "TRANSFER_ID_MAX", "EXPECT_MAX", "EXPECT_WITHDRAW",
]
