// queen-trio's operator dashboard. No build step, no dependencies.
// Every piece of data reaches the page through textContent / createTextNode (never parsed as HTML):
// queue names, timer keys, payloads and errors are user data.
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "queen-trio-token";
const API = "/api/v1";
const HISTORY = 150; // samples kept for the fire-lag chart and rates (5 min at 2 s)

const state = {
  samples: [], // {t, broker, lag: {le: cumulative}, lagCount, pushed, popped, acked}
  peek: null, // {queue, key, answer}
  notice: null, // {text, error}
  timer: null,
};

// -- DOM helpers ------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return node;
}

function table(headers, rows) {
  return el("div", { class: "table-wrap" },
    el("table", {},
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows.length
        ? rows.map((r) => el("tr", {}, r.map((c, i) => el("td", { "data-label": headers[i] }, c))))
        : el("tr", {}, el("td", { colspan: headers.length, class: "muted" }, "none")))));
}

// Stored bytes against the plan's gate ("over the gate" in words, not colour alone).
function storageText(st) {
  if (!st) return "—";
  const mb = (n) => (n < 1048576 ? `${(n / 1024).toFixed(1)} KiB`
                                   : `${(n / 1048576).toFixed(1)} MiB`);
  if (st.maxStoredBytes == null) return `${mb(st.usedBytes)} (no gate)`;
  const share = Math.round((100 * st.usedBytes) / st.maxStoredBytes);
  return `${mb(st.usedBytes)} of ${mb(st.maxStoredBytes)} (${share}%)` +
    (st.overGate ? " OVER THE GATE: writes refused" : "");
}

function card(label, value, cls) {
  return el("div", { class: "card" }, el("div", { class: "label" }, label),
    el("div", { class: "value " + (cls || "") }, value));
}

function word(ok, yes, no) {
  return el("span", { class: ok ? "ok" : "bad" }, ok ? yes : no);
}

function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  const secs = Math.round((d.getTime() - Date.now()) / 1000);
  const rel = Math.abs(secs) < 90 ? `${Math.abs(secs)} s`
    : Math.abs(secs) < 5400 ? `${Math.round(Math.abs(secs) / 60)} min`
      : `${(Math.abs(secs) / 3600).toFixed(1)} h`;
  return `${d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z")} (${secs >= 0 ? "in " + rel : rel + " ago"})`;
}

function json(value) {
  return el("pre", {}, JSON.stringify(value, null, 2));
}

// -- the API ----------------------------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path, options) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  // Relative URLs only: the token goes to this broker and nowhere else.
  const response = await fetch(path, { cache: "no-store", credentials: "omit", ...options, headers });
  if (response.status === 401) throw new Unauthorized();
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (e) { body = text; }
  return { status: response.status, body };
}

// -- this tenant's counters (GET /api/v1/stats): the fire-lag histogram, pushes, pops, acks ---

async function stats() {
  const answer = await api(`${API}/stats`);
  if (answer.status !== 200 || !answer.body) return null;
  const b = answer.body;
  return { broker: b.broker, lag: b.timerFireLag.buckets, lagCount: b.timerFireLag.count,
    pushed: b.pushed, popped: b.popped, acked: b.acked };
}

// Like PromQL's histogram_quantile: linear inside the bucket the rank falls in.
function quantile(q, buckets) {
  const bounds = Object.keys(buckets).map((le) => [le === "+Inf" ? Infinity : Number(le), buckets[le]])
    .sort((a, b) => a[0] - b[0]);
  if (!bounds.length) return null;
  const total = bounds[bounds.length - 1][1];
  if (!(total > 0)) return null;
  const rank = q * total;
  let prevBound = 0, prevCount = 0;
  for (const [bound, count] of bounds) {
    if (count >= rank) {
      if (bound === Infinity) return prevBound;
      const inBucket = count - prevCount;
      return inBucket > 0 ? prevBound + (bound - prevBound) * ((rank - prevCount) / inBucket) : bound;
    }
    prevBound = bound; prevCount = count;
  }
  return prevBound;
}

function delta(now, then) {
  const out = {};
  for (const le of Object.keys(now.lag)) out[le] = now.lag[le] - (then.lag[le] || 0);
  return out;
}

function record(sample) {
  // Counters of another broker (another worker, or a restart) do not subtract from these.
  const last = state.samples[state.samples.length - 1];
  if (last && last.broker !== sample.broker) state.samples = [];
  state.samples.push(sample);
  if (state.samples.length > HISTORY) state.samples.shift();
}

