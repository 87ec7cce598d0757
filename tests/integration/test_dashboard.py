"""The dashboard in a real browser (Debian's chromium driven by Playwright) against a real
`gpuledger serve` process holding a simulated history: every page loads without a console
error, the figures shown equal the CLI's `--json` on the same ledger, and a plain user never
sees another team's job command. Screenshots go to $GPULEDGER_SCREENSHOTS (docs/img for the
README) or a temporary directory."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from tests.integration.dashkit import SECRET, Dashboard, build, cycled, scrape
from tests.integration.serverkit import Server, cli, make_token, start_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TIMEZONE = "Asia/Tokyo"
SAMPLE = [11.0, 22.0, 33.0, 44.0, 55.0, 66.0, 77.0, 88.0]
READY = {
    "teams": "#shares tbody tr",
    "queue": "#queue tbody tr",
    "nodes": "#nodes .card",
    "decisions": "#decisions tbody tr",
}


@dataclass
class Served:
    dash: Dashboard
    server: Server
    tokens: dict[str, str]
    shots: Path
    sampled: int
    """A running job with a utilisation sample (SAMPLE, one value per GPU)."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("dash")
    dash = build(tmp / "ledger")
    home = dash.home
    cli(home, "manager", "grant", "boss", dash.project_b.split("/")[0], GPULEDGER_USER="root")
    tokens = {
        who: make_token(home, "--user", who) for who in ("root", dash.user_a, dash.user_b, "boss")
    }
    server = start_server(home, "--interval", "1s")
    try:
        cycled(server, 2, 30)
        running = [j for j in json.loads(cli(home, "jobs", "--json").stdout) if j["nodes"]]
        sampled = running[0]["job_id"]
        status, body = server.request(
            "POST",
            "/v1/commands/job.sample",
            {"actor": "", "job_id": sampled, "gpu_utilisation": SAMPLE},
            token=tokens["root"],
        )
        assert status == 200, body
        shots = Path(os.environ.get("GPULEDGER_SCREENSHOTS") or tmp / "shots")
        shots.mkdir(parents=True, exist_ok=True)
        yield Served(dash, server, tokens, shots, sampled)
    finally:
        assert server.stop() == 0, server.log_path.read_text()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"chromium is not installed ({CHROMIUM}); scripts/test installs it", pytrace=False
        )
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=args)
        yield b
        b.close()


@pytest.fixture(autouse=True)
def tabs_closed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every browser a test opened is closed after it. Left open, each kept reading its page
    (the queue, job and nodes pages every 5 s): a later test's tab of the same person met them
    as other browsers of hers, which share no lock with it (`pageRead`), and under load her
    reads at once passed 2, a console 429 in that test (stop 55; s56-tabs at load ~30:
    `test_the_budget_and_preemptions_views_are_in_their_url_and_a_non_decision_is_inline`,
    `test_a_timed_update_waits_while_someone_types_in_a_pages_field`). So a 429 in these
    tests' consoles is a failure: one browser of each person is open at a time here."""
    yield
    if "browser" in request.fixturenames:
        for ctx in request.getfixturevalue("browser").contexts:
            ctx.close()


REFUSED = "Failed to load resource: the server responded with a status of 429 (Too Many Requests)"
"""A read refused 429, in a browser's console: past its person's 2 reads at once (row T5)."""


def beside_her_other_browser(errors: list[str]) -> list[str]:
    """`errors` but the 429s of a person's reads in two browsers of hers at once (the rule of
    row T5, not the tabs' lock: two browsers share no lock, `pageRead`, and their reads arriving
    together, as when her what-if ends and each redraws, may be refused each other's turn; the
    page asks again, `api`). For tests that open two browsers of one person; with one browser
    of each person open, a 429 is a failure (`tabs_closed`, `test_dashboard_tabs.py`)."""
    return [e for e in errors if e != REFUSED]


def signed_in(browser: Browser, token: str) -> BrowserContext:
    ctx = browser.new_context(viewport={"width": 1280, "height": 860}, timezone_id=TIMEZONE)
    ctx.add_init_script(f"localStorage.setItem('gpuledger.token', {json.dumps(token)})")
    return ctx


def watched(ctx: BrowserContext) -> tuple[Page, list[str]]:
    page = ctx.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda err: errors.append(str(err)))
    return page, errors


