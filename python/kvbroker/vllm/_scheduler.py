# SPDX-License-Identifier: MIT
"""Scheduler side of KVBrokerConnector (WRITE mode).

P (kv_producer): a request with ``do_remote_decode`` is saved layer by
layer during its last prefill chunk; its blocks stay allocated until the
workers report the transfer ended (request_finished returns True), and
request_finished returns the kv_transfer_params a proxy gives D.
D (kv_consumer): a request with ``do_remote_prefill`` loads its whole prompt
asynchronously: the workers open the transfer (the broker sends
``remote_blocks`` to P) and report it done when ``write_done`` came.
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
        self.reqs_to_abort: list[str] = []  # abort, report finished

    def __repr__(self):
        return "KVBrokerMetadata(save=%d, load=%d, abort=%d)" % (
            len(self.reqs_to_save), len(self.reqs_to_load),
            len(self.reqs_to_abort))


def _n_blocks(tokens: int, block_size: int) -> int:
    return (tokens + block_size - 1) // block_size


def _first_group(block_ids: Any) -> list[int]:
    """Block ids of the first KV cache group: vLLM gives a tuple of lists
    (one per group), or already a list."""
    if block_ids and isinstance(block_ids[0], (list, tuple)):
        return list(block_ids[0])
    return list(block_ids or [])


class BrokerScheduler:
    def __init__(self, vllm_config: Any, cfg: Config, producer: bool,
                 dp_size: int, dp_rank: int, tp_size: int):
        self.cfg = cfg
        self.producer = producer
        self.block_size = int(vllm_config.cache_config.block_size)
        self.dp_size, self.dp_rank, self.tp_size = dp_size, dp_rank, tp_size
        # P: requests waiting for their last prefill chunk, and those whose
        # save went to the workers and has not been reported finished
        self._save_pending: dict[str, tuple[Any, list[int], ReqMeta]] = {}
        self._sending: set[str] = set()
        # D: loads for the next step, and those the workers run
        self._load_next: dict[str, ReqMeta] = {}
        self._loading: set[str] = set()
        self._abort_next: list[str] = []
        self._bad: set[str] = set()  # refused params, not asked again
        self.bad_params = 0

    def _refuse(self, request: Any, err: Exception) -> None:
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

    # --- vLLM scheduler-side calls ---

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int):
        params = request.kv_transfer_params
        if self.producer or not params:
            return 0, False
        if not isinstance(params, dict):  # from outside: refuse, not raise
            self._parse(request)
            return 0, False
        if not params.get("do_remote_prefill"):
            return 0, False
        if request.request_id in self._bad or self._parse(request) is None:
            return 0, False
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
        if self.producer and params.get("do_remote_decode"):
            if rid in self._save_pending or rid in self._sending:
                return
            m = self._parse(request)
            if m is not None:
                self._save_pending[rid] = (
                    request, _first_group(blocks.get_block_ids()), m)
            return
        if not self.producer and params.get("do_remote_prefill"):
            if num_external_tokens <= 0:
                return
            m = self._parse(request)
            if m is None:
                return
            ids = _first_group(blocks.get_block_ids())
            m.block_ids = ids[:_n_blocks(request.num_prompt_tokens,
                                         self.block_size)]
            self._load_next[rid] = m
            params["do_remote_prefill"] = False  # one transfer per request

    def build_connector_meta(self, scheduler_output: Any) -> KVBrokerMetadata:
        meta = KVBrokerMetadata()
        if self.producer:
            self._meta_saves(scheduler_output, meta)
        meta.reqs_to_load = list(self._load_next.values())
        self._loading.update(self._load_next)
        self._load_next.clear()
        meta.reqs_to_abort, self._abort_next = self._abort_next, []
        return meta

    def _meta_saves(self, so: Any, meta: KVBrokerMetadata) -> None:
        sched = getattr(so, "num_scheduled_tokens", {}) or {}
        cached = getattr(so, "scheduled_cached_reqs", None)
        if cached is not None:  # later chunks' new blocks
            for i, rid in enumerate(getattr(cached, "req_ids", []) or []):
                nb = cached.new_block_ids[i]
                if rid in self._save_pending and nb:
                    self._save_pending[rid][1].extend(_first_group(nb))
        for rid in list(self._save_pending):
            request, ids, m = self._save_pending[rid]
            n = sched.get(rid, 0)
            if n <= 0:
                continue
            if request.num_computed_tokens + n < request.num_prompt_tokens:
                continue  # not the last prefill chunk
            m.block_ids = ids[:_n_blocks(request.num_prompt_tokens,
                                         self.block_size)]
            meta.reqs_to_save.append(m)
            self._sending.add(rid)
            del self._save_pending[rid]

    def update_connector_output(self, connector_output: Any) -> None:
        for rid in getattr(connector_output, "finished_sending", None) or ():
            self._sending.discard(rid)
            self._loading.discard(rid)
        for rid in getattr(connector_output, "finished_recving", None) or ():
            self._loading.discard(rid)

    def request_finished(self, request: Any, block_ids: list[int]):
        rid = request.request_id
        self._bad.discard(rid)
        if self.producer:
            self._save_pending.pop(rid, None)
            if rid not in self._sending:
                return False, None
            if request_aborted(request):
                self._abort_next.append(rid)
            return True, self._params_for_d(request, block_ids)
        if rid in self._load_next or rid in self._loading:
            # dropped while its load runs (or is about to: it still goes
            # out, so that P is not left waiting): the workers report it
            # in finished_sending once P can no longer write its blocks
            self._abort_next.append(rid)
            return True, None
        return False, None

    def _params_for_d(self, request: Any, block_ids: list[int]) -> dict:
        c = self.cfg
        return {
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

    def has_pending_push_work(self) -> bool:
        return bool(self._sending)
