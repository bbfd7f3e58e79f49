# SPDX-License-Identifier: MIT
"""Scheduler side of KVBrokerConnector (WRITE mode).

P (kv_producer): a request with ``do_remote_decode`` is saved during its
last prefill chunk, from the blocks it holds *then*: the list follows every
SchedulerOutput (new requests, later chunks' new blocks, a resumed
request's list replacing the old one after a preemption). Its blocks stay
allocated until the workers report the save ended (request_finished returns
True), and request_finished returns the kv_transfer_params a proxy gives D.

D (kv_consumer): a request with ``do_remote_prefill`` loads what its own
prefix cache does not hold, asynchronously: the workers announce D's
unhashed blocks (the broker sends ``remote_blocks`` to P, and P writes its
last blocks into them) and report the load once it ended. A request that
loads nothing (a full local hit, or dropped before it was scheduled) still
releases P's blocks (a release-only open).

Each request is reported once, only while vLLM holds it: the scheduler's
asserts (``_update_from_kv_xfer_finished``) forbid anything else.
"""

from __future__ import annotations

import logging
from typing import Any

from ._compat import KVConnectorMetadata, request_aborted
from ._params import Config, ParamsError, ReqMeta, parse_request

log = logging.getLogger("kvbroker.vllm")


class KVBrokerMetadata(KVConnectorMetadata):
    """One step's instructions from the scheduler to every worker."""

    def __init__(self):
        self.reqs_to_save: list[ReqMeta] = []  # P: open, save, seal
        self.reqs_to_load: list[ReqMeta] = []  # D: open (announce), seal
        self.reqs_to_release: list[ReqMeta] = []  # D: P frees, no load
        self.reqs_to_abort: list[str] = []  # abort; reported when ended
        self.preempted: list[str] = []  # P: saves reading freed blocks
        # P: transfer ids of new requests (the broker holds D's
        # announcements of these; others fail D soon), and of requests
        # that went away before their save opened (D fails at once)
        self.expect: list[str] = []
        self.withdraw: list[str] = []

    def __repr__(self):
        return "KVBrokerMetadata(save=%d, load=%d, release=%d, abort=%d)" % (
            len(self.reqs_to_save), len(self.reqs_to_load),
            len(self.reqs_to_release), len(self.reqs_to_abort))


def _n_blocks(tokens: int, block_size: int) -> int:
    return (tokens + block_size - 1) // block_size


def _first_group(block_ids: Any) -> list[int]:
    """Block ids of the first KV cache group: vLLM gives a tuple of lists
    (one per group), or already a list."""
    if block_ids and isinstance(block_ids[0], (list, tuple)):
        return list(block_ids[0])
    return list(block_ids or [])


class _Save:
    """P: a request to be saved, and the blocks it holds now."""

    def __init__(self, request: Any, meta: ReqMeta, blocks: list[int]):
        self.request = request
        self.meta = meta
        self.blocks = blocks


