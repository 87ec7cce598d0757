// gpu-ledger dashboard: the login page and the loop (loaded last: it starts the page; the
// pages are in jobs.js, views.js and budget.js, the charts in charts.js, the helpers and
// the API client in base.js, times in times.js). Times in the viewer's time zone.
"use strict";

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

// --- the loop -------------------------------------------------------------------------------

const PAGES = { teams: teamsPage, queue: queuePage, finished: finishedPage, job: jobPage, nodes: nodesPage, decisions: decisionsPage,
  preemptions: preemptionsPage, budget: budgetPage };
let ME = null;
let timer = null;
let started = false;

// A page's read of this tab unanswered by the server for SILENT_MS (`unansweredFor`: waiting
// behind another tab's read is not counted, `pageRead` bounds it) is said in the status line,
// counting, until it answers: a hung server, or a network that drops its packets, left
// "updated …" there for good. One ticker says it (`watch`), counting from the oldest read asked
// since the page was last drawn: a refresh a click began while a read hung let the superseded
// one's timer run on, the line flipping between two counters, and took the line as the page
// shown, saying "nothing new shown" over rows on the screen (atk57-29 F2, F3). The same ticker
// looks at the server every 2 s while the tab is shown (`lookAtServer`, base.js), whatever the
// page's refresh period: a look unanswered for its limit says "the server is not answering
// (N s)", counting from that look, so a paused server is said within seconds in every tab
// (atk60-29 F1), and once a look is answered again the page updates at once. A read unanswered
// while the looks asked since it are answered is this tab's, not the server's: said as such,
// and given up and asked again at 20 s (READ_TIMEOUT_MS; it blamed the server and was never
// asked again, atk60-29 F2).
const SILENT_MS = 10000;
let drawn = 0;       // when the page was last drawn (Date.now())
let updated = null;  // what the status line said then ("updated 12:34:56")
let updating = false;  // a refresh is under way
let blamed = false;    // the status line says the server does not answer

function watch() {
  if (updating || document.visibilityState !== "hidden") lookAtServer();
  const read = unansweredFor(drawn), looked = unheardFor();
  const shown = updated ? `the page shown was ${updated}` : "nothing shown yet";
  if (looked > 0 || (read >= SILENT_MS && heardAt < Date.now() - read)) {
    blamed = true;
    status(`the server is not answering (${Math.round(Math.max(read, looked) / 1000)} s); ${shown}`, true);
  } else if (read >= SILENT_MS) {
    status(`this tab's read has not been answered (${Math.round(read / 1000)} s) though the server answers (a slow read, or this tab's network); asked again every ${READ_TIMEOUT_MS / 1000} s; ${shown}`, true);
  } else if (blamed && !updating) {
    blamed = false;  // answered again: the page updated now, not at its next timed update
    poll();
  }
}

async function refresh() {
  clearTimeout(timer);
  const mine = ++refreshes;
  updating = true;
  try {
    await PAGES[PAGE](!started);
    started = true;
    drawn = Date.now();
    updated = `updated ${new Date(drawn).toLocaleTimeString(undefined, { hourCycle: "h23" })}`;
    blamed = false;
    status(updated);
  } catch (err) {
    // superseded (its answer, or its failure: a hung read given up), the later refresh draws,
    // says and times the next
    if (err instanceof Superseded || mine !== refreshes) return;
    status(`could not update: ${err.message}`, true);
    // nothing shown yet (a bad page address, say): the one line says why, not a blank page
    if (!started) main(el("p", { class: "err", id: "page-error" }, err.message));
  } finally {
    if (mine === refreshes) updating = false;
  }
  if (mine === refreshes) timer = setTimeout(poll, POLL_MS[PAGE]);
}

// Who is signed in, asked until the server answers: a tab opened while the server was down or
// restarting (or refused her turn past its retries) stayed blank for good, the one failure
// uncaught (atk57-29 F4). Each failure is said in the status line with when it is asked again.
async function whoami() {
  for (let tries = 0; ; tries++) {
    try {
      const asked = Date.now();
      const me = await api("/v1/whoami", RETRIES_429, PAGE_LOCK_MS);
      heard(asked);  // its round trip the first measure of the looks' (`lookLimit`)
      return me;
    } catch (err) {
      if (err instanceof SignedOut) throw err;  // the login page is being opened
      const wait = Math.min(5, 2 ** tries);
      status(`could not ask the server who is signed in (${err.message}); asking again in ${wait} s`, true);
      await new Promise((done) => setTimeout(done, wait * 1000));
    }
  }
}

function poll() {  // the timed update, once nobody types in the page's fields (`editing`)
  clearTimeout(timer);
  if (editing()) timer = setTimeout(poll, 1000);
  else refresh();
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
  ME = await whoami();
  document.getElementById("who").textContent = `${ME.actor}${ME.admin ? " (admin)" : ""}`;
  setInterval(watch, 1000);
  await refresh();
}

start();
