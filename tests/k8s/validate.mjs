// Validates the Kubernetes manifests of deploy/k8s offline: the kustomize base and every
// overlay are rendered (a small kustomize subset: resources, patches as strategic merge or JSON
// 6902) and every object is checked against the Kubernetes OpenAPI schemas of the
// kubernetes-models package, which flags wrong types and missing required fields; unknown
// fields are flagged too (the schemas allow them, the API server's strict decoding does not).
// Then Shoal's own rules: every flag passed to a Shoal binary is one it declares
// (ABSL_FLAG in services/*/main.cc), selectors match, every container has probes and resource
// requests/limits, the peer count matches the shard count, replicated coordinators sit on an
// etcd StatefulSet's members and share a ReadWriteMany volume, and so on.
//
//   npm ci --prefix tests/k8s && node tests/k8s/validate.mjs [KUSTOMIZATION_DIR ...]
//
// With no argument: deploy/k8s/base and every deploy/k8s/overlays/*. Exit 0 when everything
// validates, 1 otherwise (each problem on one line: target, object, path, what is wrong).
// SHOAL_K8S_DUMP=DIR writes each rendering there as JSON (to compare with `kubectl kustomize`).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import YAML from "yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..", "..");
const models = path.join(here, "node_modules", "kubernetes-models");

class ManifestError extends Error {}
const fail = (msg) => {
  throw new ManifestError(msg);
};
const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const rel = (p) => path.relative(root, p) || ".";
const idOf = (o) => `${o?.kind ?? "?"}/${o?.metadata?.name ?? "?"}`;

// --- Rendering: the kustomize features the manifests use -----------------------------------

function readYamlDocs(file) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
  const out = [];
  for (const doc of docs) {
    if (doc.errors.length > 0) fail(`${rel(file)}: YAML: ${doc.errors[0].message}`);
    const value = doc.toJS();
    if (value === null || value === undefined) continue;
    if (!isObject(value)) fail(`${rel(file)}: a document is not a mapping`);
    out.push(value);
  }
  return out;
}

const KUSTOMIZATION_KEYS = new Set(["apiVersion", "kind", "resources", "patches"]);

function kustomize(dir) {
  const file = path.join(dir, "kustomization.yaml");
  if (!fs.existsSync(file)) fail(`${rel(dir)}: no kustomization.yaml`);
  const [k, ...rest] = readYamlDocs(file);
  if (!k || rest.length > 0) fail(`${rel(file)}: expected one document`);
  if (k.apiVersion !== "kustomize.config.k8s.io/v1beta1" || k.kind !== "Kustomization") {
    fail(`${rel(file)}: expected apiVersion kustomize.config.k8s.io/v1beta1, kind Kustomization`);
  }
  for (const key of Object.keys(k)) {
    if (!KUSTOMIZATION_KEYS.has(key)) {
      fail(`${rel(file)}: ${key}: not supported by this validator (supported: ` +
           `${[...KUSTOMIZATION_KEYS].join(", ")}); extend tests/k8s/validate.mjs first`);
    }
  }
  const objects = [];
  for (const r of k.resources ?? []) {
    const p = path.resolve(dir, r);
    if (!fs.existsSync(p)) fail(`${rel(file)}: resources: ${r} does not exist`);
    objects.push(...(fs.statSync(p).isDirectory() ? kustomize(p) : readYamlDocs(p)));
  }
  const seen = new Set();
  for (const o of objects) {
    const key = `${o.apiVersion} ${idOf(o)}`;
    if (seen.has(key)) fail(`${rel(dir)}: ${idOf(o)} is defined twice`);
    seen.add(key);
  }
  for (const [i, p] of (k.patches ?? []).entries()) applyPatch(objects, p, dir, `${rel(file)}: patches[${i}]`);
  return objects;
}