def visit(
    s: Served, browser: Browser, path: str, ready: str, who: str = "root"
) -> tuple[Page, list[str]]:
    """`path` opened as `who` (watched for errors), once `ready` shows."""
    page, errors = watched(signed_in(browser, s.tokens[who]))
    page.goto(s.server.url + path)
    page.wait_for_selector(ready)
    return page, errors


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cli_json(s: Served, *args: str) -> Any:
    return json.loads(cli(s.dash.home, *args, "--json", GPULEDGER_USER="root").stdout)


def test_every_page_loads_without_a_console_error(served: Served, browser: Browser) -> None:
    s = served
    ctx = signed_in(browser, s.tokens["root"])
    page, errors = watched(ctx)
    base = s.server.url
    status, latest = s.server.request("GET", "/ui/api/decisions?limit=1", token=s.tokens["root"])
    assert status == 200 and latest["rows"], latest
    position = latest["rows"][0]["position"]
    visits = [
        ("teams", "/ui/teams", READY["teams"]),
        ("teams-whole-period", "/ui/teams", "#window-all"),
        ("queue", "/ui/queue", READY["queue"]),
        ("finished", "/ui/finished", "#finished tbody tr"),
        ("job", f"/ui/job?id={s.dash.job_b}", "#job-decisions"),
        ("nodes", "/ui/nodes", READY["nodes"]),
        ("decisions", f"/ui/decisions?position={position}", "#decision"),
        ("preemptions", "/ui/preemptions", "#preempt-summary"),
        ("budget", "/ui/budget", "#budget tbody tr"),
    ]
    for name, path, ready in visits:
        page.goto(base + path)
        page.wait_for_selector(ready)
        if name == "teams-whole-period":
            page.click("#window-all")
            page.wait_for_selector("#window-all[disabled]")
            page.wait_for_selector(READY["teams"])
        if name == "job":
            page.wait_for_function(
                "[...document.querySelectorAll('[data-col=replay]')].every("
                "c => c.textContent !== '…')"
            )
        assert page.locator("#status").inner_text().startswith("updated"), name
        assert page.locator("#tz").inner_text() == TIMEZONE
        page.screenshot(path=str(s.shots / f"{name}.png"))
    assert errors == []
    # the job page shows its timeline and each decision about it beside its replay: identical
    page.goto(f"{base}/ui/job?id={s.dash.job_b}")
    page.wait_for_selector("#job-history tbody tr")
    history = page.locator("#job-history").inner_text()
    assert "job.submitted.v2" in history and "job.placed.v1" in history
    page.wait_for_function(
        "[...document.querySelectorAll('[data-col=replay]')].every(c => c.textContent !== '…')"
    )
    replays = [c.inner_text() for c in page.locator("[data-col=replay]").all()]
    assert replays and set(replays) == {"identical"}, replays
    ctx.close()


def test_the_login_page_keeps_a_good_token_and_refuses_a_bad_one(
    served: Served, browser: Browser
) -> None:
    ctx = browser.new_context()
    page, errors = watched(ctx)
    page.goto(served.server.url + "/ui/queue")
    page.wait_for_url("**/ui/login?next=*")
    page.fill("#token", "glt_nothing_like_a_token")
    page.click("#signin")
    page.wait_for_selector("#login-error:not(:empty)")
    page.fill("#token", served.tokens[served.dash.user_a])
    page.click("#signin")
    page.wait_for_url("**/ui/queue")
    page.wait_for_selector(READY["queue"])
    assert page.locator("#who").inner_text() == served.dash.user_a
    page.click("#signout")
    page.wait_for_url("**/ui/login")
    # the one failed whoami is the browser's own "401" line; nothing else
    assert [e for e in errors if "401" not in e] == []
    ctx.close()