function lagSeries() {
  // p50/p99 of the fires in each 2 s step.
  const points = [];
  for (let i = 1; i < state.samples.length; i++) {
    const d = delta(state.samples[i], state.samples[i - 1]);
    points.push({ t: state.samples[i].t, p50: quantile(0.5, d), p99: quantile(0.99, d),
      fires: state.samples[i].lagCount - state.samples[i - 1].lagCount });
  }
  return points;
}

function rates() {
  const n = state.samples.length;
  if (n < 2) return null;
  const a = state.samples[Math.max(0, n - 6)], b = state.samples[n - 1];
  const secs = (b.t - a.t) / 1000;
  if (secs <= 0) return null;
  return { push: (b.pushed - a.pushed) / secs, pop: (b.popped - a.popped) / secs,
    ack: (b.acked - a.acked) / secs };
}

function seconds(v) {
  if (v === null || v === undefined) return "—";
  return v < 1 ? `${(v * 1000).toFixed(1)} ms` : `${v.toFixed(2)} s`;
}

function lagChart(points) {
  const W = 640, H = 160, P = 28;
  const chart = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": "timer fire lag p50 (solid) and p99 (dashed) over the last 5 minutes" });
  const values = points.flatMap((p) => [p.p50, p.p99]).filter((v) => v !== null);
  const max = Math.max(0.001, ...values);
  chart.append(svg("line", { class: "axis", x1: P, y1: H - P, x2: W - 4, y2: H - P }));
  chart.append(svg("line", { class: "axis", x1: P, y1: 4, x2: P, y2: H - P }));
  const top = svg("text", { x: 2, y: 12 }); top.textContent = seconds(max); chart.append(top);
  const zero = svg("text", { x: 2, y: H - P }); zero.textContent = "0"; chart.append(zero);
  const legend = svg("text", { x: P + 6, y: H - 8 });
  legend.textContent = "p50: solid line, filled dots; p99: dashed line, open dots; last 5 min, one point per 2 s with fires"; chart.append(legend);
  // x: time, the last HISTORY polls ending now; a dot per point, a line through them.
  const now = Date.now(), span = HISTORY * POLL_MS;
  const x = (t) => P + (W - P - 8) * Math.max(0, 1 - (now - t) / span);
  const y = (v) => H - P - (H - P - 8) * (v / max);
  for (const key of ["p50", "p99"]) {
    const coords = points.filter((p) => p[key] !== null)
      .map((p) => [x(p.t).toFixed(1), y(p[key]).toFixed(1)]);
    if (coords.length > 1) chart.append(svg("polyline", { class: key, points: coords.map((c) => c.join(",")).join(" ") }));
    for (const [cx, cy] of coords) chart.append(svg("circle", { class: key + " dot", cx, cy, r: 3 }));
  }
  return chart;
}

// -- pages ------------------------------------------------------------------------------------

async function overview() {
  const [health, ov, queues] = await Promise.all([
    fetch("/health", { cache: "no-store", credentials: "omit" }).then((r) => r.json()),
    api(`${API}/resources/overview`),
    api(`${API}/resources/queues`),
  ]);
  const details = await Promise.all((queues.body.queues || []).slice(0, 50).map(
    (q) => api(`${API}/resources/queues/${encodeURIComponent(q.name)}`)));
  let pending = 0, next = null;
  for (const d of details) {
    const t = (d.body && d.body.timers) || {};
    pending += t.pending || 0;
    if (t.nextDeliverAt && (!next || t.nextDeliverAt < next)) next = t.nextDeliverAt;
  }
  const o = ov.body || {};
  const messages = o.messages || {};
  const r = rates();
  const points = lagSeries();
  const last = [...points].reverse().find((p) => p.p50 !== null);
  const services = Object.entries(health.services || {});
  return [
    el("h2", {}, "Overview"),
    el("div", { class: "cards" },
      card("broker", health.ok ? "healthy" : "NOT healthy", health.ok ? "ok" : "bad"),
      card("database", health.database === "up" ? "up" : "DOWN", health.database === "up" ? "ok" : "bad"),
      card("schema version", health.schemaVersion ?? "—"),
      card("queues", o.queues ?? "—"),
      card("partitions", o.partitions ?? "—"),
      card("pending timers", pending),
      card("next timer due", next ? when(next) : "none"),
      card("messages pending", messages.pending ?? "—"),
      card("dead letters", messages.deadLetter ?? "—", messages.deadLetter ? "warn" : ""),
      card("storage used", storageText(o.storage), o.storage && o.storage.overGate ? "bad" : ""),
      card("push / s", r ? r.push.toFixed(1) : "…"),
      card("pop / s", r ? r.pop.toFixed(1) : "…"),
      card("ack / s", r ? r.ack.toFixed(1) : "…")),
    el("h3", {}, "Services"),
    table(["service", "state"], services.map(([name, s]) => [name, word(s === "up", "up", "DOWN")])),
    el("h3", {}, "Timer fire lag (fire commit minus due instant)"),
    el("p", {}, last ? `latest: p50 ${seconds(last.p50)}, p99 ${seconds(last.p99)} over ${last.fires} fires`
      : "no timer fired since this page opened"),
    lagChart(points),
    table(["time", "fires", "p50", "p99"], [...points].reverse().filter((p) => p.fires > 0).slice(0, 10)
      .map((p) => [new Date(p.t).toLocaleTimeString(), p.fires, seconds(p.p50), seconds(p.p99)])),
  ];
}

