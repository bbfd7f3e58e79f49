# SPDX-License-Identifier: MIT
"""Pods of deploy/kubernetes/ as Linux namespaces, without Kubernetes.

A "node" is a network namespace of its own with the node's address (two
nodes: joined by a veth pair), its files in a directory of its own. Each
container of a pod runs as the kubelet and a container runtime would start
it, as far as the questions "what does a worker pod share with the broker
pod" go:

- its own mount namespace, its root an overlay over the host's / (the
  "image": for images named kvbroker:*, this build's kvbroker, kvbctl,
  libkvbroker and Python package at the paths the Debian package uses),
  read-only when the manifest says readOnlyRootFilesystem; a fresh /proc,
  /tmp and /run, and /dev/shm a tmpfs of its own unless hostIPC;
- its own PID namespace (its command is PID 1) unless hostPID, its own IPC
  namespace unless hostIPC, its own network namespace (loopback only)
  unless hostNetwork, then the node's; its own UTS namespace;
- the pod's volumes: hostPath (a directory of the node, created for
  DirectoryOrCreate, required for Directory), emptyDir (one per pod),
  configMap and secret (the kubelet's layout: ..data symlinks, files owned
  by root with the volume's mode);
- the uid and gid of securityContext (the pod's, the container's winning),
  the capabilities (drop ALL + add: the bounding set), no_new_privs for
  allowPrivilegeEscalation: false, env with fieldRef status.hostIP and
  $(VAR) expansion of command and args as Kubernetes does.

What it does not do: images other than kvbroker's are the host's files (a
vLLM container runs a stand-in command with the manifest's env, volumes
and identity), no cgroups or resource limits, no seccomp profile, init
containers of a pod share no namespaces with its main container (they
share its volumes, which is all they use here), and each pod has one main
container.
"""
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time

import yaml

# the nodes' addresses: those of the placeholder trusted-hosts of
# deploy/kubernetes/broker/config.yaml
NODE_IPS = ("192.0.2.11", "192.0.2.12")


# --- manifests ----------------------------------------------------------

