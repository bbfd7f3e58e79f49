# SPDX-License-Identifier: MIT
"""Scheduler side of KVBrokerConnector (WRITE and READ modes).

P (kv_producer): a request with ``do_remote_decode`` is saved during its
last prefill chunk, from the blocks it holds *then*: the list follows every
SchedulerOutput (new requests, later chunks' new blocks, a resumed
request's list replacing the old one after a preemption). Its blocks stay
allocated until the workers report the save ended (request_finished returns
True), and request_finished returns the kv_transfer_params a proxy gives D.

D (kv_consumer): a request with ``do_remote_prefill`` loads what its own
prefix cache does not hold, asynchronously: the workers announce D's
unhashed blocks (the broker sends ``remote_blocks`` to P, and P writes its
last blocks into them) and report the load once it ended. A request that
loads nothing (a full local hit, or dropped before it was scheduled) still
releases P's blocks (a release-only open).

Each request is reported once, only while vLLM holds it: the scheduler's
asserts (``_update_from_kv_xfer_finished``) forbid anything else.

READ mode (``"mode": "read"``): P's blocks are followed as in WRITE mode;
with the last prefill chunk its workers open a READ transfer that holds
them (P's broker serves reads of a P worker's KV blocks only while one
holds them), ending on D's release or after ``read_lease_s``, reported in
finished_sending. request_finished keeps the blocks (True) and hands D
their ids with the params (a preemption or an abort before it ends the
hold, as it ends a WRITE save). D reads those blocks into its own
unhashed ones from start_load_kv (positions aligned: D's block i of the
prompt takes P's block i) and releases P's; the params say when P's hold
ends, and D does not read after that (a block P freed may hold another
request's KV).

Hybrid models (several KV cache groups, _groups.py): block ids come per
group; P saves and D loads each group's blocks (a sliding-window group only
those in the window of the prompt's next token, never the null block), in
one transfer per request whose parts the workers open per group.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from ._compat import KVConnectorMetadata, request_aborted
from ._groups import NULL_BLOCK, Group, skipped_blocks, sub_transfer_id
from ._params import Config, ParamsError, ReqMeta, parse_request

log = logging.getLogger("kvbroker.vllm")

_SUB_ID = re.compile(r"#g[0-9]+$")


class KVBrokerMetadata(KVConnectorMetadata):
    """One step's instructions from the scheduler to every worker."""

    def __init__(self):
        # P: open, save, seal (READ mode: open a hold of the blocks)
        self.reqs_to_save: list[ReqMeta] = []
        self.reqs_to_load: list[ReqMeta] = []  # D: open (announce), seal
        self.reqs_to_release: list[ReqMeta] = []  # D: P frees, no load
        self.reqs_to_abort: list[str] = []  # abort; reported when ended
        self.preempted: list[str] = []  # P: saves reading freed blocks
        # P: transfer ids of new requests (the broker holds D's
        # announcements of these; others fail D soon), and of requests
        # that went away before their save opened (D fails at once)
        self.expect: list[str] = []
        self.withdraw: list[str] = []

    def __repr__(self):
        return "KVBrokerMetadata(save=%d, load=%d, release=%d, abort=%d)" % (
            len(self.reqs_to_save), len(self.reqs_to_load),
            len(self.reqs_to_release), len(self.reqs_to_abort))


def _n_blocks(tokens: int, block_size: int) -> int:
    return (tokens + block_size - 1) // block_size


def _per_group(block_ids: Any, n_groups: int) -> list[list[int]]:
    """Block ids per KV cache group: vLLM gives a tuple of lists (one per
    group), or already one list (one group); None or () means none."""
    if block_ids and isinstance(block_ids[0], (list, tuple)):
        out = [list(g) for g in block_ids]
    else:
        out = [list(block_ids or [])]
    while len(out) < n_groups:
        out.append([])
    return out[:max(n_groups, 1)]


class _Save:
    """P: a request to be saved, and the blocks it holds now (per KV cache
    group)."""

    def __init__(self, request: Any, meta: ReqMeta, blocks: list[list[int]]):
        self.request = request
        self.meta = meta
        self.blocks = blocks


