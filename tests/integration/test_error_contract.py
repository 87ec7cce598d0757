"""The error contract and the bounds, through the real `gpuledger` console script: every failure
is one line on stderr ending in a stable code, exit 1 for a rejected command, bad usage and an
environment problem, nothing appended; values outside the schema's bounds are refused; an old
store holding such values still works (they are clamped when read)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import msgspec
import pytest

from ledger.store.application import Ledger
from projections.testing.synthetic import append_raw
from schemas import codec
from schemas import commands as c
from schemas import events as e

GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"
LINE = re.compile(r"^error: .+ \[(?P<code>[a-z_]+)\]$")

BUDGET = """
[accounts."ml"]
kind = "program"
shares = 1

[accounts."ml/nlp"]
kind = "project"
shares = 1
members = ["alice"]
"""


def run(home: Path, *args: str, actor: str | None = "root") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env["GPULEDGER_HOME"] = str(home)
    if actor is not None:
        env["GPULEDGER_USER"] = actor
    return subprocess.run([GPULEDGER, *args], env=env, capture_output=True, text=True, timeout=60)


def ok(home: Path, *args: str, actor: str | None = "root") -> str:
    proc = run(home, *args, actor=actor)
    assert proc.returncode == 0, f"{args}: {proc.stderr}"
    return proc.stdout


def one_line(proc: subprocess.CompletedProcess[str], code: str, exit_code: int = 1) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    m = LINE.match(lines[0])
    assert m is not None, lines[0]
    assert m["code"] == code, lines[0]
    assert proc.returncode == exit_code, (proc.returncode, lines[0])
    return lines[0]


def rows(home: Path) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(home / "events.sqlite")) as db:
        return db.execute("SELECT rowid, * FROM stored_events ORDER BY rowid").fetchall()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data directory every test starts from, built once per module by the CLI: the
    organisation of `BUDGET` and node n1 (8 x h100). Tests get copies (`home`)."""
    tmp = tmp_path_factory.mktemp("built")
    h = tmp / "ledger"
    ok(h, "init", "--admin", "root")
    budget = tmp / "budget.toml"
    budget.write_text(BUDGET)
    ok(h, "budget", "apply", str(budget))
    ok(h, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100")
    return h


@pytest.fixture
def home(built: Path, tmp_path: Path) -> Path:
    """A copy of `built` of this test's own (no process has it open: a copy is the same data
    directory)."""
    h = tmp_path / "ledger"
    shutil.copytree(built, h)
    return h


REJECTED = [
    pytest.param(
        ["submit", "-A", "ml/nlp", "-G", "1", "--priority", "99999999999999999999"],
        "invalid",
        "`priority` must be int <= 1000000000",
        id="an overflowing priority",
    ),
    pytest.param(
        ["submit", "-A", "ml/nlp", "-G", "1", "--priority", "1000000000"],
        "forbidden",
        "'alice' may not raise a job's priority above 0 in 'ml/nlp': only its managers and admins",
        id="a member raising her own priority (atk46-23 F15)",
    ),
    pytest.param(
        ["share", "set", "ml/nlp", "9223372036854775808"],
        "invalid",
        "`shares` must be int <= 1000000000",
        id="overflowing shares",
    ),
    pytest.param(
        ["member", "add", "bob", "ml/nlp", "--shares", "1e20"],
        "usage",
        "'1e20' is not a valid integer",
        id="member shares in scientific notation",
    ),
    pytest.param(
        ["member", "add", "bob", "ml/nlp", "--shares", "100000000000000000000"],
        "invalid",
        "`shares` must be int <= 1000000000",
        id="overflowing member shares",
    ),
    pytest.param(
        ["submit", "-A", "ml/nlp", "-G", "1", "--min-runtime", "0.4"],
        "invalid",
        "a bare number is whole minutes",
        id="a fractional min runtime is not silently unfunded",
    ),
    pytest.param(
        ["submit", "-A", "ml/nlp", "-G", "nan"],
        "usage",
        "'nan' is not a valid integer",
        id="-G nan",
    ),
    pytest.param(
        ["share", "set", "ml/nlp", "nan"], "usage", "'nan' is not a valid integer", id="shares nan"
    ),
    pytest.param(
        ["submit", "-A", "ml/nlp", "-G", "1", "--duration", "1e400s"],
        "invalid",
        "invalid duration",
        id="an infinite duration",
    ),
    pytest.param(
        ["shares", "--window", "0"],
        "invalid",
        "invalid --window: must be int >= 1, got 0",
        id="a zero window",
    ),
    pytest.param(["usage", "--window", "-1d"], "invalid", "invalid duration", id="negative window"),
    pytest.param(
        ["report", "delivered", "--window", "0s"], "invalid", "must be int >= 1", id="zero span"
    ),
    pytest.param(
        ["report", "delivered", "--team-depth", "0"], "invalid", "must be int >= 1", id="depth 0"
    ),
    # the option's own words since 82ff6b11, no longer the type's "must be float ..., got nan"
    pytest.param(
        ["shares", "--at", "nan"], "invalid", "invalid --at 'nan': not a time", id="--at nan"
    ),
    pytest.param(
        ["shares", "--at", "inf"], "invalid", "invalid --at 'inf': not a time", id="--at inf"
    ),
    pytest.param(["up", "--log-level", "LOUD"], "usage", "'LOUD' is not one of", id="log level"),
    pytest.param(["queue", "--bogus"], "usage", "No such option", id="an unknown option"),
    pytest.param(["jobs", "--limit", "0"], "invalid", "`limit` must be int >= 1", id="limit 0"),
    pytest.param(["explain", "999"], "unknown", "no job 999", id="an unknown job"),
]


@pytest.mark.parametrize(("args", "code", "words"), REJECTED)
def test_every_failure_is_one_line_with_a_stable_code_and_appends_nothing(
    home: Path, args: list[str], code: str, words: str
) -> None:
    before = rows(home)
    line = one_line(run(home, *args, actor="alice"), code)
    assert words in line
    assert rows(home) == before


def test_the_scheduler_keeps_working_after_refused_overflows(home: Path) -> None:
    run(home, "share", "set", "ml/nlp", "9223372036854775808")
    run(home, "submit", "-A", "ml/nlp", "-G", "1", "--priority", "99999999999999999999")
    ok(home, "projection", "rebuild")
    ok(home, "queue")
    ok(home, "shares")


def test_an_old_store_with_values_outside_the_bounds_still_works(home: Path) -> None:
    """Stored before the bounds existed: clamped into them when read, for every reader."""
    ledger = Ledger(home)
    head = ledger.head()
    ledger.close()
    at = time.time()
    old = [
        e.SharesSet(event_id="old-1", at=at, actor="root", account="ml/nlp", shares=2**63),
        e.JobSubmitted(
            event_id="old-2", at=at, actor="alice", job_id=1, account="ml/nlp", user="alice",
            gpus=1, min_runtime_s=60, priority=10**20, labels={"k": "v" * 5_000},
        ),
    ]  # fmt: skip
    # msgspec encodes what Python holds: the values the old code stored
    append_raw(home, [(e.tag_of(type(ev)), msgspec.json.encode(ev)) for ev in old])
    assert json.loads(rows(home)[-1][-1])["priority"] == 10**20
    ok(home, "projection", "rebuild")
    jobs = json.loads(ok(home, "jobs", "--json"))
    assert [(j["job_id"], j["priority"]) for j in jobs] == [(1, 1_000_000_000)]
    shares = {r["account"]: r["raw_shares"] for r in json.loads(ok(home, "shares", "--json"))}
    assert shares["ml/nlp"] == 1_000_000_000
    ok(home, "queue")
    assert codec.decode(rows(home)[-1][-1]).labels == {"k": "v" * 1_000}  # type: ignore[union-attr]
    assert head + 2 == Ledger(home).head()


def test_budget_kind_mismatch_and_strangers_member_shares_are_refused(
    home: Path, tmp_path: Path
) -> None:
    before = rows(home)
    kind = tmp_path / "kind.toml"
    kind.write_text(BUDGET.replace('kind = "project"', 'kind = "program"'))
    line = one_line(run(home, "budget", "apply", str(kind)), "invalid")
    assert "'ml/nlp' is a project in the ledger but a program in the file" in line
    stranger = tmp_path / "stranger.toml"
    stranger.write_text(BUDGET + "member_shares = { bob = 2 }\n")
    line = one_line(run(home, "budget", "apply", str(stranger)), "invalid")
    assert "member_shares to bob, who are not in its members" in line
    huge = tmp_path / "huge.toml"
    huge.write_text(BUDGET.replace("shares = 1\n", "shares = 100000000000000000000\n", 1))
    line = one_line(run(home, "budget", "apply", str(huge)), "invalid")
    assert "account 'ml': `shares` must be int <= 1000000000" in line
    assert rows(home) == before


def test_environment_problems_are_named_with_their_path(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    line = one_line(run(a_file, "init", "--admin", "root"), "usage")
    assert str(a_file) in line and "is a file" in line
    inside = a_file / "ledger"
    line = one_line(run(inside, "init", "--admin", "root"), "environment")
    assert str(inside) in line
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "events.sqlite").write_bytes(os.urandom(4096))
    line = one_line(run(garbage, "jobs"), "environment")
    assert str(garbage / "events.sqlite") in line and "unreadable" in line


def test_an_unreachable_broker_is_named_without_client_logging(home: Path) -> None:
    """The store is the system of record: `up` keeps scheduling through a broker outage (issue
    16) and says so in its own words, naming the address; kafka-python's logging stays out."""
    proc = run(home, "up", "--kafka", "127.0.0.1:1", "--for", "3s")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 0, proc.stderr
    assert any("Kafka at 127.0.0.1:1 is unreachable" in line for line in lines), proc.stderr
    assert all(" gpuledger." in line for line in lines), proc.stderr
    assert "Traceback" not in proc.stderr


def test_output_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    home = tmp_path / "big"
    ledger = Ledger(home)
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path=f"p{i}", kind="program", reason="x" * 200)
            for i in range(800)
        ]
    )
    ledger.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env["GPULEDGER_HOME"] = str(home)
    for args in (["log", "--limit", "1000"], ["log", "--json", "--limit", "1000"]):
        proc = subprocess.run(
            f"'{GPULEDGER}' {' '.join(args)} | head -1",
            shell=True,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            executable="/bin/bash",
        )
        assert proc.stdout.count("\n") == 1
        assert proc.stderr == "", proc.stderr
