"""One cap on the SIGTERM-to-SIGKILL grace for every engine and read (atk49-23 F6): `up --grace
10m` started, every read said "SIGKILL at stop + 600 s", and the agent (handed the service's
grace as the part's own, capped at `MAX_GRACE_S`) killed at stop + 120 s. Now a `--grace`
above the cap is refused at start, and a grace recorded above it (a log written before) reads
as the cap, as the engines apply it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.core.state import State
from ledger.server.run import serve
from ledger.wire import config
from schemas import commands as c
from schemas.bounds import MAX_GRACE_S, job_grace
from schemas.errors import InvalidCommand
from schemas.units import Duration, when
from tests.unit.test_service_grace import Recording, _configure, _queue, _running


def test_a_grace_above_the_cap_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    for grace in ("10m", "2h"):
        with pytest.raises(InvalidCommand, match="more than the 120 s any job gets") as err:
            serve(tmp_path / "home", config.ServeConfig(grace=Duration(grace)))
        assert "\n" not in err.value.line()
    assert not (tmp_path / "home").exists()  # refused before the data directory is touched
    config.check_grace(MAX_GRACE_S)  # the cap itself is fine


def test_the_services_grace_is_capped_as_a_jobs_own() -> None:
    assert job_grace(None, 600.0) == MAX_GRACE_S == job_grace(600, 30.0)
    assert job_grace(None, 90.0) == 90.0


@pytest.fixture
def w(org_state: State) -> Recording:
    return Recording(org_state)


def test_reads_count_a_grace_recorded_above_the_cap_as_the_cap(w: Recording) -> None:
    _configure(w, 600)  # recorded by a service started before the refusal
    cancelled = _running(w)
    w.now += 5
    w.run(c.CancelJob(actor="alice", job_id=cancelled))
    row = _queue(w, w.now + 1)[cancelled]
    assert row.kill_at == w.now + MAX_GRACE_S  # not + 600
    assert f"SIGKILL at {when(w.now + MAX_GRACE_S)} at the latest" in row.reason
    limited = _running(w, 1, time_limit_s=60)
    start = w.state.jobs[limited].started_at
    assert start is not None
    assert _queue(w, start + 61)[limited].kill_at == start + 60 + MAX_GRACE_S


def test_up_refuses_a_grace_above_the_cap_before_registering_its_nodes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ledger.cli import cli

    env = {"GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_USER": "root"}
    assert CliRunner().invoke(cli, ["init", "--admin", "root"], env=env).exit_code == 0
    out = CliRunner().invoke(cli, ["up", "--node", "n9:2", "--grace", "10m"], env=env)
    assert out.exit_code == 1 and "more than the 120 s any job gets" in out.output, out.output
    listed = CliRunner().invoke(cli, ["node", "list", "--json"], env=env)
    assert listed.exit_code == 0 and "n9" not in listed.output  # registered none


def test_the_agent_refuses_a_grace_above_the_cap_at_start_in_one_line(tmp_path: Path) -> None:
    """As `serve`/`up` (s50): `agent --grace 10m` started and capped every stop at 120 s. The
    refusal comes first, before the URL is looked at or the state directory touched."""
    from click.testing import CliRunner

    from ledger.cli import cli

    state = tmp_path / "agent"
    out = CliRunner().invoke(cli, ["agent", "--grace", "10m", "--state-dir", str(state)])
    assert out.exit_code == 1 and "more than the 120 s any job gets" in out.output, out.output
    assert len(out.output.strip().splitlines()) <= 2  # the line and its hint
    assert not state.exists()
