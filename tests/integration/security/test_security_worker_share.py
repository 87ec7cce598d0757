"""Red team (atk44-25 F6, F7; threat model row T5, docs/security.md), against a real server:
the dispatcher's worker thread runs no one's dry run. A manager's budget plan checked as
applied (a 70,000-member file held the cycle and everyone's submits ~35 s) and a batch refused
at its last command (19,000 submits and one bad: 2.5 s of the worker each, four at once
stopped the cycle 9 s) are decided beside the worker on the view of the live state: the
worker's calls, counted by the server (`gpuledger_worker_calls_total`), do not move. A budget
file lists at most 2,000 names and a batch holds at most 2,000 commands, each past it one
line. (What the server counts, not latencies: a shared machine's noise decides those.)"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.integration.serverkit import Server, make_token, set_up_ledger, start_server


@dataclass
class World:
    server: Server
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("worker-share")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)  # ai2/olmo: alice, bob, managed by mgr
    tokens = {who: make_token(home, "--user", who) for who in ("root", "alice", "mgr")}
    server = start_server(home, "--interval", "0.2s")
    try:
        yield World(server, tokens)
    finally:
        assert server.stop() == 0


def worker_calls(w: World) -> float:
    """The calls the worker thread ran so far (`gpuledger_worker_calls_total`)."""
    status, text = w.server.request("GET", "/metrics", token=w.tokens["root"])
    assert status == 200, text
    for line in (text if isinstance(text, bytes) else text.encode()).decode().splitlines():
        if line.startswith("gpuledger_worker_calls_total "):
            return float(line.split()[1])
    raise AssertionError("no gpuledger_worker_calls_total")


def plan(w: World, body: dict[str, object], who: str) -> tuple[int, dict[str, object]]:
    return w.server.request("POST", "/v1/budget/plan", body, token=w.tokens[who])  # type: ignore[no-any-return]


def members_file(n: int) -> str:
    names = ", ".join(['"alice"', '"bob"'] + [f'"x{i}"' for i in range(n)])
    return f'[accounts."ai2/olmo"]\nkind = "project"\nshares = 1\nmembers = [{names}]\n'


def test_a_checked_budget_plan_runs_beside_the_worker(world: World) -> None:
    before = worker_calls(world)
    body = {"name": "big.toml", "toml": members_file(1_990), "check": True}
    status, answer = plan(world, body, "mgr")
    assert status == 200, answer
    assert len(answer["changes"]) == 1_990, len(answer["changes"])
    # refused by the dry run (mgr may not manage another project): planned and checked beside it
    other = members_file(10).replace("ai2/olmo", "ai2/tulu")
    body = {"name": "other.toml", "toml": other, "check": True}
    status, answer = plan(world, body, "mgr")
    assert status == 403, answer
    # a plain user's plan without check, as large as a file may be
    body = {"name": "big.toml", "toml": members_file(1_990), "check": False}
    status, answer = world.server.request(
        "POST", "/v1/budget/plan", body, token=world.tokens["alice"]
    )
    assert status == 200, answer
    assert worker_calls(world) == before  # was one call each, 35 s for 70,000 members


def test_a_budget_file_past_2000_names_is_one_line(world: World) -> None:
    before = worker_calls(world)
    body = {"name": "huge.toml", "toml": members_file(70_000), "check": True}
    status, answer = plan(world, body, "mgr")
    assert status == 400, answer
    assert "huge.toml: lists 70,003 accounts, members and managers" in answer["detail"], answer
    assert "at most 2,000" in answer["detail"], answer
    assert "\n" not in answer["detail"]
    assert worker_calls(world) == before


def submit(account: str = "ai2/olmo") -> dict[str, object]:
    return {"op": "submit", "actor": "", "account": account, "gpus": 1, "min_runtime_s": 60}


def test_a_refused_batch_costs_the_worker_nothing(world: World) -> None:
    alice = world.tokens["alice"]
    before = worker_calls(world)
    body = {"commands": [submit()] * 1_999 + [submit("ai2/nope")]}
    status, answer = world.server.request("POST", "/v1/batch", body, token=alice)
    assert status == 404 and "ai2/nope" in answer["detail"], answer
    # past a project's subtree: refused as the apply would (403), on the view
    body = {"commands": [{"op": "member.add", "actor": "", "user": "zed",
                          "project": "ai2/tulu", "shares": 1}]}  # fmt: skip
    status, answer = world.server.request("POST", "/v1/batch", body, token=world.tokens["mgr"])
    assert status == 403, answer
    assert worker_calls(world) == before  # was a call each (2.5 s of the worker for 19,001)
    status, answer = world.server.request("POST", "/v1/batch", {"commands": [submit()] * 2},
                                          token=alice)  # fmt: skip
    assert status == 200 and len(answer["events"]) == 2, answer
    assert worker_calls(world) == before + 1  # an accepted batch is applied on the worker


def test_a_batch_past_2000_commands_is_refused_before_it_is_decided(world: World) -> None:
    before = worker_calls(world)
    body = {"commands": [submit()] * 2_001}
    status, answer = world.server.request("POST", "/v1/batch", body, token=world.tokens["alice"])
    assert status == 400, answer
    assert "2000" in answer["detail"] and "$.commands" in answer["detail"], answer
    assert worker_calls(world) == before


def test_a_batch_that_clashes_with_its_expected_position_is_refused_on_the_view(
    world: World,
) -> None:
    """atk44w: the dry run ignored `expected_position`, so a batch whose command clashed
    passed it and was refused 409 on the worker (1.3-5 s each for 2,000 commands against
    1,000 events)."""
    alice = world.tokens["alice"]
    first = world.server.request("POST", "/v1/commands/submit", submit(), token=alice)
    assert first[0] == 200, first
    seen = int(first[1]["position"])
    later = world.server.request("POST", "/v1/commands/submit", submit(), token=alice)
    assert later[0] == 200, later  # changes account:ai2/olmo after `seen`
    before = worker_calls(world)
    body = {"commands": [submit()] * 1_999 + [{**submit(), "expected_position": seen}]}
    status, answer = world.server.request("POST", "/v1/batch", body, token=alice)
    assert status == 409, answer
    assert "stale command" in answer["detail"] and "account:ai2/olmo" in answer["detail"]
    assert worker_calls(world) == before  # was a call (the whole batch decided on the worker)
    head = int(later[1]["position"])
    body = {"commands": [{**submit(), "expected_position": head + 10_000}]}  # ahead: no clash
    status, answer = world.server.request("POST", "/v1/batch", body, token=alice)
    assert status == 200, answer


def test_an_audit_check_runs_nothing_on_the_worker(world: World) -> None:
    """atk44w F6: `audit check` caught the projection up and queried it on the worker (~0.45 s
    a check on a busy ledger); now beside it, with the view of the live state."""
    alice = world.tokens["alice"]
    assert world.server.request("POST", "/v1/commands/submit", submit(), token=alice)[0] == 200
    before = worker_calls(world)
    status, answer = world.server.request("GET", "/v1/audit/check", token=alice)
    assert status == 200, answer
    assert answer["events"] > 0 and answer["violations"] == [], answer
    assert worker_calls(world) == before  # was one call
