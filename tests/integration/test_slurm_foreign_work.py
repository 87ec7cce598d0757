"""Foreign work counts (issue 24): Slurm jobs that did not come through the ledger, on any
partition sharing its nodes, hold their GPUs in the ledger's view (`node list`, `queue`, the
dispatcher) while they run, while their allocation is not running yet (CONFIGURING: Slurm runs
its PrologSlurmctld, as it does while a node boots) and while a requeue releases it
(COMPLETING: its processes may live until KillWait); a pending job without an allocation holds
nothing. A real Slurm (scripts/slurm/slurm: a second partition on the node, and a controller
prolog that keeps a job named hold-configuring* CONFIGURING while a flag file exists)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.integration.test_slurm import (  # noqa: F401 (fixtures)
    SHOW,
    Ledger,
    cluster,
    cuda_devices,
    held_twice,
    ledger,
    slurm,
    status,
)


def test_foreign_jobs_on_any_partition_configuring_or_completing_hold_their_gpus(
    ledger: Ledger,  # noqa: F811
) -> None:
    c = ledger.cluster
    other = f"{c.partition}-shared"
    hold = Path(c.conf).parent / "hold-configuring"
    foreign: list[str] = []

    def sbatch(partition: str, name: str, script: str) -> str:
        job = c.run("sbatch", "--parsable", "-p", partition, "--gres=gpu:1", "-J", name,
                    "-o", "/dev/null", "--wrap", script).strip()  # fmt: skip
        foreign.append(job)
        return job

    def state(job: str) -> str:
        out = c.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T", check=False)
        return out.strip()

    def node() -> dict[str, Any]:
        (n,) = ledger.nodes()
        return dict(n)

    def until(what: str, pred: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert ledger.proc is not None and ledger.proc.poll() is None, ledger.service_log()
            assert time.monotonic() < deadline, (what, node(), c.jobs(), ledger.service_log())
            time.sleep(0.2)

    try:
        ledger.up()
        # 1. running on another partition of the node (its processes ignore SIGTERM, so a
        #    requeue leaves it COMPLETING until KillWait, 10 s)
        a = sbatch(other, "train", "trap '' TERM; sleep 300")
        until("the other partition's job to run", lambda: state(a) == "RUNNING")
        # 2. allocated, not running yet: CONFIGURING while the controller's prolog runs
        hold.touch()
        b = sbatch(c.partition, "hold-configuring", "sleep 300")
        until("the allocation to be CONFIGURING", lambda: state(b) == "CONFIGURING")
        until("both to count", lambda: node()["foreign_gpus"] == [0, 1])
        assert node()["free_gpus"] == 2
        ledger.submit("alice", 3, SHOW + "exit 0")
        time.sleep(2)
        assert status(ledger, 1) == "pending"
        (row,) = json.loads(ledger.cli("queue", "--json"))
        assert row["code"] == "WAIT_RESOURCES", row
        assert f"Held outside the ledger (counted busy): {c.node} GPUs 0,1" in ledger.cli("queue")
        # 3. a requeue releasing its allocation (COMPLETING) still holds GPU 0; once released
        #    the job is pending, held, with no allocation: it holds nothing
        c.run("scontrol", "requeuehold", a)
        until("the requeue to release", lambda: state(a) == "COMPLETING", timeout=5)
        seen = node()
        assert state(a) == "COMPLETING", c.jobs()  # still releasing when the node was read
        assert seen["foreign_gpus"] == [0, 1], seen
        assert ledger.of("job.placed.v1") == []
        until("the requeue to end", lambda: state(a) == "PENDING", timeout=30)
        # seen at the engine's next look (CI at load ~10 on the second cluster: 60 s ran out
        # as the service logged the release)
        until("the released GPU to be free", lambda: node()["foreign_gpus"] == [1], timeout=150)
        # 4. the 3-GPU job runs on the GPUs no foreign job holds
        ledger.wait("the 3-GPU job to end", lambda: status(ledger, 1) == "finished", timeout=90)
        assert cuda_devices(ledger.log_of(1)) == [0, 2, 3]
        assert state(b) == "CONFIGURING"  # never touched
        assert held_twice(ledger.events()) == []
    finally:
        hold.unlink(missing_ok=True)
        for job in foreign:
            c.run("scancel", job, check=False)
