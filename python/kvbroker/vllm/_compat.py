# SPDX-License-Identifier: MIT
"""vLLM's KV connector base class, or a stand-in when vLLM is not installed.

With vLLM importable, its own classes are used. Without it (tests, machines
without a GPU), the stand-in below carries every member of
``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` as of
vllm-project/vllm commit 00f4240ee645 (the newest version read, about late
September 2026; vLLM 0.31/0.32 interface): the module-level classes
(KVConnectorTransferResults, SupportsHMA, supports_hma, KVConnectorRole,
KVConnectorHandshakeMetadata, KVConnectorMetadata, KVConnectorWorkerMetadata,
CopyBlocksOp) and KVConnectorBase_V1 with vLLM's signatures and default
behaviour: ``__init__`` raises ValueError without kv_transfer_config,
``requires_kv_delivery`` is the producer role, ``get_transfer_results``
wraps ``get_finished``, ``bind_kv_cache_manager`` stores the manager and
calls ``bind_gpu_block_pool(manager.block_pool)``, and so on. It holds no
other vLLM logic. tests/python/test_vllm_model_base.py lists the members and
their signatures, so a drift from that file shows.

The connector itself was first written against commit 003df2961dd8 (mid
2026); the members added since then have defaults here, as in vLLM.
"""

from __future__ import annotations

import enum
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

VLLM_INTERFACE = ("vllm-project/vllm@00f4240ee645 "
                  "vllm/distributed/kv_transfer/kv_connector/v1/base.py "
                  "(KVConnectorBase_V1; the connector was first written "
                  "against 003df2961dd8)")

log = logging.getLogger("kvbroker.vllm")