function applyPatch(objects, spec, dir, where) {
  if (!isObject(spec)) fail(`${where}: expected a mapping`);
  for (const key of Object.keys(spec)) {
    if (!["path", "patch", "target"].includes(key)) fail(`${where}: ${key}: not supported`);
  }
  if ((spec.path === undefined) === (spec.patch === undefined)) fail(`${where}: needs one of path, patch`);
  let docs;
  if (spec.path !== undefined) {
    const file = path.resolve(dir, spec.path);
    if (!fs.existsSync(file)) fail(`${where}: ${spec.path} does not exist`);
    docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8")).map((d) => d.toJS()).filter((d) => d != null);
  } else {
    docs = [YAML.parse(spec.patch)];
  }
  if (docs.length !== 1) fail(`${where}: expected exactly one patch document`);
  const patch = docs[0];
  const target = spec.target ?? (isObject(patch) ? { kind: patch.kind, name: patch.metadata?.name } : null);
  if (!target?.kind || !target?.name) fail(`${where}: needs a target (kind and name)`);
  for (const key of Object.keys(target)) {
    if (!["kind", "name", "group", "version"].includes(key)) fail(`${where}: target.${key}: not supported`);
  }
  const matches = objects.filter((o) => o.kind === target.kind && o.metadata?.name === target.name);
  if (matches.length !== 1) fail(`${where}: target ${target.kind}/${target.name} matches ${matches.length} objects`);
  const obj = matches[0];
  // A strategic merge patch that is only `$patch: delete` and the target's identity removes it.
  if (isObject(patch) && patch.$patch !== undefined) {
    const extra = Object.keys(patch).filter((k) => !["$patch", "apiVersion", "kind", "metadata"].includes(k));
    if (patch.$patch !== "delete" || extra.length > 0) fail(`${where}: $patch: only "delete" of a whole object is supported`);
    objects.splice(objects.indexOf(obj), 1);
    return;
  }
  if (Array.isArray(patch)) {
    applyJson6902(obj, patch, where);
  } else {
    if (patch.apiVersion !== undefined && patch.apiVersion !== obj.apiVersion) {
      fail(`${where}: apiVersion ${patch.apiVersion} is not the target's (${obj.apiVersion})`);
    }
    const merged = strategicMerge(obj, patch, where, "");
    for (const key of Object.keys(obj)) delete obj[key];
    Object.assign(obj, merged);
  }
}

// Strategic merge patch: maps merge recursively; lists of the kinds below merge by their key
// (as the Kubernetes API defines them); every other list is replaced; null deletes a field.
const MERGE_KEYS = {
  containers: "name", initContainers: "name", env: "name", ports: "containerPort",
  volumes: "name", volumeMounts: "mountPath", imagePullSecrets: "name",
};

function strategicMerge(base, patch, where, at) {
  if (!isObject(patch)) return structuredClone(patch);
  if (!isObject(base)) base = {};
  const out = structuredClone(base);
  for (const [key, value] of Object.entries(patch)) {
    if (key.startsWith("$")) fail(`${where}: ${at}/${key}: patch directives are not supported`);
    if (value === null) {
      delete out[key];
    } else if (Array.isArray(value) && MERGE_KEYS[key] && Array.isArray(out[key]) &&
               !(key === "ports" && value.some((p) => p.containerPort === undefined))) {
      const mk = MERGE_KEYS[key];
      const list = out[key];
      for (const item of value) {
        if (!isObject(item) || item[mk] === undefined) fail(`${where}: ${at}/${key}: every item needs ${mk}`);
        const i = list.findIndex((x) => x?.[mk] === item[mk]);
        if (i >= 0) list[i] = strategicMerge(list[i], item, where, `${at}/${key}[${mk}=${item[mk]}]`);
        else list.push(structuredClone(item));
      }
    } else if (isObject(value)) {
      out[key] = strategicMerge(out[key], value, where, `${at}/${key}`);
    } else {
      out[key] = structuredClone(value);
    }
  }
  return out;
}

