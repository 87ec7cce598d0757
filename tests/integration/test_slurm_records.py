"""The records a sacct user relies on, on the Slurm executor, as an outsider found them wrong
(atk23c): a run first seen after it ended (the service paused, then killed with -9 and started
later) keeps its own start and end, Slurm's, in `jobs` and `explain` (F1), and the GPUs Slurm
gave it (F11); a job gets GPULEDGER_NODELIST as on the node agents (F11); a cancel sends TERM,
waits the job's own `--grace` (not the service's), and records the run's real end (F5), which
ends the job's record and its charge (atk33 F1); an
`afternotok` on an array waits for every task (F2). Real Slurm, `gpuledger up --executor slurm`
as a process."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime

from tests.integration import test_slurm as base
from tests.integration.test_slurm import Ledger, status

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures


RESERVATION = "gpuledger-held"


def _hold(led: Ledger, held: bool) -> None:
    """Slurm keeps the ledger's runs pending (a reservation of the cluster's nodes for root), or
    lets them start. Not a partition set DOWN: the service reads that as a pause within 5 s and
    takes its pending runs back, so whether Slurm held one first was a race, lost at load (the
    fresh-clone run of 2026-12-07: "timed out waiting for Slurm to hold the job")."""
    c = led.cluster
    if held:
        nodes = ",".join(c.nodes)
        c.run("scontrol", "create", "reservation", f"ReservationName={RESERVATION}",
              "StartTime=now", "Duration=30", "Users=root", f"Nodes={nodes}")  # fmt: skip
    else:  # gone for sure: a reservation left would hold every later job of this cluster
        deadline = time.monotonic() + 30
        while RESERVATION in c.run("scontrol", "show", "reservation", check=False):
            assert time.monotonic() < deadline, c.run("scontrol", "show", "reservation")
            c.run("scontrol", "delete", f"ReservationName={RESERVATION}", check=False)
            time.sleep(0.5)


def _until(what: str, pred: object, timeout: float = 60, why: object = str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}; {why()}"  # type: ignore[operator]
        time.sleep(0.1)


def test_a_run_first_seen_after_it_ended_keeps_slurms_times_and_gpus(ledger: Ledger) -> None:
    """F1, F11: the job waits in Slurm (its nodes reserved) while the service is paused; it runs
    and ends; the service is killed with -9 and started 5 s later. `jobs` shows the job's own
    start and end (Slurm's, in whole seconds: within 2 s of the job's clock; not the restart),
    `explain` starts its line with the real start, the run's GPUs are recorded, and the job saw
    GPULEDGER_NODELIST."""
    work = ledger.work
    ledger.up()
    _hold(ledger, True)
    try:
        ledger.submit("alice", 1, f'date +%s.%N > {work}/began; echo "NL=$GPULEDGER_NODELIST"; '
                      f"sleep 2; date +%s.%N > {work}/ended")  # fmt: skip
        # pending (its nodes reserved); earlier tests' ended jobs stay listed (MinJobAge)
        held = lambda: any(j["state"] == "PENDING" for j in ledger.cluster.jobs().values())  # noqa: E731
        _until("Slurm to hold the job", held)
        assert ledger.proc is not None
        ledger.proc.send_signal(signal.SIGSTOP)  # nothing more is recorded until the restart
    finally:
        _hold(ledger, False)
    try:  # Slurm schedules it at its next pass (sched/builtin: within SchedulerInterval, 60 s)
        _until("the job to end in Slurm", lambda: (work / "ended").exists(), 240,
               lambda: f"{ledger.cluster.jobs()}\n{ledger.service_log()[-3000:]}")  # fmt: skip
    except BaseException:
        ledger.proc.send_signal(signal.SIGCONT)  # never left stopped (the fixture stops it)
        raise
    ledger.kill9()
    time.sleep(5)  # the service stays down past the end
    restarted = time.time()
    ledger.up()
    ledger.wait("the job to be recorded", lambda: status(ledger, 1) == "finished")
    row = ledger.jobs()[1]
    began, ended = float((work / "began").read_text()), float((work / "ended").read_text())
    assert row["finish_reason"] == "completed", row
    # Slurm's StartTime and EndTime are whole seconds (cut, up to 1 s early), and its script's
    # first line runs after slurmstepd has set it up (~0.1-1 s on a loaded machine)
    assert 0.0 <= began - row["started_at"] <= 2.0, (row, began)
    assert abs(row["finished_at"] - ended) <= 2.0, (row, ended)
    assert row["started_at"] < restarted - 4 and 1.0 <= row["elapsed_s"] <= 4.0, row
    explain = ledger.cli("explain", "1")
    start_line = next(ln for ln in explain.splitlines() if " started" in ln)
    said = datetime.fromtimestamp(row["started_at"], UTC).strftime("%H:%M:%S")
    assert said in start_line and "recorded at" in start_line, explain
    (linked,) = ledger.of("job.engine_linked.v1", 1)
    (placed,) = ledger.of("job.placed.v1", 1)
    assert linked["gpus"] == placed["slots"], (linked, placed)  # F11: not []
    assert f"NL={ledger.cluster.node}" in ledger.log_of(1)


def test_a_cancel_waits_the_jobs_own_grace_and_records_the_runs_end(ledger: Ledger) -> None:
    """F5: `up --grace 2s`, the job `--grace 20s` traps TERM and needs 5 s to save: it gets
    TERM, finishes saving (the service's 2 s would have killed it), and the run's end is
    recorded (`job.run_ended.v2`, Slurm's EndTime, not killed)."""
    work = ledger.work
    ledger.up()
    script = (f"trap 'date +%s.%N > {work}/term; sleep 5; date +%s.%N > {work}/saved; exit 0' "
              f"TERM; date +%s.%N > {work}/began; while true; do sleep 0.2; done")  # fmt: skip
    ledger.submit("alice", 1, script, "--grace", "20s")
    # recorded running (its launch mark read), not only begun: a cancel in between is a
    # cancel of a run the ledger has not seen start (its own race, not this test's point)
    ledger.wait(
        "the job to run", lambda: (work / "began").exists() and status(ledger, 1) == "running"
    )
    ledger.cli("cancel", "1", actor="alice")
    saved_file = work / "saved"  # written by `date` once made: wait for its line
    _until("the job to save and end", lambda: saved_file.exists() and saved_file.read_text(), 60)
    saved = float((work / "saved").read_text())
    assert saved - float((work / "term").read_text()) >= 4.5  # its grace, not the service's
    ledger.wait("the run's end", lambda: bool(ledger.of("job.run_ended.v2", 1)))
    (end,) = ledger.of("job.run_ended.v2", 1)
    assert end["killed"] is False and end["run"] == 0, end
    assert abs(end["ended_at"] - saved) <= 1.5, (end, saved)
    row = ledger.jobs()[1]
    assert row["finish_reason"] == "cancelled"
    # atk33 F1: the job ended when its run really ended (its grace), and is charged to then
    assert row["finished_at"] == end["ended_at"], (row, end)
    rows = json.loads(ledger.cli("usage", "--by", "user", "--json"))
    charged = sum(r["usage_gpu_hours"] for r in rows if r["name"] == "alice") * 3600.0
    assert abs(charged - (end["ended_at"] - row["started_at"])) <= 0.01, (charged, row, end)


def test_afternotok_on_an_array_waits_for_every_task_on_slurm(ledger: Ledger) -> None:
    """F2 on Slurm: task 0 completes while task 1 runs (and then fails): `afternotok:ARRAY` is
    accepted, waits, and runs once task 1 failed."""
    go = ledger.work / "go"
    ledger.up()
    ledger.submit("alice", 1, f'[ "$GPULEDGER_ARRAY_TASK_ID" = 0 ] && exit 0; '
                  f"while [ ! -e {go} ]; do sleep 0.2; done; exit 3", "--array=0-1")  # fmt: skip
    both = lambda: status(ledger, 1) == "finished" and status(ledger, 2) == "running"  # noqa: E731
    ledger.wait("task 0 to end and task 1 to run", both)
    out = ledger.cli("submit", "-A", "ai2/olmo", "-G", "1", "--json", "--dependency=afternotok:1",
                     "--", "true", actor="alice")  # fmt: skip
    dep = int(json.loads(out)["job_id"])
    assert status(ledger, dep) == "pending"
    go.touch()
    os.chmod(go, 0o644)
    ledger.wait("the dependent job to run", lambda: status(ledger, dep) == "finished", 90)
    rows = ledger.jobs()
    assert (rows[2]["finish_reason"], rows[dep]["finish_reason"]) == ("failed", "completed"), rows
