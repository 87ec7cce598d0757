"""A run's marks are its user's to write, Slurm's word is not (atk43s): a run that claims
`wrong-gpus` is charged for what Slurm ran it and its job is not requeued without bound (F2);
a launch Slurm holds CONFIGURING is charged from its command's start, not the allocation (F1).
A real Slurm (scripts/slurm/slurm), real processes."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.test_slurm import (  # noqa: F401 (fixtures)
    Ledger,
    cluster,
    ledger,
    slurm,
    status,
)


def test_a_run_that_claims_wrong_gpus_is_charged_and_not_requeued_without_bound(
    ledger: Ledger,  # noqa: F811
) -> None:
    """F2: the job removes its `launched` mark, leaves `wrong-gpus` and exits 127 within 10 s,
    every run: each was recorded `node_failure` "never ran", requeued, never started, nothing
    charged, forever. Now every run is recorded started, and the job ends by its third run
    (`launch_failed`, 3 in a row; or, where a read saw the mark before its removal, `failed`
    127 at once)."""
    runs = ledger.work / "runs"
    ledger.up()
    ledger.submit("alice", 1, 'd=$(dirname "$GPULEDGER_CHECKPOINT_FILE"); rm -f "$d/launched"; '
                  f'echo run $GPULEDGER_RUN >> {runs}; sleep 3; : > "$d/wrong-gpus"; exit 127',
                  "--resumable")  # fmt: skip
    ledger.wait("the job to end", lambda: status(ledger, 1) == "finished", timeout=180)
    job = ledger.jobs()[1]
    placed = len(ledger.of("job.placed.v1", 1))
    assert len(runs.read_text().splitlines()) == placed <= 3, (runs.read_text(), job)
    assert len(ledger.of("job.started.v1", 1)) == placed, ledger.of("job.started.v1", 1)
    if job["finish_reason"] == "launch_failed":
        assert placed == 3, job
        assert job["finish_note"].endswith("3 runs in a row: not placed again"), job
    else:  # a read saw its `launched` mark: its command ran, as Slurm says
        assert (job["finish_reason"], job["exit_code"]) == ("failed", 127), job
    time.sleep(2)
    assert len(ledger.of("job.placed.v1", 1)) == placed  # never placed again


def test_a_launch_held_configuring_is_charged_from_its_commands_start(
    ledger: Ledger,  # noqa: F811
) -> None:
    """F1: the cluster's prolog holds the launch CONFIGURING (`hold-launches`) 6 s; Slurm's
    StartTime stays the allocation. The recorded start is the command's, not the allocation."""
    hold = Path(ledger.cluster.conf).parent / "hold-launches"
    began = ledger.work / "began"
    hold.touch()
    try:
        ledger.up()
        ledger.submit("alice", 1, f"date +%s.%N > {began}; sleep 2")

        def configuring() -> bool:
            return any("job=1:" in j["comment"] and j["state"] == "CONFIGURING"
                       for j in ledger.cluster.jobs().values())  # fmt: skip

        ledger.wait("Slurm to hold the launch", configuring)
        time.sleep(6)
        assert status(ledger, 1) == "placed"  # not started while held (nor after 10 s)
        released = time.time()
    finally:
        hold.unlink(missing_ok=True)
    ledger.wait("the job to end", lambda: status(ledger, 1) == "finished", timeout=120)
    job = ledger.jobs()[1]
    assert job["outcome"] == "completed", job
    command = float(began.read_text())
    assert released - 1 <= job["started_at"] <= command + 1.5, (released, command, job)
