# SPDX-License-Identifier: MIT
"""A vLLM GPU worker (one TP rank), as a forked process, driving the
connector's worker half in the version's runner order.

Runner orders (versions.py names the sources):

V1 (vllm/v1/worker/gpu_model_runner.py execute_model +
kv_connector_model_runner_mixin.py):
  handle_preemptions(meta)                 every step, empty ones too
  bind_connector_metadata(meta)
  start_load_kv(ctx)                       before the forward (<= 0.28;
                                           >= 0.29 only with sync loads)
  forward: per layer wait_for_layer_load, the layer's KV written,
           save_kv_layer(name, kv_layer, attn_metadata)
  start_load_kv(ctx)                       after it (>= 0.29, no sync load)
  wait_for_save()                          (empty steps: version)
  get_transfer_results(finished) | get_finished(finished)
  get_block_ids_with_load_errors(), stats, events, worker meta
  clear_connector_metadata()

V2 (vllm/v1/worker/gpu/kv_connector.py ActiveKVConnector):
  pre_forward: handle_preemptions + bind (order: version), start_load_kv
               (before: <= 0.28; >= 0.29 only with sync loads)
  forward (as above); finish_forward() (newest)
  post_forward: pending start_load_kv, wait_for_save, results, errors,
                stats, events, worker meta, clear
  no_forward (0 tokens) = pre_forward + finish_forward + post_forward
  (wait_for_save on it: version)

The KV caches are broker memory (Client.alloc of the connector's own
client, Region.as_torch), in the version's form:

- "5d": one region per layer, (2, num_blocks, block_size, heads, head_dim)
  (FlashAttention; NHD strides, or HND: heads before tokens in memory) or
  (num_blocks, 2, block_size, heads, head_dim) (FlashInfer);
- "views": ONE int8 region for all layers and per-layer 4-D [B, H, N, C]
  ``as_strided`` views made as vLLM's create_kv_cache_views makes them: the
  logical [L, B, H, N, C] in bytes, strides from the KVCacheLayout's
  permutation (LBNHC default; LBHNC, LHBNC, BLHNC, BLNHC, BHLNC), K and V
  packed in C (C = head_size + head_size_v), kernel-block granular
  (B = num_blocks * block_size / kernel_block_size, the block stride divided
  by that ratio), viewed as the model dtype.

A hybrid model (a kv_cache_config with several groups): each layer's
group gives its block list; layers that share a KVCacheTensor (one of each
group) share one cache tensor (the same region, the same view), as vLLM
allocates them; the forward never writes the null block.

The "forward" writes, for each token computed this step, a pattern of
(token id, position, layer, K/V and dim, global head, writer salt) into its
slot; the test harness tells a worker which loads to check and the worker
checks every byte once the connector reports the load.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from math import prod
from typing import Any

LAYOUT_ORDER = {  # vllm/v1/kv_cache_layout.py KVCacheLayout (L B H N C)
    "LBHNC": (0, 1, 2, 3, 4), "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4), "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4), "BHLNC": (1, 2, 0, 3, 4),
    "NHD": (0, 1, 3, 2, 4), "HND": (0, 1, 2, 3, 4),
}
P_MOD = 32749


def layer_name(i: int) -> str:
    return "model.layers.%d.self_attn.attn" % i


def sample_token(tokens: list[int]) -> int:
    """The model's next token: a function of the sequence so far."""
    return (hash(tuple(tokens)) & 0x7FFF) + 1


# ------------------------------------------------------------- KV caches


def layout_strides(shape, order, fixed=(None,) * 5):
    """Byte strides of logical [L, B, H, N, C] under a stride permutation
    (compute_layout_strides, without page padding)."""
    strides = [0] * 5
    cur = 1
    for dim in reversed(order):
        strides[dim] = fixed[dim] or cur
        cur = strides[dim] * shape[dim]
    return strides


