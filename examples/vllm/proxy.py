#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A minimal P/D proxy for vLLM with KVBrokerConnector (stdlib only).

For each /v1/completions or /v1/chat/completions request:
  1. it sends the request to a prefill (P) instance with max_tokens 1, no
     streaming, and kv_transfer_params
        {"do_remote_decode": true, "transfer_id": "tx-<uuid>",
         "remote_host": <D's broker --host-ip>,
         "remote_handshake_port": <D's broker --handshake-port>,
         "remote_tp_size": <D's TP size>}
     (P's broker writes the KV into D's blocks once D announces them);
  2. it takes the kv_transfer_params of P's answer (P's broker address,
     block ids, transfer id, TP and DP sizes: what request_finished
     returned) and sends the original request with them to a decode (D)
     instance, whose answer (streamed or not) goes back to the client.

    proxy.py --port 8000 --prefill http://10.0.0.1:8100 \\
        --decode http://10.0.0.2:8200,10.0.0.2:6301,2

--decode is URL,BROKER_HOST:HANDSHAKE_PORT,TP_SIZE; --prefill and --decode
may be given several times (round robin). Not for production: no retries,
no health checks, no authentication.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATHS = ("/v1/completions", "/v1/chat/completions")


def post(url: str, path: str, body: dict, timeout: float):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80,
                                      timeout=timeout)
    conn.request("POST", path, json.dumps(body).encode(),
                 {"Content-Type": "application/json"})
    return conn, conn.getresponse()


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cfg = None  # set in main()

    def do_POST(self):
        if self.path not in PATHS:
            return self.reply(404, {"error": "no such path"})
        try:
            n = int(self.headers.get("Content-Length", 0))
            req = json.loads(self.rfile.read(n))
        except (ValueError, json.JSONDecodeError) as e:
            return self.reply(400, {"error": "bad request: %s" % e})
        c = self.cfg
        with c.lock:
            p_url = next(c.prefill)
            d_url, d_host, d_port, d_tp = next(c.decode)
        p_req = dict(req, max_tokens=1, stream=False, kv_transfer_params={
            "do_remote_decode": True, "transfer_id": "tx-" + uuid.uuid4().hex,
            "remote_host": d_host, "remote_handshake_port": d_port,
            "remote_tp_size": d_tp})
        p_req.pop("max_completion_tokens", None)
        p_req.pop("stream_options", None)
        try:
            conn, r = post(p_url, self.path, p_req, c.timeout)
            p_ans = json.loads(r.read())
            conn.close()
        except (OSError, json.JSONDecodeError) as e:
            return self.reply(502, {"error": "prefill %s: %s" % (p_url, e)})
        params = p_ans.get("kv_transfer_params") if r.status == 200 else None
        if not params:
            return self.reply(502, {"error": "prefill %s gave no "
                                    "kv_transfer_params" % p_url,
                                    "answer": p_ans})
        try:
            conn, r = post(d_url, self.path,
                           dict(req, kv_transfer_params=params), c.timeout)
        except OSError as e:
            return self.reply(502, {"error": "decode %s: %s" % (d_url, e)})
        self.send_response(r.status)
        self.send_header("Content-Type", r.getheader("Content-Type",
                                                     "application/json"))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:  # pass D's answer through as it comes (SSE or JSON)
            chunk = r.read1(65536)
            if not chunk:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        conn.close()

    def reply(self, status: int, obj: dict):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--prefill", action="append", required=True,
                    help="a P instance's URL")
    ap.add_argument("--decode", action="append", required=True,
                    help="URL,BROKER_HOST:HANDSHAKE_PORT,TP_SIZE of a D")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    decode = []
    for d in a.decode:
        url, hostport, tp = d.split(",")
        host, port = hostport.rsplit(":", 1)
        decode.append((url, host, int(port), int(tp)))
    Proxy.cfg = argparse.Namespace(
        prefill=itertools.cycle(a.prefill), decode=itertools.cycle(decode),
        timeout=a.timeout, lock=threading.Lock())
    ThreadingHTTPServer((a.host, a.port), Proxy).serve_forever()


if __name__ == "__main__":
    main()