function applyJson6902(obj, ops, where) {
  const decode = (s) => s.replace(/~1/g, "/").replace(/~0/g, "~");
  for (const [i, op] of ops.entries()) {
    const w = `${where}: op ${i}`;
    if (!isObject(op) || typeof op.path !== "string" || !op.path.startsWith("/")) fail(`${w}: needs op and path`);
    const parts = op.path.slice(1).split("/").map(decode);
    const last = parts.pop();
    let parent = obj;
    for (const p of parts) {
      parent = Array.isArray(parent) ? parent[Number(p)] : parent?.[p];
      if (parent === undefined || parent === null || typeof parent !== "object") fail(`${w}: path ${op.path} does not exist`);
    }
    const exists = Array.isArray(parent) ? Number(last) < parent.length : Object.hasOwn(parent, last);
    switch (op.op) {
      case "add":
        if (Array.isArray(parent)) parent.splice(last === "-" ? parent.length : Number(last), 0, structuredClone(op.value));
        else parent[last] = structuredClone(op.value);
        break;
      case "replace":
        if (!exists) fail(`${w}: replace: ${op.path} does not exist`);
        parent[last] = structuredClone(op.value);
        break;
      case "remove":
        if (!exists) fail(`${w}: remove: ${op.path} does not exist`);
        if (Array.isArray(parent)) parent.splice(Number(last), 1);
        else delete parent[last];
        break;
      default:
        fail(`${w}: op "${op.op}" is not supported (add, replace, remove)`);
    }
  }
}

// --- Schema validation -----------------------------------------------------------------------

const validators = new Map();

async function schemaValidator(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (validators.has(key)) return validators.get(key);
  if (typeof apiVersion !== "string" || typeof kind !== "string" || !/^[A-Za-z0-9]+$/.test(kind)) {
    fail("apiVersion and kind must be strings");
  }
  const modelFile = path.join(models, ...apiVersion.split("/"), `${kind}.mjs`);
  if (!fs.existsSync(modelFile)) fail(`unknown apiVersion/kind ${apiVersion} ${kind}`);
  const m = /_schemas\/(\w+)\.mjs/.exec(fs.readFileSync(modelFile, "utf8"));
  if (!m) fail(`cannot find the schema of ${apiVersion} ${kind} in ${modelFile}`);
  const { validate } = await import(pathToFileURL(path.join(models, "_schemas", `${m[1]}.mjs`)).href);
  validators.set(key, validate);
  return validate;
}

// Wraps `value` so that the compiled schema validator's reads are recorded: a property of an
// object that the validator never read is not in the schema (objects it enumerates are maps).
function track(value, records, at) {
  if (value === null || typeof value !== "object") return value;
  const rec = { value, at, read: new Set(), enumerated: false };
  records.push(rec);
  const children = new Map();
  return new Proxy(value, {
    get(t, k, r) {
      if (typeof k === "string") rec.read.add(k);
      const v = Reflect.get(t, k, r);
      if (typeof k !== "string" || v === null || typeof v !== "object") return v;
      if (!children.has(k)) children.set(k, track(v, records, `${at}/${k}`));
      return children.get(k);
    },
    ownKeys(t) {
      rec.enumerated = true;
      return Reflect.ownKeys(t);
    },
  });
}

// The compiled validators carry no messages: make one from the keyword and its parameters.
function describe(e) {
  if (e.message) return e.message;
  const p = e.params ?? {};
  switch (e.keyword) {
    case "type": return `must be ${p.type}`;
    case "required": return `missing required field ${p.missingProperty}`;
    case "enum": return `must be one of ${(p.allowedValues ?? []).join(", ")}`;
    case "format": return `must match format ${p.format}`;
    case "oneOf": case "anyOf": return "matches none of the allowed types";
    default: return `${e.keyword} ${JSON.stringify(p)}`;
  }
}

async function validateSchema(obj) {
  const validate = await schemaValidator(obj.apiVersion, obj.kind);
  const records = [];
  const problems = [];
  if (!validate(track(obj, records, ""))) {
    for (const e of validate.errors ?? []) problems.push(`${e.instancePath || "/"}: ${describe(e)}`);
  }
  for (const r of records) {
    if (r.enumerated || Array.isArray(r.value)) continue;
    for (const k of Object.keys(r.value)) {
      if (!r.read.has(k)) problems.push(`${r.at}/${k}: unknown field`);
    }
  }
  return problems;
}

// --- Shoal's own rules ----------------------------------------------------------------------

const BINARIES = {
  "shoal-coordinator": "services/coordinator/main.cc",
  "shoal-aggregator": "services/aggregator/main.cc",
  "shoal-peer": "services/peer_agent/peer_main.cc",
};