def test_the_figures_shown_equal_the_cli_json(served: Served, browser: Browser) -> None:
    s = served
    ctx = signed_in(browser, s.tokens[s.dash.user_a])
    page, errors = watched(ctx)
    # teams: the tree as of the page's moment, and delivered over the page's window
    page.goto(s.server.url + "/ui/teams")
    page.wait_for_selector(READY["teams"])
    at = float(page.locator("#shares").get_attribute("data-at") or "nan")
    shown = {
        r.get_attribute("data-account"): [
            r.locator(f"[data-col={c}]").inner_text()
            for c in ("norm_shares", "usage", "level_fs", "fair_share")
        ]
        for r in page.locator("#shares tbody tr").all()
    }
    want = {
        r["account"]: [
            f"{r['norm_shares']:.4f}",
            f"{r['raw_usage_gpu_s'] / 3600:.1f}",
            "∞" if r["level_fs_infinite"] else f"{r['level_fs']:.4f}",
            "—" if r["fair_share"] is None else f"{r['fair_share']:.4f}",
        ]
        for r in cli_json(s, "shares", "--at", iso(at))
    }
    assert shown == want
    assert any(v[1] != "0.0" for v in shown.values())  # the history shows up as usage
    for window in ("7d", "all"):
        if window == "all":
            page.click("#window-all")
            page.wait_for_selector("#window-all[disabled]")
        table = page.locator("#delivered")
        start = float(table.get_attribute("data-start") or "nan")
        end = float(table.get_attribute("data-end") or "nan")
        shown_d = {
            r.get_attribute("data-team"): (
                r.locator("[data-col=owed]").inner_text(),
                r.locator("[data-col=delivered]").inner_text(),
            )
            for r in table.locator("tbody tr").all()
        }
        rep = cli_json(
            s, "report", "delivered", "--at", iso(end), "--window", f"{round(end - start)}s"
        )
        want_d = {
            t["team"]: (f"{t['owed_gpu_hours']:.1f}", f"{t['delivered_gpu_hours']:.1f}")
            for t in rep["teams"]
        }
        assert shown_d == want_d and len(want_d) == 4
    assert any(float(d) > 0 for _, d in shown_d.values())
    # queue: the same jobs in the same order with the same codes as `gpuledger queue --json`
    for _ in range(5):
        before = [(q["job_id"], q["code"]) for q in cli_json(s, "queue")]
        page.goto(s.server.url + "/ui/queue")
        page.wait_for_selector(READY["queue"])
        rows = page.locator("#queue tbody tr").all()
        shown_q = [
            (int(r.get_attribute("data-job") or 0), r.locator("[data-col=code]").inner_text())
            for r in rows
        ]
        after = [(q["job_id"], q["code"]) for q in cli_json(s, "queue")]
        if before == after:  # nothing moved while the page read it
            assert shown_q == after and after
            break
    else:
        raise AssertionError("the queue kept changing under five reads")
    # filters: my jobs, then an account
    page.check("#f-mine")
    page.wait_for_function(
        "[...document.querySelectorAll('#queue tbody tr')].every("
        f"r => r.children[2].textContent === {json.dumps(s.dash.user_a)})"
    )
    mine = [q["job_id"] for q in cli_json(s, "queue", "--user", s.dash.user_a)]
    assert [
        int(r.get_attribute("data-job") or 0) for r in page.locator("#queue tbody tr").all()
    ] == mine
    # nodes: the GPU map holds the jobs the node list says, the drained node is marked
    page.goto(s.server.url + "/ui/nodes")
    page.wait_for_selector(READY["nodes"])
    for n in cli_json(s, "node", "list"):
        card = page.locator(f"[data-node={n['node']}]")
        held = {int(x.inner_text().split()[0]) for x in card.locator("a.gpu").all()}
        assert held == set(n["jobs"]), n
        assert card.locator("a.gpu").count() == n["gpus"] - n["free_gpus"]
        assert n["state"] in card.locator("h3").inner_text()
    tiles = page.locator("a.gpu").all()
    shown_util = [
        t.inner_text().split()[1] for t in tiles if t.inner_text().split()[0] == str(s.sampled)
    ]
    assert shown_util == [f"{round(x)}%" for x in SAMPLE]  # one value per GPU, in slot order
    states = {n["state"] for n in cli_json(s, "node", "list")}
    assert {"active", "drained", "lost"} <= states
    assert errors == []
    ctx.close()


def test_a_plain_user_never_sees_another_teams_job_command(
    served: Served, browser: Browser
) -> None:
    s = served
    job = s.dash.job_b
    seen = {}
    for who in ("root", s.dash.user_a, s.dash.user_b, "boss"):
        status, body = s.server.request("GET", f"/ui/api/job/{job}", token=s.tokens[who])
        assert status == 200, body
        seen[who] = (body["private"], SECRET in json.dumps(body))
    assert seen == {
        "root": (True, True),  # admin
        s.dash.user_a: (False, False),  # another team's member
        s.dash.user_b: (True, True),  # its owner
        "boss": (True, True),  # a manager above its account
    }
    ctx = signed_in(browser, s.tokens[s.dash.user_a])
    page, errors = watched(ctx)
    page.goto(f"{s.server.url}/ui/job?id={job}")
    page.wait_for_selector("#job-private")
    assert "only the owner" in page.locator("#job-private").inner_text()
    assert SECRET not in page.content()
    ctx.close()
    ctx = signed_in(browser, s.tokens[s.dash.user_b])
    page, more = watched(ctx)
    page.goto(f"{s.server.url}/ui/job?id={job}")
    page.wait_for_selector("#job-command")
    assert SECRET in page.locator("#job-command").inner_text()
    assert errors == more == []
    ctx.close()


