# SPDX-License-Identifier: MIT
"""KVBrokerConnector: vLLM's V1 KV connector over kvbroker, WRITE mode.

Load it with::

    --kv-transfer-config '{"kv_connector": "KVBrokerConnector",
        "kv_connector_module_path": "kvbroker.vllm",
        "kv_role": "kv_producer",          # or "kv_consumer"
        "kv_connector_extra_config": {"broker_socket": "/run/kvbroker.sock",
            "host_ip": "10.0.0.1", "handshake_port": 6301,
            "notify_port": 61005}}'

vLLM makes one instance in its scheduler (role SCHEDULER: _scheduler.py)
and one in each worker (role WORKER: _worker.py); this class only routes
each call to the half that exists. See docs/vllm.md.

Hybrid models: where vLLM reports failed loads per request
(KVConnectorTransferResults.failed_recving, vLLM 0.30 and later) the class
implements SupportsHMA, so vLLM keeps its hybrid KV cache manager on and
calls request_finished_all_groups; every full-attention and sliding-window
KV cache group moves (_groups.py). Under an older vLLM it does not, and vLLM
turns the hybrid manager off (every layer full attention, one group).
"""

from __future__ import annotations

import copy
from typing import Any

from ._compat import (KVConnectorBase_V1, KVConnectorRole,
                      KVConnectorTransferResults, SupportsHMA)
from ._groups import GroupsError, parse_groups
from ._params import Config, ParamsError
from ._scheduler import BrokerScheduler, KVBrokerMetadata
from ._stats import KVBrokerConnectorStats, KVBrokerPromMetrics

__all__ = ["KVBrokerConnector", "KVBrokerMetadata"]

_STANDARD = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")


def _standard_layouts(vllm_config: Any) -> bool:
    """Does this vLLM name KV cache layouts as stride permutations of
    [L, B, H, N, C] (0.29 and later) rather than NHD / HND?"""
    try:
        from vllm.v1 import kv_cache_layout  # noqa: F401  (0.29+)
        return True
    except ImportError:
        pass
    cc = getattr(vllm_config, "cache_config", None)
    return str(getattr(cc, "kv_cache_layout", "") or "") in _STANDARD


def hma_supported() -> bool:
    """Can this vLLM run the connector with its hybrid KV cache manager?
    It needs SupportsHMA and request-level load failures
    (KVConnectorTransferResults.failed_recving): with several KV cache
    groups vLLM cannot take failed block ids (0.30+ raises; older versions
    unpack one group's block list)."""
    return SupportsHMA is not None and KVConnectorTransferResults is not None


_HMA_BASES = (SupportsHMA,) if hma_supported() else ()