function declaredFlags(binary) {
  const src = fs.readFileSync(path.join(root, BINARIES[binary]), "utf8");
  return new Set([...src.matchAll(/ABSL_FLAG\(\s*[\w:<>]+\s*,\s*(\w+)/g)].map((m) => m[1].replace(/_/g, "-")));
}

// The argv of a container: args (command runs the image's entrypoint otherwise); a `sh -c`
// script is split into words from its `exec`.
function commandLine(c) {
  const argv = [...(c.command ?? []), ...(c.args ?? [])];
  if (argv[0] === "sh" && argv[1] === "-c") {
    const m = /(?:^|\s)exec\s+([\s\S]*)$/.exec(argv[2] ?? "");
    return m ? m[1].trim().split(/\s+/) : [];
  }
  return argv;
}

// `--flag=VALUE` or `--flag VALUE` of argv, or undefined.
function flagOf(argv, flag) {
  for (const [i, a] of argv.entries()) {
    if (a === `--${flag}`) return argv[i + 1];
    if (a.startsWith(`--${flag}=`)) return a.slice(flag.length + 3);
  }
  return undefined;
}

// A coordinator on the etcd store that waits as a standby while another one is active.
const isReplicatedCoordinator = (argv) =>
  argv[0] === "shoal-coordinator" && (flagOf(argv, "store") ?? "").startsWith("etcd://") &&
  flagOf(argv, "standby") !== "false" && !isSharingCoordinator(argv);
// Coordinators on the etcd store that share the tasks, each serving its own.
const isSharingCoordinator = (argv) =>
  argv[0] === "shoal-coordinator" && (flagOf(argv, "store") ?? "").startsWith("etcd://") &&
  flagOf(argv, "share-tasks") === "true";

// --state-dir of coordinators on etcd: a ReadWriteMany claim (they share the checkpoints).
function sharedStateDirProblems(objects, w, argv) {
  const stateDir = flagOf(argv, "state-dir");
  const c = w.spec.template.spec.containers.find((x) => commandLine(x)[0] === "shoal-coordinator");
  const mount = (c.volumeMounts ?? []).find((m) => m.mountPath === stateDir);
  const volume = (w.spec.template.spec.volumes ?? []).find((v) => v.name === mount?.name);
  const claim = objects.find((o) => o.kind === "PersistentVolumeClaim" && o.metadata.name === volume?.persistentVolumeClaim?.claimName);
  if (!claim || !(claim.spec.accessModes ?? []).includes("ReadWriteMany")) {
    return [`--state-dir ${stateDir} must be a ReadWriteMany PersistentVolumeClaim (the replicas share the checkpoints)`];
  }
  return [];
}

// --store of coordinators on etcd: every member of the etcd StatefulSet here, by stable name.
function storeProblems(objects, argv) {
  const store = flagOf(argv, "store").slice("etcd://".length);
  const endpoints = store.split("/")[0].split(",");
  const sets = objects.filter((o) => o.kind === "StatefulSet" && commandLine(o.spec.template.spec.containers[0])[0] === "etcd");
  if (sets.length !== 1) return [`--store ${flagOf(argv, "store")}: expected one etcd StatefulSet here, found ${sets.length}`];
  const e = sets[0];
  const port = (e.spec.template.spec.containers[0].ports ?? []).find((p) => p.name === "client")?.containerPort;
  const members = Array.from({ length: e.spec.replicas ?? 1 }, (_, i) => `${e.metadata.name}-${i}.${e.spec.serviceName}:${port}`);
  if (endpoints.join(",") !== members.join(",")) return [`--store lists ${endpoints.join(",")}, not the etcd members ${members.join(",")}`];
  if (flagOf(argv, "store-tls") !== "true") return ["--store-tls=true: the etcd members take only clients with a certificate of the CA"];
  return [];
}

// Replicated coordinators: two or more replicas whose rollout never waits for readiness (only
// the active one is ever ready), a shared ReadWriteMany checkpoint volume, and --store naming
// every member of an etcd StatefulSet here by its stable name (etcd checked by etcdChecks).
function replicatedCoordinatorChecks(objects, d, argv) {
  const problems = [];
  const bad = (msg) => problems.push(`${idOf(d)}: ${msg}`);
  if (!(d.spec.replicas >= 2)) bad(`replicas ${d.spec.replicas}: a coordinator with standbys needs at least 2`);
  if (flagOf(argv, "standby") !== "true") bad("--standby=true, explicitly");
  const s = d.spec.strategy;
  if (s?.type !== "RollingUpdate" || s.rollingUpdate?.maxUnavailable !== "100%") {
    bad("strategy must be RollingUpdate with maxUnavailable 100% (a standby never becomes ready: a rollout that waits for it never ends)");
  }
  for (const p of [...sharedStateDirProblems(objects, d, argv), ...storeProblems(objects, argv)]) bad(p);
  return problems;
}

// Coordinators that share the tasks: a StatefulSet of two or more behind its headless Service,
// each advertising its stable name (its pod's name, from an env of metadata.name), on a shared
// ReadWriteMany checkpoint volume and every etcd member; every aggregator and peer given every
// coordinator by that name (a client sent to a task's owner can only go to an address it has).
function sharingCoordinatorChecks(objects, s, argv) {
  const problems = [];
  const bad = (msg) => problems.push(`${idOf(s)}: ${msg}`);
  if (s.kind !== "StatefulSet") bad("coordinators that share the tasks must be a StatefulSet (each needs a stable name)");
  const n = s.spec.replicas ?? 1;
  if (n < 2) bad(`replicas ${n}: coordinators that share the tasks need at least 2`);
  const c = s.spec.template.spec.containers.find((x) => commandLine(x)[0] === "shoal-coordinator");
  const podName = (c.env ?? []).find((v) => v.valueFrom?.fieldRef?.fieldPath === "metadata.name")?.name;
  const port = (c.ports ?? []).find((p) => p.name === "grpc")?.containerPort;
  const expected = `$(${podName}).${s.spec.serviceName}:${port}`;
  if (!podName || flagOf(argv, "advertise") !== expected) bad(`--advertise must be ${podName ? expected : "the pod's stable name (an env from metadata.name)"}`);
  for (const p of [...sharedStateDirProblems(objects, s, argv), ...storeProblems(objects, argv)]) bad(p);
  const names = Array.from({ length: n }, (_, i) => `${s.metadata.name}-${i}.${s.spec.serviceName}:${port}`).join(",");
  for (const w of objects.filter(podSpecOf)) {
    for (const x of w.spec.template.spec.containers ?? []) {
      const a = commandLine(x);
      if (!["shoal-aggregator", "shoal-peer"].includes(a[0])) continue;
      if (flagOf(a, "coordinator") !== names) problems.push(`${idOf(w)}: container ${x.name}: --coordinator must list every coordinator, ${names}`);
    }
  }
  return problems;
}

// An etcd StatefulSet: an odd number of members started together, each named after its pod
// and listed in --initial-cluster by its stable name; mutual TLS on both ports with the
// certificate of a mounted Secret; the client port open to the coordinators.
function etcdChecks(objects, e) {
  const problems = [];
  const bad = (msg) => problems.push(`${idOf(e)}: ${msg}`);
  const c = e.spec.template.spec.containers[0];
  const argv = commandLine(c);
  const n = e.spec.replicas ?? 1;
  if (n < 3 || n % 2 === 0) bad(`replicas ${n}: an etcd cluster needs an odd number, at least 3`);
  if (e.spec.podManagementPolicy !== "Parallel") bad("podManagementPolicy must be Parallel (one member alone never becomes ready)");
  const podName = (c.env ?? []).find((v) => v.valueFrom?.fieldRef?.fieldPath === "metadata.name")?.name;
  if (!podName || flagOf(argv, "name") !== `$(${podName})`) bad("--name must be the pod's name (an env from metadata.name)");
  const peerPort = (c.ports ?? []).find((p) => p.name === "peer")?.containerPort;
  const expected = Array.from({ length: n }, (_, i) => `${e.metadata.name}-${i}=https://${e.metadata.name}-${i}.${e.spec.serviceName}:${peerPort}`);
  if (flagOf(argv, "initial-cluster") !== expected.join(",")) bad(`--initial-cluster must be ${expected.join(",")}`);
  if (flagOf(argv, "initial-advertise-peer-urls") !== `https://$(${podName}).${e.spec.serviceName}:${peerPort}`) bad("--initial-advertise-peer-urls must be the pod's stable name over https");
  for (const flag of ["listen-client-urls", "advertise-client-urls", "listen-peer-urls"]) {
    if (!(flagOf(argv, flag) ?? "").startsWith("https://")) bad(`--${flag} must be https:// (mutual TLS)`);
  }
  for (const flag of ["client-cert-auth", "peer-client-cert-auth"]) {
    if (!argv.includes(`--${flag}`)) bad(`--${flag}: without it any client is taken`);
  }
  const secretDirs = (c.volumeMounts ?? []).filter((m) =>
    (e.spec.template.spec.volumes ?? []).some((v) => v.name === m.name && v.secret?.secretName)).map((m) => m.mountPath);
  for (const flag of ["cert-file", "key-file", "trusted-ca-file", "peer-cert-file", "peer-key-file", "peer-trusted-ca-file"]) {
    const file = flagOf(argv, flag);
    if (!file || !secretDirs.some((d) => file.startsWith(`${d}/`))) bad(`--${flag} ${file ?? "(missing)"}: must be a file of a mounted Secret`);
  }
  const svc = objects.find((o) => o.kind === "Service" && o.metadata.name === e.spec.serviceName);
  if (svc && svc.spec.publishNotReadyAddresses !== true) bad(`Service ${svc.metadata.name} must publishNotReadyAddresses (members resolve each other before they are ready)`);
  const labels = e.spec.template.metadata.labels;
  const clientPort = (c.ports ?? []).find((p) => p.name === "client")?.containerPort;
  const open = objects.some((o) => o.kind === "NetworkPolicy" &&
    Object.entries(o.spec.podSelector?.matchLabels ?? {}).every(([k, v]) => labels[k] === v) &&
    (o.spec.ingress ?? []).some((r) => (r.ports ?? []).some((p) => p.port === clientPort) &&
      (r.from ?? []).some((f) => f.podSelector?.matchLabels?.["app.kubernetes.io/component"] === "coordinator")));
  if (!open) bad(`no NetworkPolicy lets the coordinators reach the client port ${clientPort}`);
  return problems;
}

const podSpecOf = (o) => (["Deployment", "StatefulSet", "DaemonSet", "Job"].includes(o.kind) ? o.spec?.template : null);

function shoalChecks(objects) {
  const problems = [];
  const bad = (o, msg) => problems.push(`${idOf(o)}: ${msg}`);
  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  const workloads = objects.filter(podSpecOf);
  const labelsMatch = (selector, labels) =>
    Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);

  for (const w of workloads) {
    const tpl = w.spec.template;
    if (!labelsMatch(w.spec.selector?.matchLabels, tpl.metadata?.labels)) bad(w, "spec.selector does not match the pod template's labels");
    const a = tpl.metadata?.annotations ?? {};
    if (a["prometheus.io/scrape"] !== "true" || !a["prometheus.io/path"]) bad(w, "pod template lacks prometheus.io/scrape and prometheus.io/path annotations");
    const ports = (tpl.spec.containers ?? []).flatMap((c) => c.ports ?? []);
    if (!ports.some((p) => String(p.containerPort) === a["prometheus.io/port"] && p.name === "metrics")) {
      bad(w, `prometheus.io/port "${a["prometheus.io/port"]}" is not a container port named metrics`);
    }
    const volumes = new Set([...(tpl.spec.volumes ?? []), ...(w.spec.volumeClaimTemplates ?? []).map((t) => t.metadata)]
      .map((v) => v?.name));
    for (const c of [...(tpl.spec.initContainers ?? []), ...(tpl.spec.containers ?? [])]) {
      const res = c.resources ?? {};
      for (const kind of ["requests", "limits"]) {
        for (const r of ["cpu", "memory"]) if (res[kind]?.[r] === undefined) bad(w, `container ${c.name}: no resources.${kind}.${r}`);
      }
      for (const m of c.volumeMounts ?? []) if (!volumes.has(m.name)) bad(w, `container ${c.name}: volumeMount ${m.name} has no volume`);
      const argv = commandLine(c);
      const bin = argv[0];
      if (BINARIES[bin]) {
        const flags = declaredFlags(bin);
        for (const arg of argv.slice(1)) {
          const m = /^--([\w-]+)/.exec(arg);
          if (m && !flags.has(m[1].replace(/_/g, "-"))) bad(w, `container ${c.name}: ${bin} has no flag --${m[1]} (${BINARIES[bin]})`);
        }
        if (!argv.some((a) => a.startsWith("--tls-dir"))) bad(w, `container ${c.name}: ${bin} runs without --tls-dir`);
      }
    }
    for (const c of tpl.spec.containers ?? []) {
      const argv = commandLine(c);
      if (!BINARIES[argv[0]]) {
        // Another program (etcd): probes of its own kind.
        for (const probe of ["readinessProbe", "livenessProbe"]) if (!c[probe]) bad(w, `container ${c.name}: no ${probe}`);
        continue;
      }
      // A standby coordinator is NOT_SERVING: only readiness may ask the health service, or
      // every standby would be restarted; the others check that it listens.
      const standby = isReplicatedCoordinator(argv);
      for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const cmd = c[probe]?.exec?.command;
        const health = cmd && cmd[0] === "shoalctl" && cmd[1] === "health" && cmd.includes("--target") && cmd.includes("--tls-dir");
        if (standby && probe !== "readinessProbe") {
          if (health || c[probe]?.tcpSocket?.port !== "grpc") bad(w, `container ${c.name}: ${probe} of a coordinator with standbys must be a tcpSocket probe of port grpc (a standby's health is NOT_SERVING)`);
        } else if (!health) {
          bad(w, `container ${c.name}: ${probe} must be an exec of shoalctl health --target ... --tls-dir ...`);
        }
      }
    }
    for (const v of tpl.spec.volumes ?? []) {
      const claim = v.persistentVolumeClaim?.claimName;
      if (claim && !byKind("PersistentVolumeClaim").some((p) => p.metadata.name === claim)) bad(w, `volume ${v.name}: no PersistentVolumeClaim ${claim}`);
    }
  }
  for (const s of byKind("StatefulSet")) {
    const svc = byKind("Service").find((x) => x.metadata.name === s.spec.serviceName);
    if (!svc || svc.spec.clusterIP !== "None") bad(s, `serviceName ${s.spec.serviceName} is not a headless Service here`);
    if (commandLine(s.spec.template.spec.containers[0])[0] === "etcd") problems.push(...etcdChecks(objects, s));
  }
  for (const s of byKind("Service")) {
    if (!workloads.some((w) => labelsMatch(s.spec.selector, w.spec.template.metadata?.labels))) bad(s, "selector matches no pod template");
  }
  const coordinators = workloads.filter((w) => ["Deployment", "StatefulSet"].includes(w.kind) && w.metadata.name === "shoal-coordinator");
  const coordinator = coordinators.length === 1 ? coordinators[0] : null;
  if (!coordinator) problems.push(`expected one Deployment or StatefulSet shoal-coordinator, found ${coordinators.length}`);
  else {
    const argv = coordinator.spec.template.spec.containers.map(commandLine).find((a) => a[0] === "shoal-coordinator") ?? [];
    if (isSharingCoordinator(argv)) {
      problems.push(...sharingCoordinatorChecks(objects, coordinator, argv));
    } else if (coordinator.kind !== "Deployment") {
      bad(coordinator, "must be a Deployment unless its coordinators share the tasks (--share-tasks=true)");
    } else if (isReplicatedCoordinator(argv)) {
      problems.push(...replicatedCoordinatorChecks(objects, coordinator, argv));
    } else if (coordinator.spec.replicas !== 1 || coordinator.spec.strategy?.type !== "Recreate") {
      bad(coordinator, "must have replicas 1 and strategy Recreate (its state is one SQLite database)");
    }
  }
  const peers = byKind("StatefulSet").find((s) => s.metadata.name === "shoal-peer");
  if (!peers) problems.push("no StatefulSet shoal-peer");
  else {
    const env = peers.spec.template.spec.containers.flatMap((c) => c.env ?? []).find((e) => e.name === "SHOAL_PEERS");
    if (String(env?.value) !== String(peers.spec.replicas ?? 1)) {
      bad(peers, `env SHOAL_PEERS (${env?.value}) must equal replicas (${peers.spec.replicas}): it is the shard count`);
    }
  }
  if (byKind("NetworkPolicy").length === 0) problems.push("no NetworkPolicy");
  return problems;
}

