"""The agent's last check before it starts a launch, from outside, with a real `gpuledger serve
--executor agents` and real agents (atk55-23 F1's last step, made certain).

A launch is carried out from a poll answer; by then the ledger may have moved past it (job 98
of atk55-23: launched 0.29 s after its job was recorded completed, its command run again,
held its GPU its grace and was charged). The window is made certain by the agent's test seam
(`ledger.agent.checks.TEST_HOLD_ENV`): the agent holds the launch it is about to start while
the test cancels the job, then goes on with the answer it had. Before the last check, the
command started (its run directory made, its own file written) and the run was charged from
its start; now the server refuses it, it never starts, and the ledger says so."""

from __future__ import annotations

import signal
from pathlib import Path

from ledger.agent.checks import TEST_HOLD_ENV
from tests.integration.agentkit import Cluster, cluster, template, wait_for

__all__ = ["cluster", "template"]  # the fixtures


def test_a_launch_from_an_answer_the_ledger_has_moved_past_never_starts(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    hold = tmp_path / "hold"
    hold.write_text("")
    for ag in c.agents.values():  # each agent with the seam (none has a run yet)
        ag.kill(signal.SIGTERM)
        ag.prefix = ("env", f"{TEST_HOLD_ENV}={hold}")
        ag.start()
    ran = tmp_path / "ran"
    job = c.submit(1, f"touch {ran}; sleep 120")
    held = Path(f"{hold}.held")
    wait_for("the agent to hold the launch", held.exists, 60, c.why)
    assert held.read_text().split() == [str(job), "0"]
    c.cli("cancel", str(job))
    wait_for("the cancel recorded", lambda: c.job(job)["outcome"] == "cancelled", 60, c.why)
    hold.unlink()  # the agent goes on with the answer that listed the job

    def launched() -> list[Path]:
        return [p for ag in c.agents.values() for p in (ag.state / "runs").glob(f"{job}.*")]

    wait_for("the run's end recorded (or its launch)",
             lambda: launched() or [x for x in c.events("job.run_ended.v2")
                                    if x["job_id"] == job], 60, c.why)  # fmt: skip
    assert not launched(), f"launched after its job was cancelled: {launched()}"
    assert not ran.exists(), "its command ran after its job was cancelled"
    said = "\n".join(ag.text() for ag in c.agents.values())
    assert f"job {job} (run 0) not started" in said, said[-3000:]  # the server refused it
    row = c.job(job)
    assert row["started_at"] is None and row["nodes"] == [], row
    (ended,) = [x for x in c.events("job.run_ended.v2") if x["job_id"] == job]
    assert ended.get("started_at") is None, ended
    explained = c.cli("explain", str(job)).stdout
    assert "never started" in explained and "held, and charged" not in explained, explained
