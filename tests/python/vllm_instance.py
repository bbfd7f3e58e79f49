#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""One vLLM instance (P or D) driving KVBrokerConnector in vLLM's order.

The main process plays vLLM's scheduler (role SCHEDULER connector, a block
allocator, requests); one forked process per TP rank plays a GPU worker
(role WORKER connector, KV caches as torch CPU tensors over broker memory).
Each step, as vLLM's engine does:

  scheduler: get_num_new_matched_tokens -> update_state_after_alloc ->
             build_connector_meta
  workers:   bind_connector_metadata, start_load_kv, per layer
             (wait_for_layer_load, [P: the layer's KV is written]
             save_kv_layer), wait_for_save, get_finished,
             get_block_ids_with_load_errors, clear_connector_metadata
  scheduler: update_connector_output (the ranks' finished sets, a request
             counting once every rank reported it), request_finished

P's requests are prefilled (max_tokens 1) and finished; request_finished's
kv_transfer_params go, as a P/D proxy passes them, to D through a file
(DIR/relay.jsonl). P writes into each block a pattern of (request, layer,
K/V, token, global head, dim); D checks every byte it received.

Writes DIR/result-<role>.json; exit 0 when it ran to the end (the test
judges the outcome).
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import random
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_doubles as vd  # noqa: E402

BLOCK = 16
HEAD_DIM = 32
P_MOD = 32749


def layer_name(i: int) -> str:
    return "model.layers.%d.self_attn.attn" % i


def prompt_len(i: int) -> int:
    return 17 + (i * 37) % 64  # 2..5 blocks of 16


def nblocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


# ---------------------------------------------------------------- worker


class Worker:
    def __init__(self, a, rank: int):
        import torch

        import kvbroker
        from kvbroker.vllm import KVBrokerConnector
        from kvbroker.vllm._compat import KVConnectorRole

        self.torch, self.a, self.rank = torch, a, rank
        cfg = vd.make_config(a.kv_role, a.extra, a.tp, rank, BLOCK)
        self.conn = KVBrokerConnector(cfg, KVConnectorRole.WORKER, None)
        self.client = self.conn.broker_client
        self.heads = a.heads
        shape = self._phys_shape()
        nbytes = 2 * a.num_blocks * BLOCK * self.heads * HEAD_DIM * 2
        self.kv = {}
        flags = kvbroker.MEM_REMOTE_WRITE | kvbroker.MEM_REMOTE_READ
        for li in range(a.layers):
            r = self.client.alloc(nbytes, flags, li)
            t = r.as_torch(torch.int16, shape)
            self.kv[layer_name(li)] = self._logical(t)
        self.conn.register_kv_caches(self.kv)
        # pattern grid over one block: kv, slot, head, dim (global head)
        kv = torch.arange(2).view(2, 1, 1, 1, 1)
        slot = torch.arange(BLOCK).view(1, 1, BLOCK, 1, 1)
        gh = (rank * self.heads + torch.arange(self.heads)).view(
            1, 1, 1, self.heads, 1)
        dim = torch.arange(HEAD_DIM).view(1, 1, 1, 1, HEAD_DIM)
        self.grid = (kv * 31 + slot * 613 + gh * 97 + dim * 13).to(
            torch.int32)

    def _phys_shape(self):
        a, H = self.a, self.heads
        if a.layout == "hnd":  # kv first, heads before tokens
            return (2, a.num_blocks, H, BLOCK, HEAD_DIM)
        if a.layout == "block":  # FlashInfer: blocks first
            return (a.num_blocks, 2, BLOCK, H, HEAD_DIM)
        return (2, a.num_blocks, BLOCK, H, HEAD_DIM)

    def _logical(self, t):
        if self.a.layout == "hnd":
            return t.permute(0, 1, 3, 2, 4)
        return t

    def expected(self, idx: int, layer: int, n: int):
        torch = self.torch
        pos = (torch.arange(n) * (BLOCK * 613)).view(1, n, 1, 1, 1)
        v = (self.grid + pos + (idx * 7919 + layer * 104729)) % P_MOD
        return v.to(torch.int16)  # [2, n, BLOCK, heads, HEAD_DIM]

    def view(self, t, blocks):
        if self.a.layout == "block":
            return t[blocks].transpose(0, 1)
        return t[:, blocks]

    def fill(self, t, blocks, val):
        if self.a.layout == "block":
            t[blocks] = val.transpose(0, 1)
        else:
            t[:, blocks] = val

    def step(self, msg):
        meta, finished, new = msg["meta"], msg["finished"], msg["new"]
        c = self.conn
        c.bind_connector_metadata(meta)
        c.start_load_kv(None)
        for li in range(self.a.layers):
            name = layer_name(li)
            c.wait_for_layer_load(name)
            if self.a.kv_role == "kv_producer":
                for rid, (idx, blocks) in new.items():
                    self.fill(self.kv[name], blocks,
                              self.expected(idx, li, len(blocks)))
            if msg.get("pause_layer") == li:  # a broker dies meanwhile
                open(msg["pause_file"], "w").close()
                time.sleep(msg["pause_s"])
            c.save_kv_layer(name, self.kv[name], None)
        c.wait_for_save()
        sending, recving = c.get_finished(set(finished))
        errs = c.get_block_ids_with_load_errors()
        c.clear_connector_metadata()
        verified = {}
        for rid in recving or ():
            if rid in msg["blocks"]:
                idx, blocks = msg["blocks"][rid]
                if not set(blocks) & errs:
                    verified[rid] = self.check(idx, blocks)
        return {"sending": sorted(sending or ()),
                "recving": sorted(recving or ()), "errors": sorted(errs),
                "verified": verified, "stats": c.connector_stats()}

    def check(self, idx, blocks) -> str:
        for li in range(self.a.layers):
            got = self.view(self.kv[layer_name(li)], blocks)
            want = self.expected(idx, li, len(blocks))
            if not self.torch.equal(got, want):
                bad = (got != want).nonzero()[0].tolist()
                return "layer %d: first difference at %s" % (li, bad)
        return ""


def worker_main(a, rank, conn):
    try:
        w = Worker(a, rank)
        conn.send({"ready": True})
        while True:
            msg = conn.recv()
            if msg is None:
                break
            conn.send(w.step(msg))
        w.conn.shutdown()
    except Exception:  # reported to the scheduler, which fails the run
        conn.send({"error": traceback.format_exc()})


# ------------------------------------------------------------- scheduler


class Engine:
    def __init__(self, a):
        from kvbroker.vllm import KVBrokerConnector
        from kvbroker.vllm._compat import KVConnectorRole

        self.a = a
        self.p = a.kv_role == "kv_producer"
        cfg = vd.make_config(a.kv_role, a.extra, a.tp, 0, BLOCK)
        self.conn = KVBrokerConnector(cfg, KVConnectorRole.SCHEDULER, None)
        ids = list(range(a.num_blocks))
        random.Random(7 if self.p else 11).shuffle(ids)
        self.free = collections.deque(ids)
        self.workers = []
        ctx = mp.get_context("fork")
        for r in range(a.tp):
            parent, child = ctx.Pipe()
            pr = ctx.Process(target=worker_main, args=(a, r, child),
                             daemon=True)
            pr.start()
            self.workers.append((pr, parent))
        for pr, pipe in self.workers:
            self._recv(pipe)
        self.res = collections.defaultdict(list)
        for k in ("sent", "not_sent", "ok", "bad", "local", "load_error",
                  "load_error_t", "aborted", "abort_delayed",
                  "recv_after_abort", "delay_after_load", "unfinished"):
            self.res[k] = []
        self.finished_prev: set[str] = set()
        self.blocks: dict[str, list[int]] = {}
        self.idx: dict[str, int] = {}
        self.reqs: dict[str, vd.Request] = {}
        self.count_send = collections.Counter()
        self.count_recv = collections.Counter()
        self.count_verified = collections.Counter()
        self.errs: set[int] = set()
        self.bad_verify: dict[str, str] = {}
        self.stats = []
        self.events = []  # (time, what)
        self.t0 = time.monotonic()

    def _recv(self, pipe, timeout=60.0):
        if not pipe.poll(timeout):
            raise RuntimeError("a worker did not answer in %.0f s" % timeout)
        m = pipe.recv()
        if "error" in m:
            raise RuntimeError("worker failed:\n" + m["error"])
        return m

    def alloc(self, n):
        if len(self.free) < n:
            return None
        return [self.free.popleft() for _ in range(n)]

    def release(self, rid):
        self.free.extend(self.blocks.pop(rid, []))

    def run_step(self, new, pause=None):
        so = vd.SchedulerOutput(
            num_scheduled_tokens={r: self.reqs[r].num_prompt_tokens
                                  for r in new},
            finished_req_ids=set(self.finished_prev))
        meta = self.conn.build_connector_meta(so)
        self.finished_prev = set()
        msg = {"meta": meta, "finished": so.finished_req_ids,
               "new": {r: (self.idx[r], self.blocks[r]) for r in new},
               "blocks": {r: (self.idx[r], b) for r, b in self.blocks.items()}}
        if pause:
            msg.update(pause)
        for _, pipe in self.workers:
            pipe.send(msg)
        outs = [self._recv(pipe, 120.0) for _, pipe in self.workers]
        done_send, done_recv = set(), set()
        for o in outs:
            self.errs.update(o["errors"])
            for rid, why in o["verified"].items():
                self.count_verified[rid] += 1
                if why:
                    self.bad_verify[rid] = why
            for rid in o["sending"]:
                self.count_send[rid] += 1
                if self.count_send[rid] == self.a.tp:
                    done_send.add(rid)
            for rid in o["recving"]:
                self.count_recv[rid] += 1
                if self.count_recv[rid] == self.a.tp:
                    done_recv.add(rid)
        self.stats = [o["stats"] for o in outs]
        self.conn.update_connector_output(vd.KVConnectorOutput(
            finished_sending=done_send or None,
            finished_recving=done_recv or None))
        return done_send, done_recv

    def finish(self, rid, status):
        r = self.reqs[rid]
        r.status = status
        delay, params = self.conn.request_finished(r, list(self.blocks[rid]))
        self.finished_prev.add(rid)
        return delay, params

    def elapsed(self):
        return time.monotonic() - self.t0

    def close(self):
        for _, pipe in self.workers:
            try:
                pipe.send(None)
            except OSError:
                pass
        for pr, _ in self.workers:
            pr.join(10)
            if pr.is_alive():
                pr.kill()


def run_p(e: Engine, a):
    waiting = collections.deque(range(a.requests))
    sending: set[str] = set()
    relay = open(os.path.join(a.dir, "relay.jsonl"), "a")
    deadline = time.monotonic() + a.timeout
    steps = 0
    paused = False
    while (waiting or sending) and time.monotonic() < deadline:
        new = []
        while waiting and len(new) < a.per_step:
            i = waiting[0]
            rid = "req-%d" % i
            n = prompt_len(i)
            blocks = e.alloc(nblocks(n))
            if blocks is None:
                break
            waiting.popleft()
            params = {"do_remote_decode": True, "transfer_id": "tx-%s-%d" %
                      (a.tag, i), "remote_host": a.peer_ip,
                      "remote_handshake_port": 6301, "remote_tp_size": a.peer_tp}
            if i in a.bad_p:
                del params["transfer_id"]
            r = vd.Request(rid, n, params)
            e.reqs[rid], e.idx[rid], e.blocks[rid] = r, i, blocks
            assert e.conn.get_num_new_matched_tokens(r, 0) == (0, False)
            e.conn.update_state_after_alloc(r, vd.KVCacheBlocks(blocks), 0)
            new.append(rid)
        pause = None
        if a.pause_when_d_ok and not paused and \
                _d_ok(a.dir) >= a.pause_when_d_ok:
            paused = True
            pause = {"pause_layer": a.layers // 2, "pause_s": a.pause_s,
                     "pause_file": os.path.join(a.dir, "paused")}
        done_send, _ = e.run_step(new, pause)
        steps += 1
        for rid in new:  # prefilled: one token, finished by length
            e.reqs[rid].num_computed_tokens = e.reqs[rid].num_prompt_tokens
            delay, params = e.finish(rid, vd.RequestStatus.FINISHED_LENGTH_CAPPED)
            if delay:
                sending.add(rid)
                relay.write(json.dumps({"req_id": rid, "params": params}) + "\n")
                relay.flush()
            else:
                e.res["not_sent"].append(rid)
                e.release(rid)
        for rid in done_send:
            sending.discard(rid)
            e.res["sent"].append(rid)
            e.release(rid)
        if not new and not done_send:
            time.sleep(0.005)
    e.res["unfinished"] = sorted(sending) + ["req-%d" % i for i in waiting]
    e.res["steps"] = steps


def _d_ok(d: str) -> int:
    """How many loads D has checked so far (its progress file)."""
    try:
        with open(os.path.join(d, "d-ok")) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


def run_d(e: Engine, a):
    relay_path = os.path.join(a.dir, "relay.jsonl")
    pos = 0
    incoming = collections.deque()
    loading: set[str] = set()
    aborting: set[str] = set()
    seen = 0
    deadline = time.monotonic() + a.timeout
    while time.monotonic() < deadline:
        if os.path.exists(relay_path):
            with open(relay_path) as f:
                f.seek(pos)
                for line in f:
                    if not line.endswith("\n"):
                        break
                    pos += len(line)
                    incoming.append(json.loads(line))
        new = []
        while incoming:
            item = incoming[0]
            rid, params = item["req_id"], dict(item["params"])
            i = int(rid.split("-")[1])
            n = prompt_len(i)
            blocks = e.alloc(nblocks(n))
            if blocks is None:
                break
            incoming.popleft()
            seen += 1
            if i in a.bad_d:
                _corrupt(params, i)
            r = vd.Request(rid, n, params)
            e.reqs[rid], e.idx[rid], e.blocks[rid] = r, i, blocks
            nt, is_async = e.conn.get_num_new_matched_tokens(r, 0)
            if nt == 0:  # vLLM computes it here
                e.conn.update_state_after_alloc(r, vd.KVCacheBlocks(blocks), 0)
                e.finish(rid, vd.RequestStatus.FINISHED_LENGTH_CAPPED)
                e.res["local"].append(rid)
                e.release(rid)
                continue
            assert is_async and nt == n, (nt, is_async)
            e.conn.update_state_after_alloc(r, vd.KVCacheBlocks(blocks), nt)
            r.status = vd.RequestStatus.WAITING_FOR_REMOTE_KVS
            new.append(rid)
            if i in a.abort:  # the client goes away before it runs
                # vLLM holds a request dropped in WAITING_FOR_REMOTE_KVS
                # until finished_recving names it (its own delay_free):
                # a connector asking for a delay of its own is wrong
                delay, _ = e.finish(rid, vd.RequestStatus.FINISHED_ABORTED)
                if delay:
                    e.res["abort_delayed"].append(rid)
                aborting.add(rid)
            else:
                loading.add(rid)
        _, done_recv = e.run_step(new)
        for rid in done_recv & aborting:
            aborting.discard(rid)
            e.res["aborted"].append(rid)
            e.release(rid)
        for rid in done_recv:
            if rid in e.res["aborted"]:
                continue
            if rid not in loading:
                e.res["recv_after_abort"].append(rid)
                continue
            loading.discard(rid)
            if set(e.blocks[rid]) & e.errs:
                e.res["load_error"].append(rid)
                e.res["load_error_t"].append(round(e.elapsed(), 2))
            elif rid in e.bad_verify or e.count_verified[rid] != a.tp:
                e.res["bad"].append(rid)  # wrong bytes, or not checked
            else:
                e.res["ok"].append(rid)  # every byte, on every rank
                with open(os.path.join(a.dir, "d-ok.tmp"), "w") as f:
                    f.write(str(len(e.res["ok"])))
                os.rename(os.path.join(a.dir, "d-ok.tmp"),
                          os.path.join(a.dir, "d-ok"))
            # decoded, finished: vLLM frees its blocks
            e.reqs[rid].num_computed_tokens = e.reqs[rid].num_prompt_tokens
            delay, _ = e.finish(rid, vd.RequestStatus.FINISHED_LENGTH_CAPPED)
            if delay:
                e.res["delay_after_load"].append(rid)
            e.release(rid)
        if seen >= a.requests - len(a.bad_p) and not loading and \
                not aborting and not incoming:
            break
        if not new and not done_recv:
            time.sleep(0.005)
    e.res["unfinished"] = sorted(loading | aborting)
    e.res["seen"] = seen


def _corrupt(params: dict, i: int) -> None:
    """Malformed kv_transfer_params, one kind per request."""
    kind = i % 4
    if kind == 0:
        del params["transfer_id"]
    elif kind == 1:
        params["remote_handshake_port"] = "not-a-port"
    elif kind == 2:
        params["remote_host"] = 12
    else:  # well formed, but nobody answers there: fails at the worker
        params["remote_handshake_port"] = 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=("P", "D"), required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--host-ip", required=True)
    ap.add_argument("--peer-ip", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--peer-tp", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layout", choices=("nhd", "hnd", "block"), default="nhd")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--per-step", type=int, default=8)
    ap.add_argument("--num-blocks", type=int, default=192)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--transfer-timeout", type=float, default=12)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tag", default="t")
    ap.add_argument("--abort", default="")
    ap.add_argument("--bad-p", default="")
    ap.add_argument("--bad-d", default="")
    ap.add_argument("--pause-when-d-ok", type=int, default=0)
    ap.add_argument("--pause-s", type=float, default=0)
    a = ap.parse_args()
    ints = lambda s: {int(x) for x in s.split(",") if x}  # noqa: E731
    a.abort, a.bad_p, a.bad_d = ints(a.abort), ints(a.bad_p), ints(a.bad_d)
    a.kv_role = "kv_producer" if a.role == "P" else "kv_consumer"
    a.extra = {"broker_socket": a.socket, "host_ip": a.host_ip,
               "handshake_port": 6301, "notify_port": 61005,
               "transfer_timeout_s": a.transfer_timeout}
    out = os.path.join(a.dir, "result-%s.json" % a.role)
    e = None
    try:
        e = Engine(a)
        (run_p if a.role == "P" else run_d)(e, a)
        res = dict(e.res)
        res["bad_params"] = e.conn.connector_stats()["bad_params"]
        res["worker_stats"] = e.stats
        res["bad_verify"] = e.bad_verify
        res["elapsed"] = round(e.elapsed(), 2)
    except Exception:
        res = {"error": traceback.format_exc()}
    finally:
        if e is not None:
            e.close()
    with open(out + ".tmp", "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    os.rename(out + ".tmp", out)
    print("vllm_instance %s: %s" % (a.role, json.dumps(
        {k: (len(v) if isinstance(v, list) else v) for k, v in res.items()
         if k != "worker_stats"})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