class KVBrokerConnector(KVConnectorBase_V1, *_HMA_BASES):
    def __init__(self, vllm_config: Any, role: KVConnectorRole,
                 kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        try:
            self._groups = parse_groups(kv_cache_config)
        except GroupsError as e:
            raise ValueError("KVBrokerConnector: %s" % e) from None
        if len(self._groups) > 1 and not hma_supported():
            raise ValueError(
                "KVBrokerConnector: %d KV cache groups, but this vLLM "
                "reports no request-level load failures (failed_recving, "
                "vLLM >= 0.30): run with the hybrid KV cache manager off "
                "(--disable-hybrid-kv-cache-manager)" % len(self._groups))
        ktc = vllm_config.kv_transfer_config
        kv_role = getattr(ktc, "kv_role", None)
        if kv_role not in ("kv_producer", "kv_consumer"):
            raise ValueError(
                "KVBrokerConnector: kv_role %r: it runs as kv_producer "
                "(prefill) or kv_consumer (decode); kv_both is not "
                "supported" % (kv_role,))
        pp = int(getattr(vllm_config.parallel_config,
                         "pipeline_parallel_size", 1) or 1)
        if pp > 1:
            # each stage holds some of the layers under the same TP ranks:
            # the broker knows a worker by (role, dp, tp) and a transfer
            # covers all of a model's layers
            raise ValueError(
                "KVBrokerConnector: pipeline_parallel_size %d: pipeline "
                "parallelism is not supported (tensor and data parallelism "
                "are)" % pp)
        try:
            self._cfg = Config.parse(getattr(ktc, "kv_connector_extra_config",
                                             None))
        except ParamsError as e:
            raise ValueError("KVBrokerConnector: kv_connector_extra_config: "
                             "%s" % e) from None
        self._producer = kv_role == "kv_producer"
        self._sched: BrokerScheduler | None = None
        self._worker = None
        if role == KVConnectorRole.SCHEDULER:
            pc = vllm_config.parallel_config
            self._sched = BrokerScheduler(
                vllm_config, self._cfg, self._producer,
                int(getattr(pc, "data_parallel_size", 1) or 1),
                int(getattr(pc, "data_parallel_rank", 0) or 0),
                int(getattr(pc, "tensor_parallel_size", 1) or 1),
                self._groups)
        else:
            from ._worker import BrokerWorker

            self._worker = BrokerWorker(vllm_config, self._cfg,
                                        self._producer, self._groups)

    # ---------------- scheduler side ----------------

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int):
        return self._sched.get_num_new_matched_tokens(request,
                                                      num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int):
        self._sched.update_state_after_alloc(request, blocks,
                                             num_external_tokens)

    def on_new_request(self, request: Any) -> None:
        self._sched.on_new_request(request)

    def build_connector_meta(self, scheduler_output: Any) -> KVBrokerMetadata:
        return self._sched.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        self._sched.update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: list[int]):
        return self._sched.request_finished(request, block_ids)

    def request_finished_all_groups(self, request: Any,
                                    block_ids: tuple[list[int], ...]):
        """SupportsHMA: vLLM's call instead of request_finished when its
        hybrid KV cache manager is on: the block ids of every KV cache
        group (a sliding-window group's out-of-window blocks already
        null)."""
        return self._sched.request_finished_all_groups(request, block_ids)

    def has_pending_push_work(self) -> bool:
        return self._sched is not None and self._sched.has_pending_push_work()

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Any) -> bool:
        # WRITE mode needs no hook: under a FULL CUDA graph replay (no
        # save_kv_layer) wait_for_save queues every layer after the
        # forward (the stream synchronized first); D loads between steps.
        # READ mode needs none either: D reads whole requests from
        # start_load_kv, P does nothing per layer
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any):
        """The layout that lets the broker split heads between different
        TP sizes, in the vocabulary of the vLLM that asks: "LBNHC" (vLLM
        >= 0.29, vllm/v1/kv_cache_layout.py), "NHD" before. Either is that
        vLLM's default; the others still work with equal heads per rank
        on both sides (docs/vllm.md). VLLM_KV_CACHE_LAYOUT, when set, wins
        over this answer in vLLM."""
        return "LBNHC" if _standard_layouts(vllm_config) else "NHD"

    # ---------------- worker side ----------------

    def register_kv_caches(self, kv_caches: dict[str, Any]):
        self._worker.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        # called before the forward in every vLLM version (start_load_kv
        # runs after it from 0.29): P's saves open here
        super().bind_connector_metadata(connector_metadata)
        if isinstance(connector_metadata, KVBrokerMetadata):
            self._worker.bind(connector_metadata)

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        if isinstance(kv_connector_metadata, KVBrokerMetadata):
            self._worker.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        # D's loads open here (after the forward from vLLM 0.29); P's
        # saves opened at bind (a caller that did not bind: here)
        meta = self._connector_metadata
        if isinstance(meta, KVBrokerMetadata):
            self._worker.bind(meta)
            self._worker.start_loads(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # WRITE mode loads between steps (get_num_new_matched_tokens says
        # async): a request runs only once its transfer has ended
        return

    def save_kv_layer(self, layer_name: str, kv_layer: Any,
                      attn_metadata: Any, **kwargs: Any) -> None:
        self._worker.save_kv_layer(layer_name, kv_layer)

    def wait_for_save(self):
        self._worker.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]):
        sending, recving, _ = self._worker.results(finished_req_ids)
        return sending or None, recving or None

    def get_transfer_results(self, finished_req_ids: set[str]):
        sending, recving, failed = self._worker.results(finished_req_ids)
        if KVConnectorTransferResults is None:  # a vLLM without it
            return sending or None, recving or None
        return KVConnectorTransferResults(finished_sending=sending,
                                          finished_recving=recving,
                                          failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.get_block_ids_with_load_errors()

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()

    # ---------------- stats (vLLM's metrics) ----------------

    def get_kv_connector_stats(self):
        """Worker: what its transfers did since the last call (a
        KVBrokerConnectorStats), None when nothing; vLLM aggregates the
        ranks'. The scheduler side has none."""
        if self._worker is None:
            return None
        return self._worker.connector_stats_object()

    @classmethod
    def build_kv_connector_stats(cls, data: Any = None):
        """vLLM's logging process rebuilds the aggregated stats from
        their data (a copy: aggregating it later must not change the
        dict vLLM also hands its Prometheus logger)."""
        return KVBrokerConnectorStats(data=copy.deepcopy(data) if data
                                      else {})

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any,
                           labelnames: Any, per_engine_labelvalues: Any):
        """vllm:kvbroker_* Prometheus metrics (docs/vllm.md)."""
        return KVBrokerPromMetrics(vllm_config, metric_types, labelnames,
                                   per_engine_labelvalues)

    # ---------------- for tests and operators ----------------

    @property
    def broker_client(self):
        """The kvbroker.Client this worker attached with (worker role):
        CPU KV caches must be its memory (Client.alloc + Region.as_torch)."""
        return self._worker.client if self._worker is not None else None

    def connector_stats(self) -> dict:
        """Counters of this instance (scheduler: refused params; worker:
        transfers opened / ok / failed / aborted)."""
        if self._sched is not None:
            return {"bad_params": self._sched.bad_params,
                    "duplicate_ids": self._sched.duplicate_ids,
                    "sending": len(self._sched._sending),
                    "loading": len(self._sched._loading)}
        d = dict(self._worker.stats)
        d["live"] = self._worker.live()
        d["broker_gone"] = self._worker.broker_gone
        return d
