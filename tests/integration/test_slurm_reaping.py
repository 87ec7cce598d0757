"""Slurm as the engine, a job whose command exits 0 leaving a child that ignores SIGTERM: its batch
script ends that child (SIGTERM, the job's grace, SIGKILL) while Slurm lists the job RUNNING.
The script's `reaping` mark (`script_tree.REAPING_MARK`) makes the ledger show it `stopping`
with that SIGKILL, as on the node agents (`job.leader_ended.v1`); before, it read `running`
with no SIGKILL time until its end. A cancel in that grace then finds a job whose command
completed: it ends `completed` (exit 0) and the child is killed at once (atk52-23 F2). Real
Slurm (scripts/slurm/slurm), the child's life read from /proc."""

from __future__ import annotations

import json
import pwd
import subprocess
import time
from typing import Any

from tests.integration import test_slurm as base
from tests.integration.test_slurm import Ledger
from tests.integration.test_slurm_trees import alive, kill_of_job, pids

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures

GRACE_S = 30


def _slurm_ids(ledger: Ledger, job: int) -> set[str]:
    """The Slurm jobs of `job`'s runs (a run requeued is another Slurm job)."""
    return {str(e["engine_job_id"]) for e in ledger.of("job.engine_linked.v1", job)}


def _row(ledger: Ledger, job: int) -> dict[str, Any]:
    rows = json.loads(ledger.cli("queue", "--state", "running", "--json"))
    return next((r for r in rows if r["job_id"] == job), {})


def test_a_job_whose_command_exited_reads_stopping_and_a_cancel_then_leaves_it_completed(
    ledger: Ledger,
) -> None:
    ledger.up()
    kid = "( trap '' TERM; while :; do sleep 0.2; done ) & echo kid=$!; sleep 1; exit 0"
    ledger.submit("alice", 1, kid, "--grace", f"{GRACE_S}s")
    ledger.wait("job 1's command to end", lambda: "its command exited"
                in str(_row(ledger, 1).get("reason", "")), timeout=120)  # fmt: skip
    (child,) = pids(ledger.log_of(1), "kid")
    try:
        row = _row(ledger, 1)  # the old code: `running`, no kill_at, until the job's end
        assert row["state"] == "stopping", row
        began = float(ledger.jobs()[1]["started_at"])
        kill_at = float(row["kill_at"])
        assert began < kill_at <= time.time() + GRACE_S + 2, (row, began)
        assert alive(child), "its child was gone already"
        assert "RUNNING" in ledger.cluster.run("squeue", "-h", "-o", "%T")
        ledger.cli("cancel", "1", actor="alice")
        cancelled = time.time()
        while alive(child):  # killed at once, not at kill_at
            assert time.time() < min(kill_at, cancelled + 15), "its child outlived the cancel"
            time.sleep(0.3)
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 90)
    finally:
        kill_of_job(child, _slurm_ids(ledger, 1))
    got = ledger.jobs()[1]
    assert (got["outcome"], got["finish_reason"], got["exit_code"]) == (
        "completed", "completed", 0), got  # fmt: skip
    (ended,) = ledger.of("job.leader_ended.v1", 1)
    assert ended["exit_code"] == 0 and ended["left"] >= 1, ended


def _reaping_child(ledger: Ledger, job: int) -> int:
    ledger.wait(f"job {job}'s command to end", lambda: "its command exited"
                in str(_row(ledger, job).get("reason", "")), timeout=120)  # fmt: skip
    (child,) = pids(ledger.log_of(job), "kid")
    assert alive(child), "its child was gone already"
    return child


def test_a_time_limit_that_passes_while_the_batch_script_reaps_leaves_the_job_completed(
    ledger: Ledger,
) -> None:
    """atk53-23 F4: the command exits 0 after a second leaving a child, and the job's time limit
    (4 s) passes while its batch script reaps that child: the limit stops nothing more (the
    child's SIGKILL, at the command's end plus the grace, comes before the limit's) and the job
    ends `completed`, exit 0, as on the node agents. The old code: `time_limit`."""
    ledger.up()
    kid = "( trap '' TERM; while :; do sleep 0.2; done ) & echo kid=$!; sleep 1; exit 0"
    ledger.submit("alice", 1, kid, "-t", "4s", "--grace", "15s")
    child = _reaping_child(ledger, 1)
    try:
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
    finally:
        kill_of_job(child, _slurm_ids(ledger, 1))
    got = ledger.jobs()[1]
    assert (got["outcome"], got["finish_reason"], got["exit_code"]) == (
        "completed", "completed", 0), got  # fmt: skip


