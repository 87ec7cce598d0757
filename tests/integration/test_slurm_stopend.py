"""The end of a run the ledger stops, on real Slurm (atk43s F8, F8b, F10): a stop whose node's
slurmd is dead, which Slurm ends CANCELLED when it gives the node up, holds its GPUs (and its
job's next launch) until its processes are gone; a stop that comes while Slurm holds the launch
CONFIGURING never lets its command start. Checked from outside: the jobs' own files."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.integration import test_slurm as base
from tests.integration.test_slurm import Ledger, status
from tests.integration.test_slurm_stops import _run_ended, _times, _until_quiet

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures


def _node_state(led: Ledger) -> str:
    (node,) = led.nodes()
    return str(node["state"])


def _stopped_with_slurmd_dead(ledger: Ledger, stop: str) -> float:
    """Job 1 (alice, 4 GPUs, ignores SIGTERM, writes `alive.<run>` every 0.2 s; resumable);
    its node's slurmd is killed, then the ledger stops it (`stop`: cancel or requeue) and job 2
    (bob, 4 GPUs) waits. Slurm reaches nothing; its `scancel` after the grace leaves the job
    COMPLETING until Slurm gives the node up (SlurmdTimeout, 30 s) and ends it CANCELLED. Then
    slurmd comes back. Returns run 0's last heartbeat, once it has stopped."""
    work, cl = ledger.work, ledger.cluster
    ledger.up()
    ledger.submit("alice", 4, f"trap 'date +%s.%N >> {work}/term' TERM; "
                  f"while true; do date +%s.%N >> {work}/alive.$GPULEDGER_RUN; sleep 0.2; done",
                  "--resumable")  # fmt: skip
    ledger.wait("the job to run", lambda: (work / "alive.0").exists() and status(ledger, 1) == "running")  # fmt: skip  # noqa: E501
    os.kill(cl.daemon_pid("slurmd"), signal.SIGKILL)
    ledger.cli(stop, "1", actor="alice" if stop == "cancel" else "root")
    ledger.submit("bob", 4, f"date +%s.%N >> {work}/next; sleep 2")
    ledger.wait("Slurm to give the node up", lambda: _node_state(ledger) == "lost", timeout=120)
    time.sleep(2)  # the stopped run is CANCELLED now, its processes alive
    assert (_times(work / "alive.0") or [0.0])[-1] > time.time() - 2.0, "run 0 died early"
    cl.up()  # slurmd back: Slurm's kill reaches run 0, SIGKILL KillWait (10 s) later
    return _until_quiet(work / "alive.0", 120, _run_ended(ledger))


def test_a_run_cancelled_while_its_slurmd_is_dead_holds_its_gpus_until_it_is_gone(
    ledger: Ledger,
) -> None:
    """atk43s F8: the cancelled run was recorded ended when Slurm gave its node up, and on the
    node's return job 2 was placed on its 4 GPUs and ran beside it (their own files). Now job 2
    starts only after run 0's last heartbeat, and run 0's end is not before it."""
    last = _stopped_with_slurmd_dead(ledger, "cancel")
    ledger.wait("job 2 to finish", lambda: status(ledger, 2) == "finished", timeout=90)
    (started,) = _times(ledger.work / "next")
    assert started > last, f"job 2 started {last - started:.1f} s before job 1's processes died"
    (end,) = ledger.of("job.run_ended.v2", 1)
    assert end["ended_at"] >= last - 0.5 and end["killed"] is True, (end, last)
    assert ledger.jobs()[1]["finish_reason"] == "cancelled"


def test_a_run_requeued_while_its_slurmd_is_dead_is_never_alive_with_its_next_launch(
    ledger: Ledger,
) -> None:
    """atk43s F8b: an admin's requeue of a resumable job while its node's slurmd is dead: its
    next launch ran on the same GPUs beside the first for 8 s once the node returned. Now the
    launch fence holds until the first launch is gone."""
    last = _stopped_with_slurmd_dead(ledger, "requeue")
    work = ledger.work
    ledger.wait("its next launch", lambda: bool(_times(work / "alive.1")), timeout=90)
    first = _times(work / "alive.1")[0]
    assert first > last, f"launch 2 began {last - first:.1f} s before launch 1 was gone"
    (end,) = ledger.of("job.run_ended.v2", 1)
    assert end["run"] == 0 and end["ended_at"] >= last - 0.5, (end, last)
    ledger.cli("cancel", "1", actor="alice")
    ledger.wait("job 2 to finish", lambda: status(ledger, 2) == "finished", timeout=90)
    (started,) = _times(work / "next")
    assert started > last, f"job 2 started {last - started:.1f} s before job 1's processes died"


