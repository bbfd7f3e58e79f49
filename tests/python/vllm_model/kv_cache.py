# SPDX-License-Identifier: MIT
"""vLLM's block pool and KV cache manager: one KV cache group, or several
(HybridKVCacheManager: vLLM's hybrid memory allocator).

Modelled on vllm/v1/core/block_pool.py and kv_cache_manager.py as the
scheduler at vllm-project/vllm 00f4240ee645 calls them: block 0 is the null
block and never handed out; free blocks sit in an LRU queue (freed requests'
blocks go to its tail in reverse order, so a request's last blocks are
evicted first); full blocks get their chained content hash when cached and
stay findable until reallocated; ``allocate_slots(...,
delay_cache_blocks=True)`` (an async KV load) allocates without hashing, and
``cache_blocks`` hashes later; ``get_computed_blocks`` never covers the last
token (it must be computed to sample); the local hit is a whole number of
blocks.

Hybrid (several groups over the one block pool, as vLLM's
HybridKVCacheCoordinator and SingleTypeKVCacheManagers): block ids per group;
a sliding-window group frees the blocks its window no longer reaches
(``remove_skipped_blocks``: the first ``max(0, n - window + 1) //
block_size`` blocks of n computed tokens become the null block) when
``allocate_slots`` runs and before the connector's request_finished call,
and an allocation with external (connector) tokens pads the skipped blocks
with the null block and allocates only the rest
(``allocate_new_computed_blocks``). Local prefix-cache hits: each group's
blocks cached under their group; the hit is the full-attention groups'
longest prefix, cut to what every sliding-window group can serve (its
``cdiv(window - 1, block_size)`` blocks before the hit's end all cached,
searched right to left, else the cached blocks from the start:
SlidingWindowManager.find_longest_cache_hit), without EAGLE.
"""

from __future__ import annotations

from collections import OrderedDict

from .objects import Request, cdiv


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None

    def __repr__(self):
        return "Block(%d, ref=%d, %s)" % (self.block_id, self.ref_cnt,
                                          "hashed" if self.block_hash
                                          else "-")


