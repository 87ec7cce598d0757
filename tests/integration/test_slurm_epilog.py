"""Slurm as the engine, the job as its whole cgroup tree when neither Slurm's proctrack nor the
batch script can sweep it (atk47-s F1, F2): the site's Epilog (ledger/engines/slurm/epilog.sh,
which scripts/slurm/slurm sets) kills every process left in the job's cgroups, sub-cgroups too,
while slurmd holds the node COMPLETING. Real Slurm, real jobs; which processes lived when is read
from outside the ledger (each process's own lines every 0.2 s, /proc)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration import test_slurm as base
from tests.integration.test_slurm import Cluster, Ledger
from tests.integration.test_slurm_stepd import _remove_groups, _stepd_of
from tests.integration.test_slurm_stops import _times
from tests.integration.test_slurm_trees import alive, kill_of_job, pids

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures


def _loop(name: str, work: Path) -> str:
    """A loop that writes the time to `work/name` every 0.2 s for good."""
    return f"while :; do date +%s.%N >> {work}/{name}; sleep 0.2; done"


def _slurm_id(pid: int) -> str:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (slurm_id,) = [v[13:].decode() for v in environ if v.startswith(b"SLURM_JOB_ID=")]
    return slurm_id


def _tree(cl: Cluster, slurm_id: str) -> set[int]:
    """Every process in the job's cgroups, sub-cgroups included."""
    found: set[int] = set()
    for top in Path("/sys/fs/cgroup").glob(f"*/slurm_{cl.node}/uid_*/job_{slurm_id}"):
        for procs in top.glob("**/cgroup.procs"):
            with contextlib.suppress(OSError):
                found |= {int(p) for p in procs.read_text().split()}
    return found


def _below(pid: int, tops: set[int]) -> bool:
    """True if `pid` is one of `tops` or runs below one of them."""
    while pid > 1:
        if pid in tops:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


def _end(ledger: Ledger, slurm_id: str, *left: int) -> None:
    for pid in left:
        kill_of_job(pid, {slurm_id})
    time.sleep(0.5)
    _remove_groups(ledger.cluster, slurm_id)


def test_the_orphans_of_a_job_whose_slurmstepd_and_script_were_killed_end_before_the_next_job(
    ledger: Ledger,
) -> None:
    """atk47-s F1: job 1 (every GPU) leaves a TERM-ignoring child and a TERM-ignoring setsid
    daemon; its slurmstepd, its batch script and its leader are killed with -9, so nothing inside
    the job sweeps it. Slurm cancels it by NODE_FAIL (its batch job missing from the node); the
    ledger ended the run and started job 2 on the same GPUs while the two ran on for minutes.
    Now the epilog kills them while the node is COMPLETING: both are gone before job 2 starts."""
    work = ledger.work
    ledger.up()
    kid = f"( trap '' TERM HUP INT; {_loop('kid', work)} ) & echo kid=$!; "
    daemon = f"setsid bash -c 'trap \"\" TERM HUP INT; echo daemon=$$; {_loop('daemon', work)}' & "
    ledger.submit("alice", 4, kid + daemon + "sleep 0.5; echo leader=$$; sleep 600")
    ledger.submit("bob", 4, f"date +%s.%N >> {work}/next; sleep 1")
    ledger.wait(
        "job 1 to run and fork",
        lambda: all(pids(ledger.log_of(1), k) for k in ("leader", "kid", "daemon"))
        and bool(_times(work / "kid")) and bool(_times(work / "daemon")),
        timeout=120,
    )  # fmt: skip
    (leader,) = pids(ledger.log_of(1), "leader")
    left = {*pids(ledger.log_of(1), "kid"), *pids(ledger.log_of(1), "daemon")}
    slurm_id = _slurm_id(leader)
    try:
        os.kill(_stepd_of(leader), signal.SIGKILL)
        killed = [p for p in _tree(ledger.cluster, slurm_id) if not _below(p, left)]
        for pid in killed:  # the batch script and the leader: what is left is the orphans
            with contextlib.suppress(ProcessLookupError):  # one may end with its slurmstepd
                os.kill(pid, signal.SIGKILL)
        assert leader in killed and all(alive(p) for p in left)
        ledger.wait("job 2 to start", lambda: (work / "next").exists(), timeout=240)
        orphans_alive = [p for p in left if alive(p)]
        (ended,) = ledger.of("job.engine_ended.v2", 1)
    finally:
        _end(ledger, slurm_id, *left)
    last = max(_times(work / "kid")[-1], _times(work / "daemon")[-1])
    (started,) = _times(work / "next")
    assert not orphans_alive, "job 1's orphans outlived its end"
    assert started > last, f"job 2 started {last - started:.1f} s before job 1's orphans ended"
    # Slurm's NODE_FAIL ends the run (the epilog kills the orphans at once): the end recorded
    # is not before theirs (seen 11 s after: the ledger's KillWait past the NODE_FAIL)
    assert ended["reason"] == "node_failure" and ended["ended_at"] >= last - 1, (ended, last)


