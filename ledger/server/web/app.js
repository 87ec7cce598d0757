// gpu-ledger dashboard: hand-written, no dependencies. Each page asks /ui/api/* with the bearer
// token kept in localStorage and redraws every few seconds. Times in the viewer's time zone.
"use strict";

const TOKEN_KEY = "gpuledger.token";
const PAGE = document.body.dataset.page;
const POLL_MS = { teams: 30000, queue: 5000, finished: 15000, job: 5000, nodes: 5000, decisions: 5000, preemptions: 30000, budget: 30000 };
const SVGNS = "http://www.w3.org/2000/svg";

// --- small helpers --------------------------------------------------------------------------

function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "on") for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}

function svg(tag, attrs, ...kids) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}

// Times and durations (when, timeEl, localised, dur, clock, ticking, serverNow): times.js.

function num(x, digits) {
  if (x === null || x === undefined) return "—";
  return Number(x).toFixed(digits === undefined ? 2 : digits);
}

function pct(x) {
  return x === null || x === undefined ? "—" : `${(100 * x).toFixed(1)}%`;
}

function colour(key) {
  let h = 0;
  for (const c of String(key)) h = (h * 31 + c.charCodeAt(0)) % 997;
  return `hsl(${Math.round(h * 137.508) % 360}, 55%, 42%)`;
}

