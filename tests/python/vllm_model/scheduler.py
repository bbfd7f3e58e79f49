# SPDX-License-Identifier: MIT
"""vLLM's V1 scheduler, where a KV connector can see it.

Written from vllm/v1/core/sched/scheduler.py at vllm-project/vllm
00f4240ee6458263d76cf51ca7901ce1350bb4d1 (Scheduler and the async
scheduler's placeholders) and checked against the same file at
003df2961dd8830c317a61f9745ccd557da9fa06 (mid August 2026: the same
connector-facing logic, without has_sync_kv_loads and with
bind_gpu_block_pool), one KV cache group, no speculative decoding,
multimodal inputs, LoRA, Mamba, prefix replay or structured output. What is
kept, with vLLM's names:

- ``schedule()``: RUNNING requests first (token budget, chunked prefill,
  ``allocate_slots``, FCFS preemption of ``running[-1]`` under block pressure
  unless ``connector.has_pending_block_frees()``), then WAITING requests only
  if nothing was preempted: requests holding blocks first
  (``kv_holding_waiting``), WAITING_FOR_REMOTE_KVS promoted once their load
  finished (``_update_waiting_for_remote_kv``: blocks cached, the last token
  recomputed), the local prefix hit presented block-aligned to
  ``get_num_new_matched_tokens(request, block_aligned_local)`` (the partial
  tail dropped when the remote hit is longer, else ext = 0), ``None``
  skipping the request, ``update_state_after_alloc(request,
  get_blocks(req_id), num_external)``, an async load going to
  WAITING_FOR_REMOTE_KVS with ``num_computed_tokens`` set and its blocks not
  hashed; a sync one setting ``has_sync_kv_loads``.
- the SchedulerOutput (V2 runner: resumed requests in scheduled_new_reqs
  with all their blocks and tokens; V1: ``resumed_req_ids`` in the cached
  data, whose new_block_ids replace the list) and ``build_connector_meta``.
- ``_preempt_request``: blocks freed (or fenced by ``defer_block_free``),
  ``num_computed_tokens = 0``, PREEMPTED, prepended to waiting,
  ``preempted_req_ids``, ``drop_stale_output = requires_kv_delivery``.
- ``update_from_output``: ``failed_recving`` and ``invalid_block_ids`` with
  ``kv_load_failure_policy`` (recompute | fail), stop checks, ``_free_request``
  -> ``_connector_finished`` -> ``request_finished(request, block ids of the
  computed tokens)``, ``delay_free_blocks``, and
  ``_update_from_kv_xfer_finished`` calling ``update_connector_output`` first
  and then asserting, as vLLM does, that every finished_recving and
  finished_sending id is a request it still holds (and that a received one is
  either waiting for it or finished): a connector reporting an unknown or
  already freed id fails here as it would kill vLLM's engine core.
- ``finish_requests`` (aborts) in every state: WAITING_FOR_REMOTE_KVS not yet
  received -> ``delay_free_blocks``; ``has_requests`` kept true by
  ``has_pending_push_work``.

Version switches (versions.Version): the connector is bound with
``bind_kv_cache_manager`` or ``bind_gpu_block_pool``; ``failed_recving``.

Hybrid models (a KVCacheConfig with several groups, or a sliding-window
group; vLLM keeps its hybrid KV cache manager on only for a connector that
implements SupportsHMA): block ids per group everywhere (KVCacheBlocks,
NewRequestData.block_ids, CachedRequestData.new_block_ids),
``remove_skipped_blocks`` before the connector's finish call, which is
``request_finished_all_groups(request, block ids of every group)`` for a
SupportsHMA connector (``request_finished(request, block_ids[0])`` after
asserting one group otherwise), and ``_handle_invalid_blocks`` raising
RuntimeError with more than one group (connectors must report failed loads
through failed_recving).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .kv_cache import HybridKVCacheManager, KVCacheBlocks, KVCacheManager
from .objects import (
    CachedRequestData,
    KVConnectorOutput,
    ModelRunnerOutput,
    NewRequestData,
    Request,
    RequestStatus,
    SchedulerOutput,
    VllmConfig,
)
from .versions import V2, Version


def supports_hma(connector: Any) -> bool:
    """vLLM's supports_hma (base.py): the connector implements SupportsHMA
    (the stand-in's class, or vLLM's)."""
    from kvbroker.vllm._compat import supports_hma as f

    return bool(f(connector))


class EngineDead(AssertionError):
    """An assert of vLLM's scheduler failed: vLLM's engine core would die."""


class Scheduler:
    def __init__(self, vllm_config: VllmConfig, version: Version,
                 connector: Any, runner: str, kv_cache_config: Any = None):
        self.vllm_config = vllm_config
        self.version = version
        self.runner = runner
        sc = vllm_config.scheduler_config
        cc = vllm_config.cache_config
        self.block_size = cc.block_size
        self.max_num_running_reqs = sc.max_num_seqs
        self.max_num_scheduled_tokens = sc.max_num_batched_tokens
        self.long_prefill_token_threshold = sc.long_prefill_token_threshold
        self.enable_chunked_prefill = sc.enable_chunked_prefill
        self.async_scheduling = sc.async_scheduling
        self.max_model_len = vllm_config.model_config.max_model_len
        self.use_v2_model_runner = runner == V2
        ktc = vllm_config.kv_transfer_config
        self.connector = connector
        self.recompute_kv_load_failures = \
            ktc.kv_load_failure_policy == "recompute"
        self.defer_block_free = (vllm_config.max_concurrent_batches > 1 and
                                 ktc.is_kv_consumer)
        self.requires_kv_delivery = bool(connector.requires_kv_delivery) \
            if hasattr(type(connector), "requires_kv_delivery") else False
        self.kv_cache_config = kv_cache_config
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        windows = [g.kv_cache_spec.sliding_window
                   if type(g.kv_cache_spec).__name__ == "SlidingWindowSpec"
                   else 0 for g in groups]
        self.num_kv_cache_groups = max(1, len(groups))
        if len(windows) > 1 or any(windows):
            self.kv_cache_manager = HybridKVCacheManager(
                cc.num_gpu_blocks, self.block_size, windows,
                cc.enable_prefix_caching, self.max_model_len)
        else:
            self.kv_cache_manager = KVCacheManager(
                cc.num_gpu_blocks, self.block_size, cc.enable_prefix_caching,
                self.max_model_len)
        if version.bind_kv_cache_manager:
            connector.bind_kv_cache_manager(self.kv_cache_manager)
        else:
            connector.bind_gpu_block_pool(self.kv_cache_manager.block_pool)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.kv_holding_waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.reset_preempted_req_ids: set[str] = set()
        self.finished_recving_kv_req_ids: set[str] = set()
        self.failed_recving_kv_req_ids: set[str] = set()
        self.prev_step_scheduled_req_ids: set[str] = set()
        self.sched_step_seq = 0
        self.processed_step_seq = 0
        self.deferred_frees: deque = deque()
        self.step = 0
        # observations for tests (not vLLM state)
        self.kv_transfer_params_out: dict[str, Any] = {}
        self.finished: dict[str, RequestStatus] = {}
        self.events: list[tuple] = []
        self.local_hits: dict[str, int] = {}  # async loads: local tokens
        self.async_loads: dict[str, int] = {}  # req -> external tokens
        self.matched_calls: list[tuple[str, int]] = []

    # ----------------------------------------------------------- requests

    def add_request(self, request: Request) -> None:
        assert request.request_id not in self.requests, "duplicate request id"
        self._enqueue_waiting_request(request)
        self.requests[request.request_id] = request
        self.connector.on_new_request(request)

    @staticmethod
    def _holds_kv_blocks(request: Request) -> bool:
        return (request.num_computed_tokens > 0 or
                request.status == RequestStatus.WAITING_FOR_REMOTE_KVS)

    def _enqueue_waiting_request(self, request: Request) -> None:
        if self._holds_kv_blocks(request):
            self.kv_holding_waiting.append(request)
        else:
            self.waiting.append(request)

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting) + len(
            self.kv_holding_waiting)

    def has_unfinished_requests(self) -> bool:
        r, w = self.get_request_counts()
        return r + w > 0

    def has_finished_requests(self) -> bool:
        if self.finished_req_ids:
            return True
        r, w = self.get_request_counts()
        return len(self.requests) > r + w

    def has_requests(self) -> bool:
        return (self.has_unfinished_requests() or
                self.has_finished_requests() or
                self.connector.has_pending_push_work())

    # ----------------------------------------------------------- schedule

    def schedule(self) -> SchedulerOutput:
        self.step += 1
        scheduled_new: list[Request] = []
        scheduled_resumed: list[Request] = []
        scheduled_running: list[Request] = []
        preempted: list[Request] = []
        req_to_new_blocks: dict[str, KVCacheBlocks] = {}
        num_scheduled: dict[str, int] = {}
        token_budget = self.max_num_scheduled_tokens
        has_sync_kv_loads = False
        kvm = self.kv_cache_manager
        n_running, n_waiting = self.get_request_counts()
        threshold = self.long_prefill_token_threshold \
            if n_running + n_waiting > 1 else 0

        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            if (request.num_output_placeholders > 0 and
                    request.num_computed_tokens + 2 -
                    request.num_output_placeholders >=
                    request.num_prompt_tokens + request.max_tokens):
                req_index += 1
                continue
            num_new = (request.num_tokens_with_spec +
                       request.num_output_placeholders -
                       request.num_computed_tokens)
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, token_budget,
                          self.max_model_len - request.num_computed_tokens - 1)
            if num_new <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = kvm.allocate_slots(request, num_new)
                if new_blocks is not None:
                    break
                if self.connector.has_pending_block_frees():
                    break
                victim = self.running[-1]
                if not self._request_blocks_can_be_freed(victim):
                    break
                self.running.pop()
                self._preempt_request(victim, self.requires_kv_delivery)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                break
            scheduled_running.append(request)
            req_to_new_blocks[request.request_id] = new_blocks
            num_scheduled[request.request_id] = num_new
            token_budget -= num_new
            req_index += 1

        if not preempted:
            skipped_waiting: list[Request] = []
            skipped_holding: list[Request] = []

            def skip(q: deque) -> None:
                r = q.popleft()
                (skipped_holding if self._holds_kv_blocks(r)
                 else skipped_waiting).append(r)

            while token_budget > 0:
                q = self.kv_holding_waiting or self.waiting
                if not q or len(self.running) >= self.max_num_running_reqs:
                    break
                request = q[0]
                rid = request.request_id
                if not self._handle_blocked_waiting_request(request):
                    skip(q)
                    continue
                if (request.num_stale_output_tokens and
                        not request.drop_stale_output):
                    skip(q)
                    continue
                num_external = 0
                load_kv_async = False
                new_computed = kvm.empty_kv_cache_blocks
                num_local = 0
                if request.num_computed_tokens == 0:
                    new_computed, num_local = kvm.get_computed_blocks(request)
                    partial = num_local % self.block_size
                    aligned = num_local - partial
                    ext, load_kv_async = \
                        self.connector.get_num_new_matched_tokens(request,
                                                                  aligned)
                    self.matched_calls.append((rid, aligned))
                    if request.skip_reading_prefix_cache:
                        ext, load_kv_async = 0, False
                    if ext is None:
                        skip(q)
                        continue
                    if partial and ext > partial:
                        new_computed = kvm.truncate_computed_blocks(
                            new_computed, aligned)
                        num_local = aligned
                        num_external = ext
                    elif partial:
                        num_external = 0
                        load_kv_async = False
                    else:
                        num_external = ext
                    num_computed = num_local + num_external
                    if num_computed > request.num_tokens:
                        raise EngineDead(
                            "num_computed_tokens %d > num_tokens %d for %s "
                            "(get_num_new_matched_tokens said %r)" % (
                                num_computed, request.num_tokens, rid, ext))
                else:
                    num_computed = request.num_computed_tokens

                if load_kv_async:
                    if num_external <= 0:
                        raise EngineDead("load_kv_async with %r external "
                                         "tokens (%s)" % (num_external, rid))
                    num_new = 0
                else:
                    num_new = request.num_tokens - num_computed
                    if 0 < threshold < num_new:
                        num_new = threshold
                    if not self.enable_chunked_prefill and \
                            num_new > token_budget:
                        break
                    num_new = min(num_new, token_budget)
                    assert num_new > 0
                new_blocks = kvm.allocate_slots(
                    request, num_new, num_new_computed_tokens=num_local,
                    new_computed_blocks=new_computed,
                    num_external_computed_tokens=num_external,
                    delay_cache_blocks=load_kv_async)
                if new_blocks is None:
                    break
                self.connector.update_state_after_alloc(
                    request, kvm.get_blocks(rid), num_external)
                if load_kv_async:
                    request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    request.num_computed_tokens = num_computed
                    self.local_hits[rid] = num_local
                    self.async_loads[rid] = num_external
                    self.events.append(("async_load", self.step, rid,
                                        num_local, num_external))
                    skip(q)
                    continue
                q.popleft()
                self.running.append(request)
                if num_external > 0:
                    has_sync_kv_loads = True
                if request.status == RequestStatus.WAITING:
                    scheduled_new.append(request)
                elif request.status == RequestStatus.PREEMPTED:
                    scheduled_resumed.append(request)
                else:
                    raise EngineDead("Invalid request status: %s" %
                                     request.status)
                req_to_new_blocks[rid] = kvm.get_blocks(rid)
                num_scheduled[rid] = num_new
                token_budget -= num_new
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed
            # re-queue skipped requests ahead of the rest
            self.kv_holding_waiting.extendleft(reversed(skipped_holding))
            self.waiting.extendleft(reversed(skipped_waiting))

        total = sum(num_scheduled.values())
        assert total <= self.max_num_scheduled_tokens
        if self.use_v2_model_runner:
            scheduled_new.extend(scheduled_resumed)
            scheduled_resumed = []
            new_data = [NewRequestData.from_request(
                r, req_to_new_blocks[r.request_id].get_block_ids(),
                r.all_token_ids) for r in scheduled_new]
        else:
            new_data = [NewRequestData.from_request(
                r, req_to_new_blocks[r.request_id].get_block_ids())
                for r in scheduled_new]
        cached = self._make_cached_request_data(
            scheduled_running, scheduled_resumed, req_to_new_blocks)
        if not self.use_v2_model_runner:
            self.prev_step_scheduled_req_ids = set(num_scheduled)
        so = SchedulerOutput(
            scheduled_new_reqs=new_data, scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=total,
            preempted_req_ids=self.reset_preempted_req_ids,
            finished_req_ids=self.finished_req_ids,
            has_sync_kv_loads=has_sync_kv_loads, step=self.step)
        so.kv_connector_metadata = self.connector.build_connector_meta(so)
        if self.defer_block_free and total > 0:
            self.sched_step_seq += 1
        self._update_after_schedule(so)
        return so

    def _make_cached_request_data(self, running, resumed, req_to_new_blocks
                                  ) -> CachedRequestData:
        cd = CachedRequestData()
        n_running = len(running)
        for idx, req in enumerate(running + resumed):
            rid = req.request_id
            cd.req_ids.append(rid)
            if idx >= n_running:
                cd.resumed_req_ids.add(rid)
            if not self.use_v2_model_runner and \
                    rid not in self.prev_step_scheduled_req_ids:
                cd.all_token_ids[rid] = list(req.all_token_ids)
            cd.new_block_ids.append(
                req_to_new_blocks[rid].get_block_ids(allow_none=True))
            cd.num_computed_tokens.append(req.num_computed_tokens)
            cd.num_output_tokens.append(req.num_output_tokens +
                                        req.num_output_placeholders)
        return cd

    def _update_after_schedule(self, so: SchedulerOutput) -> None:
        for rid, n in so.num_scheduled_tokens.items():
            r = self.requests[rid]
            r.num_computed_tokens += n
            r.num_in_flight_tokens += n
            if self.defer_block_free:
                r.last_sched_seq = self.sched_step_seq
            r.is_prefill_chunk = r.num_computed_tokens < (
                r.num_tokens + r.num_output_placeholders)
            if self.async_scheduling and not r.is_prefill_chunk:
                # AsyncScheduler: the token this step samples
                r.num_output_placeholders += 1
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()

    def _preempt_request(self, request: Request,
                         drop_stale_output: bool = False) -> None:
        assert request.status == RequestStatus.RUNNING
        self._free_request_blocks(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.drop_stale_output = drop_stale_output or (
            request.drop_stale_output and request.num_stale_output_tokens > 0)
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        self.reset_preempted_req_ids.add(request.request_id)
        self.events.append(("preempt", self.step, request.request_id))

    def preempt(self, req_id: str) -> bool:
        """Test hook: preempt a RUNNING request now, as block pressure would
        (it is taken out of running and prepended to waiting)."""
        r = self.requests.get(req_id)
        if r is None or r.status != RequestStatus.RUNNING or \
                not self._request_blocks_can_be_freed(r):
            return False
        self.running.remove(r)
        self._preempt_request(r, self.requires_kv_delivery)
        return True

    # ------------------------------------------------------------ outputs

    def update_from_output(self, so: SchedulerOutput,
                           out: ModelRunnerOutput) -> None:
        kvo = out.kv_connector_output
        if self.defer_block_free and so.total_num_scheduled_tokens > 0:
            self.processed_step_seq += 1
            self._drain_deferred_frees()
        failed: set[str] = set()
        if kvo is not None and kvo.failed_recving:
            failed |= self._handle_failed_recving(kvo.failed_recving)
        if kvo is not None and kvo.invalid_block_ids:
            failed |= self._handle_invalid_blocks(kvo.invalid_block_ids,
                                                  so.num_scheduled_tokens)
        stopped_running: list[Request] = []
        stopped_preempted: list[Request] = []
        for rid, n in so.num_scheduled_tokens.items():
            assert n > 0
            request = self.requests.get(rid)
            stale = False
            if request is not None:
                request.num_in_flight_tokens -= n
                if request.num_stale_output_tokens > 0:
                    stale = True
                    request.num_stale_output_tokens -= n
                    assert request.num_stale_output_tokens >= 0
            if rid in failed:
                continue
            if request is None or request.is_finished():
                continue
            if stale and request.drop_stale_output:
                continue
            idx = out.req_id_to_index.get(rid)
            toks = out.sampled_token_ids[idx] if idx is not None else []
            stopped = False
            status_before = request.status
            for tok in toks:
                if self.async_scheduling and \
                        request.num_output_placeholders > 0 and not stale:
                    request.num_output_placeholders -= 1
                request.append_output_token_ids(tok)
                if request.num_output_tokens >= request.max_tokens:
                    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    stopped = True
                    break
            if stopped:
                params = self._free_request(request)
                self.kv_transfer_params_out[rid] = params
                (stopped_running if status_before == RequestStatus.RUNNING
                 else stopped_preempted).append(request)
        if stopped_running:
            gone = set(map(id, stopped_running))
            self.running = [r for r in self.running if id(r) not in gone]
        for r in stopped_preempted:
            for q in (self.waiting, self.kv_holding_waiting):
                if r in q:
                    q.remove(r)
        if failed and not self.recompute_kv_load_failures:
            self.finish_requests(failed, RequestStatus.FINISHED_ERROR)
        if kvo is not None:
            self._update_from_kv_xfer_finished(kvo)

    def _handle_failed_recving(self, ids: set[str]) -> set[str]:
        affected = set()
        for rid in ids:
            r = self.requests.get(rid)
            if r is not None and \
                    r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                affected.add(rid)
                if self.recompute_kv_load_failures:
                    r.num_computed_tokens = 0
                    self.failed_recving_kv_req_ids.add(rid)
        self.events.append(("failed_recving", self.step, sorted(ids)))
        return set() if self.recompute_kv_load_failures else affected

    def _handle_invalid_blocks(self, invalid: set[int],
                               num_scheduled: dict[str, int]) -> set[str]:
        self.events.append(("invalid_blocks", self.step, sorted(invalid)))
        if self.num_kv_cache_groups > 1:
            raise EngineDead(
                "RuntimeError: invalid_block_ids with %d KV cache groups: "
                "Connectors must report failed requests via "
                "KVConnectorTransferResults.failed_recving" %
                self.num_kv_cache_groups)
        async_reqs = [r for r in self.kv_holding_waiting
                      if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
        a_ids, _, _ = self._update_requests_with_invalid_blocks(
            async_reqs, invalid, num_scheduled, evict=False)
        s_ids, _, evict = self._update_requests_with_invalid_blocks(
            self.running, invalid, num_scheduled, evict=True)
        if not a_ids and not s_ids:
            return set()
        if evict and not self.recompute_kv_load_failures:
            self.kv_cache_manager.evict_blocks(evict)
        if not self.recompute_kv_load_failures:
            return a_ids | s_ids
        self.failed_recving_kv_req_ids |= a_ids
        return s_ids

    def _update_requests_with_invalid_blocks(self, requests, invalid,
                                             num_scheduled, evict):
        affected, total, to_evict = set(), 0, set()
        marked: set[int] = set()
        for r in requests:
            is_affected = marked_block = False
            (ids,) = self.kv_cache_manager.get_block_ids(r.request_id)
            computed = r.num_computed_tokens - num_scheduled.get(
                r.request_id, 0)
            nblk = -(-computed // self.block_size)
            for idx, bid in zip(range(nblk), ids):
                if bid not in invalid:
                    continue
                is_affected = True
                if bid in marked:
                    continue
                marked.add(bid)
                if marked_block:
                    continue
                marked_block = True
                r.num_computed_tokens = idx * self.block_size
                total += computed - r.num_computed_tokens
                if evict:
                    to_evict.update(ids[idx:])
            if is_affected:
                if not marked_block:
                    total += r.num_computed_tokens - computed
                    r.num_computed_tokens = computed
                affected.add(r.request_id)
        return affected, total, to_evict

    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        kvm = self.kv_cache_manager
        rid = request.request_id
        if rid in self.failed_recving_kv_req_ids:
            if request.num_computed_tokens:
                kvm.cache_blocks(request, request.num_computed_tokens)
            else:
                kvm.free(request)
            self.failed_recving_kv_req_ids.remove(rid)
        else:
            kvm.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving_kv_req_ids.remove(rid)
        self.events.append(("recv_done", self.step, rid,
                            request.num_computed_tokens))

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            if request.request_id not in self.finished_recving_kv_req_ids:
                return False
            self._update_waiting_for_remote_kv(request)
            request.status = RequestStatus.PREEMPTED \
                if request.num_preemptions else RequestStatus.WAITING
        return True

    def _update_from_kv_xfer_finished(self, kvo: KVConnectorOutput) -> None:
        self.connector.update_connector_output(kvo)
        for rid in kvo.finished_recving or ():
            if rid not in self.requests:
                raise EngineDead(
                    "assert req_id in self.requests: finished_recving "
                    "reported %r, which the scheduler does not hold (unknown"
                    " or already freed)" % rid)
            req = self.requests[rid]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(rid)
            else:
                if not RequestStatus.is_finished(req.status):
                    raise EngineDead(
                        "assert RequestStatus.is_finished(req.status): "
                        "finished_recving reported %r in state %s" %
                        (rid, req.status.name))
                self._free_blocks(req)
        for rid in kvo.finished_sending or ():
            if rid not in self.requests:
                raise EngineDead(
                    "assert req_id in self.requests: finished_sending "
                    "reported %r, which the scheduler does not hold (unknown"
                    " or already freed)" % rid)
            self._free_blocks(self.requests[rid])

    # --------------------------------------------------------- finishing

    def finish_requests(self, request_ids, finished_status: RequestStatus
                        ) -> list[Request]:
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        valid = []
        for rid in request_ids:
            r = self.requests.get(rid)
            if r is None or r.is_finished():
                continue
            valid.append(r)
            if r.status == RequestStatus.RUNNING:
                self.running.remove(r)
            else:
                for q in (self.waiting, self.kv_holding_waiting):
                    if r in q:
                        q.remove(r)
        for r in valid:
            delay = False
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                delay = r.request_id not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(r.request_id)
                self.failed_recving_kv_req_ids.discard(r.request_id)
            self.events.append(("finish", self.step, r.request_id,
                                r.status.name, finished_status.name))
            r.status = finished_status
            self.kv_transfer_params_out[r.request_id] = \
                self._free_request(r, delay_free_blocks=delay)
        return valid

    def _free_request(self, request: Request,
                      delay_free_blocks: bool = False) -> Any:
        assert request.is_finished()
        delay, params = self._connector_finished(request)
        rid = request.request_id
        self.finished_req_ids.add(rid)
        self.finished[rid] = request.status
        if params is not None and params.get("do_remote_prefill"):
            params["remote_prefill_cached_tokens"] = 0
        if not (delay_free_blocks or delay):
            self._free_blocks(request)
        return params

    def _connector_finished(self, request: Request):
        kvm = self.kv_cache_manager
        if isinstance(kvm, HybridKVCacheManager):
            kvm.remove_skipped_blocks(request.request_id,
                                      request.num_computed_tokens)
        block_ids = kvm.get_block_ids_for_computed_tokens(
            request.request_id, request.num_computed_tokens)
        if supports_hma(self.connector):
            return self.connector.request_finished_all_groups(request,
                                                              block_ids)
        if len(block_ids) != 1:
            raise EngineDead("assert len(kv_cache_groups) == 1: a connector"
                             " without SupportsHMA and %d groups" %
                             len(block_ids))
        return self.connector.request_finished(request, block_ids[0])

    def _free_blocks(self, request: Request) -> None:
        assert request.is_finished()
        self._free_request_blocks(request)
        del self.requests[request.request_id]

    def _request_blocks_can_be_freed(self, request: Request) -> bool:
        return not self.defer_block_free or \
            request.last_sched_seq <= self.processed_step_seq

    def _free_request_blocks(self, request: Request) -> None:
        if self._request_blocks_can_be_freed(request):
            self.kv_cache_manager.free(request)
            return
        blocks = self.kv_cache_manager.pop_blocks_for_free(request)
        if blocks:
            self.deferred_frees.append((self.sched_step_seq, blocks))

    def _drain_deferred_frees(self) -> None:
        while self.deferred_frees:
            fence, _ = self.deferred_frees[0]
            if fence > self.processed_step_seq:
                break
            _, blocks = self.deferred_frees.popleft()
            self.kv_cache_manager.block_pool.free_blocks(
                list(reversed(blocks)))

    def num_free_blocks(self) -> int:
        return self.kv_cache_manager.block_pool.get_num_free_blocks()
