"""atk45s F2: the ledger stops a run, it ends in its grace (its own end record written), then
slurmctld is killed -9 and comes back with its state rewound: it lists the ended run RUNNING, so
the executor's `scancel` comes once the grace has passed and Slurm ends it CANCELLED at that
kill. The old executor recorded that: 15-23 s late, exit 0, "killed after its grace". The run
ended as its own end record says: its time, its code (`stops.stopped_end`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ledger.engines.slurm import SlurmExecutor, parse_jobs
from ledger.engines.slurm.ends import OwnEnd
from ledger.engines.slurm.stops import Stopping, stopped_end
from ledger.engines.slurm.words import SlurmJob

LID = "0123abcd4567"
START = float(int(time.time()) - 120)


def at(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(START + seconds))


def slurm(state: str, end: float | None = None, code: str = "0:0") -> str:
    ends = "Unknown" if end is None else at(end)
    return (
        f"JobId=7 JobName=gpuledger-1 UserId=bob(1001) JobState={state} Reason=None"
        f" ExitCode={code} StartTime={at(0)} EndTime={ends} Partition=gpuledger NodeList=vm"
        f" Comment=gpuledger:{LID}:job=1:run=0 StdOut=/tmp/y"
    )


def job(state: str, end: float | None = None, code: str = "0:0") -> SlurmJob:
    (j,) = parse_jobs(slurm(state, end, code))
    return j


@pytest.mark.parametrize("own_code", [0, 143])
def test_a_killed_stop_that_wrote_its_own_end_record_ended_by_it(own_code: int) -> None:
    """Stopped at 10 s (grace 30 s), its command ended at 20 s (its record, beat at 19 s);
    Slurm's end is the kill's, at 45 s, CANCELLED 0:15: recorded at 20 s with its own code."""
    st = Stopping(START + 10.0, cancelled=True, grace_s=30.0, run=(1, 0), killed=True)
    own = OwnEnd(own_code, START + 20.0, True, written=START + 20.0)
    x = stopped_end(st, job("CANCELLED", 45.0, "0:15"), START + 50.0,
                    record=(own, START + 19.0))  # fmt: skip
    assert (x.exit_code, x.at) == (own_code, START + 20.0), x
    assert "its own end record" in x.note and "killed" not in x.note, x.note
    assert x.engine_state == "CANCELLED" and not x.by_itself


def test_a_killed_stop_without_a_record_is_killed_at_slurm_s_end() -> None:
    """No record (the kill ended its command): Slurm's end stands, killed."""
    st = Stopping(START + 10.0, cancelled=True, grace_s=30.0, run=(1, 0), killed=True)
    x = stopped_end(st, job("CANCELLED", 45.0, "0:15"), START + 50.0, record=(None, START + 44.0))
    assert (x.at, x.engine_state) == (START + 45.0, "KILLED")
    assert "killed after its grace" in x.note


def test_the_executor_records_a_stop_listed_running_after_its_end_by_its_record(
    tmp_path: Path,
) -> None:
    """Through the stop loop: the run's record written in its grace, Slurm lists it RUNNING
    (rewound), the grace passes (`scancel`), Slurm ends it CANCELLED: its own end."""
    run_dir = tmp_path / "checkpoints" / "1.0"
    run_dir.mkdir(parents=True)
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    calls: list[list[str]] = []
    ex._run = lambda args, *_, **__: calls.append(args) or ""  # type: ignore[method-assign,func-returns-value]
    real = time.time()
    ex._stopping = {"7": Stopping(real - 40.0, grace_s=30.0, run=(1, 0))}
    (run_dir / "launched").touch()
    (run_dir / "ended").write_text(f"0 {real:.6f} 1\n")  # signalled: the stop reached it
    ex._view = {j.slurm_id: j for j in parse_jobs(slurm("RUNNING"))}
    ex._read_runs(real + 1.0)  # the grace has passed: SIGKILL (atk47-s F3)
    kill = ["scancel", "--signal=KILL", "--batch", "--name=gpuledger-1", "7"]
    assert [a for a in calls if a[0] == "scancel"] == [kill]
    assert ex._stopping["7"].killed
    ex._view = {j.slurm_id: j for j in parse_jobs(slurm("CANCELLED", real - START + 18.0, "0:15"))}  # fmt: skip  # noqa: E501
    ex._read_runs(real + 20.0)
    (x,) = ex._stopped
    assert (x.job_id, x.run, x.exit_code) == (1, 0, 0), x
    assert real - 1.0 <= x.at <= real + 1.0, (x.at - real, x.note)
