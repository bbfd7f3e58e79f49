# SPDX-License-Identifier: MIT
"""What a worker pod shares with the broker pod, as deploy/kubernetes/
says, tested with namespaces (podsim.py): the broker DaemonSet's pod (init
container, then the broker with the manifest's arguments, ConfigMap,
Secret, hostNetwork, uid, capabilities and read-only root) and the vLLM
prefill and decode pods (their init container copying libkvbroker and the
Python package out of the kvbroker image into an emptyDir, the manifest's
env, volumes and uid; a stand-in worker instead of vLLM) on one node.

1. The probes of the DaemonSet answer (HTTP GET /metrics on the node
   address, exec kvbctl stats in the broker's namespaces).
2. D in the decode pod offers a region, P in the prefill pod writes 4 MiB
   into it through the broker, D checks every byte; kvb-demo (C) in the
   prefill pod moves and checks its blocks. The pods share no mount, PID,
   IPC or network namespace with the broker's pod (checked): only the
   socket directory and the uid.
3. Sharing that is wrong fails: a worker pod without the socket
   directory (ENOENT), one of another uid, and one running as root (vLLM's
   image default) are refused; a second prefill pod on the node is refused
   (one worker per role, dp and tp rank on a broker: the Deployments'
   anti-affinity).
4. The broker container restarts under a running worker, killed (SIGKILL,
   a crash) and stopped (SIGTERM, the kubelet): the worker sees an error
   within 5 s, attaches to the new broker once it listens and goes on
   moving checked bytes.
5. Two nodes (network namespaces joined by a veth pair, at the addresses
   of the ConfigMap's trusted-hosts): P in a prefill pod on one writes 4
   KV layers into D's blocks in a decode pod on the other, through both
   broker pods (hostNetwork, the ConfigMap's ports, tcp, the Secret's
   cluster key); D's bytes are P's. A broker with another cluster key
   refuses the handshake. (Not run where veth is missing.)

Runs as root (77 otherwise, and without unshare, nsenter, setpriv, ip,
overlayfs or PyYAML). Usage: pod_boundary.py SOURCE_DIR BUILD_DIR
"""
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SKIP = 77
SLACK = 5.0  # seconds: upper bounds only catch what never happens


def skip(why):
    print("SKIP:", why)
    sys.exit(SKIP)


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)
    print("  ok:", what)


def reexec_in_node():
    """The test runs inside a node: its own network and mount namespaces."""
    if os.environ.get("KVB_PODSIM_NODE"):
        return
    env = dict(os.environ, KVB_PODSIM_NODE="1")
    r = subprocess.run(["unshare", "--net", "--mount", "--", sys.executable,
                        os.path.abspath(__file__)] + sys.argv[1:], env=env)
    sys.exit(r.returncode)


def preflight():
    if os.geteuid() != 0:
        skip("needs root (namespaces, mounts, other uids)")
    for t in ("unshare", "nsenter", "setpriv", "ip", "mount", "chroot"):
        if not shutil.which(t):
            skip("no %s" % t)
    try:
        import yaml  # noqa: F401
    except ImportError:
        skip("no PyYAML (python3-yaml)")
    d = tempfile.mkdtemp(prefix="kvb-ovl.")
    try:
        r = subprocess.run(
            ["unshare", "--mount", "sh", "-c",
             "mount -t tmpfs t %s && mkdir %s/u %s/w %s/m && mount -t overlay "
             "o -o lowerdir=/,upperdir=%s/u,workdir=%s/w %s/m" % ((d,) * 7)],
            capture_output=True)
        if r.returncode:
            skip("no overlayfs over / here: %s" % r.stderr.decode().strip())
    finally:
        os.rmdir(d)