def test_pages_answer_only_signed_in_people(served: Served) -> None:
    s = served
    for path in (
        "/ui/api/teams",
        "/ui/api/queue",
        "/ui/api/nodes",
        "/ui/api/decisions",
        "/metrics",
    ):
        assert s.server.request("GET", path)[0] == 401, path
        assert s.server.request("GET", path, token="glt_bad_secret")[0] == 401, path
    node_token = make_token(s.dash.home, "--user", "root", "--node", "n001")
    assert s.server.request("GET", "/ui/api/queue", token=node_token)[0] == 403
    assert s.server.request("GET", "/ui/job")[0] == 200  # the page itself holds no data
    assert s.server.request("GET", "/ui/nothing")[0] == 404
    assert s.server.request("GET", "/ui/api/job/999999", token=s.tokens["root"])[0] == 404


def test_metrics_match_the_cli_and_time_the_api(served: Served) -> None:
    s = served
    root = s.tokens["root"]
    assert s.server.request("GET", "/ui/api/queue", token=root)[0] == 200
    assert s.server.request("GET", "/ui/api/job/999999", token=root)[0] == 404
    assert s.server.request("GET", "/metrics")[0] == 401
    node_token = make_token(s.dash.home, "--user", "root", "--node", "n002")
    assert s.server.request("GET", "/ui/api/queue", token=node_token)[0] == 403

    for _ in range(5):
        before = cli_json(s, "queue")
        got = scrape(s.server, root)
        after = cli_json(s, "queue")
        if [q["job_id"] for q in before] == [q["job_id"] for q in after]:
            break
    else:
        raise AssertionError("the queue kept changing under five reads")
    codes: dict[str, int] = {}
    teams: dict[str, int] = {}
    for q in after:
        codes[q["code"]] = codes.get(q["code"], 0) + 1
        team = "/".join(q["account"].split("/")[:2])
        teams[team] = teams.get(team, 0) + 1
    assert {k[0][1]: n for k, n in got["gpuledger_queue_jobs"].items()} == codes and codes
    assert {k[0][1]: n for k, n in got["gpuledger_queue_jobs_by_team"].items()} == teams
    preempted: dict[str, int] = {}
    for p in cli_json(s, "audit", "preemptions"):
        preempted[p["reason"]] = preempted.get(p["reason"], 0) + 1
    shown = {k[0][1]: n for k, n in got.get("gpuledger_preemptions_total", {}).items()}
    assert shown == preempted
    placed = got["gpuledger_placements_total"]
    jobs = cli_json(s, "jobs", "--limit", "10000")
    assert sum(placed.values()) == sum(j["placements"] for j in jobs) > 0
    at = iso(got["gpuledger_read_at_seconds"][()])
    shares = {r["account"]: r for r in cli_json(s, "shares", "--at", at)}
    usage = {r["name"]: r["usage_gpu_hours"] for r in cli_json(s, "usage", "--at", at)}
    delivered = {
        t["team"]: t
        for t in cli_json(s, "report", "delivered", "--at", at, "--window", "7d")["teams"]
    }
    for (label,), level in got["gpuledger_team_level_fs"].items():
        row = shares[label[1]]
        assert level == (float("inf") if row["level_fs_infinite"] else row["level_fs"])
    for (label,), hours in got["gpuledger_team_usage_gpu_hours"].items():
        assert hours == usage.get(label[1], 0.0)
    for (label,), hours in got["gpuledger_team_delivered_gpu_hours"].items():
        assert hours == delivered[label[1]]["delivered_gpu_hours"]
    for (label,), hours in got["gpuledger_team_owed_gpu_hours"].items():
        assert hours == delivered[label[1]]["owed_gpu_hours"]
    assert len(got["gpuledger_team_level_fs"]) == 4
    assert any(h > 0 for h in got["gpuledger_team_delivered_gpu_hours"].values())
    assert got["gpuledger_projection_lag_events"][()] == 0
    assert got["gpuledger_cycle_seconds_count"][()] >= 2
    api = got["gpuledger_api_request_seconds_count"]
    seen = {(dict(k)["route"], dict(k)["status"]) for k, n in api.items() if n > 0}
    assert {("/ui/api/queue", "200"), ("/ui/api/queue", "403"), ("/metrics", "401")} <= seen
    assert ("/ui/api/job/{job_id}", "404") in seen  # the template, not the path


