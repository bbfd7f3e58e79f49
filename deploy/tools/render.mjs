// SPDX-License-Identifier: MIT
// The part of Kustomize that deploy/kubernetes uses, to check what
// `kubectl apply -k` would send without kubectl: `resources` (files and
// directories), `configMapGenerator` with `disableNameSuffixHash`, and
// `patches` holding JSON 6902 operations with a `target`. Anything else in
// a kustomization.yaml is refused, so that a check never passes over a
// feature it does not render. validate.mjs compares the result with
// `kubectl kustomize` where kubectl exists.
import fs from "node:fs";
import path from "node:path";
import YAML from "yaml";

const KEYS = new Set(["apiVersion", "kind", "resources", "configMapGenerator",
  "generatorOptions", "patches"]);

// Kubernetes reads YAML 1.1 (0400 is octal, yes/no are strings only in 1.2)
export function parseDocs(file) {
  const text = fs.readFileSync(file, "utf8");
  const docs = YAML.parseAllDocuments(text, { version: "1.1", prettyErrors: true });
  const out = [];
  for (const d of docs) {
    if (d.errors.length)
      throw new Error(`${file}: ${d.errors.map((e) => e.message).join("; ")}`);
    const o = d.toJS({ maxAliasCount: 0 });
    if (o !== null && o !== undefined) out.push({ obj: o, file });
  }
  return out;
}

function pointer(p) {
  return p.split("/").slice(1).map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"));
}

function applyOp(obj, op, where) {
  const keys = pointer(op.path);
  const last = keys.pop();
  let parent = obj;
  for (const k of keys) {
    if (parent === null || typeof parent !== "object" || !(k in parent))
      throw new Error(`${where}: ${op.op} ${op.path}: no ${k}`);
    parent = parent[k];
  }
  const isArr = Array.isArray(parent);
  switch (op.op) {
    case "add":
      if (isArr) {
        if (last === "-") parent.push(op.value);
        else parent.splice(Number(last), 0, op.value);
      } else parent[last] = op.value;
      break;
    case "replace":
      if (!(last in parent)) throw new Error(`${where}: replace ${op.path}: nothing there`);
      parent[last] = op.value;
      break;
    case "remove":
      if (!(last in parent)) throw new Error(`${where}: remove ${op.path}: nothing there`);
      if (isArr) parent.splice(Number(last), 1);
      else delete parent[last];
      break;
    case "test":
      if (JSON.stringify(parent[last]) !== JSON.stringify(op.value))
        throw new Error(`${where}: test ${op.path} failed`);
      break;
    default:
      throw new Error(`${where}: JSON patch op ${op.op} not rendered here`);
  }
}

function matches(t, o) {
  return (!t.kind || t.kind === o.kind) &&
    (!t.name || t.name === o.metadata?.name) &&
    (!t.namespace || t.namespace === o.metadata?.namespace) &&
    (!t.version || o.apiVersion?.split("/").pop() === t.version) &&
    (!t.group || (o.apiVersion?.includes("/") ? o.apiVersion.split("/")[0] : "") === t.group);
}

// [{obj, file}] of a kustomization directory
export function render(dir) {
  const kf = path.join(dir, "kustomization.yaml");
  const [{ obj: k }] = parseDocs(kf);
  for (const key of Object.keys(k))
    if (!KEYS.has(key)) throw new Error(`${kf}: '${key}' is not rendered by deploy/tools/render.mjs`);
  let out = [];
  for (const r of k.resources || []) {
    const p = path.join(dir, r);
    if (fs.statSync(p).isDirectory()) out = out.concat(render(p));
    else out = out.concat(parseDocs(p));
  }
  const gopt = k.generatorOptions || {};
  for (const key of Object.keys(gopt))
    if (!["disableNameSuffixHash", "labels"].includes(key))
      throw new Error(`${kf}: generatorOptions.${key} is not rendered here`);
  for (const g of k.configMapGenerator || []) {
    if (!gopt.disableNameSuffixHash)
      throw new Error(`${kf}: configMapGenerator needs generatorOptions.disableNameSuffixHash here`);
    for (const key of Object.keys(g))
      if (!["name", "namespace", "files"].includes(key))
        throw new Error(`${kf}: configMapGenerator.${key} is not rendered here`);
    const data = {};
    for (const f of g.files || []) {
      if (f.includes("=")) throw new Error(`${kf}: key=file in configMapGenerator is not rendered here`);
      data[path.basename(f)] = fs.readFileSync(path.join(dir, f), "utf8");
    }
    const metadata = { name: g.name };
    if (g.namespace) metadata.namespace = g.namespace;
    if (gopt.labels) metadata.labels = { ...gopt.labels };
    out.push({ obj: { apiVersion: "v1", kind: "ConfigMap", metadata, data }, file: kf });
  }
  for (const p of k.patches || []) {
    if (!p.target) throw new Error(`${kf}: a patch without target is not rendered here`);
    const text = p.path ? fs.readFileSync(path.join(dir, p.path), "utf8") : p.patch;
    const ops = YAML.parse(text, { version: "1.1" });
    if (!Array.isArray(ops))
      throw new Error(`${kf}: only JSON 6902 patches (a list of ops) are rendered here`);
    const hit = out.filter((e) => matches(p.target, e.obj));
    if (!hit.length) throw new Error(`${kf}: patch ${p.path || ""} matches nothing`);
    for (const e of hit) {
      e.obj = structuredClone(e.obj);
      for (const op of ops) applyOp(e.obj, op, `${kf} ${p.path || "patch"}`);
    }
  }
  return out;
}