class KVCaches:
    """One worker's KV caches in a version's form, over broker memory."""

    def __init__(self, torch, client, spec: dict):
        import kvbroker

        self.torch = torch
        self.form = spec["form"]
        self.layout = spec["layout"]
        self.backend = spec.get("backend", "flash")
        self.L = spec["layers"]
        self.NB = spec["num_blocks"]
        self.BS = spec["block_size"]
        self.H = spec["heads"]
        self.D = spec["head_dim"]
        self.KBS = spec.get("kernel_block_size") or self.BS
        self.mla = bool(spec.get("mla"))
        if self.mla and self.H != 1:
            raise ValueError("an MLA model holds one latent (heads=1)")
        # the layers' KV cache groups and the tensor each layer uses (from
        # the KVCacheConfig: a tensor is shared by one layer of each group)
        kcc = spec.get("kv_cache_config")
        groups = getattr(kcc, "kv_cache_groups", None) or []
        names = [layer_name(i) for i in range(self.L)]
        gof = {n: g for g, grp in enumerate(groups) for n in grp.layer_names}
        self.layer_group = [gof.get(n, 0) for n in names]
        self.windows = [getattr(grp.kv_cache_spec, "sliding_window", 0) or 0
                        if type(grp.kv_cache_spec).__name__ ==
                        "SlidingWindowSpec" else 0 for grp in groups] or [0]
        tensors = getattr(kcc, "kv_cache_tensors", None) or \
            [type("T", (), {"shared_by": [n]}) for n in names]
        mem = {n: t for t, kt in enumerate(tensors) for n in kt.shared_by}
        self.mem_of = [mem[n] for n in names]
        self.LM = len(tensors)
        self.dtype = torch.int16
        self.regions = []
        self.caches: dict[str, Any] = {}
        flags = kvbroker.MEM_REMOTE_WRITE | kvbroker.MEM_REMOTE_READ
        if self.form == "5d":
            views = []
            for mi in range(self.LM):
                n = 2 * self.NB * self.BS * self.H * self.D
                r = client.alloc(n * 2, flags, mi)
                self.regions.append(r)
                flat = r.as_torch(torch.int16, (n,))
                views.append(self._view_5d(flat))
            for li in range(self.L):
                self.caches[layer_name(li)] = views[self.mem_of[li]]
        else:
            self._make_views(client, flags)

    def _view_5d(self, flat):
        NB, BS, H, D = self.NB, self.BS, self.H, self.D
        if self.mla:  # (num_blocks, block_size, latent_dim)
            return flat.view(NB, BS, 2 * D)
        if self.backend == "flashinfer":  # (num_blocks, 2, BS, H, D)
            shape = (NB, 2, BS, H, D)
            if self.layout == "HND":  # memory (NB, 2, H, BS, D)
                return flat.view(NB, 2, H, BS, D).permute(0, 1, 3, 2, 4)
            return flat.view(shape)
        if self.layout == "HND":  # memory (2, NB, H, BS, D)
            return flat.view(2, NB, H, BS, D).permute(0, 1, 3, 2, 4)
        return flat.view(2, NB, BS, H, D)

    def _make_views(self, client, flags):
        torch = self.torch
        order = LAYOUT_ORDER[self.layout]
        esz = 2
        cbytes = 2 * self.D * esz  # head_size + head_size_v, in bytes
        page = self.H * self.BS * cbytes
        # the KVCacheTensor: placement of the group's L layers x NB blocks
        # (manager blocks) in one int8 allocation
        mshape = (self.LM, self.NB, self.H, self.BS, cbytes)
        ms = layout_strides(mshape, order)
        layer_stride, block_stride = ms[0], ms[1]
        size = self.LM * self.NB * page
        r = client.alloc(size, flags, 0)
        self.regions.append(r)
        raw = r.as_torch(torch.int8, (size,))
        ratio = self.BS // self.KBS
        if ratio > 1:
            if block_stride != page:
                raise ValueError(
                    "layout %s does not store blocks as dense pages: no "
                    "kernel block split (as vLLM's create_kv_cache_views)" %
                    self.layout)
            block_stride //= ratio
        shape = (self.LM, self.NB * ratio, self.H, self.KBS, cbytes)
        strides = layout_strides(shape, order,
                                 (layer_stride, block_stride, None, None,
                                  None))
        v5 = torch.as_strided(raw, size=shape, stride=strides,
                              storage_offset=raw.storage_offset())
        self.page = page
        for li in range(self.L):
            self.caches[layer_name(li)] = v5[self.mem_of[li]].view(self.dtype)

    # --- slot addressing: values are [n, H, 2*D] (K dims, then V dims) ---

    def write(self, li: int, blocks, slots, vals) -> None:
        t = self.caches[layer_name(li)]
        n = vals.shape[0]
        if self.form == "5d" and self.mla:
            t[blocks, slots] = vals.view(n, 2 * self.D)
        elif self.form == "5d":
            v = vals.view(n, self.H, 2, self.D)
            if self.backend == "flashinfer":
                t[blocks, :, slots] = v.permute(0, 2, 1, 3)
            else:
                t[:, blocks, slots] = v.permute(2, 0, 1, 3)
        else:
            kb, kn = self._kernel(blocks, slots)
            t[kb, :, kn, :] = vals

    def read(self, li: int, blocks, slots):
        t = self.caches[layer_name(li)]
        if self.form == "5d" and self.mla:
            return t[blocks, slots].view(len(blocks), 1, 2 * self.D)
        if self.form == "5d":
            if self.backend == "flashinfer":
                v = t[blocks, :, slots]  # [n, 2, H, D]
                return v.permute(0, 2, 1, 3).reshape(len(blocks), self.H,
                                                     2 * self.D)
            v = t[:, blocks, slots]  # [2, n, H, D]
            return v.permute(1, 2, 0, 3).reshape(len(blocks), self.H,
                                                 2 * self.D)
        kb, kn = self._kernel(blocks, slots)
        return t[kb, :, kn, :]

    def _kernel(self, blocks, slots):
        ratio = self.BS // self.KBS
        return blocks * ratio + slots // self.KBS, slots % self.KBS

    def read_blocks(self, li: int, block_ids: list[int]):
        """Every slot of whole blocks: [n_blocks * BS, H, 2D]."""
        torch = self.torch
        b = torch.tensor(block_ids, dtype=torch.long).repeat_interleave(
            self.BS)
        s = torch.arange(self.BS).repeat(len(block_ids))
        return self.read(li, b, s).clone()


