# SPDX-License-Identifier: MIT
"""The connector's configuration and a request's kv_transfer_params, checked.

Everything here comes from outside (the --kv-transfer-config JSON, a proxy's
request body): a bad value raises ParamsError with a message that names the
key, and the caller turns it into a logged, counted refusal of that request
(or of the configuration at start-up).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any


class ParamsError(ValueError):
    pass


def _int(d: dict, key: str, default=None, lo: int = 0, hi: int = 1 << 31):
    v = d.get(key, default)
    if v is None:
        raise ParamsError("%s is missing" % key)
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ParamsError("%s: %r is not an integer" % (key, v))
    try:
        v = int(v)
    except ValueError:
        raise ParamsError("%s: %r is not an integer" % (key, v)) from None
    if not lo <= v <= hi:
        raise ParamsError("%s: %d is outside [%d, %d]" % (key, v, lo, hi))
    return v


def _str(d: dict, key: str, maxlen: int = 255) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        raise ParamsError("%s: %r is not a non-empty string" % (key, v))
    if len(v.encode()) > maxlen or not v.isprintable():
        raise ParamsError("%s: not printable or longer than %d bytes" %
                          (key, maxlen))
    return v


@dataclass
class Config:
    """kv_connector_extra_config, with defaults."""
    broker_socket: str | None = None
    host_ip: str = ""
    handshake_port: int = 6301
    notify_port: int = 61005
    timeout_ms: int = 10000
    transfer_timeout_s: float = 90.0
    total_num_kv_heads: int = 0
    # READ mode (MoRIIO's "mode": "read"): D pulls P's blocks; P holds them
    # until D's release or read_lease_s after its request finished
    read: bool = False
    read_lease_s: float = 120.0

    @classmethod
    def parse(cls, extra: dict | None) -> "Config":
        extra = dict(extra or {})
        c = cls()
        if extra.get("broker_socket") is not None:
            c.broker_socket = _str(extra, "broker_socket", 107)
        c.host_ip = (_str(extra, "host_ip") if extra.get("host_ip")
                     else _guess_host_ip())
        c.handshake_port = _int(extra, "handshake_port", 6301, 1, 65535)
        c.notify_port = _int(extra, "notify_port", 61005, 1, 65535)
        c.timeout_ms = _int(extra, "timeout_ms", 10000, 100, 600000)
        c.total_num_kv_heads = _int(extra, "total_num_kv_heads", 0, 0, 1 << 20)
        # MoRIIO's key for its READ and WRITE modes
        mode = extra.get("mode", "write")
        if not isinstance(mode, str) or mode.lower() not in ("write", "read"):
            raise ParamsError("mode: %r: \"write\" (P writes into D's "
                              "blocks) or \"read\" (D reads P's)" % (mode,))
        c.read = mode.lower() == "read"
        t = extra.get("transfer_timeout_s", 90.0)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or \
                not 0.1 <= t <= 3600:
            raise ParamsError("transfer_timeout_s: %r is not in [0.1, 3600]"
                              % (t,))
        lease = extra.get("read_lease_s", 120.0)
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) \
                or not 1 <= lease <= 3600:
            raise ParamsError("read_lease_s: %r is not in [1, 3600]"
                              % (lease,))
        c.read_lease_s = float(lease)
        c.transfer_timeout_s = float(t)
        return c


def _guess_host_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass
class ReqMeta:
    """What a worker needs for one request's transfer (pickled to workers)."""
    req_id: str
    transfer_id: str
    block_ids: list = field(default_factory=list)
    host: str = ""  # the other side's broker (--host-ip)
    port: int = 0  # its --handshake-port
    remote_dp_rank: int = 0
    remote_tp_size: int = 0  # 0: the same as ours
    # hybrid models (several KV cache groups): every group's block ids
    # (block_ids is group 0's); empty with one group. A worker moves group
    # k in its own broker transfer (_groups.sub_transfer_id).
    group_block_ids: list = field(default_factory=list)
    group: int = 0  # the group a worker's part of the transfer moves
    # READ mode, D: P's blocks to read (block_ids[i] <- remote_block_ids[i])
    # and when P's hold on them ends (time.time(); 0: not said)
    remote_block_ids: list = field(default_factory=list)
    group_remote_block_ids: list = field(default_factory=list)
    lease_until: float = 0.0
    refused: str = ""  # D: why this load cannot be made (it fails)


def parse_request(params: Any, req_id: str, producer: bool) -> ReqMeta:
    """A request's kv_transfer_params -> ReqMeta (block_ids left empty).

    P (producer) gets do_remote_decode with D's broker address; D
    (consumer) gets do_remote_prefill with P's. Both: transfer_id.
    """
    if not isinstance(params, dict):
        raise ParamsError("kv_transfer_params is not a dict")
    m = ReqMeta(req_id=str(req_id), transfer_id=_str(params, "transfer_id"))
    m.host = _str(params, "remote_host")
    m.port = _int(params, "remote_handshake_port", None, 1, 65535)
    tp = params.get("remote_tp_size", params.get("tp_size", 0))
    m.remote_tp_size = _int({"remote_tp_size": tp}, "remote_tp_size", 0, 0,
                            4096)
    if not producer:
        m.remote_dp_rank = _int(params, "remote_dp_rank", 0, 0, 65535)
    return m
