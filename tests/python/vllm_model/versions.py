# SPDX-License-Identifier: MIT
"""How each vLLM version from 0.25 to 0.32 drives a V1 KV connector.

Every fact names the vLLM file and commit it was read from. Two vLLM trees
were read in full for the connector's part:

- NEWEST = vllm-project/vllm 00f4240ee6458263d76cf51ca7901ce1350bb4d1 (about
  late September 2026; after 0.30.0, with the contract of 0.31/0.32):
  vllm/distributed/kv_transfer/kv_connector/v1/base.py,
  vllm/v1/core/sched/scheduler.py, vllm/v1/worker/gpu/kv_connector.py,
  vllm/v1/worker/kv_connector_model_runner_mixin.py.
- MID = vllm-project/vllm 003df2961dd8830c317a61f9745ccd557da9fa06 (a mid
  August 2026 tree, between 0.27.1 and 0.29: no has_sync_kv_loads yet):
  base.py (get_finished only: no get_transfer_results, finish_forward,
  bind_kv_cache_manager or KVConnectorTransferResults; bind_gpu_block_pool,
  requires_kv_delivery) and scheduler.py (bind_gpu_block_pool, V2 resumed
  requests in scheduled_new_reqs, the block-aligned local hit, the asserts,
  request_finished with the computed tokens' blocks, defer_block_free).
- Older runners were read only in copies of vLLM's files whose commit the
  index does not name (forks that vendor vllm/v1/worker/gpu/kv_connector.py
  and gpu_model_runner.py). Where a version's fact rests on such a copy, or on
  no source at all, ``unverified`` says so and the value is the nearest
  known one (named).

The layout vocabulary of 0.29+ is vllm/v1/kv_cache_layout.py at
vllm-project/vllm 14f7a27c776bd0c423bbc155b25ce21ee5a839da (KVCacheLayout:
stride permutations of the logical [L, B, H, N, C]); the per-layer views are
``create_kv_cache_views`` of vllm/v1/kv_cache_interface.py after the layout
standardization (read in a copy whose commit is not named; the stored
vllm-project copy 001cabc1be16 still has the older ``shared_by`` tensors).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

NEWEST = "00f4240ee6458263d76cf51ca7901ce1350bb4d1"
MID = "003df2961dd8830c317a61f9745ccd557da9fa06"
LAYOUT_COMMIT = "14f7a27c776bd0c423bbc155b25ce21ee5a839da"

F_BASE = "vllm/distributed/kv_transfer/kv_connector/v1/base.py"
F_SCHED = "vllm/v1/core/sched/scheduler.py"
F_V2 = "vllm/v1/worker/gpu/kv_connector.py"
F_V1 = "vllm/v1/worker/kv_connector_model_runner_mixin.py"
F_V1_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
F_IFACE = "vllm/v1/kv_cache_interface.py"
F_LAYOUT = "vllm/v1/kv_cache_layout.py"

V1, V2 = "v1", "v2"
# KV cache forms handed to register_kv_caches
FORM_5D = "5d"  # one tensor per layer, the attention backend's 5-D shape
FORM_VIEWS = "views"  # one int8 buffer, per-layer 4-D [B, H, N, C] views


@dataclass(frozen=True)
class Version:
    name: str  # "0.29"
    default_runner: str  # V1 (mixin) or V2 (gpu/kv_connector.py)
    # start_load_kv: "before" the forward always, or "after" it unless the
    # step has sync loads (SchedulerOutput.has_sync_kv_loads)
    start_load: str
    # wait_for_save on a step with no tokens (V1 kv_connector_no_forward,
    # V2 no_forward)
    wait_for_save_on_empty: dict = field(default_factory=dict)  # runner->bool
    # V2 pre_forward: "handle_then_bind" or "bind_then_handle"; V1 calls
    # handle_preemptions at the top of execute_model (before bind, every
    # step, empty ones too)
    v2_preempt_order: str = "handle_then_bind"
    # the runners call get_transfer_results (True) or get_finished (False);
    # the base class has get_transfer_results wrapping get_finished where True
    transfer_results: bool = True
    finish_forward: bool = True  # V2 calls finish_forward after the forward
    kv_form: str = FORM_VIEWS
    default_layout: str = "LBNHC"  # FORM_VIEWS: KVCacheLayout; 5D: NHD/HND
    # V2: a resumed (preempted) request comes in scheduled_new_reqs with all
    # its block ids; V1: in scheduled_cached_reqs.resumed_req_ids, its
    # new_block_ids replacing the request's list
    v2_resumed_as_new: bool = True
    has_sync_kv_loads: bool = True  # SchedulerOutput field exists
    # the scheduler binds the manager (bind_kv_cache_manager) or the block
    # pool (bind_gpu_block_pool); reports failed_recving
    bind_kv_cache_manager: bool = True
    failed_recving: bool = True
    sources: tuple = ()
    unverified: tuple = ()

    def wait_for_save_empty(self, runner: str) -> bool:
        return self.wait_for_save_on_empty[runner]

    @property
    def key(self) -> str:
        return self.name


_SRC_NEWEST = (
    "%s@%s: KVConnectorBase_V1 members, get_transfer_results wraps "
    "get_finished" % (F_BASE, NEWEST),
    "%s@%s: pre_forward = handle_preemptions, bind, start_load_kv only if "
    "has_sync_kv_loads; finish_forward; post_forward = pending start_load_kv, "
    "wait_for_save, get_transfer_results, get_block_ids_with_load_errors, "
    "stats, events, worker meta, clear; no_forward = pre + finish + post "
    "(wait_for_save on empty steps)" % (F_V2, NEWEST),
    "%s@%s: bind; start_load_kv before the forward only with sync loads, "
    "else after it; wait_for_save (not deferred); get_transfer_results; "
    "kv_connector_no_forward runs the same context (wait_for_save included)"
    % (F_V1, NEWEST),
    "%s@%s: has_sync_kv_loads, V2 resumed requests in scheduled_new_reqs, "
    "get_num_new_matched_tokens(request, block-aligned local hit), "
    "_update_from_kv_xfer_finished asserts, _connector_finished block ids "
    "for computed tokens, finish_requests delay_free_blocks for "
    "WAITING_FOR_REMOTE_KVS, requires_kv_delivery -> drop_stale_output, "
    "defer_block_free for consumers with max_concurrent_batches > 1, "
    "failed_recving, kv_load_failure_policy" % (F_SCHED, NEWEST),
)

_UNVERIFIED_V1_PREEMPT = (
    "V1 handle_preemptions(meta) at the top of %s execute_model (every "
    "step, empty ones too, before _update_states and bind): read in copies "
    "of that file whose commit is not named; vllm-project's copy at %s was "
    "not available" % (F_V1_RUNNER, NEWEST),
)
_UNVERIFIED_FINISH_FORWARD = (
    "V2 finish_forward after a forward with tokens: %s@%s calls it on "
    "no_forward and exposes ActiveKVConnector.finish_forward; the model "
    "runner that calls it after the forward was not read at that commit"
    % (F_V2, NEWEST),
)

_UNVERIFIED_OLD_RUNNER = _UNVERIFIED_V1_PREEMPT + (
    "start_load_kv always before the forward, get_finished (no "
    "get_transfer_results), no finish_forward: not read at a vllm-project "
    "commit of this version; taken from copies of the pre-0.29 V1 mixin and "
    "V2 kv_connector.py (commit not named) in which pre_forward is bind -> "
    "handle_preemptions -> start_load_kv and no_forward passes "
    "wait_for_save=False; other copies without has_sync_kv_loads already "
    "call handle_preemptions before bind, so which order 0.25-0.28 ship is "
    "not proven (the table keeps bind first)",
)


def _old(name: str) -> Version:
    return Version(
        name=name, default_runner=V1, start_load="before",
        wait_for_save_on_empty={V1: False, V2: False},
        v2_preempt_order="bind_then_handle", transfer_results=False,
        finish_forward=False, kv_form=FORM_5D, default_layout="NHD",
        v2_resumed_as_new=True, has_sync_kv_loads=False,
        bind_kv_cache_manager=False, failed_recving=False,
        sources=(
            "%s@%s: get_finished, bind_gpu_block_pool, no finish_forward, "
            "no KVConnectorTransferResults (failed_recving)" % (F_BASE, MID),
            "%s@%s: no has_sync_kv_loads; bind_gpu_block_pool; V2 resumed "
            "requests in scheduled_new_reqs; get_num_new_matched_tokens("
            "request, block-aligned local hit); _update_from_kv_xfer_finished"
            " asserts; request_finished(get_block_ids_for_computed_tokens); "
            "requires_kv_delivery, defer_block_free" % (F_SCHED, MID),
        ),
        unverified=_UNVERIFIED_OLD_RUNNER + (
            "default runner V1: Model Runner V2 was experimental and off by "
            "default before 0.28/0.29 (release notes, not source)",
            "5-D per-layer KV tensors (2, num_blocks, block_size, heads, "
            "head_dim) / (num_blocks, 2, ...): the attention backends' "
            "shapes before the layout standardization (stored "
            "vllm-project copy of %s at 001cabc1be16 has per-layer "
            "KVCacheTensor.shared_by)" % F_IFACE,
            "%s: the scheduler facts are those of %s (nearest known; the "
            "release itself was not read)" % (name, MID),
        ))


VERSIONS: dict[str, Version] = {}
for _n in ("0.25", "0.26", "0.27"):
    VERSIONS[_n] = _old(_n)
VERSIONS["0.28"] = replace(
    _old("0.28"),
    unverified=_old("0.28").unverified + (
        "0.28 made Model Runner V2 the default for dense models according to "
        "release notes (not source); the table keeps V1 as 0.28's default "
        "runner and the tests also run 0.28 under V2",))
# 0.29: the after-forward start (has_sync_kv_loads), the int8 view layout
# and V2 by default arrived together; the runners still call get_finished
# and V2's no_forward still skips wait_for_save (a V2 kv_connector.py copy
# with has_sync_kv_loads but get_finished and wait_for_save=False on
# no_forward, commit not named)
VERSIONS["0.29"] = Version(
    name="0.29", default_runner=V2, start_load="after",
    wait_for_save_on_empty={V1: False, V2: False},
    v2_preempt_order="handle_then_bind", transfer_results=False,
    finish_forward=False, kv_form=FORM_VIEWS, default_layout="LBNHC",
    bind_kv_cache_manager=False, failed_recving=False,
    sources=_SRC_NEWEST[3:] + (
        "%s@%s: LBHNC LBNHC LHBNC BLHNC BLNHC BHLNC" % (F_LAYOUT,
                                                          LAYOUT_COMMIT),),
    unverified=_UNVERIFIED_V1_PREEMPT + (
        "0.29's runner: an intermediate V2 kv_connector.py (commit not "
        "named) with has_sync_kv_loads, handle_preemptions before bind, "
        "get_finished and no_forward(wait_for_save=False); which release "
        "first shipped get_transfer_results is not proven (nearest: absent "
        "in that copy, present at %s)" % NEWEST,
        "the int8 [B, H, N, C] views: create_kv_cache_views read in a copy "
        "of %s whose commit is not named" % F_IFACE,
    ))
for _n in ("0.30", "0.31", "0.32"):
    VERSIONS[_n] = Version(
        name=_n, default_runner=V2, start_load="after",
        wait_for_save_on_empty={V1: True, V2: True},
        v2_preempt_order="handle_then_bind", transfer_results=True,
        finish_forward=True, kv_form=FORM_VIEWS, default_layout="LBNHC",
        sources=_SRC_NEWEST,
        unverified=_UNVERIFIED_V1_PREEMPT + _UNVERIFIED_FINISH_FORWARD + ((
            "%s: its contract is that of %s (the newest tree read); that "
            "%s is 0.31 or 0.32 exactly is not proven" % (_n, NEWEST, NEWEST),
        ) if _n != "0.30" else (
            "0.30: get_transfer_results, failed_recving, "
            "bind_kv_cache_manager and wait_for_save on empty steps taken "
            "from %s (nearest known; 0.30.0 was not read)" % NEWEST,)))

ALL = tuple(VERSIONS)

# the hybrid KV cache manager (kv_cache.HybridKVCacheManager and the
# scheduler's HMA calls), the same for every version the connector declares
# SupportsHMA on (0.30+, where failed_recving exists)
F_STKM = "vllm/v1/core/single_type_kv_cache_manager.py"
HYBRID_SOURCES = (
    "%s@%s: _connector_finished calls request_finished_all_groups(request, "
    "block ids of every group) for a SupportsHMA connector, else asserts "
    "one group; _handle_invalid_blocks raises RuntimeError with more than "
    "one KV cache group (connectors report failed_recving)" % (F_SCHED,
                                                               NEWEST),
    "%s@002f34915134cfd1a7d6ed777edd67dcc2289466: SlidingWindowManager."
    "remove_skipped_blocks: blocks before (n - sliding_window + 1) // "
    "block_size become the null block and are freed" % F_STKM,
)
HYBRID_UNVERIFIED = (
    "SlidingWindowManager.get_num_skipped_tokens = max(0, n - window + 1) "
    "and allocate_new_computed_blocks padding an external (connector) "
    "load's skipped blocks with the null block: read in copies of %s whose "
    "commit is not named (a downstream mirror of the newer manager)" %
    F_STKM,
    "the group order (full attention first) and one KV cache tensor shared "
    "by a layer of each group: vLLM's uniform-page-size hybrid config as "
    "documented, not read at a named commit; the connector reads the "
    "groups from the config and does not depend on either",
)


def get(name: str) -> Version:
    return VERSIONS[name]


def table() -> str:
    """The table as text (for reports)."""
    rows = ["version runner start_load  wfs_empty(V1/V2) preempt(V2)       "
            "results  kv_form layout resumed(V2)"]
    for v in VERSIONS.values():
        rows.append("%-7s %-6s %-11s %-16s %-17s %-8s %-7s %-6s %s" % (
            v.name, v.default_runner, v.start_load,
            "%s/%s" % (v.wait_for_save_on_empty[V1],
                       v.wait_for_save_on_empty[V2]),
            v.v2_preempt_order,
            "get_transfer_results" if v.transfer_results else "get_finished",
            v.kv_form, v.default_layout,
            "new_reqs" if v.v2_resumed_as_new else "cached"))
    return "\n".join(rows)
