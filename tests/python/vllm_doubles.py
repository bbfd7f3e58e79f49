# SPDX-License-Identifier: MIT
"""Test doubles of the vLLM objects KVBrokerConnector touches.

Only the attributes the connector reads, with vLLM's names: Request
(request_id, prompt_token_ids, num_prompt_tokens, num_computed_tokens,
kv_transfer_params, status), KVCacheBlocks.get_block_ids(), SchedulerOutput
(num_scheduled_tokens, scheduled_cached_reqs, finished_req_ids),
KVConnectorOutput (finished_sending / finished_recving) and VllmConfig
(kv_transfer_config, cache_config, parallel_config).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class RequestStatus(enum.Enum):
    WAITING = 1
    WAITING_FOR_REMOTE_KVS = 2
    RUNNING = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6


@dataclass
class Request:
    request_id: str
    num_prompt_tokens: int
    kv_transfer_params: Any = None
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING

    @property
    def prompt_token_ids(self) -> list[int]:
        return list(range(self.num_prompt_tokens))


class KVCacheBlocks:
    def __init__(self, ids: list[int]):
        self._ids = list(ids)

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (list(self._ids),)


@dataclass
class CachedRequestData:
    req_ids: list = field(default_factory=list)
    new_block_ids: list = field(default_factory=list)


@dataclass
class SchedulerOutput:
    num_scheduled_tokens: dict = field(default_factory=dict)
    scheduled_cached_reqs: CachedRequestData = field(
        default_factory=CachedRequestData)
    finished_req_ids: set = field(default_factory=set)


@dataclass
class KVConnectorOutput:
    finished_sending: set | None = None
    finished_recving: set | None = None


@dataclass
class KVTransferConfig:
    kv_connector: str = "KVBrokerConnector"
    kv_connector_module_path: str = "kvbroker.vllm"
    kv_role: str = "kv_producer"
    kv_connector_extra_config: dict = field(default_factory=dict)


@dataclass
class CacheConfig:
    block_size: int = 16


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    rank: int = 0


@dataclass
class VllmConfig:
    kv_transfer_config: KVTransferConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    model_config: Any = None


def make_config(kv_role: str, extra: dict | None = None, tp_size: int = 1,
                rank: int = 0, block_size: int = 16) -> VllmConfig:
    return VllmConfig(
        kv_transfer_config=KVTransferConfig(
            kv_role=kv_role, kv_connector_extra_config=dict(extra or {})),
        cache_config=CacheConfig(block_size=block_size),
        parallel_config=ParallelConfig(tensor_parallel_size=tp_size,
                                       rank=rank))
