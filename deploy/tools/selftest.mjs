// SPDX-License-Identifier: MIT
// The checks fail where they should: validate.mjs on a copy of
// deploy/kubernetes with mistakes put in, check-dashboard.mjs on a copy of
// the dashboard with mistakes put in; each mistake must be reported.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const K8S = path.resolve(HERE, "..", "kubernetes");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kvb-deploy-selftest-"));
let bad = 0;

function edit(file, from, to) {
  const s = fs.readFileSync(file, "utf8");
  if (!s.includes(from)) throw new Error(`${file}: '${from}' not found: the self-test is out of date`);
  fs.writeFileSync(file, s.replace(from, to));
}

function expect(what, args, wants) {
  const r = spawnSync(process.execPath, args, { encoding: "utf8" });
  const out = r.stdout + r.stderr;
  if (r.status !== 1) {
    bad++;
    console.log(`FAIL: ${what}: exit ${r.status}, not 1\n${out}`);
  }
  for (const [mistake, text] of wants) {
    if (out.includes(text)) console.log(`  ok: ${what}: ${mistake}`);
    else {
      bad++;
      console.log(`FAIL: ${what}: ${mistake} not reported ('${text}')`);
    }
  }
}

try {
  const m = path.join(tmp, "kubernetes");
  fs.cpSync(K8S, m, { recursive: true });
  edit(path.join(m, "broker/daemonset.yaml"), "      hostNetwork: true", "      hostNetwrok: true");
  edit(path.join(m, "vllm-example/prefill.yaml"), 'cpu: "4"', 'cpu: "4 cores"');
  edit(path.join(m, "vllm-example/decode.yaml"), "        runAsUser: 10001", "        runAsUser: 1000");
  edit(path.join(m, "vllm-example/prefill.yaml"), '"broker_socket": "/run/kvbroker/kvbroker.sock"', '"broker_socket": "/var/run/kvb/kvbroker.sock"');
  edit(path.join(m, "vllm-example/decode.yaml"), '"handshake_port": 6301', '"handshake_port": 6401');
  edit(path.join(m, "vllm-example/decode.yaml"), '"host_ip": "$(HOST_IP)"', '"host_ip": "$(NODE_IP)"');
  edit(path.join(m, "monitoring/podmonitor.yaml"), "    - port: metrics", "    - port: prometheus");
  edit(path.join(m, "overlays/rdma/broker.yaml"), 'value: ["IPC_LOCK"]', 'value: ["NET_ADMIN"]');
  expect("manifests", [path.join(HERE, "validate.mjs"), m, path.join(m, "overlays", "rdma")], [
    ["a misspelt field (hostNetwrok)", "'\"hostNetwrok\"' does not exist in type 'IPodSpec'"],
    ["a quantity that is not one", "cpu must match format \"quantity\""],
    ["no hostNetwork for the broker", "no hostNetwork"],
    ["vLLM of another uid than the broker", "runs as uid 1000, the broker as 10001"],
    ["broker_socket outside the socket directory", "its directory is not the broker's hostPath /run/kvbroker"],
    ["another handshake port", "handshake_port 6401 is not the broker's 6301"],
    ["an undefined $(VAR)", "$(NODE_IP) is not defined"],
    ["a PodMonitor port the broker lacks", "port prometheus: not a port of the broker container"],
    ["rdma without IPC_LOCK", "rdma without IPC_LOCK"],
  ]);
  const d = JSON.parse(fs.readFileSync(path.join(K8S, "monitoring", "kvbroker-dashboard.json"), "utf8"));
  const p = d.panels.find((x) => x.type === "timeseries");
  p.targets[0].expr = p.targets[0].expr.replace(/kvbroker_[a-z_]+/, "kvbroker_no_such_metric_total");
  p.gridPos = { ...d.panels.find((x) => x.type === "stat").gridPos };
  p.title = 42;
  d.panels.push({ ...d.panels[1], gridPos: { h: 4, w: 4, x: 22, y: 200 } });
  const df = path.join(tmp, "dashboard.json");
  fs.writeFileSync(df, JSON.stringify(d));
  expect("dashboard", [path.join(HERE, "check-dashboard.mjs"), df], [
    ["a metric the broker does not export", "kvbroker_no_such_metric_total is not in docs/metrics.md"],
    ["two panels on one place", "overlap"],
    ["a title that is a number", "Type 'number' is not assignable to type 'string'"],
    ["a panel id twice, and one past the 24 columns", "id used twice"],
    ["a panel past the 24 columns", "outside the 24 columns"],
  ]);
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
console.log(bad ? `${bad} mistakes not reported` : "every mistake reported");
process.exit(bad ? 1 : 0);
