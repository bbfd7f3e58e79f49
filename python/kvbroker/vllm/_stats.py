# SPDX-License-Identifier: MIT
"""KVBrokerConnector's transfer statistics, in vLLM's connector-stats form.

Each worker collects, between two calls of vLLM's
``get_kv_connector_stats``, what its transfers did (a
:class:`KVBrokerConnectorStats`); vLLM aggregates the TP ranks' objects
(``aggregate``), ships ``.data`` to its logging process, which rebuilds it
with ``KVBrokerConnector.build_kv_connector_stats(data)``, logs ``reduce()``
every interval and feeds ``build_prom_metrics``'s object
(:class:`KVBrokerPromMetrics`) every observation, under ``vllm:kvbroker_*``
names, as ``vllm:nixl_*`` does for NIXL.

``data`` holds only lists, numbers and dicts (it is pickled across
processes):

- ``transfer_duration`` (s), ``bytes_transferred``, ``num_blocks``: one
  entry per transfer that ended well, from its open to its completion. P
  counts the blocks it offered (D may take its last ones only), D the
  blocks it received.
- ``post_duration`` (s): one entry per step that opened transfers, the
  time of that step's open round trip to the broker.
- ``descs_per_doorbell``: the broker's descriptors (work requests) per
  doorbell since the previous sample, sampled at most every 5 s.
- ``failed``: ``{errno name: count}`` of transfers that failed;
  ``aborted``: transfers ended because vLLM dropped their request.
"""

from __future__ import annotations

import copy
import errno as _errno
from dataclasses import dataclass
from typing import Any

try:  # pragma: no cover - vLLM is not installed where the tests run
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics, KVConnectorStats)
except ImportError:  # vLLM's classes, same members and defaults
    from dataclasses import field

    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        data: dict[str, Any] = field(default_factory=dict)

        def reset(self):
            raise NotImplementedError

        def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
            raise NotImplementedError

        def reduce(self) -> dict[str, int | float]:
            raise NotImplementedError

        def is_empty(self) -> bool:
            raise NotImplementedError

    class KVConnectorPromMetrics:  # type: ignore[no-redef]
        def __init__(self, vllm_config: Any, metric_types: dict,
                     labelnames: list[str],
                     per_engine_labelvalues: dict[int, list[object]]):
            self._kv_transfer_config = vllm_config.kv_transfer_config
            # vLLM keys the dict by prometheus_client's classes; without
            # it, by their names
            self._gauge_cls = _by_name(metric_types, "Gauge")
            self._counter_cls = _by_name(metric_types, "Counter")
            self._histogram_cls = _by_name(metric_types, "Histogram")
            self._labelnames = labelnames
            self.per_engine_labelvalues = per_engine_labelvalues

        def observe(self, transfer_stats_data: dict[str, Any],
                    engine_idx: int = 0):
            raise NotImplementedError


def _by_name(metric_types: dict, name: str) -> Any:
    for k, v in metric_types.items():
        if getattr(k, "__name__", k) == name:
            return v
    raise KeyError(name)


_LISTS = ("transfer_duration", "bytes_transferred", "num_blocks",
          "post_duration", "descs_per_doorbell")


def _pct(v: list, q: float) -> float:
    s = sorted(v)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def errno_name(status: int) -> str:
    return _errno.errorcode.get(-int(status), "E%d" % -int(status))


