"""Outage mode from the start (issue 24, F8): `gpuledger up --executor slurm` starts while
slurmctld is down, says so in `status`, takes submissions in their usual time, places nothing,
and opens fully (the partition checked, its nodes registered, runs adopted) once the controller
answers. A real Slurm (scripts/slurm/slurm), real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.integration.test_slurm import (  # noqa: F401 (fixtures)
    GPULEDGER,
    SHOW,
    Ledger,
    cluster,
    ledger,
    slurm,
    status,
)


def test_the_service_starts_while_slurmctld_is_down_and_places_once_it_answers(
    ledger: Ledger,  # noqa: F811
) -> None:
    """A ledger whose service ran once (its nodes registered; a ledger that never saw Slurm
    has no GPUs, and refuses a submission asking for any), started again while slurmctld is
    down."""
    c = ledger.cluster
    ledger.up()
    ledger.stop()
    os.kill(c.daemon_pid("slurmctld"), signal.SIGKILL)
    time.sleep(0.5)
    ledger.up(nodes=False)

    def answering() -> bool:
        done = subprocess.run([GPULEDGER, "status"], env=ledger.env("root"),
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        return done.returncode == 0

    ledger.wait("the service to answer", answering, timeout=60)
    shown = ledger.cli("status")
    assert "outage" in shown and "slurmctld does not answer" in shown, shown
    health = json.loads(ledger.cli("status", "--json"))
    assert health["engine_away"] and health["engine_away_since"] is not None, health
    t0 = time.monotonic()
    ledger.submit("alice", 2, SHOW + "exit 0")
    submit_s = time.monotonic() - t0
    assert submit_s < 5, f"a submission took {submit_s:.1f} s while slurmctld was down"
    t0 = time.monotonic()
    assert status(ledger, 1) == "pending"
    read_s = time.monotonic() - t0
    assert read_s < 5, f"a read took {read_s:.1f} s while slurmctld was down"
    time.sleep(3)  # many cycles (0.2 s): nothing is placed while Slurm cannot be seen
    assert ledger.of("job.placed.v1") == [] and status(ledger, 1) == "pending"
    c.up()
    ledger.wait("the job to end", lambda: status(ledger, 1) == "finished", timeout=120)
    job = ledger.jobs()[1]
    assert (job["outcome"], job["exit_code"]) == ("completed", 0), job
    (node,) = json.loads(ledger.cli("node", "list", "--json"))
    assert node["state"] == "active", node
    shown = ledger.cli("status")
    assert "outage" not in shown, shown
    assert json.loads(ledger.cli("status", "--json"))["engine_away"] is None
    assert "the executor is open after" in ledger.service_log()


def test_a_service_started_during_an_outage_adopts_the_runs_slurm_kept(
    ledger: Ledger,  # noqa: F811
) -> None:
    """A service stopped while its job runs, started again while slurmctld is down: the job
    stays running (never recorded lost, never launched twice) and is adopted once Slurm
    answers."""
    c, flags = ledger.cluster, ledger.home.parent
    ledger.up()
    ledger.submit("alice", 1, SHOW + f"until [ -e {flags / 'end'} ]; do sleep 0.2; done")
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running", timeout=120)
    time.sleep(8)  # slurmctld saves its state a few seconds after a change
    ledger.stop()
    os.kill(c.daemon_pid("slurmctld"), signal.SIGKILL)
    ledger.up(nodes=False)
    ledger.wait("the outage to show", lambda: "outage" in ledger.cli("status"), timeout=60)
    time.sleep(2)
    assert status(ledger, 1) == "running"
    c.up()
    ledger.wait("the outage to end", lambda: "outage" not in ledger.cli("status"), timeout=120)
    (flags / "end").touch()
    ledger.wait("the job to end", lambda: status(ledger, 1) == "finished", timeout=120)
    job = ledger.jobs()[1]
    assert (job["outcome"], job["exit_code"]) == ("completed", 0), job
    assert len(ledger.of("job.engine_linked.v1", 1)) == 1
    assert "adopted Slurm job" in ledger.service_log()


def test_the_service_starts_while_an_admin_pauses_the_partition_and_runs_once_it_is_up(
    ledger: Ledger,  # noqa: F811
) -> None:
    """atk60-slurm F1: `up` refused to start while the partition was paused ("partition
    'gpuledger' is INACTIVE, not UP"): a restart during an admin's pause took the whole service
    down until the pause ended. Now it starts, serves (a submission, `status` naming the pause),
    submits nothing to Slurm meanwhile, and runs the job once the partition is UP."""
    c = ledger.cluster
    c.run("scontrol", "update", f"PartitionName={c.partition}", "State=INACTIVE")
    try:
        ledger.up()  # before: exit 1, "partition 'gpuledger' is INACTIVE, not UP"
        paused = f"Slurm's partition {c.partition} is INACTIVE (an admin's pause)"
        assert paused in ledger.service_log()
        ledger.submit("alice", 1, SHOW + "echo ran >> runs-1")
        ledger.wait("the pause in status", lambda: paused in ledger.cli("status"), timeout=60)
        time.sleep(6)  # many cycles (0.2 s) and a partition read (5 s): it waits
        assert ledger.jobs()[1]["status"] == "pending", ledger.jobs()[1]
        listed = c.run("squeue", "-h", "-n", "gpuledger-1", "-o", "%i %T", check=False)
        assert listed.strip() == "", listed  # nothing submitted to Slurm
    finally:
        c.run("scontrol", "update", f"PartitionName={c.partition}", "State=UP")
    ledger.wait("job 1 finished", lambda: status(ledger, 1) == "finished", timeout=120)
    job = ledger.jobs()[1]
    assert (job["outcome"], job["exit_code"], job["preemptions"]) == ("completed", 0, 0), job
    assert (ledger.work / "runs-1").read_text().split() == ["ran"]


@pytest.mark.parametrize("pause", ["INACTIVE", "DOWN"])
def test_a_job_placed_while_an_admin_pauses_the_partition_waits_in_the_queue_and_runs_after(
    ledger: Ledger,  # noqa: F811
    pause: str,
) -> None:
    """atk59b N4: a partition paused (`State=INACTIVE`: sbatch refuses, "Required partition not
    available"; `DOWN`: sbatch queues it PENDING, `PartitionDown`) while a job is placed: its
    run was retried (or left pending) until the take-back time, 5 minutes, then the job ended
    `launch_failed` for good, no fault of its own. Now it goes back to the queue (its run taken
    back, nothing of it left in Slurm), `status` names the pause, nothing is placed meanwhile,
    and it runs once the partition is UP again."""
    c = ledger.cluster
    ledger.up()
    try:
        c.run("scontrol", "update", f"PartitionName={c.partition}", f"State={pause}")
        ledger.submit("alice", 1, SHOW + "echo ran >> runs-1")
        paused = f"Slurm's partition {c.partition} is {pause}"
        ledger.wait("the pause in status", lambda: paused in ledger.cli("status"), timeout=60)
        time.sleep(8)  # many cycles (0.2 s) and partition reads (5 s): it waits
        job = ledger.jobs()[1]
        assert job["status"] == "pending", job  # before: placed, then launch_failed
        # placed before the executor's read of the partition saw the pause (every 5 s): taken
        # back to the queue, with why; placed after it: never placed while it lasts
        if ledger.of("job.unplaced.v1", 1):
            said = ledger.cli("explain", "1") + ledger.cli("log", "--json", "--limit", "10000")
            assert f"is {pause} (an admin's pause)" in said, said[-3000:]
        listed = c.run("squeue", "-h", "-n", "gpuledger-1", "-o", "%i %T", check=False)
        assert listed.strip() == "", listed  # nothing of it left in Slurm
        assert not (ledger.work / "runs-1").exists()
    finally:
        c.run("scontrol", "update", f"PartitionName={c.partition}", "State=UP")
    ledger.wait("job 1 finished", lambda: status(ledger, 1) == "finished", timeout=120)
    job = ledger.jobs()[1]
    assert (job["outcome"], job["exit_code"]) == ("completed", 0), job
    assert (ledger.work / "runs-1").read_text().split() == ["ran"]
    assert "outage" not in ledger.cli("status")


def test_a_run_pending_in_slurm_when_the_partition_is_paused_is_taken_back_not_preempted(
    ledger: Ledger,  # noqa: F811
) -> None:
    """atk60-slurm F5: a run taken back during a pause was recorded as an admin preemption
    (`job.preempted.v1` "requeued by @executor ...", `explain` "preempted for admin ... inside
    its contract", `jobs --json` `preemptions: 1`, `report preemptions` "suffered 1") though it
    never ran. Now it is `job.unplaced.v1`: no preemption anywhere, and the job's next run runs
    once. Deterministic: a reservation of the partition's nodes for another user keeps the run
    pending in Slurm (it cannot start) until the pause is seen."""
    c = ledger.cluster
    ledger.up()
    c.run("scontrol", "create", "reservation", "ReservationName=gpuledger-f5", "StartTime=now",
          "Duration=30", "Users=root", f"Nodes={','.join(c.nodes)}")  # fmt: skip
    try:
        ledger.submit("alice", 1, SHOW + "echo ran >> runs-1", "--min-runtime", "1h")

        def pending() -> bool:
            return any("job=1:" in j["comment"] and j["state"] == "PENDING"
                       for j in c.jobs().values())  # fmt: skip

        ledger.wait("its run pending in Slurm", pending, timeout=60)
        c.run("scontrol", "update", f"PartitionName={c.partition}", "State=DOWN")
        back = ("job.unplaced.v1", "job.preempted.v1")
        ledger.wait("its take-back", lambda: any(ledger.of(k, 1) for k in back), timeout=60)
        said = ledger.cli("explain", "1")
    finally:
        c.run("scontrol", "delete", "ReservationName=gpuledger-f5", check=False)
        c.run("scontrol", "update", f"PartitionName={c.partition}", "State=UP")
    assert ledger.of("job.preempted.v1", 1) == [] and ledger.of("job.requeued.v1", 1) == []
    (unplaced,) = ledger.of("job.unplaced.v1", 1)
    assert (unplaced["run"], unplaced["actor"]) == (0, "@executor"), unplaced
    assert f"Slurm's partition {c.partition} is DOWN (an admin's pause)" in unplaced["reason"]
    assert "taken back by @executor before it started" in said and "preempted" not in said, said
    ledger.wait("job 1 finished", lambda: status(ledger, 1) == "finished", timeout=120)
    job = ledger.jobs()[1]
    assert (job["outcome"], job["exit_code"], job["preemptions"], job["placements"]) == (
        "completed", 0, 0, 2
    ), job  # fmt: skip
    report = json.loads(ledger.cli("report", "preemptions", "--json"))
    assert (report["suffered"], report["caused"], report["rows"]) == (0, 0, []), report
    assert (ledger.work / "runs-1").read_text().split() == ["ran"]  # its next run, once
    assert [ev["run"] for ev in ledger.of("job.engine_linked.v1", 1)][-1:] == [1]
