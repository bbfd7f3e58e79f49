# SPDX-License-Identifier: MIT
"""The KV cache groups of a hybrid model (vLLM's hybrid memory allocator).

vLLM hands every connector instance its ``kv_cache_config`` (a KVCacheConfig,
the constructor's third argument, in the scheduler and in every worker). Its
``kv_cache_groups`` list one KVCacheGroupSpec per group: ``layer_names`` and
a ``kv_cache_spec``. Block ids come per group (a tuple of lists, in the
groups' order), from one shared block pool: block 0 is the null block that
stands for a block a group freed or never needed.

What the connector moves, per kind of group:

- full attention (FullAttentionSpec, MLAAttentionSpec, any AttentionSpec
  that is not windowed): every block of the prompt;
- sliding window (SlidingWindowSpec and its subclasses): only the blocks
  the next token's window reaches. vLLM frees the others
  (``remove_skipped_blocks``: the first ``max(0, n - window + 1) //
  block_size`` blocks of n computed tokens become null) in P before it
  calls ``request_finished_all_groups`` and in D when it allocates the
  load, so both sides hold exactly those;
- Mamba / linear-attention state (MambaSpec), chunked local attention and
  anything else: refused, with the reason.

A FullAttentionSpec can carry a ``sliding_window`` (vLLM sets it on a
sliding-window layer it turned into full attention when the hybrid
allocator is off): such a group keeps all its blocks and moves all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NULL_BLOCK = 0  # vLLM's BlockPool: the first block, never handed out


class GroupsError(ValueError):
    """A KV cache group this connector cannot move."""


@dataclass(frozen=True)
class Group:
    layer_names: tuple[str, ...]
    window: int  # sliding window in tokens; 0: full attention
    kind: str  # the spec's class name, for messages


def _mro_names(spec: Any) -> list[str]:
    return [c.__name__ for c in type(spec).__mro__]


def classify(spec: Any, where: str = "") -> int:
    """A group's spec -> its sliding window (0: full attention), or
    GroupsError naming what is not supported."""
    names = _mro_names(spec)
    kind = names[0]
    what = (" (%s)" % where) if where else ""
    if "MambaSpec" in names or any("Mamba" in n or "Linear" in n
                                   for n in names):
        raise GroupsError(
            "KV cache group%s is %s: Mamba / linear-attention state groups "
            "are not supported by KVBrokerConnector (it moves attention KV "
            "blocks only; a state group needs its last state block moved "
            "and its prefix-cache alignment kept, which it does not do)"
            % (what, kind))
    if "ChunkedLocalAttentionSpec" in names:
        raise GroupsError(
            "KV cache group%s is %s: chunked local attention is not "
            "supported by KVBrokerConnector (only full attention and "
            "sliding window groups are)" % (what, kind))
    if "SlidingWindowSpec" in names:
        w = getattr(spec, "sliding_window", None)
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise GroupsError("KV cache group%s is %s with sliding_window "
                              "%r" % (what, kind, w))
        return w
    if "AttentionSpec" in names:
        return 0
    raise GroupsError(
        "KV cache group%s is %s: not an attention KV cache; "
        "KVBrokerConnector moves full attention and sliding window groups "
        "only" % (what, kind))


def parse_groups(kv_cache_config: Any) -> list[Group]:
    """kv_cache_config.kv_cache_groups -> [Group], [] when vLLM gave no
    config (one group, every layer: the connector's behaviour before
    hybrid models). GroupsError for a group it cannot move."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if not groups:
        return []
    out = []
    for i, g in enumerate(groups):
        spec = getattr(g, "kv_cache_spec", None)
        names = tuple(getattr(g, "layer_names", None) or ())
        window = classify(spec, "%d of %d" % (i, len(groups)))
        out.append(Group(names, window, type(spec).__name__))
    return out


def skipped_blocks(window: int, num_tokens: int, block_size: int) -> int:
    """Leading blocks of a request of num_tokens computed tokens that a
    sliding-window group no longer holds (vLLM's get_num_skipped_tokens //
    block_size); 0 for full attention."""
    if window <= 0:
        return 0
    return max(0, num_tokens - window + 1) // block_size


def sub_transfer_id(transfer_id: str, group: int) -> str:
    """The broker transfer that carries one group of a request: the
    request's own id for group 0, ``<id>#g<k>`` for group k (the broker
    maps one block list to every layer of a transfer, so each group's
    blocks travel in their own)."""
    return transfer_id if group == 0 else "%s#g%d" % (transfer_id, group)
