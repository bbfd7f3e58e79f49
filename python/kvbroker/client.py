# SPDX-License-Identifier: MIT
"""kvbroker.Client and kvbroker.Region: a worker attached to the node's broker."""
from __future__ import annotations

import array
import bisect
import ctypes
import errno
import fcntl
import json
import mmap
import os
import threading
import time
import weakref
from ctypes import byref, c_int32, c_uint32, c_void_p
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from . import _lib
from .errors import Error, check, error
from .types import (
    EXPECT_MAX,
    EXPECT_WITHDRAW,
    TRANSFER_OPEN_BATCH_MAX,
    XFER_F_RELEASE_ONLY,
    CompKind,
    Completion,
    Desc,
    KVGeometry,
    OpenResult,
    RemoteRegion,
    Role,
    XferMode,
    role_of,
)

# kvb_wait slices for an unbounded wait (timeout_ms=None): Ctrl-C and
# close() from another thread are seen between two slices
_WAIT_SLICE_MS = 200
_DEFAULT_WAIT_MS = 1000
_STATS_MAX = 1 << 16  # the broker's text fits in one control message
_MEM_FLAGS = 0x1 | 0x2
_KINDS = {int(k): k for k in CompKind}

DescsLike = Union[Sequence[Union[Desc, tuple]], "ctypes.Array[_lib.CDesc]"]


def default_socket() -> str:
    """The socket path a Client(socket=None) attaches to (kvb_default_socket)."""
    lib = _lib.load()
    buf = ctypes.create_string_buffer(4096)
    check(lib.kvb_default_socket(buf, len(buf)), "kvb_default_socket")
    return buf.value.decode()


def _id_bytes(transfer_id: Union[str, bytes], call: str) -> bytes:
    b = transfer_id.encode() if isinstance(transfer_id, str) else bytes(transfer_id)
    if not b or len(b) > _lib.TRANSFER_ID_MAX or b"\0" in b:
        raise ValueError(f"{call}: a transfer id is 1..255 bytes without NUL, not {transfer_id!r}")
    return b


def _u32_array(values: Optional[Iterable[int]]) -> array.array:
    """uint32 array of block ids (a numpy array or any iterable of ints)."""
    if values is None:
        return array.array("I")
    if hasattr(values, "tobytes") and hasattr(values, "dtype"):  # numpy
        import numpy as np

        return array.array("I", np.ascontiguousarray(values, dtype=np.uint32).tobytes())
    return array.array("I", values)