async function queueList() {
  const [queues, groups] = await Promise.all([api(`${API}/resources/queues`), api(`${API}/consumer-groups`)]);
  const list = queues.body.queues || [];
  // Pending timers are counted per queue by its detail (as on the overview: first 50 queues).
  const details = await Promise.all(list.slice(0, 50).map(
    (q) => api(`${API}/resources/queues/${encodeURIComponent(q.name)}`)));
  const known = Object.fromEntries(details.filter((d) => d.status === 200).map((d) => [d.body.name, d.body]));
  return [
    el("h2", {}, "Queues"),
    el("p", { class: "muted" }, "pending: not yet done by the slowest consumer group (all of them while nobody consumed); total: retained, consumed or not"),
    table(["queue", "partitions", "pending messages", "total messages", "pending timers", "delayedProcessing", "links"], list.map((q) => [
      el("a", { href: "#/queue/" + encodeURIComponent(q.name) }, q.name),
      q.partitions, known[q.name] ? backlog(known[q.name]).pending : (q.messages || {}).pending ?? "—",
      (q.messages || {}).total ?? "—", known[q.name] ? (known[q.name].timers || {}).pending ?? 0 : "—", `${q.options.delayedProcessing ?? 0} s`,
      el("a", { href: "#/timers/" + encodeURIComponent(q.name) }, "timers")])),
    el("h3", {}, "Consumer groups"),
    (groups.body || []).length ? null
      : el("p", { class: "muted", id: "no-groups" }, "No consumer group has read these queues yet: a group shows here from its first pop."),
    table(["group", "queue", "lag (messages)", "lag (seconds)", "state"], (groups.body || []).map((g) => [
      g.name, g.queueName, g.totalLag, g.maxTimeLag, g.state])),
  ];
}

async function queuePage(name) {
  const d = await api(`${API}/resources/queues/${encodeURIComponent(name)}`);
  if (d.status !== 200) return [el("h2", {}, "Queue ", el("code", {}, name)), problem(d)];
  const q = d.body;
  const { pending, rows: groupRows } = backlog(q);
  const t = q.timers || {};
  return [
    el("h2", {}, "Queue ", el("code", {}, q.name)),
    el("p", {}, el("a", { href: "#/timers/" + encodeURIComponent(q.name) }, `Timers (${t.pending ?? 0} pending)`),
      " · ", el("a", { href: "#/dlq?queue=" + encodeURIComponent(q.name) }, `Dead letters (${(q.totals || {}).deadLetters ?? 0})`)),
    el("div", { class: "cards" },
      card("pending messages", pending),
      card("total messages (consumed or not)", (q.totals || {}).messages ?? "—"),
      card("pending timers", t.pending ?? 0),
      card("next timer due", t.nextDeliverAt ? when(t.nextDeliverAt) : "none"),
      card("delayedProcessing", `${(q.options || {}).delayedProcessing ?? 0} s`)),
    el("h3", {}, "Partitions"),
    table(["partition", "logStart", "nextOffset", "retained messages", "head (frames / bytes)", "segments (count / frames / bytes)"],
      (q.partitions || []).map((p) => [p.name, p.logStart, p.nextOffset, p.messages,
        `${p.storage.headFrames} / ${p.storage.headBytes} B`,
        `${p.storage.segments} / ${p.storage.segmentFrames} / ${p.storage.compressedBytes} B`])),
    el("h3", {}, "Consumer groups"),
    table(["group", "partition", "committed", "lag (messages)", "lease"], groupRows),
    el("h3", {}, "Options"),
    table(["option", "value"], Object.entries(q.options || {}).map(([k, v]) => [k, JSON.stringify(v)])),
  ];
}