class BrokerScheduler:
    def __init__(self, vllm_config: Any, cfg: Config, producer: bool,
                 dp_size: int, dp_rank: int, tp_size: int,
                 groups: list[Group] | None = None):
        self.cfg = cfg
        # KV cache groups (empty: one, the connector's behaviour without a
        # kv_cache_config); their sliding windows (0: full attention)
        self.groups = list(groups or [])
        self.n_groups = max(1, len(self.groups))
        self.windows = [g.window for g in self.groups] or [0]
        # blocks per group, null blocks skipped (several groups, or one
        # sliding-window group)
        self.hybrid = self.n_groups > 1 or any(self.windows)
        self.producer = producer
        self.block_size = int(vllm_config.cache_config.block_size)
        self.kv_layout = str(getattr(vllm_config.cache_config,
                                     "kv_cache_layout", "") or "")
        self.dp_size, self.dp_rank, self.tp_size = dp_size, dp_rank, tp_size
        # P: requests waiting for their last prefill chunk; those whose
        # save went to the workers and was not reported yet (rid -> tid)
        self._save_pending: dict[str, _Save] = {}
        self._sending: dict[str, str] = {}
        # D: loads for the next step and those the workers run (rid ->
        # tid), releases for the next step
        self._load_next: dict[str, ReqMeta] = {}
        self._loading: dict[str, str] = {}
        self._release_next: list[ReqMeta] = []
        self._abort_next: list[str] = []
        self._save_aborted: set[str] = set()  # P: preempted mid-save
        # P, READ: when each request's hold ends (time.time(), for D)
        self._lease_until: dict[str, float] = {}
        # P, several groups: what each running save reads (rid -> lists)
        self._saved_lists: dict[str, list[list[int]]] = {}
        # P: ids of requests vLLM added, for the workers to declare (and
        # withdraw when a request goes before its save opened): rid -> tid
        self._expect_next: list[str] = []
        self._withdraw_next: list[str] = []
        self._expected: dict[str, str] = {}
        self._expected_tids: set[str] = set()
        self._live_tids: dict[str, str] = {}  # tid -> rid, both roles
        self._bad: set[str] = set()  # refused params, not asked again
        self.bad_params = 0
        self.duplicate_ids = 0

    def _refuse(self, request: Any, err: Any) -> None:
        rid = request.request_id
        if rid not in self._bad:
            self._bad.add(rid)
            self.bad_params += 1
            log.error("KVBrokerConnector: request %s: bad kv_transfer_params "
                      "(%s): %s", rid, err,
                      "its KV is not sent" if self.producer else
                      "its prompt is computed here, nothing is loaded")

    def _parse(self, request: Any) -> ReqMeta | None:
        try:
            return parse_request(request.kv_transfer_params,
                                 request.request_id, self.producer)
        except ParamsError as e:
            self._refuse(request, e)
            return None

    def _duplicate(self, rid: str, tid: str) -> bool:
        """A transfer id another live request of ours uses: two requests
        would share one transfer (and one's bytes be taken for the
        other's), so the second is refused (logged, counted)."""
        other = self._live_tids.get(tid)
        if other is None or other == rid:
            return False
        return True

    def _layout_mismatch(self, params: dict) -> str:
        theirs = params.get("kv_cache_layout")
        if isinstance(theirs, str) and theirs and self.kv_layout and \
                theirs != self.kv_layout:
            return ("P's KV cache layout is %s, ours %s: set the same "
                    "VLLM_KV_CACHE_LAYOUT on both" % (theirs, self.kv_layout))
        return ""

    def _mode_mismatch(self, params: dict) -> str:
        """P and D must run the same mode: a WRITE D would wait for writes
        a READ P never makes, a READ D would read blocks a WRITE P does
        not hold for it."""
        theirs = "read" if params.get("mode") == "read" else "write"
        ours = "read" if self.cfg.read else "write"
        if theirs == ours:
            return ""
        return "P runs %s mode, this D %s mode (kv_connector_extra_config " \
            "\"mode\" must be the same on both)" % (theirs.upper(),
                                                      ours.upper())

    def _groups_mismatch(self, params: dict) -> str:
        """D: P's KV cache groups (their sliding windows, in order) are
        not ours: each group's blocks would land in another's layers."""
        theirs = params.get("kv_cache_groups")
        if theirs is None:
            theirs = [0]  # a P without hybrid support: one group
        if not isinstance(theirs, list) or \
                any(isinstance(w, bool) or not isinstance(w, int)
                    for w in theirs):
            return "kv_cache_groups: %r is not a list of windows" % (theirs,)
        if theirs != self.windows:
            return ("P's KV cache groups (sliding windows %s, 0 = full "
                    "attention) are not ours (%s): the same model and "
                    "hybrid KV cache manager setting on both" %
                    (theirs, self.windows))
        return ""

    def _sub_ids(self, tid: str) -> list[str]:
        return [sub_transfer_id(tid, g) for g in range(self.n_groups)]

    def _load_params(self, request: Any) -> tuple[str, ReqMeta | None]:
        """D: the request's load, or why there is none: "no_remote" (not
        ours), "bad" (refused, logged and counted once), "duplicate"."""
        params = request.kv_transfer_params
        if not params:
            return "no_remote", None
        if not isinstance(params, dict):  # from outside: refuse, not raise
            self._parse(request)
            return "bad", None
        if not params.get("do_remote_prefill"):
            return "no_remote", None
        if request.request_id in self._bad:
            return "bad", None
        m = self._parse(request)
        if m is None:
            return "bad", None
        why = self._layout_mismatch(params) or \
            self._groups_mismatch(params) or self._mode_mismatch(params) \
            or (self.cfg.read and self._read_params(request, params, m))
        if why:
            self._refuse(request, why)
            return "bad", None
        if self.n_groups > 1 and not self._parse_tid_len(request, m):
            return "bad", None
        if self._duplicate(request.request_id, m.transfer_id):
            return "duplicate", m
        return "", m

    # --- vLLM scheduler-side calls ---

    def on_new_request(self, request: Any) -> None:
        """P: vLLM added the request (Scheduler.add_request): its workers
        declare its transfer id at the next step, long before the save
        opens, so that P's broker tells it from an id no one will open."""
        if not self.producer or self.cfg.read:  # READ: D announces nothing
            return
        params = request.kv_transfer_params
        if not isinstance(params, dict) or not params.get("do_remote_decode"):
            return
        tid = params.get("transfer_id")
        if not isinstance(tid, str) or not tid or \
                len(tid.encode("utf-8", "replace")) > self._tid_max() or \
                tid in self._live_tids or tid in self._expected_tids:
            return  # refused later, with its reason, or another's
        self._expected[request.request_id] = tid
        self._expected_tids.add(tid)
        self._expect_next.extend(self._sub_ids(tid))

    def _tid_max(self) -> int:
        """The longest transfer id: the broker's 255 bytes, less the
        suffix of the groups' sub-transfers."""
        if self.n_groups == 1:
            return 255
        return 255 - len(sub_transfer_id("", self.n_groups - 1))

    def _parse_tid_len(self, request: Any, m: ReqMeta) -> bool:
        """Several groups: the transfer id leaves room for the groups'
        sub-transfer ids, and is not one of them (another request's part)."""
        if len(m.transfer_id.encode()) > self._tid_max():
            why = "longer than %d bytes" % self._tid_max()
        elif _SUB_ID.search(m.transfer_id):
            why = "ends like a KV cache group's sub-transfer (#g<k>)"
        else:
            return True
        self._refuse(request, "transfer_id: %s (its %d KV cache groups move "
                     "as sub-transfers <id>#g<k>)" % (why, self.n_groups))
        return False

    def _withdraw(self, rid: str) -> None:
        """P: the request went away (or will not be sent) before its save
        opened: D's load of it fails at once."""
        tid = self._expected.pop(rid, None)
        if tid is not None:
            self._expected_tids.discard(tid)
            self._withdraw_next.extend(self._sub_ids(tid))

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int):
        if self.producer:
            return 0, False
        if self._load_params(request)[0]:
            return 0, False
        # vLLM hands the block-aligned local prefix hit: D loads the rest
        n = int(request.num_prompt_tokens) - int(num_computed_tokens)
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        rid = request.request_id
        if not params or rid in self._bad:
            return
        if not isinstance(params, dict):
            self._parse(request)  # logged and counted once
            return
        if self.producer:
            if params.get("do_remote_decode"):
                self._p_alloc(request, blocks)
            return
        why, m = self._load_params(request)
        if m is None:
            return
        params["do_remote_prefill"] = False  # one transfer per request
        if why == "duplicate":
            self.duplicate_ids += 1
            log.error("KVBrokerConnector: request %s: transfer_id %r is "
                      "already loading for request %s: computed here",
                      rid, m.transfer_id, self._live_tids[m.transfer_id])
            return
        if num_external_tokens <= 0:
            # its whole prompt is in D's prefix cache (or its partial
            # tail is): nothing to load, but P still holds its blocks
            self._release_next.append(m)
            return
        per = _per_group(blocks.get_block_ids(), self.n_groups)
        n_prompt = int(request.num_prompt_tokens)
        # the local hit is block-aligned: its blocks are D's own (prefix
        # cached), only the rest is filled (P writes its last blocks). A
        # sliding-window group holds null blocks where vLLM skipped what the
        # window no longer reaches: those are not filled (P sends none)
        first = (n_prompt - int(num_external_tokens)) // self.block_size
        nb = _n_blocks(n_prompt, self.block_size)
        lists = [[b for b in ids[first:nb] if b != NULL_BLOCK]
                 for ids in per] if self.hybrid else \
            [per[0][first:nb]]
        m.block_ids = lists[0]
        if self.n_groups > 1:
            m.group_block_ids = lists
        if self.cfg.read:
            self._read_pairs(m, per, first, nb)
        self._load_next[rid] = m
        self._live_tids[m.transfer_id] = rid

    def _read_params(self, request: Any, params: dict, m: ReqMeta) -> str:
        """D, READ mode: P's blocks of the prompt, per KV cache group (each
        list ends at the prompt's last block: a sliding-window group's
        starts where P's window does), and when P's hold on them ends,
        into m; or why the params cannot say."""
        nb = _n_blocks(int(request.num_prompt_tokens), self.block_size)
        remote = params.get("remote_block_ids")
        lists = remote if self.hybrid else [remote]
        if isinstance(remote, list) and len(remote) == 1 and \
                isinstance(remote[0], list) and not self.hybrid:
            lists = remote  # one KV cache group's list, HMA-shaped
        if not isinstance(lists, list) or len(lists) != self.n_groups:
            return "remote_block_ids: not %d KV cache groups' lists" % \
                self.n_groups
        out = []
        for lst in lists:
            if not isinstance(lst, list) or not all(
                    isinstance(b, int) and not isinstance(b, bool) and
                    0 <= b < (1 << 31) for b in lst):
                return "remote_block_ids: not lists of block ids"
            if self.hybrid:
                if len(lst) > nb:
                    return "remote_block_ids: %d blocks for a prompt of " \
                        "%d" % (len(lst), nb)
                out.append(list(lst))
            elif len(lst) < nb:
                return "remote_block_ids: %d blocks for a prompt of %d " \
                    "(READ mode reads P's blocks of the prompt)" % (
                        len(lst), nb)
            else:
                out.append(list(lst[:nb]))
        lease = params.get("lease_until")
        if isinstance(lease, bool) or \
                not isinstance(lease, (int, float)) or lease <= 0:
            return "lease_until: %r is not a time" % (lease,)
        m.group_remote_block_ids = out
        m.remote_block_ids = out[0]
        m.lease_until = float(lease)
        return ""

    def _read_pairs(self, m: ReqMeta, per: list[list[int]], first: int,
                    nb: int) -> None:
        """D, READ mode: for each block D fills (prompt positions first ..
        nb, a sliding-window group's null blocks skipped), P's block at the
        same position. A position P's lists do not reach fails the load
        (m.refused): nothing is read."""
        remote = []
        for g, ids in enumerate(per if self.hybrid else per[:1]):
            theirs = m.group_remote_block_ids[g]
            off = nb - len(theirs)  # P's list starts at this position
            rl = []
            for i in range(first, nb):
                if self.hybrid and ids[i] == NULL_BLOCK:
                    continue
                if i < off:
                    m.refused = ("KV cache group %d: P holds no block for "
                                 "prompt block %d (its list starts at %d)"
                                 % (g, i, off))
                    return
                rl.append(theirs[i - off])
            remote.append(rl)
        m.remote_block_ids = remote[0]
        m.group_remote_block_ids = remote if self.n_groups > 1 else []

    def _p_alloc(self, request: Any, blocks: Any) -> None:
        rid = request.request_id
        s = self._save_pending.get(rid)
        if s is not None:  # resumed after a preemption: its blocks now
            s.blocks = _per_group(blocks.get_block_ids(), self.n_groups)
            return
        if rid in self._sending:
            return
        m = self._parse(request)
        if m is None:
            return
        if self.n_groups > 1 and not self._parse_tid_len(request, m):
            return
        if self._duplicate(rid, m.transfer_id):
            self.duplicate_ids += 1
            log.error("KVBrokerConnector: request %s: transfer_id %r is "
                      "already used by request %s: its KV is not sent", rid,
                      m.transfer_id, self._live_tids[m.transfer_id])
            self._bad.add(rid)
            return
        self._save_pending[rid] = _Save(
            request, m, _per_group(blocks.get_block_ids(), self.n_groups))
        self._live_tids[m.transfer_id] = rid

    def build_connector_meta(self, scheduler_output: Any) -> KVBrokerMetadata:
        meta = KVBrokerMetadata()
        if self.producer:
            self._meta_saves(scheduler_output, meta)
            meta.expect, self._expect_next = self._expect_next, []
            meta.withdraw, self._withdraw_next = self._withdraw_next, []
        meta.reqs_to_load = list(self._load_next.values())
        for rid, m in self._load_next.items():
            self._loading[rid] = m.transfer_id
        self._load_next.clear()
        meta.reqs_to_release, self._release_next = self._release_next, []
        meta.reqs_to_abort, self._abort_next = self._abort_next, []
        return meta

    def _track_blocks(self, so: Any) -> None:
        """P: each pending save's block list as the workers hold it."""
        pend = self._save_pending
        ng = self.n_groups
        for rid in getattr(so, "preempted_req_ids", None) or ():
            if rid in pend:  # its blocks went back to the pool
                pend[rid].blocks = [[] for _ in range(ng)]
        for nr in getattr(so, "scheduled_new_reqs", None) or ():
            # new, or (V2 runner) resumed after a preemption: all its ids
            if nr.req_id in pend:
                pend[nr.req_id].blocks = _per_group(nr.block_ids, ng)
        cached = getattr(so, "scheduled_cached_reqs", None)
        if cached is None:
            return
        resumed = getattr(cached, "resumed_req_ids", None) or ()
        for i, rid in enumerate(getattr(cached, "req_ids", None) or ()):
            s = pend.get(rid)
            if s is None:
                continue
            nb = _per_group(cached.new_block_ids[i], ng)
            if rid in resumed:  # V1 runner: the list is replaced
                s.blocks = nb
            else:
                for have, new in zip(s.blocks, nb):
                    have.extend(new)

    def _meta_saves(self, so: Any, meta: KVBrokerMetadata) -> None:
        for rid in getattr(so, "preempted_req_ids", None) or ():
            if rid in self._sending:  # its save reads freed blocks
                meta.preempted.append(rid)
                self._save_aborted.add(rid)
        self._track_blocks(so)
        sched = getattr(so, "num_scheduled_tokens", {}) or {}
        for rid in list(self._save_pending):
            s = self._save_pending[rid]
            n = sched.get(rid, 0)
            request = s.request
            if n <= 0:
                continue
            if request.num_computed_tokens + n < request.num_prompt_tokens:
                continue  # not the last prefill chunk
            lists, why = self._save_lists(s)
            if why:
                log.error("KVBrokerConnector: request %s: %s: its KV is not "
                          "sent", rid, why)
                self._withdraw(rid)
                del self._save_pending[rid]
                self._live_tids.pop(s.meta.transfer_id, None)
                continue
            s.meta.block_ids = lists[0]
            if self.n_groups > 1:
                s.meta.group_block_ids = lists
            self._expected_tids.discard(  # opened by this step's workers
                self._expected.pop(rid, ""))
            meta.reqs_to_save.append(s.meta)
            if self.hybrid or self.cfg.read:
                self._saved_lists[rid] = lists
            if self.cfg.read:  # the workers open the hold at this step
                self._lease_until[rid] = time.time() + self.cfg.read_lease_s
            self._sending[rid] = s.meta.transfer_id
            del self._save_pending[rid]

    def _save_lists(self, s: _Save) -> tuple[list[list[int]], str]:
        """P: per group, the prompt's blocks D will read: all of them for
        full attention; for a sliding window only those the window of the
        prompt's next token reaches (vLLM frees the others before
        request_finished: a save must not read them). Or why not."""
        n = int(s.request.num_prompt_tokens)
        nb = _n_blocks(n, self.block_size)
        out = []
        for g, (have, w) in enumerate(zip(s.blocks, self.windows)):
            if len(have) < nb:
                return [], "%d blocks known in KV cache group %d for a " \
                    "prompt of %d" % (len(have), g, nb)
            lst = have[skipped_blocks(w, n, self.block_size):nb]
            if self.hybrid and NULL_BLOCK in lst:
                return [], "KV cache group %d holds the null block in " \
                    "the window" % g
            out.append(lst)
        return out, ""

    def update_connector_output(self, connector_output: Any) -> None:
        for rid in getattr(connector_output, "finished_sending", None) or ():
            tid = self._sending.pop(rid, None)
            if tid is not None and self._live_tids.get(tid) == rid:
                del self._live_tids[tid]
        for rid in getattr(connector_output, "finished_recving", None) or ():
            tid = self._loading.pop(rid, None)
            if tid is not None and self._live_tids.get(tid) == rid:
                del self._live_tids[tid]

    def request_finished_all_groups(self, request: Any, block_ids: Any):
        """vLLM's SupportsHMA call (instead of request_finished): the
        request's block ids per KV cache group, out-of-window sliding
        window blocks already null."""
        per = _per_group(block_ids, self.n_groups)
        if not self.hybrid:
            return self.request_finished(request, per[0])
        rid = request.request_id
        if self.producer and rid in self._sending and \
                rid not in self._save_aborted and \
                not self._holds_saved(rid, per):
            # vLLM freed a block the save reads: nothing of it may go to D
            log.error("KVBrokerConnector: request %s: a block its save "
                      "reads was freed before it finished: not sent", rid)
            self._save_aborted.add(rid)
            self._abort_next.append(rid)
        return self.request_finished(request, per)

    def _holds_saved(self, rid: str, per: list[list[int]]) -> bool:
        saved = self._saved_lists.get(rid)
        if saved is None:
            return True
        return all(set(lst) <= set(have) for lst, have in zip(saved, per))

    def request_finished(self, request: Any, block_ids: Any):
        rid = request.request_id
        self._bad.discard(rid)
        if self.producer:
            s = self._save_pending.pop(rid, None)
            if s is not None and \
                    self._live_tids.get(s.meta.transfer_id) == rid:
                del self._live_tids[s.meta.transfer_id]
            self._withdraw(rid)  # never saved: D need not wait
            saved = self._saved_lists.pop(rid, None)
            lease = self._lease_until.pop(rid, 0.0)
            if rid not in self._sending:
                return False, None
            if rid in self._save_aborted:  # D would wait for nothing
                self._save_aborted.discard(rid)
                return True, None
            if request_aborted(request):
                self._abort_next.append(rid)
                return True, None
            p = self._params_for_d(request, block_ids, saved)
            if self.cfg.read:  # D reads remote_block_ids until then
                p["lease_until"] = lease
                p["mode"] = "read"
            return True, p
        if rid in self._load_next or rid in self._loading:
            # dropped while loading: vLLM keeps its blocks until it comes
            # back in finished_recving (the workers abort the transfer and
            # report it when no byte of it can land any more)
            self._abort_next.append(rid)
            return False, None
        params = request.kv_transfer_params
        if isinstance(params, dict) and params.get("do_remote_prefill"):
            # dropped before it was scheduled: P still holds its blocks
            try:
                m = parse_request(params, rid, False)
            except ParamsError:
                return False, None
            params["do_remote_prefill"] = False
            if not self._duplicate(rid, m.transfer_id):
                self._release_next.append(m)
        return False, None

    def _params_for_d(self, request: Any, block_ids: Any,
                      saved: list | None) -> dict:
        c = self.cfg
        if self.hybrid:
            # per group, the blocks P saves: WRITE, informative (D
            # announces its own; P's broker writes its last blocks into
            # them); READ, what D reads (each list ends at the prompt's
            # last block)
            remote = [list(x) for x in saved] if saved else \
                [[b for b in lst if b != NULL_BLOCK]
                 for lst in _per_group(block_ids, self.n_groups)]
        elif self.cfg.read:
            remote = list(saved[0])  # the prompt's blocks, held
        else:
            remote = _per_group(block_ids, 1)[0]
        p = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "transfer_id": request.kv_transfer_params["transfer_id"],
            "remote_block_ids": remote,
            "remote_engine_id": "%s:%d" % (c.host_ip, c.handshake_port),
            "remote_host": c.host_ip,
            "remote_handshake_port": c.handshake_port,
            "remote_notify_port": c.notify_port,
            "remote_dp_rank": self.dp_rank,
            "remote_dp_size": self.dp_size,
            "remote_tp_size": self.tp_size,
            "tp_size": self.tp_size,
        }
        if self.kv_layout:
            p["kv_cache_layout"] = self.kv_layout
        if self.hybrid:
            p["kv_cache_groups"] = list(self.windows)
        return p

    def has_pending_push_work(self) -> bool:
        return bool(self._sending)
