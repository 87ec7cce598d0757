// gpu-ledger dashboard: the Teams, Nodes, Decisions and Preemptions pages.
"use strict";

// --- teams ----------------------------------------------------------------------------------

const teamsState = { window: "7d" };

async function teamsPage() {
  const data = await pageRead(`/ui/api/teams?window=${teamsState.window}`);
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
    el("div", { class: "card" }, el("h3", {}, s.team), teamChart(s, data.series.start_at, data.series.end_at, data.series.bucket_s))));
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

// --- nodes ----------------------------------------------------------------------------------

async function nodesPage() {
  const data = await pageRead("/ui/api/nodes");
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

// A recorded event as [field, value] rows, its fields named by their path ("ranks.usage.window_s"):
// times (`at`, `*_at`) in the page's form (the viewer's zone, UTC on hover), an absent value
// (null, "") left out, an empty list or map said "none"; it was the raw JSON, a literal `null`
// and epoch seconds (atk61-29a F2).
function recordRows(value, name = "") {
  if (value === null || value === undefined || value === "") return [];
  if (Array.isArray(value)) {
    const item = (x) => (Array.isArray(x) ? x.join(" ") : x !== null && typeof x === "object"
      ? recordRows(x).map(([k, v]) => `${k} ${v instanceof Node ? v.textContent : v}`).join(" · ") : String(x));
    return [[name, value.length ? value.map(item).join(", ") : "none"]];
  }
  if (typeof value === "object") {
    const rows = Object.entries(value).flatMap(([k, v]) => recordRows(v, name ? `${name}.${k}` : k));
    return rows.length || name === "" ? rows : [[name, "none"]];
  }
  const key = name.split(".").pop();
  if (typeof value === "number" && (key === "at" || key.endsWith("_at"))) return [[name, timeEl(value)]];
  if (typeof value === "boolean") return [[name, value ? "yes" : "no"]];
  return [[name, String(value)]];
}

const decisionsState = { before: null };  // the page: the cycles before this position (null: the newest)

async function decisionsPage() {
  const q = new URLSearchParams({ limit: 500 });
  if (decisionsState.before !== null) q.set("before", decisionsState.before);
  const page = await pageRead(`/ui/api/decisions?${q}`);
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
  if (chosen !== null && !/^\d+$/.test(chosen)) {  // dropped without a word (atk61-29c F4)
    detail = el("p", { class: "err", id: "decision-error" }, `position=${cutValue(chosen)} dropped: not a whole number from 0: choose a cycle below.`);
  } else if (chosen) {
    try {
      d = await pageRead(`/ui/api/decision/${chosen}`);
    } catch (err) {  // no decision there: said inline, the cycles stay listed (atk48-29 F10)
      if (err instanceof Superseded) throw err;  // (a later update draws the page)
      detail = el("p", { class: "err", id: "decision-error" }, `${err.message}: choose a cycle below.`);
    }
  }
  if (d) {
    const rec = d.record;
    detail = el("div", { id: "decision" },
      el("h2", {}, `Cycle ${rec.cycle_id}`),
      table(["", ""], [
        ["decided", timeEl(d.row.decided_at)], ["based on position", rec.based_on],
        // its version, the settings by name in the record below: it printed them as raw JSON (atk61-29c F5)
        ["policy", rec.policy === null || rec.policy === undefined ? rec.policy_version : `${rec.policy_version} (its settings: policy.* in the record below)`],
        ["ranks read at", rec.ranks ? `${rec.ranks.position}${rec.ranks.digest ? ` (digest ${rec.ranks.digest})` : ""}` : "—"],
        ["placed", rec.placed.join(", ") || "none"], ["preempted", rec.preempted.join(", ") || "none"],
        ["considered", rec.waiting.considered],
        ["waiting by code", rec.waiting.counts.map(([c, n]) => `${c}: ${n}`).join(", ") || "—"],
        ["wake at", timeEl(rec.wake_at)], ["skipped empty cycles before", rec.skipped_cycles],
      ].map(([k, v]) => el("tr", {}, td(k), td(v === null || v === undefined ? "—" : v)))),
      el("h2", {}, "The record"),
      table(["field", "value"], recordRows(rec).map(([k, v]) => el("tr", {}, td(k, { class: "tag" }), td(v))), { id: "decision-record" }));
  }
  main(el("h1", {}, "Decisions"), el("p", { class: "legend" },
    el("span", {}, el("i", { class: "sw", style: "background:var(--delivered)" }), "placed"),
    el("span", {}, el("i", { class: "sw", style: "background:var(--bad)" }), "preempted"),
    `${rows.length} ${decisionsState.before === null ? "latest " : ""}cycles`), cyclesChart(rows), detail, el("h2", {}, "Cycles"), nav, list);
}

// --- preemptions ----------------------------------------------------------------------------

const preemptState = { account: null, side: "both", window: "30d", offset: 0 };
const PREEMPT_PAGE = 200;

const preemptDropped = [];  // what the address held that was dropped (`droppedNote`)

// a bookmarked or sent view (atk48-29 F10), as the queue's: a side or window it cannot be is
// dropped and said (it was dropped without a word, atk61-29c F4)
function preemptFromUrl() {
  const u = new URLSearchParams(location.search);
  if (u.has("account")) preemptState.account = u.get("account") === "*" ? "" : u.get("account");
  for (const [k, known] of [["side", ["both", "of", "by"]], ["window", ["7d", "30d", "90d", "all"]]]) {
    if (known.includes(u.get(k))) preemptState[k] = u.get(k);
    else if (u.has(k)) preemptDropped.push(`${k}=${cutValue(u.get(k))} dropped: not one of ${known.join(", ")}`);
  }
  const n = Number(u.get("offset"));
  if (u.has("offset") && Number.isInteger(n) && n >= 0 && n <= 1e9) preemptState.offset = n;
}

// the page's read; an account the server refuses (`account=nope`: its answer names the
// parameter) is dropped and said, the page drawn for the default (the error line replaced the
// page, as the Queue's did: atk61-29c F4)
async function preemptRead() {
  const q = new URLSearchParams({ side: preemptState.side, window: preemptState.window,
    offset: preemptState.offset, limit: PREEMPT_PAGE });
  if (preemptState.account !== null) q.set("account", preemptState.account || "*");  // "*": every team (no name has one)
  try {
    return await pageRead(`/ui/api/preemptions?${q}`);
  } catch (err) {
    if (err instanceof Superseded || err.param !== "account" || !preemptState.account) throw err;
    preemptDropped.push(`account=${cutValue(preemptState.account)} dropped: ${err.message}`);
    preemptState.account = null;
    return preemptRead();
  }
}

async function preemptionsPage(first) {
  if (first) preemptFromUrl();
  const data = await preemptRead();
  const rep = data.report;
  if (first || preemptState.account === null) preemptState.account = rep.account || "";
  const u = new URLSearchParams({ account: preemptState.account || "*" });
  if (preemptState.side !== "both") u.set("side", preemptState.side);
  if (preemptState.window !== "30d") u.set("window", preemptState.window);
  if (preemptState.offset) u.set("offset", preemptState.offset);
  toUrl(u);
  const choose = (key) => (ev) => { preemptState[key] = ev.target.value.trim(); preemptState.offset = 0; preemptDropped.length = 0; refresh(); };
  const accounts = el("datalist", { id: "managed" }, data.managed.map((a) => el("option", { value: a })));
  const filters = el("div", { class: "filters" },
    el("input", { id: "p-account", list: "managed", placeholder: "account (and below); empty: all",
      value: preemptState.account, on: { change: choose("account") } }), accounts,
    el("select", { id: "p-side", on: { change: choose("side") } },
      [["both", "suffered and caused"], ["of", "suffered"], ["by", "caused"]].map(([v, t]) =>
        el("option", { value: v, selected: v === preemptState.side }, t))),
    el("select", { id: "p-window", on: { change: choose("window") } },
      [["7d", "last 7 days"], ["30d", "last 30 days"], ["90d", "last 90 days"], ["all", "whole period"]].map(([v, t]) =>
        el("option", { value: v, selected: v === preemptState.window }, t))), droppedNote(preemptDropped));
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
      // the whole period has no start (`null`): said, not "—" (atk61-29a F5)
      `${who}, `, rep.start === null ? "from the log's start to " : [timeEl(rep.start), " – "], timeEl(rep.end), `: suffered ${rep.suffered}, caused ${rep.caused}; `,
      `GPU-hours lost ${num(rep.lost_gpu_hours, 1)} (by the jobs it preempted ${num(rep.caused_lost_gpu_hours, 1)})`),
    table(["at", "side", "job", "account", "user", "GPUs", "reason", "victim rule", "for job", "for account", "lost GPU-h"],
      rows, { id: "preemptions" }),
    data.total > data.limit ? pager(data.total, data.offset, data.limit, preemptState, "preemptions") : null);
}
