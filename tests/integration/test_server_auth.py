"""Authorisation over HTTP against a real `gpuledger serve`: every endpoint x every kind of caller.

0 unauthorised successes; every denied call appends nothing; the unauthenticated get 401 (the
same answer for a missing, malformed, wrong, expired or revoked token). Also: secrets never show
up in the log, the projection, the server's log, error bodies or `ps`.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.serverkit import (
    BUDGET,
    Server,
    cli,
    make_token,
    set_up_ledger,
    start_server,
)

UNAUTHENTICATED = ["none", "malformed", "wrong", "expired", "revoked"]
PEOPLE = ["other_member", "other_manager", "user", "manager", "admin"]
NARROW = ["node", "job"]
CALLERS = UNAUTHENTICATED + NARROW + PEOPLE


@dataclass
class World:
    server: Server
    tokens: dict[str, str | None]
    secrets: list[str]
    bodies: list[bytes]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("auth")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    # long enough to be in the future when the command is decided on a loaded machine; made
    # first, so the rest of the set-up counts towards its 10 s (the rest is slept out below)
    expired = make_token(home, "--user", "alice", "--expires", "10s")
    expired_by = time.monotonic() + 10.2
    # job 2 (alice, 8 GPUs) never fits beside jobs 1 and 3: it stays pending
    cli(home, "submit", "-A", "ai2/olmo", "-G", "8", GPULEDGER_USER="alice")
    cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--resumable", GPULEDGER_USER="bob")
    cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--resumable", GPULEDGER_USER="bob")
    tokens: dict[str, str | None] = {
        "none": None,
        "user": make_token(home, "--user", "alice", "--name", "laptop"),
        "other_member": make_token(home, "--user", "carol"),
        "other_manager": make_token(home, "--user", "othermgr"),
        "manager": make_token(home, "--user", "mgr"),
        "admin": make_token(home, "--user", "root"),
        "node": make_token(home, "--node", "n1"),
        "job": make_token(home, "--job", "1", actor="alice"),
        "expired": expired,
        "revoked": make_token(home, "--user", "alice"),
        "spare": make_token(home, "--user", "alice", "--name", "to revoke"),
    }
    revoked = tokens["revoked"]
    assert revoked is not None
    cli(home, "token", "revoke", revoked[4:20], GPULEDGER_USER="root")
    user = tokens["user"]
    assert user is not None
    tokens["malformed"] = "not-a-token"
    tokens["wrong"] = user[:21] + ("A" if user[21] != "A" else "B") + user[22:]
    secrets = [t for k, t in tokens.items() if t and k not in ("malformed", "wrong")]
    time.sleep(max(0.0, expired_by - time.monotonic()))  # the 10 s token has expired
    server = start_server(home, "--interval", "1h", "--log-level", "DEBUG")
    try:
        _wait_running(server, tokens["admin"], {1, 3, 4})
        yield World(server, tokens, secrets, [])
    finally:
        assert server.stop() == 0


def _wait_running(server: Server, admin: str | None, jobs: set[int]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, rows = server.request("GET", "/v1/jobs", token=admin)
        assert status == 200, rows
        running = {r["job_id"] for r in rows if r["status"] == "running"}
        if jobs <= running:
            return
        time.sleep(0.1)
    raise AssertionError(f"jobs {jobs} never ran")


def _hex(n: int) -> str:
    return uuid.uuid4().hex[:n]


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    body: Callable[[World], Any]
    allowed: frozenset[str]
    succeeds: bool = True
    """Whether some allowed caller is expected to succeed (False: the state rejects all)."""


def cmd(**fields: Any) -> Callable[[World], Any]:
    return lambda w: {"actor": "", **fields}


def _spare_id(w: World) -> str:
    spare = w.tokens["spare"]
    assert spare is not None
    return spare[4:20]


ADMIN = frozenset({"admin"})
MANAGERS = frozenset({"manager", "admin"})
READERS = frozenset(PEOPLE)
NODE = frozenset({"node"})

CASES: dict[str, Case] = {
    "submit": Case(
        "POST", "/v1/commands/submit", cmd(account="ai2/olmo", gpus=1), frozenset({"user"})
    ),
    "account.open": Case(
        "POST",
        "/v1/commands/account.open",
        cmd(path="ai2/olmo/sub", kind="project"),
        MANAGERS,
    ),
    "account.close": Case("POST", "/v1/commands/account.close", cmd(path="ai2/olmo/sub"), MANAGERS),
    "share.set": Case("POST", "/v1/commands/share.set", cmd(account="ai2/olmo", shares=2), ADMIN),
    "member.add": Case(
        "POST", "/v1/commands/member.add", cmd(user="dave", project="ai2/olmo"), MANAGERS
    ),
    "member.remove": Case(
        "POST", "/v1/commands/member.remove", cmd(user="dave", project="ai2/olmo"), MANAGERS
    ),
    "manager.grant": Case(
        "POST", "/v1/commands/manager.grant", cmd(user="dave", account="ai2/olmo"), ADMIN
    ),
    "manager.revoke": Case(
        "POST", "/v1/commands/manager.revoke", cmd(user="dave", account="ai2/olmo"), ADMIN
    ),
    "admin.grant": Case("POST", "/v1/commands/admin.grant", cmd(user="dave"), ADMIN),
    "admin.revoke": Case("POST", "/v1/commands/admin.revoke", cmd(user="dave"), ADMIN),
    "node.add": Case(
        "POST", "/v1/commands/node.add", cmd(node="n2", gpus=2, gpu_type="h100"), ADMIN
    ),
    "node.drain": Case("POST", "/v1/commands/node.drain", cmd(node="n2", reason="fw"), ADMIN),
    "node.return": Case("POST", "/v1/commands/node.return", cmd(node="n2"), ADMIN),
    "node.drain again": Case("POST", "/v1/commands/node.drain", cmd(node="n2", reason="fw"), ADMIN),
    "node.agent": Case("POST", "/v1/commands/node.agent", cmd(node="n2", agent="a" * 64), ADMIN),
    "node.lost": Case("POST", "/v1/commands/node.lost", cmd(node="n2", reason="psu"), ADMIN),
    "node.remove": Case("POST", "/v1/commands/node.remove", cmd(node="n2"), ADMIN),
    "hold": Case(
        "POST", "/v1/commands/hold", cmd(job_id=2), frozenset({"user", "manager", "admin"})
    ),
    "release": Case(
        "POST", "/v1/commands/release", cmd(job_id=2), frozenset({"user", "manager", "admin"})
    ),
    "requeue": Case("POST", "/v1/commands/requeue", cmd(job_id=4), frozenset({"manager", "admin"})),
    "cancel": Case(
        "POST", "/v1/commands/cancel", cmd(job_id=2), frozenset({"user", "manager", "admin"})
    ),
    "decision.apply": Case(
        "POST",
        "/v1/commands/decision.apply",
        cmd(decision={"cycle_id": "by-hand", "based_on": 0, "policy_version": "manual"}),
        frozenset(),  # only the service decides, an admin neither (atk34-26 F2: audit check's rule)
        succeeds=False,
    ),
    "job.sample": Case(
        "POST",
        "/v1/commands/job.sample",
        cmd(job_id=1, gpu_utilisation=[50.0]),
        frozenset({"node", "admin"}),
    ),
    "job.checkpoint": Case(
        "POST",
        "/v1/commands/job.checkpoint",
        cmd(job_id=1),
        frozenset({"job", "node", "user", "admin"}),
    ),
    "job.leader_ended": Case(
        "POST",
        "/v1/commands/job.leader_ended",
        cmd(job_id=1, leader_ended_at=1.0, left=1, kill_at=4.0e9),  # reaped long after the run
        frozenset({"node", "admin"}),
    ),
    "job.start": Case(
        "POST",
        "/v1/commands/job.start",
        cmd(job_id=1),
        frozenset({"node", "admin"}),
        succeeds=False,  # job 1 already runs
    ),
    "token.issue": Case(
        "POST",
        "/v1/commands/token.issue",
        lambda w: {
            "actor": "",
            "token_id": _hex(16),
            "user": "alice",
            "secret_sha256": _hex(32) + _hex(32),
        },
        frozenset({"user", "admin"}),
    ),
    "token.revoke": Case(
        "POST",
        "/v1/commands/token.revoke",
        lambda w: {"actor": "", "token_id": _spare_id(w)},
        frozenset({"user", "admin"}),
    ),
    "preempt": Case("POST", "/v1/commands/preempt", cmd(job_id=3, note="maintenance"), ADMIN),
    "job.finish": Case(
        "POST",
        "/v1/commands/job.finish",
        cmd(job_id=1, exit_code=0),
        frozenset({"node", "admin"}),
    ),
    "job.run_ended": Case(
        "POST",
        "/v1/commands/job.run_ended",
        cmd(job_id=1, engine="agent", engine_job_id="1.1"),
        ADMIN,  # job 1 has finished (`job.finish`): it is on no node, so no node speaks of it
        succeeds=False,  # job 1's run was never stopped
    ),
    "job.unplace": Case(
        "POST",
        "/v1/commands/job.unplace",
        cmd(job_id=2, run=0, reason="the partition is down"),
        ADMIN,  # an engine's report, or an admin's; a node's agent never takes a run back
        succeeds=False,  # job 2 was cancelled (`cancel`): no placed run to take back
    ),
    "service.configure": Case(
        "POST",
        "/v1/commands/service.configure",
        cmd(policy={"version": "fairshare-1"}, interval_s=3600.0, executor="none"),
        ADMIN,
    ),
    "batch": Case(
        "POST",
        "/v1/batch",
        lambda w: {"commands": [{"op": "share.set", "actor": "", "account": "ai2", "shares": 3}]},
        ADMIN,
    ),
    "jobs": Case("GET", "/v1/jobs", lambda w: None, READERS),
    "nodes": Case("GET", "/v1/nodes", lambda w: None, READERS),
    "accounts": Case("GET", "/v1/accounts", lambda w: None, READERS),
    "log": Case("GET", "/v1/log", lambda w: None, READERS),
    "tokens": Case("GET", "/v1/tokens", lambda w: None, READERS),
    "shares": Case("GET", "/v1/shares", lambda w: None, READERS),
    "usage": Case("GET", "/v1/usage?by=user", lambda w: None, READERS),
    "report delivered": Case(
        "GET", "/v1/report/delivered?start=1700000000&end=1764000000", lambda w: None, READERS
    ),
    "report preemptions": Case("GET", "/v1/report/preemptions", lambda w: None, READERS),
    "queue": Case("GET", "/v1/queue?state=pending", lambda w: None, READERS),
    "queue total": Case("GET", "/v1/queue/total?state=pending", lambda w: None, READERS),
    "priority": Case("GET", "/v1/priority", lambda w: None, READERS),
    "explain": Case("GET", "/v1/explain?job_id=1", lambda w: None, READERS),
    "squatters": Case("GET", "/v1/squatters", lambda w: None, READERS),
    "projection": Case("GET", "/v1/projection", lambda w: None, READERS),
    "audit preemptions": Case("GET", "/v1/audit/preemptions", lambda w: None, READERS),
    "audit budget changes": Case("GET", "/v1/audit/budget-changes", lambda w: None, READERS),
    "whoami": Case("GET", "/v1/whoami", lambda w: None, frozenset(PEOPLE + NARROW)),
    "budget plan": Case("POST", "/v1/budget/plan", lambda w: {"toml": BUDGET}, READERS),
    # the batch above set ai2's shares to 3: the file's 1 is a change only admins may make
    "budget check": Case(
        "POST", "/v1/budget/plan", lambda w: {"toml": BUDGET, "check": True}, ADMIN
    ),
    "audit table": Case("POST", "/v1/audit/table", lambda w: {"kind": "preemptions"}, READERS),
    # node n1's token only; this server runs no node agents, so even it gets a clear 409
    "agent register": Case(
        "POST",
        "/v1/agent/register",
        lambda w: {"node": "n1", "gpus": 8, "gpu_type": "h100"},
        NODE,
        succeeds=False,
    ),
    "agent poll": Case("GET", "/v1/agent/poll?node=n1", lambda w: None, NODE, succeeds=False),
    "agent report": Case(
        "POST", "/v1/agent/report", lambda w: {"node": "n1"}, NODE, succeeds=False
    ),
    "agent heartbeat": Case(
        "POST", "/v1/agent/heartbeat", lambda w: {"node": "n1"}, NODE, succeeds=False
    ),
    "agent confirm": Case(
        "POST", "/v1/agent/confirm", lambda w: {"node": "n1"}, NODE, succeeds=False
    ),
    "audit verify": Case("GET", "/v1/audit/verify", lambda w: None, READERS),
    "audit check": Case("GET", "/v1/audit/check", lambda w: None, READERS),
    "audit progress": Case("GET", "/v1/audit/progress", lambda w: None, READERS),
}


def test_every_route_of_the_api_is_in_the_matrix(world: World) -> None:
    status, doc = world.server.request("GET", "/v1/openapi.json")
    assert status == 200
    routes = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    covered = {(c.method, c.path.split("?")[0]) for c in CASES.values()}
    public = {("GET", "/v1/health")}
    assert routes - public == covered, routes ^ (covered | public)


# the matrix runs in this order: state moves forward through it (n2 added, drained, removed...)
@pytest.mark.parametrize("name", list(CASES))
def test_authorisation_matrix(world: World, name: str) -> None:
    case = CASES[name]
    server = world.server
    answers: dict[str, int] = {}
    for caller in CALLERS:
        before = server.head()
        status, body = server.request(
            case.method, case.path, case.body(world), token=world.tokens[caller]
        )
        after = _callers_head(world, before)
        world.bodies.append(repr(body).encode())
        answers[caller] = status
        ok = 200 <= status < 300
        if caller == "job" and _status(world, 1) == "finished":
            # a job token works while its job runs (docs/security.md, row T13): job 1 ended
            # (the matrix's `job.finish`), so the token proves nothing any more
            assert status == 401 and after == before, (name, status, body)
            continue
        if caller not in case.allowed:
            assert not ok, f"{caller} succeeded at {name}: {body}"
            if case.method == "POST":
                assert after == before, f"{caller}'s denied {name} appended events"
            if caller in UNAUTHENTICATED:
                assert status == 401, (caller, status, body)
                assert body["code"] == "unauthenticated"
            else:
                assert status in (403, 404), (caller, status, body)
        else:
            assert status not in (401, 403), (caller, status, body)
            if case.method == "POST" and not ok:
                assert after == before, f"{caller}'s rejected {name} appended events"
    if case.succeeds:
        assert any(200 <= answers[c] < 300 for c in case.allowed), answers


def _callers_head(world: World, before: int) -> int:
    """The head as far as callers moved it: `before` unless an event after it came from someone
    but the service (a submission brings the next cycle forward: the dispatcher's own appends,
    actors `@...`, may land between two cases)."""
    status, rows = world.server.request(
        "GET", f"/v1/log?after={before}&limit=1000", token=world.tokens["admin"]
    )
    assert status == 200, rows
    theirs = [r["position"] for r in rows if not str(r["actor"] or "").startswith("@")]
    return max(theirs, default=before)


def _status(world: World, job_id: int) -> str:
    status, rows = world.server.request("GET", "/v1/jobs", token=world.tokens["admin"])
    assert status == 200, rows
    return str(next(r["status"] for r in rows if r["job_id"] == job_id))


def test_as_works_for_admins_only_and_records_the_real_actor(world: World) -> None:
    server = world.server
    before = server.head()
    status, body = server.request(
        "POST",
        "/v1/commands/share.set",
        {"actor": "root", "account": "ai2/tulu", "shares": 5},
        token=world.tokens["user"],
    )
    assert status == 403 and "only admins may use --as" in body["detail"]
    assert server.head() == before
    status, body = server.request(
        "POST",
        "/v1/commands/submit",
        {"actor": "carol", "account": "ai2/tulu", "gpus": 1, "real_actor": "mallory"},
        token=world.tokens["admin"],
    )
    assert status == 200, body
    (ev,) = body["events"]
    assert (ev["actor"], ev["real_actor"], ev["user"]) == ("carol", "root", "carol")
    status, body = server.request(
        "POST",
        "/v1/commands/submit",
        {"actor": "@dispatcher", "account": "ai2/tulu", "gpus": 1},
        token=world.tokens["admin"],
    )
    assert status == 403 and "system actors" in body["detail"]


def test_secrets_never_appear_in_events_projection_logs_errors_or_ps(world: World) -> None:
    home = world.server.home
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    places: dict[str, bytes] = {
        "ps": ps.encode(),
        "server log": world.server.log_path.read_bytes(),
        "responses": b"\n".join(world.bodies),
    }
    for path in sorted(home.rglob("*")):
        if path.is_file() and not path.name.endswith(".sock"):
            places[str(path.relative_to(home))] = path.read_bytes()
    assert "events.sqlite" in places and any("projection" in p for p in places)
    for secret in world.secrets:
        for where, data in places.items():
            assert secret.encode() not in data, f"a token secret is in {where}"
            assert secret[20:].encode() not in data, f"a token secret's tail is in {where}"
