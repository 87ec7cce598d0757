// gpu-ledger dashboard: the Budget review page and its what-if.
"use strict";

// --- budget review ------------------------------------------------------------------------

// `run`: the caller's what-if under way ({account, turn}; one of a person's at a time), its
// result or error kept under its own account (`results`, `errors`): a second child's "what
// if…" while one ran showed the first's progress under the second's heading and lost its
// result (atk52-29 F1)
// (`run.elsewhere`: one asked in another tab or browser of hers, `watchTurn`; `ended`: the last such)
// (`lost`: hers whose server stopped answering before its end, {account, shares, why})
// (`silent`: since when (ms) the server has not answered about hers under way; null: it answers)
const budgetState = { account: null, whatif: null, shares: null, children: [], run: null, results: {}, errors: {}, ended: null, lost: null, silent: null };

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
    else if (m.data.lost && budgetState.run?.elsewhere) lostWith(budgetState.run, m.data.lost);
    else if (m.data.ended) budgetState.endedWell = m.data.ok;
  };
}

async function runWhatif(child, shares) {
  const account = child.account;
  // (`heard`: when its stream last said something; `gaveUp`: aborted once the server has not
  // answered for GIVE_UP_MS)
  const run = budgetState.run = { account, shares, turn: null, heard: Date.now(), gaveUp: new AbortController() };
  budgetState.ended = budgetState.lost = null;
  budgetState.epoch += 1;  // (a look at the turn asked before this is stale)
  delete budgetState.results[account];
  delete budgetState.errors[account];
  redrawPanel();  // (its panel from what the tab holds: the page's read may wait, or be refused 429)
  // where it stands (its place in line, then its step), streamed as it moves (atk50-29 F3: it
  // said "running" while it waited; F2: nothing came until the answer, and a proxy gave up)
  // (each line only rewrites that line: a whole redraw per line fetched the page again and
  // replaced its fields under the cursor, atk51-29 F1)
  const said = (turn) => {
    if (tabs && run.turn === null) tabs.postMessage({ started: account });  // (the server has it now)
    run.turn = turn;
    run.heard = Date.now();
    silentEnd();
    const line = document.getElementById("whatif-running");
    if (line) line.textContent = runningText(line.dataset.panel);
  };
  try {
    budgetState.results[account] = await streamed("/ui/api/budget/whatif?stream=true", { account, shares }, said, run.gaveUp.signal);
  } catch (err) {
    budgetState.epoch += 1;
    silentEnd();
    if (/under way/.test(err.message)) {  // one of hers asked elsewhere (another browser)
      budgetState.run = null;
      watchSoon(0);
      return;
    }
    // the stream broke once the server had it (killed, restarted, a proxy's cut: the server
    // ends a what-if whose client left), or this tab closed it after GIVE_UP_MS of silence:
    // lost, said so, and Run is back (atk54-29 F5: the tab said "running" for good, its
    // redraw failing against a server that was gone)
    const gaveUp = run.gaveUp.signal.aborted;
    if (run.turn !== null && (gaveUp || err instanceof TypeError || /cut before its end/.test(err.message))) {
      const why = gaveUp ? "silent" : "stopped";
      lostWith(run, why);
      if (tabs) tabs.postMessage({ ended: account, lost: why });
      watchSoon(0);  // (a server that answers again and still has it: shown)
      return;
    }
    budgetState.errors[account] = gaveUp ? `the server did not answer in ${GIVE_UP_MS / 1000} s: try again once it is back`
      : err instanceof TypeError ? `the server did not answer (${err.message}): try again once it is back` : err.message;
  }
  budgetState.epoch += 1;
  if (tabs) tabs.postMessage({ ended: account, ok: !(account in budgetState.errors) });
  silentEnd();
  budgetState.run = null;
  redrawPanel();
}

// her what-if (asked here or elsewhere) went with a server that stopped answering: `why`
// "stopped" (its stream broke, or her tab that asked it said so), "restarted" (another start of
// the server answers, and it has none of hers) or "silent" (no answer for GIVE_UP_MS)
function lostWith(run, why = "stopped") {
  silentEnd();
  budgetState.lost = { account: run.account, shares: run.shares, why };
  budgetState.run = null;
  redrawPanel();
}

// the panel redrawn from what the tab holds (a server gone cannot stop it: its Run comes back),
// then the whole page asked again unless someone types (or `ask` is false)
function redrawPanel(ask = true) {
  const panel = document.getElementById("whatif");
  const chosen = budgetState.children.find((c) => c.account === budgetState.whatif);
  if (panel && chosen) panel.replaceWith(whatifPanel(chosen));
  if (ask && !editing()) refresh();
}

