"""The job page watched while the job is placed (Debian's chromium driven by Playwright, a real
`gpuledger serve`): the decision that places it, listed by the page's own refresh, is replayed
then, with no reload (atk48-29 F12: it said "not replayed (older)" until a reload, the page
having fetched the job's replays once)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from tests.integration.serverkit import Server, cli, make_token, start_server
from tests.integration.test_dashboard import browser, signed_in, watched

__all__ = ["browser"]  # the module fixture, shared

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    """One 8-GPU node: alice's job 1 holds it, dan's job 2 waits for it."""
    home = tmp_path_factory.mktemp("replay") / "ledger"
    cli(home, "init", "--admin", "root", GPULEDGER_USER="root")
    cli(home, "budget", "apply", str(EXAMPLES / "demo-budgets.toml"), GPULEDGER_USER="root")
    cli(home, "node", "add", "node-01", "--gpus", "8", "--gpu-type", "h100",
        GPULEDGER_USER="root")  # fmt: skip
    for who, account in (("alice", "research/llm"), ("dan", "research/vision")):
        cli(home, "--as", who, "submit", "-A", account, "-G", "8", "--min-runtime", "1h",
            "--", "python", "train.py", GPULEDGER_USER="root")  # fmt: skip
    token = make_token(home, "--user", "root")
    server = start_server(home, "--interval", "1s")
    try:
        yield server, token
    finally:
        assert server.stop() == 0, server.log_path.read_text()


def test_the_decision_placing_the_watched_job_is_replayed_without_a_reload(
    one_node: tuple[Server, str], browser: Browser
) -> None:
    server, token = one_node
    first = json.loads(cli(server.home, "jobs", "--json", GPULEDGER_USER="root").stdout)
    assert {j["job_id"] for j in first} == {1, 2}, first
    page, errors = watched(signed_in(browser, token))
    page.goto(f"{server.url}/ui/job?id=2")
    page.wait_for_selector("#job-facts")
    page.wait_for_function(
        "document.querySelector('#job-facts').textContent.includes('pending')", timeout=30_000
    )
    placed_before = page.locator("#job-decisions tbody tr").count()
    # atk50-29 F4: the waiting job's page lists no decision, so its replay replays none (it
    # replayed every cycle of its span, the one that placed job 1 here, each over the queue)
    status, about = server.request("GET", "/ui/api/job/2", token=token)
    assert status == 200 and about["job"]["status"] == "pending" and about["decisions"] == []
    deadline = time.monotonic() + 60
    while True:  # job 1 placed by a cycle that considered job 2 too
        listed = json.loads(cli(server.home, "jobs", "--json", GPULEDGER_USER="root").stdout)
        if [j["status"] for j in listed if j["job_id"] == 1] != ["pending"]:
            break
        assert time.monotonic() < deadline, listed
        time.sleep(0.2)
    assert server.request("GET", "/ui/api/job/2/replay", token=token) == (200, [])
    cli(server.home, "cancel", "1", GPULEDGER_USER="root")  # the node is free: job 2 is placed
    # the page's own refresh (every 5 s) lists the decision that placed it, then its replay
    row = "#job-decisions tbody tr"
    page.wait_for_function(
        f"[...document.querySelectorAll('{row}')].some(r => "
        "r.querySelector('td:nth-child(3)').textContent === 'this job')",
        timeout=60_000,
    )
    page.wait_for_function(
        f"[...document.querySelectorAll('{row} [data-col=replay]')].every("
        "c => c.textContent !== '…')",
        timeout=120_000,
    )
    cells = {
        r.locator("td").nth(2).inner_text(): r.locator("[data-col=replay]").inner_text()
        for r in page.locator(row).all()
    }
    assert cells.get("this job") == "identical", cells
    assert "not replayed (older)" not in cells.values(), cells
    assert page.locator(row).count() > placed_before and errors == [], errors
