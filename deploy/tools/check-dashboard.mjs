// SPDX-License-Identifier: MIT
// Checks a Grafana dashboard JSON (default: the kvbroker dashboard):
//
// 1. as a TypeScript object literal of @grafana/schema's `Dashboard` (the
//    dashboard JSON model Grafana publishes its types for; tsc --strict:
//    wrong types and fields the model does not have fail);
// 2. Grafana's layout rules: unique panel ids, gridPos inside the 24
//    columns and no two panels overlapping, each target with a refId
//    unique in its panel, each panel's datasource a defined variable;
// 3. every metric an expression names is one the broker exports: listed
//    in docs/metrics.md and, given a scrape of a running broker
//    (--scrape FILE), present in it (the per-NIC rdma series need an rdma
//    transport and are checked against docs/metrics.md only);
// 4. with promtool (--promtool PATH), every expression parses as PromQL
//    (Grafana's $__rate_interval, $__range and $instance replaced).
//
// Usage: node check-dashboard.mjs [--scrape FILE] [--promtool PATH] [DASHBOARD]
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SRC = path.resolve(HERE, "..", "..");
const args = process.argv.slice(2);
let scrape, promtool;
const rest = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--scrape") scrape = args[++i];
  else if (args[i] === "--promtool") promtool = args[++i];
  else rest.push(args[i]);
}
const file = rest[0] || path.join(SRC, "deploy", "kubernetes", "monitoring", "kvbroker-dashboard.json");
const errors = [];
const err = (m) => errors.push(m);
const dash = JSON.parse(fs.readFileSync(file, "utf8"));

// 1. the dashboard model's types
{
  const tmp = fs.mkdtempSync(path.join(HERE, ".check-"));
  const f = path.join(tmp, "dashboard.ts");
  fs.writeFileSync(f, `import type { Dashboard } from "@grafana/schema";\n` +
    `export const d: Dashboard = ${JSON.stringify(dash, null, 1)};\n`);
  try {
    const prog = ts.createProgram([f], {
      strict: true, noEmit: true, skipLibCheck: true, types: [],
      module: ts.ModuleKind.ESNext, moduleResolution: ts.ModuleResolutionKind.Bundler,
      target: ts.ScriptTarget.ES2022,
    });
    for (const d of ts.getPreEmitDiagnostics(prog)) {
      const where = d.file ? `line ${d.file.getLineAndCharacterOfPosition(d.start).line}` : "";
      err(`type (${where}): ${ts.flattenDiagnosticMessageText(d.messageText, " ")}`);
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

// 2. layout and references
const panels = [];
for (const p of dash.panels || []) {
  panels.push(p);
  for (const q of p.panels || []) panels.push(q);
}
const vars = new Set((dash.templating?.list || []).map((v) => v.name));
const ids = new Set();
for (const p of panels) {
  const name = `panel ${p.id} "${p.title}"`;
  if (ids.has(p.id)) err(`${name}: id used twice`);
  ids.add(p.id);
  const g = p.gridPos;
  if (!g || g.x < 0 || g.w < 1 || g.x + g.w > 24 || g.h < 1 || g.y < 0) err(`${name}: gridPos ${JSON.stringify(g)} outside the 24 columns`);
  if (p.type === "row") continue;
  const uid = p.datasource?.uid;
  const m = /^\$\{?(\w+)\}?$/.exec(uid || "");
  if (!m || !vars.has(m[1])) err(`${name}: datasource ${uid} is not a dashboard variable`);
  const refs = new Set();
  if (!(p.targets || []).length) err(`${name}: no query`);
  for (const t of p.targets || []) {
    if (!t.refId || refs.has(t.refId)) err(`${name}: refId ${t.refId} missing or used twice`);
    refs.add(t.refId);
    if (!t.expr) err(`${name}: target ${t.refId} has no expr`);
  }
}
for (let i = 0; i < panels.length; i++)
  for (let j = i + 1; j < panels.length; j++) {
    const a = panels[i].gridPos, b = panels[j].gridPos;
    if (a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h)
      err(`panels ${panels[i].id} and ${panels[j].id} overlap`);
  }

// 3. metric names
const exprs = [];
for (const p of panels) for (const t of p.targets || []) if (t.expr) exprs.push({ p, expr: t.expr });
for (const v of dash.templating?.list || []) {
  const q = typeof v.query === "string" ? v.query : v.query?.query;
  if (v.type === "query" && q) exprs.push({ p: { id: `variable ${v.name}` }, expr: q, variable: true });
}
const documented = new Set(fs.readFileSync(path.join(SRC, "docs", "metrics.md"), "utf8").match(/kvbroker_[a-z0-9_]+/g));
let scraped = null;
if (scrape) {
  scraped = new Set();
  for (const line of fs.readFileSync(scrape, "utf8").split("\n")) {
    const m = /^(kvbroker_[a-z0-9_]+)/.exec(line);
    if (m) scraped.add(m[1]);
  }
}
const family = (n) => n.replace(/_(bucket|sum|count)$/, "");
let names = 0;
for (const { p, expr } of exprs) {
  for (const n of new Set(expr.match(/kvbroker_[a-z0-9_]+/g) || [])) {
    names++;
    if (!documented.has(n) && !documented.has(family(n)))
      err(`panel ${p.id}: ${n} is not in docs/metrics.md`);
    if (scraped && !n.startsWith("kvbroker_rdma_nic_") && !scraped.has(n))
      err(`panel ${p.id}: ${n} is not in the broker's scrape`);
  }
}

// 4. PromQL syntax
let promNote = "promtool not given: PromQL not parsed";
if (promtool) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kvb-dash-"));
  // a variable's query is Grafana's (label_values), not PromQL
  const rules = exprs.filter((e) => !e.variable).map(({ expr }, i) => ({
    record: `kvbroker_dashboard:expr${i}`,
    expr: expr.replace(/\$__rate_interval/g, "1m").replace(/\$__range/g, "1h").replace(/\$\{?instance\}?/g, ".*"),
  }));
  fs.writeFileSync(path.join(tmp, "rules.json"), JSON.stringify({ groups: [{ name: "dashboard", rules }] }));
  try {
    execFileSync(promtool, ["check", "rules", path.join(tmp, "rules.json")], { stdio: "pipe" });
    promNote = `${rules.length} expressions parse (promtool)`;
  } catch (e) {
    err(`promtool check rules: ${(e.stdout || "").toString()}${(e.stderr || "").toString()}`);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

for (const e of errors) console.log("  " + e);
console.log(`${errors.length ? "FAIL" : "ok"}: ${path.relative(process.cwd(), file)}: ${panels.length} panels, ` +
  `${exprs.length} queries naming ${names} metrics (${scraped ? "checked against a scrape" : "no scrape given"}); ${promNote}`);
process.exit(errors.length ? 1 : 0);
