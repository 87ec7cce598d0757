"""The kill matrix on Slurm, with real jobs that fork children on the fake GPUs: a slurmd outage
(kill -9, restarted once Slurm has given the node up past SlurmdTimeout and the ledger has
recorded it lost), a 40 s slurmctld outage (kill -9, restarted after 40 s: past SlurmdTimeout and
SlurmctldTimeout, and past the end of every run it left running), and `scontrol update
state=down` then `state=resume` within 2 s. The same checker as the node agents' matrix
(`jobwatch`: the jobs' own logs and /proc) finds 0 GPU-seconds double-booked, 0 jobs alive in
two launches, 0 completed jobs run again, and `audit check` agrees.

The suite runs one round; `scripts/kill_matrix` runs $GPULEDGER_KILL_ROUNDS (3)."""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from typing import Any

import pytest

from tests.integration.jobwatch import ProcSampler, Verdict, job_script
from tests.integration.test_slurm import (  # noqa: F401 (fixtures)
    Ledger,
    cluster,
    ledger,
    slurm,
)

ROUNDS = int(os.environ.get("GPULEDGER_KILL_ROUNDS", "1"))
SLURMD_TIMEOUT_S = 30
"""scripts/slurm/slurm's SlurmdTimeout (and SlurmctldTimeout)."""
OUTAGE_S = SLURMD_TIMEOUT_S + 10
"""The slurmctld outage: past both timeouts, and past the end of the runs it leaves running (each
ran 8 s or more of its 20-40 s before the kill), so some end while it is away (F9)."""
HELD_DOWN_S = 5.0
"""How long slurmd stays away once the ledger recorded its node lost (the jobs Slurm failed with
the node are read meanwhile)."""


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_slurm_outages_and_a_down_node_double_book_nothing_and_run_nothing_twice(
    ledger: Ledger,  # noqa: F811
    round_: int,
) -> None:
    c = ledger.cluster
    rng = random.Random(2400 + round_)
    seen = ledger.home.parent / "seen"
    seen.mkdir()
    seen.chmod(0o777)  # jobs of other users run as nobody
    marker = f"GPULEDGER_KM={uuid.uuid4().hex}"
    names = ("GPULEDGER_JOB_ID", "GPULEDGER_RUN", "SLURMD_NODENAME")
    sampler = ProcSampler(marker, names, gpus="SLURM_JOB_GPUS")  # ConstrainDevices
    sampler.start()
    ids: list[int] = []

    def batch(n: int) -> None:
        """n jobs of 1 or 2 GPUs, 20-40 s, half of them resumable."""
        for _ in range(n):
            secs = rng.uniform(20, 40)
            opts = ("--resumable",) if rng.random() < 0.5 else ()
            script = job_script(seen, secs, "$SLURMD_NODENAME", "$GPULEDGER_RUN", marker,
                                gpus="SLURM_JOB_GPUS")  # fmt: skip
            ledger.submit(rng.choice(("alice", "bob")), rng.choice((1, 1, 2)), script, *opts)
            ids.append(len(ids) + 1)

    def running() -> list[int]:
        return [j for j, x in ledger.jobs().items() if x["status"] == "running"]

    def slurm_says_down() -> bool:
        out = c.run("sinfo", "-h", "-N", "-p", c.partition, "-o", "%T", check=False)
        return any(w.rstrip("*~#!%$@^-").lower() == "down" for w in out.split())

    def node_state() -> str:
        (n,) = ledger.nodes()
        return str(n["state"])

    times: dict[str, float] = {}
    ledger.up()
    # 1. a slurmd outage: Slurm gives the node up after SlurmdTimeout (30 s) while the jobs'
    #    processes live on under slurmstepd, and the ledger records it lost; slurmd comes back
    #    (it used to be a fixed 60 s: Slurm gave up at ~35-45 s) and the node returns
    batch(4)
    ledger.wait("jobs to run", lambda: len(running()) >= 2, timeout=120)
    os.kill(c.daemon_pid("slurmd"), signal.SIGKILL)
    killed = time.monotonic()
    ledger.wait("Slurm to give the node up", lambda: slurm_says_down() and
                node_state() == "lost", timeout=180)  # fmt: skip
    assert time.monotonic() - killed >= SLURMD_TIMEOUT_S - 1, "down before SlurmdTimeout?"
    times["slurmd kill to node lost"] = time.monotonic() - killed
    time.sleep(HELD_DOWN_S)
    c.up()
    ledger.wait("the node to be active", lambda: node_state() == "active", timeout=180)
    # 2. a 40 s slurmctld outage (it saves its state a few seconds after a change: killed
    #    sooner, it comes back without the newest runs)
    batch(4)
    ledger.wait("jobs to run", lambda: len(running()) >= 2, timeout=180)
    time.sleep(8)
    os.kill(c.daemon_pid("slurmctld"), signal.SIGKILL)
    time.sleep(OUTAGE_S)
    c.up()
    ledger.wait("the outage to end", lambda: "outage" not in ledger.cli("status"), timeout=180)
    # 3. the node set DOWN, then resumed within 2 s
    batch(4)
    ledger.wait("jobs to run", lambda: len(running()) >= 2, timeout=180)
    down_at = time.time()
    c.run("scontrol", "update", f"nodename={c.node}", "state=down", "reason=matrix")
    time.sleep(1)
    c.run("scontrol", "update", f"nodename={c.node}", "state=resume")
    resumed_at = time.time()
    ledger.wait(
        "every job to end",
        lambda: all(x["status"] == "finished" for x in ledger.jobs().values()),
        timeout=600,
    )
    time.sleep(1)
    proc_side = sampler.finish()
    events = ledger.events()
    after = [ev for ev in events if ev["at"] >= down_at]
    ended = next((ev["at"] for ev in after if ev["type"] in ("job.preempted.v1", "job.finished.v2")
                  and ev.get("reason") in ("node_failure", "node_lost")), None)  # fmt: skip
    if ended is not None:
        times["down to requeued"] = ended - down_at
    back = next((ev["at"] for ev in after if ev["type"] == "node.returned.v1"), None)
    if back is not None:
        times["resume to returned"] = back - resumed_at
    # the runs the down cut (seen alive then): when their last process was seen
    cut = [max(hi for _, hi in gpus.values()) for gpus in proc_side.values()
           if any(lo < down_at <= hi + 1 for lo, hi in gpus.values())]  # fmt: skip
    if cut:
        times["down to last process of its runs"] = max(cut) - down_at
    check = json.loads(ledger.cli("audit", "check", "--json"))
    verdict = Verdict.of(f"slurm round {round_ + 1}", seen, proc_side, len(ids))
    verdict.audit = f"{len(check['violations'])} violations"
    verdict.times = times
    verdict.record()
    print(verdict.line())
    jobs = ledger.jobs()
    assert verdict.clean, (verdict, verdict.detail(seen, proc_side), ledger.service_log()[-3000:])
    assert check["violations"] == [], check
    done = {int(f.stem) for f in seen.glob("*.done")}
    completed = {j for j, x in jobs.items() if x["outcome"] == "completed"}
    assert completed == done, (completed, done, _summary(jobs))
    assert verdict.launches >= len(done)
    # F9: a run that ended while slurmctld was away is charged to no later than its real end
    # (the job's own `done` line; Slurm's EndTime is whole seconds), not to the moment the
    # returning controller heard of it
    real = {int(f.stem): float(f.read_text().split()[0]) for f in seen.glob("*.done")}
    ends = {ev["job_id"]: ev.get("ended_at") or ev["at"] for ev in events
            if ev["type"] == "job.finished.v2" and ev["job_id"] in real}  # fmt: skip
    late = {j: round(at - real[j], 1) for j, at in ends.items() if at > real[j] + 1.5}
    assert late == {}, (late, _summary(jobs))
    assert [ev for ev in events if ev["type"] == "job.engine_ended.v2" and ev["reason"] == "lost"
            ] == []  # fmt: skip


def _summary(jobs: dict[int, dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    return {j: (x["outcome"], x["finish_reason"], x["exit_code"]) for j, x in jobs.items()}
