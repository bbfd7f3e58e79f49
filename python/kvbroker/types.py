# SPDX-License-Identifier: MIT
"""kvbroker's constants and small records (kvbroker.h's, in Python)."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

from .errors import Error, error

# Region access flags (kvb_mem_alloc & co)
MEM_REMOTE_WRITE = 0x1
MEM_REMOTE_READ = 0x2
# Descriptor flag: no completion on success
DESC_UNSIGNALED = 0x1
# Flags of open_remote()
XFER_F_NO_ANNOUNCE = 0x1
XFER_F_PLAIN_RELEASE = 0x2
XFER_F_RELEASE_ONLY = 0x4  # open_remote_batch, D/WRITE: only a release to P
# KV layouts (set_kv)
KV_KV_FIRST = 0
KV_BLOCK_FIRST = 1
KV_PACKED = 2
# Most ids one kvb_transfer_open_batch call takes (open_batch splits more)
TRANSFER_OPEN_BATCH_MAX = 64
# Entries one XOPEN_BATCH message carries at most (the library splits more)
REMOTE_OPEN_BATCH_MAX = 1024
# Ids one kvb_transfer_expect call takes (Client.expect splits more); its flag
EXPECT_MAX = 1024
EXPECT_WITHDRAW = 0x1
# Longest transfer id, in bytes (UTF-8)
TRANSFER_ID_MAX = 255


class Role(enum.IntEnum):
    """A worker's role: P (prefill, sends KV) or D (decode, receives it)."""

    P = 1
    D = 2


class XferMode(enum.IntEnum):
    """Cross-node transfer modes (MoRIIO's)."""

    WRITE = 0  # P pushes into D
    READ = 1  # D pulls from P


class CompKind(enum.IntEnum):
    """What a completion reports."""

    DESC = 1  # one descriptor (or one layer of submit_layer)
    TRANSFER = 2  # a whole transfer ended (seal / abort)
    SHUTDOWN = 3  # the broker is going away


def role_of(role: Union[str, int, Role]) -> Role:
    """Role from "P"/"D" (any case), a Role or its number."""
    if isinstance(role, str):
        try:
            return Role[role.upper()]
        except KeyError:
            raise ValueError(f"role must be 'P' or 'D', not {role!r}") from None
    try:
        return Role(role)
    except ValueError:
        raise ValueError(f"role must be 'P' or 'D', not {role!r}") from None


class Desc(NamedTuple):
    """One transfer descriptor (struct kvb_desc), fields in the C order.

    A NamedTuple, not a dataclass: a list of them (or of plain tuples in
    this order) becomes the C array in one step. Build it by keyword:
    ``Desc(transfer=h, region=src.id, peer_region=dst.id, len=4096, tag=1)``.
    """

    transfer: int = 0  # handle from open()
    layer: int = 0
    flags: int = 0  # DESC_UNSIGNALED
    region: int = 0  # local region id
    peer_region: int = 0  # remote region id
    offset: int = 0  # in the local region
    peer_offset: int = 0  # in the remote region
    len: int = 0
    tag: int = 0  # echoed in the completion
    peer: int = 0  # peer node; 0 = this node


class Completion(NamedTuple):
    """One completion (struct kvb_completion)."""

    tag: int
    bytes: int
    status: int  # 0 or -errno
    transfer: int
    kind: Union[CompKind, int]

    @property
    def ok(self) -> bool:
        """True when it succeeded (status 0)."""
        return self.status == 0

    @property
    def error(self) -> Optional[Error]:
        """The failure as an Error (not raised), or None when it succeeded."""
        if self.status == 0:
            return None
        return error(self.status if self.status < 0 else -self.status, "completion")


class RemoteRegion(NamedTuple):
    """A region another worker registered with remote access (lookup())."""

    id: int
    flags: int
    size: int


class OpenResult(NamedTuple):
    """One id's outcome in open_batch(): its handle (0 when it failed)."""

    handle: int
    status: int  # 0 or -errno

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def error(self) -> Optional[Error]:
        return None if self.status == 0 else error(self.status, "kvb_transfer_open_batch")


_LAYOUTS = {"kv_first": KV_KV_FIRST, "block_first": KV_BLOCK_FIRST,
            "packed": KV_PACKED}


@dataclass
class KVGeometry:
    """How one layer's KV tensor lies in a region (struct kvb_kv_geometry).

    Dense, shaped [2, num_blocks, block_size, num_heads, head_dim]
    ("kv_first"), [num_blocks, 2, block_size, num_heads, head_dim]
    ("block_first"), or [num_blocks, block_size, num_heads, head_dim] with
    a head's K and V side by side in head_dim ("packed", vLLM >= 0.29),
    elements of elem_size bytes.
    """

    layout: Union[str, int] = "kv_first"
    num_blocks: int = 0
    block_size: int = 0  # tokens per block
    num_heads: int = 0  # KV heads held by this worker
    head_dim: int = 0
    elem_size: int = 2  # bytes per element (2: bf16 / fp16)

    def layout_code(self) -> int:
        """The layout as kvbroker.h's number (ValueError when unknown)."""
        if isinstance(self.layout, str):
            try:
                return _LAYOUTS[self.layout.lower()]
            except KeyError:
                raise ValueError(
                    f"layout must be 'kv_first', 'block_first' or 'packed', not {self.layout!r}"
                ) from None
        if int(self.layout) not in _LAYOUTS.values():
            raise ValueError(f"layout must be 0 (kv_first), 1 (block_first) or 2 (packed), "
                             f"not {self.layout!r}")
        return int(self.layout)

    @property
    def nbytes(self) -> int:
        """Bytes the layer's tensor takes."""
        planes = 1 if self.layout_code() == KV_PACKED else 2
        return (planes * self.num_blocks * self.block_size * self.num_heads * self.head_dim
                * self.elem_size)