// The server not answering about hers under way (atk55-29 F2: one failed look, a network blip,
// a proxy's 502 or a 429, said it was lost while it ran; F4: a hung server left every tab saying
// "running" for good, its looks and stream waiting with no timeout): a look unanswered in
// LOOK_MS, or the asking tab's stream quiet for QUIET_MS (it sends a line every 2 s), is said in
// one line, "the server is not answering (N s)", its Run still waiting; an answer ends it
// (shown again, ended, or lost: `seen`); past GIVE_UP_MS without one, hers is taken as lost
// (the asking tab closes its stream: the server ends a what-if whose client left).
const LOOK_MS = 8000;
const QUIET_MS = 8000;
const GIVE_UP_MS = 60000;
let silentTimer = null;

function silentSince(since) {
  if (budgetState.run === null) return;
  if (budgetState.silent === null) {
    budgetState.silent = since;
    redrawPanel(false);
    silentTimer = setInterval(silentTick, 1000);
  }
  silentTick();
}

function silentTick() {
  const run = budgetState.run;
  if (run === null || budgetState.silent === null) { silentEnd(); return; }
  const quiet = Date.now() - budgetState.silent;
  if (quiet >= GIVE_UP_MS) {
    if (run.elsewhere) lostWith(run, "silent");
    else run.gaveUp.abort();  // (its catch says it was lost)
    return;
  }
  const line = document.getElementById("whatif-silent");
  if (line) line.textContent = silentText(quiet);
}

function silentEnd() {
  clearInterval(silentTimer);
  silentTimer = null;
  if (budgetState.silent === null) return;
  budgetState.silent = null;
  document.getElementById("whatif-silent")?.remove();
}

function silentText(quiet) {
  const run = budgetState.run;
  return `The server is not answering (${Math.round(quiet / 1000)} s): your what-if of ${run.account} (shares ${run.shares}) ${run.turn?.running_s == null ? "waited for its turn" : "was running"} when it last answered. Run waits: this tab says whether it ended or was lost once the server answers, and takes it as lost after ${GIVE_UP_MS / 1000} s without an answer.`;
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
  const run = budgetState.run;
  if (run !== null && !run.elsewhere) {  // (its stream says where it stands: unless it is quiet)
    if (Date.now() - run.heard >= QUIET_MS) silentSince(run.heard);
  } else {
    const epoch = budgetState.epoch, asked = Date.now();
    watchBusy = true;
    try {
      const t = await api("/ui/api/budget/whatif/turn", RETRIES_429, LOOK_MS);
      if (epoch === budgetState.epoch) seen(t);
    } catch (err) {  // not answered: said, not taken as lost (atk55-29 F2)
      if (epoch === budgetState.epoch && budgetState.run?.elsewhere) silentSince(asked);
    } finally {
      watchBusy = false;
    }
  }
  if (watchAgain) { watchAgain = false; watchSoon(0); }
  else watchSoon(budgetState.run !== null ? WATCH_MS : IDLE_MS);
}

// what the turn route says of her what-if: shown, ended, or lost with the server. The route
// names hers by its number (`id`) in the server's start (`server`) and keeps her last one's end
// (`last`): one seen under another start than the one answering now was lost with the server
// that ran it, killed or restarted (atk55-29 F1: a tab that made no look while it was down,
// hidden, asleep or between two looks, said it had ended and that its result showed elsewhere)
function seen(t) {
  const run = budgetState.run;
  if (run !== null && !run.elsewhere) return;  // (this tab's own began meanwhile)
  silentEnd();
  if (t.account !== null) {
    budgetState.run = { account: t.account, shares: t.shares, turn: t, elsewhere: true, id: t.id, server: t.server };
    budgetState.ended = budgetState.lost = null;
    // (the line rewritten, or the panel drawn with it; the whole page asked again only when
    // hers is new to the tab: with no panel open, each look asked it again, every 2 s)
    const line = document.getElementById("whatif-running");
    if (line && line.dataset.for === t.account) line.textContent = runningText(line.dataset.panel);
    else if (run === null || document.getElementById("whatif")) redrawPanel(run === null);
  } else if (run !== null) {
    if (t.server !== run.server) { lostWith(run, "restarted"); return; }
    const how = t.last !== null && t.last.id === run.id ? t.last.end : null;
    budgetState.ended = { ...run, how, ok: how !== null ? how === "ok" : budgetState.endedWell };
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
    budgetState.lost ? el("p", { id: "whatif-lost", class: "err", "data-why": budgetState.lost.why }, lostText(budgetState.lost)) : null,
    budgetState.ended ? el("p", { id: "whatif-elsewhere", class: "muted" }, endedText(budgetState.ended)) : null,
    run && budgetState.silent !== null ? el("p", { id: "whatif-silent", class: "err" }, silentText(Date.now() - budgetState.silent)) : null,
    run ? el("p", { id: "whatif-running", class: "muted", "data-for": run.account, "data-panel": account }, runningText(account)) : null,
    shown && !(run && run.account === account) ? whatifResult(shown) : null);
}