def test_a_stop_while_slurm_holds_the_launch_configuring_never_starts_the_command(
    ledger: Ledger,
) -> None:
    """atk43s F10: cancelled while Slurm held its launch CONFIGURING (a slow PrologSlurmctld),
    the command started 3 s after the cancel, got no SIGTERM and ran the whole grace. Now its
    batch script finds the stop's mark before the command and ends there: the command never
    runs, the run's end says so, and nothing is charged."""
    hold = Path(ledger.cluster.conf).parent / "hold-launches"
    began = ledger.work / "began"
    hold.touch()
    try:
        ledger.up()
        ledger.submit("alice", 2, f"date +%s.%N > {began}; sleep 30", "--grace", "20s")

        def configuring() -> bool:
            return any("job=1:" in j["comment"] and j["state"] == "CONFIGURING"
                       for j in ledger.cluster.jobs().values())  # fmt: skip

        ledger.wait("Slurm to hold the launch", configuring)
        ledger.cli("cancel", "1", actor="alice")
        mark = ledger.home / "jobs" / "checkpoints" / "1.0" / "stopping"
        ledger.wait("the stop's mark", mark.exists)
        time.sleep(1)
    finally:
        hold.unlink(missing_ok=True)
    ledger.wait("the run's end", lambda: bool(ledger.of("job.run_ended.v2", 1)), timeout=60)
    (end,) = ledger.of("job.run_ended.v2", 1)
    assert not began.exists(), "the command ran after its stop"
    assert "the command never ran" in end["note"] and end["killed"] is False, end
    job = ledger.jobs()[1]
    assert job["finish_reason"] == "cancelled" and job["started_at"] is None, job
    assert "stopped before its command started" in ledger.log_of(1)


def test_a_run_requeued_in_its_hold_while_the_service_was_down_is_charged_from_its_start(
    ledger: Ledger,
) -> None:
    """atk44s F3: requeued while Slurm held its launch CONFIGURING, the service down before it
    could make the run's `stopping` mark; the hold ended and the command ran until the
    restarted service stopped it. It was recorded with an end and no start, never charged.
    Now its end (`job.run_ended.v2`) carries its own start, its launch mark, and the
    projection charges the run from there."""
    hold = Path(ledger.cluster.conf).parent / "hold-launches"
    began = ledger.work / "began"
    hold.touch()
    try:
        ledger.up()
        # appended: the requeued job's next run may begin before run 0's end is read here
        ledger.submit("alice", 2, f"date +%s.%N >> {began}; sleep 60", "--resumable")

        def configuring() -> bool:
            return any("job=1:" in j["comment"] and j["state"] == "CONFIGURING"
                       for j in ledger.cluster.jobs().values())  # fmt: skip

        ledger.wait("Slurm to hold the launch", configuring)
        ledger.kill9()
        ledger.cli("requeue", "1")  # appended; no service carries it out
    finally:
        hold.unlink(missing_ok=True)
    deadline = time.monotonic() + 60  # (the service is down: not `ledger.wait`)
    while not began.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert began.exists(), f"the command never started: {ledger.cluster.jobs()}"
    time.sleep(4)  # it runs
    ledger.up()  # stops it: a run the ledger no longer runs (SIGTERM, the grace)
    ledger.wait("the run's end", lambda: bool(ledger.of("job.run_ended.v2", 1)), timeout=90)
    (end,) = ledger.of("job.run_ended.v2", 1)
    start = float(began.read_text().split()[0])  # run 0's
    assert end["run"] == 0 and end["started_at"] is not None, end
    assert start - 1.5 <= end["started_at"] <= start + 0.5, (end, start)
    assert end["ended_at"] - end["started_at"] >= 4.0, end
    rows = json.loads(ledger.cli("audit", "sql", "--json", "SELECT run_start_at, run_end_at "
                                 "FROM job_intervals WHERE job_id = 1 ORDER BY start_position"))  # fmt: skip  # noqa: E501
    assert rows and abs(float(rows[0]["run_start_at"]) - end["started_at"]) < 1e-3, rows


