"""atk61-slurm F1, F2, F3 on a real Slurm cluster: a take-back a crash cut short, a MaxTime
lowered under a run pending in Slurm, and a job with no time limit under a DefaultTime. Each job
runs once, never failed for the executor's or an admin's act (docs/slurm.md)."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from tests.integration import test_slurm as base
from tests.integration.test_slurm import GPULEDGER, SHOW, Ledger, status

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures
RESERVATION = "gpuledger-atk61"


def _reserve(ledger: Ledger) -> None:
    """A reservation of the partition's nodes for root: a run of the ledger's stays pending."""
    c = ledger.cluster
    c.run("scontrol", "create", "reservation", f"ReservationName={RESERVATION}",
          "StartTime=now", "Duration=30", "Users=root", f"Nodes={','.join(c.nodes)}")  # fmt: skip


def _pending_in_slurm(ledger: Ledger) -> None:
    def pending() -> bool:
        return any("job=1:" in j["comment"] and j["state"] == "PENDING"
                   for j in ledger.cluster.jobs().values())  # fmt: skip

    ledger.wait("its run pending in Slurm", pending, timeout=60)


def _ran_once(ledger: Ledger) -> dict[str, object]:
    ledger.wait("job 1 finished", lambda: status(ledger, 1) == "finished", timeout=180)
    job = ledger.jobs()[1]
    assert (job["outcome"], job["exit_code"], job["preemptions"]) == ("completed", 0, 0), job
    assert (ledger.work / "runs-1").read_text().split() == ["ran"]  # its next run, once
    return job


@pytest.mark.parametrize("at_restart", ["DOWN", "UP"])
def test_a_take_back_a_kill_9_cut_short_is_finished_after_the_restart(
    ledger: Ledger, at_restart: str
) -> None:
    """F1: `up` killed -9 after a take-back's `taken-back` mark, before `job.unplaced.v1` (the
    mark made here at the kill, as the killed service left it): the job ended `launch_failed`
    for good ("taken back by the executor ... never ran"). Now the restarted service finishes
    the take-back, the partition still paused (`DOWN`: its run still pending in Slurm,
    cancelled) or UP again (Slurm started it, its script ended at the mark, 124), and the job
    runs once."""
    c = ledger.cluster
    ledger.up()
    _reserve(ledger)
    try:
        ledger.submit("alice", 1, SHOW + "echo ran >> runs-1")
        _pending_in_slurm(ledger)
        ledger.kill9()
        mark = ledger.home / "jobs" / "checkpoints" / "1.0" / "taken-back"
        mark.touch()  # the take-back's first act; its scancel and record never came
        if at_restart == "DOWN":
            c.run("scontrol", "update", f"PartitionName={c.partition}", "State=DOWN")
        else:
            c.run("scontrol", "delete", f"ReservationName={RESERVATION}")

            deadline = time.monotonic() + 60  # (`up` is down: `ledger.wait` wants it up)
            while not any("job=1:" in j["comment"] and j["state"] == "FAILED"
                          for j in c.jobs().values()):  # fmt: skip
                assert time.monotonic() < deadline, "Slurm never ran it to its mark"
                time.sleep(0.5)
        ledger.up()
        ledger.wait("its take-back", lambda: bool(ledger.of("job.unplaced.v1", 1)), timeout=60)
        assert not ledger.of("job.finished.v1", 1) or ledger.jobs()[1]["outcome"] == "completed"
    finally:
        c.run("scontrol", "delete", f"ReservationName={RESERVATION}", check=False)
        c.run("scontrol", "update", f"PartitionName={c.partition}", "State=UP")
    (unplaced,) = ledger.of("job.unplaced.v1", 1)
    assert unplaced["run"] == 0 and "taken-back mark" in unplaced["reason"], unplaced
    job = _ran_once(ledger)
    assert job["placements"] == 2, job
    ledger.stop()


def test_a_run_pending_under_a_lowered_max_time_waits_in_the_queue_and_runs_once_it_allows(
    ledger: Ledger,
) -> None:
    """F2: MaxTime lowered under a placed run pending in Slurm made Slurm's reason
    PartitionTimeLimit and the job ended `launch_failed` for good. Now it goes back to the queue
    (`job.unplaced.v1`), waits `PARTITION_TIME_LIMIT` there, and runs once MaxTime allows."""
    c = ledger.cluster
    part = c.partition
    ledger.up()
    _reserve(ledger)
    try:
        ledger.submit("alice", 1, SHOW + "echo ran >> runs-1", "-t", "5")
        _pending_in_slurm(ledger)
        c.run("scontrol", "update", f"PartitionName={part}", "MaxTime=1")
        ledger.wait("its take-back", lambda: bool(ledger.of("job.unplaced.v1", 1)), timeout=60)
        time.sleep(3)
        (row,) = json.loads(ledger.cli("queue", "--json"))
        assert (row["job_id"], row["code"]) == (1, "PARTITION_TIME_LIMIT"), row
        assert status(ledger, 1) == "pending", ledger.jobs()[1]
    finally:
        c.run("scontrol", "delete", f"ReservationName={RESERVATION}", check=False)
        c.run("scontrol", "update", f"PartitionName={part}", "MaxTime=INFINITE")
    (unplaced,) = ledger.of("job.unplaced.v1", 1)
    assert "PartitionTimeLimit" in unplaced["reason"], unplaced
    job = _ran_once(ledger)
    assert job["placements"] == 2, job
    ledger.stop()


def test_a_job_with_no_time_limit_is_not_stopped_at_the_partitions_default_time(
    ledger: Ledger,
) -> None:
    """F3: with DefaultTime=1 (MaxTime UNLIMITED) a job submitted with no `-t` got no `--time`,
    and Slurm's TIMEOUT killed it after a minute or so while the service was up (`failed
    time_limit`, exit 143). Now it asks `--time=UNLIMITED` and runs to its end."""
    c = ledger.cluster
    part = c.partition
    c.run("scontrol", "update", f"PartitionName={part}", "DefaultTime=1")
    try:
        ledger.up()
        ledger.submit("alice", 1, SHOW + "sleep 100; echo ran >> runs-1")
        _ran_once(ledger)
    finally:
        c.run("scontrol", "update", f"PartitionName={part}", "DefaultTime=INFINITE")
    ledger.stop()


def test_a_run_slurm_holds_partitionconfig_under_a_max_time_lowered_unread_waits_and_runs(
    ledger: Ledger,
) -> None:
    """atk62-slurm F2: MaxTime lowered (3 to 1) in the seconds before the service read it: the
    run placed meanwhile asked `--time=3` (the MaxTime last read), Slurm held it
    `PartitionConfig` (not `PartitionTimeLimit`) and the job ended `launch_failed` for good.
    Now MaxTime is read again at once, the run goes back to the queue, waits
    `PARTITION_TIME_LIMIT` there, and runs once MaxTime allows."""
    c = ledger.cluster
    part = c.partition
    ledger.up()
    try:
        c.run("scontrol", "update", f"PartitionName={part}", "MaxTime=3")
        ledger.wait("MaxTime read", lambda: f"partition {part}: MaxTime=3" in ledger.service_log())
        c.run("scontrol", "update", f"PartitionName={part}", "MaxTime=1")  # read within 5 s
        # -t 1: its limit, the 2 s grace and a minute fit in the 3m read (-t 2 is refused)
        ledger.submit("alice", 1, SHOW + "echo ran >> runs-1", "-t", "1")
        ledger.wait("its take-back", lambda: bool(ledger.of("job.unplaced.v1", 1)), timeout=60)
        (row,) = json.loads(ledger.cli("queue", "--json"))
        assert (row["job_id"], row["code"]) == (1, "PARTITION_TIME_LIMIT"), row
        assert status(ledger, 1) == "pending", ledger.jobs()[1]
    finally:
        c.run("scontrol", "update", f"PartitionName={part}", "MaxTime=INFINITE")
    (unplaced,) = ledger.of("job.unplaced.v1", 1)
    # Slurm says either, by whether its scheduler or its submit check looked first (CI of
    # stop 62 saw PartitionTimeLimit): both wait in the queue, not launch_failed
    assert re.search(r"\((PartitionConfig|PartitionTimeLimit)\)", unplaced["reason"]), unplaced
    assert _ran_once(ledger)["placements"] == 2
    ledger.stop()
    # atk62b G3: its cycles decided with the MaxTime read again, recorded before them
    assert "0 differ, 0 cannot" in ledger.cli("replay", "--all", "--exact")


def test_a_grace_max_time_cannot_hold_is_refused_or_waits_and_the_log_replays_exactly(
    ledger: Ledger,
) -> None:
    """atk62b G1: `-t 1 --grace 120s` on MaxTime=2 was accepted; Slurm's TIMEOUT came before
    the ledger's SIGKILL and the run outlived MaxTime. Now refused in one line, nothing
    recorded (`-t 2` under the service's 2 s grace here). G2: a limit taken from MaxTime=3
    (118 s), then MaxTime=2: the job was placed (`--time=2`), Slurm's TIMEOUT first again. Now
    it waits `PARTITION_TIME_LIMIT`, saying what it needs, and runs once MaxTime holds it. G3:
    the log replays exactly (`replay --all --exact` exits 0)."""
    c = ledger.cluster
    part = f"PartitionName={c.partition}"
    ledger.up()
    try:
        c.run("scontrol", "update", part, "MaxTime=3")
        ledger.wait("MaxTime recorded", lambda: "(MaxTime): 3m" in ledger.service_log())
        before = len(ledger.events())
        refused = subprocess.run(
            [GPULEDGER, "submit", "-A", "ai2/olmo", "-G", "1", "-t", "2", "--", "true"],
            env=ledger.env("alice"), capture_output=True, text=True, timeout=120,
            cwd=ledger.work,
        )  # fmt: skip
        assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1, refused
        assert "(ask --grace of at most 0s, or a -t of at most 118s)" in refused.stderr, refused
        assert len(ledger.events()) == before  # nothing recorded
        ledger.submit("alice", 1, "sleep 8", "-t", "1")  # job 1: fits (60 + 2 + 60 <= 180)
        ledger.submit("alice", 1, SHOW + "echo ran >> runs-2", "-d", "afterany:1")  # 118 s
        assert ledger.jobs()[2]["time_limit_s"] == 180 - 2 - 60
        # started in Slurm first: its --time=3 pending under MaxTime=2 is taken back, and its
        # 122 s never fit in 2m (this run's one failure at load: it waited for good)
        ledger.wait("job 1 started", lambda: ledger.jobs()[1]["started_at"] is not None)
        c.run("scontrol", "update", part, "MaxTime=2")
        ledger.wait("MaxTime=2 recorded", lambda: "(MaxTime): 2m" in ledger.service_log())
        ledger.wait("job 1 finished", lambda: status(ledger, 1) == "finished", timeout=90)
        time.sleep(3)  # many cycles: it is not placed
        row = {r["job_id"]: r for r in json.loads(ledger.cli("queue", "--json"))}[2]
        assert row["code"] == "PARTITION_TIME_LIMIT", row
        assert (
            "its grace (2s, the service's) and a minute need 3m; the partition's MaxTime is 2m"
            in row["reason"]
        )
        assert status(ledger, 2) == "pending" and not ledger.of("job.placed.v1", 2)
    finally:
        c.run("scontrol", "update", part, "MaxTime=INFINITE")
    ledger.wait("job 2 finished", lambda: status(ledger, 2) == "finished", timeout=90)
    assert ledger.jobs()[2]["outcome"] == "completed", ledger.jobs()[2]
    ledger.stop()
    assert "0 differ, 0 cannot" in ledger.cli("replay", "--all", "--exact")
