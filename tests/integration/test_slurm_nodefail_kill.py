"""A run Slurm ends NODE_FAIL is gone only once it surely is (issue 24, atk39-24): Slurm's kill
is Slurm's word, not the processes' end. Real Slurm (KillWait=10, SlurmdTimeout=30),
`gpuledger up --executor slurm`; each job writes a line every 0.2 s while it lives, so which
runs lived at once is read from outside the ledger."""

from __future__ import annotations

import os
import signal
import threading
import time

from tests.integration import test_slurm as base
from tests.integration.test_slurm import Ledger, status
from tests.integration.test_slurm_nodefail import _down
from tests.integration.test_slurm_stops import _any_end, _times, _until_quiet

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures


def _beating(work: str, name: str, each_beat: str = "") -> str:
    """A job that notes each SIGTERM and ignores it, and writes the time to `name` every 0.2 s
    (running `each_beat` too) until `<work>/stop.<name>` exists, then exits 0."""
    return (f"trap 'date +%s.%N >> {work}/term.{name}' TERM; while [ ! -e {work}/stop.{name} ];"
            f" do date +%s.%N >> {work}/{name}; {each_beat}sleep 0.2; done")  # fmt: skip


def test_a_node_fail_run_whose_kill_never_comes_keeps_its_gpus_while_it_lives(
    ledger: Ledger,
) -> None:
    """atk39-24 F5: an admin sets the node DOWN, slurmd is killed 0.3 s later (its TERM has
    landed, its SIGKILL never will) and restarted 3 s after: the node returns and Slurm never
    kills the NODE_FAIL job, which ignores SIGTERM and runs on. The ledger took it for gone
    KillWait after the TERM once SlurmdTimeout had passed and started the waiting job on its
    GPUs beside it 30 s after the DOWN. Now its GPUs stay held while its heartbeat beats: the
    next job starts only after the job's last line (Slurm's own cleanup kills it 45-60 s after
    the DOWN here; else it ends by itself at 75 s)."""
    _kill_never_comes(ledger, "")


def test_a_node_fail_run_that_forges_its_end_record_keeps_its_gpus_while_it_lives(
    ledger: Ledger,
) -> None:
    """F5 with atk38-24 F1: as above, but from its node's DOWN on the job writes its own end
    record (`0 <now> 0`) every 0.2 s while it lives. The record sets how it is recorded (its
    user's word), but its GPUs stay held while its heartbeat beats, not only until Slurm's kill
    would have landed (its script, which did not write the record, ends it at its next beat:
    atk42-24 F1). It forged from its start before, so since atk42-24 F1 its script ended it
    within a beat, before the DOWN: the DOWN met job 2 instead, which had taken its GPUs, and
    when job 2's launch was slow (the whole suite) it ended `node_lost` before its command
    wrote its line (s52), the test tests nothing. Now job 1 must live at the DOWN."""
    forge = (
        f'[ -e {ledger.work}/downed ] && {{ d=$(dirname "$GPULEDGER_CHECKPOINT_FILE"); '
        'echo "0 $(date +%s.%N) 0" > "$d/ended.part" && mv -f "$d/ended.part" "$d/ended"; }; '
    )
    _kill_never_comes(ledger, forge)


