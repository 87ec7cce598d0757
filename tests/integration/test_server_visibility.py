"""Who sees a job's command, labels and logs, over HTTP and in both CLI faces: its owner, the
managers of its account or one above it, and admins; everyone else sees the job with them
withheld (`redacted`), through `jobs` and `log` alike, and the embedded CLI shows the same
thing to the same actor."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.serverkit import Server, cli, make_token, set_up_ledger, start_server

SECRET = "--data=/secret/olmo-run-7"
SEES = {"alice": True, "mgr": True, "root": True, "bob": False, "carol": False, "othermgr": False}
"""Job 2 is alice's in ai2/olmo (managed by mgr): bob shares her team but is no manager; carol
and othermgr are of ai2/tulu."""


@dataclass
class World:
    home: Path
    server: Server
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("visibility")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    cli(
        home, "submit", "-A", "ai2/olmo", "-G", "1", "--label", "run=olmo-7", "--",
        "echo", SECRET, GPULEDGER_USER="alice",
    )  # fmt: skip
    tokens = {who: make_token(home, "--user", who) for who in SEES}
    server = start_server(home, "--interval", "0.2s", "--executor", "local")
    try:
        deadline = time.monotonic() + 30
        while True:  # job 2 started (its log paths are in the log; alice has no OS account
            # here, so it ends at once: the job is what matters, not its process)
            status, rows = server.request("GET", "/v1/jobs", token=tokens["root"])
            assert status == 200, rows
            if any(r["job_id"] == 2 and r["status"] == "finished" and r["logs"] for r in rows):
                break
            assert time.monotonic() < deadline, rows
            time.sleep(0.1)
        yield World(home, server, tokens)
    finally:
        assert server.stop() == 0


def _job(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in rows if r["job_id"] == 2)


def _events(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Job 2's submission and start, by tag."""
    return {
        x["tag"]: x
        for x in entries
        if x["tag"] in ("job.submitted.v2", "job.started.v1")
        and (x["event"] or {}).get("job_id") == 2
    }


@pytest.mark.parametrize("who", sorted(SEES))
def test_only_the_owner_managers_above_and_admins_see_a_jobs_command_over_http(
    world: World, who: str
) -> None:
    token = world.tokens[who]
    status, rows = world.server.request("GET", "/v1/jobs", token=token)
    assert status == 200, rows
    job = _job(rows)
    assert (job["user"], job["status"]) == ("alice", "finished")  # everyone sees the job
    status, entries = world.server.request("GET", "/v1/log?limit=10000", token=token)
    assert status == 200, entries
    events = _events(entries)
    submitted, started = events["job.submitted.v2"], events["job.started.v1"]
    if SEES[who]:
        assert SECRET in job["command"] and job["logs"] and not job["redacted"]
        assert SECRET in submitted["event"]["command"]
        assert submitted["event"]["labels"] == {"run": "olmo-7"}
        assert started["event"]["logs"] == job["logs"]
        assert not submitted["redacted"] and not started["redacted"]
        assert job["workdir"] and submitted["event"]["workdir"] == job["workdir"]
        assert submitted["event"]["stdout"] == "gpuledger-%j.out"
    else:
        assert (job["command"], job["logs"], job["redacted"]) == ([], [], True)
        assert submitted["redacted"] and started["redacted"]
        assert submitted["event"]["command"] == [] and submitted["event"]["labels"] == {}
        assert started["event"]["logs"] == []
        # where it runs and writes is as private as its command and logs
        assert job["workdir"] == "" and submitted["event"]["workdir"] == ""
        assert (submitted["event"]["stdout"], submitted["event"]["env"]) == ("", {})
        assert (submitted["event"]["user"], submitted["event"]["account"]) == (
            "alice",
            "ai2/olmo",
        )
        raw = json.dumps([rows, entries])
        assert SECRET not in raw and "olmo-7" not in raw


def test_no_reader_of_the_log_sees_a_tokens_secret_hash(world: World) -> None:
    """Tokens are kept as hashes; the log shows who was issued one, never the hash."""
    for who in ("root", "bob"):
        status, rows = world.server.request("GET", "/v1/log?limit=10000", token=world.tokens[who])
        assert status == 200, rows
        issued = [r for r in rows if r["tag"] == "token.issued.v1"]
        assert len(issued) >= len(SEES), who
        assert all(r["event"]["secret_sha256"] == "" and r["redacted"] for r in issued), who
    embedded = json.loads(cli(world.home, "log", "--json", "--limit", "10000").stdout)
    assert [r for r in embedded if r["tag"] == "token.issued.v1"]
    assert all(r["event"]["secret_sha256"] == "" for r in embedded if r["tag"] == "token.issued.v1")


def test_the_cli_shows_the_same_through_the_server_and_embedded(world: World) -> None:
    """The CLI as client prints what the API answers that caller; embedded (the server
    stopped), the same actor (`--as`, an admin's on this host) sees the same."""
    remote = {}
    for who in ("carol", "mgr"):
        url = {"GPULEDGER_URL": world.server.url, "GPULEDGER_TOKEN": world.tokens[who]}
        jobs = json.loads(cli(world.home, "jobs", "--json", **url).stdout)
        log = json.loads(cli(world.home, "log", "--json", "--limit", "10000", **url).stdout)
        assert _job(jobs)["redacted"] is not SEES[who]
        assert (SECRET in json.dumps(jobs)) is SEES[who]
        assert (SECRET in json.dumps(log)) is SEES[who]
        remote[who] = (_job(jobs), _events(log))
    assert world.server.stop() == 0
    for who in ("carol", "mgr"):
        jobs = json.loads(cli(world.home, "jobs", "--json", GPULEDGER_USER=who).stdout)
        log = json.loads(
            cli(world.home, "log", "--json", "--limit", "10000", GPULEDGER_USER=who).stdout
        )
        job, seen = remote[who]
        assert (_job(jobs)["command"], _job(jobs)["redacted"]) == (job["command"], job["redacted"])
        assert _events(log) == seen, who
        assert (SECRET in json.dumps([jobs, log])) is SEES[who]