class Region:
    """Memory the broker can read and write: allocated, a memfd, or GPU memory.

    ``id`` names it in descriptors; ``key`` is the label peers look it up by.
    Host regions are mapped in this process (``buffer``, ``as_numpy``,
    ``as_torch``); the mapping is a Python mmap, so a view taken from it
    keeps it mapped: ``free()`` never unmaps memory a live view points into
    (it is unmapped when the last view goes).
    """

    def __init__(self, client: "Client", c: _lib.CRegion, key: int,
                 mm: Optional[mmap.mmap], addr: Optional[int], gpu: bool, device: int = -1,
                 parent: Optional["Region"] = None, parent_offset: int = 0):
        # weak: a dropped Client is detached at once (no cycle to collect)
        self._client: Optional[weakref.ref] = weakref.ref(client)
        self._c = c
        self._mm = mm
        # an alias (kvb_mem_alias): a view of bytes of `parent`'s mapping
        self.parent: Optional[Region] = parent
        self.parent_offset: int = parent_offset
        self.id: int = c.id
        self.flags: int = c.flags
        self.size: int = c.size
        self.key: int = key
        self.gpu: bool = gpu
        self.device: int = device
        self.addr: Optional[int] = addr
        # a host region registered from a memfd keeps that file open (its
        # own descriptor, closed when the region is released): the same
        # memory can be registered with another client (fileno()), e.g. a
        # worker attaching again after its broker restarted
        self._fd: Optional[int] = None
        self.fd_offset: int = 0

    def __repr__(self) -> str:
        state = "freed" if self.freed else ("gpu" if self.gpu else "host")
        addr = f"{self.addr:#x}" if self.addr is not None else None
        return (f"Region(id={self.id:#x}, size={self.size}, flags={self.flags:#x}, "
                f"key={self.key}, addr={addr}, {state})")

    @property
    def freed(self) -> bool:
        """True once free() (or the client's close()) gave it back."""
        return self._client is None

    @property
    def buffer(self) -> memoryview:
        """A writable memoryview (bytes) over the whole host mapping."""
        if self.freed:
            raise ValueError(f"region {self.id:#x} is freed")
        if self.parent is not None:
            off = self.parent_offset
            return self.parent.buffer[off:off + self.size]
        if self._mm is None:
            raise ValueError(f"region {self.id:#x} is not mapped here (GPU memory)")
        return memoryview(self._mm)

    def as_numpy(self, dtype: Any = "uint8", shape: Union[int, Sequence[int], None] = None,
                 offset: int = 0):
        """A numpy array over the mapping (zero-copy): `shape` elements of
        `dtype` from byte `offset` (shape None: as many as fit)."""
        import numpy as np

        dt = np.dtype(dtype)
        count = -1 if shape is None else _prod(shape)
        a = np.frombuffer(self.buffer, dtype=dt, count=count, offset=offset)
        return a if shape is None else a.reshape(shape)

    def as_torch(self, dtype: Any = None, shape: Union[int, Sequence[int], None] = None,
                 offset: int = 0):
        """A CPU torch tensor over the mapping (zero-copy), like as_numpy."""
        import torch

        dt = dtype if dtype is not None else torch.uint8
        count = -1 if shape is None else _prod(shape)
        t = torch.frombuffer(self.buffer, dtype=dt, count=count, offset=offset)
        return t if shape is None else t.view(tuple(shape) if not isinstance(shape, int) else (shape,))

    def offset_of(self, ptr: int) -> int:
        """Byte offset of address ptr inside this region (ValueError outside)."""
        if self.addr is None or not self.addr <= ptr < self.addr + self.size:
            raise ValueError(f"{ptr:#x} is not inside region {self.id:#x}")
        return ptr - self.addr

    def alias(self, offset: int, size: int, flags: int = 0, key: int = 0) -> "Region":
        """A region over bytes [offset, offset + size) of this one
        (kvb_mem_alias): Client.alias(self, ...)."""
        ref = self._client
        c = ref() if ref is not None else None
        if c is None:
            raise ValueError(f"region {self.id:#x} is freed")
        return c.alias(self, offset, size, flags=flags, key=key)

    def fileno(self) -> int:
        """The memfd this host region was registered from (this region's
        own descriptor: do not close it; valid until the region is freed or
        its client closed), at byte ``fd_offset``. Register the same memory
        with another client by ``register_fd(os.dup(r.fileno()), r.size,
        r.fd_offset, ...)``. ValueError for GPU memory, an alias (use its
        parent) or a freed region."""
        if self._fd is None:
            why = ("freed" if self.freed else "GPU memory" if self.gpu else
                   "an alias: its parent holds the file"
                   if self.parent is not None else "not from a file")
            raise ValueError(f"region {self.id:#x} has no memfd ({why})")
        return self._fd

    def free(self) -> None:
        """Give the region back (kvb_mem_free); idempotent."""
        ref = self._client
        c = ref() if ref is not None else None
        if c is None:
            return
        c._free_region(self)

    def _release(self) -> None:
        """Forget the region here: close the mapping where no view holds it."""
        self._client = None
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views hold it: unmapped when the last one goes


def _prod(shape: Union[int, Sequence[int]]) -> int:
    if isinstance(shape, int):
        return shape
    n = 1
    for s in shape:
        n *= int(s)
    return n