class BrokerScheduler:
    def __init__(self, vllm_config: Any, cfg: Config, producer: bool,
                 dp_size: int, dp_rank: int, tp_size: int):
        self.cfg = cfg
        self.producer = producer
        self.block_size = int(vllm_config.cache_config.block_size)
        self.kv_layout = str(getattr(vllm_config.cache_config,
                                     "kv_cache_layout", "") or "")
        self.dp_size, self.dp_rank, self.tp_size = dp_size, dp_rank, tp_size
        # P: requests waiting for their last prefill chunk; those whose
        # save went to the workers and was not reported yet (rid -> tid)
        self._save_pending: dict[str, _Save] = {}
        self._sending: dict[str, str] = {}
        # D: loads for the next step and those the workers run (rid ->
        # tid), releases for the next step
        self._load_next: dict[str, ReqMeta] = {}
        self._loading: dict[str, str] = {}
        self._release_next: list[ReqMeta] = []
        self._abort_next: list[str] = []
        self._save_aborted: set[str] = set()  # P: preempted mid-save
        # P: ids of requests vLLM added, for the workers to declare (and
        # withdraw when a request goes before its save opened): rid -> tid
        self._expect_next: list[str] = []
        self._withdraw_next: list[str] = []
        self._expected: dict[str, str] = {}
        self._expected_tids: set[str] = set()
        self._live_tids: dict[str, str] = {}  # tid -> rid, both roles
        self._bad: set[str] = set()  # refused params, not asked again
        self.bad_params = 0
        self.duplicate_ids = 0

    def _refuse(self, request: Any, err: Any) -> None:
        rid = request.request_id
        if rid not in self._bad:
            self._bad.add(rid)
            self.bad_params += 1
            log.error("KVBrokerConnector: request %s: bad kv_transfer_params "
                      "(%s): %s", rid, err,
                      "its KV is not sent" if self.producer else
                      "its prompt is computed here, nothing is loaded")

    def _parse(self, request: Any) -> ReqMeta | None:
        try:
            return parse_request(request.kv_transfer_params,
                                 request.request_id, self.producer)
        except ParamsError as e:
            self._refuse(request, e)
            return None

    def _duplicate(self, rid: str, tid: str) -> bool:
        """A transfer id another live request of ours uses: two requests
        would share one transfer (and one's bytes be taken for the
        other's), so the second is refused (logged, counted)."""
        other = self._live_tids.get(tid)
        if other is None or other == rid:
            return False
        return True

    def _layout_mismatch(self, params: dict) -> str:
        theirs = params.get("kv_cache_layout")
        if isinstance(theirs, str) and theirs and self.kv_layout and \
                theirs != self.kv_layout:
            return ("P's KV cache layout is %s, ours %s: set the same "
                    "VLLM_KV_CACHE_LAYOUT on both" % (theirs, self.kv_layout))
        return ""

    def _load_params(self, request: Any) -> tuple[str, ReqMeta | None]:
        """D: the request's load, or why there is none: "no_remote" (not
        ours), "bad" (refused, logged and counted once), "duplicate"."""
        params = request.kv_transfer_params
        if not params:
            return "no_remote", None
        if not isinstance(params, dict):  # from outside: refuse, not raise
            self._parse(request)
            return "bad", None
        if not params.get("do_remote_prefill"):
            return "no_remote", None
        if request.request_id in self._bad:
            return "bad", None
        m = self._parse(request)
        if m is None:
            return "bad", None
        why = self._layout_mismatch(params)
        if why:
            self._refuse(request, why)
            return "bad", None
        if self._duplicate(request.request_id, m.transfer_id):
            return "duplicate", m
        return "", m

    # --- vLLM scheduler-side calls ---

    def on_new_request(self, request: Any) -> None:
        """P: vLLM added the request (Scheduler.add_request): its workers
        declare its transfer id at the next step, long before the save
        opens, so that P's broker tells it from an id no one will open."""
        if not self.producer:
            return
        params = request.kv_transfer_params
        if not isinstance(params, dict) or not params.get("do_remote_decode"):
            return
        tid = params.get("transfer_id")
        if not isinstance(tid, str) or not tid or \
                len(tid.encode("utf-8", "replace")) > 255 or \
                tid in self._live_tids or tid in self._expected_tids:
            return  # refused later, with its reason, or another's
        self._expected[request.request_id] = tid
        self._expected_tids.add(tid)
        self._expect_next.append(tid)

    def _withdraw(self, rid: str) -> None:
        """P: the request went away (or will not be sent) before its save
        opened: D's load of it fails at once."""
        tid = self._expected.pop(rid, None)
        if tid is not None:
            self._expected_tids.discard(tid)
            self._withdraw_next.append(tid)

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int):
        if self.producer:
            return 0, False
        if self._load_params(request)[0]:
            return 0, False
        # vLLM hands the block-aligned local prefix hit: D loads the rest
        n = int(request.num_prompt_tokens) - int(num_computed_tokens)
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        rid = request.request_id
        if not params or rid in self._bad:
            return
        if not isinstance(params, dict):
            self._parse(request)  # logged and counted once
            return
        if self.producer:
            if params.get("do_remote_decode"):
                self._p_alloc(request, blocks)
            return
        why, m = self._load_params(request)
        if m is None:
            return
        params["do_remote_prefill"] = False  # one transfer per request
        if why == "duplicate":
            self.duplicate_ids += 1
            log.error("KVBrokerConnector: request %s: transfer_id %r is "
                      "already loading for request %s: computed here",
                      rid, m.transfer_id, self._live_tids[m.transfer_id])
            return
        if num_external_tokens <= 0:
            # its whole prompt is in D's prefix cache (or its partial
            # tail is): nothing to load, but P still holds its blocks
            self._release_next.append(m)
            return
        ids = _first_group(blocks.get_block_ids())
        n_prompt = int(request.num_prompt_tokens)
        # the local hit is block-aligned: its blocks are D's own (prefix
        # cached), only the rest is filled (P writes its last blocks)
        first = (n_prompt - int(num_external_tokens)) // self.block_size
        m.block_ids = ids[first:_n_blocks(n_prompt, self.block_size)]
        self._load_next[rid] = m
        self._live_tids[m.transfer_id] = rid

    def _p_alloc(self, request: Any, blocks: Any) -> None:
        rid = request.request_id
        s = self._save_pending.get(rid)
        if s is not None:  # resumed after a preemption: its blocks now
            s.blocks = _first_group(blocks.get_block_ids())
            return
        if rid in self._sending:
            return
        m = self._parse(request)
        if m is None:
            return
        if self._duplicate(rid, m.transfer_id):
            self.duplicate_ids += 1
            log.error("KVBrokerConnector: request %s: transfer_id %r is "
                      "already used by request %s: its KV is not sent", rid,
                      m.transfer_id, self._live_tids[m.transfer_id])
            self._bad.add(rid)
            return
        self._save_pending[rid] = _Save(
            request, m, _first_group(blocks.get_block_ids()))
        self._live_tids[m.transfer_id] = rid

    def build_connector_meta(self, scheduler_output: Any) -> KVBrokerMetadata:
        meta = KVBrokerMetadata()
        if self.producer:
            self._meta_saves(scheduler_output, meta)
            meta.expect, self._expect_next = self._expect_next, []
            meta.withdraw, self._withdraw_next = self._withdraw_next, []
        meta.reqs_to_load = list(self._load_next.values())
        for rid, m in self._load_next.items():
            self._loading[rid] = m.transfer_id
        self._load_next.clear()
        meta.reqs_to_release, self._release_next = self._release_next, []
        meta.reqs_to_abort, self._abort_next = self._abort_next, []
        return meta

    def _track_blocks(self, so: Any) -> None:
        """P: each pending save's block list as the workers hold it."""
        pend = self._save_pending
        for rid in getattr(so, "preempted_req_ids", None) or ():
            if rid in pend:  # its blocks went back to the pool
                pend[rid].blocks = []
        for nr in getattr(so, "scheduled_new_reqs", None) or ():
            # new, or (V2 runner) resumed after a preemption: all its ids
            if nr.req_id in pend:
                pend[nr.req_id].blocks = _first_group(nr.block_ids)
        cached = getattr(so, "scheduled_cached_reqs", None)
        if cached is None:
            return
        resumed = getattr(cached, "resumed_req_ids", None) or ()
        for i, rid in enumerate(getattr(cached, "req_ids", None) or ()):
            s = pend.get(rid)
            if s is None:
                continue
            nb = _first_group(cached.new_block_ids[i])
            if rid in resumed:  # V1 runner: the list is replaced
                s.blocks = nb
            elif nb:
                s.blocks.extend(nb)

    def _meta_saves(self, so: Any, meta: KVBrokerMetadata) -> None:
        for rid in getattr(so, "preempted_req_ids", None) or ():
            if rid in self._sending:  # its save reads freed blocks
                meta.preempted.append(rid)
                self._save_aborted.add(rid)
        self._track_blocks(so)
        sched = getattr(so, "num_scheduled_tokens", {}) or {}
        for rid in list(self._save_pending):
            s = self._save_pending[rid]
            n = sched.get(rid, 0)
            request = s.request
            if n <= 0:
                continue
            if request.num_computed_tokens + n < request.num_prompt_tokens:
                continue  # not the last prefill chunk
            nb = _n_blocks(request.num_prompt_tokens, self.block_size)
            if len(s.blocks) < nb:
                log.error("KVBrokerConnector: request %s: %d blocks known "
                          "for a prompt of %d: its KV is not sent", rid,
                          len(s.blocks), nb)
                self._withdraw(rid)
                del self._save_pending[rid]
                self._live_tids.pop(s.meta.transfer_id, None)
                continue
            s.meta.block_ids = s.blocks[:nb]
            self._expected_tids.discard(  # opened by this step's workers
                self._expected.pop(rid, ""))
            meta.reqs_to_save.append(s.meta)
            self._sending[rid] = s.meta.transfer_id
            del self._save_pending[rid]

    def update_connector_output(self, connector_output: Any) -> None:
        for rid in getattr(connector_output, "finished_sending", None) or ():
            tid = self._sending.pop(rid, None)
            if tid is not None and self._live_tids.get(tid) == rid:
                del self._live_tids[tid]
        for rid in getattr(connector_output, "finished_recving", None) or ():
            tid = self._loading.pop(rid, None)
            if tid is not None and self._live_tids.get(tid) == rid:
                del self._live_tids[tid]

    def request_finished(self, request: Any, block_ids: list[int]):
        rid = request.request_id
        self._bad.discard(rid)
        if self.producer:
            s = self._save_pending.pop(rid, None)
            if s is not None and \
                    self._live_tids.get(s.meta.transfer_id) == rid:
                del self._live_tids[s.meta.transfer_id]
            self._withdraw(rid)  # never saved: D need not wait
            if rid not in self._sending:
                return False, None
            if rid in self._save_aborted:  # D would wait for nothing
                self._save_aborted.discard(rid)
                return True, None
            if request_aborted(request):
                self._abort_next.append(rid)
                return True, None
            return True, self._params_for_d(request, block_ids)
        if rid in self._load_next or rid in self._loading:
            # dropped while loading: vLLM keeps its blocks until it comes
            # back in finished_recving (the workers abort the transfer and
            # report it when no byte of it can land any more)
            self._abort_next.append(rid)
            return False, None
        params = request.kv_transfer_params
        if isinstance(params, dict) and params.get("do_remote_prefill"):
            # dropped before it was scheduled: P still holds its blocks
            try:
                m = parse_request(params, rid, False)
            except ParamsError:
                return False, None
            params["do_remote_prefill"] = False
            if not self._duplicate(rid, m.transfer_id):
                self._release_next.append(m)
        return False, None

    def _params_for_d(self, request: Any, block_ids: list[int]) -> dict:
        c = self.cfg
        p = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "transfer_id": request.kv_transfer_params["transfer_id"],
            "remote_block_ids": _first_group(block_ids),
            "remote_engine_id": "%s:%d" % (c.host_ip, c.handshake_port),
            "remote_host": c.host_ip,
            "remote_handshake_port": c.handshake_port,
            "remote_notify_port": c.notify_port,
            "remote_dp_rank": self.dp_rank,
            "remote_dp_size": self.dp_size,
            "remote_tp_size": self.tp_size,
            "tp_size": self.tp_size,
        }
        if self.kv_layout:
            p["kv_cache_layout"] = self.kv_layout
        return p

    def has_pending_push_work(self) -> bool:
        return bool(self._sending)
