# SPDX-License-Identifier: MIT
"""examples/vllm/proxy.py between stand-ins of a P and a D vLLM server on
loopback: what P is asked (max_tokens 1, do_remote_decode with D's broker
address and a fresh transfer id), that P's kv_transfer_params reach D
unchanged, that D's streamed answer comes back whole, and the errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PROXY = os.path.join(ROOT, "examples", "vllm", "proxy.py")


class Fake(BaseHTTPRequestHandler):
    seen: list = []
    role = "P"
    give_params = True

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if self.role == "P":
            ans = {"choices": [{"text": "x"}]}
            if self.give_params:
                ans["kv_transfer_params"] = {
                    "do_remote_prefill": True, "transfer_id":
                    body["kv_transfer_params"]["transfer_id"],
                    "remote_host": "10.0.0.1", "remote_handshake_port": 6301,
                    "remote_block_ids": [1, 2], "remote_tp_size": 2}
            data = json.dumps(ans).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(3):
            self.wfile.write(b"data: {\"n\": %d}\n\n" % i)
            self.wfile.flush()
            time.sleep(0.02)
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


def serve(role, **kw):
    cls = type("Fake" + role, (Fake,), dict(role=role, seen=[], **kw))
    srv = ThreadingHTTPServer(("127.0.0.1", 0), cls)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, cls


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def proxy_with():
    made = []

    def make(p_kw=None):
        p, pcls = serve("P", **(p_kw or {}))
        d, dcls = serve("D")
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, PROXY, "--host", "127.0.0.1", "--port",
             str(port), "--prefill", "http://127.0.0.1:%d" %
             p.server_address[1], "--decode", "http://127.0.0.1:%d,"
             "10.0.0.2:6301,2" % d.server_address[1]])
        made.append((proc, p, d))
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        return "http://127.0.0.1:%d" % port, pcls, dcls

    yield make
    for proc, p, d in made:
        proc.kill()
        proc.wait()
        p.shutdown()
        d.shutdown()


def ask(url, body):
    req = urllib.request.Request(url + "/v1/completions",
                                 json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


def test_proxy_passes_params(proxy_with):
    url, pcls, dcls = proxy_with()
    status, data = ask(url, {"model": "m", "prompt": "hi", "max_tokens": 50,
                             "stream": True})
    assert status == 200
    assert data.count(b"data: ") == 4 and data.endswith(b"[DONE]\n\n")
    (p_req,) = pcls.seen
    assert p_req["max_tokens"] == 1 and p_req["stream"] is False
    kp = p_req["kv_transfer_params"]
    assert kp["do_remote_decode"] is True and kp["transfer_id"].startswith(
        "tx-")
    assert (kp["remote_host"], kp["remote_handshake_port"],
            kp["remote_tp_size"]) == ("10.0.0.2", 6301, 2)
    (d_req,) = dcls.seen
    assert d_req["max_tokens"] == 50 and d_req["stream"] is True
    assert d_req["kv_transfer_params"]["transfer_id"] == kp["transfer_id"]
    assert d_req["kv_transfer_params"]["remote_block_ids"] == [1, 2]
    ask(url, {"model": "m", "prompt": "again"})
    assert pcls.seen[0]["kv_transfer_params"]["transfer_id"] != \
        pcls.seen[1]["kv_transfer_params"]["transfer_id"]


def test_proxy_errors(proxy_with):
    url, pcls, dcls = proxy_with({"give_params": False})
    with pytest.raises(urllib.error.HTTPError) as e:
        ask(url, {"model": "m", "prompt": "hi"})
    assert e.value.code == 502 and b"no kv_transfer_params" in e.value.read()
    assert not dcls.seen  # D is not asked without P's params
    req = urllib.request.Request(url + "/v1/completions", b"{not json",
                                 {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