UTC_TEXT = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\dZ")
OTHER_FORMS = re.compile(r"\d+/\d+/\d{4}|\b[AP]M\b")  # 6/17/2025, 12:28:40 AM


def placed_job(s: Served) -> int:
    """The job with the longest history: placed, maybe preempted and placed again."""
    rows = cli_json(s, "audit", "preemptions")
    return int(rows[0]["job_id"]) if rows else s.sampled


def test_every_page_shows_one_time_form_and_never_the_word_null(
    served: Served, browser: Browser
) -> None:
    s = served
    page, errors = watched(signed_in(browser, s.tokens["root"]))
    job = placed_job(s)
    visits = {
        "teams": READY["teams"],
        "queue": READY["queue"],
        f"job?id={job}": "#explain",
        "nodes": READY["nodes"],
        "decisions": READY["decisions"],
        "preemptions": "#preempt-summary",
        "budget": "#budget tbody tr",
    }
    for path, ready in visits.items():
        page.goto(f"{s.server.url}/ui/{path}")
        page.wait_for_selector(ready)
        page.wait_for_function("document.getElementById('status').textContent !== ''")
        text = page.locator("main").inner_text()
        lines = [ln.strip() for ln in text.splitlines()]
        assert "null" not in lines and "undefined" not in lines, (path, text)
        assert not OTHER_FORMS.search(text), (path, OTHER_FORMS.search(text))
        # UTC is only in the hover titles, never in the text a person reads
        assert not UTC_TEXT.search(text), (path, UTC_TEXT.search(text))
        svg = " ".join(page.locator("svg text").all_text_contents())
        assert not OTHER_FORMS.search(svg), (path, svg)
    # the job page: the history's texts and Explain hold times too, each a <time> with UTC on hover
    page.goto(f"{s.server.url}/ui/job?id={job}")
    page.wait_for_selector("#explain time")
    for t in page.locator("#job-history time, #explain time, #job-facts time").all():
        assert (t.get_attribute("title") or "").endswith("(UTC)")
    assert errors == []


def test_the_teams_series_buckets_start_on_whole_hours(served: Served) -> None:
    """atk50-29 F6: the buckets started at `now - 7 d` (:40:21, say), so the first held the
    clipped hour and 4 whole ones and the last 3 and the current part: a constant delivery read
    +8% at the start and -22% at "now". On whole hours from `start`'s hour, the hours kept."""
    s = served
    for window in ("7d", "all"):
        status, data = s.server.request(
            "GET", f"/ui/api/teams?window={window}", token=s.tokens["root"]
        )
        assert status == 200, data
        series, bucket = data["series"], data["series"]["bucket_s"]
        start, end = series["start_at"], series["end_at"]
        for team in series["teams"]:
            ats = [p["at"] for p in team["points"]]
            assert all(at % 3600 == 0 for at in ats), (window, team["team"], ats[:3])
            assert ats[0] <= start < ats[0] + 3600 and ats[-1] < end <= ats[-1] + bucket
            assert all(b - a == bucket for a, b in itertools.pairwise(ats)), (window, ats)
        totals = {t["team"]: t["delivered_gpu_hours"] for t in data["delivered"]["teams"]}
        summed = {
            t["team"]: sum(p["delivered_gpu_hours"] for p in t["points"]) for t in series["teams"]
        }
        assert summed == pytest.approx(totals, rel=1e-9, abs=1e-9), window


def test_a_time_of_another_year_shows_its_year(served: Served, browser: Browser) -> None:
    """The short form (`Dec 2, 03:44`) is for this year's times; one of another year says it
    (`Jun 21, 2025, 05:02`), on every page (the one `when` they all use)."""
    page, errors = visit(served, browser, "/ui/teams", READY["teams"])
    now = datetime.now(UTC)
    shown = page.evaluate(
        "([a, b]) => [when(a, SHORT), when(b, SHORT)]",
        [datetime(2025, 6, 21, 12, 2, tzinfo=UTC).timestamp(), now.timestamp()],
    )
    assert "2025" in shown[0] and "Jun 21" in shown[0], shown
    assert str(now.year) not in shown[1], shown
    assert errors == []