def _kill_never_comes(ledger: Ledger, each_beat: str) -> None:
    """Job 1 (4 GPUs, SIGTERM ignored, running `each_beat` every 0.2 s too; `<work>/downed` is
    there from the DOWN on) runs, job 2 waits; the DOWN, slurmd killed 0.3 s later and
    restarted 3 s after. Job 1 lives at the DOWN, job 2 starts (its command runs, once) only
    after job 1's last line, and job 1's recorded end is not before it."""
    work = ledger.work
    cl = ledger.cluster
    ledger.up()
    ledger.submit("alice", 4, _beating(str(work), "one", each_beat))
    ledger.wait("the job to run", lambda: bool(_times(work / "one")) and status(ledger, 1) == "running")  # fmt: skip  # noqa: E501
    ledger.submit("bob", 4, f"date +%s.%N >> {work}/next; sleep 2")
    time.sleep(2)
    down = time.time()
    _down(ledger)
    (work / "downed").touch()
    time.sleep(0.3)
    os.kill(cl.daemon_pid("slurmd"), signal.SIGKILL)
    time.sleep(3)
    cl.up()  # slurmd back within seconds (and the node resumed, as ReturnToService=1 does)
    try:  # Slurm's own cleanup kills it at last, here 45-60 s after the DOWN (74-142 s seen)
        while time.time() < down + 75 and time.time() - _times(work / "one")[-1] < 3.0:
            time.sleep(0.5)
    finally:
        (work / "stop.one").touch()  # else its command ends by itself
    last = _until_quiet(work / "one", ended=_any_end(ledger))
    assert last > down, (  # else the DOWN met job 2, not job 1 (s52: its forger's old shape)
        f"job 1 ended {down - last:.1f} s before its node's DOWN\n{ledger.service_log()[-3000:]}"
    )
    ledger.wait("the next job to finish", lambda: status(ledger, 2) == "finished", timeout=120)
    ran = _times(work / "next")
    assert len(ran) == 1, (  # finished (failed too) with its command run 0 times: say how
        f"job 2 is finished, its command ran {len(ran)} times: {ledger.jobs()[2]}\n"
        f"{ledger.service_log()[-6000:]}"
    )
    (started,) = ran
    assert started > last, (
        f"job 2 started {last - started:.1f} s before job 1 ended ({started - down:.0f} s "
        f"after the DOWN)\n{ledger.service_log()[-3000:]}"
    )
    job = ledger.jobs()[1]
    assert each_beat or job["finished_at"] >= last - 0.5, (job, last)


def test_a_restart_with_a_stop_in_doubt_submits_nothing_onto_the_lost_node_or_its_gpus(
    ledger: Ledger,
) -> None:
    """atk39-24 F3: job 1 (4 GPUs, SIGTERM ignored, grace 60 s) is cancelled and job 2 waits for
    its GPUs (placed on them before atk47-23 F8); slurmd is killed, the node set DOWN (Slurm:
    NODE_FAIL; job 1's processes run on, its kill never sent), the service killed with -9 and
    started again, then slurmd restarted. The restart submitted job 2 onto the lost node at once
    ("placed but never reached the engine"), and Slurm started it there beside job 1 as soon as
    the node returned; job 1's end was recorded before the DOWN. Now job 2 starts only after
    job 1's last line, and job 1's recorded end is not before it."""
    work = ledger.work
    cl = ledger.cluster
    before = set(cl.jobs())  # earlier tests' jobs
    ledger.up()
    ledger.submit("alice", 4, _beating(str(work), "one"), "--grace", "60s")
    ledger.wait("the job to run", lambda: bool(_times(work / "one")) and status(ledger, 1) == "running")  # fmt: skip  # noqa: E501
    ledger.submit("bob", 4, f"date +%s.%N >> {work}/next; sleep 2")
    ledger.cli("cancel", "1", actor="alice")
    # job 2 waits for job 1's GPUs, never placed on them while its processes live (atk47-23 F8)
    waits = "stopped runs still in their grace"
    ledger.wait("job 2 to wait for job 1's GPUs", lambda: waits in ledger.cli("explain", "2"))
    ledger.wait("job 1's SIGTERM", lambda: (work / "term.one").exists())
    time.sleep(1)
    try:
        os.kill(cl.daemon_pid("slurmd"), signal.SIGKILL)
        _down(ledger)
        time.sleep(3)
        ledger.kill9()
        time.sleep(1)
        ledger.up()
        time.sleep(4)
        submitted = [
            j for i, j in cl.jobs().items() if i not in before and j["name"] == "gpuledger-2"
        ]
        assert submitted == [], "job 2 was submitted onto the DOWN node"
        cl.up()  # slurmd back (and the node resumed)
        time.sleep(20)  # job 2 would be running beside job 1 by now
    finally:
        (work / "stop.one").touch()
    last = _until_quiet(work / "one", ended=_any_end(ledger))
    ledger.wait("job 2 to finish", lambda: status(ledger, 2) == "finished", timeout=120)
    (started,) = _times(work / "next")
    assert started > last, (
        f"job 2 started {last - started:.1f} s before job 1 ended; Slurm's jobs at the "
        f"restart: {submitted}\n{ledger.service_log()[-3000:]}"
    )
    (end,) = ledger.of("job.run_ended.v2", 1)
    assert end["ended_at"] >= last - 0.5, (end, last)


