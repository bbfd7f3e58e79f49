# SPDX-License-Identifier: MIT
"""Worker side of KVBrokerConnector: one broker client per TP rank.

register_kv_caches declares each layer's tensor to the broker (its memory and
its geometry); start_load_kv opens the step's transfers (P: to be written, D:
to be announced and waited for); save_kv_layer queues one layer op per
request; wait_for_save seals; get_finished reaps completions. The broker
moves the bytes: nothing is copied in Python.

Every transfer ends: the broker fails it within its timeouts; should the
broker itself go away, every live transfer ends here at once; and a
transfer that has heard nothing by ``transfer_timeout_s`` is aborted, and
ended here 5 s after that whatever the broker says.
"""

from __future__ import annotations

import errno
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ._compat import parallel_ranks
from ._layout import LayerLayout, LayoutError, derive
from ._params import Config, ReqMeta

log = logging.getLogger("kvbroker.vllm")

KIND_DESC, KIND_TRANSFER, KIND_SHUTDOWN = 1, 2, 3
UNSIGNALED = 0x1  # KVB_DESC_UNSIGNALED
REGION_FLAGS = 0x3  # KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ
ABORT_GRACE_S = 5.0
PEER_RETRY_S = 10.0
LIVENESS_S = 0.25
_LAYER_RE = re.compile(r"(?:^|\.)layers?\.(\d+)(?:\.|$)")


@dataclass(eq=False)
class Xfer:
    """One request's transfer on this worker."""
    meta: ReqMeta
    load: bool  # D: this worker receives
    tag: int
    handle: int = 0
    deadline: float = 0.0
    aborted: bool = False  # the scheduler asked (request aborted)
    abort_sent: float = 0.0  # when we aborted it (deadline passed)
    done: bool = False
    status: int = 0
    why: list = field(default_factory=list)