function table(head, rows, attrs) {
  return el("table", attrs || {},
    el("thead", {}, el("tr", {}, head.map((h) =>
      el("th", { class: /^[#]|GPU|Shares|Usage|LevelFS|FairShare|owed|delivered|burst|by |\bcount|placed|preempted|considered/i.test(h) ? "num" : null }, h)))),
    el("tbody", {}, rows));
}

function td(value, attrs) {
  return el("td", attrs || {}, value);
}

function status(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = bad ? "err" : "";
}

// --- the token and the API ------------------------------------------------------------------

function token() {
  return localStorage.getItem(TOKEN_KEY);
}

// A read refused 429 is asked again after the Retry-After the server gives (at most 5 s, with
// jitter), twice: a person's reads are 2 at once (docs/security.md, row T5), and her own tabs
// refreshing together were refused each other's turn ("could not update", atk39-25 F3).
const RETRIES_429 = 2;

async function api(path, retries = RETRIES_429) {
  const resp = await fetch(path, { headers: { Authorization: `Bearer ${token()}` } });
  if (resp.status === 429 && retries > 0) {
    const wait = Math.min(5, Number(resp.headers.get("Retry-After")) || 1);
    await new Promise((done) => setTimeout(done, wait * 1000 * (0.5 + Math.random())));
    return api(path, retries - 1);
  }
  if (resp.status === 401) {
    localStorage.removeItem(TOKEN_KEY);
    location.assign(`/ui/login?next=${encodeURIComponent(location.pathname + location.search)}`);
    throw new Error("signed out");
  }
  heardFrom(resp.headers.get("Date"));
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.detail || `${resp.status}`);
  return body;
}


function main(...kids) {
  const m = document.getElementById("main");
  m.replaceChildren(...kids.filter((k) => k !== null && k !== undefined && k !== false));
}

// --- login ----------------------------------------------------------------------------------

function loginPage() {
  const area = el("textarea", { id: "token", placeholder: "glt_…", autocomplete: "off" });
  const err = el("p", { class: "err", id: "login-error" });
  const form = el("form", { class: "login", on: { submit: async (ev) => {
    ev.preventDefault();
    const secret = area.value.trim();
    const resp = await fetch("/v1/whoami", { headers: { Authorization: `Bearer ${secret}` } });
    if (!resp.ok) {
      err.textContent = "This token is not accepted (expired, revoked or mistyped).";
      return;
    }
    localStorage.setItem(TOKEN_KEY, secret);
    const next = new URLSearchParams(location.search).get("next") || "/ui/teams";
    location.assign(next.startsWith("/ui/") ? next : "/ui/teams");
  } } },
  el("h1", {}, "Sign in"),
  el("p", {}, "Paste a token (", el("code", {}, "gpuledger token create"), "). It stays in this browser until you sign out."),
  area, el("p", {}, el("button", { type: "submit", id: "signin" }, "Sign in")), err);
  main(form);
}

// --- teams ----------------------------------------------------------------------------------

function teamChart(series, start, end) {
  const W = 300, H = 110, L = 34, B = 16;
  const pts = series.points;
  const top = Math.max(1e-9, ...pts.map((p) => Math.max(p.owed_gpu_hours, p.delivered_gpu_hours)));
  const x = (t) => L + ((t - start) / Math.max(1, end - start)) * (W - L - 4);
  const y = (v) => H - B - (v / top) * (H - B - 6);
  const line = (key) => pts.map((p, i) => `${i ? "L" : "M"}${x(p.at).toFixed(1)},${y(p[key]).toFixed(1)}`).join("");
  const burst = pts.filter((p) => p.delivered_gpu_hours > p.owed_gpu_hours).map((p) =>
    svg("rect", { x: x(p.at), y: y(p.delivered_gpu_hours), width: Math.max(1, x(p.at + 3600) - x(p.at)),
                  height: Math.max(0.5, y(p.owed_gpu_hours) - y(p.delivered_gpu_hours)),
                  fill: "var(--burst)", opacity: 0.6 }));
  return svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "data-team": series.team },
    svg("line", { x1: L, y1: H - B, x2: W, y2: H - B, stroke: "#ccd" }),
    svg("text", { x: 2, y: 10 }, num(top, 1)),
    svg("text", { x: 2, y: H - B }, "0"),
    svg("text", { x: L, y: H - 3 }, when(start, SHORT)),
    svg("text", { x: W - 4, y: H - 3, "text-anchor": "end" }, when(end, SHORT)),
    burst,
    svg("path", { d: line("owed_gpu_hours"), fill: "none", stroke: "var(--owed)", "stroke-dasharray": "4 3", "stroke-width": 1.5 }),
    svg("path", { d: line("delivered_gpu_hours"), fill: "none", stroke: "var(--delivered)", "stroke-width": 1.8 }));
}

const teamsState = { window: "7d" };

async function teamsPage() {
  const data = await api(`/ui/api/teams?window=${teamsState.window}`);
  const d = data.delivered;
  const toggle = el("div", { class: "filters" },
    ["7d", "all"].map((w) => el("button", { type: "button", id: `window-${w}`, disabled: w === data.window,
      on: { click: () => { teamsState.window = w; refresh(); } } }, w === "7d" ? "Last 7 days" : "Whole period")),
    el("span", { class: "muted", id: "teams-range" }, timeEl(d.start_at), " – ", timeEl(d.end_at)));
  const legend = el("p", { class: "legend" },
    el("span", {}, el("i", { class: "sw", style: "background:var(--owed)" }), "owed (allocation × capacity, capped by demand)"),
    el("span", {}, el("i", { class: "sw", style: "background:var(--delivered)" }), "delivered"),
    el("span", {}, el("i", { class: "sw", style: "background:var(--burst);height:8px" }), "burst (delivered above owed)"));
  const charts = el("div", { class: "grid", id: "team-charts" }, data.series.teams.map((s) =>
    el("div", { class: "card" }, el("h3", {}, s.team), teamChart(s, data.series.start_at, data.series.end_at))));
  const summary = table(["team", "owed GPU-h", "delivered GPU-h", "burst GPU-h", "by period", "hour by hour"],
    d.teams.map((t) => el("tr", { "data-team": t.team },
      td(t.team), td(num(t.owed_gpu_hours, 1), { class: "num", "data-col": "owed" }),
      td(num(t.delivered_gpu_hours, 1), { class: "num", "data-col": "delivered" }),
      td(num(Math.max(0, t.delivered_gpu_hours - t.owed_gpu_hours), 1), { class: "num" }),
      td(pct(t.by_period), { class: "num" }), td(pct(t.hour_by_hour), { class: "num" }))),
    { id: "delivered", "data-start": d.start_at, "data-end": d.end_at });
  const tree = table(["account", "kind", "RawShares", "NormShares", "RawUsage GPU-h", "EffectvUsage", "LevelFS", "FairShare"],
    data.shares.map((r) => el("tr", { "data-account": r.account },
      td(`${"\u00a0\u00a0".repeat(r.depth)}${r.account.split("/").pop()}`, { title: r.account }),
      td(r.kind), td(r.raw_shares, { class: "num" }),
      td(num(r.norm_shares, 4), { class: "num", "data-col": "norm_shares" }),
      td(num(r.raw_usage_gpu_s / 3600, 1), { class: "num", "data-col": "usage" }),
      td(num(r.effectv_usage, 4), { class: "num" }),
      td(r.level_fs_infinite ? "∞" : num(r.level_fs, 4), { class: "num", "data-col": "level_fs" }),
      td(num(r.fair_share, 4), { class: "num", "data-col": "fair_share" }))),
    { id: "shares", "data-at": data.at });
  main(el("h1", {}, "Teams: owed against delivered"), toggle, legend, charts,
    el("h2", {}, `Totals: ${pct(d.by_period)} by period, ${pct(d.hour_by_hour)} hour by hour; ${d.teams_at_95}/${d.teams_owed} teams at ≥ 95%`),
    summary, el("h2", {}, "Budget tree (fair share over the last 7 days)"), tree);
}

// --- queue ----------------------------------------------------------------------------------

const queueState = { user: "", account: "", state: "queued", reason: "", mine: false,
  sort: "order", descending: false, offset: 0, limit: 100 };
const QUEUE_COLUMNS = [  // [heading, sort column or null, width]
  ["#", "order", "4.5em"], ["job", "job", "5em"], ["user", "user", "6.5em"], ["account", "account", "10.5em"],
  ["GPUs", "gpus", "4.5em"], ["state", "state", "5.5em"], ["code", "code", "10em"], ["reason", null, "auto"],
  ["sort key", null, "8em"], ["submitted", "submitted", "8.5em"], ["waiting", null, "5.5em"],
  ["est. start", null, "8.5em"],
];

const RUNNING_COLUMNS = [  // the running view (state=running), like squeue -t R: TIME, TIME_LIMIT, TIME_LEFT
  ["job", "job", "5em"], ["user", "user", "6.5em"], ["account", "account", "10.5em"], ["GPUs", "gpus", "4.5em"],
  ["state", "state", "5.5em"], ["nodes", null, "auto"], ["submitted", "submitted", "8.5em"], ["waited", null, "5.5em"],
  ["started", null, "8.5em"], ["elapsed", null, "7em"], ["time limit", null, "7em"], ["remaining", null, "7em"],
];

// a stopping job (past its time limit, or stopped by the ledger, in its grace): its SIGKILL
// at the latest beside its state, as every read shows it (ledger/reads/stopping.py)
function stateCell(state, killAt) {
  return killAt === null || killAt === undefined ? state
    : el("span", { class: "stopping", "data-kill-at": killAt }, `${state} · SIGKILL by `, timeEl(killAt));
}

// an account cut in its middle, both ends shown (sibling accounts differ at their end: cut at
// the end, prog1/segmentation-large and -small both read "prog1/segm…", atk49-29 F3); whole on hover
function squeezed(s, most = 16) {
  if (s.length <= most) return s;
  const head = Math.min(s.indexOf("/") + 1 || 4, Math.floor(most / 2));
  return `${s.slice(0, head)}…${s.slice(s.length - (most - head - 1))}`;
}

function queueCells(r, parts, running) {
  if (running) {
    return [td(el("a", { href: `/ui/job?id=${r.job_id}` }, r.job_id)), td(r.user, { title: r.user }),
      td(squeezed(r.account), { title: r.account, "data-col": "account" }), td(r.gpus, { class: "num" }), td(stateCell(r.state, r.kill_at)),
      td(r.nodes.join(", ") || "—", { class: "wrap" }), td(timeEl(r.submitted_at)), td(dur(r.waiting_s)),
      td(timeEl(r.started_at)), td(ticking("elapsed", r.started_at), { "data-col": "elapsed" }),
      td(r.time_limit_s === null ? "none" : clock(r.time_limit_s)),
      td(ticking("remaining", r.started_at, r.time_limit_s), { "data-col": "remaining" })];
  }
  // a job holding GPUs in the queued views: where it runs and for how long, in its reason
  const holding = r.state === "running" || r.state === "placed" || r.state === "stopping";
  const reason = holding
    ? [`${r.state} on ${r.nodes.join(", ") || "—"}`, r.started_at === null ? "" : " · elapsed ",
      r.started_at === null ? "" : ticking("elapsed", r.started_at),
      r.time_limit_s === null || r.started_at === null ? "" : " · left ",
      r.time_limit_s === null || r.started_at === null ? "" : ticking("remaining", r.started_at, r.time_limit_s)]
    : localised(r.reason);
  // its position whole at every width (4.5em: "9…" for every position from 1,000 on: atk49-29 F2)
  return [td(r.order === null ? "—" : r.order, { class: "num", "data-col": "order", title: r.order === null ? null : `#${r.order} in dispatch order` }),
    td(el("a", { href: `/ui/job?id=${r.job_id}` }, r.job_id)), td(r.user, { title: r.user }),
    td(squeezed(r.account), { title: r.account, "data-col": "account" }), td(r.gpus, { class: "num" }), td(stateCell(r.state, r.kill_at)),
    td(r.code, { "data-col": "code", title: r.code }), td(reason, { class: "wrap", "data-col": "reason" }),
    td(parts.map(keyPart), { class: "wrap" }),
    td(timeEl(r.submitted_at)), td(dur(r.waiting_s)), td(timeEl(r.estimated_start_at))];
}

function queueFilters() {
  const again = () => { queueState.offset = 0; refresh(); };
  const input = (name, ph) => el("input", { id: `f-${name}`, placeholder: ph, value: queueState[name],
    on: { change: (ev) => { queueState[name] = ev.target.value.trim(); again(); } } });
  const sel = el("select", { id: "f-state", on: { change: (ev) => { queueState.state = ev.target.value; again(); } } },
    [["queued", "queued (pending and held)"], ["pending", "pending"], ["held", "held"], ["running", "running"],
     ["all", "all (queued and running)"]].map(([s, t]) => el("option", { value: s, selected: s === queueState.state }, t)));
  const reason = el("select", { id: "f-reason", on: { change: (ev) => { queueState.reason = ev.target.value; again(); } } },
    el("option", { value: "" }, "any reason"));
  const mine = el("input", { type: "checkbox", id: "f-mine", checked: queueState.mine,
    on: { change: (ev) => { queueState.mine = ev.target.checked; again(); } } });
  return el("div", { class: "filters" }, input("user", "user"), input("account", "account (and below)"), sel,
    reason, el("label", {}, mine, " my jobs"));
}

function reasonChoices(codes) {
  const sel = document.getElementById("f-reason");
  const known = Object.keys(codes).sort();
  if (queueState.reason && !known.includes(queueState.reason)) known.push(queueState.reason);
  sel.replaceChildren(el("option", { value: "" }, "any reason"),
    ...known.map((c) => el("option", { value: c, selected: c === queueState.reason }, `${c} (${codes[c] || 0})`)));
}

function pager(total, offset, limit, state = queueState, what = "jobs") {
  const last = Math.max(0, Math.floor((total - 1) / limit) * limit);
  const go = (to) => () => { state.offset = Math.min(last, Math.max(0, to)); refresh(); };
  const b = (id, text, to, off) => el("button", { type: "button", id, disabled: off, on: { click: go(to) } }, text);
  const shown = total ? `${(offset + 1).toLocaleString()}–${Math.min(total, offset + limit).toLocaleString()}` : "0";
  return el("div", { class: "filters pager" },
    b("page-first", "« first", 0, offset === 0), b("page-prev", "‹ previous", offset - limit, offset === 0),
    el("span", { id: "queue-range", "data-total": total, "data-offset": offset }, `${shown} of ${total.toLocaleString()} ${what}`),
    b("page-next", "next ›", offset + limit, offset + limit >= total), b("page-last", "last »", last, offset + limit >= total));
}

function keyPart(p, i) {
  // compact: the values in key order, each part's name and meaning on hover
  const value = typeof p.value === "number" && /_at$/.test(p.name) ? timeEl(p.value)
    : typeof p.value === "number" ? `${+p.value.toFixed(4)}` : p.value;
  return el("span", { class: "part", title: `${p.name}: ${p.meaning}` }, i ? " · " : "", value);
}

// The queue page's state lives in its URL (page, sort, filters): a view reloads, bookmarks and shares.
const QUEUE_DEFAULTS = { ...queueState };

function queueFromUrl() {
  const q = new URLSearchParams(location.search);
  for (const k of ["user", "account", "state", "reason", "sort"]) if (q.has(k)) queueState[k] = q.get(k);
  if (q.has("descending")) queueState.descending = q.get("descending") === "true";
  if (q.has("mine")) queueState.mine = q.get("mine") === "true";
  for (const k of ["offset", "limit"]) {
    const n = Number(q.get(k));
    if (q.has(k) && Number.isInteger(n) && n >= (k === "limit" ? 1 : 0) && n <= (k === "limit" ? 1000 : 1e9)) queueState[k] = n;
  }
}

function queueToUrl() {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(queueState)) if (v !== QUEUE_DEFAULTS[k]) q.set(k, String(v));
  toUrl(q);
}

function toUrl(q) {  // a page's state in its URL, replaced (no history entry per change)
  const url = `${location.pathname}${q.size ? "?" + q : ""}`;
  if (url !== location.pathname + location.search) history.replaceState(null, "", url);
}

async function queuePage(first) {
  if (first) queueFromUrl();
  if (first) document.getElementById("main").replaceChildren(el("h1", {}, "Queue in dispatch order"), queueFilters(), el("div", { id: "queue-body" }));
  const q = new URLSearchParams({ state: queueState.state, sort: queueState.sort, descending: queueState.descending,
    offset: queueState.offset, limit: queueState.limit });
  const user = queueState.mine ? ME.actor : queueState.user;
  if (user) q.set("user", user);
  if (queueState.account) q.set("account", queueState.account);
  if (queueState.reason) q.set("reason", queueState.reason);
  const page = await api(`/ui/api/queue?${q}`);
  if (page.total && page.offset >= page.total) {  // the queue shrank under this page
    queueState.offset = Math.max(0, Math.floor((page.total - 1) / queueState.limit) * queueState.limit);
    return queuePage(false);
  }
  queueToUrl();
  reasonChoices(page.codes);
  const running = queueState.state === "running";
  const columns = running ? RUNNING_COLUMNS : QUEUE_COLUMNS;
  const head = el("tr", {}, columns.map(([h, col]) => {
    const on = col && queueState.sort === col;
    const arrow = on ? (queueState.descending ? " ▼" : " ▲") : "";
    return el("th", { class: /^(#|GPUs)$/.test(h) ? "num" : null, "data-sort": col,
      "aria-sort": on ? (queueState.descending ? "descending" : "ascending") : null,
      on: col ? { click: () => {
        queueState.descending = on ? !queueState.descending : false;
        queueState.sort = col; queueState.offset = 0; refresh();
      } } : null }, h + arrow);
  }));
  const body = el("table", { id: "queue", class: "fixed", "data-view": running ? "running" : "queued" },
    el("colgroup", {}, columns.map(([, , w]) => el("col", { style: w === "auto" ? null : `width:${w}` }))),
    el("thead", {}, head),
    el("tbody", {}, page.rows.map(({ row: r, parts }) => el("tr", { "data-job": r.job_id }, queueCells(r, parts, running)))));
  document.getElementById("queue-body").replaceChildren(pager(page.total, page.offset, page.limit), body);
}

// --- finished jobs (like sacct) ------------------------------------------------------------

const finishedState = { user: "", account: "", reason: "", mine: false, offset: 0, limit: 100 };
const FINISH_REASONS = ["completed", "failed", "cancelled", "time_limit", "preempted", "node_lost",
  "dependency_never_satisfied", "launch_failed"];

function finishedFilters() {
  const again = () => { finishedState.offset = 0; refresh(); };
  const input = (name, ph) => el("input", { id: `f-${name}`, placeholder: ph, value: finishedState[name],
    on: { change: (ev) => { finishedState[name] = ev.target.value.trim(); again(); } } });
  const reason = el("select", { id: "f-reason", on: { change: (ev) => { finishedState.reason = ev.target.value; again(); } } },
    el("option", { value: "" }, "any end"),
    FINISH_REASONS.map((r) => el("option", { value: r, selected: r === finishedState.reason }, r)));
  const mine = el("input", { type: "checkbox", id: "f-mine", checked: finishedState.mine,
    on: { change: (ev) => { finishedState.mine = ev.target.checked; again(); } } });
  return el("div", { class: "filters" }, input("user", "user"), input("account", "account (and below)"), reason,
    el("label", {}, mine, " my jobs"));
}

async function finishedPage(first) {
  if (first) {
    const q = new URLSearchParams(location.search);
    for (const k of ["user", "account", "reason"]) if (q.has(k)) finishedState[k] = q.get(k);
    const n = Number(q.get("limit"));
    if (q.has("limit") && Number.isInteger(n) && n >= 1 && n <= 1000) finishedState.limit = n;
    document.getElementById("main").replaceChildren(el("h1", {}, "Finished jobs, newest first"),
      finishedFilters(), el("div", { id: "finished-body" }));
  }
  const q = new URLSearchParams({ offset: finishedState.offset, limit: finishedState.limit });
  const user = finishedState.mine ? ME.actor : finishedState.user;
  if (user) q.set("user", user);
  if (finishedState.account) q.set("account", finishedState.account);
  if (finishedState.reason) q.set("reason", finishedState.reason);
  const page = await api(`/ui/api/finished?${q}`);
  const body = table(["job", "user", "account", "GPUs", "end", "exit", "submitted", "started", "ended", "elapsed", "nodes"],
    page.rows.map((j) => el("tr", { "data-job": j.job_id },
      td(el("a", { href: `/ui/job?id=${j.job_id}` }, j.job_id)), td(j.user), td(j.account, { title: j.account }),
      td(j.gpus, { class: "num" }), td(j.finish_reason || j.outcome || "—", { "data-col": "reason" }),
      td(j.exit_code === null ? "—" : j.exit_code, { class: "num" }), td(timeEl(j.submitted_at)),
      td(timeEl(j.started_at)), td(timeEl(j.finished_at)), td(dur(j.elapsed_s), { "data-col": "elapsed" }),
      td(j.nodes.join(", ") || "—", { class: "wrap" }))),
    { id: "finished" });
  document.getElementById("finished-body").replaceChildren(
    pager(page.total, page.offset, page.limit, finishedState, "finished jobs"), body);
}

// --- job ------------------------------------------------------------------------------------

function timeline(history) {
  if (!history.length) return el("p", { class: "muted" }, "no events");
  const W = 900, t0 = history[0].at, t1 = Math.max(t0 + 1, history[history.length - 1].at);
  const x = (t) => 10 + ((t - t0) / (t1 - t0)) * (W - 20);
  // each label on the first row where it overlaps no other label (6 px a character, a gap)
  const ends = [];
  const marks = history.map((h) => {
    const label = h.tag.split(".")[1] || h.tag, cx = x(h.at), w = 6 * label.length + 8;
    const anchor = cx < 60 ? "start" : cx > W - 60 ? "end" : "middle";
    const left = anchor === "start" ? cx : anchor === "end" ? cx - w : cx - w / 2;
    let row = ends.findIndex((e) => e <= left);
    if (row < 0) { row = ends.length; ends.push(0); }
    ends[row] = left + w;
    return { h, label, cx, anchor, row };
  });
  const H = 40 + 12 * ends.length;
  return svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", id: "timeline" },
    svg("line", { x1: 10, y1: 20, x2: W - 10, y2: 20, stroke: "#ccd" }),
    marks.map(({ h, label, cx, anchor, row }) => svg("g", {},
      svg("circle", { cx, cy: 20, r: 5, fill: colour(h.tag) }, svg("title", {}, `${when(h.at)} ${h.tag}: ${localisedText(h.text)}`)),
      svg("text", { x: cx, y: 36 + 12 * row, "text-anchor": anchor, "data-row": row }, label))));
}

let replayed = null, replayedFor = null, replayedTop = 0;

async function jobPage() {
  const id = new URLSearchParams(location.search).get("id");
  if (!id || !/^\d+$/.test(id)) {
    main(el("h1", {}, "Job"), el("p", {}, "Open a job from the queue."));
    return;
  }
  const data = await api(`/ui/api/job/${id}`);
  const j = data.job, x = data.explain;
  const facts = table(["field", "value"], [
    ["status", j.kill_at === null ? j.status + (j.outcome ? ` (${j.outcome})` : "") : stateCell(j.status, j.kill_at)],
    ["user", j.user], ["account", j.account],
    ["GPUs", `${j.gpus}${j.gpu_type ? " × " + j.gpu_type : ""}`], ["nodes", j.nodes.join(", ") || "—"],
    ["funded", j.funded], ["resumable", j.resumable], ["min runtime", dur(j.min_runtime_s)],
    ["submitted", timeEl(j.submitted_at)], ["started", timeEl(j.started_at)], ["finished", timeEl(j.finished_at)],
    ["elapsed", j.status === "running" || j.status === "stopping" ? ticking("elapsed", j.started_at) : clock(j.elapsed_s)],
    ["time limit", j.time_limit_s === null ? "none" : clock(j.time_limit_s)],
    ["remaining", j.status === "running" ? ticking("remaining", j.started_at, j.time_limit_s) : "—"],
    ["placements / preemptions", `${j.placements} / ${j.preemptions}`],
  ].map(([k, v]) => el("tr", {}, td(k), td(v instanceof Node ? v : String(v)))), { id: "job-facts" });
  const priv = data.private
    ? el("div", { id: "job-private" }, el("h2", {}, "Command"), el("pre", { id: "job-command" }, j.command.join(" ") || "(none)"),
      el("h2", {}, "Labels"), el("pre", {}, JSON.stringify(data.labels, null, 1)),
      el("h2", {}, "Logs"), el("pre", { id: "job-logs" }, j.logs.join("\n") || "(none yet)"))
    : el("p", { id: "job-private", class: "muted" }, "Command, labels and logs: only the owner, the managers above its account and admins see them.");
  const decisions = table(["cycle", "decided", "placed", "preempted", "considered", "replay"],
    data.decisions.map((d) => el("tr", { "data-position": d.position },
      td(el("a", { href: `/ui/decisions?position=${d.position}` }, d.cycle_id)), td(timeEl(d.decided_at)),
      td(d.placed.includes(j.job_id) ? "this job" : d.placed.length, { class: "num" }),
      td(d.preempted.includes(j.job_id) ? "this job" : d.preempted.length, { class: "num" }),
      td(d.considered, { class: "num" }),
      td(replayed === null || replayedFor !== id || d.position > replayedTop ? "…" : replayText(replayed.get(d.position)), { "data-col": "replay" }))),
    { id: "job-decisions" });
  main(el("h1", {}, `Job ${j.job_id}`), facts, priv,
    el("h2", {}, "Timeline"), timeline(x.history),
    table(["at", "event", "what"], x.history.map((h) => el("tr", {}, td(timeEl(h.at)), td(h.tag, { class: "tag" }), td(localised(h.text)))), { id: "job-history" }),
    el("h2", {}, "Explain"), el("pre", { id: "explain" }, localised(x.lines.join("\n"))),
    el("h2", {}, "Decisions about it, beside their replay"), decisions);
  // replayed again once a newer decision about it is listed (atk48-29 F12: the decision that
  // just placed the watched job said "not replayed (older)" until a reload)
  const newest = Math.max(0, ...data.decisions.map((d) => d.position));
  if (replayed === null || replayedFor !== id || newest > replayedTop) {
    replayedFor = id;
    replayedTop = newest;
    const got = await api(`/ui/api/job/${id}/replay`);
    replayed = new Map();
    for (const r of got) replayed.set(r.position, r);
    refresh();
  }
}

function replayText(r) {
  if (!r) return "not replayed (older)";
  if (r.identical) return "identical";
  if (r.replay.error) return `cannot replay: ${r.replay.error}`;
  return `${r.replay.differences.length} differences`;
}

// --- nodes ----------------------------------------------------------------------------------

async function nodesPage() {
  const data = await api("/ui/api/nodes");
  const byNode = new Map();
  for (const g of data.gpus) {
    if (!byNode.has(g.node)) byNode.set(g.node, []);
    byNode.get(g.node).push(g);
  }
  const squat = new Set(data.squatters.map((s) => s.job_id));
  const cards = data.nodes.map((n) => {
    const gpus = byNode.get(n.node) || [];
    const held = gpus.filter((g) => g.job_id !== null).length;
    const ending = new Set(n.stopping_gpus || []);
    const idle = (g) => ending.has(g.gpu)
      ? el("div", { class: "gpu stopping", title: `GPU ${g.gpu}: stopping (a stopped job's processes are ending)` }, g.gpu)
      : el("div", { class: "gpu free", title: `GPU ${g.gpu}: free` }, g.gpu);
    return el("div", { class: "card", "data-node": n.node },
      el("h3", {}, `${n.node} `, el("span", { class: `state-${n.state}` }, n.state), n.drain_reason ? el("span", { class: "muted" }, ` (${n.drain_reason})`) : null),
      el("div", { class: "muted" }, `${n.gpus} × ${n.gpu_type} · ${n.cluster} · ${held}/${n.gpus} allocated (${pct(held / Math.max(1, n.gpus))})`),
      (n.stopping_jobs || []).length ? el("div", { class: "stopping", "data-col": "stopping" }, "stopping: ",
        n.stopping_jobs.flatMap((j, i) => [i ? ", " : "", el("a", { href: `/ui/job?id=${j}` }, j)])) : null,
      el("div", { class: "gpus" }, gpus.map((g) => g.job_id === null
        ? idle(g)
        : el("a", { class: "gpu", href: `/ui/job?id=${g.job_id}`, "data-gpu": `${g.node}:${g.gpu}`,
          style: `background:${colour(g.job_id)}${squat.has(g.job_id) ? ";outline:3px solid var(--bad)" : ""}`,
          title: `GPU ${g.gpu}: job ${g.job_id} (${g.user}, ${g.account}) utilisation ${g.utilisation_pct === null ? "unknown" : g.utilisation_pct + "%"}` },
          `${g.job_id}${g.utilisation_pct === null ? "" : " " + Math.round(g.utilisation_pct) + "%"}`))));
  });
  const total = data.gpus.length, used = data.gpus.filter((g) => g.job_id !== null).length;
  main(el("h1", {}, "Nodes and GPUs"),
    el("p", {}, `${used}/${total} GPUs allocated (${pct(used / Math.max(1, total))}); `,
      `${data.nodes.filter((n) => n.state !== "active").length} nodes not active; squatters outlined in red.`),
    el("div", { class: "grid", id: "nodes" }, cards),
    el("h2", {}, "Squatters (idle GPUs held)"),
    el("p", { class: "muted", id: "squat-rule" }, `GPUs below ${data.squat_util_pct}% utilisation for ${dur(data.squat_after_s)} or more (the service's settings)`),
    table(["job", "user", "account", "GPUs", "idle since", "past contract", "managers"],
      data.squatters.map((s) => el("tr", {}, td(el("a", { href: `/ui/job?id=${s.job_id}` }, s.job_id)), td(s.user), td(s.account),
        td(s.gpus, { class: "num" }), td(timeEl(s.idle_since_at)), td(s.past_contract ? "yes" : "no", { "data-col": "past_contract" }),
        td(s.managers.join(", ") || "—"))),
      { id: "squatters" }));
}

// --- decisions ------------------------------------------------------------------------------

function cyclesChart(rows) {
  const W = 900, H = 140, B = 16;
  if (!rows.length) return el("p", { class: "muted" }, "no recorded decisions");
  const t0 = rows[rows.length - 1].decided_at, t1 = Math.max(t0 + 1, rows[0].decided_at);
  const top = Math.max(1, ...rows.map((r) => r.placed.length + r.preempted.length));
  const x = (t) => 30 + ((t - t0) / (t1 - t0)) * (W - 40);
  const y = (v) => H - B - (v / top) * (H - B - 8);
  return svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", id: "cycles-chart" },
    svg("line", { x1: 30, y1: H - B, x2: W, y2: H - B, stroke: "#ccd" }),
    svg("text", { x: 2, y: 12 }, top), svg("text", { x: 2, y: H - B }, 0),
    svg("text", { x: 30, y: H - 3 }, when(t0, SHORT)), svg("text", { x: W - 4, y: H - 3, "text-anchor": "end" }, when(t1, SHORT)),
    rows.map((r) => svg("g", {},
      svg("line", { x1: x(r.decided_at), x2: x(r.decided_at), y1: H - B, y2: y(r.placed.length), stroke: "var(--delivered)", "stroke-width": 2 }),
      svg("line", { x1: x(r.decided_at) + 2, x2: x(r.decided_at) + 2, y1: H - B, y2: y(r.preempted.length), stroke: "var(--bad)", "stroke-width": 2 }))));
}

const decisionsState = { before: null };  // the page: the cycles before this position (null: the newest)

async function decisionsPage() {
  const q = new URLSearchParams({ limit: 500 });
  if (decisionsState.before !== null) q.set("before", decisionsState.before);
  const page = await api(`/ui/api/decisions?${q}`);
  const rows = page.rows;
  const older = () => { decisionsState.before = rows[rows.length - 1].position; refresh(); };
  const nav = el("div", { class: "filters pager" },
    el("button", { type: "button", id: "decisions-newest", disabled: decisionsState.before === null,
      on: { click: () => { decisionsState.before = null; refresh(); } } }, "« newest"),
    el("span", { id: "decisions-range", "data-total": page.total }, `${rows.length} of ${page.total.toLocaleString()} cycles`),
    el("button", { type: "button", id: "decisions-older", disabled: rows.length < page.limit,
      on: { click: older } }, "older ›"));
  const chosen = new URLSearchParams(location.search).get("position");
  const list = table(["cycle", "decided", "placed", "preempted", "considered", "fragmented GPUs", "policy"],
    rows.map((r) => el("tr", { "data-position": r.position },
      td(el("a", { href: `/ui/decisions?position=${r.position}` }, r.cycle_id)), td(timeEl(r.decided_at)),
      td(r.placed.length, { class: "num" }), td(r.preempted.length, { class: "num" }),
      td(r.considered, { class: "num" }), td(r.fragmentation_gpus === null ? "—" : r.fragmentation_gpus, { class: "num" }),
      td(r.policy_version))),
    { id: "decisions" });
  let detail = null;
  let d = null;
  if (chosen && /^\d+$/.test(chosen)) {
    try {
      d = await api(`/ui/api/decision/${chosen}`);
    } catch (err) {  // no decision there: said inline, the cycles stay listed (atk48-29 F10)
      detail = el("p", { class: "err", id: "decision-error" }, `${err.message}: choose a cycle below.`);
    }
  }
  if (d) {
    const rec = d.record;
    detail = el("div", { id: "decision" },
      el("h2", {}, `Cycle ${rec.cycle_id}`),
      table(["", ""], [
        ["decided", timeEl(d.row.decided_at)], ["based on position", rec.based_on],
        ["policy", rec.policy === null || rec.policy === undefined ? rec.policy_version : `${rec.policy_version} ${JSON.stringify(rec.policy)}`],
        ["ranks read at", rec.ranks ? `${rec.ranks.position}${rec.ranks.digest ? ` (digest ${rec.ranks.digest})` : ""}` : "—"],
        ["placed", rec.placed.join(", ") || "none"], ["preempted", rec.preempted.join(", ") || "none"],
        ["considered", rec.waiting.considered],
        ["waiting by code", rec.waiting.counts.map(([c, n]) => `${c}: ${n}`).join(", ") || "—"],
        ["wake at", timeEl(rec.wake_at)], ["skipped empty cycles before", rec.skipped_cycles],
      ].map(([k, v]) => el("tr", {}, td(k), td(v === null || v === undefined ? "—" : v)))),
      el("h2", {}, "The record"), el("pre", {}, JSON.stringify(rec, null, 1)));
  }
  main(el("h1", {}, "Decisions"), el("p", { class: "legend" },
    el("span", {}, el("i", { class: "sw", style: "background:var(--delivered)" }), "placed"),
    el("span", {}, el("i", { class: "sw", style: "background:var(--bad)" }), "preempted"),
    `${rows.length} ${decisionsState.before === null ? "latest " : ""}cycles`), cyclesChart(rows), detail, el("h2", {}, "Cycles"), nav, list);
}

// --- preemptions ----------------------------------------------------------------------------

const preemptState = { account: null, side: "both", window: "30d", offset: 0 };
const PREEMPT_PAGE = 200;

function preemptFromUrl() {  // a bookmarked or sent view (atk48-29 F10), as the queue's
  const u = new URLSearchParams(location.search);
  if (u.has("account")) preemptState.account = u.get("account") === "*" ? "" : u.get("account");
  if (["both", "of", "by"].includes(u.get("side"))) preemptState.side = u.get("side");
  if (["7d", "30d", "90d", "all"].includes(u.get("window"))) preemptState.window = u.get("window");
  const n = Number(u.get("offset"));
  if (u.has("offset") && Number.isInteger(n) && n >= 0 && n <= 1e9) preemptState.offset = n;
}

async function preemptionsPage(first) {
  if (first) preemptFromUrl();
  const q = new URLSearchParams({ side: preemptState.side, window: preemptState.window,
    offset: preemptState.offset, limit: PREEMPT_PAGE });
  if (preemptState.account !== null) q.set("account", preemptState.account || "*");  // "*": every team (no name has one)
  const data = await api(`/ui/api/preemptions?${q}`);
  const rep = data.report;
  if (first || preemptState.account === null) preemptState.account = rep.account || "";
  const u = new URLSearchParams({ account: preemptState.account || "*" });
  if (preemptState.side !== "both") u.set("side", preemptState.side);
  if (preemptState.window !== "30d") u.set("window", preemptState.window);
  if (preemptState.offset) u.set("offset", preemptState.offset);
  toUrl(u);
  const choose = (key) => (ev) => { preemptState[key] = ev.target.value.trim(); preemptState.offset = 0; refresh(); };
  const accounts = el("datalist", { id: "managed" }, data.managed.map((a) => el("option", { value: a })));
  const filters = el("div", { class: "filters" },
    el("input", { id: "p-account", list: "managed", placeholder: "account (and below); empty: all",
      value: preemptState.account, on: { change: choose("account") } }), accounts,
    el("select", { id: "p-side", on: { change: choose("side") } },
      [["both", "suffered and caused"], ["of", "suffered"], ["by", "caused"]].map(([v, t]) =>
        el("option", { value: v, selected: v === preemptState.side }, t))),
    el("select", { id: "p-window", on: { change: choose("window") } },
      [["7d", "last 7 days"], ["30d", "last 30 days"], ["90d", "last 90 days"], ["all", "whole period"]].map(([v, t]) =>
        el("option", { value: v, selected: v === preemptState.window }, t))));
  const rows = rep.rows.map((r) => el("tr", { "data-position": r.position, "data-job": r.job_id },
    td(timeEl(r.preempted_at)), td(r.side, { "data-col": "side" }),
    td(el("a", { href: `/ui/job?id=${r.job_id}` }, r.job_id)), td(r.account || "—"), td(r.user_name || "—"),
    td(r.gpus === null ? "—" : r.gpus, { class: "num" }), td(r.reason, { "data-col": "reason" }),
    td(localised(r.rule || "—"), { "data-col": "rule" }),
    td(r.for_job === null ? "—" : el("a", { href: `/ui/job?id=${r.for_job}` }, r.for_job), { "data-col": "for_job" }),
    td(r.for_account || "—"), td(num(r.lost_gpu_hours, 2), { class: "num", "data-col": "lost" })));
  const who = rep.account ? `${rep.account} and below` : "every team";
  main(el("h1", {}, "Preemptions suffered and caused"), filters,
    el("p", { id: "preempt-summary", "data-start": rep.start, "data-end": rep.end, "data-account": rep.account || "", "data-side": rep.side },
      `${who}, `, timeEl(rep.start), " – ", timeEl(rep.end), `: suffered ${rep.suffered}, caused ${rep.caused}; `,
      `GPU-hours lost ${num(rep.lost_gpu_hours, 1)} (by the jobs it preempted ${num(rep.caused_lost_gpu_hours, 1)})`),
    table(["at", "side", "job", "account", "user", "GPUs", "reason", "victim rule", "for job", "for account", "lost GPU-h"],
      rows, { id: "preemptions" }),
    data.total > data.limit ? pager(data.total, data.offset, data.limit, preemptState, "preemptions") : null);
}

// --- budget review ------------------------------------------------------------------------

const budgetState = { account: null, whatif: null, shares: null, result: null, running: false, error: null };

async function post(path, body) {
  const resp = await fetch(path, { method: "POST", body: JSON.stringify(body),
    headers: { Authorization: `Bearer ${token()}`, "Content-Type": "application/json" } });
  if (resp.status === 401) return api(path);  // signed out: the login page
  const text = await resp.text();
  let out = null;
  try { out = JSON.parse(text); } catch (err) { out = null; }
  // a proxy in front answers its own HTML page (a 504 past its read timeout): said as such, not
  // as "Unexpected token '<'" (atk50-29 F2)
  if (out === null) throw new Error(`the server or a proxy in front of it answered ${resp.status}${resp.status === 504 ? " (a proxy's read timeout: see docs/server.md, TLS and reverse proxies)" : ""}`);
  if (!resp.ok) throw new Error(out.detail || `${resp.status}`);
  return out;
}

async function runWhatif(child, shares) {
  budgetState.running = true; budgetState.error = null; budgetState.result = null; budgetState.turn = null;
  refresh();
  // where it stands, while it waits or runs (atk50-29 F3: it said "running" while it waited)
  const poll = setInterval(async () => { budgetState.turn = await api("/ui/api/budget/whatif/turn"); refresh(); }, 1000);
  try {
    budgetState.result = await post("/ui/api/budget/whatif", { account: child.account, shares });
  } catch (err) {
    budgetState.error = err.message;
  }
  clearInterval(poll);
  budgetState.running = false;
  refresh();
}

function whatifResult(r) {
  const rep = r.report;
  if (rep === null) return el("div", { id: "whatif-result", "data-shares": r.shares }, el("p", {}, `${r.account}: shares ${r.was} → ${r.shares}: the shares it has now, so no change (nothing to simulate).`));
  const notes = [...new Set(rep.notes)];
  // against the same simulation with no change (atk49-29 F1); what happened beside it
  const base = (t) => t.baseline ?? t.actual;
  const pair = (a, b, f) => (f(a) === f(b) ? f(a) : `${f(a)} → ${f(b)}`);
  const col = (t, k, f, c) => td(pair(base(t)[k], t.whatif[k], f), { class: "num", "data-col": c });
  const rows = rep.teams.map((t) => el("tr", { "data-team": t.team },
    td(t.team), col(t, "owed_gpu_h", (x) => num(x, 1), "owed"), col(t, "delivered_gpu_h", (x) => num(x, 1), "delivered"),
    col(t, "by_period", pct, "by_period"), col(t, "mean_wait_s", dur, "mean_wait"), col(t, "preemptions", String, "preemptions"),
    td(num(t.actual.delivered_gpu_h, 1), { class: "num", "data-col": "happened" })));
  const same = r.shares === r.was ? ` (the shares it has now: no change, so the two sides should not differ)` : "";
  return el("div", { id: "whatif-result", "data-start": rep.start, "data-end": rep.end, "data-shares": r.shares },
    el("p", { class: "muted" }, `${r.account}: shares ${r.was} → ${r.shares}${same}; `, timeEl(rep.start), " – ", timeEl(rep.end),
      ` (the last 4 weeks; accounts opened, members and shares changed meanwhile as recorded): ${rep.submissions} submissions (+${rep.carried} active at the start), ${rep.cycles} cycles${rep.step_s ? ` (deciding every ${rep.step_s} s)` : ""}, policy ${rep.policy_version}.`),
    el("p", { id: "whatif-compared" }, `Compared: ${rep.compared}. No change → what-if:`),
    table(["team", "owed GPU-h", "delivered GPU-h", "delivered/owed (by period, capped at 100%)", "mean wait", "preemptions", "delivered GPU-h: happened"], rows, { id: "whatif-teams" }),
    notes.slice(0, 8).map((n) => el("p", { class: "muted note" }, "note: ", ...localised(n))),
    notes.length > 8 ? el("p", { class: "muted" }, `… and ${notes.length - 8} more notes`) : null);
}

function whatifPanel(data, child) {
  // the what-if of one share change, run by the server (nothing is written: no budget changes)
  const input = el("input", { id: "whatif-shares", type: "number", min: 0, step: 1, value: budgetState.shares ?? child.raw_shares,
    on: { input: (ev) => { budgetState.shares = ev.target.value; } } });
  const run = el("button", { type: "button", id: "whatif-run", disabled: budgetState.running,
    on: { click: () => runWhatif(child, Number(input.value === "" ? NaN : input.value)) } },
    budgetState.running ? "running…" : "Run what-if");
  const shown = budgetState.result && budgetState.result.account === child.account ? budgetState.result : null;
  return el("div", { id: "whatif", class: "card" },
    el("h3", {}, `What if ${child.account} held other shares?`),
    el("p", {}, "Shares ", input, ` (now ${child.raw_shares}; its siblings keep theirs) `, run),
    el("p", { class: "muted" }, "The server re-simulates the last 4 weeks' submissions (at most) twice, with and without the change (twice the time), and compares per team; what happened is beside them. Nothing is changed."),
    budgetState.error ? el("p", { class: "err", id: "whatif-error" }, budgetState.error) : null,
    budgetState.running ? el("p", { id: "whatif-running", class: "muted" }, turnText(budgetState.turn)) : null,
    shown ? whatifResult(shown) : null);
}

const turnText = (t) => (!t || (t.ahead === 0 && t.running_s === null) ? "The what-if is starting…"
  : t.running_s === null ? `Waiting for ${t.ahead} what-if${t.ahead > 1 ? "s" : ""} ahead of yours (one runs at a time)…`
  : `The what-if is running: ${dur(t.running_s)} so far (4 weeks: about a minute on an idle server, minutes on a busy one)…`);

async function budgetPage(first) {
  if (first && new URLSearchParams(location.search).has("account")) {  // a bookmarked or sent review
    budgetState.account = new URLSearchParams(location.search).get("account").trim();
  }
  const q = new URLSearchParams();
  if (budgetState.account !== null) q.set("account", budgetState.account);
  const data = await api(`/ui/api/budget?${q}`);
  if (budgetState.account === null) budgetState.account = data.account;
  toUrl(new URLSearchParams(data.account ? { account: data.account } : {}));
  const input = el("input", { id: "b-account", list: "b-managed", value: data.account,
    placeholder: "account (empty: the programs)",
    on: { change: (ev) => { budgetState.account = ev.target.value.trim(); budgetState.whatif = null; refresh(); } } });
  const rows = data.children.map((c) => el("tr", { "data-account": c.account },
    td(c.account.split("/").pop(), { title: c.account }), td(c.kind),
    td(c.raw_shares, { class: "num", "data-col": "raw_shares" }),
    td(num(c.norm_shares, 4), { class: "num", "data-col": "norm_shares" }),
    td(num(c.usage_gpu_hours, 1), { class: "num", "data-col": "usage" }),
    td(num(c.owed_gpu_hours, 1), { class: "num", "data-col": "owed" }),
    td(num(c.delivered_gpu_hours, 1), { class: "num", "data-col": "delivered" }),
    td(pct(c.by_period), { class: "num", "data-col": "by_period", title: c.owed_gpu_hours > 0 // the uncapped ratio (atk49-29 F6)
      ? `${(100 * c.delivered_gpu_hours / c.owed_gpu_hours).toFixed(1)}% uncapped (delivered / owed)` : null }),
    td(el("button", { type: "button", class: "whatif", on: { click: () => { budgetState.whatif = c.account; budgetState.shares = null; budgetState.result = null; budgetState.error = null; refresh(); } } }, "what if…"))));
  const chosen = data.children.find((c) => c.account === budgetState.whatif);
  main(el("h1", {}, `Budget review: ${data.account || "the programs"}`),
    el("div", { class: "filters" }, input, el("datalist", { id: "b-managed" }, data.managed.map((a) => el("option", { value: a })))),
    el("p", { id: "budget-period", "data-start": data.start, "data-at": data.at, class: "muted" },
      "Each child's shares of its parent, and over the last 4 weeks (", timeEl(data.start), " – ", timeEl(data.at),
      "): funded usage, owed (its share of the capacity, capped hour by hour by its demand) and delivered."),
    table(["account", "kind", "RawShares", "NormShares", "usage GPU-h", "owed GPU-h", "delivered GPU-h", "delivered/owed (by period, capped at 100%)", ""],
      rows, { id: "budget" }),
    chosen ? whatifPanel(data, chosen) : null);
}

// --- the loop -------------------------------------------------------------------------------

const PAGES = { teams: teamsPage, queue: queuePage, finished: finishedPage, job: jobPage, nodes: nodesPage, decisions: decisionsPage,
  preemptions: preemptionsPage, budget: budgetPage };
let ME = null;
let timer = null;
let started = false;

async function refresh() {
  clearTimeout(timer);
  try {
    await PAGES[PAGE](!started);
    started = true;
    status(`updated ${new Date().toLocaleTimeString(undefined, { hourCycle: "h23" })}`);
  } catch (err) {
    status(`could not update: ${err.message}`, true);
    // nothing shown yet (a bad page address, say): the one line says why, not a blank page
    if (!started) main(el("p", { class: "err", id: "page-error" }, err.message));
  }
  timer = setTimeout(refresh, POLL_MS[PAGE]);
}

async function start() {
  document.getElementById("tz").textContent = Intl.DateTimeFormat().resolvedOptions().timeZone;
  for (const a of document.querySelectorAll("[data-nav]")) if (a.dataset.nav === PAGE) a.className = "on";
  document.getElementById("signout").addEventListener("click", () => {
    localStorage.removeItem(TOKEN_KEY);
    location.assign("/ui/login");
  });
  if (PAGE === "login") {
    document.getElementById("signout").hidden = true;
    loginPage();
    return;
  }
  if (!token()) {
    location.assign(`/ui/login?next=${encodeURIComponent(location.pathname + location.search)}`);
    return;
  }
  ME = await api("/v1/whoami");
  document.getElementById("who").textContent = `${ME.actor}${ME.admin ? " (admin)" : ""}`;
  await refresh();
}

start();
