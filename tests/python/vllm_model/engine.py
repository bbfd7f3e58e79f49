# SPDX-License-Identifier: MIT
"""vLLM instances (engine core + scheduler + TP workers) and a P/D harness.

An Instance is one vLLM engine: the scheduler-role connector and the
scheduler model in this process, one forked process per TP rank (vLLM's
multiproc executor: each worker its own process, so each has its own
kvbroker Client), and vLLM's engine-core loop:

- sync (``step``): schedule -> execute on every rank -> aggregate ->
  update_from_output;
- async scheduling (``step_with_batch_queue``, max_concurrent_batches 2, as
  vllm/v1/engine/core.py): step N+1 is scheduled and sent to the workers
  before step N's output is processed.

Steps run whenever ``scheduler.has_requests()`` (so with no tokens: empty
steps). The executor aggregates the ranks' KVConnectorOutputs as vLLM's
KVOutputAggregator does: a request id counts as finished sending / receiving
once every rank reported it (or ``get_finished_count()`` ranks), block load
errors and failed receives are the union.

Harness: one P and one D instance; a request finished at P hands its
request_finished kv_transfer_params to D as vLLM's P/D proxy does (the
prompt again, with those params); scripted events (abort, preempt, kill a
worker or a broker) run at a step or a state.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .objects import (
    CacheConfig,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    SlidingWindowSpec,
    KVConnectorOutput,
    KVTransferConfig,
    ModelConfig,
    ModelRunnerOutput,
    ParallelConfig,
    Request,
    RequestStatus,
    SchedulerConfig,
    VllmConfig,
)
from .scheduler import EngineDead, Scheduler
from .versions import Version, get
from .worker import worker_main

_ctx = mp.get_context("fork")

try:  # imported once here: every forked worker inherits it (3 s each else)
    import torch  # noqa: F401
except ImportError:  # the tests skip
    torch = None


@dataclass
class InstanceSpec:
    role: str  # "P" or "D"
    version: str
    runner: str | None = None  # None: the version's default
    socket: str = ""
    host_ip: str = ""
    tp: int = 1
    heads: int = 4  # per rank
    head_dim: int = 32
    layers: int = 4
    num_blocks: int = 64
    block_size: int = 16
    kernel_block_size: int | None = None
    layout: str | None = None  # None: the version's default
    # None: the version's KV cache form; "5d" under a >= 0.29 version is no
    # vLLM configuration: it separates the runner contract from the form
    kv_form: str | None = None
    backend: str = "flash"  # 5-D form: flash or flashinfer
    max_num_batched_tokens: int = 256
    long_prefill_token_threshold: int = 0
    max_num_seqs: int = 64
    async_scheduling: bool = False
    enable_prefix_caching: bool = True
    kv_load_failure_policy: str = "recompute"
    transfer_timeout_s: float = 12.0
    # "full": vLLM's CUDAGraphMode.FULL, every step a graph replay, so the
    # attention layers' connector hooks (wait_for_layer_load,
    # save_kv_layer) do not run, unless the connector's
    # requires_piecewise_for_cudagraph() says True (then vLLM downgrades
    # to PIECEWISE and they run)
    cudagraph: str = "piecewise"
    # an MLA model (DeepSeek-style): one latent cache per layer, heads must
    # be 1 and the latent is 2 * head_dim wide; <= 0.28 hands
    # register_kv_caches [num_blocks, block_size, latent] per layer, >= 0.29
    # [B, 1, N, C] views; every rank holds the same latent
    mla: bool = False
    # data parallelism: this engine's DP rank of dp_size (its workers'
    # notify ports are the broker's base + dp_rank * tp + tp_rank)
    dp_rank: int = 0
    dp_size: int = 1
    # a hybrid model shaped like gpt-oss: even layers sliding-window
    # attention over this many tokens, odd layers full attention (0: every
    # layer full attention). With vLLM's hybrid KV cache manager on (a
    # SupportsHMA connector) two KV cache groups, full attention first, and
    # layer 2i (sliding) and 2i+1 (full) share one KV cache tensor
    sliding_window: int = 0
    # vLLM's --disable-hybrid-kv-cache-manager (what vLLM also does for a
    # connector without SupportsHMA): one group, every layer full attention
    disable_hybrid_kv_cache_manager: bool = False
    # the workers' connector class (a test's subclass); None: the connector
    connector_cls: Any = None
    extra: dict = field(default_factory=dict)

    def hybrid_groups(self, hma: bool) -> bool:
        return bool(self.sliding_window) and hma and \
            not self.disable_hybrid_kv_cache_manager

    def kv_cache_config(self, hma: bool) -> KVCacheConfig:
        """The KVCacheConfig vLLM hands the connector (both roles)."""
        from .worker import layer_name

        names = [layer_name(i) for i in range(self.layers)]
        page = 2 * self.block_size * self.heads * self.head_dim * 2
        kw = dict(block_size=self.block_size, num_kv_heads=self.heads,
                  head_size=2 * self.head_dim if self.mla else self.head_dim,
                  dtype="int16")
        if self.hybrid_groups(hma):
            full, sw = names[1::2], names[0::2]
            if len(full) != len(sw):
                raise ValueError("a hybrid model here has an even number "
                                 "of layers (sliding, full, ...)")
            return KVCacheConfig(
                num_blocks=self.num_blocks,
                kv_cache_tensors=[
                    KVCacheTensor(size=page * self.num_blocks,
                                  shared_by=[a, b]) for a, b in zip(full, sw)],
                kv_cache_groups=[
                    KVCacheGroupSpec(full, FullAttentionSpec(**kw)),
                    KVCacheGroupSpec(sw, SlidingWindowSpec(
                        **kw, sliding_window=self.sliding_window))])
        return KVCacheConfig(
            num_blocks=self.num_blocks,
            kv_cache_tensors=[KVCacheTensor(size=page * self.num_blocks,
                                            shared_by=[n]) for n in names],
            kv_cache_groups=[KVCacheGroupSpec(names, FullAttentionSpec(
                **kw, sliding_window=self.sliding_window or None))])

    @property
    def kv_role(self) -> str:
        return "kv_producer" if self.role == "P" else "kv_consumer"

    def vllm_config(self, rank: int = 0) -> VllmConfig:
        v = get(self.version)
        runner = self.runner or v.default_runner
        extra = {"broker_socket": self.socket, "host_ip": self.host_ip,
                 "handshake_port": 6301, "notify_port": 61005,
                 "transfer_timeout_s": self.transfer_timeout_s}
        extra.update(self.extra)
        return VllmConfig(
            kv_transfer_config=KVTransferConfig(
                kv_role=self.kv_role, kv_connector_extra_config=extra,
                kv_load_failure_policy=self.kv_load_failure_policy),
            cache_config=CacheConfig(
                block_size=self.block_size, num_gpu_blocks=self.num_blocks,
                enable_prefix_caching=self.enable_prefix_caching,
                kv_cache_layout=self.layout or v.default_layout),
            parallel_config=ParallelConfig(tensor_parallel_size=self.tp,
                                           rank=rank,
                                           data_parallel_size=self.dp_size,
                                           data_parallel_rank=self.dp_rank),
            scheduler_config=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                long_prefill_token_threshold=self.long_prefill_token_threshold,
                async_scheduling=self.async_scheduling),
            model_config=ModelConfig(
                # an MLA config names its attention heads (16 here), not
                # what a rank holds
                total_num_kv_heads=16 if self.mla else self.heads * self.tp,
                use_mla=self.mla),
            use_v2_model_runner=runner == "v2")


class WorkerDied(RuntimeError):
    pass


class Instance:
    def __init__(self, spec: InstanceSpec, salt: int):
        from kvbroker.vllm import KVBrokerConnector
        from kvbroker.vllm._compat import KVConnectorRole

        self.spec = spec
        self.version: Version = get(spec.version)
        self.runner = spec.runner or self.version.default_runner
        from kvbroker.vllm._compat import supports_hma

        self.cfg = spec.vllm_config(0)
        # vLLM keeps its hybrid KV cache manager on only for a SupportsHMA
        # connector, and hands every connector instance the config
        self.hma = supports_hma(KVBrokerConnector)
        self.kv_cache_config = spec.kv_cache_config(self.hma)
        self.connector = KVBrokerConnector(self.cfg, KVConnectorRole.SCHEDULER,
                                           self.kv_cache_config)
        self.sched = Scheduler(self.cfg, self.version, self.connector,
                               self.runner, self.kv_cache_config)
        self.salt = salt
        self.workers: list[tuple[Any, Any]] = []
        self.pids: list[int] = []
        wspec = {
            "version": spec.version, "runner": self.runner, "salt": salt,
            "form": spec.kv_form or self.version.kv_form,
            "layout": spec.layout or (
                self.version.default_layout
                if (spec.kv_form or self.version.kv_form) ==
                self.version.kv_form else
                ("NHD" if spec.kv_form == "5d" else "LBNHC")),
            "backend": spec.backend, "layers": spec.layers,
            "num_blocks": spec.num_blocks, "block_size": spec.block_size,
            "kernel_block_size": spec.kernel_block_size,
            "heads": spec.heads, "head_dim": spec.head_dim,
            "vllm_config_factory": spec.vllm_config,
            "cudagraph": spec.cudagraph,
            "mla": spec.mla,
            "kv_cache_config": self.kv_cache_config,
            "connector_cls": spec.connector_cls,
        }
        for r in range(spec.tp):
            parent, child = _ctx.Pipe()
            pr = _ctx.Process(target=worker_main, args=(wspec, r, child),
                              daemon=True)
            pr.start()
            child.close()
            self.workers.append((pr, parent))
        for pr, pipe in self.workers:
            m = self._recv(pipe, 60)
            self.pids.append(m["pid"])
        self.batch_queue: collections.deque = collections.deque()
        self.kv_stats_data: list[dict] = []  # per step, TP ranks aggregated
        self.dead = ""
        self.count_send: collections.Counter = collections.Counter()
        self.count_recv: collections.Counter = collections.Counter()
        self.expected = self.connector.get_finished_count() or spec.tp
        self.verified: dict[str, list] = collections.defaultdict(list)
        self.calls: list[list[str]] = []
        self.worker_stats: list[dict] = []
        self.pending_checks: dict[str, dict] = {}
        self.steps = 0
        self.empty_steps = 0
        self.outputs: list[tuple[int, KVConnectorOutput]] = []

    # --- executor ---

    def _recv(self, pipe, timeout=60.0):
        if not pipe.poll(timeout):
            raise WorkerDied("a worker did not answer in %.0f s" % timeout)
        try:
            m = pipe.recv()
        except EOFError:
            raise WorkerDied("a worker process died") from None
        if "error" in m:
            raise WorkerDied("worker failed:\n" + m["error"])
        return m

    def _dispatch(self, so) -> None:
        msg = {"so": so, "checks": self.pending_checks}
        self.pending_checks = {}
        for pr, pipe in self.workers:
            try:
                pipe.send(msg)
            except OSError:
                raise WorkerDied("a worker process is gone") from None

    def _collect(self, so) -> ModelRunnerOutput:
        outs = [self._recv(pipe, 120.0) for _, pipe in self.workers]
        kvo = KVConnectorOutput(expected_finished_count=self.expected)
        send, recv = set(), set()
        for o in outs:
            for rid in o["sending"]:
                self.count_send[rid] += 1
                if self.count_send[rid] == self.expected:
                    send.add(rid)
                    del self.count_send[rid]
            for rid in o["recving"]:
                self.count_recv[rid] += 1
                if self.count_recv[rid] == self.expected:
                    recv.add(rid)
                    del self.count_recv[rid]
            kvo.failed_recving |= set(o["failed_recving"])
            kvo.invalid_block_ids |= set(o["invalid"])
            for rid, why in o["verified"].items():
                self.verified[rid].append(why)
        kvo.finished_sending = send or None
        kvo.finished_recving = recv or None
        # KVOutputAggregator: the first rank's stats object aggregates the
        # others' (pickled across processes, as vLLM ships them)
        for o in outs:
            st = o.get("kv_stats")
            if st is None:
                continue
            kvo.kv_connector_stats = st if kvo.kv_connector_stats is None \
                else kvo.kv_connector_stats.aggregate(st)
        if kvo.kv_connector_stats is not None:
            # what the scheduler hands vLLM's logging process: .data
            self.kv_stats_data.append(kvo.kv_connector_stats.data)
        self.calls.append(outs[0]["calls"])
        self.worker_stats = [o["stats"] for o in outs]
        o0 = outs[0]
        self.outputs.append((so.step, kvo))
        return ModelRunnerOutput(
            req_ids=o0["req_ids"],
            req_id_to_index={r: i for i, r in enumerate(o0["req_ids"])},
            sampled_token_ids=o0["sampled"], kv_connector_output=kvo)

    # --- engine core ---

    def add_request(self, r: Request) -> None:
        self.sched.add_request(r)

    def abort(self, req_ids) -> None:
        self.sched.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)

    def step(self) -> bool:
        """One engine-core step; False when there was nothing to do."""
        if self.dead:
            return False
        try:
            if self.spec.async_scheduling:
                return self._step_with_batch_queue()
            if not self.sched.has_requests():
                return False
            so = self._schedule()
            self._dispatch(so)
            self.sched.update_from_output(so, self._collect(so))
            return True
        except WorkerDied as e:
            self.dead = str(e)
            return False

    def _schedule(self):
        so = self.sched.schedule()
        self.steps += 1
        if so.total_num_scheduled_tokens == 0:
            self.empty_steps += 1
        for ev in self.sched.events:
            if ev[0] == "async_load" and ev[1] == so.step:
                self._on_async_load(ev[2], ev[3], ev[4])
        return so

    def _on_async_load(self, rid, num_local, num_external):
        hook = getattr(self, "on_async_load", None)
        if hook is not None:
            hook(self, rid, num_local, num_external)

    def _step_with_batch_queue(self) -> bool:
        bq = self.batch_queue
        if self.sched.has_requests():
            so = self._schedule()
            self._dispatch(so)
            bq.appendleft(so)
            executed = so.total_num_scheduled_tokens > 0
            if executed and len(bq) < 2:
                return True  # schedule the next step before this output
        elif not bq:
            return False
        so = bq.pop()
        self.sched.update_from_output(so, self._collect(so))
        return True

    def drain(self) -> None:
        """Process what the batch queue still holds (async scheduling)."""
        while self.batch_queue and not self.dead:
            so = self.batch_queue.pop()
            try:
                self.sched.update_from_output(so, self._collect(so))
            except WorkerDied as e:
                self.dead = str(e)

    def kill_worker(self, rank: int = 0) -> None:
        pr, _ = self.workers[rank]
        os.kill(pr.pid, 9)
        pr.join(10)

    def close(self) -> None:
        for pr, pipe in self.workers:
            try:
                pipe.send(None)
            except OSError:
                pass
        for pr, _ in self.workers:
            pr.join(10)
            if pr.is_alive():
                pr.kill()
                pr.join(5)


def make_prompt(rng: random.Random, n: int, prefix: list[int] | None = None
                ) -> list[int]:
    p = list(prefix or [])
    while len(p) < n:
        p.append(rng.randrange(1, 30000))
    return p[:n]


class Harness:
    """P on node a, D on node b; requests go to P, P's finished params to D
    (as vLLM's P/D proxy does), scripted events between steps."""

    def __init__(self, p_spec: InstanceSpec, d_spec: InstanceSpec,
                 peer_ips: tuple[str, str] = ("192.0.2.1", "192.0.2.2"),
                 proxy: str = "sequential"):
        self.p_ip, self.d_ip = peer_ips
        # "sequential": D gets the request with P's request_finished params
        # once P finished (vLLM's P/D proxy); "concurrent": the proxy sends
        # both at once, D's params made by the proxy (WRITE-mode proxies)
        self.proxy = proxy
        self.P = self.D = None
        self.P = Instance(p_spec, salt=1)
        self.D = Instance(d_spec, salt=2)
        self.D.on_async_load = self._d_async_load
        self.prompts: dict[str, list[int]] = {}  # P request id -> prompt
        self.salt_of: dict[str, int] = {}  # D request id -> P's writer salt
        self.d_of: dict[str, str] = {}  # P id -> D id
        self.p_of: dict[str, str] = {}
        self.d_max_tokens: dict[str, int] = {}
        self.handed: dict[str, dict] = {}  # P id -> params given to D
        self.not_handed: dict[str, Any] = {}  # P id -> params (None, ...)
        self.p_params: dict[str, Any] = {}  # concurrent: P's own params
        self.events: list[tuple[Callable, Callable]] = []  # (when, what)
        self.log: list[tuple] = []
        self.transform_params: Callable | None = None
        self.t0 = time.monotonic()
        self.loop_steps = 0

    # --- requests ---

    def submit(self, rid: str, prompt: list[int], d_max_tokens: int = 2,
               transfer_id: str | None = None, params: dict | None = None
               ) -> None:
        """A client request: the proxy sends it to P with do_remote_decode
        (max_tokens 1), then to D with P's params."""
        if params is None:
            params = {"do_remote_decode": True,
                      "transfer_id": transfer_id or "tx-" + rid,
                      "remote_host": self.d_ip,
                      "remote_handshake_port": 6301,
                      "remote_tp_size": self.D.spec.tp}
        self.prompts[rid] = list(prompt)
        self.d_max_tokens[rid] = d_max_tokens
        self.P.add_request(Request(rid, prompt, 1, params,
                                   self.P.spec.block_size))
        if self.proxy == "concurrent" and isinstance(params, dict):
            self._to_d(rid, {
                "do_remote_prefill": True, "do_remote_decode": False,
                "transfer_id": params.get("transfer_id"),
                "remote_host": self.p_ip, "remote_handshake_port": 6301,
                "remote_tp_size": self.P.spec.tp,
                "remote_dp_rank": self.P.spec.dp_rank})

    def _to_d(self, rid: str, params: dict) -> None:
        if self.transform_params is not None:
            params = self.transform_params(rid, params)
        did = "d-" + rid
        self.handed[rid] = params
        self.d_of[rid], self.p_of[did] = did, rid
        self.salt_of[did] = self.P.salt
        self.D.add_request(Request(did, self.prompts[rid],
                                   self.d_max_tokens[rid], params,
                                   self.D.spec.block_size))

    def submit_d_local(self, rid: str, prompt: list[int],
                       max_tokens: int = 1) -> None:
        """A request D computes itself (fills D's prefix cache)."""
        self.D.add_request(Request(rid, prompt, max_tokens, None,
                                   self.D.spec.block_size))

    def _proxy(self) -> None:
        out = self.P.sched.kv_transfer_params_out
        for rid in list(out):
            params = out.pop(rid)
            if rid not in self.prompts:
                continue
            st = self.P.sched.finished.get(rid)
            if self.proxy == "concurrent":
                self.p_params[rid] = params
                continue
            if params is None or st != RequestStatus.FINISHED_LENGTH_CAPPED:
                self.not_handed[rid] = (params, st)
                continue
            self._to_d(rid, dict(params))

    def _d_async_load(self, inst, rid, num_local, num_external):
        if rid not in self.p_of:
            return
        groups = inst.sched.kv_cache_manager.get_block_ids(rid)
        inst.pending_checks[rid] = {
            "tokens": self.prompts[self.p_of[rid]],
            "blocks": list(groups[0]), "local_tokens": num_local,
            "gblocks": [list(g) for g in groups],
            "salt": self.salt_of[rid]}

    # --- events ---

    def at(self, when: Callable[["Harness"], bool],
           what: Callable[["Harness"], None]) -> None:
        """Run what(h) once, between steps, the first time when(h)."""
        self.events.append((when, what))

    def _run_events(self) -> None:
        for ev in list(self.events):
            when, what = ev
            if when(self):
                self.events.remove(ev)
                what(self)

    # --- the loop ---

    def busy(self) -> bool:
        return any(not i.dead and (i.sched.has_requests() or i.batch_queue)
                   for i in (self.P, self.D))

    def step_once(self) -> bool:
        """One engine step of P, the proxy, one of D; whether any ran."""
        self._run_events()
        did = self.P.step()
        self._proxy()
        self._run_events()
        did = self.D.step() or did
        self.loop_steps += 1
        return did

    def settled(self) -> bool:
        """Nothing left to run (the batch queues drained)."""
        if self.busy() or self.events:
            return False
        for i in (self.P, self.D):
            i.drain()
        return not self.busy()

    def run(self, timeout: float = 60.0, until: Callable | None = None
            ) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            did = self.step_once()
            if until is not None and until(self):
                return
            if self.settled():
                return
            if not did:
                time.sleep(0.002)
            elif not self.P.sched.has_unfinished_requests() and \
                    not self.D.sched.has_unfinished_requests():
                time.sleep(0.001)  # only transfers left: do not spin
        raise TimeoutError("still busy after %.0f s: P %s, D %s" % (
            timeout, self.state(self.P), self.state(self.D)))

    @staticmethod
    def state(inst: Instance) -> str:
        s = inst.sched
        return ("requests=%s running=%d waiting=%d push_work=%s dead=%r" % (
            {k: v.status.name for k, v in list(s.requests.items())[:8]},
            len(s.running), len(s.waiting) + len(s.kv_holding_waiting),
            s.connector.has_pending_push_work(), inst.dead))

    def close(self) -> None:
        for i in (self.P, self.D):
            if i is not None:
                i.close()

    # --- results ---

    def d_results(self) -> dict:
        """Per D request: "ok" (loaded, every byte checked on every rank),
        the first mismatch, "load_error", or "unchecked"."""
        res = {}
        for did in self.p_of:
            whys = self.D.verified.get(did, [])
            if not whys:
                res[did] = "unchecked"
            elif any(w is None for w in whys):
                res[did] = "load_error"
            elif any(whys):
                res[did] = next(w for w in whys if w)
            elif len(whys) == self.D.spec.tp:
                res[did] = "ok"
            else:
                res[did] = "checked on %d of %d ranks" % (len(whys),
                                                          self.D.spec.tp)
        return res


def run_all(harnesses: list, timeout: float = 60.0) -> None:
    """Step several harnesses in turn (data-parallel engines sharing the
    two nodes' brokers) until all settled."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        did = False
        for h in harnesses:
            did = h.step_once() or did
        if all(h.settled() for h in harnesses):
            return
        if not did:
            time.sleep(0.002)