class Lines:
    """A process's JSON lines, read by a thread, with arrival times."""

    def __init__(self, stream, log):
        self.q = queue.Queue()
        self.all = []
        self.log = log
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            self.log.write((line + "\n").encode())
            self.log.flush()
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ev["at"] = time.monotonic()
            self.all.append(ev)
            self.q.put(ev)

    def next(self, pred, timeout):
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return None
            try:
                ev = self.q.get(timeout=left)
            except queue.Empty:
                return None
            if pred(ev):
                return ev


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    src, build = (os.path.abspath(a) for a in sys.argv[1:3])
    for d in (src, build):
        if os.path.realpath(d).startswith("/tmp/"):
            # each simulated pod mounts its own /tmp, as a container has:
            # a tree there is not what the pods' init containers copy
            skip("%s is under /tmp, which every simulated pod replaces "
                 "with its own: build outside /tmp to run this test" % d)
    preflight()
    reexec_in_node()
    # a timeout's SIGTERM still stops every container (finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    import podsim as ps

    for f in ("broker/kvbroker", "broker/kvbctl", "client/libkvbroker.so.0",
              "bench/demo/kvb-demo"):
        if not os.path.exists(os.path.join(build, f)):
            skip("not built: %s" % f)
    ps.enter_node()
    peer = ps.add_peer_node()
    objs = ps.load_kustomization(os.path.join(src, "deploy", "kubernetes"))
    ds = ps.find(objs, "DaemonSet", "kvbroker")
    pre = ps.find(objs, "Deployment", "vllm-prefill")
    dec = ps.find(objs, "Deployment", "vllm-decode")
    bspec = ds["spec"]["template"]["spec"]
    bc = ps.container(bspec, "kvbroker")

    root = tempfile.mkdtemp(prefix="kvb-pods.", dir="/tmp")
    # the node's files on a tmpfs of the node's mount namespace: gone with it
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "node", root],
                   check=True)
    logs = os.path.join(build, "Testing", "pod_boundary")
    shutil.rmtree(logs, ignore_errors=True)
    os.makedirs(logs)
    image = ps.Image(build, src)
    node = ps.Node(os.path.join(root, "a"), objs, image, ps.NODE_IPS[0])
    # the Secret, the same for every node (it is one object)
    node.secrets["kvbroker-cluster-key"] = {"cluster.key": os.urandom(32)}
    node_b = None
    if peer:
        node_b = ps.Node(os.path.join(root, "b"), objs, image, ps.NODE_IPS[1],
                         netns=peer[1])
        node_b.secrets = node.secrets
    live = []
    failed = None
    try:
        run_all(ps, node, bspec, bc, pre, dec, build, logs, live)
        if node_b:
            cross_node(ps, node, node_b, bspec, bc, pre, dec, logs, live)
        else:
            print("5. across nodes: not run (no veth device here)")
    except (Fail, ps.PodError) as e:
        failed = str(e)
    finally:
        for c in live:
            c.stop()
        if peer:
            peer[0].kill()
            peer[0].wait()
        subprocess.run(["umount", "-l", root])
        os.rmdir(root)
    if failed:
        print("FAIL:", failed)
        print("logs:", logs)
        for f in sorted(os.listdir(logs)):
            p = os.path.join(logs, f)
            with open(p, errors="replace") as fh:
                tail = fh.readlines()[-15:]
            print("--- %s" % f)
            sys.stdout.writelines(tail)
        return 1
    print("pod_boundary: passed")
    return 0


def start_init(ps, node, pod, spec, logs):
    for ic in spec.get("initContainers", []):
        log = open(os.path.join(logs, "%s-init-%s.log" % (pod, ic["name"])), "ab")
        c = ps.Container(node, pod, spec, ic, stdout=log, stderr=log)
        rc = c.wait(20)
        if rc != 0:
            c.stop()
            raise Fail("%s: init container %s exited %s" % (pod, ic["name"], rc))
        print("  ok: %s: init container %s" % (pod, ic["name"]))


