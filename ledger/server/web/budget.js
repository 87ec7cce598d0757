// gpu-ledger dashboard: the Budget review page and its what-if.
"use strict";

// --- budget review ------------------------------------------------------------------------

// `run`: the caller's what-if under way ({account, turn}; one of a person's at a time), its
// result or error kept under its own account (`results`, `errors`): a second child's "what
// if…" while one ran showed the first's progress under the second's heading and lost its
// result (atk52-29 F1)
// (`run.elsewhere`: one asked in another tab or browser of hers, `watchTurn`; `ended`: the last such)
// (`lost`: hers whose server stopped answering before its end, {account, shares})
const budgetState = { account: null, whatif: null, shares: null, children: [], run: null, results: {}, errors: {}, ended: null, lost: null };

// her other tabs of this browser hear at once that a what-if of hers starts or ends (they
// learnt of it at their next 30 s redraw: atk54-29 F3; and said its result showed in this tab
// when it had failed: F4, or went on saying it ran after the server was gone: F5); another
// browser learns within a few seconds (`watchTurn`), or at once when its Run is answered
// "under way" (it then shows hers rather than an error)
const tabs = "BroadcastChannel" in window ? new BroadcastChannel("gpuledger-whatif") : null;
if (tabs) {
  tabs.onmessage = (m) => {
    if (!document.getElementById("budget")) return;
    if (m.data.started) watchSoon(0);
    else if (m.data.lost && budgetState.run?.elsewhere) lostWith(budgetState.run);
    else if (m.data.ended) budgetState.endedWell = m.data.ok;
  };
}

async function runWhatif(child, shares) {
  const account = child.account;
  budgetState.run = { account, shares, turn: null };
  budgetState.ended = budgetState.lost = null;
  budgetState.epoch += 1;  // (a look at the turn asked before this is stale)
  delete budgetState.results[account];
  delete budgetState.errors[account];
  refresh();
  // where it stands (its place in line, then its step), streamed as it moves (atk50-29 F3: it
  // said "running" while it waited; F2: nothing came until the answer, and a proxy gave up)
  // (each line only rewrites that line: a whole redraw per line fetched the page again and
  // replaced its fields under the cursor, atk51-29 F1)
  const said = (turn) => {
    if (tabs && budgetState.run.turn === null) tabs.postMessage({ started: account });  // (the server has it now)
    budgetState.run.turn = turn;
    const line = document.getElementById("whatif-running");
    if (line) line.textContent = runningText(line.dataset.panel);
  };
  try {
    budgetState.results[account] = await streamed("/ui/api/budget/whatif?stream=true", { account, shares }, said);
  } catch (err) {
    budgetState.epoch += 1;
    if (/under way/.test(err.message)) {  // one of hers asked elsewhere (another browser)
      budgetState.run = null;
      watchSoon(0);
      return;
    }
    // the stream broke once the server had it (killed, restarted, a proxy's cut: the server
    // ends a what-if whose client left): lost, said so, and Run is back (atk54-29 F5: the tab
    // said "running" for good, its redraw failing against a server that was gone)
    if (budgetState.run.turn !== null && (err instanceof TypeError || /cut before its end/.test(err.message))) {
      lostWith(budgetState.run);
      if (tabs) tabs.postMessage({ ended: account, lost: true });
      watchSoon(0);  // (a server that answers again and still has it: shown)
      return;
    }
    budgetState.errors[account] = err instanceof TypeError ? `the server did not answer (${err.message}): try again once it is back` : err.message;
  }
  budgetState.epoch += 1;
  if (tabs) tabs.postMessage({ ended: account, ok: !(account in budgetState.errors) });
  budgetState.run = null;
  redrawPanel();
}

// her what-if (asked here or elsewhere) went with a server that stopped answering
function lostWith(run) {
  budgetState.lost = { account: run.account, shares: run.shares };
  budgetState.run = null;
  redrawPanel();
}

// the panel redrawn from what the tab holds (a server gone cannot stop it: its Run comes back),
// then the whole page asked again unless someone types
function redrawPanel() {
  const panel = document.getElementById("whatif");
  const chosen = budgetState.children.find((c) => c.account === budgetState.whatif);
  if (panel && chosen) panel.replaceWith(whatifPanel(chosen));
  if (!editing()) refresh();
}

// a what-if of hers asked in another tab or browser: this one shows it where it stands and its
// Run waits for its end, as for one of its own (atk53-29 F6: this tab knew nothing of it, and
// its Run answered 429 "a what-if of yours is under way"); its result shows in the tab that
// asked it. While the Budget page is in view the tab asks where hers stands every few seconds
// (the turn route names the caller's own what-if alone): another browser learnt of it only at
// its next 30 s redraw or at its Run (atk54-29 F3); a server that stopped answering ends it as
// lost (F5), and one that answers again and still has it shows it again.
const WATCH_MS = 2000;  // while one of hers is shown
const IDLE_MS = 3000;  // while none is
let watchTimer = null, watchBusy = false, watchAgain = false;
budgetState.epoch = 0;

function watchSoon(ms) {
  clearTimeout(watchTimer);
  watchTimer = setTimeout(watchTurn, ms);
}

async function watchTurn() {
  clearTimeout(watchTimer);
  if (PAGE !== "budget" || document.visibilityState !== "visible") return;  // (`visibilitychange` asks again)
  if (watchBusy) { watchAgain = true; return; }
  const mine = budgetState.run !== null && !budgetState.run.elsewhere;  // (its stream says where it stands)
  if (!mine) {
    const epoch = budgetState.epoch;
    watchBusy = true;
    try {
      const t = await api("/ui/api/budget/whatif/turn");
      if (epoch === budgetState.epoch) seen(t);
    } catch (err) {
      if (epoch === budgetState.epoch && budgetState.run?.elsewhere) lostWith(budgetState.run);
    } finally {
      watchBusy = false;
    }
  }
  if (watchAgain) { watchAgain = false; watchSoon(0); }
  else watchSoon(budgetState.run !== null ? WATCH_MS : IDLE_MS);
}