def test_a_requeue_after_the_command_exited_3_fails_the_job_not_run_again(
    ledger: Ledger,
) -> None:
    """atk53-23 F3 on Slurm: the command exits 3 leaving a child; a requeue comes in that
    child's grace: its exit is its outcome, `failed` exit 3, and it never runs again. The old
    code requeued it and ran its whole command a second time."""
    ledger.up()
    kid = ("echo ran >> runs-1; ( trap '' TERM; while :; do sleep 0.2; done ) & echo kid=$!;"
           " sleep 1; exit 3")  # fmt: skip
    ledger.submit("alice", 1, kid, "--resumable", "--min-runtime", "0", "--grace", f"{GRACE_S}s")
    child = _reaping_child(ledger, 1)
    try:
        ledger.cli("requeue", "1")
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
    finally:
        kill_of_job(child, _slurm_ids(ledger, 1))
    got = ledger.jobs()[1]
    assert (got["outcome"], got["finish_reason"], got["exit_code"]) == (
        "failed", "failed", 3), got  # fmt: skip
    time.sleep(3)  # reads pass: nothing runs it again
    assert (ledger.work / "runs-1").read_text().split() == ["ran"]
    assert len(ledger.of("job.engine_linked.v1", 1)) == 1


def test_a_requeue_before_the_start_was_seen_of_a_command_that_exited_0_completes_the_job(
    ledger: Ledger,
) -> None:
    """atk54-23 F1: a resumable job's command exits 0 at once leaving a child, and an admin
    requeues it after its placement but before the executor's read saw its Slurm job start (a
    cycle every 15 s here; 4-9 s under load in the attack). The next read finds that Slurm job
    ended and reports its start and its exit together: its exit is the job's outcome,
    `completed`, and the job never runs again. The old code dropped both (the job was pending),
    placed it again and ran its whole command a second time."""
    ledger.up(interval="15s")
    kid = ("echo ran >> runs-1; ( trap '' TERM; while :; do sleep 0.2; done ) & echo kid=$!;"
           " sleep 0.2; exit 0")  # fmt: skip
    ledger.submit("alice", 1, kid, "--resumable", "--min-runtime", "0", "--grace", "1s")
    ledger.wait("job 1 in Slurm", lambda: "gpuledger" in ledger.cluster.run(
        "squeue", "-h", "-o", "%j"), timeout=60)  # fmt: skip
    ledger.cli("requeue", "1")
    assert ledger.jobs()[1]["status"] == "pending"  # before any read saw it start
    ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
    time.sleep(20)  # a cycle passes: nothing runs it again
    got = ledger.jobs()[1]
    assert (got["outcome"], got["finish_reason"], got["exit_code"]) == (
        "completed", "completed", 0), got  # fmt: skip
    assert (ledger.work / "runs-1").read_text().split() == ["ran"]
    (ended,) = ledger.of("job.run_ended.v2", 1)
    assert ended["run"] == 0 and ended["by_itself"] and ended["started_at"], ended


def test_a_leftover_that_kills_its_batch_script_fails_the_job_and_explain_says_whose_doing(
    ledger: Ledger,
) -> None:
    """atk53-23 F8 (explain's half): the command exits 0 leaving a child whose SIGTERM trap
    (the batch script ending it) kills the batch script with -9. Slurm says FAILED 0:9, no end
    record is written, and the ledger stopped nothing: the job fails (137, the job's own
    doing, docs/slurm.md), and its end's note, which `explain` and `jobs` show, says in words
    that a process of the job's own killed its batch script, after its command exited 0.
    Before: "failed ..., exit code 137" and nothing more."""
    ledger.up()
    # a process of the same user elsewhere on the host whose command line names a batch script
    # (another cluster's job, as in the suite) lives on: the job kills its own script alone
    decoy = subprocess.Popen(["/bin/bash", "-c", "exec -a /elsewhere/job1/slurm_script sleep 600"],
                             user="nobody", start_new_session=True)  # fmt: skip
    # its own batch script alone (Slurm's `<spool>/job<id>/slurm_script`): a bare `slurm_script`
    # matched every batch script of the job's user on the host, and killed other clusters' jobs
    # in the suite (CI of stops 55 and 56: test_slurm_world's job, SIGKILLed with this one)
    kid = ("( trap 'pkill -KILL -f \"/job${SLURM_JOB_ID}/slurm_scrip[t]\"' TERM;"
           " while :; do sleep 0.2; done ) & echo kid=$!; echo uid=$(id -u);"
           " sleep 1; exit 0")  # fmt: skip
    ledger.submit("alice", 1, kid, "--grace", f"{GRACE_S}s")
    try:  # the script's SIGTERM to the child makes it kill the script at once
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
        assert pids(ledger.log_of(1), "uid") == [pwd.getpwnam("nobody").pw_uid]  # the decoy's
        assert decoy.poll() is None, "the job's pkill killed another job's batch script"
    finally:
        decoy.kill()
        decoy.wait(timeout=10)
        for child in pids(ledger.log_of(1), "kid"):
            kill_of_job(child, _slurm_ids(ledger, 1))
    got = ledger.jobs()[1]
    assert (got["outcome"], got["exit_code"]) == ("failed", 137), got
    assert "a process of the job's own (or someone on its node) killed it" in got[
        "finish_note"], got  # fmt: skip
    explained = ledger.cli("explain", "1")
    assert "its command exited 0 and ended at" in explained, explained
    assert "its batch script was killed by signal 9" in explained, explained
