// SPDX-License-Identifier: MIT
// Checks deploy/kubernetes offline, each kustomization given (default: the
// top one and every overlay), rendered as `kubectl apply -k` would send it
// (render.mjs):
//
// 1. every object against Kubernetes' API schema of its kind: the
//    validators kubernetes-models generates from Kubernetes' OpenAPI
//    document (types, formats such as quantities, required fields, enums),
//    and @kubernetes-models/prometheus-operator's for the PodMonitor;
// 2. every object as a TypeScript object literal of its kind's interface
//    (tsc --strict): this refuses fields that do not exist (a misspelt
//    `hostNetwrok: true` passes the OpenAPI schema, which allows unknown
//    fields, and the API server would drop it);
// 3. the wiring between the objects, which no schema knows: the vLLM
//    pods mount the broker's hostPath socket directory and name the same
//    socket, run as the broker's uid, use its handshake and notify ports
//    and its --host-ip; $(VAR)s are defined; probe, Service and PodMonitor
//    ports and selectors match; the libkvbroker and Python paths lie in
//    the volume the init container fills;
// 4. where kubectl is installed, that `kubectl kustomize` renders the same
//    objects as render.mjs.
//
// Usage: node validate.mjs [KUSTOMIZATION_DIR...]   exit 0: all valid
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import YAML from "yaml";
import ts from "typescript";
import { render } from "./render.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const K8S = path.resolve(HERE, "..", "kubernetes");

// apiVersion/kind -> [module, class]: the kinds the manifests use; another
// kind is an error (not silently unchecked)
const KINDS = {
  "v1/Namespace": "kubernetes-models/v1",
  "v1/ConfigMap": "kubernetes-models/v1",
  "v1/Secret": "kubernetes-models/v1",
  "v1/Service": "kubernetes-models/v1",
  "v1/ServiceAccount": "kubernetes-models/v1",
  "apps/v1/DaemonSet": "kubernetes-models/apps/v1",
  "apps/v1/Deployment": "kubernetes-models/apps/v1",
  "monitoring.coreos.com/v1/PodMonitor": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
  "monitoring.coreos.com/v1/ServiceMonitor": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
};

const errors = [];
const err = (where, msg) => errors.push(`${where}: ${msg}`);
const id = (o) => `${o.kind}/${o.metadata?.namespace ? o.metadata.namespace + "/" : ""}${o.metadata?.name}`;

async function schemaCheck(entries) {
  for (const { obj, file } of entries) {
    const key = `${obj.apiVersion}/${obj.kind}`;
    const mod = KINDS[key];
    if (!mod) {
      err(`${file} ${id(obj)}`, `no schema here for ${key}`);
      continue;
    }
    const Cls = (await import(mod))[obj.kind];
    try {
      new Cls(structuredClone(obj)).validate();
    } catch (e) {
      err(`${file} ${id(obj)}`, `OpenAPI schema: ${e.message}`);
    }
  }
}

