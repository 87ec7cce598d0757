// gpu-ledger dashboard: the charts (SVG drawn here, no library): a team's owed and
// delivered, a job's timeline, the decided cycles.
"use strict";

function svg(tag, attrs, ...kids) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}

function colour(key) {
  let h = 0;
  for (const c of String(key)) h = (h * 31 + c.charCodeAt(0)) % 997;
  return `hsl(${Math.round(h * 137.508) % 360}, 55%, 42%)`;
}

// A bucket's GPU-hours scaled to a whole bucket by the part of [start, end) it covers, drawn
// from where that part starts: the buckets start on whole hours (the server's `origin`), so the
// first and the last ("now") cover part of one and, unscaled, a constant delivery rose at the
// start and dipped at "now" by up to 22% (atk50-29 F6). One covering under a minute is left out.
function perBucket(points, start, end, bucket) {
  return points.flatMap((p) => {
    const covered = Math.min(p.at + bucket, end) - Math.max(p.at, start), k = bucket / covered;
    return covered < 60 ? [] : [{ at: Math.max(p.at, start), owed_gpu_hours: p.owed_gpu_hours * k,
      delivered_gpu_hours: p.delivered_gpu_hours * k }];
  });
}

function teamChart(series, start, end, bucket) {
  const W = 300, H = 110, L = 34, B = 16;
  const pts = perBucket(series.points, start, end, bucket);
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