def test_a_run_that_makes_its_mark_unwritable_is_ended_by_its_own_script(ledger: Ledger) -> None:
    """atk40-24 F1b: job 1 (4 GPUs, SIGTERM ignored) removes its `alive` mark and makes its
    directory unwritable; 9 s later the node is set DOWN, slurmd killed 0.3 s after and
    restarted 3 s later (its SIGKILL never comes). The old heartbeat was a process of the
    script's that stopped beating, so the run was judged by the older rules and taken for gone
    KillWait after SlurmdTimeout while it lived on (until Slurm's own cleanup, 45-60 s here),
    beside the next job on its GPUs. Now the script is the heartbeat: unable to write its mark
    for 6 s it SIGTERMs the command itself (before the DOWN) and ends it KillWait + 1 s later;
    the executor waits that long after the last beat. Job 2 starts after job 1's last line."""
    work = ledger.work
    cl = ledger.cluster
    ledger.up()
    unwrite = (
        f'[ -e {work}/unwrite ] && d=$(dirname "$GPULEDGER_CHECKPOINT_FILE") && '
        '[ -w "$d" ] && { rm -f "$d/alive"; chmod 500 "$d"; }; '
    )
    ledger.submit("alice", 4, _beating(str(work), "one", unwrite))
    ledger.wait("the job to run", lambda: bool(_times(work / "one")) and status(ledger, 1) == "running")  # fmt: skip  # noqa: E501
    ledger.submit("bob", 4, f"date +%s.%N >> {work}/next; sleep 2")
    time.sleep(2)
    (work / "unwrite").touch()
    unwritten = time.time()
    time.sleep(9)
    termed = _times(work / "term.one")
    down = time.time()
    _down(ledger)
    time.sleep(0.3)
    os.kill(cl.daemon_pid("slurmd"), signal.SIGKILL)
    time.sleep(3)
    cl.up()  # slurmd back within seconds (and the node resumed)
    try:
        while time.time() < down + 75 and time.time() - _times(work / "one")[-1] < 3.0:
            time.sleep(0.5)
    finally:
        (work / "stop.one").touch()
    last = _until_quiet(work / "one", ended=_any_end(ledger))
    assert termed and termed[0] - unwritten < 6 + 2 * 2 + 1.5, (termed, unwritten)  # its own
    assert last - down < 20, f"job 1 lived {last - down:.0f} s after the DOWN"
    ledger.wait("the next job to finish", lambda: status(ledger, 2) == "finished", timeout=120)
    (started,) = _times(work / "next")
    assert started > last, (
        f"job 2 started {last - started:.1f} s before job 1 ended ({started - down:.0f} s "
        f"after the DOWN)\n{ledger.service_log()[-3000:]}"
    )


def test_a_dead_runs_mark_kept_fresh_from_outside_does_not_hold_its_gpus(ledger: Ledger) -> None:
    """atk40-24 F3: job 1's node is set DOWN (its slurmd answering: Slurm's TERM, then its
    SIGKILL KillWait later, kill it) while a process of its user outside Slurm touches its
    `alive` mark every second. Its heartbeat looked fresh for good: its GPUs stayed held and
    job 2 never started. Its script ends it its grace + KillWait + 1 s after the TERM it noted,
    so a beat after that is not its script's (`ends.beat_bound`): job 2 starts after job 1's
    last line, within a minute of the DOWN."""
    work = ledger.work
    cl = ledger.cluster
    ledger.up()
    ledger.submit("alice", 4, _beating(str(work), "one"))
    ledger.wait("the job to run", lambda: bool(_times(work / "one")) and status(ledger, 1) == "running")  # fmt: skip  # noqa: E501
    ledger.submit("bob", 4, f"date +%s.%N >> {work}/next; sleep 2")
    alive = ledger.home / "jobs" / "checkpoints" / "1.0" / "alive"
    assert alive.exists()
    done = threading.Event()

    def keep_fresh() -> None:  # the job's user's process, outside Slurm
        while not done.wait(1.0):
            os.utime(alive)

    toucher = threading.Thread(target=keep_fresh, daemon=True)
    toucher.start()
    try:
        time.sleep(2)
        down = time.time()
        _down(ledger)
        time.sleep(3)
        cl.run("scontrol", "update", f"nodename={cl.node}", "state=resume")
        last = _until_quiet(work / "one", ended=_any_end(ledger))
        assert last - down < 15, f"Slurm's kill did not end job 1 ({last - down:.0f} s)"
        ledger.wait("the next job to start", lambda: bool(_times(work / "next")), timeout=90)
    finally:
        done.set()
        toucher.join()
        (work / "stop.one").touch()
    (started,) = _times(work / "next")
    assert started > last, f"job 2 started {last - started:.1f} s before job 1 ended"
    assert started - down < 60 + 5, started - down
