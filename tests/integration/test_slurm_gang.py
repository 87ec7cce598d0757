"""Gangs (multi-node jobs) on real Slurm: the suite's two-node cluster (scripts/test's cluster g,
two slurmd on this host, `GPULEDGER_SLURM_NODES=2`), the only one where a gang runs; every other
Slurm cluster of the suite has one node. A job of 8 GPUs spans both 4-GPU nodes: one Slurm job of
two nodes, whose batch script runs its command on the first; the command starts what runs on the
second with `srun`, as a multi-node job's ranks start. Checked from outside: each process's life
read from /proc, the node it runs on from the slurmstepd above it (the step socket of that node's
slurmd: `slurmd_steps.held_steps`), and Slurm's own view (`squeue`; the suite's clusters keep no
accounting, so there is no sacct). The next job of both nodes' GPUs starts, in Slurm and in the
ledger, only once the gang's processes on either node are gone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration import test_slurm as base
from tests.integration.ports import free_port
from tests.integration.slurmd_steps import held_steps
from tests.integration.test_slurm import Ledger
from tests.integration.test_slurm_trees import alive, kill_of_job, pids

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures

GRACE_S = 45
"""The reaping's grace: the preempt must reach the ledger within it (checked from the ledger's
records, not assumed): 20 s ran out under load before the preempt was recorded."""

SECOND = ('other=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | grep -vx "$SLURMD_NODENAME");'
          ' srun -N1 -n1 -w "$other" bash -c \'trap "" TERM; echo kid2=$$; echo $$ > kid2.pid;'
          ' while :; do sleep 0.2; done\' &'
          ' until [ -s kid2.pid ]; do sleep 0.2; done;')  # fmt: skip
"""A command's start: a step on the node that is not the batch script's, ignoring SIGTERM and
never ending by itself (its pid in `kid2.pid` and the log), left running when the command ends."""


def _row(ledger: Ledger, job: int) -> dict[str, Any]:
    rows = json.loads(ledger.cli("queue", "--state", "running", "--json"))
    return next((r for r in rows if r["job_id"] == job), {})


def _node_of(ledger: Ledger, pid: int) -> str:
    """The node whose slurmd runs `pid`: the one holding the step socket of the slurmstepd above
    it (each node's slurmd has its own spool dir)."""
    up, stepds = pid, set()
    while up > 1:
        stat = Path(f"/proc/{up}/stat").read_text()
        if stat.split("(", 1)[1].startswith("slurmstepd"):
            stepds.add(up)
        up = int(stat.rsplit(")", 1)[1].split()[1])
    for node in ledger.cluster.nodes:
        if any(stepds & held for held in held_steps(ledger.cluster.conf, node).values()):
            return node
    raise AssertionError(f"{pid} is under no step of {ledger.cluster.nodes} (slurmstepd {stepds})")


def _slurm_state(ledger: Ledger, job: int) -> str:
    """Slurm's state of the ledger job's Slurm job (`gpuledger-<job>`), "" when it lists none."""
    return ledger.cluster.run("squeue", "-h", "-n", f"gpuledger-{job}", "-o", "%T",
                              check=False).strip()  # fmt: skip


def _slurm_nodes(ledger: Ledger, job: int) -> list[str]:
    listed = ledger.cluster.run("squeue", "-h", "-n", f"gpuledger-{job}", "-o", "%N").strip()
    return sorted(ledger.cluster.run("scontrol", "show", "hostnames", listed).split())


def _last_alive(kids: list[int]) -> tuple[dict[int, float], threading.Event]:
    """Each of `kids` -> the last time it was seen alive (this host's clock), kept by a thread
    reading /proc every 50 ms, and the event set once all are gone. A lower bound of each one's
    death that holds under any load (a starved reader sees a death late, never an end early)."""
    seen = {k: time.time() for k in kids}
    done = threading.Event()

    def watch() -> None:
        while True:
            for k in kids:
                if alive(k):
                    seen[k] = time.time()
            if not any(alive(k) for k in kids):
                done.set()
                return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    return seen, done


def _next_waits(ledger: Ledger, kids: list[int], timeout: float = 120) -> float:
    """While any of `kids` lives, job 2 (submitted for both nodes' GPUs) neither runs in Slurm
    nor in the ledger; returns when the last was last seen alive (this host's clock)."""
    seen, done = _last_alive(kids)
    deadline = time.monotonic() + timeout
    while not done.is_set():
        assert time.monotonic() < deadline, f"{kids} outlived {timeout} s: {ledger.jobs()[1]}"
        state, row = _slurm_state(ledger, 2), ledger.jobs()[2]
        gone = not any(alive(k) for k in kids)  # (they may die between the reads)
        assert state in ("", "PENDING") or gone, (state, kids)
        assert row["status"] in ("pending", "placed") or gone, row
        time.sleep(0.3)
    return max(seen.values())


def _kill_daemons(data: Path, pids: list[int]) -> None:
    """The daemons of the test's own cluster killed, each only while it is one of them (its
    command line or environment names the cluster's data dir: a pid may be another's by now)."""
    for pid in pids:
        try:
            said = (
                Path(f"/proc/{pid}/cmdline").read_bytes()
                + Path(f"/proc/{pid}/environ").read_bytes()
            )
        except OSError:
            continue
        if str(data).encode() in said:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _kill(ledger: Ledger, kids: list[int]) -> None:
    """The test's leftovers killed, each only while it is a process of this ledger's Slurm jobs
    (`kill_of_job`)."""
    ours = {str(e["engine_job_id"]) for e in ledger.of("job.engine_linked.v1")}
    for kid in kids:
        kill_of_job(kid, ours)


def _two_ranks(ledger: Ledger, grace: str = "3s") -> list[int]:
    """Job 1, alice's 8 GPUs over both nodes (`grace`), started by the service: one rank a
    node (`srun`), each ignoring SIGTERM and never ending; their pids once both run."""
    nodes = ledger.cluster.nodes
    assert len(nodes) == 2, f"the gang tests need a cluster of two nodes, not {nodes}"
    ledger.up()
    ranks = ("srun -N2 --ntasks-per-node=1 bash -c 'trap \"\" TERM; echo rank=$$;"
             " echo $$ > rank-$SLURM_NODEID.pid; while :; do sleep 0.2; done'")  # fmt: skip
    ledger.submit("alice", 8, ranks, "--grace", grace)
    work = ledger.work
    ledger.wait("both ranks", lambda: all((work / f"rank-{i}.pid").is_file()
                and (work / f"rank-{i}.pid").read_text().strip() for i in (0, 1)), 180)  # fmt: skip
    return [int((work / f"rank-{i}.pid").read_text()) for i in (0, 1)]


@pytest.mark.parametrize(("code", "outcome"), [(0, "completed"), (3, "failed")])
def test_a_gangs_own_exit_before_a_preempt_is_its_outcome_and_its_leftovers_hold_both_nodes(
    ledger: Ledger, code: int, outcome: str
) -> None:
    """The command leaves a SIGTERM-ignoring child on the batch node and a step on the other,
    then exits `code`; a preempt comes while the batch script reaps: its own exit is its outcome
    (as on one node, atk53-23 F3), it never runs again, and the next job of both nodes' GPUs
    starts only once the leftovers on both nodes are gone (the step's `srun` cancels it at the
    reaping's SIGTERM; the batch node's child lives to the grace's SIGKILL)."""
    nodes = ledger.cluster.nodes
    assert len(nodes) == 2, f"the gang tests need a cluster of two nodes, not {nodes}"
    ledger.up()
    work = ledger.work
    kid = (f"echo ran >> runs-1; {SECOND} ( trap '' TERM; while :; do sleep 0.2; done ) &"
           f" echo kid=$!; until [ -e go ]; do sleep 0.2; done; exit {code}")  # fmt: skip
    ledger.submit("alice", 8, kid, "--resumable", "--min-runtime", "0", "--grace", f"{GRACE_S}s")
    ledger.wait("both leftovers", lambda: len(pids(ledger.log_of(1), "kid")) == 1
                and len(pids(ledger.log_of(1), "kid2")) == 1, timeout=180)  # fmt: skip
    kids = [*pids(ledger.log_of(1), "kid"), *pids(ledger.log_of(1), "kid2")]
    try:
        assert all(alive(k) for k in kids), (kids, ledger.log_of(1))
        assert sorted(_node_of(ledger, k) for k in kids) == sorted(nodes), kids  # one on each
        assert sorted(sl["node"] for sl in ledger.jobs()[1]["slots"]) == sorted(nodes)  # a gang
        assert _slurm_state(ledger, 1) == "RUNNING" and _slurm_nodes(ledger, 1) == sorted(nodes)
        (work / "go").touch()  # the command exits
        ledger.wait("job 1's command to end", lambda: "its command exited"
                    in str(_row(ledger, 1).get("reason", "")), timeout=120)  # fmt: skip
        kill_at = float(_row(ledger, 1)["kill_at"])
        assert alive(kids[0]), "the batch node's child was gone already"
        ledger.cli("preempt", "1", "--reason", "the test makes room")
        (preempted,) = ledger.of("job.preempted.v1", 1)
        # the case under test: the preempt reached the ledger while the batch script reaped
        assert preempted["at"] < kill_at and alive(kids[0]), (preempted, kill_at)
        ledger.submit("bob", 8, "echo started; sleep 600")  # both nodes' GPUs, all of them
        gone = _next_waits(ledger, kids, timeout=GRACE_S + 120)
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
    finally:
        _kill(ledger, kids)
    got = ledger.jobs()[1]
    assert (got["outcome"], got["finish_reason"], got["exit_code"]) == (outcome, outcome, code), got
    ledger.wait("job 2 running", lambda: ledger.jobs()[2]["status"] == "running", 120)
    started = ledger.jobs()[2]
    assert sorted(sl["node"] for sl in started["slots"]) == sorted(nodes), started
    assert started["started_at"] >= gone - 1.0, (started, gone)  # Slurm's whole seconds
    assert _slurm_nodes(ledger, 2) == sorted(nodes)
    ledger.wait("job 1's Slurm job gone", lambda: _slurm_state(ledger, 1) == "", 30)
    assert (work / "runs-1").read_text().split() == ["ran"]  # never run again
    assert len(ledger.of("job.engine_linked.v1", 1)) == 1


def test_a_preempted_gang_is_stopped_on_both_nodes_before_the_next_job_starts(
    ledger: Ledger,
) -> None:
    """A gang's ranks (`srun` over both nodes, each ignoring SIGTERM) run when it is preempted:
    SIGTERM, the job's grace, its batch step killed, then Slurm ends the step on both nodes.
    Both ranks die, the job ends `preempted`, and the next job of both nodes' GPUs starts after
    the last one died, in Slurm and in the ledger. The run's recorded end (and the job's, and its
    charge) is its last rank's death, not the batch step's `EndTime` (s56: a rank was seen alive
    5.4 s after the recorded end at load 59)."""
    nodes = ledger.cluster.nodes
    kids = _two_ranks(ledger)
    try:
        assert sorted(_node_of(ledger, k) for k in kids) == sorted(nodes), kids
        assert _slurm_state(ledger, 1) == "RUNNING" and _slurm_nodes(ledger, 1) == sorted(nodes)
        ledger.wait("job 1 running", lambda: ledger.jobs()[1]["status"] == "running", 60)
        ledger.cli("preempt", "1", "--reason", "the test makes room")
        ledger.submit("bob", 8, "echo started; sleep 600")
        gone = _next_waits(ledger, kids)
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
    finally:
        _kill(ledger, kids)
    got = ledger.jobs()[1]
    assert got["finish_reason"] == "preempted", got
    (end,) = ledger.of("job.run_ended.v2", 1)
    # not before its last rank's death (Slurm's whole seconds), as the job's end
    assert end["ended_at"] >= gone - 1.0, (end, gone, ledger.service_log()[-3000:])
    # the job's end is its run's, within Slurm's whole second: the read that found the gang
    # ended is cut down to a whole second (the next job's StartTime is one), which may fall
    # before the preemption's own record (0.28 s at load ~14: 961.0 for 961.28)
    assert abs(got["finished_at"] - end["ended_at"]) < 1.0, (got, end)
    ledger.wait("job 2 running", lambda: ledger.jobs()[2]["status"] == "running", 120)
    started = ledger.jobs()[2]
    assert started["started_at"] >= gone - 1.0, (started, gone)
    assert _slurm_nodes(ledger, 2) == sorted(nodes)


def test_a_killed_gang_that_ends_while_the_service_is_down_ends_by_slurms_end_not_the_restart(
    ledger: Ledger,
) -> None:
    """atk59 F4: the service killed -9 once Slurm showed a preempted gang COMPLETING (after the
    grace's SIGKILL), back 20 s after its last rank died: the run was recorded ended at the
    restart's read (62.4 s late after a 60 s outage) and, the SIGKILL forgotten, `killed:
    false`, "Slurm: FAILED". Its end is now Slurm's end of the job (at most KillWait and a kill's
    landing after the batch step's), never before its last rank's death, and it was killed."""
    kids = _two_ranks(ledger)
    try:
        ledger.wait("job 1 running", lambda: ledger.jobs()[1]["status"] == "running", 60)
        seen, gone = _last_alive(kids)
        ledger.cli("preempt", "1", "--reason", "the test makes room")
        ledger.wait("the gang COMPLETING", lambda: _slurm_state(ledger, 1) == "COMPLETING"
                    or gone.is_set(), 60)  # fmt: skip
        ledger.kill9()
        assert gone.wait(120), f"{kids} outlived Slurm's end of the job"
        time.sleep(20)  # the service is down 20 s past the last rank's death
        back = time.time()
        ledger.up()
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
    finally:
        _kill(ledger, kids)
    last = max(seen.values())
    (end,) = ledger.of("job.run_ended.v2", 1)
    assert end["ended_at"] >= last - 1.0, (end, last)  # never before its last rank's death
    said = ledger.service_log()[-4000:]
    assert end["ended_at"] < back - 10, (end, last, back, said)  # not the restart's read
    assert end["killed"] and "killed after its grace" in end["note"], (end, said)


def test_a_gang_its_batch_script_killed_while_the_service_was_down_is_recorded_killed(
    ledger: Ledger,
) -> None:
    """atk59b N3: the service killed -9 just after a preempted gang's SIGTERM (its ranks ignore
    it), before the grace's SIGKILL; the batch script's own end SIGKILLed the command after the
    grace (grace + KillWait + 1 s), Slurm's end of the job the ranks, and the restart, 20 s
    after the last death, recorded `killed: false`, "Slurm: FAILED". The script's end record
    now says it killed (the executor's own SIGKILL is kept as `stops/<id>.killed`): killed,
    at Slurm's end of the job, never before the last rank's death nor at the restart."""
    _preempted_and_killed_while_down(ledger, _two_ranks(ledger, "6s"))
    assert ledger.jobs()[1]["finish_reason"] == "preempted", ledger.jobs()[1]


def _preempted_and_killed_while_down(ledger: Ledger, kids: list[int]) -> None:
    """Job 1 (its processes `kids` ignore SIGTERM) preempted, the service killed -9 after the
    stop's SIGTERM and before its SIGKILL, kept down past Slurm's end of the job (KillWait and
    a kill's landing after the batch script's end: 16 s) and 10 s more, then up: its run is
    recorded killed, never before the last of `kids` died nor at the restart's read."""
    run_dir = ledger.home / "jobs" / "checkpoints" / "1.0"
    try:
        ledger.wait("job 1 running", lambda: ledger.jobs()[1]["status"] == "running", 60)
        seen, gone = _last_alive(kids)
        ledger.cli("preempt", "1", "--reason", "the test makes room")
        ledger.wait("the stop's SIGTERM", lambda: (run_dir / "signalled").exists(), 60)
        ledger.kill9()
        killed = list((ledger.home / "jobs" / "stops").glob("*.killed"))
        assert killed == [], f"the executor's SIGKILL came first: not the case under test {killed}"
        assert gone.wait(120), f"{kids} outlived Slurm's end of the job"
        time.sleep(30)
        back = time.time()
        ledger.up()
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
    finally:
        _kill(ledger, kids)
    last = max(seen.values())
    (end,) = ledger.of("job.run_ended.v2", 1)
    said = ledger.service_log()[-4000:]
    assert end["killed"] and "killed after its grace" in end["note"], (end["note"], said)
    assert end["ended_at"] >= last - 1.0, (end["ended_at"], last)  # not before the last death
    assert end["ended_at"] < back - 10, (end["ended_at"], last, back)  # not the restart's read


def test_a_one_node_run_with_a_step_its_script_killed_while_down_ends_with_its_step(
    ledger: Ledger,
) -> None:
    """atk60-slurm F2: as above on one node, the command's rank in a step (`srun`): the batch
    script's own end SIGKILLed what its step held, but the rank, in a step of its own, died only
    by Slurm's end of the job (KillWait later), and the run was recorded ending at the script's
    record, ~10 s before it. It now ends as a gang's, never before the rank's death."""
    ledger.up()
    # the rank (as atk60-slurm's: a python task ignoring TERM, HUP and INT) in the background
    rank = ("trap '' TERM; srun -N1 -n1 /usr/bin/python3 -c 'import os, signal, time;"
            " [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGHUP,"
            " signal.SIGINT)]; open(\"rank-0.pid\", \"w\").write(str(os.getpid()));"
            " time.sleep(100000)' & while :; do sleep 0.2; done")  # fmt: skip
    ledger.submit("alice", 1, rank, "--grace", "6s")
    pid_file = ledger.work / "rank-0.pid"
    ledger.wait("the rank", lambda: pid_file.is_file() and pid_file.read_text().strip() != "", 180)
    _preempted_and_killed_while_down(ledger, [int(pid_file.read_text())])  # before: ~10 s early


def test_slurm_down_stops_both_slurmd_of_a_two_node_cluster_even_without_its_record_of_one(
    tmp_path: Path,
) -> None:
    """`scripts/slurm/slurm down` stops every daemon of its data dir: by the pids `up` recorded
    and by Slurm's own pid files (`SlurmdPidFile`, one per node), so a slurmd whose recorded pid
    is lost (here: overwritten) is stopped all the same, and `down` fails, naming it, when one
    outlives its TERM and KILL. (Before: it stopped only the recorded pids and said "stopped"
    with node 2's slurmd still running; scripts/test's clean-up threw `down`'s output away.)"""
    node = f"{socket.gethostname().split('.')[0]}-gdown"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULEDGER_SLURM", "SLURM"))}
    env |= {"GPULEDGER_SLURM_DATA": str(tmp_path / "slurm"), "GPULEDGER_SLURM_NODE": node}
    for _ in range(3):  # a free port may be taken by another process before Slurm binds it
        ctld, first, second = free_port(), free_port(), free_port()
        env |= {"GPULEDGER_SLURMCTLD_PORT": str(ctld), "GPULEDGER_SLURMD_PORT": str(first),
                "GPULEDGER_SLURMD_PORTS": str(second)}  # fmt: skip
        two = env | {"GPULEDGER_SLURM_NODES": "2"}  # (`down` reads it from the config)
        up = subprocess.run([str(base.SLURM_SCRIPT), "up"], env=two, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
        if up.returncode == 0 or "Address already in use" not in up.stderr:
            break
        subprocess.run([str(base.SLURM_SCRIPT), "down"], env=env, capture_output=True, timeout=120)
    data = tmp_path / "slurm"
    names = ("slurmd", "slurmd-2", "slurmctld", "munged")
    daemons = {
        d: int((data / f"{d}.pid").read_text()) for d in names if (data / f"{d}.pid").is_file()
    }
    try:
        assert up.returncode == 0, up.stderr
        assert sorted(daemons) == ["munged", "slurmctld", "slurmd", "slurmd-2"] and all(
            alive(p) for p in daemons.values()), daemons  # fmt: skip
        (data / "slurmd-2.pid").write_text("999999999\n")  # node 2's recorded pid lost
        down = subprocess.run([str(base.SLURM_SCRIPT), "down"], env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        left = {d: p for d, p in daemons.items() if alive(p)}
        assert left == {} and down.returncode == 0, (left, down.stderr)
    finally:
        _kill_daemons(data, list(daemons.values()))


NOTED = r"""import os, signal, subprocess, sys, time
role, notes = sys.argv[1], sys.argv[2]
def note(what):
    with open(notes, "a") as f:
        node = os.environ.get("SLURM_NODEID", "")
        f.write(f"{time.time():.6f} {role}{node} {os.getpid()} {what}\n")
def seen(sig, _):
    note(signal.Signals(sig).name)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, seen)
note("start")
if role == "rank":
    subprocess.Popen([sys.executable, __file__, "child", notes])
while True:
    time.sleep(0.1)
"""
"""A rank (and, `child`, a child of one): notes its start and every signal it sees, ignoring
them, in one file of the run's (`<time> <role><node id> <pid> <what>`); a rank starts a child."""


def _notes(path: Path) -> dict[tuple[str, int], list[tuple[float, str]]]:
    """The ranks' notes: (role and node id, pid) -> [(time, what)]."""
    out: dict[tuple[str, int], list[tuple[float, str]]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        at, who, pid, what = line.split()
        out.setdefault((who, int(pid)), []).append((float(at), what))
    return out


@pytest.mark.parametrize("stop", ["limit", "preempt", "scancel"])
def test_a_gangs_ranks_and_their_children_on_both_nodes_get_the_sigterm_and_the_grace(
    ledger: Ledger, stop: str
) -> None:
    """atk58 F1: the executor's stop was `scancel --signal=TERM --full`, which signals `srun`
    too, and srun answers a SIGTERM by SIGKILLing its step's tasks at once: a gang's ranks on
    every node died at the stop's SIGTERM, none seeing it (their children neither: Slurm gives a
    step's other processes only its SIGKILL). A two-node gang whose ranks and a child of each
    note every signal, stopped at its limit and by a preemption: every one saw the SIGTERM and
    lived the grace after it (from /proc, this host's clock), then the job ended. A plain
    `scancel` of the job (its owner's, Slurm's own termination, as its TIMEOUT): the same, its
    grace Slurm's KillWait (atk59 F5: the child on node 2 got only SIGKILL, the batch script's
    pass step refused once Slurm revoked the job's credential)."""
    nodes = ledger.cluster.nodes
    assert len(nodes) == 2, f"the gang tests need a cluster of two nodes, not {nodes}"
    grace, limit = 8.0, 30.0
    ledger.up()
    work = ledger.work
    (work / "noted.py").write_text(NOTED)
    notes = work / "notes"
    gang = (f"trap 'echo \"$(date +%s.%N) leader $$ TERM\" >> {notes}' TERM;"
            f" srun -N2 --ntasks-per-node=1 /usr/bin/python3 {work}/noted.py rank {notes} &"
            " while :; do sleep 0.2; done")  # fmt: skip
    opts = ("-t", f"{limit:.0f}s") if stop == "limit" else ()
    ledger.submit("alice", 8, gang, "--grace", f"{grace:.0f}s", *opts)
    started = lambda: sum(w == "start" for said in _notes(notes).values() for _, w in said)  # noqa: E731
    ledger.wait("both ranks and their children", lambda: started() == 4, 180)
    kids = [pid for _, pid in _notes(notes)]
    try:
        assert sorted(_node_of(ledger, k) for k in kids) == sorted(nodes * 2), kids
        ledger.wait("job 1 running", lambda: ledger.jobs()[1]["status"] == "running", 60)
        if stop == "preempt":
            ledger.cli("preempt", "1", "--reason", "the test makes room")
        elif stop == "scancel":
            slurm_id = ledger.cluster.run("squeue", "-h", "-n", "gpuledger-1", "-o", "%i").strip()
            ledger.cluster.run("scancel", slurm_id)
        else:  # the ranks run before the limit (else the case is not under test)
            assert time.time() < ledger.jobs()[1]["started_at"] + limit, ledger.jobs()[1]
        seen, done = _last_alive(kids)
        assert done.wait(limit + grace + 120), (kids, _notes(notes))
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
    finally:
        _kill(ledger, kids)
    got = ledger.jobs()[1]
    want = {"limit": "time_limit", "preempt": "preempted", "scancel": "cancelled"}[stop]
    assert got["finish_reason"] == want, got
    noted = _notes(notes)
    assert [who for who, _ in noted if who == "leader"], noted  # the batch step's command too
    assert len([k for k in noted if k[0] != "leader"]) == 4, noted
    for (who, pid), said in noted.items():
        terms = [at for at, what in said if what in ("SIGTERM", "TERM")]
        assert terms, (who, pid, said, noted)  # before: none (SIGKILLed by their srun)
        if who != "leader":  # the grace from its SIGTERM (a late limit's: min(grace, 10 s))
            assert seen[pid] >= terms[0] + min(grace, 10.0) - 0.2, (who, pid, seen[pid], said)


def test_a_gangs_timeout_while_the_service_is_down_is_recorded_killed_and_run_once(
    ledger: Ledger,
) -> None:
    """atk60-slurm F3: a gang (`-t 40s --grace 8s`, its ranks and their children on both
    nodes noting every signal and ignoring it) whose service is killed -9 while it runs, so
    Slurm's backstop TIMEOUT ends it (SIGTERM to every process, SIGKILL `KillWait` later), back
    once Slurm no longer lists it: its end was recorded `time_limit` with `killed` null
    (`job.engine_ended.v1` had none). Now `killed` says what the processes' notes show (each
    got the SIGTERM and lived `KillWait` past it: killed), its end is not before the last
    death, and nothing ran twice (one Slurm job, each process started once)."""
    nodes = ledger.cluster.nodes
    assert len(nodes) == 2, f"the gang tests need a cluster of two nodes, not {nodes}"
    limit, kill_wait = 40.0, 10.0  # the kit's KillWait
    ledger.up()
    work = ledger.work
    (work / "noted.py").write_text(NOTED)
    notes = work / "notes"
    gang = (f"trap 'echo \"$(date +%s.%N) leader $$ TERM\" >> {notes}' TERM;"
            f" srun -N2 --ntasks-per-node=1 /usr/bin/python3 {work}/noted.py rank {notes} &"
            " while :; do sleep 0.2; done")  # fmt: skip
    ledger.submit("alice", 8, gang, "--grace", "8s", "-t", f"{limit:.0f}s")
    started = lambda: sum(w == "start" for said in _notes(notes).values() for _, w in said)  # noqa: E731
    ledger.wait("both ranks and their children", lambda: started() == 4, 180)
    kids = [pid for who, pid in _notes(notes) if who != "leader"]
    try:
        ledger.wait("job 1 running", lambda: ledger.jobs()[1]["status"] == "running", 60)
        began = ledger.jobs()[1]["started_at"]
        ledger.kill9()  # before its limit: the executor stops nothing, Slurm's backstop ends it
        assert time.time() < began + limit, "the limit came first: not the case under test"
        seen, done = _last_alive(kids)
        assert done.wait(300), (kids, _notes(notes))  # backstop: 2 min, checked every ~30 s
        deadline = time.monotonic() + 120
        while _slurm_state(ledger, 1) != "":  # ended in Slurm (no longer COMPLETING)
            assert time.monotonic() < deadline, _slurm_state(ledger, 1)
            time.sleep(0.5)
        ledger.up()
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
    finally:
        _kill(ledger, kids)
    got = ledger.jobs()[1]
    said = ledger.service_log()[-4000:]
    assert got["finish_reason"] == "time_limit", (got, said)
    noted = _notes(notes)
    assert len([k for k in noted if k[0] != "leader"]) == 4, noted
    outlived = []
    for (who, pid), lines in noted.items():
        if who == "leader":
            continue
        terms = [at for at, what in lines if what == "SIGTERM"]
        assert terms, (who, pid, lines)  # Slurm's TERM reached every rank and child
        outlived.append(seen[pid] >= terms[0] + kill_wait - 1.0)  # alive until Slurm's KILL
    assert all(outlived), (outlived, noted, seen)  # what the processes show: killed
    (end,) = ledger.of("job.engine_ended.v2", 1)
    assert end["killed"] is True, (end, said)  # before: no `killed` (null)
    assert end["ended_at"] >= max(seen.values()) - 1.0, (end, seen)  # not before the last death
    # nothing ran twice: one placement, one Slurm job, each process started once
    assert (
        len(ledger.of("job.placed.v1", 1)) == 1 and len(ledger.of("job.engine_linked.v1", 1)) == 1
    )
    assert sum(w == "start" for lines in noted.values() for _, w in lines) == 4, noted


# --- atk59 F1, F3: a gang whose nodes get different GPUs (6 on 4-GPU nodes: 4 + 2) ---


def test_a_gang_whose_nodes_get_different_gpus_is_refused_with_why_under_sched_builtin(
    ledger: Ledger,
) -> None:
    """Such a gang is one heterogeneous Slurm job, which sched/builtin (the kit's) refuses at
    every sbatch: the job ends `launch_failed` at once, its note (`jobs`, `explain`) saying
    why, its command never run, and every GPU free again for a gang of whole nodes. Before, it
    stayed `placed` for good, its 6 GPUs held, sbatch failing at every cycle (atk59 F1)."""
    assert len(ledger.cluster.nodes) == 2, ledger.cluster.nodes
    ledger.up()
    ledger.submit("alice", 6, "echo ran >> runs-1")
    ledger.wait("job 1 refused", lambda: ledger.jobs()[1]["status"] == "finished", 60)
    got = ledger.jobs()[1]
    assert got["finish_reason"] == "launch_failed", got
    assert "does not run heterogeneous jobs (SchedulerType=sched/builtin" in got["finish_note"]
    assert "SchedulerType=sched/builtin" in ledger.cli("explain", "1")
    assert "SchedulerType=sched/builtin runs no heterogeneous job" in ledger.cli("status")
    ledger.submit("alice", 8, "echo ran >> runs-2")  # both nodes' every GPU
    ledger.wait("job 2 finished", lambda: ledger.jobs()[2]["status"] == "finished", 120)
    assert ledger.jobs()[2]["outcome"] == "completed", ledger.jobs()[2]
    assert not (ledger.work / "runs-1").exists()
    assert (ledger.work / "runs-2").read_text().split() == ["ran"]


def _scheduler(cluster: base.Cluster, scheduler: str = "") -> None:
    """The cluster's slurmctld started again with `SchedulerType=scheduler` (""): the kit's)."""
    pid = cluster.daemon_pid("slurmctld")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while cluster.running("slurmctld"):
        assert time.monotonic() < deadline, "slurmctld did not stop"
        time.sleep(0.2)
    cluster.up(**({"GPULEDGER_SLURM_SCHEDULER": scheduler} if scheduler else {}))
    said = cluster.run("scontrol", "show", "config")
    assert f"sched/{scheduler.split('/')[-1] or 'builtin'}" in said


def test_a_heterogeneous_gang_under_sched_backfill_runs_once_and_its_components_are_one_run(
    ledger: Ledger,
) -> None:
    """Under sched/backfill the gang runs as a heterogeneous job; its second component (the
    first's id + 1, the same name and comment) is part of the run: never cancelled as "a second
    copy" (atk59 F3: scancelled at every read, two kills accepted), its rank on the second node
    runs to its end, the GPUs Slurm gave are read from both components, and the job completes
    once."""
    nodes = ledger.cluster.nodes
    assert len(nodes) == 2, nodes
    _scheduler(ledger.cluster, "sched/backfill")
    try:
        ledger.up()
        rank = ("echo ran >> runs-1; srun --het-group=1 -n1 bash -c"
                " 'sleep 6; echo rank2=$SLURMD_NODENAME >> ranks-1'")  # fmt: skip
        ledger.submit("alice", 6, rank)
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
        got = ledger.jobs()[1]
        log = ledger.service_log()
        assert "second copy" not in log, log[-3000:]  # before: its second component, cancelled
        assert "Slurm gave GPUs" not in log, log[-3000:]  # before: component 0's alone
        assert (got["outcome"], got["exit_code"]) == ("completed", 0), got
        assert sorted((sl["node"], len(sl["gpu_indices"])) for sl in got["slots"]) == sorted(
            zip(nodes, (4, 2), strict=True)
        )
        assert (ledger.work / "runs-1").read_text().split() == ["ran"]
        assert (ledger.work / "ranks-1").read_text().split() == [f"rank2={nodes[1]}"]
    finally:
        ledger.stop()
        _scheduler(ledger.cluster)


def test_a_heterogeneous_gangs_ranks_and_their_children_on_both_nodes_get_the_sigterm(
    ledger: Ledger,
) -> None:
    """Under sched/backfill, a preempted gang of 4 + 2 GPUs (a heterogeneous job) whose ranks
    (`srun --het-group=0,1`) and a child of each note every signal: each one sees the SIGTERM
    and lives the grace after it. atk59 F3: the child on the second node got none, the batch
    script's pass to other nodes reading `SLURM_JOB_NUM_NODES` (1, its own component's)."""
    nodes = ledger.cluster.nodes
    assert len(nodes) == 2, nodes
    grace = 8.0
    _scheduler(ledger.cluster, "sched/backfill")
    kids: list[int] = []
    try:
        ledger.up()
        work = ledger.work
        (work / "noted.py").write_text(NOTED)
        notes = work / "notes"
        gang = (f"trap 'echo \"$(date +%s.%N) leader $$ TERM\" >> {notes}' TERM;"
                " srun --het-group=0,1 --ntasks-per-node=1 /usr/bin/python3"
                f" {work}/noted.py rank {notes} & while :; do sleep 0.2; done")  # fmt: skip
        ledger.submit("alice", 6, gang, "--grace", f"{grace:.0f}s")
        started = lambda: sum(w == "start" for said in _notes(notes).values() for _, w in said)  # noqa: E731
        ledger.wait("both ranks and their children", lambda: started() == 4, 180)
        kids = [pid for _, pid in _notes(notes)]
        assert sorted(_node_of(ledger, k) for k in kids) == sorted(nodes * 2), kids
        ledger.wait("job 1 running", lambda: ledger.jobs()[1]["status"] == "running", 60)
        ledger.cli("preempt", "1", "--reason", "the test makes room")
        seen, done = _last_alive(kids)
        assert done.wait(grace + 120), (kids, _notes(notes))
        ledger.wait("job 1 finished", lambda: ledger.jobs()[1]["status"] == "finished", 120)
        got = ledger.jobs()[1]
        assert got["finish_reason"] == "preempted", got
        noted = _notes(notes)
        assert len([k for k in noted if k[0] != "leader"]) == 4, noted
        for (who, pid), said in noted.items():
            terms = [at for at, what in said if what in ("SIGTERM", "TERM")]
            assert terms, (who, pid, said, noted)  # before: none for the second node's child
            if who != "leader":
                assert seen[pid] >= terms[0] + grace - 0.2, (who, pid, seen[pid], said)
        assert "second copy" not in ledger.service_log()
    finally:
        _kill(ledger, kids)
        ledger.stop()
        _scheduler(ledger.cluster)