class KVCacheBlocks:
    """vllm/v1/core/kv_cache_manager.py KVCacheBlocks: a list of blocks per
    KV cache group (``KVCacheBlocks(blocks)``: one group;
    ``KVCacheBlocks.groups(lists)``: several)."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self.blocks = (list(blocks),)

    @classmethod
    def groups(cls, lists) -> "KVCacheBlocks":
        kb = cls([])
        kb.blocks = tuple(list(g) for g in lists)
        return kb

    def get_block_ids(self, allow_none: bool = False):
        if allow_none and all(not g for g in self.blocks):
            return None
        return tuple([b.block_id for b in g] for g in self.blocks)

    def get_block_ids_flat(self) -> list[int]:
        assert len(self.blocks) == 1, "only one group"
        return [b.block_id for b in self.blocks[0]]

    def get_unhashed_block_ids(self) -> list[int]:
        assert len(self.blocks) == 1, "only one group"
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        return [[b.block_id for b in g if b.block_hash is None and
                 b.block_id != NULL_BLOCK_ID] for g in self.blocks]

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks.groups(a + b for a, b in zip(self.blocks,
                                                          other.blocks))

    def __len__(self):
        return len(self.blocks[0])


NULL_BLOCK_ID = 0  # BlockPool: the first block, never handed out


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool):
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.enable_caching = enable_caching
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks)
        self.null_block = self.free_queue.popitem(last=False)[1]
        self.cached: dict[int, dict[int, KVCacheBlock]] = {}
        self.num_evicted = 0

    def get_num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_cached_block(self, h: int) -> KVCacheBlock | None:
        d = self.cached.get(h)
        return next(iter(d.values())) if d else None

    def _evict(self, b: KVCacheBlock) -> None:
        if b.block_hash is None:
            return
        d = self.cached.get(b.block_hash)
        if d is not None:
            d.pop(b.block_id, None)
            if not d:
                del self.cached[b.block_hash]
        b.block_hash = None
        self.num_evicted += 1

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        assert n <= len(self.free_queue)
        out = []
        for _ in range(n):
            _, b = self.free_queue.popitem(last=False)
            self._evict(b)
            assert b.ref_cnt == 0
            b.ref_cnt = 1
            out.append(b)
        return out

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        for b in blocks:
            if b.ref_cnt == 0:
                self.free_queue.pop(b.block_id, None)
            b.ref_cnt += 1

    def free_blocks(self, ordered: list[KVCacheBlock]) -> None:
        for b in ordered:
            b.ref_cnt -= 1
            assert b.ref_cnt >= 0, b
            if b.ref_cnt == 0 and b is not self.null_block:
                self.free_queue[b.block_id] = b

    def cache_block(self, b: KVCacheBlock, h: int) -> None:
        if b.block_hash is not None:
            return
        b.block_hash = h
        self.cached.setdefault(h, {})[b.block_id] = b

    def evict_blocks(self, ids: set[int]) -> None:
        for i in ids:
            self._evict(self.blocks[i])


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int,
                 enable_caching: bool = True, max_model_len: int = 1 << 20):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.empty_kv_cache_blocks = KVCacheBlocks([])

    @property
    def usage(self) -> float:
        n = len(self.block_pool.blocks) - 1
        return 1.0 - self.block_pool.get_num_free_blocks() / n

    def get_computed_blocks(self, request: Request
                            ) -> tuple[KVCacheBlocks, int]:
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        max_hit = (request.num_tokens - 1) // self.block_size
        hit = []
        for h in request.block_hashes[:max_hit]:
            b = self.block_pool.get_cached_block(h)
            if b is None:
                break
            hit.append(b)
        return KVCacheBlocks(hit), len(hit) * self.block_size

    def truncate_computed_blocks(self, blocks: KVCacheBlocks,
                                 num_tokens: int) -> KVCacheBlocks:
        return KVCacheBlocks(blocks.blocks[0][:num_tokens // self.block_size])

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False
                       ) -> KVCacheBlocks | None:
        rid = request.request_id
        new_computed = list(new_computed_blocks.blocks[0]) \
            if new_computed_blocks is not None else []
        have = self.req_to_blocks.get(rid, [])
        num_computed = (request.num_computed_tokens + num_new_computed_tokens
                        + num_external_computed_tokens)
        need_slots = min(num_computed + num_new_tokens + num_lookahead_tokens,
                         self.max_model_len)
        n_new = max(0, cdiv(need_slots, self.block_size) - len(have) -
                    len(new_computed))
        evictable = sum(1 for b in new_computed if b.ref_cnt == 0)
        if n_new + evictable > self.block_pool.get_num_free_blocks():
            return None
        self.block_pool.touch(new_computed)
        blocks = self.req_to_blocks.setdefault(rid, [])
        blocks.extend(new_computed)
        if new_computed:
            self.num_cached_block[rid] = len(blocks)
        new = self.block_pool.get_new_blocks(n_new)
        blocks.extend(new)
        if self.enable_caching and not delay_cache_blocks:
            self.cache_blocks(request, min(num_computed + num_new_tokens,
                                           request.num_tokens))
        return KVCacheBlocks(new)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid, [])
        hashes = request.block_hashes
        done = self.num_cached_block.get(rid, 0)
        full = min(num_computed_tokens // self.block_size, len(blocks),
                   len(hashes))
        for i in range(done, full):
            self.block_pool.cache_block(blocks[i], hashes[i])
        self.num_cached_block[rid] = max(done, full)

    def free(self, request: Request) -> None:
        blocks = self.pop_blocks_for_free(request)
        self.block_pool.free_blocks(list(reversed(blocks)))

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        self.num_cached_block.pop(request.request_id, None)
        return self.req_to_blocks.pop(request.request_id, [])

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.req_to_blocks.get(request_id, []))

    def get_block_ids(self, request_id: str) -> tuple[list[int]]:
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id: str,
                                          num_computed_tokens: int
                                          ) -> tuple[list[int]]:
        ids = self.get_block_ids(request_id)[0]
        return (ids[:cdiv(num_computed_tokens, self.block_size)],)

    def evict_blocks(self, ids: set[int]) -> None:
        self.block_pool.evict_blocks(ids)

    def take_events(self):
        return None


class HybridKVCacheManager(KVCacheManager):
    """Several KV cache groups over one block pool (vLLM's
    HybridKVCacheCoordinator): ``windows`` holds each group's sliding
    window (0: full attention), in the groups' order."""

    def __init__(self, num_blocks: int, block_size: int, windows: list[int],
                 enable_caching: bool = True, max_model_len: int = 1 << 20):
        super().__init__(num_blocks, block_size, enable_caching,
                         max_model_len)
        self.windows = list(windows)
        self.null = self.block_pool.null_block
        self.req_groups: dict[str, list[list[KVCacheBlock]]] = {}
        self.empty_kv_cache_blocks = KVCacheBlocks.groups(
            [] for _ in self.windows)

    def _skipped(self, g: int, num_computed_tokens: int) -> int:
        """SlidingWindowManager.get_num_skipped_tokens // block_size."""
        w = self.windows[g]
        if not w:
            return 0
        return max(0, num_computed_tokens - w + 1) // self.block_size

    def _cached(self, g: int, h: int) -> KVCacheBlock | None:
        return self.block_pool.get_cached_block(hash((g, h)))

    def get_computed_blocks(self, request: Request):
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        hashes = request.block_hashes
        hit = (request.num_tokens - 1) // self.block_size
        per: list[list[KVCacheBlock]] = [[] for _ in self.windows]
        for g, w in enumerate(self.windows):  # full attention: a prefix
            if w:
                continue
            for h in hashes[:hit]:
                b = self._cached(g, h)
                if b is None:
                    break
                per[g].append(b)
            hit = min(hit, len(per[g]))
        for g, w in enumerate(self.windows):  # sliding window: its window
            if not w:
                continue
            need = cdiv(w - 1, self.block_size)
            comp = [self.null] * hit
            run, found = 0, False
            for i in range(hit - 1, -1, -1):
                b = self._cached(g, hashes[i])
                if b is None:
                    run = 0
                    continue
                comp[i] = b
                run += 1
                if run >= need:
                    del comp[i + run:]
                    found = True
                    break
            if not found:
                del comp[run:]
            per[g] = comp
            hit = min(hit, len(comp))
        per = [lst[:hit] for lst in per]
        return KVCacheBlocks.groups(per), hit * self.block_size

    def truncate_computed_blocks(self, blocks, num_tokens: int):
        return KVCacheBlocks.groups(
            lst[:num_tokens // self.block_size] for lst in blocks.blocks)

    def remove_skipped_blocks(self, request_id: str,
                              num_computed_tokens: int) -> None:
        for g, blocks in enumerate(self.req_groups.get(request_id, ())):
            removed = []
            for i in range(min(self._skipped(g, num_computed_tokens),
                               len(blocks)) - 1, -1, -1):
                if blocks[i] is self.null:
                    break  # the ones before were nulled earlier
                removed.append(blocks[i])
                blocks[i] = self.null
            self.block_pool.free_blocks(removed)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False
                       ) -> KVCacheBlocks | None:
        rid = request.request_id
        total_computed = (request.num_computed_tokens +
                          num_new_computed_tokens +
                          num_external_computed_tokens)
        self.remove_skipped_blocks(rid, total_computed)
        need_slots = min(total_computed + num_new_tokens +
                         num_lookahead_tokens, self.max_model_len)
        have = self.req_groups.get(rid)
        hits = [list(x) for x in new_computed_blocks.blocks] \
            if new_computed_blocks is not None and have is None else \
            [[] for _ in self.windows]
        n_new = 0
        for g in range(len(self.windows)):
            n_have = (len(have[g]) if have else 0) + len(hits[g])
            skip = self._skipped(g, total_computed)
            n_new += max(0, cdiv(need_slots, self.block_size) -
                         max(skip, n_have))
            n_new += sum(1 for b in hits[g][skip:]
                         if b is not self.null and b.ref_cnt == 0)
        if n_new > self.block_pool.get_num_free_blocks():
            return None
        if have is None:  # a new request: skipped blocks are null
            have = self.req_groups[rid] = []
            for g in range(len(self.windows)):
                skip = self._skipped(g, total_computed)
                kept = hits[g][skip:]
                self.block_pool.touch([b for b in kept
                                       if b is not self.null])
                lst = [self.null] * skip + kept
                if num_external_computed_tokens > 0:
                    lst += self.block_pool.get_new_blocks(
                        cdiv(total_computed, self.block_size) - len(lst))
                have.append(lst)
            self.num_cached_block[rid] = 0
        new = []
        for lst in have:
            k = cdiv(need_slots, self.block_size) - len(lst)
            got = self.block_pool.get_new_blocks(k) if k > 0 else []
            lst.extend(got)
            new.append(got)
        self.req_to_blocks[rid] = [b for lst in have for b in lst
                                   if b is not self.null]
        if self.enable_caching and not delay_cache_blocks:
            self.cache_blocks(request, min(total_computed + num_new_tokens,
                                           request.num_tokens))
        return KVCacheBlocks.groups(new)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        rid = request.request_id
        hashes = request.block_hashes
        full = min(num_computed_tokens // self.block_size, len(hashes))
        for g, lst in enumerate(self.req_groups.get(rid, ())):
            for i in range(min(full, len(lst))):
                if lst[i] is not self.null:
                    # per-group hashes: a block of one group is never found
                    # for another (vLLM keys the cache by group too)
                    self.block_pool.cache_block(lst[i],
                                                hash((g, hashes[i])))

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        rid = request.request_id
        self.num_cached_block.pop(rid, None)
        self.req_to_blocks.pop(rid, None)
        groups = self.req_groups.pop(rid, [])
        return [b for lst in groups for b in lst if b is not self.null]

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        groups = self.req_groups.get(request_id)
        if groups is None:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks.groups(groups)

    def get_block_ids_for_computed_tokens(self, request_id: str,
                                          num_computed_tokens: int):
        n = cdiv(num_computed_tokens, self.block_size)
        return tuple(ids[:n] for ids in self.get_block_ids(request_id))