def test_a_stop_whose_service_restarts_after_the_node_returned_holds_its_gpus(
    ledger: Ledger,
) -> None:
    """atk44s F2, F2b: as above, but the service is killed -9 during the stop (after its
    `scancel`) and started again only once the node has returned: the restarted service never
    saw the slurmd away, took Slurm's CANCELLED (at the node's DOWN) for the processes' end
    (exit 0, not killed) and launched the job's next run beside the live first one (2.9 s), or
    another user's job on its 4 GPUs (5.3 s). Now it judges from the run's marks (its beat and
    the returned slurmd's TERM, after Slurm's end): held until run 0 is gone."""
    work, cl = ledger.work, ledger.cluster
    ledger.up()
    ledger.submit("alice", 4, f"trap 'date +%s.%N >> {work}/term' TERM; "
                  f"while true; do date +%s.%N >> {work}/alive.$GPULEDGER_RUN; sleep 0.2; done",
                  "--resumable")  # fmt: skip
    ledger.wait("the job to run", lambda: (work / "alive.0").exists() and status(ledger, 1) == "running")  # fmt: skip  # noqa: E501
    os.kill(cl.daemon_pid("slurmd"), signal.SIGKILL)
    ledger.cli("requeue", "1")
    ledger.submit("bob", 4, f"date +%s.%N >> {work}/next; sleep 2")

    def scancelled() -> bool:  # past the grace (2 s): the executor's `scancel` reached Slurm
        return any("job=1:run=0" in j["comment"] and j["state"] != "RUNNING"
                   for j in cl.jobs().values())  # fmt: skip

    ledger.wait("the executor's scancel", scancelled, timeout=25)  # before SlurmdTimeout (30 s)
    ledger.kill9()

    def cancelled() -> bool:
        return any("job=1:run=0" in j["comment"] and j["state"] == "CANCELLED"
                   for j in cl.jobs().values())  # fmt: skip

    deadline = time.monotonic() + 120  # (the service is down: not `ledger.wait`)
    while not cancelled() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cancelled(), f"Slurm did not give the node up: {cl.jobs()}"
    assert (_times(work / "alive.0") or [0.0])[-1] > time.time() - 2.0, "run 0 died early"
    cl.up()  # slurmd back: Slurm's kill reaches run 0, SIGKILL KillWait (10 s) later

    def back() -> bool:
        return "down" not in cl.run("sinfo", "-h", "-N", "-o", "%T", check=False)

    deadline = time.monotonic() + 60
    while not back() and time.monotonic() < deadline:
        time.sleep(0.5)
    ledger.up()  # the service, after the node's return
    last = _until_quiet(work / "alive.0", 120, _run_ended(ledger))
    ledger.wait("its next launch", lambda: bool(_times(work / "alive.1")), timeout=90)
    first = _times(work / "alive.1")[0]
    assert first > last, f"launch 2 began {last - first:.1f} s before launch 1 was gone"
    (end,) = ledger.of("job.run_ended.v2", 1)
    marks = ledger.home / "jobs" / "checkpoints" / "1.0"
    seen = {m.name: m.lstat().st_ctime for m in marks.iterdir()}, _times(work / "term")
    why = (end, last, seen, ledger.service_log()[-3000:])
    # Slurm's EndTime is whole seconds, cut: up to a second before the last line (0.87 s in the
    # fresh-clone run of 2026-12-07 at load; `last` itself is the last 0.2 s line)
    assert end["run"] == 0 and end["ended_at"] >= last - 1.0 and end["killed"], why
    ledger.cli("cancel", "1", actor="alice")
    ledger.wait("job 2 to finish", lambda: status(ledger, 2) == "finished", timeout=90)
    (started,) = _times(work / "next")
    assert started > last, f"job 2 started {last - started:.1f} s before job 1's processes died"
