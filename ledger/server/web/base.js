// gpu-ledger dashboard: the constants, the small DOM helpers and the API client every page
// uses (hand-written, no dependencies; loaded after times.js, before the pages and app.js).
// Each page asks /ui/api/* with the bearer token kept in localStorage.
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

// Times and durations (when, timeEl, localised, dur, clock, ticking, serverNow): times.js.

function num(x, digits) {
  if (x === null || x === undefined) return "—";
  return Number(x).toFixed(digits === undefined ? 2 : digits);
}

function pct(x) {
  return x === null || x === undefined ? "—" : `${(100 * x).toFixed(1)}%`;
}

// a table in its own box: wider than the window, it scrolls sideways there, never the page
function table(head, rows, attrs) {
  return el("div", { class: "scroll" }, el("table", attrs || {},
    el("thead", {}, el("tr", {}, head.map((h) =>
      el("th", { class: /^[#]|GPU|Shares|Usage|LevelFS|FairShare|owed|delivered|burst|by |\bcount|placed|preempted|considered/i.test(h) ? "num" : null }, h)))),
    el("tbody", {}, rows)));
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

class SignedOut extends Error {}  // the token refused (401): the login page is being opened

// `timeoutMs`: each try given up (an AbortSignal's TimeoutError) when its answer has not come
// in that time (a hung server, or a network that drops its packets, never answers: atk55-29 F4)
async function api(path, retries = RETRIES_429, timeoutMs = 0) {
  const signal = timeoutMs > 0 ? AbortSignal.timeout(timeoutMs) : undefined;
  const resp = await fetch(path, { headers: { Authorization: `Bearer ${token()}` }, signal });
  if (resp.status === 429 && retries > 0) {
    const wait = Math.min(5, Number(resp.headers.get("Retry-After")) || 1);
    await new Promise((done) => setTimeout(done, wait * 1000 * (0.5 + Math.random())));
    return api(path, retries - 1, timeoutMs);
  }
  if (resp.status === 401) {
    signOut();
    throw new SignedOut("signed out");
  }
  heardFrom(resp.headers.get("Date"));
  const body = await resp.json();
  if (!resp.ok) throw Object.assign(new Error(body.detail || `${resp.status}`), { param: body.param || null });
  return body;
}

function signOut() {  // the token refused (a 401, to a read or to a look): the login page
  localStorage.removeItem(TOKEN_KEY);
  location.assign(`/ui/login?next=${encodeURIComponent(location.pathname + location.search)}`);
}

// A page's read (its first and its timed ones) waits for the one under way in another tab of
// this browser, not beside it: a person's reads are 2 at once (docs/security.md, row T5), so
// her tabs' timed reads arriving together (a slow server, a laptop waking) were refused each
// other's turn, a 429 in the console for each, the page asked again later (issue 29). The wait
// is bounded by PAGE_LOCK_MS counted from when the read holding the lock was asked (its tab
// writes that time, READ_ASKED_KEY, and removes it once answered): the server answers a read
// within its 10 s limit (an 8 s wait for the worker on PostgreSQL), and another tab's read that
// hangs (a paused server, a network that drops its packets) would otherwise hold this tab's for
// good. A holder asked longer ago than that is read beside at once; a younger one is waited for
// what is left of the bound. (Counted from each waiter's own wait, every read of every other
// tab waited the whole 20 s behind a hung one, for as long as it hung: one update per 25 s,
// atk57-29 F1.) Another browser of hers (another profile, another machine) shares no lock: its
// reads and this one's may still be refused each other's turn and asked again (`api`). The
// what-if's look at its turn is no read of the pool: it never waits here.
const PAGE_LOCK_MS = 20000;
const PAGE_LOCK = "gpuledger-page-read";
const READ_ASKED_KEY = "gpuledger.pageReadAsked";  // when the read holding the lock was asked

// this tab's page reads asked of the server and not answered yet (`unansweredFor`)
const unanswered = new Set();

// Each `refresh` (app.js) counts one; an answer that comes after a later refresh began (a sort,
// a filter or a page chosen while it was under way, or waited behind another tab's) is not
// drawn: `Superseded`, which that refresh drops, the later one drawing its own. Drawn, it put
// the old rows under the new header (the queue sorted by user showed its rows in dispatch order).
let refreshes = 0;

class Superseded extends Error {}

async function pageRead(path) {
  const mine = refreshes;
  const ask = async (holding) => {  // `holding` the lock: its asked time is the other tabs' bound
    // a read a later refresh replaced while it waited is never asked (atk58-29 F3: a sort
    // clicked six times behind a hung read asked all six once the bound passed, three 429s)
    if (refreshes !== mine) throw new Superseded(path);
    const asked = { at: Date.now() };
    unanswered.add(asked);
    if (holding) localStorage.setItem(READ_ASKED_KEY, String(asked.at));
    try {
      for (;;) {
        try {
          return await api(path, RETRIES_429, READ_TIMEOUT_MS);
        } catch (err) {
          if (err.name !== "TimeoutError") throw err;
          await heardAfter(Date.now(), mine, path);  // given up: asked again once the server answers a look
        }
      }
    } finally {
      unanswered.delete(asked);
      if (holding) localStorage.removeItem(READ_ASKED_KEY);
    }
  };
  let answer;
  if (!navigator.locks) answer = await ask(false);  // (not a secure context: no lock to share)
  else {
    const taken = {};  // the lock is another tab's (or this tab's superseded read's)
    const waited = Date.now();
    answer = await navigator.locks.request(PAGE_LOCK, { ifAvailable: true }, (lock) => (lock ? ask(true) : taken));
    // waited for while the read holding it is younger than PAGE_LOCK_MS; past what was left,
    // a holder asked since (the hung one answered, the next one asking) is waited for again
    while (answer === taken) {
      const left = PAGE_LOCK_MS - (Date.now() - holderAsked(waited));
      if (left <= 0) {
        answer = await ask(false);  // the other tab's read is not answered: this one is asked beside it
        break;
      }
      let granted = false;
      try {
        answer = await navigator.locks.request(PAGE_LOCK, { signal: AbortSignal.timeout(left) }, () => {
          granted = true;
          return ask(true);
        });
      } catch (err) {
        if (granted || err.name !== "TimeoutError") throw err;
      }
    }
  }
  if (refreshes !== mine) throw new Superseded(path);
  return answer;
}

// When the read holding the lock was asked, as its tab wrote it; a time not written (yet, or
// removed: site data cleared), not a number, or later than now (another tab's clock stepped
// back, a hand's edit) is none, and the wait counts from this tab's own, `waited`: read as
// "asked now", a hung holder held this tab's reads for good, each pass waiting 20 s more, and a
// time out of range made every read fail (atk58-29 F1, F2).
function holderAsked(waited) {
  const at = Number(localStorage.getItem(READ_ASKED_KEY) ?? NaN);
  return Number.isFinite(at) && at > 0 && at <= Date.now() ? at : waited;
}

// How long this tab's oldest page read asked at or after `since` (when the page was last drawn)
// has gone unanswered by the server, 0 if none: waiting behind another tab's read is no read
// of this tab's, and the server is not blamed for it (another tab's read that hangs may be its
// own network's; the wait is bounded, `pageRead`, and this tab's own read counts from when it
// is asked: atk57-29 F1).
// A read given up and asked again (READ_TIMEOUT_MS) counts from its first asking, and a
// superseded read given up while a later one is out leaves the count where it was (one counter).
let oldestOut = null;

function unansweredFor(since) {
  const asked = [...unanswered].map((a) => a.at).filter((at) => at >= since);
  if (!asked.length) {
    oldestOut = null;
    return 0;
  }
  oldestOut = oldestOut !== null && oldestOut >= since ? Math.min(oldestOut, ...asked) : Math.min(...asked);
  return Date.now() - oldestOut;
}

// A page read not answered in READ_TIMEOUT_MS is given up and asked again (it had no time
// limit: a read held by this tab's network hung for good, the page never updated again,
// atk60-29 F2). The server answers a read within its own 10 s limit (of the read's CPU, 20 s
// of the server running at most; an 8 s wait for the worker before it); past 20 s the read is
// lost on the way (a dropped connection, a proxy) or the server is paused: it is asked again
// once the server answers a look, so a paused server is not asked a read every 20 s that it
// would all answer once it runs again.
const READ_TIMEOUT_MS = 20000;

async function heardAfter(since, mine, path) {
  while (heardAt < since) {
    if (refreshes !== mine) throw new Superseded(path);
    lookAtServer();
    await new Promise((done) => setTimeout(done, 500));
  }
  if (refreshes !== mine) throw new Superseded(path);
}

// Whether the server answers at all, looked at every SERVER_LOOK_EVERY_MS while the tab is
// shown or its update is under way, whatever the page's own refresh period (`watch`, app.js).
// The look is `/v1/whoami`, answered on the server's event loop (no read of the pool, none of
// her 2 at once), one at a time; a look unanswered for its limit (`lookLimit`) means the server
// does not answer (any answer, a 429 or a 401 too, means it does). A read that hangs on this
// tab's or another tab's network leaves the looks answered: the server is not blamed for it.
// Looked at only while an update was under way, a page refreshed every 15-30 s (Teams,
// Budget, Preemptions, Finished) said a paused server 18-33 s after it stopped, or never for a
// 15-22 s pause, its line saying "updated …" meanwhile (atk60-29 F1). A tab waiting behind
// another tab's read (`pageRead`) asks nothing of its own for up to 20 s: the looks say it.
const SERVER_LOOK_EVERY_MS = 2000;
const SERVER_LOOK_MS = 3000;
let looking = null;    // the look out ({at}), null when none
let lookedAt = 0;      // when the last look was asked (one every SERVER_LOOK_EVERY_MS at most)
let unheardSince = null;  // when the first look not answered since the last answer was asked
let heardAt = 0;       // when a look (or the first whoami) was last answered
const roundTrips = [];  // the last answered looks' round trips, ms

function lookAtServer() {
  if (looking || Date.now() - lookedAt < SERVER_LOOK_EVERY_MS) return;
  const look = { at: Date.now() };
  looking = look;
  lookedAt = look.at;
  unheardSince ??= look.at;
  fetch("/v1/whoami", { headers: { Authorization: `Bearer ${token()}` }, signal: AbortSignal.timeout(PAGE_LOCK_MS) })
    .then((resp) => {
      heard(look.at);
      if (resp.status === 401) signOut();  // revoked: out now, not at the next read (atk61-29a F4)
      return resp.text();
    })
    .catch(() => {})  // given up or refused: unheard still, the next look asked
    .finally(() => {
      if (looking === look) looking = null;
    });
}

function heard(asked) {  // an answer to a look (or to the first whoami) asked at `asked`
  const now = Date.now();
  if (asked >= (unheardSince ?? 0)) unheardSince = null;
  heardAt = now;
  roundTrips.push(now - asked);
  if (roundTrips.length > 5) roundTrips.shift();
}

// How long a look may go unanswered before the server is said not to answer: SERVER_LOOK_MS,
// or twice the median of the last looks' round trips and a second, whichever is longer. A
// network slow by 1.2 s each way flashed "the server is not answering (3 s)" while the server
// answered everything (atk60-29 F3); the median leaves out the one look held across a pause.
function lookLimit() {
  if (!roundTrips.length) return SERVER_LOOK_MS;
  const sorted = [...roundTrips].sort((a, b) => a - b);
  return Math.max(SERVER_LOOK_MS, 2 * sorted[Math.floor(sorted.length / 2)] + 1000);
}

// How long the server has not answered this tab's looks, 0 if it has (or under `lookLimit`)
function unheardFor() {
  const quiet = unheardSince === null ? 0 : Date.now() - unheardSince;
  return quiet >= lookLimit() ? quiet : 0;
}

async function post(path, body) {
  return answered(await posted(path, body), path);
}

function posted(path, body, signal) {
  return fetch(path, { method: "POST", body: JSON.stringify(body), signal,
    headers: { Authorization: `Bearer ${token()}`, "Content-Type": "application/json" } });
}

// A POST answered in lines of JSON (application/x-ndjson): {"turn": …} where it stands, as it
// moves and every 2 s at least (so a proxy's read timeout is never reached while it waits or
// works), given to onTurn; then {"result": …} (returned) or {"error": …} (thrown). Any other
// answer (a refusal before it began, a proxy's page) is read as post() reads it. `signal`:
// aborted, the request (or its stream) is closed, and the promise rejects with an AbortError.
async function streamed(path, body, onTurn, signal) {
  const resp = await posted(path, body, signal);
  if (!(resp.headers.get("Content-Type") || "").startsWith("application/x-ndjson")) return answered(resp, path);
  const reader = resp.body.getReader(), text = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    buf += done ? text.decode() : text.decode(value, { stream: true });
    for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
      const frame = JSON.parse(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
      if (frame.error) throw new Error(frame.error.detail);
      if ("result" in frame) return frame.result;
      onTurn(frame.turn);
    }
    if (done) throw new Error("the answer was cut before its end (the server, or a proxy in front of it, closed it)");
  }
}

async function answered(resp, path) {
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

// someone is typing in one of the page's fields: a redraw now would replace it under the cursor
// and take the half-typed text as the filter (atk51-29 F1); timed updates wait for it
const editing = () => document.activeElement?.matches("#main input, #main select, #main textarea") ?? false;

function main(...kids) {
  const m = document.getElementById("main");
  m.replaceChildren(...kids.filter((k) => k !== null && k !== undefined && k !== false));
}

// a value of the address named in a page's note: cut past 60 characters, its length said (a
// 1,025-character `account=` was named whole, atk61-29c F4)
const cutValue = (v) => (String(v).length > 60 ? `${String(v).slice(0, 60)}… (${String(v).length.toLocaleString()} characters)` : String(v));

// what a page dropped from its address, said beside its filters (`filterNote`) until a filter
// is changed: the Queue's and Finished's rule, on Preemptions, Budget and Decisions too
const droppedNote = (said) => (said.length ? el("span", { class: "err", id: "filter-error" }, said.join("; ")) : null);

function toUrl(q) {  // a page's state in its URL, replaced (no history entry per change)
  const url = `${location.pathname}${q.size ? "?" + q : ""}`;
  if (url !== location.pathname + location.search) history.replaceState(null, "", url);
}