def start_broker(ps, node, bspec, bc, logs, live, n):
    pod = "kvbroker-%s" % n
    start_init(ps, node, pod, bspec, logs)
    log = open(os.path.join(logs, "%s.log" % pod), "ab")
    c = ps.Container(node, pod, bspec, bc, stdout=log, stderr=log)
    live.append(c)
    port = next(p["containerPort"] for p in bc["ports"]
                if p["name"] == bc["readinessProbe"]["httpGet"]["port"])
    url = "http://%s:%d%s" % (node.ip, port, bc["readinessProbe"]["httpGet"]["path"])
    if node.netns:  # the probe runs on its node
        probe = subprocess.run(["nsenter", "--net=" + node.netns, "--",
                                sys.executable, "-c", PROBE, url], capture_output=True,
                               text=True, timeout=30)
        if probe.returncode:
            raise Fail("%s: readiness probe %s: %s" % (pod, url, probe.stdout + probe.stderr))
        body = probe.stdout
        url = None
    t0 = time.monotonic()
    while url:
        if c.proc.poll() is not None:
            raise Fail("%s exited %s before it was ready" % (pod, c.proc.returncode))
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    body = r.read().decode()
                    break
        except OSError:
            pass
        if time.monotonic() - t0 > 10 + SLACK:
            raise Fail("%s: readiness probe %s never answered" % (pod, url))
        time.sleep(0.05)
    check("kvbroker_workers" in body,
          "%s ready: readiness probe GET /metrics on %s answers 200 with metrics"
          % (pod, node.ip))
    uid = ps.identity(bspec, bc)
    r = c.exec(bc["livenessProbe"]["exec"]["command"], uid)
    check(r.returncode == 0 and "workers" in r.stdout,
          "%s: liveness probe %s in the container: exit %d" %
          (pod, " ".join(bc["livenessProbe"]["exec"]["command"]), r.returncode))
    return c


PROBE = """
import sys, time, urllib.request
for _ in range(300):
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
            if r.status == 200:
                sys.stdout.write(r.read().decode())
                sys.exit(0)
    except OSError:
        time.sleep(0.05)
sys.exit(1)
"""


def cross_node(ps, a, b, bspec, bc, pre, dec, logs, live):
    """P on node a, D on node b, each broker with the manifests' settings
    (hostNetwork, ports, trusted-hosts, the cluster key): one WRITE-mode
    transfer over tcp, every byte compared."""
    print("5. across nodes: prefill pod on %s, decode pod on %s" % (a.ip, b.ip))
    bb = start_broker(ps, b, bspec, bc, logs, live, "b")
    start_broker(ps, a, bspec, bc, logs, live, "a")
    vc = ps.container(dec["spec"]["template"]["spec"], "vllm")
    port = kv_config(vc, {"HOST_IP": b.ip})["kv_connector_extra_config"]["handshake_port"]
    # P first, as the proxy does: D's load is opened once P holds the save
    p = worker(ps, a, pre, "prefill-x", logs, live, ["xp", b.ip, str(port)])
    check(p.lines.next(lambda e: e["ev"] == "opened", 20),
          "P (node %s): its save is open, its layers wait for D's blocks" % a.ip)
    d = worker(ps, b, dec, "decode-x", logs, live, ["xd", a.ip, str(port)])
    pe = p.lines.next(lambda e: e["ev"] in ("moved", "failed"), 40)
    de = d.lines.next(lambda e: e["ev"] in ("moved", "failed"), 40)
    check(pe and pe["ev"] == "moved", "P (node %s) wrote 4 layers into D's blocks "
          "through both brokers over tcp: completions %s" % (a.ip, pe and pe["status"]))
    check(de and de["ev"] == "moved" and de["digest"] == pe["digest"],
          "D (node %s): its transfer completed, every byte is P's" % b.ip)
    check(p.wait(10) == 0 and d.wait(10) == 0, "both workers exit 0")
    # a node whose broker has another cluster key
    bb.kill(signal.SIGTERM)
    check(bb.wait(10) == 0, "node %s's broker stopped" % b.ip)
    b.secrets = {"kvbroker-cluster-key": {"cluster.key": os.urandom(32)}}
    start_broker(ps, b, bspec, bc, logs, live, "b-otherkey")
    p = worker(ps, a, pre, "prefill-x2", logs, live, ["xp", b.ip, str(port)])
    pe = p.lines.next(lambda e: e["ev"] in ("moved", "failed", "error"), 40)
    check(pe and pe["ev"] == "error",
          "a broker with another cluster key: P's handshake is refused (%s)"
          % (pe and pe.get("errno")))


def ns_of(pid):
    return {n: os.readlink("/proc/%d/ns/%s" % (pid, n))
            for n in ("mnt", "pid", "ipc", "net", "uts")}


def kv_config(c, env):
    import podsim as ps
    for a in c.get("args", []):
        a = ps.expand(a, env)
        if a.startswith("--kv-transfer-config="):
            return json.loads(a.split("=", 1)[1])
    raise Fail("%s: no --kv-transfer-config" % c["name"])