class Pattern:
    """The KV value of (token, position, layer, head, c) written by
    `salt`'s forward: c in [0, 2*head_dim), K then V."""

    def __init__(self, torch, heads: int, head_dim: int, head0: int):
        self.torch = torch
        h = (head0 + torch.arange(heads)).view(1, heads, 1)
        c = torch.arange(2 * head_dim).view(1, 1, 2 * head_dim)
        self.base = (h * 97 + c * 13).to(torch.int64)

    def values(self, tokens: list[int], positions, layer: int, salt: int):
        torch = self.torch
        tok = torch.tensor(tokens, dtype=torch.int64).view(-1, 1, 1)
        pos = positions.to(torch.int64).view(-1, 1, 1)
        v = (self.base + tok * 131 + pos * 613 + layer * 1009 +
             salt * 7919) % P_MOD
        return v.to(torch.int16)


# ------------------------------------------------------------------ worker


class Worker:
    def __init__(self, spec: dict, rank: int):
        import torch

        from kvbroker.vllm._compat import KVConnectorRole

        from .versions import get

        if spec.get("connector_cls") is not None:
            KVBrokerConnector = spec["connector_cls"]  # noqa: N806
        else:
            from kvbroker.vllm import KVBrokerConnector

        torch.set_num_threads(1)
        self.torch = torch
        self.spec = spec
        self.rank = rank
        self.version = get(spec["version"])
        self.runner = spec["runner"]
        self.salt = spec["salt"]
        cfg = spec["vllm_config_factory"](rank)
        self.conn = KVBrokerConnector(cfg, KVConnectorRole.WORKER,
                                      spec.get("kv_cache_config"))
        self.kv = KVCaches(torch, self.conn.broker_client, spec)
        # MLA: every rank computes the same latent
        self.pattern = Pattern(torch, spec["heads"], spec["head_dim"],
                               0 if spec.get("mla") else rank * spec["heads"])
        self.calls: list[str] = []
        # vLLM registers the caches, then sets the host copy op (V2:
        # ActiveKVConnector.__init__)
        self.conn.register_kv_caches(self.kv.caches)
        self.conn.set_host_xfer_buffer_ops(None)
        # the layer hooks run unless the forward is a FULL graph replay,
        # which vLLM downgrades to PIECEWISE when the connector asks
        extra = cfg.kv_transfer_config.kv_connector_extra_config
        self.hooks = spec.get("cudagraph", "piecewise") != "full" or bool(
            type(self.conn).requires_piecewise_for_cudagraph(extra))
        self.reqs: dict[str, dict] = {}  # the persistent batch
        self.checks: dict[str, dict] = {}  # loads to verify
        self.pending_load = False

    # --- vLLM's _update_states ---

    def update_states(self, so) -> None:
        for rid in so.finished_req_ids:
            self.reqs.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            toks = nr.all_token_ids if nr.all_token_ids is not None \
                else nr.prompt_token_ids
            self.reqs[nr.req_id] = {"tokens": list(toks),
                                    "blocks": [list(g) for g in nr.block_ids],
                                    "computed": nr.num_computed_tokens}
        cd = so.scheduled_cached_reqs
        ng = len(self.kv.windows)
        for i, rid in enumerate(cd.req_ids):
            st = self.reqs.setdefault(rid, {"tokens": [],
                                            "blocks": [[] for _ in range(ng)],
                                            "computed": 0})
            nb = cd.new_block_ids[i]
            if rid in cd.resumed_req_ids:
                st["blocks"] = [list(g) for g in nb] if nb else \
                    [[] for _ in range(ng)]
            elif nb:
                for have, new in zip(st["blocks"], nb):
                    have.extend(new)
            if rid in cd.all_token_ids:
                st["tokens"] = list(cd.all_token_ids[rid])
            st["computed"] = cd.num_computed_tokens[i]

    # --- the forward ---

    def forward(self, so) -> tuple[list[str], list[list[int]]]:
        torch = self.torch
        work = []
        for rid, n in so.num_scheduled_tokens.items():
            st = self.reqs[rid]
            start = st["computed"]
            pos = torch.arange(start, start + n)
            toks = [st["tokens"][p] if p < len(st["tokens"]) else 0
                    for p in range(start, start + n)]
            bidx = [torch.tensor([g[p // self.kv.BS]
                                  for p in range(start, start + n)],
                                 dtype=torch.long) for g in st["blocks"]]
            if any(bool((b == 0).any()) for b in bidx):
                raise AssertionError("request %s: a computed token in the "
                                     "null block" % rid)
            work.append((rid, pos, toks, bidx, pos % self.kv.BS))
        for li in range(self.kv.L):
            name = layer_name(li)
            g = self.kv.layer_group[li]
            if self.hooks:
                self.conn.wait_for_layer_load(name)
            for rid, pos, toks, bidx, slots in work:
                self.kv.write(li, bidx[g], slots,
                              self.pattern.values(toks, pos, li, self.salt))
            if self.hooks:
                self.conn.save_kv_layer(name, self.kv.caches[name], None)
        req_ids, sampled = [], []
        for rid, n in so.num_scheduled_tokens.items():
            st = self.reqs[rid]
            st["computed"] += n
            req_ids.append(rid)
            if st["computed"] >= len(st["tokens"]):
                tok = sample_token(st["tokens"])
                st["tokens"].append(tok)
                sampled.append([tok])
            else:
                sampled.append([])
        return req_ids, sampled

    # --- the runners ---

    def _start_load(self):
        self.calls.append("start_load_kv")
        self.conn.start_load_kv(None)

    def _results(self, so) -> dict:
        c = self.conn
        v = self.version
        out = {}
        if v.transfer_results:
            self.calls.append("get_transfer_results")
            tr = c.get_transfer_results(set(so.finished_req_ids))
            out["sending"] = set(tr.finished_sending or ())
            out["recving"] = set(tr.finished_recving or ())
            out["failed_recving"] = set(tr.failed_recving or ())
        else:
            self.calls.append("get_finished")
            s, r = c.get_finished(set(so.finished_req_ids))
            out["sending"], out["recving"] = set(s or ()), set(r or ())
            out["failed_recving"] = set()
        out["invalid"] = set(c.get_block_ids_with_load_errors() or ())
        out["kv_stats"] = c.get_kv_connector_stats()
        c.get_kv_connector_kv_cache_events()
        c.build_connector_worker_meta()
        return out

    def execute(self, so) -> dict:
        v, c = self.version, self.conn
        meta = so.kv_connector_metadata
        empty = so.total_num_scheduled_tokens == 0
        before = v.start_load == "before" or so.has_sync_kv_loads
        if self.runner == "v1":
            self.calls.append("handle_preemptions")
            c.handle_preemptions(meta)
            self.update_states(so)
            self.calls.append("bind")
            c.bind_connector_metadata(meta)
            if before:
                self._start_load()
            req_ids, sampled = ([], []) if empty else self.forward(so)
            if not before:
                self._start_load()
            if not empty or v.wait_for_save_empty("v1"):
                self.calls.append("wait_for_save")
                c.wait_for_save()
            out = self._results(so)
            self.calls.append("clear")
            c.clear_connector_metadata()
        else:
            self.update_states(so)
            if v.v2_preempt_order == "handle_then_bind":
                self.calls += ["handle_preemptions", "bind"]
                c.handle_preemptions(meta)
                c.bind_connector_metadata(meta)
            else:
                self.calls += ["bind", "handle_preemptions"]
                c.bind_connector_metadata(meta)
                c.handle_preemptions(meta)
            if before:
                self._start_load()
            req_ids, sampled = ([], []) if empty else self.forward(so)
            if v.finish_forward:
                self.calls.append("finish_forward")
                c.finish_forward()
            if not before:
                self._start_load()
            if not empty or v.wait_for_save_empty("v2"):
                self.calls.append("wait_for_save")
                c.wait_for_save()
            out = self._results(so)
            self.calls.append("clear")
            c.clear_connector_metadata()
        out["req_ids"], out["sampled"] = req_ids, sampled
        return out

    # --- the checker ---

    def add_checks(self, checks: dict) -> None:
        """Loads to verify: req -> {tokens, blocks, local_tokens, salt}. The
        blocks of the local prefix hit are snapshotted now (before this
        step's start_load_kv): they must come out unchanged."""
        for rid, ck in checks.items():
            nloc = ck["local_tokens"] // self.kv.BS
            ck["snap"] = [self.kv.read_blocks(li, self._local(ck, li, nloc))
                          for li in range(self.kv.L)] if nloc else None
            self.checks[rid] = ck

    def _local(self, ck: dict, li: int, nloc: int) -> list[int]:
        """D's own blocks of the local hit in layer li's group (a
        sliding-window group's null blocks left out)."""
        gblocks = ck.get("gblocks") or [ck["blocks"]]
        return [b for b in gblocks[self.kv.layer_group[li]][:nloc] if b]

    def verify(self, rid: str) -> str:
        torch = self.torch
        ck = self.checks.pop(rid)
        bs = self.kv.BS
        nloc = ck["local_tokens"] // bs
        n = len(ck["tokens"])
        first = nloc * bs
        pos = torch.arange(first, n)
        blocks = torch.tensor([ck["blocks"][p // bs] for p in range(first, n)],
                              dtype=torch.long)
        toks = ck["tokens"][first:n]
        gblocks = ck.get("gblocks") or [ck["blocks"]]
        for li in range(self.kv.L):
            g = self.kv.layer_group[li]
            w = self.kv.windows[g]
            if w:  # sliding window: only what the window reaches is held
                skip = max(0, n - w + 1) // bs
                if any(b != 0 for b in gblocks[g][:skip]) or \
                        0 in gblocks[g][skip:]:
                    return ("layer %d: sliding-window blocks %s: not null "
                            "exactly before block %d" % (li, gblocks[g], skip))
                lo = max(first, skip * bs)
            else:
                lo = first
            zero = self.kv.read_blocks(li, [0])
            if bool(zero.any()):
                return "layer %d: the null block was written" % li
            if nloc:
                lb = self._local(ck, li, nloc)
                now = self.kv.read_blocks(li, lb)
                if not torch.equal(now, ck["snap"][li]):
                    bad = (now != ck["snap"][li]).nonzero()[0].tolist()
                    return ("layer %d: a block of D's local prefix hit was "
                            "overwritten (slot %s of blocks %s)" %
                            (li, bad, lb))
            if g or w:
                if lo >= n:
                    continue
                gpos = torch.arange(lo, n)
                gbl = torch.tensor([gblocks[g][p // bs] for p in range(lo, n)],
                                   dtype=torch.long)
                got = self.kv.read(li, gbl, gpos % bs)
                want = self.pattern.values(ck["tokens"][lo:n], gpos, li,
                                           ck["salt"])
                if not torch.equal(got, want):
                    bad = (got != want).nonzero()[0].tolist()
                    p = lo + bad[0]
                    return ("layer %d (group %d): position %d (block %d "
                            "slot %d): got %d, want %d" % (
                                li, g, p, gblocks[g][p // bs], p % bs,
                                int(got[tuple(bad)]), int(want[tuple(bad)])))
                continue
            if first >= n:
                continue
            got = self.kv.read(li, blocks, pos % bs)
            want = self.pattern.values(toks, pos, li, ck["salt"])
            if not torch.equal(got, want):
                bad = (got != want).nonzero()[0].tolist()
                p = first + bad[0]
                return ("layer %d: position %d (block %d slot %d) head %d "
                        "c %d: got %d, want %d" % (
                            li, p, ck["blocks"][p // bs], p % bs, bad[1],
                            bad[2], int(got[tuple(bad)]),
                            int(want[tuple(bad)])))
        return ""

    def step(self, msg: dict) -> dict:
        so = msg["so"]
        if msg.get("checks"):
            self.add_checks(msg["checks"])
        if msg.get("die_at_layer") is not None:
            self._die_at = msg["die_at_layer"]
        self.calls = []
        out = self.execute(so)
        verified = {}
        for rid in out["recving"]:
            if rid in self.checks:
                ck = self.checks[rid]
                if set(ck["blocks"]) & out["invalid"] or \
                        rid in out["failed_recving"]:
                    self.checks.pop(rid)
                    verified[rid] = None
                else:
                    verified[rid] = self.verify(rid)
        for rid in so.finished_req_ids:  # dropped before its load ended
            pass
        out["verified"] = verified
        out["calls"] = list(self.calls)
        stats = getattr(self.conn, "connector_stats", None)
        out["stats"] = stats() if stats else {}
        for k in ("sending", "recving", "failed_recving", "invalid"):
            out[k] = sorted(out[k])
        return out


def worker_main(spec: dict, rank: int, pipe) -> None:
    try:
        w = Worker(spec, rank)
        pipe.send({"ready": True, "pid": os.getpid()})
    except Exception:
        pipe.send({"error": traceback.format_exc()})
        return
    try:
        while True:
            msg = pipe.recv()
            if msg is None:
                break
            if msg.get("kill_self"):
                os.kill(os.getpid(), signal.SIGKILL)
            pipe.send(w.step(msg))
    except EOFError:
        pass
    except Exception:
        try:
            pipe.send({"error": traceback.format_exc()})
        except OSError:
            pass
    finally:
        try:
            w.conn.shutdown()
        except Exception:
            pass
        time.sleep(0)


def kv_bytes(spec: dict) -> int:
    n = spec["num_blocks"] * spec["block_size"] * spec["heads"] * \
        spec["head_dim"] * 2 * 2
    return n * spec["layers"]


def prod_shape(shape) -> int:
    return prod(shape)