def test_a_child_that_escaped_into_a_sub_cgroup_ends_before_the_next_job(ledger: Ledger) -> None:
    """atk47-s F2: job 1 (every GPU, a 20 s limit) forks a TERM-ignoring child that makes a
    sub-cgroup of its step's freezer cgroup (Slurm chowns the step's directory to the job's
    user) and moves itself there; its leader ignores TERM too. At the limit Slurm's proctrack
    killed only the step cgroup's own processes (the script with them, before its sweep): the
    child ran on beside job 2. Now the epilog kills it before job 2 starts."""
    work = ledger.work
    ledger.up()
    cg = "/sys/fs/cgroup/freezer$(sed -n 's/^[0-9]*:freezer://p' /proc/self/cgroup)"
    escape = (
        f"( trap '' TERM HUP INT; cg={cg}; mkdir $cg/esc && echo $BASHPID > $cg/esc/cgroup.procs"
        f" && echo esc=$BASHPID; {_loop('esc', work)} ) & "
    )
    leader = "trap '' TERM; echo leader=$$; while :; do sleep 0.2; done"
    ledger.submit("alice", 4, escape + leader, "-t", "20s", "--grace", "2s")
    ledger.submit("bob", 4, f"date +%s.%N >> {work}/next; sleep 1")
    ledger.wait(
        "job 1 to run and escape",
        lambda: bool(pids(ledger.log_of(1), "esc")) and bool(_times(work / "esc")),
        timeout=120,
    )
    (esc,) = pids(ledger.log_of(1), "esc")
    slurm_id = _slurm_id(esc)
    assert Path(f"/proc/{esc}/cgroup").read_text().count(f"job_{slurm_id}/step_batch/esc") == 1
    try:
        ledger.wait("job 2 to start", lambda: (work / "next").exists(), timeout=180)
        escapee_alive = alive(esc)
        (ended,) = ledger.of("job.engine_ended.v2", 1)
    finally:
        _end(ledger, slurm_id, esc)
    last = _times(work / "esc")[-1]
    (started,) = _times(work / "next")
    assert not escapee_alive, "job 1's escaped child outlived its end"
    assert started > last, f"job 2 started {last - started:.1f} s before job 1's child ended"
    assert ended["reason"] == "time_limit" and ended["ended_at"] >= last - 1, (ended, last)


FORKER = """
import os, signal, sys, time
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
while True:  # a new pid every ~3 ms, each parent gone at once
    if os.fork():
        os._exit(0)
    with open(sys.argv[1], "a") as out:
        out.write(f"{time.time():.6f}\\n")
    time.sleep(0.003)
"""
"""A process that keeps forking, each parent exiting: its pids outrun a sweep that reads a
cgroup's pids and then each one's environment (atk59b N1)."""


def _in_hide(node: str, slurm_id: str) -> set[int]:
    """The pids in the `hide` sub-cgroup of Slurm job `slurm_id`'s batch step (freezer)."""
    found: set[int] = set()
    for procs in Path("/sys/fs/cgroup/freezer").glob(
        f"slurm_{node}/uid_*/job_{slurm_id}/step_batch/hide/cgroup.procs"
    ):
        with contextlib.suppress(OSError):
            found |= {int(p) for p in procs.read_text().split()}
    return found