def worker(ps, node, dep, pod, logs, live, args, drop=(), uid=None):
    """The pod's vLLM container with a stand-in command: pod_worker.py,
    with the socket of its kv-transfer-config."""
    spec = dep["spec"]["template"]["spec"]
    if not os.path.isdir(os.path.join(node.root, "pods", pod)):
        start_init(ps, node, pod, spec, logs)
    vc = ps.container(spec, "vllm")
    env = {"HOST_IP": node.ip}
    cfg = kv_config(vc, env)
    sock = cfg["kv_connector_extra_config"]["broker_socket"]
    argv = ["/usr/bin/python3", os.path.join(HERE, "pod_worker.py"), sock] + args
    log = open(os.path.join(logs, "%s.log" % pod), "ab")
    c = ps.Container(node, pod, spec, vc, argv=argv, stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=log, drop_volumes=drop,
                     uid=uid)
    c.lines = Lines(c.proc.stdout, log)
    live.append(c)
    return c


def run_all(ps, node, bspec, bc, pre, dec, build, logs, live):
    print("1. the broker pod")
    broker = start_broker(ps, node, bspec, bc, logs, live, 1)
    sockdir = node.host_path(bspec["volumes"][0]["hostPath"]["path"])
    st = os.stat(sockdir)
    buid = ps.identity(bspec, bc)
    check((st.st_uid, st.st_gid, st.st_mode & 0o777) == (buid[0], buid[1], 0o700),
          "the hostPath socket directory: owner %d:%d, mode %o" %
          (st.st_uid, st.st_gid, st.st_mode & 0o777))

    print("2. worker pods through the socket directory only")
    vc = ps.container(pre["spec"]["template"]["spec"], "vllm")
    want_lib = next(e["value"] for e in vc["env"] if e["name"] == "KVBROKER_LIB")
    a = worker(ps, node, pre, "prefill", logs, live, ["attach", "P"])
    ev = a.lines.next(lambda e: True, 15)
    check(ev and ev["ev"] == "attached" and ev["lib"] == want_lib,
          "prefill pod attaches, with the library its init container copied "
          "(%s)" % (ev and ev.get("lib", ev)))
    a.wait(5)

    d = worker(ps, node, dec, "decode", logs, live, ["d", "7", str(4 << 20)])
    ev = d.lines.next(lambda e: True, 15)
    check(ev and ev["ev"] == "ready", "decode pod: D offers its region")
    p = worker(ps, node, pre, "prefill", logs, live, ["p", "7", str(4 << 20)])
    pw = p.lines.next(lambda e: True, 20)
    check(pw and pw["ev"] == "written" and pw["ok"],
          "prefill pod: P wrote 4 MiB into D's region, both completions ok")
    spaces = {"broker": ns_of(broker.init_pid()), "prefill": ns_of(p.init_pid()),
              "decode": ns_of(d.init_pid())}
    d.proc.stdin.write((pw["digest"] + "\n").encode())
    d.proc.stdin.flush()
    ev = d.lines.next(lambda e: e["ev"] == "checked", 10)
    check(ev and ev["match"], "decode pod: every byte P wrote is in D's region")
    check(d.wait(5) == 0 and p.wait(5) == 0, "both workers exit 0")
    for w in ("prefill", "decode"):
        same = [n for n in ("mnt", "pid", "ipc", "net", "uts")
                if spaces[w][n] == spaces["broker"][n]]
        check(not same, "%s pod shares no mount, PID, IPC, network or UTS "
              "namespace with the broker pod" % w)
    check(spaces["prefill"]["net"] != spaces["decode"]["net"] and
          spaces["prefill"]["ipc"] != spaces["decode"]["ipc"],
          "prefill and decode pods share neither network nor IPC namespace")

    spec = pre["spec"]["template"]["spec"]
    log = open(os.path.join(logs, "prefill-kvb-demo.log"), "ab")
    sock = kv_config(vc, {"HOST_IP": node.ip})["kv_connector_extra_config"]["broker_socket"]
    demo = ps.Container(node, "prefill", spec, vc, stdout=log, stderr=log, argv=[
        os.path.join(build, "bench", "demo", "kvb-demo"), "--socket", sock,
        "--p", "1", "--d", "1", "--layers", "4", "--blocks", "8",
        "--requests", "16", "--quiet"])
    live.append(demo)
    check(demo.wait(60) == 0, "kvb-demo (C, P and D workers) in the prefill "
          "pod: every block checked at D")

    print("3. wrong sharing is refused")
    c = worker(ps, node, dec, "no-socket-dir", logs, live, ["attach", "D"],
               drop=("socket-dir",))
    ev = c.lines.next(lambda e: True, 15)
    check(ev and ev["ev"] == "error" and ev["errno"] == "ENOENT",
          "a worker pod without the socket directory: %s" % (ev and ev.get("errno")))
    for uid, why in (((10002, 10002), "another uid"), ((0, 0), "root")):
        c = worker(ps, node, dec, "uid-%d" % uid[0], logs, live, ["attach", "D"],
                   uid=uid)
        ev = c.lines.next(lambda e: True, 15)
        check(ev and ev["ev"] == "error" and ev["errno"] in ("EACCES", "ECONNREFUSED", "EPERM"),
              "a worker pod running as %s (uid %d): refused, %s" %
              (why, uid[0], ev and ev.get("errno")))

    print("4. the broker container restarts under a running worker")
    w = worker(ps, node, pre, "prefill-loop", logs, live, ["loop", "90"])
    L = w.lines

    def oks(k, timeout):
        for _ in range(k):
            if not L.next(lambda e: e["ev"] == "ok", timeout):
                return False
        return True

    check(L.next(lambda e: e["ev"] == "attached", 15) and oks(3, 10),
          "the worker moves checked bytes")
    c = worker(ps, node, pre, "prefill-2", logs, live, ["attach", "P"])
    ev = c.lines.next(lambda e: True, 15)
    check(ev and ev["ev"] == "error" and ev["errno"] == "EADDRINUSE",
          "a second prefill pod on the node (P dp 0 tp 0 again): refused, %s"
          % (ev and ev.get("errno")))
    times = {}
    for n, (sig, what) in enumerate(((signal.SIGKILL, "killed (SIGKILL)"),
                                     (signal.SIGTERM, "stopped (SIGTERM)")), 2):
        t_kill = time.monotonic()
        broker.kill(sig)
        ev = L.next(lambda e: e["ev"] == "error", 2 + SLACK)
        check(ev, "broker %s: the worker sees %s after %.2f s" %
              (what, ev and ev["errno"], (ev["at"] - t_kill) if ev else -1))
        rc = broker.wait(5)
        check(rc == (0 if sig == signal.SIGTERM else -signal.SIGKILL) or
              (sig == signal.SIGKILL and rc is not None),
              "the old broker container ended (%s)" % rc)
        detect = ev["at"] - t_kill
        t_start = time.monotonic()
        broker = start_broker(ps, node, bspec, bc, logs, live, n)
        ev = L.next(lambda e: e["ev"] == "attached", 5 + SLACK)
        check(ev and ev["at"] > t_start,
              "the worker attached to the new broker %.2f s after its pod "
              "started" % ((ev["at"] - t_start) if ev else -1))
        times[what] = (detect, ev["at"] - t_start)
        check(oks(3, 10), "and moves checked bytes again")
    # the worker is its container's PID 1: SIGTERM without a handler of its
    # own would be ignored
    w.stop()
    broker.kill(signal.SIGTERM)
    check(broker.wait(10) == 0, "the last broker stops cleanly (SIGTERM): exit 0")
    check(not os.path.exists(os.path.join(sockdir, "kvbroker.sock")),
          "and removes its socket from the hostPath directory")
    with open(os.path.join(logs, "kvbroker-1.log")) as f:
        clash = "notify port 61005 unavailable (Address already in use)" in f.read()
    check(clash, "a P and a D worker of the same ranks on one broker: the "
          "second gets no notify port (its cross-node messages are lost): "
          "one vLLM instance per node and rank (the Deployments' anti-affinity)")
    print("restart timings (the worker sees the error after the kill / "
          "attaches after the new broker pod started):")
    for k, (a, b) in times.items():
        print("  broker %s: %.2f s / %.2f s" % (k, a, b))


if __name__ == "__main__":
    sys.exit(main())
