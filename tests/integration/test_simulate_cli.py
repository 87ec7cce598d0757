"""`gpuledger simulate` through the installed console script: the real Philly trace in a reduced
form, the compare table and report files, dumps, and determinism across hash seeds."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.sim.workload import Synthetic, parse_trace, synthetic

PHILLY = Path(__file__).resolve().parents[2] / "examples/traces/philly-4plusgpu-sample.csv.gz"
GPULEDGER = Path(sys.executable).with_name("gpuledger")


def cli(home: Path, *args: str, hashseed: str = "0") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    return subprocess.run(
        [str(GPULEDGER), "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_philly_trace_end_to_end_reduced(tmp_path: Path) -> None:
    home = tmp_path / "cmp"
    out = cli(
        home,
        "simulate", "compare", "--trace", str(PHILLY), "--days", "2", "--nodes", "12",
        "--policies", "fairshare,slurm",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["policy", "owed", "by", "period"]
    assert [ln.split()[0] for ln in lines[1:3]] == ["fairshare", "slurm"]
    assert "simulated days/s" in out.stdout and "events/s" in out.stdout
    report = json.loads((home / "report" / "report.json").read_text())
    assert [r["policy"] for r in report] == ["fairshare", "slurm"]
    for r in report:
        m = r["metrics"]
        assert m["teams"] >= 10
        assert 0.8 < m["occupancy"] <= 1.0
        assert m["jobs_submitted"] == r["workload"]["jobs"] > 100
        assert r["speed"]["events"] > 1000
    for png in ("owed_delivered_over_time", "owed_delivered_by_team", "convergence", "waits"):
        assert (home / "report" / f"{png}.png").stat().st_size > 1000
    assert "| fairshare |" in (home / "report" / "report.md").read_text()
    # every other command works on a simulation's data directory
    jobs = cli(home / "fairshare", "jobs")
    assert jobs.returncode == 0 and "prog" in jobs.stdout
    delivered = cli(home / "fairshare", "report", "delivered", "--help")
    assert delivered.returncode == 0


def test_dump_writes_the_workload_with_every_column(tmp_path: Path) -> None:
    out = tmp_path / "w.csv.gz"
    args = ("--synthetic", "--teams", "3", "--users", "9", "--programs", "1", "--days", "2")
    done = cli(tmp_path / "unused", "simulate", "dump", str(out), *args, "--nodes", "4")
    assert done.returncode == 0, done.stderr
    rows = parse_trace(out.read_bytes()).jobs
    want = synthetic(Synthetic(teams=3, users=9, programs=1, days=2, capacity_gpus=32))
    assert [(r.job_id, r.group, r.user, r.gpus, r.min_runtime_s, r.resumable) for r in rows] == [
        (j.key, j.account, j.user, j.gpus, j.min_runtime_s, j.resumable) for j in want.jobs
    ]
    assert (tmp_path / "w.budgets.toml").read_text().startswith('[accounts."prog1"]')
    # the dump replays: budgets from the TOML beside it, every column used as given
    replay = cli(
        tmp_path / "replay",
        "simulate", "run", "--trace", str(out), "--budgets", str(tmp_path / "w.budgets.toml"),
        "--days", "1", "--nodes", "4", "--no-plots", "--json",
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    notes = json.loads(replay.stdout)[0]["workload"]["notes"]
    assert notes == ["budget tree from the budgets file (4 accounts)"]


def test_same_seed_same_log_whatever_the_hash_seed(tmp_path: Path) -> None:
    args = (
        "simulate", "run", "--synthetic", "--teams", "3", "--users", "9", "--programs", "1",
        "--days", "1", "--nodes", "4", "--no-plots", "--seed", "7",
    )  # fmt: skip
    a = cli(tmp_path / "a", *args, hashseed="1")
    b = cli(tmp_path / "b", *args, hashseed="2")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr

    def states(home: Path) -> list[bytes]:
        with sqlite3.connect(home / "events.sqlite") as con:
            rows = con.execute("SELECT state FROM stored_events ORDER BY rowid")
            return [bytes(r[0]) for r in rows]

    assert states(tmp_path / "a") == states(tmp_path / "b")


def test_a_second_run_into_the_same_home_is_refused(tmp_path: Path) -> None:
    args = ("simulate", "run", "--synthetic", "--teams", "3", "--users", "9", "--programs", "1")
    small = (*args, "--days", "0.25", "--nodes", "2", "--no-plots")
    assert cli(tmp_path / "h", *small).returncode == 0
    # the relay's progress table, empty, as `gpuledger init` makes it (none: a simulated home's
    # first relay warned of "a dropped table?" that nobody dropped, atk50-25 F7)
    with sqlite3.connect(tmp_path / "h" / "events.sqlite") as db:
        assert db.execute("SELECT count(*) FROM gpuledger_relay_progress").fetchone() == (0,)
    again = cli(tmp_path / "h", *small)
    assert again.returncode == 1
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'h'} already holds a ledger "
        "(a simulation writes a fresh ledger: pass a new --home) [invalid]"
    )


def test_policy_versions_settings_and_the_signal_contract_reach_the_runs(tmp_path: Path) -> None:
    home = tmp_path / "knobs"
    out = cli(
        home,
        "simulate", "compare", "--synthetic", "--days", "1", "--nodes", "8", "--no-plots",
        "--policies", "fairshare-1,fairshare", "--set", "spare_ratio=2",
        "--sigterm-checkpoint", "0.5", "--parallel", "2", "--relaunch-cost", "2m",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads((home / "report" / "report.json").read_text())
    # run in two processes at once, reported in the order asked
    assert [r["policy"] for r in report] == ["fairshare-1", "fairshare"]
    assert (home / "fairshare-1" / "events.sqlite").exists()
    assert [r["config"]["policy_settings"] for r in report] == [{}, {"spare_ratio": "2"}]
    assert all(r["config"]["sigterm_checkpoint_p"] == 0.5 for r in report)
    assert all(r["config"]["relaunch_s"] == 120.0 for r in report)
    kinds = report[1]["metrics"]["lost_by_kind"]
    assert set(kinds) == {"unfunded", "non-resumable", "periodic checkpoints",
                          "checkpoints on SIGTERM", "relaunch"}  # fmt: skip
    assert sum(kinds.values()) == pytest.approx(report[1]["metrics"]["lost_gpu_h"])
    bad = cli(tmp_path / "bad", "simulate", "run", "--synthetic", "--set", "wiggle=1")
    assert bad.returncode != 0
    assert "no policy of this run has the setting wiggle" in bad.stderr


def test_a_sweep_runs_every_policy_on_every_workload_of_the_grid(tmp_path: Path) -> None:
    home = tmp_path / "sweep"
    out = cli(
        home,
        "simulate", "sweep", "--family", "demand=2 debug=0.2", "--grid", "teams=3/6",
        "--seeds", "1,2", "--policies", "fifo,fairshare", "--nodes", "4", "--days", "0.25",
        "--parallel", "2",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads((home / "report" / "sweep.json").read_text())
    assert [d["workload"] for d in data] == [
        "teams=3 seed=1", "teams=3 seed=2", "teams=6 seed=1", "teams=6 seed=2",
    ]  # fmt: skip
    for d in data:
        assert [r["policy"] for r in d["runs"]] == ["fifo", "fairshare"]
        seed = int(d["workload"].rsplit("=", 1)[1])
        assert all(r["config"]["seed"] == seed for r in d["runs"])
        names = {r["workload"]["name"] for r in d["runs"]}
        assert len(names) == 1 and "demand=2 " in names.pop()
    # the same workload for both policies, a different one per seed
    jobs = [d["runs"][0]["workload"]["jobs"] for d in data]
    assert jobs[0] != jobs[1]
    lines = (home / "report" / "runs.jsonl").read_text().splitlines()
    assert sorted((json.loads(x)["workload"], json.loads(x)["run"]["policy"]) for x in lines) == [
        (d["workload"], r["policy"])
        for d in data
        for r in sorted(d["runs"], key=lambda r: r["policy"])
    ]
    md = (home / "report" / "sweep.md").read_text()
    assert md.count("| teams=6 seed=2 |") == 2
    assert (home / "004" / "fairshare" / "events.sqlite").exists()
    # a bad grid is refused in one line before any run
    bad = cli(tmp_path / "bad", "simulate", "sweep", "--grid", "colour=red/blue")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1].startswith("error: invalid family setting")
    assert not (tmp_path / "bad" / "001").exists()
    tiny = cli(tmp_path / "tiny", "simulate", "sweep", "--grid", "gpus=256/12")
    assert tiny.returncode == 1
    assert "gpus=12: not a positive multiple" in tiny.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "tiny" / "001").exists()
    both = cli(tmp_path / "both", "simulate", "run", "--family", "--synthetic")
    assert both.returncode == 1 and "exactly one of" in both.stderr
