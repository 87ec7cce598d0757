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

// A page's read unanswered for SILENT_MS (its own, or another tab's it waits for: `pageRead`,
// `unansweredFor`) is said in the status line, "the server is not answering (N s)", counting,
// until it answers: a hung server, or a network that drops its packets, left "updated …" there
// for good. Waiting behind other tabs' reads that are answered is not said.
const SILENT_MS = 10000;

async function refresh() {
  clearTimeout(timer);
  const mine = ++refreshes, asked = Date.now(), shown = document.getElementById("status").textContent;
  const silent = setInterval(() => {
    const quiet = unansweredFor(asked);
    if (quiet >= SILENT_MS) status(`the server is not answering (${Math.round(quiet / 1000)} s); ${shown.startsWith("updated") ? `the page shown was ${shown}` : "nothing new shown"}`, true);
  }, 1000);
  try {
    await PAGES[PAGE](!started);
    started = true;
    status(`updated ${new Date().toLocaleTimeString(undefined, { hourCycle: "h23" })}`);
  } catch (err) {
    if (err instanceof Superseded) return;  // the later refresh draws, says and times the next
    status(`could not update: ${err.message}`, true);
    // nothing shown yet (a bad page address, say): the one line says why, not a blank page
    if (!started) main(el("p", { class: "err", id: "page-error" }, err.message));
  } finally {
    clearInterval(silent);
  }
  if (mine === refreshes) timer = setTimeout(poll, POLL_MS[PAGE]);
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
  ME = await api("/v1/whoami");
  document.getElementById("who").textContent = `${ME.actor}${ME.admin ? " (admin)" : ""}`;
  await refresh();
}

start();
