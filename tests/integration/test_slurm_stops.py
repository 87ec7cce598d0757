"""How the Slurm executor stops a run, as an outsider found it wrong (atk33-23): a run that
ignores SIGTERM lives on `KillWait` after Slurm's EndTime (the scancel), holding its GPU, and is
recorded and charged to its processes' real end (F1); a whole-minute `-t` gets the job's own
grace, not Slurm's TIMEOUT and KillWait (F7); a cancel's grace counts from the cancel across a
restart of the service (F2); meanwhile `node list` shows its GPUs `stopping`, not free, after
a restart too (atk36-23 F1); a job without `-t` on a partition with a MaxTime runs with a limit
taken from it and is stopped there by the executor (s62).
Real Slurm (KillWait=10), `gpuledger up --executor slurm`."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledger.reads.stopping import LATE_TERM_GRACE_S
from tests.integration import test_slurm as base
from tests.integration.test_slurm import Ledger, status

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures


def _stubborn(work: Path) -> str:
    """A job that notes each SIGTERM and ignores it, and says it is alive every 0.2 s."""
    return (f"trap 'date +%s.%N >> {work}/term' TERM; "
            f"while true; do date +%s.%N >> {work}/alive; sleep 0.2; done")  # fmt: skip


def _times(path: Path) -> list[float]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(float(line))
        except ValueError:
            continue  # a line cut by SIGKILL
    return out


def _until_quiet(path: Path, timeout: float = 90, ended: Callable[[], bool] | None = None) -> float:
    """The job's last 'alive' once it has written none for 3 s, and, with `ended`, once that
    holds (the ledger recorded the run's end, which it does when its processes are gone): a
    job starved for 3 s under load is no end (CI: the limit test took such a stall before its
    limit for the job's end and found no SIGTERM)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = _times(path)
        if alive and time.time() - alive[-1] > 3.0 and (ended is None or ended()):
            return _times(path)[-1]
        time.sleep(0.3)
    raise AssertionError(f"the job still writes to {path}, or its end is not recorded")


def _run_ended(led: Ledger, job: int = 1) -> Callable[[], bool]:
    """A condition: the ledger recorded the end of a run of `job`."""
    return lambda: bool(led.of("job.run_ended.v2", job))


def _any_end(led: Ledger, job: int = 1) -> Callable[[], bool]:
    """A condition: the ledger recorded how a run of `job` ended, whoever ended it: the end of
    a run it stopped (`job.run_ended.v2`) or its engine's end of a running one
    (`job.engine_ended.v2`). For `_until_quiet(..., ended=)`."""
    return lambda: bool(led.of("job.run_ended.v2", job) or led.of("job.engine_ended.v2", job))


def _node(led: Ledger) -> dict[str, Any]:
    (node,) = led.nodes()
    return dict(node)


def _charged(led: Ledger, user: str) -> float:
    rows = json.loads(led.cli("usage", "--by", "user", "--json"))
    return sum(r["usage_gpu_hours"] for r in rows if r["name"] == user) * 3600.0


def test_a_cancelled_run_that_ignores_term_ends_and_is_charged_when_its_processes_die(
    ledger: Ledger,
) -> None:
    """F1: cancel, the job's 15 s grace, scancel (Slurm's EndTime), then KillWait (10 s) of
    ignored SIGTERM before SIGKILL. The run's recorded end, the job's end and its charge are the
    processes' end (within 2 s), not the scancel's EndTime (10 s earlier)."""
    work = ledger.work
    ledger.up()
    ledger.submit("alice", 1, _stubborn(work), "--grace", "15s")
    running = lambda: (work / "alive").exists() and status(ledger, 1) == "running"  # noqa: E731
    ledger.wait("the job to run", running)
    (gpu,) = ledger.jobs()[1]["slots"][0]["gpu_indices"]
    ledger.cli("cancel", "1", actor="alice")
    # its GPU is held while its processes live (its grace, then KillWait): `stopping`, not free
    ledger.wait("its GPU shown stopping", lambda: _node(ledger)["stopping_gpus"] == [gpu])
    assert _node(ledger)["free_gpus"] == 3
    # atk47-23 F8 on Slurm: a job submitted meanwhile goes to a free GPU and starts in the
    # grace (it was placed on the stopping GPU, and started after the grace and KillWait)
    ledger.submit("bob", 1, "sleep 2")
    ledger.wait("job 2 to run", lambda: status(ledger, 2) in ("running", "finished"), 30)
    assert ledger.jobs()[2]["slots"][0]["gpu_indices"] != [gpu]
    last = _until_quiet(work / "alive", ended=_run_ended(ledger))
    ledger.wait("the run's end", lambda: bool(ledger.of("job.run_ended.v2", 1)))
    (end,) = ledger.of("job.run_ended.v2", 1)
    assert end["killed"] is True, end
    # job 2 started in job 1's grace, as the ledger recorded both (the job's last heartbeat
    # within 2 s of the read was a stall under load: 4.2 s at ~50)
    assert ledger.jobs()[2]["started_at"] < end["ended_at"], (ledger.jobs()[2], end)
    ledger.wait("its GPU free", lambda: _node(ledger)["free_gpus"] == 4)
    assert _node(ledger)["stopping_gpus"] == []
    # the end is Slurm's whole-second EndTime, read up to a cycle later; `last` is the last
    # heartbeat the job wrote, up to a beat before it died (CI under load: 2.03 s)
    assert abs(end["ended_at"] - last) <= 3.0, (end, last)
    row = ledger.jobs()[1]
    assert row["finish_reason"] == "cancelled" and row["finished_at"] == end["ended_at"], row
    charged = _charged(ledger, "alice")
    assert abs(charged - (end["ended_at"] - row["started_at"])) <= 0.01, (charged, row, end)


def test_a_second_cancel_in_a_cancels_grace_scancels_at_once(ledger: Ledger) -> None:
    """atk46-23 F7 on Slurm: cancelled with a minute's grace (`stopping` in `queue`), cancelled
    again: `scancel` at once (then Slurm's KillWait, 10 s), not after the minute."""
    work = ledger.work
    ledger.up()
    ledger.submit("alice", 1, _stubborn(work), "--grace", "60s")
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
    ledger.cli("cancel", "1", actor="alice")
    ledger.wait("its SIGTERM", lambda: bool(_times(work / "term")))
    rows = json.loads(ledger.cli("queue", "--state", "running", "--json"))
    assert [(r["job_id"], r["state"]) for r in rows] == [(1, "stopping")], rows
    assert "killed now" in ledger.cli("cancel", "1", actor="alice")
    again = time.time()
    last = _until_quiet(work / "alive", ended=_run_ended(ledger))
    assert last - again <= 24.0, (last, again)  # KillWait (10 s) at load, not the minute
    ledger.wait("the run's end", lambda: bool(ledger.of("job.run_ended.v2", 1)))
    ledger.wait("nothing stopping", lambda: not json.loads(
        ledger.cli("queue", "--state", "running", "--json")))  # fmt: skip


def test_a_whole_minute_limit_gets_the_jobs_grace_and_is_charged_to_its_end(
    ledger: Ledger,
) -> None:
    """F7: `-t 1 --grace 15s`: SIGTERM at 60 s (not Slurm's periodic check, up to 30 s late,
    nor its backstop `-t 3`), then the job's 15 s (more than KillWait's 10 s), then SIGKILL; it
    ends `time_limit` at its processes' end (F1). Its SIGKILL follows the rule
    (`reads.stopping.limit_sigkill_at`): no sooner than the limit plus the grace and 10 s after
    the SIGTERM, which a loaded service sends late (s56: 5 s late, the SIGKILL at the limit plus
    the grace came 9.65 s after the job saw the TERM, and 14-19 s was wanted)."""
    work = ledger.work
    ledger.up()
    ledger.submit("alice", 1, _stubborn(work), "-t", "1", "--grace", "15s")
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
    started = ledger.jobs()[1]["started_at"]
    last = _until_quiet(work / "alive", 240, lambda: status(ledger, 1) == "finished")
    terms, log = _times(work / "term"), ledger.service_log()[-3000:]
    limit = started + 60
    # the executor's SIGTERM, at the limit or after (loaded: late), long before Slurm's 180 s
    assert terms and limit - 1.0 <= terms[0] <= started + 150, (terms, started, log)
    # the job's own view of its TERM (its trap, between two 0.2 s sleeps) comes a little after
    # its script's note of it, which the SIGKILL counts from (`Stopping.termed_at`, from s58;
    # before, the cycle's time, before the `scancel`), and its last beat a little before its
    # SIGKILL: 1.5 s each side; above, a read late under load but no KillWait (10 s) after the
    # grace (atk47-s F3: 25 s from the TERM before)
    kill_from = max(limit + 15.0, terms[0] + LATE_TERM_GRACE_S)
    assert kill_from - 1.5 <= last <= kill_from + 7.0, (terms, started, last, log)
    ledger.wait("the job's end", lambda: status(ledger, 1) == "finished")
    row = ledger.jobs()[1]
    assert row["finish_reason"] == "time_limit", row
    assert abs(row["finished_at"] - last) <= 2.0, (row, last)


def test_a_limit_noticed_late_gets_its_sigterm_first_and_ten_seconds(ledger: Ledger) -> None:
    """s56 (CI, loaded): a `-t 1 --grace 15s` job's limit was noticed 38 s late; its grace,
    counted from the limit, had run out, so it was SIGKILLed at once: no SIGTERM, no chance to
    checkpoint. The service is held with SIGSTOP over the limit and the grace (`-t 15s --grace
    15s`) and let go: the job's own TERM trap fires first, its SIGKILL comes min(grace, 10 s)
    after that TERM (`reads.stopping.limit_sigkill_at`), and it is charged to its real end."""
    work = ledger.work
    ledger.up()
    assert ledger.proc is not None
    ledger.submit("alice", 1, _stubborn(work), "-t", "15s", "--grace", "15s")
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
    started = ledger.jobs()[1]["started_at"]
    os.kill(ledger.proc.pid, signal.SIGSTOP)  # no read sees the limit nor its grace
    try:
        time.sleep(max(0.0, started + 15 + 15 + 3 - time.time()))
    finally:
        os.kill(ledger.proc.pid, signal.SIGCONT)
    resumed = time.time()
    last = _until_quiet(work / "alive", 120, _any_end(ledger))
    terms = _times(work / "term")
    assert terms and terms[0] >= resumed - 1.0, (terms, resumed)  # before: no SIGTERM at all
    assert 9.0 <= last - terms[0] <= 18.0, (terms, last)  # 10 s from its TERM, then SIGKILL
    ledger.wait("the job's end", lambda: status(ledger, 1) == "finished")
    row = ledger.jobs()[1]
    assert row["finish_reason"] == "time_limit", row
    assert abs(row["finished_at"] - last) <= 2.0, (row, last)


def test_a_cancels_grace_counts_from_the_cancel_across_a_restart(ledger: Ledger) -> None:
    """F2: the job (`--grace 20s`) is cancelled, the service is killed with -9 at once and
    started again 22 s later: its grace is over, so Slurm cancels it at once (then KillWait);
    it was given a new 20 s grace."""
    work = ledger.work
    ledger.up()
    ledger.submit("alice", 1, _stubborn(work), "--grace", "20s")
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
    (gpu,) = ledger.jobs()[1]["slots"][0]["gpu_indices"]
    ledger.cli("cancel", "1", actor="alice")
    ledger.wait("its SIGTERM", lambda: bool(_times(work / "term")))
    ledger.kill9()
    time.sleep(22)
    ledger.up()
    serving = time.time()  # it has adopted what Slurm runs by now
    # atk36-23 F1's twin: after the restart its GPU is `stopping` while its processes live
    # one read says both (two reads, at load, saw it stopping and then its end: free 4)
    seen: list[tuple[float, dict[str, Any]]] = []

    def stopping() -> bool:
        seen.append((time.time(), _node(ledger)))
        return seen[-1][1]["stopping_gpus"] == [gpu]

    ledger.wait("its GPU shown stopping", stopping)
    read_at, node = seen[-1]
    assert node["free_gpus"] == 3 and read_at - _times(work / "alive")[-1] < 2, node
    last = _until_quiet(work / "alive", ended=_run_ended(ledger))
    # KillWait (10 s), not a new grace first (20 s + KillWait: 30 s); 24 s: CI at load ~10
    assert last - serving <= 24.0, (last, serving)
    ledger.wait("the run's end", lambda: bool(ledger.of("job.run_ended.v2", 1)))


def test_a_requeued_runs_grace_counts_from_its_preemption_across_a_restart(
    ledger: Ledger,
) -> None:
    """F2 for a run whose job lives on: a resumable job (`--grace 20s`) is preempted (requeued:
    its next run waits for this one to end), the service is killed with -9 at once and started
    again 22 s later: the old run is cancelled at once, from the time its stop began."""
    work = ledger.work
    ledger.up()
    alive = f"{work}/alive.$GPULEDGER_RUN"
    ledger.submit("alice", 1, f"trap 'date +%s.%N >> {work}/term' TERM; "
                  f"while true; do date +%s.%N >> {alive}; sleep 0.2; done",
                  "--grace", "20s", "--resumable")  # fmt: skip
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
    ledger.cli("preempt", "1", "--reason", "the test makes room")
    ledger.wait("its SIGTERM", lambda: bool(_times(work / "term")))
    ledger.kill9()
    time.sleep(22)
    ledger.up()
    serving = time.time()
    last = _until_quiet(work / "alive.0")
    # KillWait (10 s), not a new grace first (20 s + KillWait: 30 s); 24 s: CI at load ~10
    assert last - serving <= 24.0, (last, serving)
    ledger.wait("its next run", lambda: (work / "alive.1").exists(), 90)


def test_a_requeued_run_that_completes_while_the_service_is_down_completes_its_job_once(
    ledger: Ledger,
) -> None:
    """atk39-24 F1: a resumable job is requeued while the service is down (killed with -9: the
    stop's SIGTERM is never sent), then its command exits 0 by itself. After the restart the
    run's end is recorded (`job.run_ended.v2`, ended by itself) and the job is completed: its
    command never runs a second time."""
    work = ledger.work
    ledger.up()
    ledger.submit("alice", 1, f"echo $GPULEDGER_RUN >> {work}/runs; "
                  f"while [ ! -e {work}/go ]; do sleep 0.2; done; exit 0",
                  "--resumable", "--min-runtime", "0s")  # fmt: skip
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
    ledger.kill9()
    ledger.cli("requeue", "1")  # appended; no service carries it out
    (work / "go").touch()
    time.sleep(4)  # the command has ended by itself, exit 0 (Slurm: COMPLETED)
    ledger.up()
    ledger.wait("the job's end", lambda: status(ledger, 1) == "finished", 60)
    time.sleep(5)  # a second run would be submitted by now
    assert (work / "runs").read_text().split() == ["0"]
    assert ledger.jobs()[1]["finish_reason"] == "completed", ledger.jobs()[1]
    (ended,) = ledger.of("job.run_ended.v2", 1)
    assert ended["run"] == 0 and ended["by_itself"] and ended["exit_code"] == 0, ended


def test_a_stopped_run_that_ends_by_itself_in_an_outage_is_recorded_ended_when_last_seen(
    ledger: Ledger,
) -> None:
    """atk39-24 F6: slurmctld is killed, a resumable job is requeued meanwhile (its SIGTERM
    cannot be sent), and its command ends by itself, exit 0; the controller comes back 8 s
    later. The job is completed, run once, and its run's end is not the late EndTime at which
    the controller heard of it (it was): it is when the ledger last saw it running, before
    its real end."""
    work = ledger.work
    cl = ledger.cluster
    ledger.up()
    ledger.submit("alice", 1, f"echo $GPULEDGER_RUN >> {work}/runs; "
                  f"while [ ! -e {work}/go ]; do sleep 0.2; done; date +%s.%N >> {work}/end",
                  "--resumable", "--min-runtime", "0s")  # fmt: skip
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
    time.sleep(8)  # slurmctld saves its state a few seconds after a change
    os.kill(cl.daemon_pid("slurmctld"), signal.SIGKILL)
    ledger.wait("the outage to be seen", lambda: "outage" in ledger.cli("status"), timeout=90)
    ledger.cli("requeue", "1")
    time.sleep(1)
    (work / "go").touch()
    ledger.wait("its own end", lambda: bool(_times(work / "end")))
    (real,) = _times(work / "end")
    time.sleep(8)
    cl.up()
    ledger.wait("the job's end", lambda: status(ledger, 1) == "finished", timeout=180)
    (ended,) = ledger.of("job.run_ended.v2", 1)
    assert ended["by_itself"] and ended["exit_code"] == 0, ended
    assert ended["ended_at"] <= real + 1.0, (ended, real)
    assert ledger.jobs()[1]["outcome"] == "completed", ledger.jobs()[1]
    time.sleep(3)  # a second run would be submitted by now
    assert (work / "runs").read_text().split() == ["0"]


def _tree(work: Path) -> str:
    """`_stubborn` with a child of its own that ignores SIGTERM too and writes `child`."""
    return (f"(trap '' TERM; while true; do date +%s.%N >> {work}/child; sleep 0.2; done) & "
            + _stubborn(work))  # fmt: skip


def _both_run(led: Ledger, work: Path) -> bool:
    return (work / "child").exists() and status(led, 1) == "running"


def _slurm_state(led: Ledger, job: int) -> str:
    """Slurm's own word on the run's job (`scontrol show job`): its state and exit code."""
    slurm_id = led.jobs()[job]["engine_job_id"]
    text = led.cluster.run("scontrol", "-o", "show", "job", str(slurm_id))
    words = dict(w.split("=", 1) for w in text.split() if "=" in w)
    return f"{words['JobState']} {words['ExitCode']}"


def _kill_at(led: Ledger, job: int) -> float | None:
    rows = json.loads(led.cli("queue", "--state", "running", "--json"))
    return next((r["kill_at"] for r in rows if r["job_id"] == job), None)


def test_a_cancels_sigkill_comes_at_the_end_of_its_grace_to_its_whole_tree(
    ledger: Ledger,
) -> None:
    """atk47-s F3, atk47-23 F6: after the grace came a plain `scancel`, Slurm's SIGTERM again and
    SIGKILL only `KillWait` (10 s) later: a 20 s grace gave 29.5 s, and the reads' "SIGKILL by"
    was 10 s early. Now the executor SIGKILLs the batch step at the grace's end: the job and its
    TERM-ignoring child stop writing within a read or two of `kill_at`, Slurm says the job was
    killed by signal 9, and the recorded end is not before the processes' last sign of life."""
    work = ledger.work
    ledger.up()
    ledger.submit("alice", 1, _tree(work), "--grace", "5s")
    ledger.wait("the job to run", lambda: _both_run(ledger, work))
    ledger.cli("cancel", "1", actor="alice")
    ledger.wait("its SIGTERM", lambda: bool(_times(work / "term")))
    kill_at = _kill_at(ledger, 1)
    assert kill_at is not None
    last = max(_until_quiet(work / "alive", ended=_run_ended(ledger)), _until_quiet(work / "child"))
    term = _times(work / "term")[0]
    # the grace (5 s) from the recorded cancel (`kill_at`; the TERM went out a read or more
    # after it: 3.88 s from the job's TERM at load ~25), not grace + KillWait (15 s); "SIGKILL
    # by" held, a read late under load (2.5 s idle)
    assert term < kill_at - 1.0 and kill_at - 1.5 <= last <= kill_at + 6.0, (term, last, kill_at)
    ledger.wait("the run's end", lambda: bool(ledger.of("job.run_ended.v2", 1)))
    (end,) = ledger.of("job.run_ended.v2", 1)
    assert end["killed"] is True and end["ended_at"] >= last - 1.0, (end, last)  # whole seconds
    assert _slurm_state(ledger, 1).endswith(":9"), _slurm_state(ledger, 1)  # SIGKILL, Slurm says


def test_a_second_cancel_kills_at_once_and_the_reads_say_when(ledger: Ledger) -> None:
    """atk47-23 F6b: after a second cancel the reads showed `SIGKILL by <the first cancel>`, a
    time already past, while Slurm's scancel gave the job KillWait (10 s) more. Now `kill_at` is
    the second cancel and the processes are gone within a few seconds of it."""
    work = ledger.work
    ledger.up()
    ledger.submit("alice", 1, _tree(work), "--grace", "60s")
    ledger.wait("the job to run", lambda: _both_run(ledger, work))
    ledger.cli("cancel", "1", actor="alice")
    ledger.wait("its SIGTERM", lambda: bool(_times(work / "term")))
    time.sleep(3)
    again = time.time()
    assert "killed now" in ledger.cli("cancel", "1", actor="alice")
    kill_at = _kill_at(ledger, 1)
    assert kill_at is None or kill_at >= again - 1.0, (kill_at, again)  # not the first cancel
    last = max(_until_quiet(work / "alive", ended=_run_ended(ledger)), _until_quiet(work / "child"))
    assert last - again <= 4.0, (last, again)  # at once, not KillWait (10 s) later
    ledger.wait("the run's end", lambda: bool(ledger.of("job.run_ended.v2", 1)))
    said = ledger.cli("explain", "1")
    assert "cancelled again" in said and "its grace cut short" in said, said


def test_a_cancel_never_carried_out_before_a_kill_9_is_killed_at_its_kill_at(
    ledger: Ledger,
) -> None:
    """atk47-23 F9: cancelled (`--grace 8s`), the service killed -9 at once (before or just
    after its SIGTERM), started again once the reads' `kill_at` had passed: the job got a whole
    new grace and then KillWait, 8 s past its recorded end. Now it is killed at the restart
    (the SIGKILL the reads promised), and its recorded end is not before its processes'."""
    work = ledger.work
    ledger.up()
    ledger.submit("alice", 1, _tree(work), "--grace", "8s")
    ledger.wait("the job to run", lambda: _both_run(ledger, work))
    ledger.cli("cancel", "1", actor="alice")
    ledger.kill9()
    kill_at = _kill_at(ledger, 1)  # embedded: the service is down
    assert kill_at is not None
    while time.time() < kill_at + 3:
        time.sleep(0.5)
    assert time.time() - _times(work / "alive")[-1] < 2  # it lives past its kill_at meanwhile
    restarting = time.time()
    ledger.up()
    serving = time.time()
    last = max(_until_quiet(work / "alive", ended=_run_ended(ledger)), _until_quiet(work / "child"))
    # killed at the restart: no SIGTERM after it (a new grace begins with one), and by the
    # executor's SIGKILL of its batch step (Slurm's own cancel: TERM, KillWait, FAILED :0);
    # the restart's first cycles take seconds under load (5 s idle; 8-10.6 s at load ~20)
    assert [t for t in _times(work / "term") if t > restarting] == [], (restarting, serving)
    assert _slurm_state(ledger, 1).endswith(":9"), _slurm_state(ledger, 1)
    assert last - serving <= 15.0, (last, serving)  # a new grace and KillWait: 18 s and more
    ledger.wait("the run's end", lambda: bool(ledger.of("job.run_ended.v2", 1)))
    (end,) = ledger.of("job.run_ended.v2", 1)
    assert end["ended_at"] >= last - 1.0, (end, last)
    assert ledger.jobs()[1]["finished_at"] >= last - 1.0


def test_a_preemption_in_a_time_limits_grace_kills_at_once_and_records_the_end(
    ledger: Ledger,
) -> None:
    """atk54-23 F2: `-t 4s --grace 60s`, SIGTERM ignored; preempted 5 s into the limit's grace:
    killed at once, as the reads say (`time_limit`, the SIGKILL due), and the run's end recorded
    once Slurm ends it, its GPU free. The old code kept the limit's stop alone: the SIGKILL at
    the grace's end (a minute on), and no end recorded (the job `stopping`) until a restart."""
    work = ledger.work
    ledger.up()
    ledger.submit("alice", 1, _stubborn(work), "--resumable", "--min-runtime", "0",
                  "-t", "4s", "--grace", "60s")  # fmt: skip
    ledger.wait("its limit's SIGTERM", lambda: bool(_times(work / "term")), 120)
    time.sleep(5)
    ledger.cli("preempt", "1", "--reason", "in its limit's grace")
    preempted = time.time()
    last = _until_quiet(work / "alive", ended=_run_ended(ledger))
    assert last - preempted <= 15.0, (last, preempted)  # at once (the reads' word), not 55 s on
    ledger.wait("the run's end", lambda: bool(ledger.of("job.run_ended.v2", 1)), 40)
    ledger.wait("nothing stopping", lambda: not json.loads(
        ledger.cli("queue", "--state", "running", "--json")), 30)  # fmt: skip
    row = ledger.jobs()[1]
    assert (row["status"], row["finish_reason"]) == ("finished", "time_limit"), row


def test_a_job_without_a_limit_runs_on_a_partition_with_a_max_time_and_stops_at_its_limit(
    ledger: Ledger,
) -> None:
    """s62 (issues 23/24): on a partition with MaxTime=2, a job submitted without `-t` waited
    PARTITION_TIME_LIMIT for good (e4a7d9c4). Now it takes its limit from MaxTime, as Slurm
    does: MaxTime less its grace (5 s) and a minute, 55 s, recorded at submit (`submit` says
    so), shown by `jobs`, `queue` and `explain` (which names MaxTime); the executor stops it
    there itself (SIGTERM, its grace, then SIGKILL), long before Slurm's TIMEOUT at MaxTime,
    and it is recorded `time_limit`."""
    work, c = ledger.work, ledger.cluster
    part = f"PartitionName={c.partition}"
    c.run("scontrol", "update", part, "MaxTime=2")
    try:
        ledger.up()
        said = ledger.cli("submit", "-A", "ai2/olmo", "-G", "1", "--grace", "5s",
                          "--min-runtime", "1h", "--", "bash", "-c", _stubborn(work),
                          actor="alice")  # fmt: skip
        taken = "its limit is 55s, the partition's MaxTime as the service last read it (2m)"
        assert taken in said, said
        assert "its contract (1h) is cut to it" in said, said
        ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
        row = ledger.jobs()[1]
        started = row["started_at"]
        assert (row["time_limit_s"], row["min_runtime_s"]) == (55, 55), row
        (queued,) = json.loads(ledger.cli("queue", "--state", "running", "--json"))
        assert queued["time_limit_s"] == 55 and 0 < queued["remaining_s"] <= 55, queued
        told = ledger.cli("explain", "1")
        assert "with no time limit of its own: its limit is 55s, the partition's MaxTime" in told
        assert "Its contract protects it until" in told and "nothing protects it past" in told
        last = _until_quiet(work / "alive", 150, lambda: status(ledger, 1) == "finished")
    finally:
        c.run("scontrol", "update", part, "MaxTime=UNLIMITED", check=False)
    terms, log = _times(work / "term"), ledger.service_log()[-3000:]
    limit = started + 55
    # the executor's SIGTERM at the limit (late under load), then its 5 s grace, then SIGKILL:
    # all before Slurm's TIMEOUT, which MaxTime (120 s) would bring no sooner than 120 s
    assert terms and limit - 1.0 <= terms[0] <= started + 100, (terms, started, log)
    kill_from = max(limit + 5.0, terms[0] + min(5.0, LATE_TERM_GRACE_S))
    assert kill_from - 1.5 <= last <= kill_from + 7.0 and last < started + 115, (terms, last, log)
    ledger.wait("the job's end", lambda: status(ledger, 1) == "finished")
    row = ledger.jobs()[1]
    assert row["finish_reason"] == "time_limit" and row["time_limit_s"] == 55, row
    assert abs(row["finished_at"] - last) <= 2.0, (row, last)  # the ledger's stop: no TIMEOUT
    ledger.stop()  # atk62b G3: the log of a run stopped at its limit replays byte for byte
    assert "0 differ, 0 cannot" in ledger.cli("replay", "--all", "--exact")