// A queue's detail → its pending messages (not yet done by the slowest group) and one row per
// (group, partition). A group that has read the queue lags on every partition, also those it
// has not read yet (as GET /consumer-groups counts them); with no group, all are pending.
function backlog(q) {
  const known = q.consumerGroups || [];
  const rows = [];
  let pending = 0;
  for (const p of q.partitions || []) {
    let slowest = known.length ? 0 : p.messages;
    for (const group of known) {
      const c = (p.groups || {})[group];
      const lag = c ? c.lag : p.messages;
      slowest = Math.max(slowest, lag);
      rows.push([group, p.name, committed(c ? c.committed : -1), lag, c && c.leased ? "leased" : "not leased"]);
    }
    pending += slowest;
  }
  return { pending, rows };
}

// A cursor's last offset done; -1 (or below the log) means nothing committed yet.
function committed(offset) {
  return offset === null || offset === undefined || offset < 0 ? "none" : offset;
}

function problem(answer) {
  const b = answer.body || {};
  return el("div", { class: "notice error", role: "alert" },
    `Error ${answer.status}: ${b.error || ""} ${b.message || (typeof b === "string" ? b : "")}`);
}

function notice() {
  if (!state.notice) return null;
  return el("div", { class: "notice" + (state.notice.error ? " error" : ""), role: "status", id: "notice" },
    state.notice.text);
}

async function timersPage(queue) {
  const list = await api(`${API}/timers/${encodeURIComponent(queue)}?limit=500`);
  if (list.status !== 200) return [el("h2", {}, "Timers of ", el("code", {}, queue)), problem(list)];
  const timers = [...(list.body.rows || [])].sort((a, b) => (a.deliverAt < b.deliverAt ? -1 : 1));
  const peek = state.peek && state.peek.queue === queue ? state.peek : null;
  return [
    el("h2", {}, "Timers of ", el("a", { href: "#/queue/" + encodeURIComponent(queue) }, queue)),
    notice(),
    el("p", { class: "muted" }, `${timers.length} pending, soonest first${list.body.truncated ? " (first 500 only)" : ""}`),
    table(["due", "key", "state", "attempts", "last error", "actions"], timers.map((t) => [
      when(t.deliverAt), el("code", { class: "timer-key" }, t.timerKey), t.claimed ? "claimed" : "pending",
      t.attempts, t.lastError ?? "—",
      el("span", {},
        el("button", { type: "button", "data-action": "peek", onclick: () => peekTimer(queue, t.timerKey) }, "Peek"), " ",
        el("button", { type: "button", class: "danger", "data-action": "cancel", onclick: () => cancelTimer(queue, t.timerKey) }, "Cancel")),
    ])),
    peek ? el("section", { id: "peek" }, el("h3", {}, "Payload of ", el("code", {}, peek.key)),
      peek.answer.status !== 200 ? problem(peek.answer)
        : peek.answer.body.found ? json(peek.answer.body.data)
        : el("p", { class: "muted" }, "no longer pending (already fired, or cancelled)")) : null,
  ];
}

async function peekTimer(queue, key) {
  state.peek = { queue, key, answer: await api(`${API}/timers/${encodeURIComponent(queue)}/${encodeURIComponent(key)}`) };
  refresh();
}

const CANCEL_WORDS = {
  cancelled: "cancelled: it will not fire",
  absent: "absent: there was no such pending timer (already cancelled, or never scheduled)",
  too_late: "too late: it had already fired or was firing; its message is in the queue",
};

async function cancelTimer(queue, key) {
  if (!window.confirm(`Cancel timer "${key}" on queue "${queue}"? It will not fire.`)) return;
  const answer = await api(`${API}/timers/${encodeURIComponent(queue)}/${encodeURIComponent(key)}`, { method: "DELETE" });
  const status = answer.body && answer.body.status;
  state.notice = { text: `Timer "${key}": ${CANCEL_WORDS[status] || `error ${answer.status} ${JSON.stringify(answer.body)}`}`,
    error: !CANCEL_WORDS[status] };
  refresh();
}