try:  # pragma: no cover - vLLM is not installed where the tests run
    from vllm.distributed.kv_transfer.kv_connector.v1 import base as _base

    KVConnectorBase_V1 = _base.KVConnectorBase_V1
    KVConnectorMetadata = _base.KVConnectorMetadata
    KVConnectorRole = _base.KVConnectorRole
    # members of newer vLLMs only: None where the installed one lacks them
    KVConnectorTransferResults = getattr(_base, "KVConnectorTransferResults",
                                         None)
    KVConnectorHandshakeMetadata = getattr(_base,
                                           "KVConnectorHandshakeMetadata",
                                           None)
    KVConnectorWorkerMetadata = getattr(_base, "KVConnectorWorkerMetadata",
                                        None)
    SupportsHMA = getattr(_base, "SupportsHMA", None)
    supports_hma = getattr(_base, "supports_hma", None)
    CopyBlocksOp = getattr(_base, "CopyBlocksOp", None)
    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    # s_tensor_list, d_tensor_list, s_indices, d_indices, direction
    CopyBlocksOp = Callable[[dict, dict, list, list, Literal["h2d", "d2h"]],
                            None]

    @dataclass
    class KVConnectorTransferResults:
        """One worker's snapshot of finished transfers. Failed receives
        also appear in finished_recving (the scheduler releases the request
        from its wait)."""
        finished_sending: set[str] = field(default_factory=set)
        finished_recving: set[str] = field(default_factory=set)
        failed_recving: set[str] = field(default_factory=set)
        # request id -> (transfer id, exclusive token boundary, digest)
        prefix_replay_checkpoints: dict[str, tuple[str, int, str]] = field(
            default_factory=dict)

    class SupportsHMA(ABC):
        @abstractmethod
        def request_finished_all_groups(
                self, request: Any, block_ids: tuple[list[int], ...]
        ) -> tuple[bool, dict[str, Any] | None]:
            raise NotImplementedError

    def supports_hma(connector: Any) -> bool:
        if isinstance(connector, type):
            return issubclass(connector, SupportsHMA)
        return isinstance(connector, SupportsHMA)

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorHandshakeMetadata(ABC):  # noqa: B024 - as in vLLM
        pass

    class KVConnectorMetadata(ABC):  # noqa: B024 - as in vLLM
        pass

    class KVConnectorWorkerMetadata(ABC):
        @abstractmethod
        def aggregate(self, other: "KVConnectorWorkerMetadata"
                      ) -> "KVConnectorWorkerMetadata":
            pass

    class KVConnectorBase_V1(ABC):
        @property
        def supports_divergent_local_hybrid_hits(self) -> bool:
            return False

        @property
        def requires_kv_delivery(self) -> bool:
            return self._kv_transfer_config.is_kv_producer

        def __init__(self, vllm_config: Any, role: KVConnectorRole,
                     kv_cache_config: Any):
            self._connector_metadata: KVConnectorMetadata | None = None
            self._vllm_config = vllm_config
            ktc = getattr(vllm_config, "kv_transfer_config", None)
            if ktc is None:
                raise ValueError(
                    "kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_transfer_config = ktc
            self._kv_cache_config = kv_cache_config
            self._kv_cache_manager: Any = None
            self._role = role

        @property
        def role(self) -> KVConnectorRole:
            return self._role

        # ---------------- worker side ----------------

        def get_mem_pool_context(self) -> AbstractContextManager | None:
            return None

        def bind_connector_metadata(
                self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def register_kv_caches(self, kv_caches: dict[str, Any]):
            return

        def set_host_xfer_buffer_ops(self, copy_operation: CopyBlocksOp):
            return

        def finish_forward(self) -> None:
            return

        def reset_capture_state(self) -> None:
            return

        def handle_preemptions(self,
                               kv_connector_metadata: KVConnectorMetadata):
            return

        @abstractmethod
        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
            pass

        @abstractmethod
        def wait_for_layer_load(self, layer_name: str) -> None:
            pass

        @abstractmethod
        def save_kv_layer(self, layer_name: str, kv_layer: Any,
                          attn_metadata: Any, **kwargs: Any) -> None:
            pass

        @abstractmethod
        def wait_for_save(self):
            pass

        def get_finished(self, finished_req_ids: set[str]
                         ) -> tuple[set[str] | None, set[str] | None]:
            return None, None

        def get_transfer_results(self, finished_req_ids: set[str]
                                 ) -> KVConnectorTransferResults:
            finished_sending, finished_recving = self.get_finished(
                finished_req_ids)
            return KVConnectorTransferResults(
                finished_sending=set(finished_sending or ()),
                finished_recving=set(finished_recving or ()))

        def get_block_ids_with_load_errors(self) -> set[int]:
            return set()

        def shutdown(self):
            return None

        def get_kv_connector_stats(self) -> Any:
            return None

        def get_kv_connector_kv_cache_events(self) -> Any:
            return None

        def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
            return None

        def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
            return None

        # ---------------- scheduler side ----------------

        def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
            self._kv_cache_manager = kv_cache_manager
            self.bind_gpu_block_pool(kv_cache_manager.block_pool)

        def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
            return

        @abstractmethod
        def get_num_new_matched_tokens(self, request: Any,
                                       num_computed_tokens: int
                                       ) -> tuple[int | None, bool]:
            pass

        @abstractmethod
        def update_state_after_alloc(self, request: Any, blocks: Any,
                                     num_external_tokens: int):
            pass

        @abstractmethod
        def build_connector_meta(self, scheduler_output: Any
                                 ) -> KVConnectorMetadata:
            pass

        def on_new_request(self, request: Any) -> None:
            return

        def update_connector_output(self, connector_output: Any):
            return

        def can_load_prefix_replay_checkpoint(self, request: Any,
                                              num_local_tokens: int,
                                              num_external_tokens: int
                                              ) -> bool:
            return False

        def consume_prefix_replay_checkpoint(self, request: Any,
                                             num_hit_tokens: int) -> bool:
            return False

        def request_finished(self, request: Any, block_ids: list[int]
                             ) -> tuple[bool, dict[str, Any] | None]:
            return False, None

        def register_finished_partial_tail(
                self, request: Any, block_ids: tuple[list[int], ...],
                partial_tail_offloads: list[tuple[int, int, int]]) -> bool:
            return False

        def take_events(self) -> Iterable[Any]:
            return ()

        def has_pending_block_frees(self) -> bool:
            return False

        def has_pending_push_work(self) -> bool:
            return False

        @classmethod
        def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
            if cls is KVConnectorBase_V1:
                raise TypeError("get_required_kvcache_layout should not be "
                                "called on the abstract base class")
            return None

        @classmethod
        def requires_piecewise_for_cudagraph(cls,
                                             extra_config: dict[str, Any]
                                             ) -> bool:
            return False

        def get_finished_count(self) -> int | None:
            return None

        @classmethod
        def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                     ) -> Any:
            return None

        def set_xfer_handshake_metadata(
                self, metadata: dict[int, KVConnectorHandshakeMetadata]
        ) -> None:
            return None

        def set_xfer_handshake_metadata_pp_aware(
                self, metadata: dict[tuple[int, int],
                                     KVConnectorHandshakeMetadata]) -> None:
            if any(pp_rank != 0 for pp_rank, _ in metadata):
                raise ValueError(
                    "%s received pp_rank > 0 handshake metadata but does not "
                    "support PP-disaggregated KV transfer."
                    % type(self).__name__)
            self.set_xfer_handshake_metadata(
                {tp_rank: meta for (_, tp_rank), meta in metadata.items()})

        @classmethod
        def build_prom_metrics(cls, vllm_config: Any,
                               metric_types: dict[type, type],
                               labelnames: list[str],
                               per_engine_labelvalues: dict[int, list[object]]
                               ) -> Any:
            return None

        def reset_cache(self) -> bool | None:
            log.debug("Connector cache reset requested, but %s does not "
                      "implement reset_cache().", type(self).__name__)
            return None


def parallel_ranks(vllm_config: Any) -> tuple[int, int, int]:
    """(dp_rank, tp_rank, tp_size) of this worker process.

    Under vLLM: its tensor-parallel group. Without it: the config's
    ``parallel_config`` (``rank`` is the worker's rank, as in vLLM's
    ParallelConfig; pipeline parallelism is not supported).
    """
    pc = vllm_config.parallel_config
    dp = int(getattr(pc, "data_parallel_rank", 0) or 0)
    if HAVE_VLLM:  # pragma: no cover
        from vllm.distributed.parallel_state import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        return dp, get_tensor_model_parallel_rank(), \
            get_tensor_model_parallel_world_size()
    tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
    return dp, int(getattr(pc, "rank", 0) or 0) % tp_size, tp_size


def request_aborted(request: Any) -> bool:
    """Did the request end by an abort (not by length or stop)?"""
    status = getattr(request, "status", None)
    return "ABORTED" in str(getattr(status, "name", status))