// --- Main ------------------------------------------------------------------------------------

async function check(name, render) {
  let objects;
  try {
    objects = render();
    if (process.env.SHOAL_K8S_DUMP) fs.writeFileSync(path.join(process.env.SHOAL_K8S_DUMP, name.replace(/\//g, "_") + ".json"), JSON.stringify(objects));
  } catch (e) {
    if (!(e instanceof ManifestError)) throw e;
    return [`${name}: ${e.message}`];
  }
  const problems = [];
  for (const o of objects) {
    try {
      for (const p of await validateSchema(o)) problems.push(`${name}: ${idOf(o)}: ${p}`);
    } catch (e) {
      if (!(e instanceof ManifestError)) throw e;
      problems.push(`${name}: ${idOf(o)}: ${e.message}`);
    }
  }
  for (const p of shoalChecks(objects)) problems.push(`${name}: ${p}`);
  console.log(`${problems.length === 0 ? "ok  " : "FAIL"} ${name} (${objects.length} objects)`);
  return problems;
}

// The validator must be able to fail: a broken Deployment is rejected on each count.
async function selfCheck() {
  const good = {
    apiVersion: "apps/v1", kind: "Deployment", metadata: { name: "x" },
    spec: { selector: { matchLabels: { a: "b" } }, template: { metadata: { labels: { a: "b" } },
      spec: { containers: [{ name: "c", image: "i", resources: { limits: { cpu: "1" } } }] } } },
  };
  const cases = [
    ["spec.replicas: \"two\"", (d) => { d.spec.replicas = "two"; }, /replicas.*integer/],
    ["an unknown field spec.bogus", (d) => { d.spec.bogus = 1; }, /\/spec\/bogus: unknown field/],
    ["a misspelt container field", (d) => { d.spec.template.spec.containers[0].imagee = "i"; }, /imagee: unknown field/],
    ["no spec.selector", (d) => { delete d.spec.selector; }, /selector/],
  ];
  const problems = [];
  if ((await validateSchema(structuredClone(good))).length !== 0) problems.push("self-check: a valid Deployment was rejected");
  for (const [what, mutate, expected] of cases) {
    const d = structuredClone(good);
    mutate(d);
    const got = await validateSchema(d);
    if (!got.some((p) => expected.test(p))) problems.push(`self-check: a Deployment with ${what} was not rejected (${got.join("; ") || "no error"})`);
  }
  console.log(`${problems.length === 0 ? "ok  " : "FAIL"} self-check (broken manifests are rejected)`);
  return problems;
}

async function main() {
  if (!fs.existsSync(models)) {
    console.error("validate: tests/k8s/node_modules is missing: run `npm ci --prefix tests/k8s`");
    process.exit(1);
  }
  let dirs = process.argv.slice(2).map((d) => path.resolve(d));
  if (dirs.length === 0) {
    const k8s = path.join(root, "deploy", "k8s");
    const overlays = path.join(k8s, "overlays");
    dirs = [path.join(k8s, "base"),
      ...fs.readdirSync(overlays).sort().map((d) => path.join(overlays, d))
        .filter((d) => fs.existsSync(path.join(d, "kustomization.yaml")))];
  }
  const problems = [...(await selfCheck())];
  let failed = problems.length > 0 ? 1 : 0;
  let passed = problems.length > 0 ? 0 : 1;
  for (const dir of dirs) {
    const p = await check(rel(dir), () => kustomize(dir));
    problems.push(...p);
    if (p.length > 0) failed++;
    else passed++;
  }
  for (const p of problems) console.log(`  ${p}`);
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed > 0 ? 1 : 0);
}

await main();
