# SPDX-License-Identifier: MIT
"""KVBrokerConnector between two vLLM instances on two "nodes".

Two network namespaces joined by a veth pair (192.0.2.1 = P, prefill;
192.0.2.2 = D, decode), one broker in each over tcp, created here and
deleted at the end whatever happens. Each instance is
tests/python/vllm_instance.py (vLLM's scheduler and one worker process per
TP rank, driven in vLLM's call order); P's request_finished params reach D
as a proxy passes them. Needs root and ip(8); skipped otherwise.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("KVB_BUILD_DIR", os.path.join(ROOT, "build"))
BROKER = os.environ.get("KVB_BROKER_BIN") or os.path.join(BUILD, "broker",
                                                          "kvbroker")
INSTANCE = os.path.join(HERE, "vllm_instance.py")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else \
    sys.executable
TTO = 8  # the brokers' --transfer-timeout and --defer-timeout (s)
_seq = itertools.count()

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and ip(8) for network namespaces")


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True,
                          text=True, timeout=30)


class Nodes:
    """Two namespaces, a veth pair, a broker in each."""

    def __init__(self):
        if not os.access(BROKER, os.X_OK):
            pytest.skip("no broker at %s (KVB_BROKER_BIN)" % BROKER)
        tag = "%d%d" % (os.getpid() % 100000, next(_seq))
        self.ns = {"a": "kvbvA" + tag, "b": "kvbvB" + tag}
        self.ipaddr = {"a": "192.0.2.1", "b": "192.0.2.2"}
        self.dir = tempfile.mkdtemp(prefix="kvb-vllm.")
        self.brokers: dict[str, subprocess.Popen] = {}
        self.procs: list[subprocess.Popen] = []
        if _ip("netns", "add", self.ns["a"], check=False).returncode:
            shutil.rmtree(self.dir)
            pytest.skip("cannot create network namespaces")
        try:
            _ip("netns", "add", self.ns["b"])
            va, vb = "vva" + tag, "vvb" + tag
            _ip("link", "add", va, "type", "veth", "peer", "name", vb)
            _ip("link", "set", va, "netns", self.ns["a"])
            _ip("link", "set", vb, "netns", self.ns["b"])
            for n, dev in (("a", va), ("b", vb)):
                _ip("-n", self.ns[n], "addr", "add", self.ipaddr[n] + "/24",
                    "dev", dev)
                _ip("-n", self.ns[n], "link", "set", "lo", "up")
                _ip("-n", self.ns[n], "link", "set", dev, "up")
            for n in ("a", "b"):
                self.start_broker(n)
        except BaseException:
            self.close()
            raise

    def sock(self, n):
        return os.path.join(self.dir, n + ".sock")

    def start_broker(self, n):
        log = open(os.path.join(self.dir, "broker-%s.log" % n), "ab")
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.ns[n], BROKER, "--socket",
             self.sock(n), "--host-ip", self.ipaddr[n], "--transport", "tcp",
             "--transfer-timeout", str(TTO), "--defer-timeout", str(TTO),
             "--busy-poll-us", "20"], stdout=log, stderr=log)
        self.brokers[n] = p
        end = time.monotonic() + 30
        while not os.path.exists(self.sock(n)):
            if p.poll() is not None or time.monotonic() > end:
                raise RuntimeError("broker %s did not start: %s" %
                                   (n, self.logs()))
            time.sleep(0.05)

    def kill_broker(self, n):
        p = self.brokers[n]
        # ip netns exec execs the broker: this pid is the broker's
        p.send_signal(signal.SIGKILL)
        p.wait(10)

    def run(self, p_args, d_args, timeout=45.0, on_paused=None):
        """Run P on a and D on b; return (P's result, D's result)."""
        common = ["--dir", self.dir, "--timeout", str(timeout - 5),
                  "--transfer-timeout", str(TTO + 4)]
        procs = {}
        for role, n, peer, extra in (("P", "a", "b", p_args),
                                     ("D", "b", "a", d_args)):
            log = open(os.path.join(self.dir, "inst-%s.log" % role), "ab")
            procs[role] = subprocess.Popen(
                ["ip", "netns", "exec", self.ns[n], PY, INSTANCE, "--role",
                 role, "--socket", self.sock(n), "--host-ip",
                 self.ipaddr[n], "--peer-ip", self.ipaddr[peer]] + common +
                list(extra), stdout=log, stderr=log, env=os.environ.copy())
            self.procs.append(procs[role])
        end = time.monotonic() + timeout
        paused = os.path.join(self.dir, "paused")
        while any(p.poll() is None for p in procs.values()):
            if on_paused and os.path.exists(paused):
                on_paused()
                on_paused = None
            if time.monotonic() > end:
                for p in procs.values():
                    p.kill()
                pytest.fail("instances still running after %.0f s (a hang)"
                            "\n%s" % (timeout, self.logs()))
            time.sleep(0.05)
        out = []
        for role in ("P", "D"):
            path = os.path.join(self.dir, "result-%s.json" % role)
            assert os.path.exists(path), "no result from %s\n%s" % (
                role, self.logs())
            with open(path) as f:
                res = json.load(f)
            assert "error" not in res, res["error"] + self.logs()
            out.append(res)
        return out

    def logs(self):
        text = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.dir, name), "rb") as f:
                    tail = f.read()[-12000:].decode("utf-8", "replace")
                text.append("---- %s\n%s" % (name, tail))
        return "\n".join(text)

    def close(self):
        for p in self.procs + list(self.brokers.values()):
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for n in ("a", "b"):
            _ip("netns", "del", self.ns[n], check=False)
        if not os.environ.get("KVB_TEST_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def nodes():
    n = Nodes()
    try:
        yield n
    finally:
        n.close()


def _summary(res):
    return {k: (len(v) if isinstance(v, list) else v) for k, v in res.items()
            if k not in ("worker_stats",)}


def _check_all_sent(p, n):
    assert sorted(p["sent"]) == sorted("req-%d" % i for i in range(n)), \
        _summary(p)
    assert not p["unfinished"], _summary(p)


@pytest.mark.parametrize("ptp,dtp,layout,pheads,dheads", [
    (2, 2, "hnd", 4, 4),  # vLLM's HND KV layout, whole blocks
    (1, 2, "block", 8, 4),  # FlashInfer's blocks-first, heads split 8 -> 4+4
], ids=["tp2_to_tp2_hnd", "tp1_to_tp2_heads_split"])
def test_write(nodes, ptp, dtp, layout, pheads, dheads):
    """64 requests x 32 layers, every byte checked on every D rank."""
    common = ["--layers", "32", "--requests", "64", "--layout", layout]
    p, d = nodes.run(
        ["--tp", str(ptp), "--peer-tp", str(dtp), "--heads", str(pheads)]
        + common,
        ["--tp", str(dtp), "--peer-tp", str(ptp), "--heads", str(dheads)]
        + common)
    _check_all_sent(p, 64)
    assert len(d["ok"]) == 64, (_summary(d), d["bad_verify"])
    assert not d["bad"] and not d["load_error"] and not d["unfinished"]
    for st in p["worker_stats"]:
        assert st["ok"] == 64 and st["failed"] == 0, st
    for st in d["worker_stats"]:
        assert st["ok"] == 64 and st["failed"] == 0, st


def test_d_aborts(nodes):
    """D drops requests whose loads are under way: the connector asks for
    no delay (vLLM holds a request dropped in WAITING_FOR_REMOTE_KVS
    itself) and names each once in finished_recving, once its transfer
    ended (P can no longer write its blocks); the others load intact,
    nothing hangs."""
    aborted = [3, 17, 40, 41, 63]
    common = ["--layers", "32", "--requests", "64", "--tp", "2",
              "--peer-tp", "2"]
    p, d = nodes.run(common, common + ["--abort",
                                       ",".join(map(str, aborted))])
    _check_all_sent(p, 64)
    assert sorted(d["aborted"]) == sorted("req-%d" % i for i in aborted), \
        _summary(d)
    assert not d["abort_delayed"] and not d["recv_after_abort"]
    assert len(d["ok"]) == 64 - len(aborted), _summary(d)
    assert not d["bad"] and not d["unfinished"], _summary(d)
    for st in d["worker_stats"]:
        assert st["aborted"] == len(aborted), st


def test_p_broker_killed(nodes):
    """P's broker is SIGKILLed in the middle of a step: D's loads that can
    no longer finish are reported (their blocks as load errors, so vLLM
    recomputes them) within the connector's transfer timeout; P's workers fail their
    transfers and report them; no process hangs."""
    killed_at = []

    def kill():
        nodes.kill_broker("a")
        killed_at.append(time.monotonic())

    common = ["--layers", "32", "--requests", "64", "--tp", "2",
              "--peer-tp", "2"]
    t0 = time.monotonic()
    p, d = nodes.run(common + ["--pause-when-d-ok", "8", "--pause-s", "1.5"],
                     common, timeout=50, on_paused=kill)
    assert killed_at, "P never paused"
    assert not p["unfinished"] and not d["unfinished"], (_summary(p),
                                                        _summary(d))
    assert all(st["broker_gone"] for st in p["worker_stats"])
    assert len(d["ok"]) >= 8, _summary(d)  # the steps before the kill
    assert d["load_error"], _summary(d)
    assert not d["bad"], d["bad_verify"]
    assert len(d["ok"]) + len(d["load_error"]) == d["seen"], _summary(d)
    # every failure within the connector's transfer timeout (TTO + 4: D's
    # broker no longer fails a load that only waits for P at the stall
    # timeout, docs/deadlines.md), its 5 s grace after the abort, and
    # scheduling slack
    for t in d["load_error_t"]:
        assert t < killed_at[0] - t0 + TTO + 4 + 5 + 8, (t,
                                                         killed_at[0] - t0)


def test_malformed_params(nodes):
    """Bad kv_transfer_params at P (no transfer_id) and at D (no
    transfer_id, a port that is not a number, a host that is not a string,
    a port where nobody answers): each is refused with a logged error and
    counted, or fails at the worker as a load error; the other requests
    load intact."""
    bad_p = [5, 30]
    bad_d = [8, 9, 10, 11, 20, 21, 22, 23]  # i % 4 picks the kind
    n = 48
    common = ["--layers", "32", "--requests", str(n), "--tp", "2",
              "--peer-tp", "2", "--bad-p", ",".join(map(str, bad_p))]
    p, d = nodes.run(common, common + ["--bad-d",
                                       ",".join(map(str, bad_d))])
    assert p["bad_params"] == len(bad_p), _summary(p)
    assert sorted(p["not_sent"]) == sorted("req-%d" % i for i in bad_p)
    assert not p["unfinished"], _summary(p)
    # kinds 0-2 are refused by D's scheduler, kind 3 fails at the worker
    refused = [i for i in bad_d if i % 4 != 3]
    assert d["bad_params"] == len(refused), _summary(d)
    assert sorted(d["local"]) == sorted("req-%d" % i for i in refused)
    assert sorted(d["load_error"]) == sorted(
        "req-%d" % i for i in bad_d if i % 4 == 3), _summary(d)
    good = n - len(bad_p) - len(bad_d)
    assert len(d["ok"]) == good, (_summary(d), d["bad_verify"])
    assert not d["bad"] and not d["unfinished"]