@dataclass
class KVBrokerConnectorStats(KVConnectorStats):
    def __post_init__(self):
        if not self.data:
            self.reset()
        for k in _LISTS:  # data from an older connector: what it lacks
            self.data.setdefault(k, [])
        self.data.setdefault("failed", {})
        self.data.setdefault("aborted", 0)

    def reset(self):
        self.data = {k: [] for k in _LISTS}
        self.data["failed"] = {}
        self.data["aborted"] = 0

    def record_transfer(self, seconds: float, nbytes: int,
                        nblocks: int) -> None:
        self.data["transfer_duration"].append(float(seconds))
        self.data["bytes_transferred"].append(int(nbytes))
        self.data["num_blocks"].append(int(nblocks))

    def record_failed(self, status: int) -> None:
        name = errno_name(status)
        self.data["failed"][name] = self.data["failed"].get(name, 0) + 1

    def record_aborted(self) -> None:
        self.data["aborted"] += 1

    def record_post(self, seconds: float) -> None:
        self.data["post_duration"].append(float(seconds))

    def record_descs_per_doorbell(self, v: float) -> None:
        self.data["descs_per_doorbell"].append(float(v))

    def clone_and_reset(self) -> "KVBrokerConnectorStats":
        old = copy.deepcopy(self)
        self.reset()
        return old

    def is_empty(self) -> bool:
        d = self.data
        return not (d["transfer_duration"] or d["failed"] or d["aborted"] or
                    d["post_duration"] or d["descs_per_doorbell"])

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        o = getattr(other, "data", None) or {}
        for k in _LISTS:
            self.data[k].extend(o.get(k, ()))
        for k, n in (o.get("failed") or {}).items():
            self.data["failed"][k] = self.data["failed"].get(k, 0) + int(n)
        self.data["aborted"] += int(o.get("aborted", 0) or 0)
        return self

    @property
    def num_successful_transfers(self) -> int:
        return len(self.data["transfer_duration"])

    def reduce(self) -> dict[str, int | float]:
        d = self.data
        n = self.num_successful_transfers
        out: dict[str, int | float] = {"Num successful transfers": n}
        if n:
            t = d["transfer_duration"]
            mb = sum(d["bytes_transferred"]) / 2**20
            out["Avg xfer time (ms)"] = round(1e3 * sum(t) / n, 3)
            out["P90 xfer time (ms)"] = round(1e3 * _pct(t, 0.9), 3)
            out["Avg MB per transfer"] = round(mb / n, 3)
            out["Throughput (MB/s)"] = round(mb / sum(t), 3) if sum(t) else 0.0
            out["Avg blocks per transfer"] = round(sum(d["num_blocks"]) / n, 1)
        if d["post_duration"]:
            out["Avg post time (ms)"] = round(
                1e3 * sum(d["post_duration"]) / len(d["post_duration"]), 3)
        if d["descs_per_doorbell"]:
            out["Descriptors per doorbell"] = round(
                sum(d["descs_per_doorbell"]) / len(d["descs_per_doorbell"]),
                2)
        out["Num failed transfers"] = sum(d["failed"].values())
        for k in sorted(d["failed"]):
            out["Failed (%s)" % k] = d["failed"][k]
        out["Num aborted transfers"] = d["aborted"]
        return out


class KVBrokerPromMetrics(KVConnectorPromMetrics):
    """``vllm:kvbroker_*``: histograms of transfer time, post time, bytes
    and blocks per transfer and descriptors per doorbell; counters of
    failed transfers (label ``reason``: the errno name) and of aborted
    ones. One child per engine (vLLM's per-engine label values)."""

    def __init__(self, vllm_config: Any, metric_types: dict,
                 labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]):
        super().__init__(vllm_config, metric_types, labelnames,
                         per_engine_labelvalues)
        times = [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5,
                 0.75, 1.0, 5.0]
        h, c = self._histogram_cls, self._counter_cls
        self._labels = list(labelnames)

        def per_engine(m):
            return {i: m.labels(*v) for i, v in per_engine_labelvalues.items()}

        self.xfer_time = per_engine(h(
            name="vllm:kvbroker_xfer_time_seconds",
            documentation="KV transfers through kvbroker: time from open "
            "to completion",
            buckets=times, labelnames=labelnames))
        self.post_time = per_engine(h(
            name="vllm:kvbroker_post_time_seconds",
            documentation="A step's transfer opens: the round trip to the "
            "broker", buckets=[1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01,
                               0.05, 0.1], labelnames=labelnames))
        self.nbytes = per_engine(h(
            name="vllm:kvbroker_bytes_transferred",
            documentation="Bytes per KV transfer through kvbroker",
            buckets=[2.0**k for k in range(12, 34, 2)],
            labelnames=labelnames))
        self.nblocks = per_engine(h(
            name="vllm:kvbroker_num_blocks",
            documentation="KV blocks per transfer through kvbroker",
            buckets=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
            labelnames=labelnames))
        self.descs = per_engine(h(
            name="vllm:kvbroker_descs_per_doorbell",
            documentation="The node broker's descriptors per doorbell",
            buckets=[1, 2, 4, 8, 16, 32, 64, 128], labelnames=labelnames))
        self._failed = c(
            name="vllm:kvbroker_num_failed_transfers",
            documentation="KV transfers through kvbroker that failed, by "
            "reason", labelnames=list(labelnames) + ["reason"])
        self._values = dict(per_engine_labelvalues)
        self.aborted = per_engine(c(
            name="vllm:kvbroker_num_aborted_transfers",
            documentation="KV transfers ended because vLLM dropped their "
            "request", labelnames=labelnames))

    def observe(self, transfer_stats_data: dict[str, Any],
                engine_idx: int = 0):
        d = KVBrokerConnectorStats(data=dict(transfer_stats_data)).data
        for v in d["transfer_duration"]:
            self.xfer_time[engine_idx].observe(v)
        for v in d["post_duration"]:
            self.post_time[engine_idx].observe(v)
        for v in d["bytes_transferred"]:
            self.nbytes[engine_idx].observe(v)
        for v in d["num_blocks"]:
            self.nblocks[engine_idx].observe(v)
        for v in d["descs_per_doorbell"]:
            self.descs[engine_idx].observe(v)
        for reason, n in d["failed"].items():
            self._failed.labels(*self._values[engine_idx], reason).inc(n)
        if d["aborted"]:
            self.aborted[engine_idx].inc(d["aborted"])
