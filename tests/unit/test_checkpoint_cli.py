"""`gpuledger checkpoint` inside a job whose start its server has not recorded yet (the job
runs; the ledger says `placed` until its node's next report): the checkpoint is said through
the job's checkpoint file, which the executor records once the job is running, not refused
(a job that checkpointed at once was answered "job 5 is placed, not running")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.cli import _common, cli
from schemas.errors import InvalidTransition


class NotYetRunning:
    """The server's answer to the job's report while its start is not recorded."""

    def execute(self, cmd: Any, key: str | None = None) -> Any:
        raise InvalidTransition(f"job {cmd.job_id} is placed, not running")


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common.Ctx, "remote", property(lambda self: NotYetRunning()))


def run(tmp_path: Path, job: str, **env: str) -> Any:
    base = {"GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_JOB_ID": "5"}
    return CliRunner().invoke(cli, ["checkpoint", job], env={**base, **env})


def test_inside_the_job_a_refused_report_becomes_its_checkpoint_file(
    tmp_path: Path, server: None
) -> None:
    mark = tmp_path / "work" / "checkpoint"
    mark.parent.mkdir()
    out = run(tmp_path, "5", GPULEDGER_JOB_TOKEN="glj_x", GPULEDGER_CHECKPOINT_FILE=str(mark))
    assert out.exit_code == 0, out.output
    assert mark.exists() and "GPULEDGER_CHECKPOINT_FILE" in out.output


@pytest.mark.parametrize("case", ["another job", "no checkpoint file", "not inside a job"])
def test_anywhere_else_the_refusal_stands(tmp_path: Path, server: None, case: str) -> None:
    mark = tmp_path / "checkpoint"
    env = {"GPULEDGER_JOB_TOKEN": "glj_x", "GPULEDGER_CHECKPOINT_FILE": str(mark)}
    if case == "no checkpoint file":
        del env["GPULEDGER_CHECKPOINT_FILE"]
    if case == "not inside a job":
        del env["GPULEDGER_JOB_TOKEN"]
        env["GPULEDGER_JOB_ID"] = "9"  # not the job reported: the file is not its to touch
    out = run(tmp_path, "6" if case == "another job" else "5", **env)
    assert out.exit_code != 0 and "not running" in out.output, out.output
    assert not mark.exists()
