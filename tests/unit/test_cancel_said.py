"""What `cancel` says of the kill it orders (a second cancel of a stopping job): a service's
engine kills at once; with none running (the command is embedded) nothing can kill until one
starts (stop51: `killed now` was said with `up` down, atk51-23)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.cli import cli
from ledger.store.application import Ledger
from schemas import commands as c
from schemas import events as e


def test_a_kill_ordered_with_no_service_running_is_not_said_done(
    org_ledger: Ledger, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    led = org_ledger
    (sub,) = [ev for ev in led.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1,
                                                   grace_s=60)).events
              if isinstance(ev, e.JobSubmitted)]  # fmt: skip
    job = sub.job_id
    slot = e.GpuSlot(node="n1", gpu_indices=(0,))
    led.execute(c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
        cycle_id="c1", based_on=0, policy_version="test",
        placements=(c.Placement(job_id=job, slots=(slot,)),))))  # fmt: skip
    led.execute(c.StartJob(actor="@executor", job_id=job, engine="agents",
                           engine_job_id=f"{job}.1", run=0))  # fmt: skip
    led.execute(c.CancelJob(actor="alice", job_id=job))  # stopping: its grace
    with pytest.raises(SystemExit) as done:
        cli.main(["--home", str(home), "--as", "alice", "cancel", str(job)], prog_name="gpuledger")
    said = capsys.readouterr().out
    assert done.value.code in (0, None), said
    assert f"job {job} was stopping: SIGKILL ordered (no service runs now" in said, said
    assert "killed now" not in said
