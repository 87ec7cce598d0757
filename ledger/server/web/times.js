// gpu-ledger dashboard: how times and durations are shown on every page (loaded first;
// it uses base.js's `el` when called). Times in the viewer's one time zone, UTC on hover.
"use strict";

// The one form of a time on every page: 24-hour, in the viewer's zone (named in the footer).
const SHORT = { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hourCycle: "h23" };
const LONG = { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" };

const SHORT_YEAR = { year: "numeric", ...SHORT };  // a time of another year says its year

function when(at, form) {
  if (at === null || at === undefined) return "—";
  const d = new Date(at * 1000);
  const shown = form === SHORT && d.getFullYear() !== new Date().getFullYear() ? SHORT_YEAR : form || LONG;
  return d.toLocaleString(undefined, shown);
}

function utc(at) {
  return new Date(at * 1000).toISOString().replace(/\.\d+Z$/, "Z").replace("T", " ");
}

// A time in the viewer's time zone (the page's one zone, named in the footer), UTC on hover.
function timeEl(at) {
  if (at === null || at === undefined) return "—";
  const d = new Date(at * 1000);
  const short = when(at, SHORT);
  return el("time", { datetime: d.toISOString(), title: `${when(at)} here; ${utc(at)} (UTC)` }, short);
}

// A text from the server with its UTC times ("2026-11-29 12:00:00Z") in the viewer's zone.
const UTC_TEXT = /\b(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)Z/g;

function localised(text) {
  const out = [];
  let last = 0;
  for (const m of String(text).matchAll(UTC_TEXT)) {
    out.push(text.slice(last, m.index), timeEl(Date.parse(`${m[1]}T${m[2]}Z`) / 1000));
    last = m.index + m[0].length;
  }
  out.push(String(text).slice(last));
  return out;
}

// The same as plain text (an SVG title, which holds no elements).
function localisedText(text) {
  return String(text).replace(UTC_TEXT, (_, d, t) => when(Date.parse(`${d}T${t}Z`) / 1000, SHORT));
}

function dur(s) {
  if (s === null || s === undefined) return "—";
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.round(s / 60)}m`;
  if (s < 86400) return `${(s / 3600).toFixed(1)}h`;
  return `${(s / 86400).toFixed(1)}d`;
}


// The server's clock as the browser can tell it (each answer's Date header, to the second): a
// running job's elapsed and remaining time count from its start on that clock, every second,
// never from the moment a kept answer was computed (up to seconds old) nor the browser's own.
let serverSkew = null;

function heardFrom(date) {
  const at = Date.parse(date || "");
  if (Number.isNaN(at)) return;
  const skew = (at + 500) / 1000 - Date.now() / 1000;  // the header's second, at its middle
  if (serverSkew === null || Math.abs(skew - serverSkew) > 1) serverSkew = skew;
}

function serverNow() {
  return Date.now() / 1000 + (serverSkew || 0);
}

// A duration like squeue's TIME and TIME_LEFT: [d-]h:mm:ss.
function clock(s) {
  if (s === null || s === undefined) return "—";
  const t = Math.max(0, Math.floor(s)), d = Math.floor(t / 86400), h = Math.floor((t % 86400) / 3600);
  const mmss = `${String(Math.floor((t % 3600) / 60)).padStart(2, "0")}:${String(t % 60).padStart(2, "0")}`;
  return `${d ? `${d}-${String(h).padStart(2, "0")}` : h}:${mmss}`;
}

// A running job's elapsed time or time left, kept counting by `tick` (null: not running).
function ticking(kind, since, limit) {
  if (since === null || since === undefined || (kind === "remaining" && (limit === null || limit === undefined))) {
    return el("span", { class: "muted" }, "—");
  }
  const span = el("span", { "data-tick": kind, "data-since": since, "data-limit": limit ?? "" });
  tickOne(span);
  return span;
}

function tickOne(span) {
  const elapsed = Math.max(0, serverNow() - Number(span.dataset.since));
  const shown = span.dataset.tick === "elapsed" ? elapsed : Math.max(0, Number(span.dataset.limit) - elapsed);
  span.textContent = clock(shown);
  span.dataset.seconds = String(Math.floor(shown));
}

setInterval(() => document.querySelectorAll("[data-tick]").forEach(tickOne), 1000);
