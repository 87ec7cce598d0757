// gpu-ledger dashboard: the job pages: the queue, the finished jobs, one job.
"use strict";

// --- queue ----------------------------------------------------------------------------------

const queueState = { user: "", account: "", state: "queued", reason: "", mine: false,
  sort: "order", descending: false, offset: 0, limit: 100 };
const QUEUE_COLUMNS = [  // [heading, sort column or null, width]
  ["#", "order", "4.5em"], ["job", "job", "6em"], ["user", "user", "6.5em"], ["account", "account", "10.5em"],
  ["GPUs", "gpus", "4.5em"], ["state", "state", "5.5em"], ["code", "code", "10em"], ["reason", null, "auto"],
  ["sort key", null, "8em"], ["submitted", "submitted", "8.5em"], ["waiting", null, "5.5em"],
  ["est. start", null, "8.5em"],
];

const RUNNING_COLUMNS = [  // the running view (state=running), like squeue -t R: TIME, TIME_LIMIT, TIME_LEFT
  ["job", "job", "6em"], ["user", "user", "6.5em"], ["account", "account", "10.5em"], ["GPUs", "gpus", "4.5em"],
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

// A job's id, its link, and its name below it (public, as in squeue: no page showed it,
// atk61-29a F7), cut to its cell, whole on hover; its own direction (<bdi>: a name's
// right-to-left override reorders nothing beside it)
function jobName(name) {
  return name ? el("bdi", { class: "name", title: name, "data-col": "name" }, name) : null;
}

function jobCell(id, name) {
  return td([el("a", { href: `/ui/job?id=${id}` }, id), jobName(name)]);
}

function queueCells(r, parts, running, name) {
  if (running) {
    return [jobCell(r.job_id, name), td(r.user, { title: r.user }),
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
    jobCell(r.job_id, name), td(r.user, { title: r.user }),
    td(squeezed(r.account), { title: r.account, "data-col": "account" }), td(r.gpus, { class: "num" }), td(stateCell(r.state, r.kill_at)),
    td(codeWords(r.code), { class: "wrap", "data-col": "code", title: r.code }),
    td(el("span", { class: "clamp", title: holding ? null : localisedText(r.reason), on: { click: (ev) => ev.currentTarget.classList.toggle("open") } }, reason),
      { class: "wrap", "data-col": "reason" }),
    td(parts.map(keyPart), { class: "wrap" }),
    td(timeEl(r.submitted_at)), td(dur(r.waiting_s)), td(timeEl(r.estimated_start_at))];
}

// A wait code whole at every width, broken only after its underscores (`WAIT_RESOURCES` was
// cut to `WAIT_RESOUR…` at 1,024 px; the reason beside it is two lines, whole on hover or a
// click: it wrapped to 5-7 lines, 4 jobs a screen: atk61-29c F6)
const codeWords = (code) => String(code ?? "").split(/(?<=_)/).flatMap((w, i) => (i ? [el("wbr"), w] : [w]));

// A value of the address the server refuses (`sort=bogus`, `state=bogus`, `reason=NOPE`,
// `account=nope`: its answer names the parameter, `param`) is dropped, as `offset=-5` is, and
// said beside the filters, the page drawn with its filters, headers and pager: the one error
// line replaced the page, and the only way out was to edit the address (atk61-29a F3).
const dropped = [];  // what was dropped, said until a filter is changed

function droppedBad(err, state, defaults) {
  const k = err.param;
  if (!k || !(k in state) || state[k] === defaults[k]) return false;
  dropped.push(`${k}=${cutValue(state[k])} dropped: ${err.message}`);
  state[k] = defaults[k];
  document.getElementById("filters")?.replaceWith(PAGE === "queue" ? queueFilters() : finishedFilters());
  return true;
}

function filterRow(...kids) {
  return el("div", { class: "filters", id: "filters" }, ...kids,
    droppedNote(dropped));
}

function filtersChanged(state) {
  state.offset = 0;
  dropped.length = 0;
  document.getElementById("filter-error")?.remove();
  refresh();
}

function queueFilters() {
  const again = () => filtersChanged(queueState);
  const input = (name, ph) => el("input", { id: `f-${name}`, placeholder: ph, value: queueState[name],
    on: { change: (ev) => { queueState[name] = ev.target.value.trim(); again(); } } });
  const sel = el("select", { id: "f-state", on: { change: (ev) => { queueState.state = ev.target.value; again(); } } },
    [["queued", "queued (pending and held)"], ["pending", "pending"], ["held", "held"], ["running", "running"],
     ["all", "all (queued and running)"]].map(([s, t]) => el("option", { value: s, selected: s === queueState.state }, t)));
  const reason = el("select", { id: "f-reason", on: { change: (ev) => { queueState.reason = ev.target.value; again(); } } },
    el("option", { value: "" }, "any reason"));
  const mine = el("input", { type: "checkbox", id: "f-mine", checked: queueState.mine,
    on: { change: (ev) => { queueState.mine = ev.target.checked; again(); } } });
  return filterRow(input("user", "user"), input("account", "account (and below)"), sel,
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

async function queuePage(first) {
  if (first) queueFromUrl();
  if (first) document.getElementById("main").replaceChildren(el("h1", {}, "Queue in dispatch order"), queueFilters(), el("div", { id: "queue-body" }));
  const q = new URLSearchParams({ state: queueState.state, sort: queueState.sort, descending: queueState.descending,
    offset: queueState.offset, limit: queueState.limit });
  const user = queueState.mine ? ME.actor : queueState.user;
  if (user) q.set("user", user);
  if (queueState.account) q.set("account", queueState.account);
  if (queueState.reason) q.set("reason", queueState.reason);
  let page;
  try {
    page = await pageRead(`/ui/api/queue?${q}`);
  } catch (err) {
    if (!droppedBad(err, queueState, QUEUE_DEFAULTS)) throw err;
    return queuePage(false);
  }
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
    el("tbody", {}, page.rows.map(({ row: r, parts, name }) => el("tr", { "data-job": r.job_id }, queueCells(r, parts, running, name)))));
  document.getElementById("queue-body").replaceChildren(pager(page.total, page.offset, page.limit), el("div", { class: "scroll" }, body));
}

// --- finished jobs (like sacct) ------------------------------------------------------------

const finishedState = { user: "", account: "", reason: "", mine: false, offset: 0, limit: 100 };
const FINISHED_DEFAULTS = { ...finishedState };
const FINISH_REASONS = ["completed", "failed", "cancelled", "time_limit", "preempted", "node_lost",
  "dependency_never_satisfied", "launch_failed"];

function finishedFilters() {
  const again = () => filtersChanged(finishedState);
  const input = (name, ph) => el("input", { id: `f-${name}`, placeholder: ph, value: finishedState[name],
    on: { change: (ev) => { finishedState[name] = ev.target.value.trim(); again(); } } });
  const reason = el("select", { id: "f-reason", on: { change: (ev) => { finishedState.reason = ev.target.value; again(); } } },
    el("option", { value: "" }, "any end"),
    FINISH_REASONS.map((r) => el("option", { value: r, selected: r === finishedState.reason }, r)));
  const mine = el("input", { type: "checkbox", id: "f-mine", checked: finishedState.mine,
    on: { change: (ev) => { finishedState.mine = ev.target.checked; again(); } } });
  return filterRow(input("user", "user"), input("account", "account (and below)"), reason,
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
  let page;
  try {
    page = await pageRead(`/ui/api/finished?${q}`);
  } catch (err) {
    if (!droppedBad(err, finishedState, FINISHED_DEFAULTS)) throw err;
    return finishedPage(false);
  }
  const body = table(["job", "user", "account", "GPUs", "end", "exit", "submitted", "started", "ended", "elapsed", "nodes"],
    page.rows.map((j) => el("tr", { "data-job": j.job_id },
      jobCell(j.job_id, j.job_name), td(j.user), td(j.account, { title: j.account }),
      td(j.gpus, { class: "num" }), td(j.finish_reason || j.outcome || "—", { "data-col": "reason" }),
      td(j.exit_code === null ? "—" : j.exit_code, { class: "num" }), td(timeEl(j.submitted_at)),
      td(timeEl(j.started_at)), td(timeEl(j.finished_at)), td(dur(j.elapsed_s), { "data-col": "elapsed" }),
      td(j.nodes.join(", ") || "—", { class: "wrap" }))),
    { id: "finished" });
  document.getElementById("finished-body").replaceChildren(
    pager(page.total, page.offset, page.limit, finishedState, "finished jobs"), body);
}

// --- job ------------------------------------------------------------------------------------

let replayed = null, replayedFor = null, replayedTop = 0;

// A job's labels as the decision record's fields, by name, "none" when it has none: it was the
// raw JSON, `{}` (atk61-29c F5).
function labelsTable(labels) {
  const rows = recordRows(labels || {});
  return rows.length
    ? table(["label", "value"], rows.map(([k, v]) => el("tr", {}, td(k, { class: "tag" }), td(v))), { id: "job-labels" })
    : el("p", { id: "job-labels", class: "muted" }, "none");
}

async function jobPage() {
  const id = new URLSearchParams(location.search).get("id");
  if (!id || !/^\d+$/.test(id)) {
    main(el("h1", {}, "Job"), el("p", {}, "Open a job from the queue."));
    return;
  }
  const data = await pageRead(`/ui/api/job/${id}`);
  const j = data.job, x = data.explain;
  const facts = table(["field", "value"], [
    ["status", j.kill_at === null ? j.status + (j.outcome ? ` (${j.outcome})` : "") : stateCell(j.status, j.kill_at)],
    ["name", j.job_name ? el("bdi", { id: "job-name" }, j.job_name) : "none"], ["user", j.user], ["account", j.account],
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
      el("h2", {}, "Labels"), labelsTable(data.labels),
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
