"""The Teams page's charts in Debian's chromium, on the package's own scripts and a series shaped
as the server sends it (no server: the chart is the page's drawing of what it is given)."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Browser

from tests.integration.test_dashboard import browser  # noqa: F401 (the fixture)

WEB = Path(__file__).resolve().parents[2] / "ledger" / "server" / "web"
SHELL = '<!doctype html><html><body data-page="none"><main id="main"></main></body></html>'


def test_a_constant_delivery_draws_a_flat_line_to_its_ends(browser: Browser) -> None:  # noqa: F811
    """atk50-29 F6: 46 GPUs busy the whole week drew 184 GPU-h a bucket but the first and last
    bucket (the window starts and ends inside an hour): the line rose at the start and dipped
    at "now". Each bucket is drawn scaled by the part of the window it covers."""
    hour, bucket = 3600.0, 4 * 3600.0
    start = 277_000 * hour + 2421  # :40:21, as asked at any minute
    end = start + 7 * 86400
    origin = start // hour * hour  # the buckets start on start's hour (the server's origin)
    points = []
    at = origin
    while at < end:
        covered = (min(at + bucket, end) - max(at, start)) / hour
        points.append(
            {"at": at, "owed_gpu_hours": 50 * covered, "delivered_gpu_hours": 46 * covered}
        )
        at += bucket
    assert points[0]["delivered_gpu_hours"] < 184 and points[-1]["delivered_gpu_hours"] < 184
    page = browser.new_page()
    try:
        page.set_content(SHELL)
        for name in ("times.js", "base.js", "charts.js"):
            page.add_script_tag(content=(WEB / name).read_text())
        series = {"team": "prog0/proj0", "points": points}
        drawn = page.evaluate(
            """([series, start, end, bucket]) => {
                const chart = teamChart(series, start, end, bucket);
                return [...chart.querySelectorAll("path")].map((p) => p.getAttribute("d"));
            }""",
            [series, start, end, bucket],
        )
    finally:
        page.close()
    for d in drawn:  # owed, then delivered: every point at one height, the first at the axis
        xs = [float(x) for x in re.findall(r"[ML]([\d.]+),", d)]
        ys = {float(y) for y in re.findall(r",([\d.]+)", d)}
        assert len(ys) == 1, d
        assert xs[0] == 34.0 and len(xs) == len(points), d