class LayerSaveError(RuntimeError):
    pass


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
    def __init__(self, vllm_config: Any, cfg: Config, producer: bool):
        import kvbroker

        self._kvb = kvbroker
        self.cfg = cfg
        self.producer = producer
        self.dp_rank, self.tp_rank, self.tp_size = parallel_ranks(vllm_config)
        self.vllm_config = vllm_config
        self.client = kvbroker.Client(
            socket=cfg.broker_socket, role="P" if producer else "D",
            dp_rank=self.dp_rank, tp_rank=self.tp_rank, tp_size=self.tp_size,
            timeout_ms=cfg.timeout_ms)
        self.layer_of: dict[str, int] = {}
        self.layouts: list[LayerLayout] = []
        self.regions: list[Any] = []
        self.local_heads = 0
        self.hnd = False
        self.cuda = False
        self._peers: dict[tuple[str, int], int] = {}
        self._peer_failed: dict[tuple[str, int], tuple] = {}
        self._xfers: dict[int, Xfer] = {}  # tag -> live or unreported
        self._by_req: dict[str, Xfer] = {}
        self._next_tag = 1
        self._saves: list[Xfer] = []  # P: this step's
        self._step_layers = 0  # layers queued for each of them
        self._burst = _LayerBurst.make(self.client) if producer else None
        self._saved_layers: set[int] = set()
        self._cuda_pending: list[tuple[int, Any]] = []
        self._send_done: set[str] = set()
        self._recv_done: set[str] = set()
        self._finished_seen: set[str] = set()
        self._load_errors: set[int] = set()
        self.broker_gone = ""
        self._probed = 0.0
        self.stats = {"opened": 0, "ok": 0, "failed": 0, "aborted": 0,
                      "layer_errors": 0, "open_errors": 0}

    # --- registration ---

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        names = list(kv_caches)
        nums = [_LAYER_RE.search(n) for n in names]
        if all(nums):
            names.sort(key=lambda n: int(_LAYER_RE.search(n).group(1)))
        by_ptr: dict[int, int] = {}
        for name in names:
            t = kv_caches[name]
            ptr = int(t.data_ptr())
            if ptr in by_ptr:  # layers sharing one KV tensor
                self.layer_of[name] = by_ptr[ptr]
                continue
            layer = len(self.layouts)
            lay = derive(t.shape, t.stride(), t.element_size(),
                         "layer %s" % name)
            region = self._region_of(name, t, lay, layer)
            geom = self._kvb.KVGeometry(
                layout=lay.layout, num_blocks=lay.num_blocks,
                block_size=lay.block_size, num_heads=lay.num_heads,
                head_dim=lay.head_dim, elem_size=lay.elem_size)
            self.client.set_kv(region, layer, geom)
            by_ptr[ptr] = layer
            self.layer_of[name] = layer
            self.layouts.append(lay)
            self.regions.append(region)
        if not self.layouts:
            raise LayoutError("register_kv_caches: no KV cache tensors")
        heads = {lay.num_heads for lay in self.layouts}
        if len(heads) != 1:
            raise LayoutError("layers hold different numbers of KV heads "
                              "(%s): not supported" % sorted(heads))
        self.local_heads = heads.pop()
        self.hnd = any(lay.hnd for lay in self.layouts)
        log.info("KVBrokerConnector: %s rank dp %d tp %d/%d: %d layers "
                 "registered (%s, %d heads)", "P" if self.producer else "D",
                 self.dp_rank, self.tp_rank, self.tp_size, len(self.layouts),
                 self.layouts[0].name, self.local_heads)

    def _region_of(self, name: str, t: Any, lay: LayerLayout, layer: int):
        ptr, size = int(t.data_ptr()), lay.nbytes
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
        if int(region.addr) != ptr:
            raise LayoutError(
                "layer %s: the tensor starts %d bytes into its broker region;"
                " the broker's geometry starts at the region's first byte"
                % (name, ptr - int(region.addr)))
        return region

    # --- heads on the other side (heterogeneous TP) ---

    def remote_heads(self, remote_tp: int) -> int:
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

    def _check_heads(self, m: ReqMeta) -> str:
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

    # --- peers and opening ---

    def _peer(self, host: str, port: int, refresh: bool = False) -> int:
        """The broker's peer number for host:port. A handshake blocks (up
        to 3 s when nobody answers), so one that failed is not tried again
        for PEER_RETRY_S: the requests naming that peer fail at once."""
        key = (host, port)
        if not refresh and key in self._peers:
            return self._peers[key]
        failed = self._peer_failed.get(key)
        if failed and time.monotonic() < failed[0]:
            raise self._kvb.Error(failed[1], "%s (%.1f s ago; not retried "
                                  "yet)" % (failed[2], time.monotonic() -
                                            failed[0] + PEER_RETRY_S),
                                  "kvb_peer_connect")
        try:
            self._peers[key] = self.client.peer_connect(host, port)
        except self._kvb.Error as e:
            self._peer_failed[key] = (time.monotonic() + PEER_RETRY_S,
                                      _errno(e), e.strerror)
            raise
        self._peer_failed.pop(key, None)
        return self._peers[key]

    def _new_xfer(self, m: ReqMeta, load: bool) -> Xfer:
        x = Xfer(meta=m, load=load, tag=self._next_tag,
                 deadline=time.monotonic() + self.cfg.transfer_timeout_s)
        self._next_tag += 1
        old = self._by_req.get(m.req_id)
        if old is not None and not old.done:
            self._end(old, -errno.ECANCELED, "replaced by a new transfer")
        self._xfers[x.tag] = x
        self._by_req[m.req_id] = x
        return x

    def _open(self, m: ReqMeta, load: bool) -> Xfer:
        x = self._new_xfer(m, load)
        why = self._check_heads(m)
        if why:
            self._end(x, -errno.EINVAL, why)
            return x
        if not m.block_ids:
            self._end(x, -errno.EINVAL, "no blocks")
            return x
        kw = dict(mode="write", blocks=m.block_ids)
        if load:
            kw["remote_dp_rank"] = m.remote_dp_rank
        for attempt in (0, 1):
            try:
                peer = self._peer(m.host, m.port, refresh=attempt > 0)
            except self._kvb.Error as e:
                self._fail_open(x, e, "handshake with %s:%d" % (m.host,
                                                              m.port))
                return x
            try:
                x.handle = self.client.open_remote(m.transfer_id, peer, **kw)
                break
            except self._kvb.Error as e:
                if attempt == 0 and _errno(e) in (errno.EHOSTUNREACH,
                                                  errno.ENOENT):
                    continue  # peer unknown or restarted: handshake again
                self._fail_open(x, e, "open")
                return x
        self.stats["opened"] += 1
        if load:
            self._control(x, "seal", self.client.seal, x.handle,
                          self._write_dones(m), x.tag)
        return x

    def _fail_open(self, x: Xfer, e: BaseException, what: str) -> None:
        self.stats["open_errors"] += 1
        if _errno(e) == errno.EPIPE:
            self._broker_died(str(e))
        self._end(x, -_errno(e), "%s: %s" % (what, e))

    def _write_dones(self, m: ReqMeta) -> int:
        """D: write_done messages to wait for (several when P's ranks each
        write their share of our heads)."""
        ptp = m.remote_tp_size or self.tp_size
        if ptp > self.tp_size and self.remote_heads(ptp) != self.local_heads:
            return ptp // self.tp_size
        return 1

    # --- per step ---

    def start_load_kv(self, meta: Any) -> None:
        if meta is None:
            return
        self._saves = []
        self._saved_layers = set()
        self._step_layers = 0
        if self.broker_gone:
            for m in meta.reqs_to_save + meta.reqs_to_load:
                self._end(self._new_xfer(m, not self.producer), -errno.EPIPE,
                          self.broker_gone)
        else:
            for m in meta.reqs_to_load:
                self._open(m, load=True)
            for m in meta.reqs_to_save:
                x = self._open(m, load=False)
                if not x.done:
                    self._saves.append(x)
            if self._burst is not None:
                self._burst.prepare(self._saves)
        for rid in meta.reqs_to_abort:  # after the opens of the same step
            self._abort_req(rid)

    def _abort_req(self, rid: str) -> None:
        """The scheduler dropped the request and waits for it in
        finished_sending. P: abort the transfer. D: P may be writing into
        its blocks, so they are given back only when the transfer ends
        (write_done, a failure or the deadline), not at once."""
        x = self._by_req.get(rid)
        if x is None or x.done:  # already ended (or never opened)
            self._send_done.add(rid)
            return
        x.aborted = True
        self.stats["aborted"] += 1
        if not x.load:
            self._control(x, "abort", self.client.abort, x.handle, x.tag)

    def save_kv_layer(self, layer_name: str, kv_layer: Any) -> None:
        saves = self._saves
        if not saves:
            return
        layer = self.layer_of.get(layer_name)
        if layer is None or layer in self._saved_layers:
            return
        self._saved_layers.add(layer)
        if self.cuda:  # the layer's kernels may still run: later
            self._cuda_layer(layer)
            return
        self._submit(saves, layer)

    def _submit(self, saves: list, layer: int) -> None:
        """One layer op per live transfer of the step. Every transfer that
        is not ended afterwards has had each of the step's layers queued
        (one that cannot take one is ended), so all seal with
        _step_layers."""
        self._step_layers += 1
        start = self._burst.submit(saves, layer, self._kvb.Error) \
            if self._burst else 0
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

    def _cuda_layer(self, layer: int) -> None:
        import torch

        ev = torch.cuda.Event()
        ev.record()
        self._cuda_pending.append((layer, ev))
        while self._cuda_pending and self._cuda_pending[0][1].query():
            self._submit(self._saves, self._cuda_pending.pop(0)[0])

    def wait_for_save(self) -> None:
        for layer, ev in self._cuda_pending:
            ev.synchronize()
            self._submit(self._saves, layer)
        self._cuda_pending = []
        for x in self._saves:
            if x.done:
                continue
            if self._step_layers == 0:
                self._abort_req(x.meta.req_id)
                continue
            self._control(x, "seal", self.client.seal, x.handle,
                          self._step_layers, x.tag)
        self._saves = []
        self._step_layers = 0

    # --- completions ---

    def _reap(self) -> None:
        if self.broker_gone:
            return
        while True:
            try:
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
            log.error("KVBrokerConnector: the broker is gone (%s): every "
                      "transfer of this worker fails", self.broker_gone)
        for x in list(self._xfers.values()):
            if not x.done:
                self._end(x, -errno.EPIPE, self.broker_gone)

    def _end(self, x: Xfer, status: int, why: str) -> None:
        if x.done:
            return
        x.done, x.status = True, status
        self._xfers.pop(x.tag, None)
        if self._by_req.get(x.meta.req_id) is x:
            del self._by_req[x.meta.req_id]
        rid = x.meta.req_id
        if status == 0:
            self.stats["ok"] += 1
        else:
            self.stats["failed"] += 1
            if why:
                x.why.append(why)
            lvl = logging.INFO if x.aborted else logging.WARNING
            log.log(lvl, "KVBrokerConnector: request %s (transfer %s) %s: "
                    "%s%s", rid, x.meta.transfer_id,
                    "load" if x.load else "save", self._strerror(status),
                    (" (" + "; ".join(x.why[:3]) + ")") if x.why else "")
        if not x.load or x.aborted:
            self._send_done.add(rid)  # P: blocks free; D: aborted
            return
        self._recv_done.add(rid)
        if status:
            self._load_errors.update(x.meta.block_ids)

    def get_finished(self, finished_req_ids: set[str]):
        self._reap()
        for rid in finished_req_ids or ():  # only ours: the set stays small
            if rid in self._by_req or rid in self._send_done:
                self._finished_seen.add(rid)
        sending = self._send_done & self._finished_seen
        self._send_done -= sending
        self._finished_seen -= sending
        recving, self._recv_done = self._recv_done, set()
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errs, self._load_errors = self._load_errors, set()
        return errs

    def live(self) -> int:
        return sum(1 for x in self._xfers.values() if not x.done)

    def shutdown(self) -> None:
        try:
            self.client.close()
        except Exception as e:  # noqa: BLE001 - shutting down anyway
            log.warning("KVBrokerConnector: closing the client: %s", e)