def test_the_job_page_wraps_explain_and_never_overlaps_or_cuts_a_label(
    served: Served, browser: Browser
) -> None:
    s = served
    page, _ = visit(s, browser, f"/ui/job?id={placed_job(s)}", "#explain")
    pre = page.evaluate("(e => [e.scrollWidth, e.clientWidth])(document.getElementById('explain'))")
    assert pre[0] <= pre[1], pre
    boxes = page.evaluate(
        "[...document.querySelectorAll('#timeline text')].map(t => {"
        "const b = t.getBoundingClientRect(); return [b.left, b.right, b.top, b.bottom]; })"
    )
    assert len(boxes) >= 2
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            apart = a[1] <= b[0] or b[1] <= a[0] or a[3] <= b[2] or b[3] <= a[2]
            assert apart, (a, b)
    # every event name on one line (no `job.submitte` / `d.v2`)
    lines = page.evaluate(
        "[...document.querySelectorAll('#job-history td.tag')].map(td => {"
        "const r = document.createRange(); r.selectNodeContents(td);"
        "return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size; })"
    )
    assert lines and set(lines) == {1}, lines


def test_the_queue_pages_state_is_in_its_url_and_survives_a_reload(
    served: Served, browser: Browser
) -> None:
    s = served
    page, errors = visit(s, browser, "/ui/queue", READY["queue"])
    page.select_option("#f-state", "pending")
    page.wait_for_function("location.search.includes('state=pending')")
    page.click("th[data-sort=gpus]")
    page.wait_for_selector("th[data-sort=gpus][aria-sort=ascending]")
    page.click("th[data-sort=gpus]")
    page.wait_for_selector("th[data-sort=gpus][aria-sort=descending]")
    page.wait_for_function("location.search.includes('descending=true')")
    url = page.url
    assert "sort=gpus" in url and "state=pending" in url, url
    shown = [r.get_attribute("data-job") for r in page.locator("#queue tbody tr").all()]
    page.reload()
    page.wait_for_selector("th[data-sort=gpus][aria-sort=descending]")
    assert page.locator("#f-state").input_value() == "pending"
    assert [r.get_attribute("data-job") for r in page.locator("#queue tbody tr").all()] == shown
    # a shared link opens filtered and on the page it names
    queued = [q["user"] for q in cli_json(s, "queue", "--limit", "100000")]
    who = max(set(queued), key=queued.count)
    assert queued.count(who) >= 2, queued
    page.goto(f"{s.server.url}/ui/queue?user={who}&limit=1&offset=1")
    page.wait_for_selector("#queue-range[data-offset='1']")
    assert page.locator("#f-user").input_value() == who
    users = {c.inner_text() for c in page.locator("#queue tbody tr td:nth-child(3)").all()}
    assert users == {who}, users
    assert errors == []


def test_the_budget_and_preemptions_views_are_in_their_url_and_a_non_decision_is_inline(
    served: Served, browser: Browser
) -> None:
    """A team's budget review and a preemptions view open from their URL and keep a change in it
    across a reload, as the queue's; a position that is no decision is said inline with the
    cycles still listed (atk48-29 F10: the programs' review, the default view, a blank page)."""
    s = served
    team, program = s.dash.project_b, s.dash.project_b.split("/")[0]
    arg = "new URLSearchParams(location.search).get"
    page, errors = visit(s, browser, f"/ui/budget?account={team}", "#budget tbody tr")
    assert page.locator("h1").inner_text() == f"Budget review: {team}"
    page.fill("#b-account", program)
    page.dispatch_event("#b-account", "change")
    page.wait_for_function(f"{arg}('account') === {json.dumps(program)}")
    page.reload()
    page.wait_for_selector("#budget tbody tr")
    assert page.locator("h1").inner_text() == f"Budget review: {program}"
    page.goto(f"{s.server.url}/ui/preemptions?account={team}&side=of&window=all")
    page.wait_for_selector(f"#preempt-summary[data-account='{team}'][data-side='of']")
    assert page.locator("#p-window").input_value() == "all"
    page.select_option("#p-side", "by")
    page.wait_for_function(f"{arg}('side') === 'by' && {arg}('account') === {json.dumps(team)}")
    page.reload()
    page.wait_for_selector(f"#preempt-summary[data-account='{team}'][data-side='by']")
    assert errors == []
    page.goto(f"{s.server.url}/ui/decisions?position=1")  # the ledger's first event: no decision
    page.wait_for_selector("#decision-error")
    assert "no recorded decision at position 1" in page.locator("#decision-error").inner_text()
    assert page.locator("#decisions tbody tr").count() > 0


