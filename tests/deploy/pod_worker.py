# SPDX-License-Identifier: MIT
"""A worker in a vLLM pod's place (pod_boundary.py): imports the kvbroker
package the pod's init container copied, attaches to the broker through
the socket the pod's kv-transfer-config names, and reports in JSON lines
on stdout.

  pod_worker.py SOCKET d KEY SIZE     D: offer a region (remote write), say
                                      "ready", read P's digest from stdin,
                                      compare, exit 0 when the bytes match
  pod_worker.py SOCKET p KEY SIZE     P: write SIZE random bytes into D's
                                      region KEY, print their digest
  pod_worker.py SOCKET attach ROLE    attach and detach: "attached", or the
                                      error's errno name
  pod_worker.py SOCKET xd HOST PORT   D across nodes: KV regions of 4 layers
                                      (set_kv), a WRITE-mode transfer opened
                                      toward P's broker at HOST:PORT; when it
                                      completes, the digest of its layers
  pod_worker.py SOCKET xp HOST PORT   P across nodes: random layers written
                                      into D's blocks through D's broker at
                                      HOST:PORT; the digest of its layers
  pod_worker.py SOCKET loop SECONDS   attach, then transfers of its own
                                      (region to region, bytes checked)
                                      until SECONDS pass; on an error it
                                      says so, detaches and attaches again
                                      every 100 ms until a broker answers
"""
import errno
import hashlib
import json
import os
import sys
import time

import kvbroker

T0 = time.monotonic()


def say(**kw):
    kw["t"] = round(time.monotonic() - T0, 4)
    print(json.dumps(kw), flush=True)


def ename(e):
    return errno.errorcode.get(getattr(e, "errno", 0) or 0, str(e))


def main():
    sock, mode = sys.argv[1], sys.argv[2]
    if mode == "attach":
        try:
            with kvbroker.Client(sock, role=sys.argv[3], timeout_ms=3000):
                say(ev="attached", lib=kvbroker.library_path())
            return 0
        except (kvbroker.Error, OSError) as e:
            say(ev="error", errno=ename(e), msg=str(e))
            return 3
    if mode == "d":
        key, size = int(sys.argv[3]), int(sys.argv[4])
        with kvbroker.Client(sock, role="D", timeout_ms=5000) as d:
            r = d.alloc(size, flags=kvbroker.MEM_REMOTE_WRITE, key=key)
            say(ev="ready", pid=os.getpid())
            want = sys.stdin.readline().strip()
            got = hashlib.sha256(r.buffer).hexdigest()
            say(ev="checked", match=got == want)
            return 0 if got == want else 1
    if mode == "p":
        key, size = int(sys.argv[3]), int(sys.argv[4])
        with kvbroker.Client(sock, role="P", timeout_ms=5000) as p:
            peer = p.lookup("D", 0, 0, key)
            src = p.alloc(size)
            src.buffer[:] = os.urandom(size)
            h = p.open("pod-boundary")
            p.submit_write([kvbroker.Desc(transfer=h, region=src.id,
                                          peer_region=peer.id, len=size, tag=1)])
            p.seal(h, 1, tag=2)
            done = p.wait_min(2, timeout_ms=10000)
            ok = len(done) == 2 and all(c.ok for c in done)
            say(ev="written", ok=ok, digest=hashlib.sha256(src.buffer).hexdigest())
            return 0 if ok else 1
    if mode in ("xp", "xd"):
        return cross(sock, mode == "xp", sys.argv[3], int(sys.argv[4]))
    if mode == "loop":
        return loop(sock, float(sys.argv[3]))
    print("unknown mode", mode, file=sys.stderr)
    return 2


def cross(sock, is_p, host, port):
    """One WRITE-mode transfer between nodes, as the vLLM connector makes
    it: every block of every layer, P's bytes checked at D by digest."""
    g = kvbroker.KVGeometry("kv_first", num_blocks=8, block_size=16,
                            num_heads=2, head_dim=64, elem_size=2)
    layers = 4
    blocks = list(range(g.num_blocks))
    flags = kvbroker.MEM_REMOTE_READ | kvbroker.MEM_REMOTE_WRITE
    with kvbroker.Client(sock, role="P" if is_p else "D", timeout_ms=15000) as c:
        rs = [c.alloc(g.nbytes, flags=flags, key=i) for i in range(layers)]
        for i, r in enumerate(rs):
            c.set_kv(r, i, g)
            if is_p:
                r.buffer[:] = os.urandom(g.nbytes)
        try:
            peer = c.peer_connect(host, port)
        except kvbroker.Error as e:
            say(ev="error", errno=ename(e), msg=str(e)[:300])
            return 3
        say(ev="connected", peer=peer)
        h = c.open_remote("pod-xnode", peer, "write", blocks=blocks,
                          **({} if is_p else {"remote_dp_rank": 0}))
        if is_p:
            for i in range(layers):
                c.submit_layer(h, i, tag=i)
            c.seal(h, layers, tag=100)
            say(ev="opened")  # as in vLLM: D's load comes after P's prefill
            done = c.wait_min(layers + 1, timeout_ms=30000)
            ok = len(done) == layers + 1 and all(x.ok for x in done)
        else:
            c.seal(h, 1, tag=100)
            done = c.wait_min(1, timeout_ms=30000)
            ok = len(done) == 1 and done[0].ok
        dig = hashlib.sha256(b"".join(bytes(r.buffer) for r in rs)).hexdigest()
        say(ev="moved" if ok else "failed", digest=dig,
            status=[int(x.status) for x in done])
        return 0 if ok else 1


def loop(sock, seconds):
    size = 1 << 20
    end = T0 + seconds
    n = 0
    c = None
    while time.monotonic() < end:
        if c is None:
            try:
                c = kvbroker.Client(sock, role="P", timeout_ms=2000)
                src, dst = c.alloc(size, key=0), c.alloc(size, key=1)
                say(ev="attached")
            except (kvbroker.Error, OSError) as e:
                if c is not None:
                    c.close()
                c = None
                time.sleep(0.1)
                continue
        try:
            pat = os.urandom(size)
            src.buffer[:] = pat
            n += 1
            h = c.open("loop-%d" % n)
            c.submit_write([kvbroker.Desc(transfer=h, region=src.id,
                                          peer_region=dst.id, len=size, tag=1)])
            c.seal(h, 1, tag=2)
            # a control call or a wait notices a broker gone; bounded
            done = c.wait_min(2, timeout_ms=2000)
            if len(done) == 2 and all(x.ok for x in done) and \
                    bytes(dst.buffer) == pat:
                say(ev="ok", n=n)
            else:
                kinds = sorted({int(x.kind) for x in done})
                raise kvbroker.Error(errno.EIO, "transfer %d ended: %d "
                                     "completions, kinds %s" % (n, len(done), kinds),
                                     "loop")
            time.sleep(0.05)
        except (kvbroker.Error, OSError) as e:
            say(ev="error", errno=ename(e), msg=str(e)[:200])
            try:
                c.close()
            except Exception:
                pass
            c = None
    if c is not None:
        c.close()
    say(ev="end", n=n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