function typeCheck(entries) {
  // one .ts file, one typed constant per object; placed in deploy/tools so
  // that node_modules resolves
  const lines = [];
  const spans = [];
  const imports = new Set();
  entries.forEach(({ obj, file }, i) => {
    const mod = KINDS[`${obj.apiVersion}/${obj.kind}`];
    if (!mod) return;
    imports.add(`import type { I${obj.kind} } from "${mod}/${obj.kind}";`);
    const start = lines.length;
    lines.push(`export const o${i}: I${obj.kind} = ${JSON.stringify(obj, null, 1)};`);
    spans.push({ start, text: lines[lines.length - 1], file, obj });
  });
  const head = [...imports];
  const text = head.concat(lines).join("\n") + "\n";
  const tmp = fs.mkdtempSync(path.join(HERE, ".check-"));
  const f = path.join(tmp, "manifests.ts");
  fs.writeFileSync(f, text);
  try {
    const prog = ts.createProgram([f], {
      strict: true, noEmit: true, skipLibCheck: true, types: [],
      module: ts.ModuleKind.ESNext, moduleResolution: ts.ModuleResolutionKind.Bundler,
      target: ts.ScriptTarget.ES2022,
    });
    for (const d of ts.getPreEmitDiagnostics(prog)) {
      const msg = ts.flattenDiagnosticMessageText(d.messageText, "\n");
      if (!d.file || path.resolve(d.file.fileName) !== f) {
        err("typescript", msg);
        continue;
      }
      const { line } = d.file.getLineAndCharacterOfPosition(d.start);
      const s = spans.find((x) => line - head.length >= x.start && line - head.length < x.start + x.text.split("\n").length);
      // the JSON path of the field: the lines above it
      err(s ? `${s.file} ${id(s.obj)}` : "manifests", `type: ${msg.split("\n").slice(-1)[0]}`);
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

// --- the wiring --------------------------------------------------------
const podOf = (o) => o.spec?.template?.spec;
const labelsOf = (o) => o.spec?.template?.metadata?.labels || {};

function expandVars(s, env, where) {
  return s.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, v) => {
    if (m === "$$") return "$";
    if (!(v in env)) {
      err(where, `$(${v}) is not defined in the container's env: Kubernetes leaves it as it is`);
      return m;
    }
    return env[v];
  });
}

function envOf(c) {
  const env = {};
  for (const e of c.env || []) {
    if ("value" in e) env[e.name] = e.value;
    else if (e.valueFrom?.fieldRef) env[e.name] = `<${e.valueFrom.fieldRef.fieldPath}>`;
    else env[e.name] = "<ref>";
  }
  return env;
}

function volumeAt(pod, c, dir) {
  for (const m of c.volumeMounts || []) {
    if (m.mountPath.replace(/\/$/, "") === dir) return (pod.volumes || []).find((v) => v.name === m.name);
  }
  return undefined;
}

function mountCovering(c, p) {
  return (c.volumeMounts || []).find((m) => p === m.mountPath || p.startsWith(m.mountPath.replace(/\/$/, "") + "/"));
}

function uidOf(pod, c) {
  return c.securityContext?.runAsUser ?? pod.securityContext?.runAsUser;
}

function matchLabels(sel, labels) {
  return Object.entries(sel || {}).every(([k, v]) => labels[k] === v);
}

function portsCheck(o, pod) {
  for (const c of (pod.containers || []).concat(pod.initContainers || [])) {
    const names = new Set((c.ports || []).map((p) => p.name));
    for (const pr of ["readinessProbe", "livenessProbe", "startupProbe"]) {
      const port = c[pr]?.httpGet?.port ?? c[pr]?.tcpSocket?.port;
      if (typeof port === "string" && !names.has(port))
        err(id(o), `${c.name}.${pr}: port '${port}' is not a port of the container`);
    }
    for (const m of c.volumeMounts || [])
      if (!(pod.volumes || []).some((v) => v.name === m.name))
        err(id(o), `${c.name}: volumeMount ${m.name}: no such volume`);
    const env = envOf(c);
    for (const a of (c.command || []).concat(c.args || [])) expandVars(a, env, `${id(o)} ${c.name}`);
  }
}

function brokerConf(objs) {
  const cm = objs.find((o) => o.kind === "ConfigMap" && o.metadata.name === "kvbroker-config");
  const conf = {};
  if (!cm) return conf;
  for (const line of (cm.data?.["kvbroker.conf"] || "").split("\n")) {
    const t = line.trim();
    if (!t || t.startsWith("#")) continue;
    const m = /^([a-z0-9-]+)\s*=\s*(.*)$/.exec(t);
    if (!m) err(id(cm), `kvbroker.conf: not "key = value": ${t}`);
    else conf[m[1]] = m[2];
  }
  return conf;
}

function argValue(args, name) {
  let v;
  args.forEach((a, i) => {
    if (a.startsWith(`--${name}=`)) v = a.slice(name.length + 3);
    else if (a === `--${name}`) v = args[i + 1];
  });
  return v;
}

function wiring(objs) {
  const pods = objs.filter((o) => podOf(o));
  for (const o of pods) portsCheck(o, podOf(o));
  const ds = objs.find((o) => o.kind === "DaemonSet" && o.metadata.name === "kvbroker");
  const conf = brokerConf(objs);
  for (const s of objs.filter((o) => o.kind === "Service")) {
    const target = pods.find((p) => matchLabels(s.spec.selector, labelsOf(p)));
    if (!target) {
      err(id(s), "its selector matches no pod template");
      continue;
    }
    const names = new Set(podOf(target).containers.flatMap((c) => (c.ports || []).map((p) => p.name)));
    for (const p of s.spec.ports || [])
      if (typeof p.targetPort === "string" && !names.has(p.targetPort))
        err(id(s), `targetPort ${p.targetPort}: not a port of ${id(target)}`);
  }
  if (!ds) return;
  const bpod = podOf(ds);
  const bc = bpod.containers.find((c) => c.name === "kvbroker");
  const bargs = (bc.args || []).map((a) => expandVars(a, envOf(bc), id(ds)));
  const sock = argValue(bargs, "socket");
  const bvol = sock && volumeAt(bpod, bc, path.dirname(sock));
  if (!bvol?.hostPath) err(id(ds), `the socket ${sock}: its directory is not a hostPath volume of the broker`);
  if (envOf(bc).KVB_SOCKET !== sock) err(id(ds), `KVB_SOCKET (kvbctl, the probe) is not the --socket ${sock}`);
  const buid = uidOf(bpod, bc);
  if (bargs.includes("--transport=rdma")) {
    const caps = bc.securityContext?.capabilities?.add || [];
    if (!caps.includes("IPC_LOCK")) err(id(ds), "rdma without IPC_LOCK: the broker cannot pin the workers' memory");
    if (buid !== 0) err(id(ds), "rdma: IPC_LOCK is effective for root only in Kubernetes (runAsUser 0)");
    if (!Object.keys(bc.resources?.limits || {}).some((k) => k.startsWith("rdma/") || k.includes("rdma")))
      err(id(ds), "rdma without an RDMA device resource");
  }
  const metrics = argValue(bargs, "metrics-listen");
  const mport = (bc.ports || []).find((p) => p.name === "metrics");
  if (metrics && (!mport || !metrics.endsWith(`:${mport.containerPort}`)))
    err(id(ds), `--metrics-listen ${metrics} and the metrics containerPort differ`);
  if (!bpod.hostNetwork) err(id(ds), "no hostNetwork: the cross-node ports are not at the node's address");
  const hostIp = argValue(bargs, "host-ip");
  if (hostIp !== "<status.hostIP>") err(id(ds), `--host-ip is ${hostIp}, not the node's address (status.hostIP)`);
  for (const pm of objs.filter((o) => o.kind === "PodMonitor")) {
    if (!matchLabels(pm.spec.selector?.matchLabels, labelsOf(ds)))
      err(id(pm), "its selector does not match the broker's pods");
    for (const ep of pm.spec.podMetricsEndpoints || [])
      if (!(bc.ports || []).some((p) => p.name === ep.port))
        err(id(pm), `port ${ep.port}: not a port of the broker container`);
    if (pm.metadata.namespace !== ds.metadata.namespace && !pm.spec.namespaceSelector)
      err(id(pm), "in another namespace than the broker, without namespaceSelector");
  }
  // the vLLM pods
  const workers = pods.filter((o) => podOf(o).containers.some((c) => (c.args || []).some((a) => a.startsWith("--kv-transfer-config"))));
  if (!workers.length) return;
  for (const o of workers) {
    const pod = podOf(o);
    for (const c of pod.containers) {
      const env = envOf(c);
      const raw = (c.args || []).find((a) => a.startsWith("--kv-transfer-config"));
      if (!raw) continue;
      const where = `${id(o)} ${c.name}`;
      let kv;
      try {
        kv = JSON.parse(expandVars(raw.slice(raw.indexOf("=") + 1), env, where));
      } catch (e) {
        err(where, `--kv-transfer-config is not JSON: ${e.message}`);
        continue;
      }
      if (kv.kv_connector !== "KVBrokerConnector" || kv.kv_connector_module_path !== "kvbroker.vllm")
        err(where, "kv_connector is not kvbroker.vllm's KVBrokerConnector");
      if (!["kv_producer", "kv_consumer"].includes(kv.kv_role)) err(where, `kv_role ${kv.kv_role}`);
      const x = kv.kv_connector_extra_config || {};
      const wvol = volumeAt(pod, c, path.dirname(x.broker_socket || ""));
      if (!wvol?.hostPath || wvol.hostPath.path !== bvol?.hostPath?.path)
        err(where, `broker_socket ${x.broker_socket}: its directory is not the broker's hostPath ${bvol?.hostPath?.path}`);
      else if (path.basename(x.broker_socket) !== path.basename(sock))
        err(where, `broker_socket ${x.broker_socket} is not the broker's socket ${sock}`);
      if (env.KVB_SOCKET && env.KVB_SOCKET !== x.broker_socket)
        err(where, "KVB_SOCKET and broker_socket differ");
      if (uidOf(pod, c) !== buid)
        err(where, `runs as uid ${uidOf(pod, c)}, the broker as ${buid}: the broker serves its own uid only`);
      if (String(x.handshake_port ?? 6301) !== (conf["handshake-port"] ?? "6301"))
        err(where, `handshake_port ${x.handshake_port} is not the broker's ${conf["handshake-port"]}`);
      if (String(x.notify_port ?? 61005) !== (conf["notify-port"] ?? "61005"))
        err(where, `notify_port ${x.notify_port} is not the broker's ${conf["notify-port"]}`);
      if (x.host_ip !== "<status.hostIP>") err(where, `host_ip ${x.host_ip} is not the node's address (status.hostIP)`);
      for (const v of ["KVBROKER_LIB", "PYTHONPATH"]) {
        const m = env[v] && mountCovering(c, env[v]);
        const filled = m && (pod.initContainers || []).some((ic) => (ic.volumeMounts || []).some((im) => im.name === m.name));
        if (!filled) err(where, `${v} ${env[v]}: not in a volume an init container fills`);
      }
      const anti = pod.affinity?.podAntiAffinity?.requiredDuringSchedulingIgnoredDuringExecution || [];
      if (!anti.some((t) => t.topologyKey === "kubernetes.io/hostname" && matchLabels(t.labelSelector?.matchLabels, labelsOf(o)) &&
        workers.every((w) => matchLabels(t.labelSelector?.matchLabels, labelsOf(w)))))
        err(where, "no anti-affinity keeping vLLM instances on separate nodes (one worker per role and rank per broker, notify ports per node)");
    }
  }
}

function compareKubectl(dir, mine) {
  let out;
  try {
    out = execFileSync("kubectl", ["kustomize", dir], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    if (e.code === "ENOENT") return "kubectl not installed: render.mjs not compared";
    err(dir, `kubectl kustomize: ${e.stderr || e.message}`);
    return "";
  }
  const theirs = YAML.parseAllDocuments(out, { version: "1.1" }).map((d) => d.toJS()).filter(Boolean);
  const key = (o) => id(o);
  const a = new Map(mine.map((e) => [key(e.obj), e.obj]));
  const b = new Map(theirs.map((o) => [key(o), o]));
  const norm = (o) => JSON.stringify(o, (k, v) => (v && typeof v === "object" && !Array.isArray(v)
    ? Object.fromEntries(Object.entries(v).sort(([x], [y]) => (x < y ? -1 : 1))) : v));
  for (const k of new Set([...a.keys(), ...b.keys()])) {
    if (!a.has(k)) err(dir, `kubectl kustomize renders ${k}, render.mjs does not`);
    else if (!b.has(k)) err(dir, `render.mjs renders ${k}, kubectl kustomize does not`);
    else if (norm(a.get(k)) !== norm(b.get(k))) err(dir, `${k}: render.mjs and kubectl kustomize differ`);
  }
  return `the same ${b.size} objects as kubectl kustomize`;
}

async function main() {
  let dirs = process.argv.slice(2);
  if (!dirs.length) {
    dirs = [K8S];
    const ov = path.join(K8S, "overlays");
    if (fs.existsSync(ov))
      for (const d of fs.readdirSync(ov).sort()) dirs.push(path.join(ov, d));
  }
  for (const dir of dirs) {
    const before = errors.length;
    let entries;
    try {
      entries = render(dir);
    } catch (e) {
      err(dir, e.message);
      continue;
    }
    await schemaCheck(entries);
    typeCheck(entries);
    wiring(entries.map((e) => e.obj));
    const cmp = compareKubectl(dir, entries);
    const rel = path.relative(process.cwd(), dir) || ".";
    console.log(`${errors.length === before ? "ok" : "FAIL"}: ${rel}: ${entries.length} objects (${[...new Set(entries.map((e) => e.obj.kind))].join(", ")}); ${cmp}`);
  }
  for (const e of errors) console.log("  " + e);
  if (errors.length) {
    console.log(`${errors.length} problems`);
    process.exit(1);
  }
  console.log(`kubernetes-models ${JSON.parse(fs.readFileSync(path.join(HERE, "node_modules/kubernetes-models/package.json"))).version} schemas, typescript ${ts.version}, ${os.platform()}`);
}

main().catch((e) => {
  console.error(e.stack || e);
  process.exit(2);
});