async function dlqPage(params) {
  const query = new URLSearchParams({ limit: "200" });
  if (params.get("queue")) query.set("queue", params.get("queue"));
  const page = await api(`${API}/dlq?${query}`);
  if (page.status !== 200) return [el("h2", {}, "Dead letters"), problem(page)];
  const rows = page.body.messages || [];
  return [
    el("h2", {}, "Dead letters", params.get("queue") ? [" of ", el("code", {}, params.get("queue"))] : ""),
    notice(),
    el("p", { class: "muted" }, `${page.body.total} in all, oldest first; showing ${rows.length}`),
    table(["id", "queue / partition", "group", "failed", "retries", "error", "payload", "replay"], rows.map((d) => [
      d.id, `${d.queue} / ${d.partition}`, d.consumerGroup, when(d.failedAt), d.retryCount, d.errorMessage ?? "—",
      json(d.data),
      d.consumerGroup === "__timer__"
        ? el("span", { class: "muted" }, "a timer that could not be fired: not replayable (schedule it again)")
        : d.replayedAt ? el("span", { class: "ok" }, "replayed " + when(d.replayedAt))
          : el("button", { type: "button", "data-action": "replay", onclick: () => replay(d) }, "Replay"),
    ])),
  ];
}

async function replay(d) {
  if (!window.confirm(`Replay dead letter ${d.id} into queue "${d.queue}"?`)) return;
  const answer = await api(`${API}/dlq/${encodeURIComponent(d.id)}/replay`, { method: "POST" });
  state.notice = answer.status === 200
    ? { text: `Dead letter ${d.id} replayed as message ${answer.body.transactionId}`, error: false }
    : { text: `Dead letter ${d.id} not replayed: ${answer.status} ${(answer.body || {}).error || ""} ${(answer.body || {}).message || ""}`, error: true };
  refresh();
}

function tokenForm(again) {
  const input = el("input", { type: "password", id: "token", autocomplete: "off", "aria-label": "token",
    placeholder: "bearer token" });
  return [
    el("h2", {}, "Token needed"),
    el("p", {}, again ? "That token was refused. " : "",
      "This broker runs with QUEEN_AUTH=on. Type a tenant's token: it stays in this tab ",
      "(sessionStorage) and is sent only to this broker."),
    el("form", { class: "token", id: "token-form", onsubmit: (e) => {
      e.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      document.getElementById("main").replaceChildren();
      refresh();
    } }, input, el("button", { type: "submit" }, "Use token")),
  ];
}

// -- routing and polling ----------------------------------------------------------------------

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, search] = hash.split("?");
  const parts = path.split("/");
  return { page: parts[0] || "overview", arg: parts.slice(1).join("/"), params: new URLSearchParams(search || "") };
}

let lastRoute = "";

async function refresh() {
  const r = route();
  const routeKey = location.hash;
  if (routeKey !== lastRoute) { state.notice = null; state.peek = null; lastRoute = routeKey; }
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("current", a.id === "nav-" + (r.page === "queue" || r.page === "timers" ? "queues" : r.page));
  }
  const main = document.getElementById("main");
  const status = document.getElementById("status");
  document.getElementById("forget-token").hidden = !sessionStorage.getItem(TOKEN_KEY);
  try {
    const sample = await stats();
    if (sample) record({ t: Date.now(), ...sample });
    let content;
    if (r.page === "queues") content = await queueList();
    else if (r.page === "queue") content = await queuePage(decodeURIComponent(r.arg));
    else if (r.page === "timers") content = await timersPage(decodeURIComponent(r.arg));
    else if (r.page === "dlq") content = await dlqPage(r.params);
    else content = await overview();
    main.replaceChildren(...content.flat().filter(Boolean));
    status.textContent = "live";
    status.className = "status ok";
    document.getElementById("updated").textContent = "Last update " + new Date().toLocaleTimeString() + ".";
  } catch (e) {
    if (e instanceof Unauthorized) {
      if (!document.getElementById("token-form")) main.replaceChildren(...tokenForm(!!sessionStorage.getItem(TOKEN_KEY)));
      status.textContent = "token needed";
      status.className = "status warn";
    } else {
      status.textContent = "broker unreachable (retrying)";
      status.className = "status bad";
    }
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("forget-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    refresh();
  });
  window.addEventListener("hashchange", refresh);
  refresh();
  // A poll is skipped while the previous one is still waiting on a slow broker.
  let polling = null;
  state.timer = setInterval(() => {
    if (!polling) polling = refresh().finally(() => { polling = null; });
  }, POLL_MS);
});