def test_a_timed_update_waits_while_someone_types_in_a_pages_field(
    served: Served, browser: Browser
) -> None:
    """atk51-29 F1: the preemptions page's 30 s update redrew the page under the cursor and took
    the half-typed account as the filter (asked for at every update after). The update waits
    while a field of the page has the focus; leaving it (its change) asks for the whole text."""
    s = served
    program = s.dash.project_b.split("/")[0]
    page, errors = watched(signed_in(browser, s.tokens["root"]))
    page.clock.install()
    page.goto(f"{s.server.url}/ui/preemptions?account=*")
    page.wait_for_selector("#preempt-summary")
    asked: list[str] = []
    page.on("request", lambda q: asked.append(q.url) if "/ui/api/preemptions" in q.url else None)
    page.locator("#p-account").fill("")
    page.locator("#p-account").press_sequentially(program[:-1])
    page.clock.fast_forward(65_000)  # two updates' worth
    page.wait_for_timeout(1_500)
    assert asked == [], asked
    assert page.evaluate("document.activeElement.id") == "p-account"
    assert page.locator("#p-account").input_value() == program[:-1]
    page.locator("#p-account").press_sequentially(program[-1])
    page.locator("#p-account").press("Tab")  # leaves it: its change asks for the whole name
    page.wait_for_function("document.activeElement.id !== 'p-account'")
    page.wait_for_timeout(1_500)
    accounts = [parse_qs(urlsplit(u).query).get("account") for u in asked]
    assert accounts and all(a == [program] for a in accounts), asked
    assert errors == []


def test_metrics_are_typed_and_documented_and_head_answers(served: Served) -> None:
    import http.client

    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=60)
    try:
        bearer = {"Authorization": f"Bearer {served.tokens['root']}"}
        conn.request("GET", "/metrics", headers=bearer)
        resp = conn.getresponse()
        raw = resp.read().decode()
        kind = resp.getheader("Content-Type")
        conn.request("HEAD", "/")
        head = conn.getresponse()
        head.read()
    finally:
        conn.close()
    docs = (Path(__file__).parents[2] / "docs" / "server.md").read_text()
    assert resp.status == 200 and f"`Content-Type: {kind}`" in docs, kind
    assert kind == "text/plain; version=0.0.4; charset=utf-8"
    listed = set(re.findall(r"`((?:gpuledger|kueue)_[a-z_]+)`", docs))
    missing = {
        f.name
        for f in text_string_to_metric_families(raw)
        if f.name not in listed and f"{f.name}_total" not in listed
    }
    assert missing == set(), missing
    # a probe's HEAD / sees what a browser's GET / does: a redirect to the pages
    assert head.status in (200, 301, 302, 303, 307, 308), head.status


def test_the_cli_queue_says_how_many_its_limit_left_out(served: Served) -> None:
    home = served.dash.home
    everything = json.loads(cli(home, "queue", "--json", "--limit", "100000").stdout)
    assert len(everything) >= 2, everything
    total = len(everything)
    table = cli(home, "queue", "--limit", "1").stdout.strip().splitlines()
    assert table[-1] == f"1 of {total:,} shown (--limit N for more)", table
    got = cli(home, "queue", "--json", "--limit", "1")
    assert len(json.loads(got.stdout)) == 1  # the JSON stays a list of rows
    assert got.stderr.strip() == f"1 of {total:,} shown (--limit N for more)", got.stderr
    # nothing cut, nothing said
    whole = cli(home, "queue", "--limit", str(total))
    assert "shown" not in whole.stdout and whole.stderr == ""
    assert "Show the first N jobs" in cli(home, "queue", "--help").stdout


