// The Shoal web console: one page, views by URL fragment (#/tasks, #/task/NAME, #/nodes,
// #/create), over the coordinator's JSON API (/api/...). No library.
"use strict";

const state = { role: null, events: null, task: null, rounds: new Map() };
const $ = (id) => document.getElementById(id);

// ---- helpers --------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const num = (v) => Number(v || 0);
const short = (name) =>
  String(name || "").replace(/^(TASK_STATE_|MODE_|ROUND_PHASE_|REACHABILITY_|PARTITION_)/, "");
const pct = (v) => (v === undefined || v === null ? "" : (100 * v).toFixed(1) + " %");
const ms = (v) => (num(v) >= 10000 ? (num(v) / 1000).toFixed(1) + " s" : num(v) + " ms");
const bytes = (v) => {
  let n = num(v), u = 0;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  while (n >= 1024 && u < units.length - 1) { n /= 1024; u++; }
  return n === 0 ? "" : n.toFixed(u ? 1 : 0) + " " + units[u];
};
const when = (unixMs) => (num(unixMs) ? new Date(num(unixMs)).toLocaleString() : "");

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({ credentials: "same-origin" }, options));
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (response.status === 401) showLogin();
  if (!response.ok) {
    throw new HttpError(response.status, (body && body.error) || `HTTP ${response.status}`);
  }
  return body;
}

function stateTag(s) {
  const name = short(s);
  return h("span", { class: "state " + name }, name.toLowerCase());
}

function view(...children) {
  const v = $("view");
  v.replaceChildren(...children);
  return v;
}

function errorBox(e) {
  return h("p", { class: "error", id: "error" }, e.message || String(e));
}

// ---- login ----------------------------------------------------------------------------------

function showLogin() {
  closeEvents();
  state.role = null;
  $("login").hidden = false;
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("view").replaceChildren();
}