def _kill_hidden(node: str, slurm_id: str) -> None:
    """Every process in that `hide` sub-cgroup killed: frozen first (a forking one outruns
    a kill by pid), SIGKILLed, thawed."""
    for state in Path("/sys/fs/cgroup/freezer").glob(
        f"slurm_{node}/uid_*/job_{slurm_id}/step_batch/hide/freezer.state"
    ):
        with contextlib.suppress(OSError):
            state.write_text("FROZEN")
            deadline = time.monotonic() + 5
            while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.01)
            for pid in (state.parent / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            state.write_text("THAWED")


@pytest.mark.parametrize("forks", [False, True], ids=["one-pid", "forking"])
def test_a_process_that_moved_into_its_owners_other_job_ends_before_the_next_job(
    ledger: Ledger, forks: bool
) -> None:
    """atk59 F2: alice's job 2 forks a TERM-ignoring process that makes a sub-cgroup of the batch
    step of her job 1 on the same node (in the freezer and devices hierarchies: Slurm chowns
    the step's directories to her) and moves there. Job 2 is cancelled and bob's job 4 takes its
    GPU: the process lived on beside job 4 until job 1 ended, as neither Slurm's proctrack, the
    batch script's reaping nor the epilog looked outside job 2's cgroups. Now job 2's epilog
    finds it in job 1's by the job id in its environment and kills it before job 4 starts; job 1
    and bob's job 3 run on."""
    work, node = ledger.work, ledger.cluster.node
    ledger.up()
    ledger.submit("alice", 1, "sleep 600")
    ledger.wait("job 1 to run", lambda: ledger.jobs()[1]["status"] == "running", timeout=120)
    (linked,) = ledger.of("job.engine_linked.v1", 1)
    steps = f"/sys/fs/cgroup/{{freezer,devices}}/slurm_{node}/uid_*/job_{linked['engine_job_id']}"
    (work / "forker.py").write_text(FORKER)
    then = f"exec /usr/bin/python3 {work}/forker.py {work}/esc" if forks else _loop("esc", work)
    escape = (
        f"( trap '' TERM HUP INT; for d in {steps}/step_batch; do mkdir $d/hide &&"
        f" echo $BASHPID > $d/hide/cgroup.procs; done; echo esc=$BASHPID; {then} ) & "
    )
    ledger.submit("alice", 1, escape + "sleep 600")
    ledger.submit("bob", 2, "sleep 600")
    ledger.wait(
        "jobs 2 and 3 to run, job 2's process to escape",
        lambda: ledger.jobs()[3]["status"] == "running" and bool(pids(ledger.log_of(2), "esc"))
        and bool(_times(work / "esc")),
        timeout=120,
    )  # fmt: skip
    (esc,) = pids(ledger.log_of(2), "esc")
    (linked2,) = ledger.of("job.engine_linked.v1", 2)
    slurm_id, hidden = str(linked2["engine_job_id"]), str(linked["engine_job_id"])
    if not forks:
        moved = Path(f"/proc/{esc}/cgroup").read_text()
        assert moved.count(f"job_{hidden}/step_batch/hide") == 2, moved
    assert _in_hide(node, hidden), "job 2's process never moved into job 1"
    try:
        ledger.cli("cancel", "2", actor="alice")
        ledger.submit("bob", 1, f"date +%s.%N >> {work}/next; sleep 1")
        ledger.wait("job 4 to start", lambda: (work / "next").exists(), timeout=180)
        escapee_alive = bool(_in_hide(node, hidden))
        jobs = ledger.jobs()
    finally:
        _kill_hidden(node, hidden)
        _end(ledger, slurm_id)
    last = _times(work / "esc")[-1]
    (started,) = _times(work / "next")
    assert not escapee_alive, "job 2's process that moved into job 1 outlived job 2's end"
    assert started > last, f"job 4 started {last - started:.1f} s before job 2's process ended"
    assert (jobs[1]["status"], jobs[3]["status"]) == ("running", "running"), jobs