function lostText(lost) {
  const hers = `Your what-if of ${lost.account} (shares ${lost.shares})`;
  if (lost.why === "restarted") return `${hers} was lost: the server was restarted (or replaced) before its end, and the one answering now never had it (a what-if ends with its server). Run it again.`;
  if (lost.why === "silent") return `${hers} is taken as lost: the server has not answered for ${GIVE_UP_MS / 1000} s (a what-if ends with its server). Run it again once the server is back; if it answers with yours still under way, this tab shows it again.`;
  return `${hers} was lost: the server stopped answering before its end (a what-if ends with its server). Run it again once the server is back.`;
}

function endedText(ended) {
  const how = ended.how === "stopped" ? "it was stopped before its end (the tab that asked it was closed, or its answer cut): it has no result"
    : ended.ok === false ? "it failed; its error shows in that tab" : ended.ok ? "its result shows in that tab" : "its result (or its error) shows in that tab";
  return `Your what-if of ${ended.account} (shares ${ended.shares}), asked in another tab, has ended: ${how}.`;
}

const turnText = (t) => (!t || (t.ahead === 0 && t.running_s === null) ? "The what-if is starting…"
  : t.running_s === null ? `Waiting for ${t.ahead} what-if${t.ahead > 1 ? "s" : ""} ahead of yours (one runs at a time)…`
  : `The what-if is running: ${t.steps ? `${Math.floor(100 * t.step / t.steps)}% of its work done, ` : ""}${dur(t.running_s)} so far (4 weeks: about a minute on an idle server, minutes on a busy one)…`);

const budgetDropped = [];  // an account of the address the server refused (`droppedNote`)

// the page's read; an account the server refuses (`account=nope`) is dropped and said, the
// page drawn for the default: "no open account 'nope'" replaced the page (atk61-29c F4)
async function budgetRead() {
  const q = new URLSearchParams();
  if (budgetState.account !== null) q.set("account", budgetState.account);
  try {
    return await pageRead(`/ui/api/budget?${q}`);
  } catch (err) {
    if (err instanceof Superseded || err.param !== "account" || !budgetState.account) throw err;
    budgetDropped.push(`account=${cutValue(budgetState.account)} dropped: ${err.message}`);
    budgetState.account = null;
    return budgetRead();
  }
}

async function budgetPage(first) {
  if (first && new URLSearchParams(location.search).has("account")) {  // a bookmarked or sent review
    budgetState.account = new URLSearchParams(location.search).get("account").trim();
  }
  const data = await budgetRead();
  if (budgetState.account === null) budgetState.account = data.account;
  budgetState.children = data.children;
  toUrl(new URLSearchParams(data.account ? { account: data.account } : {}));
  const input = el("input", { id: "b-account", list: "b-managed", value: data.account,
    placeholder: "account (empty: the programs)",
    on: { change: (ev) => { budgetState.account = ev.target.value.trim(); budgetState.whatif = null; budgetDropped.length = 0; refresh(); } } });
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
    el("div", { class: "filters" }, input, el("datalist", { id: "b-managed" }, data.managed.map((a) => el("option", { value: a }))), droppedNote(budgetDropped)),
    el("p", { id: "budget-period", "data-start": data.start, "data-at": data.at, class: "muted" },
      "Each child's shares of its parent, and over the last 4 weeks (", timeEl(data.start), " – ", timeEl(data.at),
      "): funded usage, owed (its share of the capacity, capped hour by hour by its demand) and delivered."),
    table(["account", "kind", "RawShares", "NormShares", "usage GPU-h", "owed GPU-h", "delivered GPU-h", "delivered/owed (by period, capped at 100%)", ""],
      rows, { id: "budget" }),
    chosen ? whatifPanel(chosen) : null);
  if (first) watchSoon(0);  // (then every few seconds while the page is in view: `watchTurn`)
}
