"""The finished jobs page (like sacct) and the queue's running view in a real browser (Debian's
chromium) against a real `gpuledger serve`: the finished jobs paged, filtered by person, team
and end, their total and rows equal to `jobs --status finished --json`, another person's job
without its command; the running jobs' elapsed and remaining times counting as the page stays
open, equal to what `jobs --json` says."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from tests.integration import test_dashboard as dashboard
from tests.integration.dashkit import SECRET
from tests.integration.serverkit import Server, cli, make_token, set_up_ledger, start_server
from tests.integration.test_dashboard import Served, signed_in, visit, watched

served = dashboard.served  # the same module-scoped fixtures (a server of its own here)
browser = dashboard.browser


def finished_cli(s: Served, *args: str, who: str = "root") -> list[dict[str, Any]]:
    out = cli(s.dash.home, "jobs", "--status", "finished", "--limit", "10000", "--json", *args,
              GPULEDGER_USER=who)  # fmt: skip
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def finished_api(s: Served, query: str, who: str = "root") -> dict[str, Any]:
    status, body = s.server.request("GET", f"/ui/api/finished?{query}", token=s.tokens[who])
    assert status == 200, body
    page: dict[str, Any] = body
    return page


def test_the_finished_jobs_are_paged_to_the_last_with_their_true_total(served: Served) -> None:
    s = served
    want = finished_cli(s)
    assert len(want) > 50, len(want)  # pages of 20: three at least
    got: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = finished_api(s, f"offset={offset}&limit=20")
        assert page["total"] == len(want)
        got += page["rows"]
        offset += 20
        if offset >= page["total"]:
            break
    assert [r["job_id"] for r in got] == [r["job_id"] for r in want]
    for g, w in zip(got, want, strict=True):
        for k in ("user", "account", "finish_reason", "exit_code", "started_at", "finished_at"):
            assert g[k] == w[k], (k, g, w)
        assert g["elapsed_s"] == w["elapsed_s"]
    assert finished_api(s, f"offset={len(want)}")["rows"] == []


def test_the_finished_jobs_filter_by_person_team_and_end(served: Served) -> None:
    s = served
    every = finished_cli(s)
    by_user = finished_api(s, f"user={s.dash.user_a}&limit=1000")
    assert (
        [r["job_id"] for r in by_user["rows"]]
        == [r["job_id"] for r in finished_cli(s, "-u", s.dash.user_a)]
        != []
    )
    team = "/".join(every[0]["account"].split("/")[:2])
    by_team = finished_api(s, f"account={team}&limit=1000")
    assert by_team["total"] == len(finished_cli(s, "-A", team)) > 0
    assert all(r["account"] == team or r["account"].startswith(team + "/") for r in by_team["rows"])
    reasons = {r["finish_reason"] for r in every}
    for reason in reasons:
        page = finished_api(s, f"reason={reason}&limit=1000")
        assert page["total"] == sum(r["finish_reason"] == reason for r in every), reason
        assert {r["finish_reason"] for r in page["rows"]} == {reason}
    status, body = s.server.request(
        "GET", "/ui/api/finished?reason=nonsense", token=s.tokens["root"]
    )
    assert status == 400, body


def test_a_persons_node_filters_every_page_and_an_unknown_account_is_one_error(
    served: Served,
) -> None:
    """`account=prog/proj/alice` (a person's node, as the budget tree shows it) is that person's
    jobs in that account on the Queue and Finished pages and `queue`/`jobs -A`, as on the
    Preemptions page (atk48-29 F6: total 0); an unknown account is the same 404 everywhere."""
    s = served
    d = s.dash
    node = f"{d.project_a}/{d.user_a}"
    want = finished_cli(s, "-A", d.project_a, "-u", d.user_a)
    assert want and [r["job_id"] for r in finished_cli(s, "-A", node)] == [
        r["job_id"] for r in want
    ]
    assert finished_api(s, f"account={node}&limit=1000")["total"] == len(want)
    every = ("--state", "all", "--limit", "100000", "--json")
    root = {"GPULEDGER_USER": "root"}
    queued = json.loads(
        cli(d.home, "queue", "-A", d.project_a, "-u", d.user_a, *every, **root).stdout
    )
    mine = json.loads(cli(d.home, "queue", "-A", node, *every, GPULEDGER_USER="root").stdout)
    assert queued and [r["job_id"] for r in mine] == [r["job_id"] for r in queued]
    status, page = s.server.request(
        "GET", f"/ui/api/queue?account={node}&state=all&limit=1000", token=s.tokens["root"]
    )
    assert status == 200 and page["total"] == len(queued), page
    for path in ("queue", "finished", "preemptions"):
        status, body = s.server.request(
            "GET", f"/ui/api/{path}?account=nope", token=s.tokens["root"]
        )
        assert status == 404 and "no account 'nope'" in json.dumps(body), (path, status, body)
    for args in (("queue", "-A", "nope"), ("jobs", "-A", "nope")):
        got = cli(d.home, *args, ok=False, GPULEDGER_USER="root")
        assert got.returncode != 0 and got.stderr.startswith("error: no account 'nope'"), got
        assert len(got.stderr.strip().splitlines()) == 1, got.stderr


def test_another_persons_finished_job_shows_without_its_command(served: Served) -> None:
    """The rule of `jobs` (docs/dashboard.md): every person sees every job, its command, directory
    and logs only its owner, the managers above its account and admins."""
    s = served
    cli(s.dash.home, "cancel", str(s.dash.job_b), GPULEDGER_USER=s.dash.user_b)
    deadline = time.monotonic() + 30
    while True:
        rows = finished_api(s, f"user={s.dash.user_b}&limit=1000", who=s.dash.user_a)["rows"]
        mine = [r for r in rows if r["job_id"] == s.dash.job_b]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert mine, rows
    assert mine[0]["redacted"] and mine[0]["command"] == [] and mine[0]["logs"] == []
    assert SECRET not in json.dumps(rows)
    own = finished_api(s, f"user={s.dash.user_b}&limit=1000", who=s.dash.user_b)["rows"]
    assert SECRET in next(r for r in own if r["job_id"] == s.dash.job_b)["command"]


def test_the_finished_page_pages_to_its_last_job_in_the_browser(
    served: Served, browser: Browser
) -> None:
    s = served
    want = finished_cli(s, "-u", s.dash.user_a)
    path = f"/ui/finished?user={s.dash.user_a}&limit=5"
    page, errors = visit(s, browser, path, "#finished tbody tr")
    total = int(page.get_attribute("#queue-range", "data-total") or "-1")
    assert total == len(want) > 5
    rows = "t => t.map(r => +r.dataset.job)"
    assert page.eval_on_selector_all("#finished tbody tr", rows) == [r["job_id"] for r in want[:5]]
    page.click("#page-last")
    page.wait_for_function(
        "n => document.querySelector('#queue-range').dataset.offset == n",
        arg=str((total - 1) // 5 * 5),
    )
    last = page.eval_on_selector_all("#finished tbody tr", rows)
    assert last == [r["job_id"] for r in want[(total - 1) // 5 * 5 :]]
    page.screenshot(path=str(s.shots / "finished.png"), full_page=True)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1280, width
    assert errors == []


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, int]]:
    """A small ledger whose job 2 runs with a 3-hour limit (placements recorded, nothing runs)."""
    tmp = tmp_path_factory.mktemp("running")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    out = cli(home, "submit", "-A", "ai2/olmo", "-G", "2", "-t", "3h", "--json", "--", "sleep", "1",
              GPULEDGER_USER="bob")  # fmt: skip
    assert '"job_id": 2' in out.stdout.replace('"job_id":2', '"job_id": 2'), out.stdout
    token = make_token(home, "--user", "bob")
    server = start_server(home, "--interval", "1s")
    try:
        deadline = time.monotonic() + 30
        while job_json(home, 2)["started_at"] is None:
            assert time.monotonic() < deadline, server.log_path.read_text()
            time.sleep(0.2)
        yield server, token, 2
    finally:
        assert server.stop() == 0, server.log_path.read_text()


def job_json(home: Path, job_id: int) -> dict[str, Any]:
    rows = json.loads(cli(home, "jobs", "-j", str(job_id), "--json", GPULEDGER_USER="root").stdout)
    row: dict[str, Any] = rows[0]
    return row


def seconds(page: Page, where: str) -> int:
    return int(page.get_attribute(where, "data-seconds") or "-1")


def test_the_running_view_counts_elapsed_and_remaining_time_as_it_stays_open(
    running: tuple[Server, str, int], browser: Browser
) -> None:
    """A running job's elapsed and remaining time (squeue's TIME and TIME_LEFT) are what `jobs`
    says at the same moment, and they go on counting every second while the page stays open
    (the answer it was drawn from is kept up to seconds, the page polls every 5 s)."""
    server, token, job_id = running
    ctx = signed_in(browser, token)
    page, errors = watched(ctx)
    row = job_json(server.home, job_id)  # first: the CLI takes seconds on a loaded host
    page.goto(server.url + "/ui/queue?state=running")
    cell = f'#queue tr[data-job="{job_id}"] [data-tick="elapsed"]'
    left = f'#queue tr[data-job="{job_id}"] [data-tick="remaining"]'
    page.wait_for_selector(cell)
    shown = seconds(page, cell)
    want = time.time() - row["started_at"]  # the moment the page was read
    assert abs(shown - want) <= 2.5, (shown, want)
    assert abs(seconds(page, left) - (3 * 3600 - want)) <= 2.5
    first, first_left = seconds(page, cell), seconds(page, left)
    time.sleep(3.2)  # less than the 5 s poll: the page counts on its own
    assert 2 <= seconds(page, cell) - first <= 5, (first, seconds(page, cell))
    assert 2 <= first_left - seconds(page, left) <= 5
    head = page.eval_on_selector_all("#queue thead th", "t => t.map(h => h.textContent)")
    assert [h for h in head if h in ("elapsed", "time limit", "remaining")] == [
        "elapsed",
        "time limit",
        "remaining",
    ]
    page.goto(server.url + f"/ui/job?id={job_id}")
    facts = '#job-facts [data-tick="elapsed"]'
    page.wait_for_selector(facts)
    assert abs(seconds(page, facts) - (time.time() - row["started_at"])) <= 2.5
    assert errors == []
