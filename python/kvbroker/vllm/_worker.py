# SPDX-License-Identifier: MIT
"""Worker side of KVBrokerConnector: one broker client per TP rank.

register_kv_caches declares each layer's memory and geometry to the broker.
Every step's work is set up when vLLM binds the step's metadata (before the
forward in every vLLM version; from 0.29 start_load_kv runs after it): the
step's transfers are opened in one round trip (Client.open_remote_batch,
which never waits for a handshake), P's saves get the layers the forward
writes (save_kv_layer, one call per layer for all requests), and
wait_for_save queues any layer no hook saved (a full CUDA graph, block-major
views) and seals. get_transfer_results / get_finished reap completions and
report each request once, only when vLLM still holds it. The broker moves
the bytes: nothing is copied in Python.

Every transfer ends: the broker fails it within its timeouts (a dead peer
in --peer-timeout); should the broker itself go away, every live transfer
ends here at once; and a transfer that has heard nothing by
``transfer_timeout_s`` is aborted, and ended here 5 s after that whatever
the broker says.

A broker that went away (killed, restarted) is attached again once one
answers at the same socket: from the step hooks, one try every
REATTACH_S at most, the same KV cache memory registered again and each
layer's geometry declared again (_reattach). Transfers opened meanwhile
fail at once.

Hybrid models (several KV cache groups): the broker maps one block list to
every layer of a transfer, so a request's transfer is opened as one part per
group (group k under ``<transfer id>#g<k>``, _groups.sub_transfer_id), each
carrying its group's layers and blocks; the request is reported once every
part ended, failed if any failed (request-level: failed_recving only, never
block ids, which vLLM cannot take with several groups).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ._compat import parallel_ranks
from ._groups import Group, sub_transfer_id
from ._layout import (LayerLayout, LayoutError, ViewInfo, derive,
                      derive_view, view_layout)
from ._params import Config, ReqMeta

log = logging.getLogger("kvbroker.vllm")

# the broker's doorbell counters are read at most this often (stats)
DOORBELL_SAMPLE_S = 5.0

KIND_DESC, KIND_TRANSFER, KIND_SHUTDOWN = 1, 2, 3
UNSIGNALED = 0x1  # KVB_DESC_UNSIGNALED
REGION_FLAGS = 0x3  # KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ
ABORT_GRACE_S = 5.0
PREEMPT_WAIT_S = 2.0
LIVENESS_S = 0.25
REATTACH_S = 0.25  # a gone broker: one attach try per this, at most
# ids declared to P's broker (expect) that no save opened yet are declared
# again to a new broker while younger than its --unopened-timeout
EXPECT_KEEP_S = 60.0
_LAYER_RE = re.compile(r"(?:^|\.)layers?\.(\d+)(?:\.|$)")

LOAD, SAVE, RELEASE = "load", "save", "release"
SERVE = "serve"  # P, READ mode: holds a request's blocks for D's reads
# READ mode, D: a load stops this long before P's hold on its blocks ends
# (P's clock; the hosts' clocks are taken to agree within this)
LEASE_MARGIN_S = 2.0


@dataclass(eq=False)
class Xfer:
    """One request's transfer on this worker."""
    meta: ReqMeta
    # LOAD (D), SAVE (P, WRITE), SERVE (P, READ: its blocks held for D's
    # reads) or RELEASE (D: only frees P's blocks)
    kind: str
    tag: int
    handle: int = 0
    deadline: float = 0.0
    aborted: bool = False  # the scheduler asked (request dropped)
    abort_sent: float = 0.0  # when we aborted it (deadline passed)
    done: bool = False
    status: int = 0
    opened_at: float = 0.0  # time.monotonic() at the open (stats)
    why: list = field(default_factory=list)
    # several KV cache groups: every part of the request's transfer (one
    # per group, this one among them; parts[0] stands for the request)
    parts: list | None = None
    sib_abort: bool = False  # aborted here because another part failed


def _parts(x: Xfer) -> list[Xfer]:
    """Every part of x's request transfer (x alone with one group)."""
    return x.parts or [x]


def _errno(e: BaseException) -> int:
    return getattr(e, "errno", None) or errno.EIO


class _LayerBurst:
    """A step's layer ops in one call per layer (Client.submit_layers, that
    is kvb_submit_layers) over arrays built once per step, instead of one
    call per request: what keeps save_kv_layer at a few microseconds with
    many requests (BENCHMARKS.md)."""

    def __init__(self, client):
        self.client = client
        self.h = self.t = None
        self.n = 0

    @classmethod
    def make(cls, client):
        if not hasattr(client, "submit_layers") or \
                not hasattr(client, "layer_arrays"):
            return None  # an older binding: one call per request
        return cls(client)

    def prepare(self, saves: list) -> None:
        self.n = len(saves)
        self.h, self.t = self.client.layer_arrays(
            [x.handle for x in saves], [x.tag for x in saves])

    def submit(self, saves: list, layer: int, errors) -> int:
        """Queue layer for saves[0:k]; returns k (the rest: one by one, and
        that path says what went wrong)."""
        if self.n != len(saves) or not self.n:
            return 0
        try:
            return self.client.submit_layers(self.h, self.t, layer,
                                             UNSIGNALED)
        except errors:
            return 0