def load_kustomization(path):
    """Every object of a kustomization directory: its resources (files and
    directories, recursively), in order. Generators and patches are not
    applied (the node validator, deploy/tools/validate.mjs, renders them):
    the objects that pods are made of come from plain resources."""
    with open(os.path.join(path, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    out = []
    for r in k.get("resources", []):
        p = os.path.join(path, r)
        if os.path.isdir(p):
            out += load_kustomization(p)
        else:
            with open(p) as f:
                out += [d for d in yaml.safe_load_all(f) if d]
    return out


def find(objs, kind, name):
    for o in objs:
        if o.get("kind") == kind and o["metadata"]["name"] == name:
            return o
    raise KeyError("%s/%s not in the manifests" % (kind, name))


def container(podspec, name):
    for c in podspec.get("containers", []) + podspec.get("initContainers", []):
        if c["name"] == name:
            return c
    raise KeyError("container %s" % name)


def expand(s, env):
    """Kubernetes' $(VAR) expansion: defined variables are replaced, $$
    escapes, anything else stays."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        v = m.group(1)
        return env[v] if v in env else m.group(0)
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)


def mount_of(c, volume):
    """The mountPath of a volume in a container (None: not mounted)."""
    for m in c.get("volumeMounts", []):
        if m["name"] == volume:
            return m["mountPath"]
    return None


def volume_by_mount(podspec, c, path):
    for m in c.get("volumeMounts", []):
        if m["mountPath"] == path:
            for v in podspec.get("volumes", []):
                if v["name"] == m["name"]:
                    return v
    return None


def identity(podspec, c):
    """(uid, gid) the container runs as (pod securityContext, container's
    wins); None where neither says (the image's user)."""
    sc = dict(podspec.get("securityContext") or {})
    sc.update({k: v for k, v in (c.get("securityContext") or {}).items()
               if k in ("runAsUser", "runAsGroup")})
    return sc.get("runAsUser"), sc.get("runAsGroup")


# --- the node -----------------------------------------------------------

def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def enter_node():
    """Sets up the first node in the network and mount namespaces this
    process was started in (`unshare --net --mount`): loopback up. Its
    address: add_peer_node() puts it on a veth pair to the second node;
    without veth it goes on loopback (one node only)."""
    run(["mount", "--make-rprivate", "/"])
    run(["ip", "link", "set", "lo", "up"])


def die_with_parent():
    """preexec_fn: SIGKILL when the test dies, however it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def add_peer_node():
    """A second node: a network namespace held by a sleeping process,
    joined to this one by a veth pair (NODE_IPS[0] here, NODE_IPS[1]
    there). Returns (holder process, its netns path), or None without
    veth (then NODE_IPS[0] is put on loopback)."""
    holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "3600"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
    ns = "/proc/%d/ns/net" % holder.pid
    mine = os.readlink("/proc/self/ns/net")
    t0 = time.monotonic()
    while True:  # until unshare has made its namespace
        try:
            if os.readlink(ns) != mine:
                break
        except OSError:
            pass
        if time.monotonic() - t0 > 10:
            holder.kill()
            raise RuntimeError("the second node's namespace never came up")
        time.sleep(0.01)
    r = subprocess.run(["ip", "link", "add", "kvbn0", "type", "veth", "peer",
                        "name", "kvbn1", "netns", str(holder.pid)],
                       capture_output=True)
    if r.returncode:
        holder.kill()
        holder.wait()
        run(["ip", "addr", "add", NODE_IPS[0] + "/32", "dev", "lo"])
        return None
    run(["ip", "addr", "add", NODE_IPS[0] + "/24", "dev", "kvbn0"])
    run(["ip", "link", "set", "kvbn0", "up"])
    there = ["nsenter", "--net=" + ns, "--"]
    run(there + ["ip", "link", "set", "lo", "up"])
    run(there + ["ip", "addr", "add", NODE_IPS[1] + "/24", "dev", "kvbn1"])
    run(there + ["ip", "link", "set", "kvbn1", "up"])
    return holder, ns


class Image:
    """Files a container's image adds over the host's root."""

    def __init__(self, build, src):
        self.build = build
        self.src = src

    def populate(self, image, upper):
        if not image.startswith("kvbroker:"):
            return
        files = {
            "usr/bin/kvbroker": os.path.join(self.build, "broker", "kvbroker"),
            "usr/bin/kvbctl": os.path.join(self.build, "broker", "kvbctl"),
            "usr/lib/x86_64-linux-gnu/libkvbroker.so.0":
                os.path.join(self.build, "client", "libkvbroker.so.0"),
        }
        for dst, srcf in files.items():
            d = os.path.join(upper, dst)
            os.makedirs(os.path.dirname(d), exist_ok=True)
            shutil.copy2(srcf, d)
        pkg = os.path.join(upper, "usr/lib/python3/dist-packages/kvbroker")
        shutil.copytree(os.path.join(self.src, "python", "kvbroker"), pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))


class Node:
    def __init__(self, root, objs, image, ip, netns=None):
        self.root = root  # the node's own files: hostPath dirs, pods
        self.objs = objs
        self.image = image
        self.ip = ip
        self.netns = netns  # None: this process's network namespace
        self.secrets = {}  # name -> {key: bytes}
        os.makedirs(os.path.join(root, "host"), exist_ok=True)
        self.env_base = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                         "/usr/bin:/sbin:/bin"}

    def host_path(self, p):
        return os.path.join(self.root, "host", p.lstrip("/"))

    # the kubelet's volumes
    def _atomic_dir(self, where, files, mode):
        """configMap/secret layout: ..<ts>/ with the files, ..data -> it,
        each key a symlink through ..data; root-owned."""
        ts = "..2026_01_01_00_00_00.%d" % time.monotonic_ns()
        os.makedirs(os.path.join(where, ts))
        for k, v in files.items():
            f = os.path.join(where, ts, k)
            with open(f, "wb") as fh:
                fh.write(v if isinstance(v, bytes) else v.encode())
            os.chmod(f, mode)
        os.symlink(ts, os.path.join(where, "..data"))
        for k in files:
            os.symlink(os.path.join("..data", k), os.path.join(where, k))
        os.chmod(where, 0o755)

    def volume_source(self, pod, v):
        """The node directory behind a pod volume (made as the kubelet
        makes it), or raises PodError."""
        name = v["name"]
        pdir = os.path.join(self.root, "pods", pod, "volumes", name)
        if "hostPath" in v:
            hp = v["hostPath"]
            d = self.host_path(hp["path"])
            t = hp.get("type", "")
            if not os.path.isdir(d):
                if t == "DirectoryOrCreate":
                    os.makedirs(d, mode=0o755)
                    os.chmod(d, 0o755)
                elif t == "Directory":
                    raise PodError("hostPath %s: no such directory (type "
                                   "Directory): the pod does not start"
                                   % hp["path"])
                else:
                    os.makedirs(d, exist_ok=True)
            return d
        if os.path.isdir(pdir):
            return pdir
        if "emptyDir" in v:
            os.makedirs(pdir)
            os.chmod(pdir, 0o777)
            return pdir
        if "configMap" in v:
            cm = find(self.objs, "ConfigMap", v["configMap"]["name"])
            os.makedirs(pdir)
            self._atomic_dir(pdir, cm.get("data", {}),
                             v["configMap"].get("defaultMode", 0o644))
            return pdir
        if "secret" in v:
            sname = v["secret"]["secretName"]
            if sname not in self.secrets:
                raise PodError("secret %s missing: the pod does not start"
                               % sname)
            os.makedirs(pdir)
            self._atomic_dir(pdir, self.secrets[sname],
                             v["secret"].get("defaultMode", 0o644))
            return pdir
        raise PodError("volume %s: type not simulated" % name)


class PodError(Exception):
    pass


CAPS = {"CHOWN": "chown", "FOWNER": "fowner", "IPC_LOCK": "ipc_lock",
        "DAC_OVERRIDE": "dac_override", "NET_ADMIN": "net_admin",
        "SYS_PTRACE": "sys_ptrace", "NET_RAW": "net_raw"}


class Container:
    """One container started; .pid is its PID 1 (in the node's view)."""

    def __init__(self, node, pod, podspec, c, argv=None, env_extra=None,
                 stdin=None, stdout=None, stderr=None, drop_volumes=(),
                 uid=None):
        self.node = node
        self.name = "%s/%s" % (pod, c["name"])
        n = "%s-%s-%d" % (pod, c["name"], time.monotonic_ns())
        self.dir = os.path.join(node.root, "ctr", n)
        upper, work, merged = (os.path.join(self.dir, x)
                               for x in ("upper", "work", "root"))
        for d in (upper, work, merged):
            os.makedirs(d)
        node.image.populate(c.get("image", ""), upper)
        env = dict(node.env_base)
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            elif e.get("valueFrom", {}).get("fieldRef", {}).get(
                    "fieldPath") in ("status.hostIP", "status.podIP") and \
                    (podspec.get("hostNetwork") or
                     e["valueFrom"]["fieldRef"]["fieldPath"] ==
                     "status.hostIP"):
                env[e["name"]] = node.ip
            else:
                raise PodError("env %s: not simulated" % e["name"])
        env.update(env_extra or {})
        if argv is None:
            argv = [expand(a, env) for a in
                    (c.get("command") or ["kvbroker"]) + c.get("args", [])]
        u, g = identity(podspec, c)
        if uid is not None:
            u, g = uid
        sc = c.get("securityContext") or {}
        mounts = []
        for m in c.get("volumeMounts", []):
            if m["name"] in drop_volumes:
                continue
            v = next(v for v in podspec.get("volumes", [])
                     if v["name"] == m["name"])
            mounts.append((node.volume_source(pod, v), m["mountPath"],
                           m.get("readOnly", False)))
        R = merged
        sh = ["set -e",
              "mount --make-rprivate /",
              "mount -t overlay overlay -o lowerdir=/,upperdir=%s,workdir=%s %s"
              % (upper, work, R),
              "mount -t proc proc %s/proc" % R,
              "mount --rbind /sys %s/sys" % R,
              "mount --bind /dev %s/dev" % R,
              "mount --bind /dev/pts %s/dev/pts" % R,
              "mount -t tmpfs -o mode=1777 tmpfs %s/tmp" % R,
              "mount -t tmpfs -o mode=755 tmpfs %s/run" % R]
        if podspec.get("hostIPC"):
            sh.append("mount --bind /dev/shm %s/dev/shm" % R)
        else:
            sh.append("mount -t tmpfs -o mode=1777 tmpfs %s/dev/shm" % R)
        if not podspec.get("hostNetwork"):
            sh.append("ip link set lo up")
        for srcd, path, ro in mounts:
            sh.append("mkdir -p %s%s" % (R, shlex.quote(path)))
            sh.append("mount --bind %s %s%s" % (shlex.quote(srcd), R,
                                               shlex.quote(path)))
            if ro:
                sh.append("mount -o remount,bind,ro %s%s" % (R, shlex.quote(path)))
        if sc.get("readOnlyRootFilesystem"):
            sh.append("mount -o remount,ro %s" % R)
        sp = ["setpriv"]
        if u is not None:
            sp += ["--reuid=%d" % u, "--regid=%d" % (g if g is not None else u),
                   "--clear-groups"]
        caps = sc.get("capabilities") or {}
        if "ALL" in caps.get("drop", []):
            add = [CAPS[x] for x in caps.get("add", [])]
            bset = "-all" + "".join(",+" + x for x in add)
            sp += ["--bounding-set=" + bset, "--inh-caps=" + bset]
            if u not in (None, 0) and add:
                sp += ["--ambient-caps=" + "".join(",+" + x for x in add)[1:]]
        if sc.get("allowPrivilegeEscalation") is False:
            sp.append("--no-new-privs")
        envs = ["%s=%s" % kv for kv in env.items()]
        sh.append("cd %s" % R)
        sh.append("exec chroot %s env -i %s %s -- %s" % (
            R, " ".join(shlex.quote(x) for x in envs),
            " ".join(shlex.quote(x) for x in sp),
            " ".join(shlex.quote(x) for x in argv)))
        flags = ["--fork", "--mount", "--uts", "--kill-child"]
        if not podspec.get("hostPID"):
            flags.append("--pid")
        if not podspec.get("hostIPC"):
            flags.append("--ipc")
        if not podspec.get("hostNetwork"):
            flags.append("--net")
        self.cmd = ["unshare"] + flags + ["--", "/bin/sh", "-c", "\n".join(sh)]
        if node.netns:
            self.cmd = ["nsenter", "--net=" + node.netns, "--"] + self.cmd
        self.env = env
        self.argv = argv
        self.proc = subprocess.Popen(self.cmd, stdin=stdin, stdout=stdout,
                                     stderr=stderr, start_new_session=True,
                                     preexec_fn=die_with_parent)
        self.pid = None

    def init_pid(self, timeout=5.0):
        """The container's first process (unshare's child), as the node
        sees it."""
        t0 = time.monotonic()
        while self.pid is None and time.monotonic() - t0 < timeout:
            try:
                with open("/proc/%d/task/%d/children" % (self.proc.pid,
                                                          self.proc.pid)) as f:
                    kids = f.read().split()
                if kids:
                    self.pid = int(kids[0])
                    break
            except FileNotFoundError:
                break
            time.sleep(0.01)
        return self.pid

    def exec(self, argv, uid, timeout=10):
        """What an exec probe does: argv in the container's namespaces and
        root, as uid."""
        pid = self.init_pid()
        cmd = ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p",
               "-r", "-w", "env", "-i"] + \
              ["%s=%s" % kv for kv in self.env.items()] + \
              ["setpriv", "--reuid=%d" % uid[0], "--regid=%d" % uid[1],
               "--clear-groups", "--no-new-privs", "--"] + argv
        return subprocess.run(cmd, capture_output=True, text=True,
                              timeout=timeout)

    def kill(self, sig):
        pid = self.init_pid()
        if pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        if self.proc.poll() is None:
            self.kill(signal.SIGKILL)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)


def dumps(o):
    return json.dumps(o, sort_keys=True)
