# SPDX-License-Identifier: MIT
"""vLLM's objects a KV connector sees, with vLLM's names and meanings.

From vllm-project/vllm 00f4240ee645: vllm/v1/request.py (Request,
RequestStatus: every status after PREEMPTED is a finished one),
vllm/v1/core/sched/output.py (NewRequestData, CachedRequestData with
resumed_req_ids, SchedulerOutput with preempted_req_ids, finished_req_ids,
has_sync_kv_loads, kv_connector_metadata), vllm/v1/outputs.py
(KVConnectorOutput, ModelRunnerOutput) and the config fields the connector
and scheduler read (KVTransferConfig.is_kv_producer / is_kv_consumer /
kv_load_failure_policy). Only what a connector can observe is modelled.

The KV cache config a connector is constructed with (KVCacheConfig,
KVCacheGroupSpec, KVCacheTensor and the specs of vllm/v1/kv_cache_interface.py:
AttentionSpec, FullAttentionSpec, SlidingWindowSpec, MambaSpec) carries
vLLM's field names and defaults; the connector reads the groups' layer_names
and kv_cache_spec.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # everything after PREEMPTED is finished
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED


def block_hash_chain(tokens: list[int], block_size: int) -> list[int]:
    """Hashes of the full blocks of tokens, each chained on its parent (as
    vLLM's hash_block_tokens: the hash of a block covers its whole prefix)."""
    out, parent = [], 0x9E3779B9
    for i in range(len(tokens) // block_size):
        parent = hash((parent, tuple(tokens[i * block_size:(i + 1) *
                                            block_size])))
        out.append(parent)
    return out


class Request:
    """vllm/v1/request.py Request: the fields a scheduler and a connector
    read."""

    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 max_tokens: int = 1, kv_transfer_params: Any = None,
                 block_size: int = 16):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._all_token_ids = list(self.prompt_token_ids)
        self._output_token_ids: list[int] = []
        self.max_tokens = max_tokens
        self.kv_transfer_params = kv_transfer_params
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.num_output_placeholders = 0  # async scheduling
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.drop_stale_output = False
        self.last_sched_seq = 0
        self.is_prefill_chunk = False
        self.spec_token_ids: list[int] = []
        self.skip_reading_prefix_cache = False
        self.client_index = 0
        self.stop_reason = None
        self.block_size = block_size
        self.sampling_params = None
        self.pooling_params = None
        self.lora_request = None
        self.mm_features: list = []
        self.has_encoder_inputs = False
        self.resumable = False

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self._output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    @property
    def block_hashes(self) -> list[int]:
        return block_hash_chain(self._all_token_ids, self.block_size)

    def append_output_token_ids(self, token_id: int) -> None:
        self._output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self):
        return self.status.name if self.is_finished() else None

    def __repr__(self):
        return "Request(%s, %s, computed=%d/%d)" % (
            self.request_id, self.status.name, self.num_computed_tokens,
            self.num_tokens)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    block_ids: tuple
    num_computed_tokens: int
    all_token_ids: list[int] | None = None  # V2 (resumed requests too)
    sampling_params: Any = None

    @classmethod
    def from_request(cls, request: Request, block_ids: tuple,
                     all_token_ids: list[int] | None = None):
        return cls(req_id=request.request_id,
                   prompt_token_ids=list(request.prompt_token_ids),
                   block_ids=tuple(list(g) for g in block_ids),
                   num_computed_tokens=request.num_computed_tokens,
                   all_token_ids=(list(all_token_ids)
                                  if all_token_ids is not None else None))


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    # requests resumed after a preemption: their new_block_ids replace the
    # block list (vllm/v1/core/sched/output.py)
    resumed_req_ids: set[str] = field(default_factory=set)
    new_token_ids: list[list[int]] = field(default_factory=list)
    all_token_ids: dict[str, list[int]] = field(default_factory=dict)
    new_block_ids: list = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    num_output_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @classmethod
    def make_empty(cls) -> "CachedRequestData":
        return cls()


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict = field(default_factory=dict)
    scheduled_encoder_inputs: dict = field(default_factory=dict)
    num_common_prefix_blocks: list = field(default_factory=list)
    preempted_req_ids: set[str] = field(default_factory=set)
    finished_req_ids: set[str] = field(default_factory=set)
    free_encoder_mm_hashes: list = field(default_factory=list)
    has_sync_kv_loads: bool = False
    kv_connector_metadata: Any = None
    # the model's own bookkeeping (not vLLM's): the step number
    step: int = 0


@dataclass
class KVConnectorOutput:
    finished_sending: set[str] | None = None
    finished_recving: set[str] | None = None
    failed_recving: set[str] = field(default_factory=set)
    prefix_replay_checkpoints: dict = field(default_factory=dict)
    invalid_block_ids: set[int] = field(default_factory=set)
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    kv_connector_worker_meta: Any = None
    expected_finished_count: int = 0

    def is_empty(self) -> bool:
        return (not self.finished_sending and not self.finished_recving
                and not self.failed_recving and not self.invalid_block_ids
                and not self.kv_connector_stats and not self.kv_cache_events
                and not self.kv_connector_worker_meta)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    kv_connector_output: KVConnectorOutput | None = None


# ------------------------------------------------- KV cache config / specs


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int
    dtype: Any
    page_size_padded: int | None = None

    @property
    def page_size_bytes(self) -> int:  # K and V, 2-byte elements here
        return 2 * self.block_size * self.num_kv_heads * self.head_size * 2


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    head_size_v: int | None = None
    # set when vLLM turned a sliding-window layer into full attention (the
    # hybrid KV cache manager off): every block is kept
    sliding_window: int | None = None
    attention_chunk_size: int | None = None


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int = 0


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    shapes: tuple = ()
    dtypes: tuple = ()
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    num_speculative_blocks: int = 0


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheTensor:
    size: int
    shared_by: list[str]  # layers of different groups share one tensor


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]


# ---------------------------------------------------------------- configs


@dataclass
class KVTransferConfig:
    kv_connector: str = "KVBrokerConnector"
    kv_connector_module_path: str = "kvbroker.vllm"
    kv_role: str = "kv_producer"
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_load_failure_policy: str = "recompute"  # or "fail"

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")


@dataclass
class CacheConfig:
    block_size: int = 16
    num_gpu_blocks: int = 64
    enable_prefix_caching: bool = True
    kv_cache_layout: str | None = None


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    rank: int = 0


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 256
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    async_scheduling: bool = False


@dataclass
class ModelConfig:
    max_model_len: int = 4096
    total_num_kv_heads: int = 4
    # MLA: one latent per layer, the same on every TP rank; the config's
    # KV head count (get_total_num_kv_heads) is then not what ranks hold
    use_mla: bool = False

    def get_total_num_kv_heads(self) -> int:
        return self.total_num_kv_heads


@dataclass
class VllmConfig:
    kv_transfer_config: KVTransferConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    use_v2_model_runner: bool = False

    @property
    def max_concurrent_batches(self) -> int:
        return 2 if self.scheduler_config.async_scheduling else 1