def test_metrics_whole_log_counts_kept_between_scrapes_equal_a_recount(served: Served) -> None:
    """/metrics counts the placements and preemptions since its last scrape only: in steps,
    at any position, the counts equal a group-by over every row."""
    from ledger.server.metrics import Tallies
    from ledger.store.embedded import EmbeddedSource
    from projections.projector import Projector
    from projections.store import Store

    with Store(":memory:") as store, EmbeddedSource(served.dash.home) as source:
        head = source.head()
        kept = Tallies()
        steps = [head // 7, head // 3, head // 3, head // 2 + 1, head - 5, head]
        for until in steps:
            Projector(store, source).catch_up(until=until)
            assert kept.read(store) == Tallies().read(store), until
        teams, placements, preemptions = kept.read(store)
        assert sum(placements.values()) > 0 and teams
        assert sum(n for k, _t, _r, n in teams if k == "placed") == sum(placements.values())
        assert sum(n for k, _t, _r, n in teams if k == "evicted") <= sum(preemptions.values())


def test_head_metrics_is_the_gets_headers_and_big_answers_are_gzipped(served: Served) -> None:
    """atk48-29 F10: `HEAD /metrics` was 405 and nothing was ever compressed. A HEAD is the
    GET's status and headers with no body; a large JSON answer is gzipped for a client that
    accepts it, the same JSON once decompressed (`ledger.server.encoding`)."""
    import gzip
    import http.client

    def asked(method: str, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=60)
        try:
            bearer = {"Authorization": f"Bearer {served.tokens['root']}", **headers}
            conn.request(method, path, headers=bearer)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    status, got, _ = asked("GET", "/metrics")
    status_h, head, empty = asked("HEAD", "/metrics")
    assert (status, status_h, empty) == (200, 200, b""), head
    assert head["content-type"] == got["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert int(head["content-length"]) > 1_000 and "content-encoding" not in head
    path = "/ui/api/queue?state=all&limit=1000"
    _, plain, text = asked("GET", path)
    status, squeezed, packed = asked("GET", path, **{"Accept-Encoding": "gzip"})
    assert status == 200 and squeezed["content-encoding"] == "gzip", squeezed
    assert len(text) > 1_024 and "content-encoding" not in plain
    assert int(squeezed["content-length"]) == len(packed) < len(text)
    assert json.loads(gzip.decompress(packed))["total"] == json.loads(text)["total"]
    scraped = asked("GET", "/metrics", **{"Accept-Encoding": "gzip"})
    assert scraped[1]["content-encoding"] == "gzip" and b"# TYPE" in gzip.decompress(scraped[2])


def test_static_serves_the_assets_alone_revalidated_and_head_is_counted_as_head(
    served: Served,
) -> None:
    """atk49-29 F8: `/ui/static/%00` (no token) was a 500 and the route served the package's
    `__init__.py` and `__pycache__`; F9: the gzip'd and identity assets shared one strong ETag
    and `If-None-Match` was never 304; F7: a HEAD was counted as a GET in the metrics."""
    import http.client

    def asked(method: str, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=60)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    for path in ("/ui/static/%00", "/ui/static/app.js%00", "/ui/static/a%00b",
                 "/ui/static/__init__.py", "/ui/static/__pycache__/__init__.cpython-311.pyc",
                 "/ui/static/page.html", "/ui/static/", "/ui/static/..%2fpages.py"):  # fmt: skip
        status, _, body = asked("GET", path)
        assert status == 404 and b"\n" not in body.rstrip(b"\n"), (path, status, body)
    shell = asked("GET", "/ui/teams")[2].decode()
    scripts = re.findall(r'<script src="(/ui/static/[a-z]+\.js)"></script>', shell)
    assert scripts[0].endswith("/times.js") and scripts[-1].endswith("/app.js"), scripts
    for path in scripts:  # every script the shell names (app.js split by role, s51) is served
        status, got, _ = asked("GET", path)
        assert (status, got["content-type"].split(";")[0]) == (200, "application/javascript")
    plain = asked("GET", "/ui/static/app.js", **{"Accept-Encoding": "identity"})
    packed = asked("GET", "/ui/static/app.js", **{"Accept-Encoding": "gzip"})
    assert plain[0] == packed[0] == 200 and packed[1]["content-encoding"] == "gzip"
    tag, ztag = plain[1]["etag"], packed[1]["etag"]
    assert tag.startswith('"') and ztag == tag[:-1] + '-gzip"', (tag, ztag)
    assert plain[1]["cache-control"] == "no-cache"
    for sent, coding in ((tag, "identity"), (ztag, "gzip"), (f"W/{tag}, {ztag}", "gzip")):
        status, got, body = asked(
            "GET", "/ui/static/app.js", **{"If-None-Match": sent, "Accept-Encoding": coding}
        )
        assert (status, body) == (304, b""), (sent, status)
        assert got["etag"] in (tag, ztag)
    assert asked("GET", "/ui/static/app.js", **{"If-None-Match": '"other"'})[0] == 200

    def heads() -> float:
        text = asked("GET", "/metrics", Authorization=f"Bearer {served.tokens['root']}")[2]
        mark = 'gpuledger_api_request_seconds_count{method="HEAD",route="/v1/whoami",status="200"}'
        found = [ln for ln in text.decode().splitlines() if ln.startswith(mark)]
        return float(found[0].split()[-1]) if found else 0.0

    before = heads()
    for _ in range(3):
        assert (
            asked("HEAD", "/v1/whoami", Authorization=f"Bearer {served.tokens['root']}")[0] == 200
        )
    assert heads() == before + 3