async function login(event) {
  event.preventDefault();
  $("login-error").textContent = "";
  const response = await fetch("/api/login", {
    method: "POST", credentials: "same-origin", body: $("token").value,
    headers: { "Content-Type": "text/plain" } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    $("login-error").textContent = body.error || `HTTP ${response.status}`;
    return;
  }
  $("token").value = "";
  loggedIn(body.role);
}

function loggedIn(role) {
  state.role = role;
  $("login").hidden = true;
  $("nav").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = role;
  $("nav-create").hidden = role !== "admin";
  route();
}

async function logout() {
  await fetch("/api/logout", { method: "POST", credentials: "same-origin" });
  showLogin();
}

// ---- tasks ----------------------------------------------------------------------------------

async function showTasks() {
  const filters = h("div", { class: "filters" },
    h("label", {}, "State ", h("select", { id: "filter-state" },
      ["", "WAITING", "RUNNING", "COMPLETED", "STOPPED", "FAILED"].map(
        (s) => h("option", { value: s }, s ? s.toLowerCase() : "any")))),
    h("label", {}, "Mode ", h("select", { id: "filter-mode" },
      ["", "FEDERATED_SYNC", "FEDERATED_ASYNC", "DECENTRALIZED", "GOSSIP"].map(
        (s) => h("option", { value: s }, s ? s.toLowerCase().replace("_", "-") : "any")))),
    h("label", {}, "Name ", h("input", { id: "filter-name", type: "search",
                                        placeholder: "contains" })));
  const table = h("div", { id: "tasks" }, h("p", { class: "muted" }, "loading..."));
  view(h("h1", {}, "Tasks"), filters, table);
  let tasks = [];
  const draw = () => {
    const st = $("filter-state").value, mode = $("filter-mode").value;
    const name = $("filter-name").value.trim();
    const rows = tasks.filter((t) =>
      (!st || short(t.status.state) === st) && (!mode || short(t.status.spec.mode) === mode) &&
      (!name || t.status.spec.name.includes(name)));
    table.replaceChildren(rows.length === 0 ? h("p", { class: "muted" }, "no tasks") :
      h("table", {},
        h("tr", {}, ["Name", "State", "Mode", "Round", "Version", "Accuracy", "Peers",
                     "Created"].map((c) => h("th", {}, c))),
        rows.map((t) => {
          const s = t.status, spec = s.spec;
          const rounds = num(spec.rounds) ? `${s.round} / ${spec.rounds}` : String(s.round);
          return h("tr", { class: "clickable", "data-task": spec.name,
                           onclick: () => { location.hash = "#/task/" + spec.name; } },
            h("td", {}, h("a", { href: "#/task/" + spec.name }, spec.name)),
            h("td", {}, stateTag(s.state)),
            h("td", {}, short(spec.mode).toLowerCase().replace("_", "-")),
            h("td", { class: "num" }, rounds),
            h("td", { class: "num" }, s.model_version),
            h("td", { class: "num accuracy" },
              t.latest_round ? pct(t.latest_round.test_accuracy) : ""),
            h("td", { class: "num" }, `${s.participants.length} (min ${spec.min_participants})`),
            h("td", {}, when(s.created_unix_ms)));
        })));
  };
  for (const id of ["filter-state", "filter-mode", "filter-name"]) {
    $(id).addEventListener("input", draw);
  }
  try {
    tasks = (await api("/api/tasks")).tasks;
    draw();
  } catch (e) {
    table.replaceChildren(errorBox(e));
  }
}

// ---- one task -------------------------------------------------------------------------------

function closeEvents() {
  if (state.events) state.events.close();
  state.events = null;
}

// Rounds by number; a round seen with its per-peer lists keeps them.
function mergeRounds(rounds) {
  for (const r of rounds) {
    const old = state.rounds.get(num(r.round));
    if (old && r.lists_omitted && !old.lists_omitted) continue;
    state.rounds.set(num(r.round), r);
  }
}

async function showTask(name) {
  view(h("h1", {}, name), h("p", { class: "muted" }, "loading..."));
  state.rounds = new Map();
  try {
    const task = await api("/api/tasks/" + encodeURIComponent(name));
    state.task = task.status;
    mergeRounds(task.rounds);
  } catch (e) {
    view(h("h1", {}, name), errorBox(e));
    return;
  }
  drawTask();
  // Live: the status again at every change (WatchTask), until the task ends.
  const events = new EventSource("/api/tasks/" + encodeURIComponent(name) + "/events");
  state.events = events;
  events.addEventListener("status", (e) => {
    const status = JSON.parse(e.data);
    state.task = status;
    mergeRounds(status.history || []);
    drawTask();
  });
  events.addEventListener("end", () => {
    closeEvents();
    const live = $("live");
    if (live) live.textContent = "";
  });
}

function facts(pairs) {
  return h("div", { class: "facts" }, pairs.filter((p) => p[1] !== "" && p[1] !== undefined)
    .map(([k, v]) => h("div", {}, h("span", {}, k), v)));
}

function drawTask() {
  const s = state.task, spec = s.spec;
  const rounds = [...state.rounds.values()].sort((a, b) => num(a.round) - num(b.round));
  const evaluated = rounds.filter((r) => r.evaluated);
  const ended = ["COMPLETED", "STOPPED", "FAILED"].includes(short(s.state));
  const toolbar = h("div", { class: "toolbar" },
    h("a", { class: "button", id: "download", href: `/api/tasks/${encodeURIComponent(spec.name)}/model`,
             download: true }, "Download model"),
    state.role === "admin" && !ended ?
      h("button", { class: "danger", id: "stop", onclick: stopTask }, "Stop task") : null,
    state.role === "admin" && ended ?
      h("button", { class: "danger", id: "delete", onclick: deleteTask }, "Delete task") : null,
    state.events ? h("span", { class: "live", id: "live" }, "● live") : null,
    h("span", { class: "error", id: "task-error" }));
  const parts = [
    h("h1", {}, spec.name, " ", stateTag(s.state)),
    toolbar,
    facts([
      ["Mode", short(spec.mode).toLowerCase().replace("_", "-")],
      ["Phase", short(s.phase) === "UNSPECIFIED" ? "" : short(s.phase).toLowerCase()],
      ["Round", num(spec.rounds) ? `${s.round} of ${spec.rounds}` : s.round],
      ["Model version", s.model_version],
      ["Model", spec.model || (spec.torchscript ? "torchscript" : "")],
      ["Dataset", spec.dataset ?
        `${spec.dataset.name || ""} ${short(spec.dataset.partition).toLowerCase()}` : ""],
      ["Participants", `${s.participants.length} (min ${spec.min_participants})`],
      ["Aggregator", s.aggregator],
      ["Created", when(s.created_unix_ms)],
      ["Latest accuracy", evaluated.length ? pct(evaluated[evaluated.length - 1].test_accuracy) : ""],
      ["Message", s.message],
    ]),
    h("h2", {}, "Training"),
    h("div", { class: "charts" },
      ShoalCharts.line([{ label: "test accuracy", color: "#2f7bd0",
                          points: evaluated.map((r) => [num(r.round), r.test_accuracy]) }],
                       { title: "Accuracy per round", id: "chart-accuracy", yMin: 0, yMax: 1,
                         empty: "no evaluated round yet" }),
      ShoalCharts.line([
        { label: "mean train loss", color: "#d0792f",
          points: rounds.filter((r) => r.mean_train_loss > 0).map((r) => [num(r.round), r.mean_train_loss]) },
        { label: "test loss", color: "#7a4bb5",
          points: evaluated.map((r) => [num(r.round), r.test_loss]) }],
        { title: "Loss per round", id: "chart-loss" }),
      ShoalCharts.bars(rounds.filter((r) => num(r.duration_ms) > 0).map(
        (r) => ({ x: num(r.round), y: num(r.duration_ms) / 1000 })),
        { title: "Round duration (s)", id: "chart-duration" })),
  ];
  if (s.privacy && (num(s.privacy.rounds) || s.privacy.delta)) parts.push(privacy(s.privacy));
  parts.push(h("h2", {}, "Rounds"), roundsTable(rounds));
  if ((s.data || []).length) parts.push(h("h2", {}, "Data of each peer"), dataTable(s.data));
  if ((s.clusters || []).length) parts.push(h("h2", {}, "Aggregation tree"), tree(s.clusters));
  if ((s.peers || []).length) parts.push(h("h2", {}, "Peers"), peersTable(s.peers));
  if ((s.nodes || []).length) parts.push(h("h2", {}, "Nodes of this task"), nodesTable(s.nodes));
  view(...parts);
}

function privacy(p) {
  const eps = p.epsilon >= 1e300 ? "∞ (no noise)" : Number(p.epsilon).toFixed(3);
  return h("div", { id: "privacy" }, h("h2", {}, "Privacy budget"), facts([
    ["ε spent", eps], ["δ", p.delta], ["Rounds charged", p.rounds],
    ["Sampling rate", Number(p.sampling_rate).toFixed(3)],
    ["Target ε", p.target_epsilon ? p.target_epsilon : "none"],
    ["Rounds left", p.target_epsilon ? p.rounds_left : ""]]));
}

function peerList(r) {
  if (r.lists_omitted) {
    return h("span", { class: "muted" },
      `${r.participant_count} peers` + (num(r.dropped_count) ? `, ${r.dropped_count} dropped` : ""));
  }
  const late = new Set(r.late || []);
  return h("span", {},
    (r.participants || []).map((p) => h("span", { class: late.has(p) ? "late" : "" }, p, " ")),
    (r.dropped || []).map((p) => h("span", { class: "dropped", title: "dropped" }, p, " ")));
}

function roundsTable(rounds) {
  if (rounds.length === 0) return h("p", { class: "muted", id: "rounds" }, "no rounds yet");
  return h("table", { id: "rounds" },
    h("tr", {}, ["Round", "Version", "Accuracy", "Test loss", "Train loss", "Samples", "Duration",
                 "Peers (dropped struck through, late in orange)", "ε"].map((c) => h("th", {}, c))),
    rounds.slice().reverse().map((r) => h("tr", { "data-round": r.round },
      h("td", { class: "num" }, r.round), h("td", { class: "num" }, r.model_version),
      h("td", { class: "num" }, r.evaluated ? pct(r.test_accuracy) : ""),
      h("td", { class: "num" }, r.evaluated ? Number(r.test_loss).toFixed(3) : ""),
      h("td", { class: "num" }, r.mean_train_loss ? Number(r.mean_train_loss).toFixed(3) : ""),
      h("td", { class: "num" }, r.num_samples),
      h("td", { class: "num" }, ms(r.duration_ms)),
      h("td", {}, peerList(r)),
      h("td", { class: "num" }, r.epsilon ? Number(r.epsilon).toFixed(2) : ""))));
}

function dataTable(data) {
  return h("table", { id: "peer-data" },
    h("tr", {}, h("th", {}, "Peer"), h("th", { class: "num" }, "Training samples"),
      h("th", { class: "num" }, "Test samples"), h("th", {}, "Labels")),
    data.map((d) => h("tr", {},
      h("td", {}, d.peer_id), h("td", { class: "num" }, d.train_samples),
      h("td", { class: "num" }, d.test_samples),
      h("td", {}, (d.label_histogram || []).length ?
        ShoalCharts.histogram(d.label_histogram.map(Number)) : ""))));
}

function tree(clusters) {
  const children = new Map();
  for (const c of clusters) {
    const list = children.get(c.parent || "") || [];
    list.push(c);
    children.set(c.parent || "", list);
  }
  const item = (c) => h("li", {},
    h("b", {}, c.aggregator), " ", h("span", { class: "tag" }, c.level === 0 ? "root" : "level " + c.level),
    c.host_peer ? h("span", { class: "tag" }, "supernode on " + c.host_peer) : null,
    (c.backups || []).length ? h("span", { class: "tag" }, "backups: " + c.backups.join(", ")) : null,
    (c.peers || []).length ? h("div", { class: "muted" }, "peers: " + c.peers.join(", ")) : null,
    (children.get(c.aggregator) || []).length ?
      h("ul", {}, children.get(c.aggregator).map(item)) : null);
  return h("div", { class: "tree", id: "tree" }, h("ul", {}, (children.get("") || []).map(item)));
}

function peersTable(peers) {
  return h("table", { id: "progress" },
    h("tr", {}, ["Peer", "State", "Model round", "Step", "Loss", "Updates"].map((c) => h("th", {}, c))),
    peers.map((p) => h("tr", {}, h("td", {}, p.peer_id), h("td", {}, p.state),
      h("td", { class: "num" }, p.model_round), h("td", { class: "num" }, p.step),
      h("td", { class: "num" }, p.loss ? Number(p.loss).toFixed(3) : ""),
      h("td", { class: "num" }, p.updates))));
}

async function stopTask() {
  if (!confirm(`Stop task ${state.task.spec.name}?`)) return;
  try {
    state.task = await api(`/api/tasks/${encodeURIComponent(state.task.spec.name)}/stop`,
                           { method: "POST" });
    drawTask();
  } catch (e) {
    $("task-error").textContent = e.message;
  }
}

async function deleteTask() {
  const name = state.task.spec.name;
  if (!confirm(`Delete task ${name} with its rounds and checkpoints?`)) return;
  try {
    await api(`/api/tasks/${encodeURIComponent(name)}`, { method: "DELETE" });
    location.hash = "#/tasks";
  } catch (e) {
    $("task-error").textContent = e.message;
  }
}

// ---- peers and aggregators ------------------------------------------------------------------

function capacity(c) {
  if (!c) return "";
  const parts = [];
  if (c.cpu_cores) parts.push(`${c.cpu_cores} cores`);
  if (c.matmul_gflops) parts.push(`${Number(c.matmul_gflops).toFixed(1)} GFLOP/s`);
  if (num(c.memory_bytes)) parts.push(`${bytes(c.memory_available_bytes)} of ${bytes(c.memory_bytes)} free`);
  if (c.upload_bytes_per_second) parts.push(`upload ${bytes(c.upload_bytes_per_second)}/s`);
  return parts.join(", ");
}

function nodesTable(nodes, id) {
  return h("table", { id: id || "task-nodes" },
    h("tr", {}, ["Id", "Role", "Address", "Device", "Task", "Capacity", "Reachability",
                 "Supernode", "Aggregator RTTs", "Since"].map((c) => h("th", {}, c))),
    nodes.map((n) => h("tr", {},
      h("td", {}, n.id), h("td", {}, n.role),
      // HOST:PORT/PEER_ID: a peer behind NAT, reached through the relay at HOST:PORT.
      h("td", {}, n.address.includes("/") ? `via relay ${n.address.split("/")[0]}` : n.address),
      h("td", {}, n.device),
      h("td", {}, n.task ? h("a", { href: "#/task/" + n.task }, n.task) : ""),
      h("td", {}, capacity(n.capacity)),
      h("td", {}, n.capacity ? short(n.capacity.reachability).toLowerCase() : ""),
      h("td", {}, n.supernode),
      h("td", {}, ((n.capacity && n.capacity.aggregator_rtts) || [])
        .map((r) => `${r.address} ${(r.rtt_us / 1000).toFixed(1)} ms`).join(", ")),
      h("td", {}, when(n.since_unix_ms)))));
}

async function showNodes() {
  view(h("h1", {}, "Peers and aggregators"), h("p", { class: "muted" }, "loading..."));
  try {
    const nodes = await api("/api/nodes");
    view(h("h1", {}, "Peers and aggregators"),
      h("h2", {}, `Peers (${nodes.peers.length})`),
      nodes.peers.length ? nodesTable(nodes.peers, "peers") : h("p", { class: "muted" }, "none"),
      h("h2", {}, `Aggregators (${nodes.aggregators.length})`),
      nodes.aggregators.length ? nodesTable(nodes.aggregators, "aggregators") :
        h("p", { class: "muted" }, "none"));
  } catch (e) {
    view(h("h1", {}, "Peers and aggregators"), errorBox(e));
  }
}

// ---- create ---------------------------------------------------------------------------------

function showCreate() {
  const file = h("input", { type: "file", id: "task-upload", accept: ".yaml,.yml,.json" });
  const text = h("textarea", { id: "task-file", spellcheck: "false",
                               placeholder: "name: my-task\nmode: federated-sync\n..." });
  file.addEventListener("change", async () => {
    if (file.files.length) text.value = await file.files[0].text();
  });
  const error = h("p", { class: "error", id: "create-error" });
  text.addEventListener("input", () => { error.textContent = ""; });
  const submit = h("button", { id: "create", onclick: async () => {
    error.textContent = "";
    submit.disabled = true;
    try {
      const status = await api("/api/tasks", { method: "POST", body: text.value,
                                               headers: { "Content-Type": "application/yaml" } });
      location.hash = "#/task/" + status.spec.name;
    } catch (e) {
      error.textContent = e.message;
    } finally {
      submit.disabled = false;
    }
  } }, "Create task");
  view(h("h1", {}, "Create a task"),
    h("p", {}, "A task file in YAML or JSON, as for ", h("code", {}, "shoalctl task create"),
      "; the coordinator reads it and names any field that is wrong."),
    h("p", {}, "Upload one: ", file), text, h("div", { class: "toolbar" }, submit), error);
}

// ---- routing --------------------------------------------------------------------------------

function route() {
  if (!state.role) return;
  closeEvents();
  const hash = location.hash || "#/tasks";
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", hash.startsWith(a.getAttribute("href")));
  }
  if (hash.startsWith("#/task/")) return showTask(decodeURIComponent(hash.slice(7)));
  if (hash === "#/nodes") return showNodes();
  if (hash === "#/create" && state.role === "admin") return showCreate();
  return showTasks();
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", async () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  const response = await fetch("/api/whoami", { credentials: "same-origin" });
  if (response.ok) loggedIn((await response.json()).role);
  else showLogin();
});