class BrokerWorker:
    def __init__(self, vllm_config: Any, cfg: Config, producer: bool,
                 groups: list[Group] | None = None):
        import kvbroker

        self._kvb = kvbroker
        self.cfg = cfg
        self.producer = producer
        self.dp_rank, self.tp_rank, self.tp_size = parallel_ranks(vllm_config)
        self.vllm_config = vllm_config
        self.block_size = int(getattr(getattr(vllm_config, "cache_config",
                                              None), "block_size", 0) or 0)
        self.client = kvbroker.Client(
            socket=cfg.broker_socket, role="P" if producer else "D",
            dp_rank=self.dp_rank, tp_rank=self.tp_rank, tp_size=self.tp_size,
            timeout_ms=cfg.timeout_ms)
        self.layer_of: dict[str, int] = {}
        # KV cache groups: a vLLM layer's group, and the (group, broker
        # layer) pairs a save queues (layers of several groups can share
        # one tensor, hence one broker layer)
        self.groups = list(groups or [])
        self.n_groups = max(1, len(self.groups))
        self.group_of: dict[str, int] = {
            n: g for g, grp in enumerate(self.groups)
            for n in grp.layer_names}
        self._pairs: list[tuple[int, int]] = []
        self.layouts: list[LayerLayout] = []
        self.regions: list[Any] = []
        self.local_heads = 0
        self.hnd = False
        self.cuda = False
        # broker layers whose vLLM layers share block rows (block-major
        # views): queued once, in wait_for_save
        self._row_layers: set[int] = set()
        self._xfers: dict[int, Xfer] = {}  # tag -> live
        self._by_req: dict[str, Xfer] = {}  # req -> its load or save
        self._next_tag = 1
        self._bound: Any = None  # the metadata P's step was set up from
        self._started: Any = None  # ... D's
        self._saves: list[Xfer] = []  # P: this step's (parts: all groups)
        self._saves_g: dict[int, list[Xfer]] = {}  # ... by KV cache group
        self._step_layers: dict[int, int] = {}  # layers queued, by group
        self._bursts: dict[int, _LayerBurst] = {}
        self._saved_layers: set[tuple[int, int]] = set()  # (group, layer)
        self._cuda_pending: list[tuple[tuple[int, int], Any]] = []
        # reports: P saves ended (sent once vLLM finished the request), D
        # loads ended (with the failed ones apart), and requests vLLM
        # finished whose save still runs
        self._send_done: set[str] = set()
        self._recv_done: set[str] = set()
        self._recv_failed: set[str] = set()
        self._finished_seen: set[str] = set()
        self._load_errors: set[int] = set()
        self.broker_gone = ""
        self._probed = 0.0
        # attaching again (_reattach): each layer's geometry, when the
        # broker went, the next try, the gone client's memfds
        self._geoms: list[Any] = []
        self._gone_at = 0.0
        self._next_try = 0.0
        self._memfds: dict[int, int] = {}
        self._no_reattach = ""
        self._reattach_warned = False
        self._declared: dict[Any, float] = {}  # P: expected, not opened
        self._sock_id = self._socket_id(self.client.socket)
        self._sock_checked = 0.0
        self.stats = {"opened": 0, "ok": 0, "failed": 0, "aborted": 0,
                      "layer_errors": 0, "open_errors": 0, "released": 0,
                      "expect_errors": 0, "reattached": 0}
        self._no_expect = False
        from ._stats import KVBrokerConnectorStats

        self.kv_stats = KVBrokerConnectorStats()
        # this rank's bytes per vLLM block, all layers of each group
        self._group_bytes: list[int] = [0] * self.n_groups
        self._db_sample: tuple[float, int, int] | None = None

    # --- registration ---

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        names = list(kv_caches)
        if all(_LAYER_RE.search(n) for n in names):
            names.sort(key=lambda n: int(_LAYER_RE.search(n).group(1)))
        if not names:
            raise LayoutError("register_kv_caches: no KV cache tensors")
        if all(len(kv_caches[n].shape) == 4 for n in names):
            self._register_views(names, kv_caches)
        else:
            self._register_5d(names, kv_caches)
        self._map_groups(names)
        heads = {lay.kv_heads for lay in self.layouts}
        if len(heads) != 1:
            raise LayoutError("layers hold different numbers of KV heads "
                              "(%s): not supported" % sorted(heads))
        self.local_heads = heads.pop()
        self.hnd = any(lay.hnd for lay in self.layouts)
        # bytes a token takes in all layers (a block-row layout holds
        # `layers` of them per row), for the stats' bytes per transfer
        for g in range(self.n_groups):
            per_token = sum(lay.nbytes * lay.layers /
                            (lay.num_blocks * lay.block_size)
                            for gg, li in self._pairs if gg == g
                            for lay in (self.layouts[li],)
                            if lay.num_blocks and lay.block_size)
            self._group_bytes[g] = int(per_token * self.block_size)
        log.info("KVBrokerConnector: %s rank dp %d tp %d/%d: %d layers "
                 "registered as %d broker layers (%s, %d heads)",
                 "P" if self.producer else "D", self.dp_rank, self.tp_rank,
                 self.tp_size, len(self.layer_of), len(self.layouts),
                 self.layouts[0].name, self.local_heads)

    def _map_groups(self, names: list[str]) -> None:
        """Each broker layer's KV cache groups: the (group, layer) pairs a
        save queues, one op each."""
        if not self.groups:
            self._pairs = [(0, li) for li in range(len(self.layouts))]
            return
        missing = [n for n in names if n not in self.group_of]
        if missing:
            raise LayoutError(
                "layer %s is in no KV cache group of the kv_cache_config "
                "vLLM gave (%d groups)" % (missing[0], len(self.groups)))
        pairs = {(self.group_of[n], self.layer_of[n]) for n in names}
        if self.n_groups > 1 and self._row_layers:
            # a block row holds several layers' pages: one group's block
            # ids would move other groups' pages of the row
            li = min(self._row_layers)
            raise LayoutError(
                "block-major KV cache views (%s) with %d KV cache groups: "
                "not supported (set VLLM_KV_CACHE_LAYOUT=LBNHC)" %
                (self.layouts[li].form, self.n_groups))
        self._pairs = sorted(pairs, key=lambda p: (p[1], p[0]))

    def _add_layer(self, names: list[str], t: Any, ptr: int,
                   lay: LayerLayout) -> int:
        layer = len(self.layouts)
        region = self._region_of(names[0], t, ptr, lay.nbytes, layer)
        geom = self._kvb.KVGeometry(
            layout=lay.layout, num_blocks=lay.num_blocks,
            block_size=lay.block_size, num_heads=lay.num_heads,
            head_dim=lay.head_dim, elem_size=lay.elem_size)
        self.client.set_kv(region, layer, geom)
        self._geoms.append(geom)
        for n in names:
            self.layer_of[n] = layer
        self.layouts.append(lay)
        self.regions.append(region)
        return layer

    def _register_5d(self, names: list[str], kv_caches: dict) -> None:
        """vLLM <= 0.28: one tensor per layer, the backend's 5-D shape."""
        by_ptr: dict[int, int] = {}
        for name in names:
            t = kv_caches[name]
            ptr = int(t.data_ptr())
            if ptr in by_ptr:  # layers sharing one KV tensor
                self.layer_of[name] = by_ptr[ptr]
                continue
            lay = derive(t.shape, t.stride(), t.element_size(),
                         "layer %s" % name)
            by_ptr[ptr] = self._add_layer([name], t, ptr, lay)

    def _register_views(self, names: list[str], kv_caches: dict) -> None:
        """vLLM >= 0.29: per-layer [B, H, N, C] views over one buffer.
        Layer-major layouts (LBNHC, LBHNC: a layer's blocks are dense
        pages) give one broker layer per vLLM layer; block-major ones
        (BLNHC, BLHNC: each block row holds every layer's page) one broker
        layer for the whole row, queued in wait_for_save."""
        if self.block_size <= 0:
            raise LayoutError("cache_config.block_size is unknown: the "
                              "views' kernel blocks cannot be grouped")
        form = str(getattr(getattr(self.vllm_config, "cache_config", None),
                           "kv_cache_layout", "") or "")
        infos: list[tuple[str, Any, int, ViewInfo]] = []
        for name in names:
            t = kv_caches[name]
            infos.append((name, t, int(t.data_ptr()), derive_view(
                t.shape, t.stride(), t.element_size(), self.block_size,
                "layer %s" % name)))
        seen: dict[int, int] = {}
        i = 0
        while i < len(infos):
            name, t, ptr, v = infos[i]
            if ptr in seen:  # layers sharing one view
                self.layer_of[name] = seen[ptr]
                i += 1
                continue
            if v.block_stride == v.page or v.num_blocks == 1:
                seen[ptr] = self._add_layer(
                    [name], t, ptr, view_layout(v, 1, form))
                i += 1
                continue
            k = v.block_stride // v.page
            group = infos[i:i + k]
            if v.block_stride % v.page or v.ratio != 1 or len(group) != k or \
                    any(g[3] != v or g[2] != ptr + j * v.page
                        for j, g in enumerate(group)):
                raise LayoutError(
                    "layer %s: blocks %d bytes apart, pages of %d bytes: "
                    "not the block-major layout of %d consecutive layers "
                    "(set VLLM_KV_CACHE_LAYOUT=LBNHC)" %
                    (name, v.block_stride, v.page, k))
            layer = self._add_layer([g[0] for g in group], t, ptr,
                                    view_layout(v, k, form))
            self._row_layers.add(layer)
            for g in group:
                seen[g[2]] = layer
            i += k

    def _region_of(self, name: str, t: Any, ptr: int, size: int,
                   layer: int):
        if t.device.type == "cuda":
            self.cuda = True
            dev = t.device.index if t.device.index is not None else 0
            return self.client.register_gpu(ptr, size, dev, REGION_FLAGS,
                                            layer)
        if t.device.type != "cpu":
            raise LayoutError("layer %s: %s tensors are not supported" %
                              (name, t.device.type))
        try:
            region = self.client.region_for(ptr, size)
        except (ValueError, LookupError, OSError) as e:
            region, why = None, str(e)
        else:
            why = "no region holds it"
        if region is None:
            raise LayoutError(
                "layer %s: CPU tensor at %#x (%d bytes) is not memory the "
                "broker maps (%s): allocate it with kvbroker.Client.alloc() "
                "and wrap it with Region.as_torch(), or use CUDA tensors"
                % (name, ptr, size, why))
        if int(region.addr) != ptr or int(region.size) != size:
            # the layer is a part of a larger allocation (vLLM >= 0.29: one
            # buffer for every layer): a region over just its bytes
            region = self.client.alias(region, ptr - int(region.addr), size,
                                       REGION_FLAGS, layer)
        return region

    # --- heads on the other side (heterogeneous TP) ---

    def remote_heads(self, remote_tp: int) -> int:
        mc = getattr(self.vllm_config, "model_config", None)
        if getattr(mc, "use_mla", False) is True:
            # one latent per layer, the same on every rank: never split
            return self.local_heads
        total = self.cfg.total_num_kv_heads
        if not total:
            mc = getattr(self.vllm_config, "model_config", None)
            try:
                total = int(mc.get_total_num_kv_heads()) if mc else 0
            except (AttributeError, TypeError, ValueError):
                total = 0
        if not total:  # heads split evenly over our ranks (GQA)
            total = self.local_heads * self.tp_size
        return max(1, total // remote_tp)

    def _check(self, m: ReqMeta) -> str:
        """Why this transfer cannot be made, or ''."""
        rtp = m.remote_tp_size or self.tp_size
        rh = self.remote_heads(rtp)
        if rh == self.local_heads:
            return ""
        if self.hnd:
            return ("the KV cache is HND and the other side holds %d heads "
                    "per rank against our %d: the broker splits heads only "
                    "in NHD blocks" % (rh, self.local_heads))
        big, small = max(rtp, self.tp_size), min(rtp, self.tp_size)
        if big % small or rh * rtp != self.local_heads * self.tp_size:
            return ("TP %d against %d with %d heads per rank against our %d "
                    "is not a split the broker can make" %
                    (rtp, self.tp_size, rh, self.local_heads))
        return ""

    # --- opening ---

    def _new_xfer(self, m: ReqMeta, kind: str, lead: bool = True) -> Xfer:
        now = time.monotonic()
        x = Xfer(meta=m, kind=kind, tag=self._next_tag,
                 deadline=now + self.cfg.transfer_timeout_s, opened_at=now)
        self._next_tag += 1
        self._xfers[x.tag] = x
        if kind != RELEASE and lead:
            old = self._by_req.get(m.req_id)
            if old is not None and not old.done:
                for p in _parts(old):
                    self._end(p, -errno.ECANCELED,
                              "replaced by a new transfer")
            self._by_req[m.req_id] = x
        return x

    def _group_parts(self, x: Xfer) -> list[Xfer]:
        """Several KV cache groups: x (group 0) and a part per further
        group, each its own broker transfer with its group's blocks."""
        m = x.meta
        parts = [x]
        for g in range(1, self.n_groups):
            pm = replace(m, transfer_id=sub_transfer_id(m.transfer_id, g),
                         group=g, block_ids=list(m.group_block_ids[g])
                         if x.kind != RELEASE else [],
                         remote_block_ids=list(m.group_remote_block_ids[g])
                         if m.group_remote_block_ids and x.kind == LOAD
                         else [])
            parts.append(self._new_xfer(pm, x.kind, lead=False))
        if x.kind != RELEASE:
            for p in parts:
                p.parts = parts
        return parts

    def _open_all(self, todo: list[tuple[ReqMeta, str]]) -> list[Xfer]:
        """Open the step's transfers in one round trip; the ones that could
        not open are ended (reported like any failed transfer). A load
        refused here still releases P's blocks (a release-only open)."""
        xs, entries, live = [], [], []

        def add(m: ReqMeta, kind: str) -> None:
            x = self._new_xfer(m, kind)
            xs.append(x)
            if self.broker_gone:
                self._end(x, -errno.EPIPE, self.broker_gone)
                return
            why = "" if kind == RELEASE else (m.refused or self._check(m))
            if not why and kind != RELEASE:
                if self.n_groups > 1 and \
                        len(m.group_block_ids) != self.n_groups:
                    why = "%d KV cache groups' blocks for our %d" % (
                        len(m.group_block_ids), self.n_groups)
                elif not all(m.group_block_ids or [m.block_ids]):
                    why = "no blocks"
            if why:
                self._end(x, -errno.EINVAL, why)
                if kind == LOAD:
                    add(m, RELEASE)
                return
            if kind == LOAD and self.cfg.read and m.lease_until and \
                    time.time() > m.lease_until - LEASE_MARGIN_S:
                # P may have freed them: another request's KV by now
                self._end(x, -errno.ETIMEDOUT, "P's hold on its blocks "
                          "ended before the read could start")
                return
            for p in (self._group_parts(x) if self.n_groups > 1 else [x]):
                pm = p.meta
                e = {"transfer_id": pm.transfer_id, "host": pm.host,
                     "port": pm.port}
                if kind == RELEASE:
                    e["release_only"] = True
                else:
                    e["blocks"] = pm.block_ids
                if kind == SERVE or (kind == LOAD and self.cfg.read):
                    e["mode"] = "read"
                if kind == LOAD and self.cfg.read:
                    e["remote_blocks"] = pm.remote_block_ids
                if kind not in (SAVE, SERVE):
                    e["remote_dp_rank"] = pm.remote_dp_rank
                entries.append(e)
                live.append(p)

        for m, kind in todo:
            add(m, kind)
        xs = [p for x in xs for p in (x.parts or [x])] if \
            self.n_groups > 1 else xs
        max_n = getattr(self._kvb, "REMOTE_OPEN_BATCH_MAX", 1024)
        for i in range(0, len(entries), max_n):
            part, px = entries[i:i + max_n], live[i:i + max_n]
            try:
                t0 = time.perf_counter()
                res = self.client.open_remote_batch(part)
                self.kv_stats.record_post(time.perf_counter() - t0)
            except self._kvb.Error as e:
                if _errno(e) == errno.EPIPE:
                    self._broker_died(str(e))
                for x in px:
                    self.stats["open_errors"] += 1
                    self._end(x, -_errno(e), "open: %s" % e)
                continue
            seals = []
            for x, (st, h) in zip(px, res):
                if st == -errno.ESTALE and x.kind == SERVE:
                    # the id already ended here (a release for it came
                    # first): no read will be served, the blocks go
                    self._end(x, 0, "")
                    continue
                if st:
                    self.stats["open_errors"] += 1
                    self._end(x, int(st), "open: %s" % self._strerror(st))
                    continue
                x.handle = int(h)
                self.stats["opened"] += 1
                if x.kind == LOAD and self.cfg.read:
                    n = self._read_layers(x)
                    if n >= 0:
                        seals.append((x, n))
                elif x.kind == LOAD:
                    seals.append((x, self._write_dones(x.meta)))
                elif x.kind == SERVE:
                    self._clock(x, self.cfg.read_lease_s)
                    seals.append((x, 0))
                elif x.kind == RELEASE:
                    self.stats["released"] += 1
                    seals.append((x, 0))
            self._seal_all(seals)
        return xs

    def _clock(self, x: Xfer, seconds: float) -> None:
        """The broker's clocks of x (its deadline and stall timeout) and
        ours: `seconds` from now."""
        x.deadline = time.monotonic() + seconds
        ms = max(1, int(seconds * 1000))
        try:
            self.client.set_timeouts(x.handle, deadline_ms=ms, stall_ms=ms)
        except self._kvb.Error as e:
            if _errno(e) == errno.EPIPE:
                self._broker_died(str(e))
            elif _errno(e) != errno.ENOSYS:  # older library: its clocks
                self._end(x, -_errno(e), "timeouts: %s" % e)

    def _read_layers(self, x: Xfer) -> int:
        """D, READ mode: every layer of x read now (P's KV is complete),
        within P's hold on its blocks; returns the layers queued, or -1
        when x ended instead."""
        left = self.cfg.transfer_timeout_s
        if x.meta.lease_until:
            left = min(left, x.meta.lease_until - LEASE_MARGIN_S -
                       time.time())
        self._clock(x, max(0.001, left))
        n = 0
        for g, layer in self._pairs:
            if x.done:
                return -1
            if g != x.meta.group:
                continue
            try:
                if not self.client.submit_layer(x.handle, layer, x.tag,
                                                UNSIGNALED) and \
                        not self._submit_full(x, layer):
                    return -1
            except self._kvb.Error as e:
                self._op_failed(x, e, "layer %d" % layer)
                return -1
            n += 1
        return -1 if x.done else n

    def _seal_all(self, seals: list) -> None:
        """Seal (x, expected) pairs in one ring burst (one broker wake-up);
        what does not fit (ring full) or fails goes one by one, retried."""
        if not seals:
            return
        done = 0
        try:
            done = self.client.seal_many([x.handle for x, _ in seals],
                                         [n for _, n in seals],
                                         [x.tag for x, _ in seals])
        except self._kvb.Error as e:
            if _errno(e) == errno.EPIPE:
                self._broker_died(str(e))
                return
        for x, n in seals[done:]:
            if not x.done:
                self._control(x, "seal", self.client.seal, x.handle, n, x.tag)

    def _write_dones(self, m: ReqMeta) -> int:
        """D: write_done messages to wait for (several when P's ranks each
        write their share of our heads)."""
        ptp = m.remote_tp_size or self.tp_size
        if ptp > self.tp_size and self.remote_heads(ptp) != self.local_heads:
            return ptp // self.tp_size
        return 1

    # --- per step ---

    def bind(self, meta: Any) -> None:
        """P's step set-up, once per metadata object (vLLM binds before the
        forward in every version): the step's saves open, for the
        forward's layer hooks to feed; dropped requests' saves abort."""
        if meta is None or meta is self._bound:
            return
        self._check_socket()
        if self.broker_gone:  # the step's opens may go to a new broker
            self._reattach()
        self._bound = meta
        self._saves = []
        self._saves_g = {}
        self._saved_layers = set()
        self._step_layers = {}
        self._cuda_pending = []
        if not self.producer:
            return
        self._expect(getattr(meta, "expect", ()), False)
        self._expect(getattr(meta, "withdraw", ()), True)
        # READ mode: each save is a hold of the blocks D will read
        kind = SERVE if self.cfg.read else SAVE
        todo = [(m, kind) for m in getattr(meta, "reqs_to_save", ())]
        for m, _ in todo:
            self._declared.pop(m.transfer_id, None)
        if todo:
            for x in self._open_all(todo):
                if not x.done and x.kind == SAVE:
                    self._saves.append(x)
                    self._saves_g.setdefault(x.meta.group, []).append(x)
            for g, saves in self._saves_g.items():
                b = self._bursts.get(g)
                if b is None:
                    b = self._bursts[g] = _LayerBurst.make(self.client)
                if b is not None:
                    b.prepare(saves)
        for rid in getattr(meta, "reqs_to_abort", ()):  # after the opens
            self._abort_req(rid)
        if not todo:
            self._reap_cheap()

    def _expect(self, tids: Any, withdraw: bool) -> None:
        """P: tell the broker which transfer ids this worker will open (a
        D announcement of any other fails after the broker's
        --unknown-timeout), or no longer will (D fails at once)."""
        if not tids or self._no_expect:
            return
        self._note_declared(tids, withdraw)
        if self.broker_gone:  # declared to the next broker (_reattach)
            return
        try:
            st = self.client.expect(list(tids), withdraw=withdraw)
        except Exception as e:  # noqa: BLE001  (never into vLLM's step)
            if _errno(e) == errno.ENOSYS:
                self._no_expect = True
                log.warning("KVBrokerConnector: this libkvbroker cannot "
                            "declare transfer ids: D waits the broker's "
                            "--unopened-timeout for ids P never opens")
                return
            self.stats["expect_errors"] += len(tids)
            log.error("KVBrokerConnector: declaring %d transfer id(s) "
                      "failed: %s", len(tids), e)
            return
        bad = [(t, s) for t, s in zip(tids, st) if s and s != -errno.ESTALE]
        if bad:
            self.stats["expect_errors"] += len(bad)
            log.error("KVBrokerConnector: %d transfer id(s) not declared "
                      "(first: %r, %s): D waits the broker's "
                      "--unopened-timeout for them if P never opens them",
                      len(bad), bad[0][0], self._strerror(bad[0][1]))

    def start_loads(self, meta: Any) -> None:
        """D's step set-up, once per metadata object: the loads (and
        releases) open, dropped requests' loads abort. vLLM calls
        start_load_kv before the forward up to 0.28 and after it from 0.29
        (unless the step loads synchronously): loads need nothing from the
        forward, so they leave its critical path."""
        if meta is None or self.producer or meta is self._started:
            return
        self._started = meta
        todo = [(m, LOAD) for m in getattr(meta, "reqs_to_load", ())]
        todo += [(m, RELEASE) for m in getattr(meta, "reqs_to_release", ())]
        if todo:
            self._open_all(todo)
        for rid in getattr(meta, "reqs_to_abort", ()):  # after the opens
            self._abort_req(rid)
        if not todo:
            self._reap_cheap()

    def handle_preemptions(self, meta: Any) -> None:
        """P: a preempted request's blocks go back to vLLM's pool and may be
        written by the next forward, so a save still reading them is
        aborted, and waited for (PREEMPT_WAIT_S at most) before vLLM goes on:
        no byte of another request leaves in its name."""
        ids = getattr(meta, "preempted", None)
        if not ids:
            return
        waiting = []
        for rid in ids:
            x = self._by_req.get(rid)
            if x is None or x.kind not in (SAVE, SERVE) or \
                    all(p.done for p in _parts(x)):
                continue
            self._abort_req(rid)
            waiting.extend(_parts(x))
        end = time.monotonic() + PREEMPT_WAIT_S
        while any(not x.done for x in waiting) and time.monotonic() < end:
            self._reap(wait_ms=5)
        for x in waiting:
            if not x.done:
                log.warning("KVBrokerConnector: request %s preempted: its "
                            "save did not end in %.0f s", x.meta.req_id,
                            PREEMPT_WAIT_S)

    def _abort_req(self, rid: str) -> None:
        """The scheduler dropped the request. Its transfer is aborted; the
        request is reported when the transfer ended (the broker completes
        an abort only once no byte of it can land any more)."""
        x = self._by_req.get(rid)
        if x is None or all(p.done or p.aborted for p in _parts(x)):
            return
        self.stats["aborted"] += 1
        for p in _parts(x):
            if p.aborted:
                continue
            p.aborted = True
            if not p.done:
                self._control(p, "abort", self.client.abort, p.handle, p.tag)

    def save_kv_layer(self, layer_name: str, kv_layer: Any) -> None:
        if not self._saves:
            return
        layer = self.layer_of.get(layer_name)
        if layer is None or layer in self._row_layers:
            return
        key = (self.group_of.get(layer_name, 0), layer)
        if key in self._saved_layers:
            return
        self._saved_layers.add(key)
        if self.cuda:  # the layer's kernels may still run: later
            self._cuda_layer(key)
            return
        self._submit(*key)

    def _submit(self, group: int, layer: int) -> None:
        """One layer op per live transfer (part) of the step moving that
        KV cache group. Every transfer that is not ended afterwards has had
        each of its group's layers of the step queued (one that cannot take
        one is ended), so each seals with its group's _step_layers."""
        saves = self._saves_g.get(group)
        if not saves:
            return
        self._step_layers[group] = self._step_layers.get(group, 0) + 1
        burst = self._bursts.get(group)
        start = burst.submit(saves, layer, self._kvb.Error) if burst else 0
        submit = self.client.submit_layer
        for x in saves[start:]:
            if x.done:
                continue
            try:
                if not submit(x.handle, layer, x.tag, UNSIGNALED):
                    self._submit_full(x, layer)
            except self._kvb.Error as e:
                self._op_failed(x, e, "layer %d" % layer)

    def _submit_full(self, x: Xfer, layer: int) -> bool:
        """The ring was full: reap and retry until the transfer's deadline.
        True when the layer op went in."""
        while time.monotonic() < x.deadline:
            self._reap()
            if self.broker_gone or x.done:
                return False
            time.sleep(0.0001)
            if self.client.submit_layer(x.handle, layer, x.tag, UNSIGNALED):
                return True
        self._end(x, -errno.ETIMEDOUT, "layer %d: ring full" % layer)
        return False

    def _control(self, x: Xfer, what: str, fn, *args) -> bool:
        """seal / abort, retried while the ring is full (until the deadline,
        then ended here). False when x ended instead."""
        while True:
            try:
                fn(*args)
                return True
            except self._kvb.Error as e:
                if _errno(e) != errno.EAGAIN or time.monotonic() > x.deadline:
                    self._op_failed(x, e, what)
                    return False
            self._reap()
            if x.done:
                return False
            time.sleep(0.0001)

    def _op_failed(self, x: Xfer, e: BaseException, what: str) -> None:
        if _errno(e) == errno.EPIPE:
            self._broker_died(str(e))
        else:
            self._end(x, -_errno(e), "%s: %s" % (what, e))

    def _cuda_layer(self, key: tuple[int, int]) -> None:
        import torch

        ev = torch.cuda.Event()
        ev.record()
        self._cuda_pending.append((key, ev))
        while self._cuda_pending and self._cuda_pending[0][1].query():
            self._submit(*self._cuda_pending.pop(0)[0])

    def wait_for_save(self) -> None:
        """Once per step (empty steps too from vLLM 0.30): a no-op without
        saves. Otherwise the layers no hook queued (a full CUDA graph skips
        the hooks; block-major views are queued here) go now, the forward
        being over, then every save of the step is sealed."""
        if not self._saves:
            return
        if self._cuda_pending or (self.cuda and
                                  len(self._saved_layers) < len(self._pairs)):
            import torch

            for key, ev in self._cuda_pending:
                ev.synchronize()
                self._submit(*key)
            self._cuda_pending = []
            torch.cuda.current_stream().synchronize()
        for key in self._pairs:
            if key not in self._saved_layers:
                self._saved_layers.add(key)
                self._submit(*key)
        self._seal_all([(x, self._step_layers.get(x.meta.group, 0))
                        for x in self._saves if not x.done])
        self._saves = []
        self._saves_g = {}
        self._step_layers = {}

    # --- completions ---

    def _reap_cheap(self) -> None:
        if self._xfers:
            self._reap()

    def _reap(self, wait_ms: int = 0) -> None:
        if self.broker_gone:
            return
        while True:
            try:
                if wait_ms:
                    comps = self.client.wait(256, timeout_ms=wait_ms)
                    wait_ms = 0
                else:
                    comps = self.client.poll(256)
                now = time.monotonic()
                if not comps and self._xfers and \
                        now - self._probed > LIVENESS_S:
                    # poll() notices a dead broker only after 256 empty
                    # calls (steps, here); a wait that sleeps looks at
                    # the socket: at most 1 ms, every LIVENESS_S
                    self._probed = now
                    comps = self.client.wait(256, timeout_ms=1)
            except self._kvb.Error as e:
                self._broker_died(str(e))
                return
            for c in comps:
                self._completion(c)
            if len(comps) < 256:
                break
        now = time.monotonic()
        for x in list(self._xfers.values()):
            if x.done or now < x.deadline:
                continue
            if not x.abort_sent:
                x.abort_sent = now
                log.warning("KVBrokerConnector: request %s: no end after "
                            "%.1f s: aborting", x.meta.req_id,
                            self.cfg.transfer_timeout_s)
                try:
                    self.client.abort(x.handle, x.tag)
                except self._kvb.Error:
                    pass  # ended here after the grace period
            elif now > x.abort_sent + ABORT_GRACE_S:
                self._end(x, -errno.ETIMEDOUT, "no end from the broker")

    def _completion(self, c: Any) -> None:
        kind = int(c.kind)
        if kind == KIND_SHUTDOWN:
            self._broker_died("the broker is shutting down")
            return
        x = self._xfers.get(int(c.tag))
        if x is None:
            return
        if kind == KIND_DESC:
            if c.status:
                self.stats["layer_errors"] += 1
                x.why.append("layer op: %s" % self._strerror(c.status))
            return
        if kind == KIND_TRANSFER and not x.done:
            self._end(x, int(c.status), "")

    def _strerror(self, status: int) -> str:
        return self._kvb.strerror(status)

    def _broker_died(self, why: str) -> None:
        if not self.broker_gone:
            self.broker_gone = why or "broker gone"
            self._gone_at = time.monotonic()
            self._next_try = 0.0
            self._reattach_warned = False
            log.error("KVBrokerConnector: %s rank dp %d tp %d: the broker "
                      "is gone (%s): transfers fail until one answers at "
                      "%s; will attach again", "P" if self.producer else
                      "D", self.dp_rank, self.tp_rank, self.broker_gone,
                      self.client.socket)
        for x in list(self._xfers.values()):
            if not x.done:
                self._end(x, -errno.EPIPE, self.broker_gone)

    def _end_part(self, x: Xfer, status: int, why: str):
        """One part of a request's transfer (several KV cache groups)
        ended: the first to fail aborts the others (the request reports
        once none of its bytes can land any more). Returns (lead, status,
        why) once every part ended, else None."""
        if status and why:
            x.why.append("group %d: %s" % (x.meta.group, why))
        if status and not x.aborted and not x.sib_abort:
            for p in x.parts:
                if not p.done and not p.aborted and not p.sib_abort:
                    p.sib_abort = True
                    self._control(p, "abort", self.client.abort, p.handle,
                                  p.tag)
        if any(not p.done for p in x.parts):
            return None
        lead = x.parts[0]
        failed = [p for p in x.parts if p.status]
        first = ([p for p in failed if not p.sib_abort] or failed or [lead])
        lead.why = [w for p in x.parts for w in p.why]
        return lead, first[0].status, ""

    def _end(self, x: Xfer, status: int, why: str) -> None:
        if x.done:
            return
        x.done, x.status = True, status
        self._xfers.pop(x.tag, None)
        if x.kind == RELEASE:
            return  # P frees its blocks; vLLM waits for nothing here
        if x.parts:
            ended = self._end_part(x, status, why)
            if ended is None:
                return
            x, status, why = ended
        rid = x.meta.req_id
        if self._by_req.get(rid) is x:
            del self._by_req[rid]
        if status == 0:
            self.stats["ok"] += 1
            n = nbytes = 0
            for p in _parts(x):
                k = len(p.meta.block_ids)
                n += k
                nbytes += k * self._group_bytes[p.meta.group]
            self.kv_stats.record_transfer(time.monotonic() - x.opened_at,
                                          nbytes, n)
        elif x.aborted:
            self.kv_stats.record_aborted()
        else:
            self.kv_stats.record_failed(status)
        if status:
            self.stats["failed"] += 1
            if why:
                x.why.append(why)
            lvl = logging.INFO if x.aborted else logging.WARNING
            log.log(lvl, "KVBrokerConnector: request %s (transfer %s) %s: "
                    "%s%s", rid, x.meta.transfer_id, x.kind,
                    self._strerror(status),
                    (" (" + "; ".join(x.why[:3]) + ")") if x.why else "")
        if x.kind in (SAVE, SERVE):
            self._send_done.add(rid)  # P: its blocks may be freed
            return
        self._recv_done.add(rid)  # D: reported once, failed or not
        if status and not x.aborted:
            self._recv_failed.add(rid)
            if self.n_groups == 1:  # vLLM takes block ids of one group only
                self._load_errors.update(x.meta.block_ids)

    def results(self, finished_req_ids: Any) -> tuple[set, set, set]:
        """(finished_sending, finished_recving, failed_recving), each id
        once. P: a save is reported once it ended and vLLM finished its
        request (finished_req_ids of this or an earlier step). D: a load
        once it ended, done or failed (failed ones in both sets)."""
        if self.broker_gone:
            self._reattach()
        self._reap_cheap()
        for rid in finished_req_ids or ():  # only ours: the set stays small
            x = self._by_req.get(rid)
            if (x is not None and x.kind in (SAVE, SERVE)) or \
                    rid in self._send_done:
                self._finished_seen.add(rid)
        sending = self._send_done & self._finished_seen
        self._send_done -= sending
        self._finished_seen -= sending
        recving, self._recv_done = self._recv_done, set()
        failed, self._recv_failed = self._recv_failed, set()
        return sending, recving, failed

    def connector_stats_object(self) -> Any:
        """vLLM's get_kv_connector_stats: what this worker's transfers did
        since the last call (None when nothing), with the broker's
        descriptors per doorbell sampled every DOORBELL_SAMPLE_S at most."""
        now = time.monotonic()
        if not self.broker_gone and (
                self._db_sample is None or
                now - self._db_sample[0] >= DOORBELL_SAMPLE_S):
            try:
                st = self.client.stats()
                wrs, dbs = int(st.get("wrs", 0)), int(st.get("doorbells", 0))
            except Exception:  # noqa: BLE001  (stats never fail a step)
                wrs = dbs = -1
            if wrs >= 0:
                if self._db_sample is not None and \
                        dbs > self._db_sample[2]:
                    self.kv_stats.record_descs_per_doorbell(
                        (wrs - self._db_sample[1]) /
                        (dbs - self._db_sample[2]))
                self._db_sample = (now, wrs, dbs)
        if self.kv_stats.is_empty():
            return None
        return self.kv_stats.clone_and_reset()

    def get_block_ids_with_load_errors(self) -> set[int]:
        errs, self._load_errors = self._load_errors, set()
        return errs

    def live(self) -> int:
        return sum(1 for x in self._xfers.values() if not x.done)

    def shutdown(self) -> None:
        self._close_memfds()
        try:
            self.client.close()
        except Exception as e:  # noqa: BLE001 - shutting down anyway
            log.warning("KVBrokerConnector: closing the client: %s", e)

    # --- attaching again after the broker went away ---

    def _note_declared(self, tids: Any, withdraw: bool) -> None:
        """P: the ids declared and not yet opened (nor withdrawn), for a
        new broker to hear them again."""
        now = time.monotonic()
        for t in tids:
            if withdraw:
                self._declared.pop(t, None)
            else:
                self._declared[t] = now
        if len(self._declared) > 4096:  # the broker forgot the old ones
            for t, at in list(self._declared.items()):
                if now - at > EXPECT_KEEP_S:
                    del self._declared[t]

    @staticmethod
    def _socket_id(path: str) -> Any:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_ctime_ns)

    def _check_socket(self) -> None:
        """A step's start, every LIVENESS_S at most: another socket file
        at the broker's path is a new broker (ours went away; a broker
        never takes the path of a live one), noticed before the step's
        opens even when no transfer would have told."""
        now = time.monotonic()
        if self.broker_gone or self._sock_id is None or \
                now - self._sock_checked < LIVENESS_S:
            return
        self._sock_checked = now
        cur = self._socket_id(self.client.socket)
        if cur is not None and cur != self._sock_id:
            self._broker_died("a new broker listens at %s" %
                              self.client.socket)

    def _reattach(self) -> None:
        """The broker is gone: from a step hook. The gone client is closed
        (its context freed; the KV caches' memfds kept), then, every
        REATTACH_S at most, a new one attaches at the same socket with the
        same role and ranks. No broker there fails at once (ENOENT,
        ECONNREFUSED); one that answers gets the same memory registered
        again (host memory as its memfds, GPU memory by pointer), every
        layer's geometry declared again, and the ids P declared and did not
        open yet. Transfers then open on it again."""
        if not self._geoms:
            return
        now = time.monotonic()
        if not self.client.closed:
            if not self._no_reattach:
                self._keep_memfds()
            try:
                self.client.close()
            except Exception as e:  # noqa: BLE001  (it is gone)
                log.debug("KVBrokerConnector: closing the gone client: %s",
                          e)
        if self._no_reattach or now < self._next_try:
            return
        self._next_try = now + REATTACH_S
        old = self.client
        try:
            client = self._kvb.Client(
                socket=old.socket, role=old.role, dp_rank=old.dp_rank,
                tp_rank=old.tp_rank, tp_size=old.tp_size,
                timeout_ms=self.cfg.timeout_ms)
        except Exception as e:  # noqa: BLE001  (no broker yet: quiet)
            if _errno(e) not in (errno.ENOENT, errno.ECONNREFUSED,
                                 errno.ETIMEDOUT, errno.EPIPE,
                                 errno.ECONNRESET, errno.EAGAIN):
                self._reattach_failed("attach: %s" % e)
            return
        try:
            regions = self._register_again(client)
        except Exception as e:  # noqa: BLE001  (never into vLLM's step)
            client.close()
            self._reattach_failed("registering the KV caches: %s" % e)
            return
        self.client, self.regions = client, regions
        self._sock_id = self._socket_id(client.socket)
        self._burst = _LayerBurst.make(client) if self.producer else None
        self._close_memfds()
        self._db_sample = None
        self._probed = 0.0
        gone, self.broker_gone = self.broker_gone, ""
        self.stats["reattached"] += 1
        log.warning("KVBrokerConnector: %s rank dp %d tp %d: attached "
                    "again after %.2f s (the broker was gone: %s); %d "
                    "layers registered", "P" if self.producer else "D",
                    self.dp_rank, self.tp_rank,
                    time.monotonic() - self._gone_at, gone,
                    len(self.regions))
        if self._declared:
            now = time.monotonic()
            ids = [t for t, at in self._declared.items()
                   if now - at <= EXPECT_KEEP_S]
            self._declared.clear()
            self._expect(ids, False)

    def _keep_memfds(self) -> None:
        """Own descriptors of the host KV cache regions' memfds, taken
        before the gone client closes them. No more tries when a region
        has none."""
        fds: dict[int, int] = {}
        try:
            for r in self.regions:
                base = r.parent if r.parent is not None else r
                if not base.gpu and id(base) not in fds:
                    fds[id(base)] = os.dup(base.fileno())
        except (ValueError, OSError) as e:
            for fd in fds.values():
                os.close(fd)
            self._no_reattach = str(e)
            log.error("KVBrokerConnector: cannot attach again: the KV "
                      "cache memory cannot be registered again (%s): every "
                      "later transfer of this worker fails", e)
            return
        self._memfds = fds

    def _close_memfds(self) -> None:
        fds, self._memfds = self._memfds, {}
        for fd in fds.values():
            os.close(fd)

    def _register_again(self, client: Any) -> list[Any]:
        """The gone client's layer regions on `client`, as
        register_kv_caches made them: the same memory, flags and keys, the
        same layer geometries."""
        bases: dict[int, Any] = {}
        out = []
        for layer, (r, geom) in enumerate(zip(self.regions, self._geoms)):
            if r.gpu:
                nr = client.register_gpu(r.addr, r.size, r.device, r.flags,
                                         r.key)
            else:
                base = r.parent if r.parent is not None else r
                nb = bases.get(id(base))
                if nb is None:
                    nb = client.register_fd(
                        self._memfds[id(base)], base.size, base.fd_offset,
                        base.flags, base.key, map=False)
                    bases[id(base)] = nb
                nr = nb if r.parent is None else client.alias(
                    nb, r.parent_offset, r.size, r.flags, r.key)
            client.set_kv(nr, layer, geom)
            out.append(nr)
        return out

    def _reattach_failed(self, why: str) -> None:
        if not self._reattach_warned:
            self._reattach_warned = True
            log.warning("KVBrokerConnector: attaching again failed (%s): "
                        "trying again every %.2f s", why, REATTACH_S)
        else:
            log.debug("KVBrokerConnector: attaching again failed: %s", why)