// what the turn route says of her what-if: shown, or ended
function seen(t) {
  const run = budgetState.run;
  if (run !== null && !run.elsewhere) return;  // (this tab's own began meanwhile)
  if (t.account !== null) {
    budgetState.run = { account: t.account, shares: t.shares, turn: t, elsewhere: true };
    budgetState.ended = budgetState.lost = null;
    const line = document.getElementById("whatif-running");
    if (run === null || !line || line.dataset.for !== t.account) redrawPanel();
    else line.textContent = runningText(line.dataset.panel);
  } else if (run !== null) {
    budgetState.ended = { ...run, ok: budgetState.endedWell };
    budgetState.endedWell = undefined;
    budgetState.run = null;
    redrawPanel();
  }
}

document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible") watchSoon(0); });

// the line of the what-if under way, in the panel of `panel` (an account): its own, or
// another child's, named
function runningText(panel) {
  const run = budgetState.run;
  if (!run) return "";
  const text = turnText(run.turn);
  if (run.elsewhere) return `Your what-if of ${run.account} (shares ${run.shares}), asked in another tab (one of yours at a time; its result shows there): ${text}`;
  return run.account === panel ? text : `Your what-if of ${run.account} (one of yours at a time; its result shows under its own "what if…"): ${text}`;
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

function whatifPanel(child) {
  // the what-if of one share change, run by the server (nothing is written: no budget changes)
  const account = child.account, run = budgetState.run;
  const input = el("input", { id: "whatif-shares", type: "number", min: 0, step: 1, value: budgetState.shares ?? child.raw_shares,
    on: { input: (ev) => { budgetState.shares = ev.target.value; } } });
  const button = el("button", { type: "button", id: "whatif-run", disabled: run !== null,
    on: { click: () => runWhatif(child, Number(input.value === "" ? NaN : input.value)) } },
    run && run.account === account ? "running…" : "Run what-if");
  const shown = budgetState.results[account] ?? null, error = budgetState.errors[account] ?? null;
  return el("div", { id: "whatif", class: "card", "data-account": account },
    el("h3", {}, `What if ${account} held other shares?`),
    el("p", {}, "Shares ", input, ` (now ${child.raw_shares}; its siblings keep theirs) `, button),
    el("p", { class: "muted" }, "The server re-simulates the last 4 weeks' submissions (at most) twice, with and without the change (twice the time), and compares per team; what happened is beside them. Nothing is changed."),
    error ? el("p", { class: "err", id: "whatif-error" }, error) : null,
    budgetState.lost ? el("p", { id: "whatif-lost", class: "err" }, `Your what-if of ${budgetState.lost.account} (shares ${budgetState.lost.shares}) was lost: the server stopped answering before its end (a what-if ends with its server). Run it again once the server is back.`) : null,
    budgetState.ended ? el("p", { id: "whatif-elsewhere", class: "muted" }, `Your what-if of ${budgetState.ended.account} (shares ${budgetState.ended.shares}), asked in another tab, has ended: ${budgetState.ended.ok === false ? "it failed; its error" : budgetState.ended.ok ? "its result" : "its result (or its error)"} shows in that tab.`) : null,
    run ? el("p", { id: "whatif-running", class: "muted", "data-for": run.account, "data-panel": account }, runningText(account)) : null,
    shown && !(run && run.account === account) ? whatifResult(shown) : null);
}

const turnText = (t) => (!t || (t.ahead === 0 && t.running_s === null) ? "The what-if is starting…"
  : t.running_s === null ? `Waiting for ${t.ahead} what-if${t.ahead > 1 ? "s" : ""} ahead of yours (one runs at a time)…`
  : `The what-if is running: ${t.steps ? `${Math.floor(100 * t.step / t.steps)}% of its work done, ` : ""}${dur(t.running_s)} so far (4 weeks: about a minute on an idle server, minutes on a busy one)…`);

async function budgetPage(first) {
  if (first && new URLSearchParams(location.search).has("account")) {  // a bookmarked or sent review
    budgetState.account = new URLSearchParams(location.search).get("account").trim();
  }
  const q = new URLSearchParams();
  if (budgetState.account !== null) q.set("account", budgetState.account);
  const data = await api(`/ui/api/budget?${q}`);
  if (budgetState.account === null) budgetState.account = data.account;
  budgetState.children = data.children;
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
    td(el("button", { type: "button", class: "whatif", on: { click: () => { budgetState.whatif = c.account; budgetState.shares = null; refresh(); } } }, "what if…"))));
  const chosen = data.children.find((c) => c.account === budgetState.whatif);
  main(el("h1", {}, `Budget review: ${data.account || "the programs"}`),
    el("div", { class: "filters" }, input, el("datalist", { id: "b-managed" }, data.managed.map((a) => el("option", { value: a })))),
    el("p", { id: "budget-period", "data-start": data.start, "data-at": data.at, class: "muted" },
      "Each child's shares of its parent, and over the last 4 weeks (", timeEl(data.start), " – ", timeEl(data.at),
      "): funded usage, owed (its share of the capacity, capped hour by hour by its demand) and delivered."),
    table(["account", "kind", "RawShares", "NormShares", "usage GPU-h", "owed GPU-h", "delivered GPU-h", "delivered/owed (by period, capped at 100%)", ""],
      rows, { id: "budget" }),
    chosen ? whatifPanel(chosen) : null);
  if (first) watchSoon(0);  // (then every few seconds while the page is in view: `watchTurn`)
}