# Clients alive in this process: a child forked from it must not detach
# (or use) its parent's contexts (the broker would detach the parent)
_live: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for c in list(_live):
        c._forked = True
        c._ctx = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Client:
    """A worker attached to the node's broker (kvb_attach ... kvb_detach).

    ``socket`` None: $KVB_SOCKET or the default path (default_socket()).
    ``role``: "P" or "D". ``timeout_ms`` bounds attach and every control call.
    ``sq_entries`` / ``cq_entries``: ring sizes (0: the broker's default).

    Threads: control calls (memory, transfers, stats) from any thread;
    submissions (submit_*, seal, abort) from one thread at a time and
    completions (poll, wait) from one thread at a time, as in C. close()
    waits for calls in progress on other threads (a wait ends within its
    slice, 200 ms) and then detaches.
    """

    def __init__(self, socket: Optional[str] = None, role: Union[str, int, Role] = "P",
                 dp_rank: int = 0, tp_rank: int = 0, tp_size: int = 1,
                 timeout_ms: int = 5000, sq_entries: int = 0, cq_entries: int = 0):
        self._ctx: Optional[int] = None
        self._forked = False
        self._lock = threading.Lock()  # _ctx, _busy, _closing, the region maps
        self._busy = 0
        self._closing = False
        self._regions: Dict[int, Region] = {}
        self._by_addr: List[tuple] = []  # sorted (addr, id) of mapped/gpu regions
        self._cbufs: Dict[int, Any] = {}
        lib = _lib.load()
        self._lib = lib
        self.role = role_of(role)
        self.dp_rank, self.tp_rank, self.tp_size = dp_rank, tp_rank, tp_size
        self.timeout_ms = timeout_ms
        self.socket = socket if socket is not None else default_socket()
        opts = _lib.AttachOpts(self.socket.encode(), int(self.role), dp_rank, tp_rank,
                               tp_size, sq_entries, cq_entries, timeout_ms)
        ctx = c_void_p()
        check(lib.kvb_attach(byref(opts), byref(ctx)), "kvb_attach")
        self._ctx = ctx.value
        self.worker_id: int = lib.kvb_worker_id(self._ctx)
        _live.add(self)

    # ---- lifetime ----

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"worker {self.worker_id:#x}"
        return f"<kvbroker.Client {self.role.name} dp{self.dp_rank} tp{self.tp_rank}/{self.tp_size} {state} at {self.socket}>"

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def close(self) -> None:
        """Detach (kvb_detach): the broker fails this worker's unfinished
        transfers and frees its regions. Idempotent. In a child forked
        after the attach it does nothing (the context is the parent's)."""
        with self._lock:
            if self._ctx is None or self._closing:
                return
            self._closing = True
        # calls in progress on other threads end within their bounds (a
        # wait's slice, a control call's timeout_ms)
        while self._busy:
            time.sleep(0.001)
        with self._lock:
            ctx, self._ctx = self._ctx, None
        try:
            self._lib.kvb_detach(ctx)
        finally:
            for r in list(self._regions.values()):
                r._release()
            self._regions.clear()
            self._by_addr.clear()
            self._cbufs.clear()

    def _enter(self, call: str) -> int:
        with self._lock:
            if self._ctx is None or self._closing:
                if self._forked:
                    raise Error(errno.EBADF, "client was attached by the parent process "
                                "(fork): attach a new one here", call)
                raise Error(errno.EBADF, "client is closed", call)
            self._busy += 1
            return self._ctx

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1

    # ---- memory ----

    def alloc(self, size: int, flags: int = 0, key: int = 0) -> Region:
        """A new region of `size` bytes shared with the broker, mapped here.

        As kvb_mem_alloc does: a memfd sealed against shrinking, asked for
        huge pages; registered with kvb_mem_register_fd, mapped by a Python
        mmap (so views keep it alive). flags: MEM_REMOTE_WRITE/READ.
        """
        if size <= 0:
            raise Error(errno.EINVAL, f"region size must be > 0, not {size}", "kvb_mem_alloc")
        if flags & ~_MEM_FLAGS:
            raise Error(errno.EINVAL, f"bad region flags {flags:#x}", "kvb_mem_alloc")
        try:
            fd = os.memfd_create("kvb-region", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as e:
            raise Error(e.errno or errno.ENOMEM, f"memfd_create: {e.strerror}", "kvb_mem_alloc") from None
        try:
            try:
                os.ftruncate(fd, size)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
            except (OSError, OverflowError) as e:
                err = getattr(e, "errno", None) or errno.EINVAL
                raise Error(err, f"sizing the memfd: {e}", "kvb_mem_alloc") from None
            r = self._register_fd(fd, 0, size, flags, key, "kvb_mem_alloc", True, own=True)
            fd = -1  # the region's now
            return r
        finally:
            if fd >= 0:
                os.close(fd)

    def register_fd(self, fd: int, size: int, offset: int = 0, flags: int = 0,
                    key: int = 0, map: bool = True) -> Region:
        """Register `size` bytes of a memfd at `offset` (a multiple of 4096).

        The library seals the file against shrinking (a memfd made with
        MFD_ALLOW_SEALING; else the broker refuses it: EPERM). The caller
        keeps its fd (the region holds a duplicate: Region.fileno()).
        map=True maps the range here too (Region.buffer).
        """
        return self._register_fd(fd, offset, size, flags, key, "kvb_mem_register_fd", map)

    def _register_fd(self, fd: int, offset: int, size: int, flags: int, key: int,
                     call: str, want_map: bool, own: bool = False) -> Region:
        """own: the region takes fd (else it keeps a duplicate)."""
        mm = None
        addr = None
        if want_map:
            try:
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                               offset=offset)
            except (OSError, ValueError, OverflowError) as e:
                err = getattr(e, "errno", None) or errno.EINVAL
                raise Error(err, f"cannot map the region: {e}", call) from None
            if hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    mm.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass  # no THP here: no error
            tmp = ctypes.c_char.from_buffer(mm)
            addr = ctypes.addressof(tmp)
            del tmp
        c = _lib.CRegion()
        ctx = self._enter(call)
        try:
            rc = self._lib.kvb_mem_register_fd(ctx, fd, offset, size, flags, key, byref(c))
        finally:
            self._leave()
        if rc < 0:
            if mm is not None:
                mm.close()
            raise error(rc, call)
        r = Region(self, c, key, mm, addr, False)
        try:
            r._fd = fd if own else os.dup(fd)  # non-inheritable
        except OSError:
            r._fd = None  # no descriptor left: it cannot be registered again
        r.fd_offset = offset
        self._track(r)
        return r

    def register_gpu(self, ptr: Any, size: Optional[int] = None, device: Optional[int] = None,
                     flags: int = 0, key: int = 0) -> Region:
        """Register GPU memory: a device pointer (an int, e.g. a CUDA/HIP
        tensor's data_ptr()) of `size` bytes on `device`. A torch tensor may
        be passed as ptr: its data_ptr, nbytes and device index are used.
        ENODEV when this library or node has no GPU runtime."""
        if hasattr(ptr, "data_ptr"):
            t = ptr
            ptr = t.data_ptr()
            if size is None:
                size = t.numel() * t.element_size()
            if device is None:
                device = t.device.index if t.device.index is not None else 0
        if size is None or device is None:
            raise TypeError("register_gpu: size and device are needed with a pointer")
        c = _lib.CRegion()
        ctx = self._enter("kvb_mem_register_gpu")
        try:
            rc = self._lib.kvb_mem_register_gpu(ctx, c_void_p(int(ptr)), size, device, flags,
                                                key, byref(c))
        finally:
            self._leave()
        check(rc, "kvb_mem_register_gpu")
        r = Region(self, c, key, None, int(ptr), True, device)
        self._track(r)
        return r

    def alias(self, region: Region, offset: int, size: int, flags: int = 0,
              key: int = 0) -> Region:
        """A new region over bytes [offset, offset + size) of host region
        `region` (kvb_mem_alias): any byte offset, no new memory; usable
        with set_kv and in descriptors like any region. Its buffer,
        as_numpy and as_torch are views of the parent's mapping. Free the
        aliases before their parent (else EBUSY); EOPNOTSUPP for GPU
        memory or an alias of an alias."""
        if region.freed:
            raise Error(errno.ENOENT, f"region {region.id:#x} is freed", "kvb_mem_alias")
        if not self._lib.has("kvb_mem_alias"):
            raise Error(errno.ENOSYS, "this libkvbroker has no kvb_mem_alias", "kvb_mem_alias")
        c = _lib.CRegion()
        ctx = self._enter("kvb_mem_alias")
        try:
            rc = self._lib.kvb_mem_alias(ctx, byref(region._c), offset, size, flags, key,
                                         byref(c))
        finally:
            self._leave()
        check(rc, "kvb_mem_alias")
        addr = region.addr + offset if region.addr is not None else None
        r = Region(self, c, key, None, addr, False, parent=region, parent_offset=offset)
        self._track(r)
        return r

    def _track(self, r: Region) -> None:
        with self._lock:
            self._regions[r.id] = r
            if r.addr is not None:
                bisect.insort(self._by_addr, (r.addr, r.id))

    def _untrack(self, r: Region) -> None:
        with self._lock:
            self._regions.pop(r.id, None)
            if r.addr is not None:
                try:
                    self._by_addr.remove((r.addr, r.id))
                except ValueError:
                    pass

    def _free_region(self, r: Region) -> None:
        ctx = self._enter("kvb_mem_free")
        try:
            rc = self._lib.kvb_mem_free(ctx, byref(r._c))
        finally:
            self._leave()
        if rc == -errno.EBUSY:  # aliases of it live: nothing changed
            raise error(rc, "kvb_mem_free")
        # the mapping is ours whatever the broker said (as in C)
        self._untrack(r)
        r._release()
        if rc < 0 and rc != -errno.EPIPE:
            raise error(rc, "kvb_mem_free")

    def regions(self) -> List[Region]:
        """The regions this client holds (not freed)."""
        with self._lock:
            return list(self._regions.values())

    def region_for(self, ptr: int, size: int = 1) -> Optional[Region]:
        """The region (host mapping or GPU range) holding [ptr, ptr+size), or None.

        For a tensor over broker memory: ``region_for(t.data_ptr(),
        t.numel() * t.element_size())``, then ``region.offset_of(ptr)``."""
        alias = None
        with self._lock:
            # regions overlap where aliases cut a parent: the nearest start
            # that holds the range, a parent before an alias
            i = bisect.bisect_right(self._by_addr, (ptr, 1 << 64)) - 1
            while i >= 0:
                addr, rid = self._by_addr[i]
                r = self._regions.get(rid)
                i -= 1
                if r is None or ptr + size > addr + r.size:
                    continue
                if r.parent is None:
                    return r
                alias = alias or r
        return alias

    def lookup(self, role: Union[str, int, Role], dp_rank: int, tp_rank: int,
               key: int) -> RemoteRegion:
        """A region another worker on this node registered with remote
        access, by its owner and key (ENOENT: none)."""
        out = _lib.CRemoteRegion()
        ctx = self._enter("kvb_mem_lookup")
        try:
            rc = self._lib.kvb_mem_lookup(ctx, int(role_of(role)), dp_rank, tp_rank, key,
                                          byref(out))
        finally:
            self._leave()
        check(rc, "kvb_mem_lookup")
        return RemoteRegion(out.id, out.flags, out.size)

    def set_kv(self, region: Union[Region, int], layer: int, geometry: KVGeometry) -> None:
        """Declare that `region` holds layer `layer` laid out as `geometry`
        (offered to peer brokers). EINVAL: bad layout or it does not fit."""
        rid = region.id if isinstance(region, Region) else int(region)
        g = _lib.CKVGeometry(geometry.layout_code(), geometry.num_blocks, geometry.block_size,
                             geometry.num_heads, geometry.head_dim, geometry.elem_size)
        ctx = self._enter("kvb_mem_set_kv")
        try:
            rc = self._lib.kvb_mem_set_kv(ctx, rid, layer, byref(g))
        finally:
            self._leave()
        check(rc, "kvb_mem_set_kv")

    # ---- transfers ----

    def open(self, transfer_id: Union[str, bytes]) -> int:
        """Open (intern) a transfer by id: its handle for descriptors."""
        b = _id_bytes(transfer_id, "kvb_transfer_open")
        h = c_uint32()
        ctx = self._enter("kvb_transfer_open")
        try:
            rc = self._lib.kvb_transfer_open(ctx, b, byref(h))
        finally:
            self._leave()
        check(rc, "kvb_transfer_open")
        return h.value

    def open_batch(self, ids: Sequence[Union[str, bytes]]) -> List[OpenResult]:
        """Open many transfers, 64 per round trip: one OpenResult per id
        (handle, status), each id failing on its own. Raises only when a
        round trip fails as a whole (broker gone, timeout)."""
        if not self._lib.has("kvb_transfer_open_batch"):
            return [self._open_one(i) for i in ids]
        bs = [_id_bytes(i, "kvb_transfer_open_batch") for i in ids]
        out: List[OpenResult] = []
        for k in range(0, len(bs), TRANSFER_OPEN_BATCH_MAX):
            chunk = bs[k:k + TRANSFER_OPEN_BATCH_MAX]
            n = len(chunk)
            cids = (ctypes.c_char_p * n)(*chunk)
            handles = (c_uint32 * n)()
            status = (ctypes.c_int * n)(*([1] * n))  # 1: not answered
            ctx = self._enter("kvb_transfer_open_batch")
            try:
                rc = self._lib.kvb_transfer_open_batch(ctx, cids, n, handles, status)
            finally:
                self._leave()
            if rc < 0 and any(s == 1 for s in status):
                raise error(rc, "kvb_transfer_open_batch")
            out.extend(OpenResult(handles[i], status[i]) for i in range(n))
        return out

    def _open_one(self, i: Union[str, bytes]) -> OpenResult:
        try:
            return OpenResult(self.open(i), 0)
        except Error as e:
            if e.errno in (errno.EPIPE, errno.ETIMEDOUT, errno.EBADF):
                raise
            return OpenResult(0, -e.errno)

    def peer_connect(self, host: str, port: int) -> int:
        """Handshake with another node's broker (its --handshake-port):
        the peer number for descriptors and open_remote()."""
        hb = host.encode()
        if not 0 < port < 65536:
            raise Error(errno.EINVAL, f"bad port {port}", "kvb_peer_connect")
        p = c_uint32()
        ctx = self._enter("kvb_peer_connect")
        try:
            rc = self._lib.kvb_peer_connect(ctx, hb, port, byref(p))
        finally:
            self._leave()
        check(rc, "kvb_peer_connect")
        return p.value

    def open_remote(self, transfer_id: Union[str, bytes], peer: int,
                    mode: Union[str, int, XferMode] = "write", blocks: Iterable[int] = (),
                    remote_blocks: Optional[Iterable[int]] = None, remote_dp_rank: int = 0,
                    flags: int = 0, notify_host: Optional[str] = None,
                    notify_port: int = 0) -> int:
        """Open a cross-node transfer (kvb_transfer_open_remote): mode
        "write" (P pushes) or "read" (D pulls); `blocks` this worker's block
        ids, `remote_blocks` the P's (D, read). Returns the handle."""
        b = _id_bytes(transfer_id, "kvb_transfer_open_remote")
        if isinstance(mode, str):
            try:
                m = XferMode[mode.upper()]
            except KeyError:
                raise ValueError(f"mode must be 'write' or 'read', not {mode!r}") from None
        else:
            m = XferMode(mode)
        blk = _u32_array(blocks)
        rblk = _u32_array(remote_blocks)
        x = _lib.CRemoteXfer()
        x.peer, x.mode, x.flags, x.remote_dp_rank = peer, int(m), flags, remote_dp_rank
        x.blocks = blk.buffer_info()[0] if len(blk) else None
        x.nblocks = len(blk)
        x.remote_blocks = rblk.buffer_info()[0] if len(rblk) else None
        x.nremote = len(rblk)
        x.notify_host = notify_host.encode() if notify_host else None
        x.notify_port = notify_port
        h = c_uint32()
        ctx = self._enter("kvb_transfer_open_remote")
        try:
            rc = self._lib.kvb_transfer_open_remote(ctx, b, byref(x), byref(h))
        finally:
            self._leave()
        check(rc, "kvb_transfer_open_remote")
        return h.value

    def open_remote_batch(self, entries: Sequence[Dict[str, Any]]) -> List[tuple]:
        """Open cross-node transfers by their peer's address, in one round
        trip (kvb_transfer_open_remote_batch); never waits for a handshake.

        Each entry is a dict: transfer_id, host, port (the peer broker's
        --host-ip and --handshake-port), mode ("write"/"read", default
        "write"), blocks, remote_blocks, remote_dp_rank, flags, and
        release_only=True (adds XFER_F_RELEASE_ONLY). Returns one
        (status, handle) per entry: status 0 with the handle, or that
        entry's -errno with handle 0. Raises Error for the whole call
        (EINVAL, E2BIG, EPIPE, ETIMEDOUT); ValueError / TypeError for an
        entry Python cannot pass (bad id, mode or key)."""
        call = "kvb_transfer_open_remote_batch"
        n = len(entries)
        if n == 0:
            return []
        if not self._lib.has(call):
            raise Error(errno.ENOSYS, f"this libkvbroker has no {call}", call)
        arr = (_lib.CRemoteOpen * n)()
        keep = []  # the buffers the C array points into
        known = {"transfer_id", "host", "port", "mode", "blocks", "remote_blocks",
                 "remote_dp_rank", "flags", "release_only"}
        for i, e in enumerate(entries):
            bad = set(e) - known
            if bad:
                raise TypeError(f"{call}: unknown entry key(s) {sorted(bad)}")
            tid = _id_bytes(e["transfer_id"], call)
            host = str(e["host"]).encode()
            mode = e.get("mode", "write")
            if isinstance(mode, str):
                try:
                    m = XferMode[mode.upper()]
                except KeyError:
                    raise ValueError(f"mode must be 'write' or 'read', not {mode!r}") from None
            else:
                m = XferMode(mode)
            blk = _u32_array(e.get("blocks"))
            rblk = _u32_array(e.get("remote_blocks"))
            flags = int(e.get("flags", 0))
            if e.get("release_only"):
                flags |= XFER_F_RELEASE_ONLY
            keep += [tid, host, blk, rblk]
            c = arr[i]
            c.transfer_id, c.host, c.port = tid, host, int(e["port"])
            c.mode, c.flags = int(m), flags
            c.remote_dp_rank = int(e.get("remote_dp_rank", 0))
            c.blocks = blk.buffer_info()[0] if len(blk) else None
            c.nblocks = len(blk)
            c.remote_blocks = rblk.buffer_info()[0] if len(rblk) else None
            c.nremote = len(rblk)
        hs = (c_uint32 * n)()
        st = (c_int32 * n)()
        ctx = self._enter(call)
        try:
            rc = self._lib.kvb_transfer_open_remote_batch(ctx, arr, n, hs, st)
        finally:
            self._leave()
        check(rc, call)
        del keep
        return [(st[i], hs[i]) for i in range(n)]

    def expect(self, ids: Sequence[Union[str, bytes]], withdraw: bool = False) -> List[int]:
        """P: the transfer ids this worker will open (kvb_transfer_expect),
        so that D's announcement of an id it does not expect fails after
        the broker's --unknown-timeout; withdraw=True: no longer expected,
        D's transfer fails at once. One round trip per 1024 ids. Returns
        one status per id (0 or -errno: EINVAL, ESTALE, ENOSPC, ENOTCONN);
        raises Error for the whole call (EPIPE, ETIMEDOUT, ENOSYS: a
        libkvbroker without it)."""
        call = "kvb_transfer_expect"
        if not ids:
            return []
        if not self._lib.has(call):
            raise Error(errno.ENOSYS, f"this libkvbroker has no {call}", call)
        bs = [_id_bytes(i, call) for i in ids]
        out: List[int] = []
        for k in range(0, len(bs), EXPECT_MAX):
            chunk = bs[k:k + EXPECT_MAX]
            n = len(chunk)
            cids = (ctypes.c_char_p * n)(*chunk)
            st = (c_int32 * n)()
            ctx = self._enter(call)
            try:
                rc = self._lib.kvb_transfer_expect(ctx, cids, n,
                                                   EXPECT_WITHDRAW if withdraw else 0, st)
            finally:
                self._leave()
            check(rc, call)
            out.extend(st[i] for i in range(n))
        return out

    # ---- submission (one submitting thread) ----

    @staticmethod
    def desc_array(n: int) -> "ctypes.Array[_lib.CDesc]":
        """A C array of n descriptors to fill in place and reuse (no
        conversion when passed to submit_write / submit_read)."""
        return (_lib.CDesc * n)()

    def _submit(self, fn, call: str, descs: DescsLike, n: Optional[int]) -> int:
        if isinstance(descs, ctypes.Array) and descs._type_ is _lib.CDesc:
            arr = descs
            cnt = len(arr) if n is None else min(n, len(arr))
        else:
            cnt = len(descs) if n is None else min(n, len(descs))
            if cnt == 0:
                return 0
            try:
                arr = (_lib.CDesc * cnt)(*descs[:cnt])
            except (TypeError, ValueError, RuntimeError) as e:
                # ctypes reports a bad field of an element as RuntimeError
                raise TypeError(f"{call}: descriptors are Desc or tuples in its order: {e}") from None
        if cnt == 0:
            return 0
        ctx = self._enter(call)
        try:
            rc = fn(ctx, arr, cnt)
        finally:
            self._leave()
        if rc == -errno.EAGAIN:
            return 0
        return check(rc, call)

    def submit_write(self, descs: DescsLike, n: Optional[int] = None) -> int:
        """Queue WRITE descriptors (local region -> peer region); never blocks.

        Returns how many were queued (a prefix; 0 when the ring is full:
        reap completions and retry the rest). descs: Desc, tuples in Desc's
        order, or a desc_array() (first n)."""
        return self._submit(self._lib.kvb_submit_write, "kvb_submit_write", descs, n)

    def submit_read(self, descs: DescsLike, n: Optional[int] = None) -> int:
        """Queue READ descriptors (peer region -> local region); as submit_write."""
        return self._submit(self._lib.kvb_submit_read, "kvb_submit_read", descs, n)

    def submit_layer(self, handle: int, layer: int, tag: int = 0, flags: int = 0) -> int:
        """Queue one layer of a cross-node transfer: 1, or 0 when the ring is full."""
        ctx = self._enter("kvb_submit_layer")
        try:
            rc = self._lib.kvb_submit_layer(ctx, handle, layer, tag, flags)
        finally:
            self._leave()
        if rc == -errno.EAGAIN:
            return 0
        return check(rc, "kvb_submit_layer")

    @staticmethod
    def layer_arrays(handles: Sequence[int], tags: Sequence[int]) -> tuple:
        """C arrays (uint32 handles, uint64 tags) for submit_layers, to
        build once per step and pass for every layer (no conversion)."""
        if len(handles) != len(tags):
            raise ValueError(f"{len(handles)} handles but {len(tags)} tags")
        n = len(handles)
        return (c_uint32 * n)(*handles), (ctypes.c_uint64 * n)(*tags)

    def submit_layers(self, handles: Sequence[int], tags: Sequence[int], layer: int,
                      flags: int = 0) -> int:
        """submit_layer for many transfers at once, the same layer:
        handles[i]'s op completes with tags[i] (kvb_submit_layers: one
        broker wake-up). Lists, or the C arrays of layer_arrays().
        Returns how many went in (the first ones; 0 when the ring is full).
        Without kvb_submit_layers in the library: one submit_layer each."""
        n = len(handles)
        if n != len(tags):
            raise ValueError(f"{n} handles but {len(tags)} tags")
        if n == 0:
            return 0
        if not self._lib.has("kvb_submit_layers"):
            done = 0
            for h, t in zip(handles, tags):
                if not self.submit_layer(h, layer, t, flags):
                    break
                done += 1
            return done
        hs = handles if isinstance(handles, ctypes.Array) else (c_uint32 * n)(*handles)
        ts = tags if isinstance(tags, ctypes.Array) else (ctypes.c_uint64 * n)(*tags)
        ctx = self._enter("kvb_submit_layers")
        try:
            rc = self._lib.kvb_submit_layers(ctx, hs, ts, n, layer, flags)
        finally:
            self._leave()
        if rc == -errno.EAGAIN:
            return 0
        return check(rc, "kvb_submit_layers")

    def seal(self, handle: int, expected: int, tag: int = 0) -> None:
        """The transfer is done once `expected` descriptors (or peers' or
        layers', see kvbroker.h) completed: a TRANSFER completion with tag
        follows. RingFull when the ring is full (poll and retry)."""
        ctx = self._enter("kvb_transfer_seal")
        try:
            rc = self._lib.kvb_transfer_seal(ctx, handle, expected, tag)
        finally:
            self._leave()
        check(rc, "kvb_transfer_seal")

    def seal_many(self, handles: Sequence[int], expected: Sequence[int],
                  tags: Sequence[int]) -> int:
        """seal for many transfers at once (kvb_transfer_seal_many: one
        broker wake-up): how many went in, the first ones (0: ring full,
        poll and retry the rest). Without it in the library: one seal
        each."""
        n = len(handles)
        if n != len(expected) or n != len(tags):
            raise ValueError(f"{n} handles, {len(expected)} counts, {len(tags)} tags")
        if n == 0:
            return 0
        if not self._lib.has("kvb_transfer_seal_many"):
            for i in range(n):
                try:
                    self.seal(handles[i], expected[i], tags[i])
                except RingFull:
                    return i
            return n
        hs = (c_uint32 * n)(*handles)
        ex = (c_uint32 * n)(*expected)
        ts = (ctypes.c_uint64 * n)(*tags)
        ctx = self._enter("kvb_transfer_seal_many")
        try:
            rc = self._lib.kvb_transfer_seal_many(ctx, hs, ex, ts, n)
        finally:
            self._leave()
        if rc == -errno.EAGAIN:
            return 0
        return check(rc, "kvb_transfer_seal_many")

    def abort(self, handle: int, tag: int = 0) -> None:
        """Abort a transfer: it completes with -ECANCELED. RingFull as seal."""
        ctx = self._enter("kvb_transfer_abort")
        try:
            rc = self._lib.kvb_transfer_abort(ctx, handle, tag)
        finally:
            self._leave()
        check(rc, "kvb_transfer_abort")

    def set_timeouts(self, handle: int, deadline_ms: int = 0, stall_ms: int = 0,
                     defer_ms: int = 0) -> None:
        """A transfer's clocks in ms, 0 = leave as it is (docs/deadlines.md):
        its deadline (from now), its stall timeout (once it started), its
        defer timeout (cross-node only). kvb_transfer_set_timeouts; ENOSYS
        with a library that lacks it."""
        if not self._lib.has("kvb_transfer_set_timeouts"):
            raise Error(errno.ENOSYS, "the library has no kvb_transfer_set_timeouts",
                        "kvb_transfer_set_timeouts")
        ctx = self._enter("kvb_transfer_set_timeouts")
        try:
            rc = self._lib.kvb_transfer_set_timeouts(ctx, handle, deadline_ms, stall_ms,
                                                     defer_ms)
        finally:
            self._leave()
        check(rc, "kvb_transfer_set_timeouts")

    # ---- completion (one completing thread) ----

    def _cbuf(self, max: int):
        if max <= 0:
            raise ValueError(f"max must be > 0, not {max}")
        b = self._cbufs.get(max)
        if b is None:
            b = self._cbufs[max] = (_lib.CCompletion * max)()
        return b

    @staticmethod
    def _convert(buf, n: int) -> List[Completion]:
        out = []
        for i in range(n):
            c = buf[i]
            k = c.kind
            out.append(Completion(c.tag, c.bytes, c.status, c.transfer, _KINDS.get(k, k)))
        return out

    def poll(self, max: int = 64) -> List[Completion]:
        """Reap up to max completions without blocking ([] when none).
        BrokerGone when the broker is gone and nothing is left."""
        buf = self._cbuf(max)
        ctx = self._enter("kvb_poll")
        try:
            rc = self._lib.kvb_poll(ctx, buf, max)
        finally:
            self._leave()
        return self._convert(buf, check(rc, "kvb_poll"))

    def wait(self, max: int = 64, timeout_ms: Optional[int] = _DEFAULT_WAIT_MS) -> List[Completion]:
        """Wait up to timeout_ms for at least one completion; [] on timeout.

        timeout_ms None (or negative, C's -1) waits until one comes, the
        broker goes (BrokerGone) or close() is called, in 200 ms slices
        (Ctrl-C is seen between them)."""
        return self.wait_min(1, max, timeout_ms)

    def wait_min(self, min: int, max: int = 64,
                 timeout_ms: Optional[int] = _DEFAULT_WAIT_MS) -> List[Completion]:
        """Wait until at least `min` completions are there (one wake-up for
        a batch); returns what it has when timeout_ms runs out (maybe []),
        or at a SHUTDOWN completion. timeout_ms None: as wait()."""
        if min > max:
            raise ValueError(f"min ({min}) > max ({max})")
        buf = self._cbuf(max)
        lib = self._lib
        use_min = lib.has("kvb_wait_min")
        if timeout_ms is not None and timeout_ms < 0:
            timeout_ms = None  # C's -1: no limit (sliced all the same)
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000.0
        got: List[Completion] = []
        while True:
            slice_ms = _WAIT_SLICE_MS
            if deadline is not None:
                left_ms = int((deadline - time.monotonic()) * 1000.0 + 0.999)
                slice_ms = min_(max_(left_ms, 0), _WAIT_SLICE_MS)
            room = max - len(got)
            want = min - len(got)
            ctx = self._enter("kvb_wait")
            try:
                if use_min:
                    rc = lib.kvb_wait_min(ctx, buf, room, want, slice_ms)
                else:
                    rc = lib.kvb_wait(ctx, buf, room, slice_ms)
            finally:
                self._leave()
            if rc == -errno.ETIMEDOUT:
                rc = 0
            if rc < 0:
                if got:  # what came first is still the caller's
                    return got
                raise error(rc, "kvb_wait_min" if use_min else "kvb_wait")
            got.extend(self._convert(buf, rc))
            if len(got) >= min or any(c.kind == CompKind.SHUTDOWN for c in got):
                return got
            if self._closing:
                return got
            if deadline is not None and time.monotonic() >= deadline:
                return got

    # ---- misc ----

    def stats(self) -> Dict[str, Any]:
        """The broker's counters (kvbctl stats --json) as a dict."""
        return json.loads(self._stats_text(1, "kvb_stats"))

    def stats_text(self) -> str:
        """The broker's counters as kvbctl stats prints them (a table)."""
        return self._stats_text(0, "kvb_stats")

    def _stats_text(self, as_json: int, call: str) -> str:
        if not self._lib.has("kvb_stats"):
            raise Error(errno.ENOSYS, f"{self._lib.path} has no kvb_stats (older library)", call)
        buf = ctypes.create_string_buffer(_STATS_MAX)
        ctx = self._enter(call)
        try:
            rc = self._lib.kvb_stats(ctx, as_json, buf, _STATS_MAX)
        finally:
            self._leave()
        check(rc, call)
        return buf.value.decode("utf-8", "replace")


def min_(a: int, b: int) -> int:
    return a if a < b else b


def max_(a: int, b: int) -> int:
    return a if a > b else b
