# SPDX-License-Identifier: MIT
"""vLLM's KV connector base class, or a stand-in when vLLM is not installed.

The connector follows the V1 interface of vLLM's
``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` as of vllm-project/vllm
commit 003df2961dd8 (2026, after vLLM 0.18, whose MoRIIO connector carries a
``transfer_id`` in ``kv_transfer_params``). With vLLM importable, its own
classes are used. Without it (tests, machines without a GPU), the stand-in
below has the same names and method signatures, so the connector runs under a
driver that calls it in vLLM's order; it holds no vLLM logic.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import Any

VLLM_INTERFACE = "vllm-project/vllm@003df2961dd8 (v1 KVConnectorBase_V1)"

try:  # pragma: no cover - vLLM is not installed where the tests run
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata(ABC):  # noqa: B024 - as in vLLM
        pass

    class KVConnectorBase_V1(ABC):
        def __init__(self, vllm_config: Any, role: KVConnectorRole,
                     kv_cache_config: Any = None):
            if getattr(vllm_config, "kv_transfer_config", None) is None:
                raise ValueError("kv_transfer_config must be set")
            self._connector_metadata: KVConnectorMetadata | None = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self) -> KVConnectorRole:
            return self._role

        # worker side
        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def register_kv_caches(self, kv_caches):
            return

        @abstractmethod
        def start_load_kv(self, forward_context, **kwargs) -> None: ...

        @abstractmethod
        def wait_for_layer_load(self, layer_name: str) -> None: ...

        @abstractmethod
        def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata,
                          **kwargs) -> None: ...

        @abstractmethod
        def wait_for_save(self): ...

        def get_finished(self, finished_req_ids: set[str]):
            return None, None

        def get_block_ids_with_load_errors(self) -> set[int]:
            return set()

        def shutdown(self):
            return None

        # scheduler side
        @abstractmethod
        def get_num_new_matched_tokens(self, request,
                                       num_computed_tokens: int): ...

        @abstractmethod
        def update_state_after_alloc(self, request, blocks,
                                     num_external_tokens: int): ...

        @abstractmethod
        def build_connector_meta(self, scheduler_output): ...

        def update_connector_output(self, connector_output):
            return

        def request_finished(self, request, block_ids: list[int]):
            return False, None

        @classmethod
        def get_required_kvcache_layout(cls, vllm_config):
            return None

        @classmethod
        def requires_piecewise_for_cudagraph(cls, extra_config) -> bool:
            return False


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
