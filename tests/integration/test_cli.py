"""The `gpuledger` console script, run as a real subprocess on a real data directory."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"

BUDGET = """
[accounts."ai2"]
kind = "program"
shares = 1
managers = ["carol"]

[accounts."ai2/olmo"]
kind = "project"
shares = 3
members = ["alice", "bob"]
member_shares = { alice = 2 }

[accounts."ai2/tulu"]
kind = "project"
shares = 1
members = ["dan"]
"""


def run(
    home: Path, *args: str, actor: str | None = "root", ok: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env["GPULEDGER_HOME"] = str(home)
    if actor is not None:
        env["GPULEDGER_USER"] = actor
    proc = subprocess.run([GPULEDGER, *args], env=env, capture_output=True, text=True, timeout=60)
    if ok:
        assert proc.returncode == 0, f"{args}: {proc.stderr}"
    return proc


def store_rows(home: Path) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(home / "events.sqlite")) as db:
        return db.execute("SELECT rowid, * FROM stored_events ORDER BY rowid").fetchall()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data directory every test starts from, built once per module by the CLI: the
    organisation of `BUDGET` and nodes n1, n2 (8 x h100 each). Tests get copies (`home`)."""
    tmp = tmp_path_factory.mktemp("built")
    h = tmp / "ledger"
    run(h, "init", "--admin", "root")
    budget = tmp / "budget.toml"
    budget.write_text(BUDGET)
    run(h, "budget", "apply", str(budget))
    run(h, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100")
    run(h, "node", "add", "n2", "--gpus", "8", "--gpu-type", "h100")
    return h


@pytest.fixture
def home(built: Path, tmp_path: Path) -> Path:
    """A copy of `built` of this test's own (no process has it open: a copy is the same data
    directory), with the budget file it was applied from beside it."""
    (tmp_path / "budget.toml").write_text(BUDGET)
    h = tmp_path / "ledger"
    shutil.copytree(built, h)
    return h


def test_budget_apply_builds_the_tree_and_a_second_apply_changes_nothing(
    home: Path, tmp_path: Path
) -> None:
    tree = json.loads(run(home, "account", "tree", "--json").stdout)
    got = {r["path"]: (r["kind"], r["shares"]) for r in tree}
    assert got == {
        "ai2": ("program", 1),
        "ai2/olmo": ("project", 3),
        "ai2/olmo/alice": ("user", 2),
        "ai2/olmo/bob": ("user", 1),
        "ai2/tulu": ("project", 1),
        "ai2/tulu/dan": ("user", 1),
    }
    olmo = next(r for r in tree if r["path"] == "ai2/olmo")
    assert olmo["norm_shares"] == pytest.approx(0.75)
    again = run(home, "budget", "apply", str(tmp_path / "budget.toml"))
    assert "no changes" in again.stdout


def test_budget_dry_run_prints_the_diff_and_appends_nothing(home: Path, tmp_path: Path) -> None:
    changed = tmp_path / "changed.toml"
    changed.write_text(
        BUDGET.replace("shares = 3", "shares = 5").replace('["dan"]', '["dan", "erin"]')
    )
    before = store_rows(home)
    out = run(home, "budget", "apply", str(changed), "--dry-run").stdout
    assert "~ shares ai2/olmo 3 -> 5" in out
    assert "+ member erin -> ai2/tulu" in out
    assert store_rows(home) == before
    run(home, "budget", "apply", str(changed))
    tree = {
        r["path"]: r["shares"] for r in json.loads(run(home, "account", "tree", "--json").stdout)
    }
    assert tree["ai2/olmo"] == 5 and tree["ai2/tulu/erin"] == 1


def test_one_budget_change_is_said_in_the_singular(home: Path, tmp_path: Path) -> None:
    """ "plan: 1 changes" (atk61-29b)."""
    changed = tmp_path / "changed.toml"
    changed.write_text(BUDGET.replace("shares = 3", "shares = 5"))
    out = run(home, "budget", "apply", str(changed), "--dry-run").stdout
    assert out.endswith("plan: 1 change (dry run: nothing appended)\n"), out
    out = run(home, "budget", "apply", str(changed)).stdout
    assert "applied 1 change as 1 event " in out, out


def test_submit_and_list_jobs(home: Path) -> None:
    out = run(
        home,
        "submit",
        "-A",
        "ai2/olmo",
        "-G",
        "4",
        "--min-runtime",
        "2h",
        "--resumable",
        "--",
        "python",
        "train.py",
        actor="alice",
    ).stdout
    assert "submitted job 1 to ai2/olmo: 4 GPUs, contract 2h" in out
    run(home, "submit", "-A", "ai2/olmo", "-G", "1", "-t", "10m", "--min-runtime", "0", actor="bob")
    jobs = json.loads(run(home, "jobs", "--json").stdout)
    assert [(j["job_id"], j["user"], j["funded"], j["debug"], j["status"]) for j in jobs] == [
        (2, "bob", False, True, "pending"),
        (1, "alice", True, False, "pending"),
    ]
    assert jobs[1]["command"] == ["python", "train.py"]
    assert jobs[1]["min_runtime_s"] == 7200


REJECTED = [
    pytest.param(
        ["submit", "-A", "ai2/olmo", "-G", "4"],
        "dan",
        "'dan' is not a member of 'ai2/olmo'",
        id="non-member submits",
    ),
    pytest.param(
        ["submit", "-A", "ai2/nope", "-G", "4"],
        "alice",
        "unknown account 'ai2/nope'",
        id="unknown account",
    ),
    pytest.param(
        ["submit", "-A", "ai2/olmo", "-G", "4", "--min-runtime", "9h"],
        "alice",
        "outside 0..28800s",
        id="contract over the cap",
    ),
    pytest.param(
        ["submit", "-A", "ai2/olmo", "-G", "17"],
        "alice",
        "17 GPUs requested but the cluster has 16 GPUs",
        id="more GPUs than the cluster",
    ),
    pytest.param(
        ["submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "soon"],
        "alice",
        "invalid --min-runtime 'soon'",
        id="malformed duration",
    ),
    pytest.param(
        ["node", "drain", "n1", "--reason", "x"], "alice", "only admins may", id="non-admin drains"
    ),
    pytest.param(
        ["share", "set", "ai2/olmo", "9"],
        "alice",
        "needs a manager of 'ai2'",
        id="user sets shares",
    ),
    pytest.param(
        ["share", "set", "--", "ai2/olmo", "-1"],
        "root",
        "`shares` must be int >= 0, got -1",
        id="negative shares",
    ),
    pytest.param(
        ["account", "open", "ai2/olmo/x", "--kind", "program"],
        "root",
        "a program cannot sit under project",
        id="program under project",
    ),
    pytest.param(
        ["account", "close", "ai2"], "root", "still has open accounts below it", id="close a parent"
    ),
    pytest.param(["cancel", "99"], "alice", "unknown job 99", id="cancel unknown job"),
    pytest.param(
        ["manager", "grant", "alice", "ai2"],
        "carol",
        "only admins may",
        id="manager grants managers",
    ),
    pytest.param(
        ["submit", "-A", "ai2/olmo", "-G", "1"],
        "@dispatcher",
        "is a system actor",
        id="person poses as system actor",
    ),
    pytest.param(
        ["submit", "-A", "ai2/olmo", "-G", "1"],
        None,
        "'root' is not a member of 'ai2/olmo'",
        id="no --as: the OS user acts",
    ),
]


@pytest.mark.parametrize(("args", "actor", "want_error"), REJECTED)
def test_rejected_commands_print_one_line_and_append_nothing(
    home: Path, args: list[str], actor: str | None, want_error: str
) -> None:
    before = store_rows(home)
    proc = run(home, *args, actor=actor, ok=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert want_error in lines[0]
    assert "Traceback" not in proc.stderr
    assert store_rows(home) == before


@pytest.mark.parametrize(
    ("content", "want_error"),
    [
        pytest.param("x = [", "malformed TOML", id="malformed TOML"),
        pytest.param(
            '[accounts."ai2"]\nkind = "galaxy"\n', "Invalid enum value 'galaxy'", id="unknown kind"
        ),
        pytest.param(
            '[accounts."ai2"]\nkind = "program"\ncolour = 1\n',
            "unknown field `colour`",
            id="unknown field",
        ),
        pytest.param(
            '[accounts."x/y"]\nkind = "project"\n', "unknown account 'x'", id="parent missing"
        ),
    ],
)
def test_bad_budget_files_are_rejected_whole(
    home: Path, tmp_path: Path, content: str, want_error: str
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(content)
    before = store_rows(home)
    proc = run(home, "budget", "apply", str(bad), ok=False)
    assert proc.returncode == 1
    assert want_error in proc.stderr
    assert store_rows(home) == before


def test_a_manager_edits_only_their_subtree(home: Path) -> None:
    run(
        home, "account", "open", "ai2/olmo/sub", "--kind", "project", "--shares", "2", actor="carol"
    )
    run(home, "share", "set", "ai2/tulu", "2", actor="carol")
    proc = run(home, "account", "open", "other", "--kind", "program", actor="carol", ok=False)
    assert "only admins may" in proc.stderr


def test_drain_of_an_empty_node_reports_drained_and_log_shows_it(home: Path) -> None:
    out = run(home, "node", "drain", "n2", "--reason", "kernel upgrade").stdout
    assert "n2 is drained (it was empty)" in out
    nodes = {n["node"]: n["state"] for n in json.loads(run(home, "node", "list", "--json").stdout)}
    assert nodes == {"n1": "active", "n2": "drained"}
    log = json.loads(run(home, "log", "--json", "--after", "0", "--limit", "1000").stdout)
    tags = [r["event"]["type"] for r in log]
    assert tags[-2:] == ["node.drain_requested.v1", "node.drained.v1"]
    assert [r["position"] for r in log] == list(range(1, len(log) + 1))


def test_commands_on_a_missing_ledger_say_how_to_start(tmp_path: Path) -> None:
    proc = run(tmp_path / "none", "jobs", ok=False)
    assert proc.returncode == 1
    assert "no ledger in" in proc.stderr and "gpuledger init" in proc.stderr


def test_reads_after_an_upgrade_make_an_older_projection_again(home: Path) -> None:
    """A data directory whose projection an older version wrote: the first read makes it again
    from the log (one warning line) and answers as before; no manual step."""
    run(home, "--as", "alice", "submit", "-A", "ai2/olmo", "-G", "1", "--", "true")
    before = json.loads(run(home, "jobs", "--json").stdout)
    import duckdb

    with closing(duckdb.connect(str(home / "projections" / "ledger.duckdb"))) as db:
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    got = run(home, "jobs", "--json")
    assert json.loads(got.stdout) == before
    assert "schema version 1" in got.stderr and "made again from the log" in got.stderr
    assert run(home, "jobs", "--json").stderr == ""  # once


def test_import_shares_keeps_roots_users_and_names_what_it_moves_or_leaves_out(
    tmp_path: Path,
) -> None:
    """atk46-23 F6: `root||alice|3` vanished without a word, and an account whose parent is in
    no line made a file `budget apply` refused (`unknown account 'nope'`). Both files apply;
    alice is a member of root/root; the orphan and Slurm's own root user are named."""
    h = tmp_path / "ledger"
    run(h, "init", "--admin", "root")
    c1, c2 = tmp_path / "c1.txt", tmp_path / "c2.txt"
    c1.write_text("root|||1\nroot||root|1\nroot||alice|3\nphysics|root||2\nphysics||bob|1\n")
    c2.write_text("orphan|nope||1\norphan||u2|1\n")
    done = run(h, "slurm", "import-shares", "--from", str(c1), "-o", str(tmp_path / "b1.toml"))
    assert "members of the project root/root: alice" in done.stderr, done.stderr
    assert "left out: root/root" in done.stderr
    done = run(h, "slurm", "import-shares", "--from", str(c2), "-o", str(tmp_path / "b2.toml"))
    assert "placed at the top: orphan (parent nope)" in done.stderr, done.stderr
    run(h, "budget", "apply", str(tmp_path / "b1.toml"))
    run(h, "budget", "apply", str(tmp_path / "b2.toml"))
    tree = {a["path"]: a for a in json.loads(run(h, "account", "tree", "--json").stdout)}
    roots = "root/root"  # (a path of its own, not a machine's home)
    assert tree[roots]["members"] == ["alice"] and tree[f"{roots}/alice"]["shares"] == 3
    assert tree["root/physics"]["members"] == ["bob"]
    assert tree["root/orphan"]["members"] == ["u2"]


def test_jobs_status_filters_by_how_jobs_ended_as_sacct_s(home: Path) -> None:
    """atk46-23 F2: `jobs --status time_limit` (or `TO`, `CA`) was a usage error: `--status`
    took states only, where docs/slurm-users.md maps sacct's `-s STATE` to it. Finish reasons
    and sacct's names and abbreviations select finished jobs by how they ended."""
    for _ in range(3):
        run(home, "submit", "-A", "ai2/olmo", "-G", "1", "-t", "1", "--", "true", actor="alice")
    run(home, "cancel", "1", actor="alice")

    def ids(*status: str) -> list[int]:
        out = run(home, "jobs", "--status", *status, "--json", actor="alice").stdout
        return [j["job_id"] for j in json.loads(out)]

    assert ids("CA") == ids("cancelled") == ids("cancelled,TO") == ids("CANCELLED") == [1]
    assert ids("completed") == ids("TO,F,NF") == []
    assert ids("pending") == ids("PD") == [3, 2]
    table = run(home, "jobs", "--status", "ca", actor="alice").stdout
    assert "cancelled" in table and "pending" not in table
    for bad, said in (("R,TO", "one state at a time"), ("nope", "invalid --status 'nope'")):
        done = run(home, "jobs", "--status", bad, actor="alice", ok=False)
        assert done.returncode != 0 and said in done.stderr, done.stderr
    # a page with more after it says so, and where the next begins (atk47-29 F5: it stopped at
    # 200 rows without a word, while the dashboard said "of 134,417")
    full = run(home, "jobs", "--limit", "2", actor="alice")
    assert "the newest 2 shown; more match" in full.stderr and "--before-id 2" in full.stderr
    assert "more match" not in run(home, "jobs", "--limit", "3", actor="alice").stderr
    assert len(json.loads(run(home, "jobs", "--limit", "2", "--json", actor="alice").stdout)) == 2


def test_an_arrays_task_is_named_id_task_and_one_cancel_names_a_task_twice_without_error(
    home: Path,
) -> None:
    """atk46-23 F1: task 0 of an array could not be cancelled alone (its id is the array's),
    `cancel 17_0` and `jobs -j 17_2` were usage errors, and `cancel 17 19` reported 19 as an
    error after the same command had cancelled it. Slurm's ARRAY_TASK form names one task."""
    run(home, "submit", "-A", "ai2/olmo", "-G", "1", "-a", "0-3", "--", "true", actor="alice")
    done = run(home, "cancel", "1_0", actor="alice")
    assert "cancelled job 1 " in done.stdout, done.stdout
    rows = json.loads(run(home, "jobs", "--json", actor="alice").stdout)
    assert {j["job_id"]: j["status"] for j in rows} == {
        1: "finished",
        2: "pending",
        3: "pending",
        4: "pending",
    }
    picked = json.loads(run(home, "jobs", "-j", "1_2,1_3", "--json", actor="alice").stdout)
    assert [(j["job_id"], j["array_task_id"]) for j in picked] == [(4, 3), (3, 2)]
    done = run(home, "cancel", "1", "3", actor="alice")
    assert "cancelled jobs 2, 3, 4" in done.stdout and "job 3: already cancelled" in done.stdout
    assert done.stderr == ""
    done = run(home, "cancel", "1_9", "x_1", actor="alice", ok=False)
    assert done.returncode == 1
    assert "job 1 is no array with a task 9" in done.stderr
    assert "invalid job id 'x_1'" in done.stderr


def test_authorization_jwt_dsn_and_token_shaped_values_never_reach_the_log(home: Path) -> None:
    """atk46-23 F10: AUTHORIZATION, HTTP_AUTHORIZATION, CI_JOB_JWT, SENTRY_DSN and a GitHub
    token under a plain name were recorded in `job.submitted` (the immutable log, Kafka). A
    real submit with them exported: named in the note, not one of their values in the store."""
    leaks = {"AUTHORIZATION": "Basic dXNlcjpwYXNzLEAK1", "HTTP_AUTHORIZATION": "Bearer LEAK2abcd",
             "CI_JOB_JWT": "eyJhbGciOiLEAK3", "SENTRY_DSN": "https://LEAK4abc@o1.ingest.sentry.io/1",
             "GHP": "ghp_LEAK5abcdefghijklmnopqrstuvwxyz0123"}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(GPULEDGER_HOME=str(home), GPULEDGER_USER="alice", PLAIN_VAR="kept", **leaks)
    done = subprocess.run(
        [GPULEDGER, "submit", "-A", "ai2/olmo", "-G", "1", "-t", "1", "--", "true"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all(name in done.stderr for name in leaks), done.stderr
    stored = repr(store_rows(home))
    assert "kept" in stored and not [v for v in leaks.values() if v in stored]
