"""Red team, another account on the host (threat model row T13, docs/security.md): the store,
which holds every job's command, is created readable by its owner only, and so are the files
SQLite writes beside it; a job's spec (its command, environment and token), work directory and
output are its owner's and the service's alone."""

from __future__ import annotations

import dataclasses
import secrets
import stat
import subprocess
import time
from pathlib import Path

import pytest

from ledger.engines.supervised import SupervisedExecutor
from ledger.store import EVENTS_DB
from ledger.store.application import Ledger
from ledger.store.embedded import EmbeddedSource
from projections.projector import Projector
from projections.store import Store, projection_path
from schemas import commands as c
from tests.integration.execkit import job, kill_leftovers, launch, stop, wait_starts
from tests.integration.userkit import os_user, shared_dir


def test_the_store_and_its_wal_are_created_for_their_owner_only(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    ledger = Ledger(home)
    try:
        ledger.execute(c.InitLedger(actor="root", admin="root"))
        ledger.execute(c.OpenAccount(actor="root", path="ai2", kind="program"))
        files = sorted(home.glob(f"{EVENTS_DB}*"))
        assert [f.name for f in files][:1] == [EVENTS_DB], files
        for f in files:
            mode = stat.S_IMODE(f.stat().st_mode)
            assert mode & 0o077 == 0, f"{f.name} is {oct(mode)}"
    finally:
        ledger.close()


def test_an_existing_store_keeps_its_mode(tmp_path: Path) -> None:
    """An operator's choice (a group that reads the store) is not undone at the next start."""
    home = tmp_path / "ledger"
    Ledger(home).close()
    (home / EVENTS_DB).chmod(0o640)
    Ledger(home).close()
    assert stat.S_IMODE((home / EVENTS_DB).stat().st_mode) == 0o640


SPEC_SECRET = "wk_9d2e7b41c0"


@pytest.mark.parametrize("agent", [False, True], ids=["up", "agent"])
def test_a_jobs_spec_work_and_output_are_private_to_the_service_and_its_owner(agent: bool) -> None:
    """Finding F9: a part's spec (`<state>/runs/<run>/<rank>/spec.json`: the job's command,
    environment, directory and GPULEDGER_JOB_TOKEN) was 0644 under `up`'s and the agents'
    state directories. Another real account on the host, knowing every path, reads none of it,
    nor the job's checkpoint or output; the job itself still reaches its checkpoint file."""
    with os_user("glto") as owner, os_user("glte") as other, shared_dir() as top:
        state, jobs = top / "state", top / "jobs"  # a traversable place, like /var/lib
        ex = SupervisedExecutor(
            state, jobs, run_as="submitter", local_node="n0" if agent else None
        )  # closed here (execkit's `executor` would close it again after the directory went)
        token = "glj_" + secrets.token_hex(16)
        script = f'echo saved > "$GPULEDGER_CHECKPOINT_FILE"; echo said {SPEC_SECRET}; sleep 600'
        the_job = dataclasses.replace(
            job(7, script), user=owner.name, job_token=token, env=(("WANDB", SPEC_SECRET),)
        )
        try:
            launch(ex, the_job)
            wait_starts(ex)
            part = state / "runs" / "7.1" / "0"
            checkpoint, log = part / "work" / "checkpoint", jobs / "job-7.log"
            deadline = time.monotonic() + 30
            while not (checkpoint.exists() and SPEC_SECRET in log.read_text()):
                assert time.monotonic() < deadline, "the job never wrote its checkpoint and log"
                time.sleep(0.05)
            assert token in (part / "spec.json").read_text()  # the service reads it
            assert stat.S_IMODE((part / "spec.json").stat().st_mode) == 0o600
            paths = [part / "spec.json", checkpoint, log, part / "launch.log", part / "exit"]
            probe = "; ".join(
                [f"cat {p}" for p in paths]
                + [f"ls -la {d}" for d in (state / "runs", part.parent, part, part / "work")]
                + [f"grep -rs {token} {top}", f"find {top} -type f -exec cat {{}} +"]
            )
            got = subprocess.run(
                ["/bin/sh", "-c", probe], user=other.uid, group=other.gid, extra_groups=[],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            seen = got.stdout + got.stderr
            for secret in (token, SPEC_SECRET, "saved"):
                assert secret not in seen, (secret, seen)
            assert "Permission denied" in got.stderr, got.stderr
        finally:
            stop(ex, 7)
            ex.close()
            kill_leftovers(state)


def test_the_projection_and_its_wal_are_the_services_alone(tmp_path: Path) -> None:
    """The projection holds every job's command and every event's bytes (`events.raw`): its
    directory is created 0700 and its file 0600, so DuckDB's WAL, which it makes with the
    process's umask, is out of another account's reach too; that account, knowing the paths,
    reads nothing."""
    home = tmp_path / "ledger"
    ledger = Ledger(home)
    try:
        ledger.execute(c.InitLedger(actor="root", admin="root"))
        ledger.execute(c.OpenAccount(actor="root", path="ai2", kind="program"))
    finally:
        ledger.close()
    path = projection_path(home)
    with Store(path) as store, EmbeddedSource(home) as source:
        Projector(store, source).catch_up()  # written, not checkpointed: the WAL is there
        files = sorted(path.parent.iterdir())
        assert path.with_name(path.name + ".wal") in files, files
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the WAL's is the umask's
        with os_user("glte") as other:
            tmp_path.chmod(0o755)  # the way to the data directory is open; the projections not
            got = subprocess.run(
                ["/bin/sh", "-c", f"cat {path} {path}.wal; ls {path.parent}"],
                user=other.uid, group=other.gid, extra_groups=[],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
        assert got.stdout == "" and got.stderr.count("Permission denied") == 3, got
