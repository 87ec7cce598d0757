"""A run Slurm ended NODE_FAIL that noted Slurm's signal (its `signalled` mark) is taken for gone
only once Slurm's SIGKILL has surely landed, whatever the mark says (atk38-24):

- F5: the note proves slurmd's TERM landed, not its SIGKILL KillWait later; a slurmd killed
  right after an admin's DOWN never sends it, and the processes ran on beside the job's next
  launch. The run waits for its slurmd to answer again, then KillWait from that answer.
- F6: the mark's time is its mtime, which the job's user sets: one dated in the future kept
  the run `running` for good after DOWN + resume. It counts no later than the first read that
  saw it.

The executor reads canned `scontrol` output (its `_run`); the marks are real files."""

from __future__ import annotations

import os
from pathlib import Path

from ledger.engines.slurm import SlurmExecutor
from ledger.engines.slurm.tracked import Run
from ledger.engines.slurm.words import slurm_time

LID = "0123abcd4567"
END = slurm_time("2026-12-01T21:18:11")
assert END is not None


class _Slurm(SlurmExecutor):
    jobs = ""
    nodes_text = ""

    def _run(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
        return self.nodes_text if "node" in args else self.jobs


def _job(state: str) -> str:
    end = "Unknown" if state == "RUNNING" else "2026-12-01T21:18:11"
    return (
        f"JobId=70 JobName=gpuledger-1 UserId=bob(1001) JobState={state} Reason=None"
        f" ExitCode=0:0 StartTime=2026-12-01T21:17:50 EndTime={end}"
        f" Partition=gpuledger NodeList=vm Comment=gpuledger:{LID}:job=1:run=0 StdOut=/tmp/y"
    )


def _node(state: str) -> str:
    return f"NodeName=vm Gres=gpu:fake_0:1,gpu:fake_1:1 State={state} Partitions=gpuledger"


def _running(tmp_path: Path) -> _Slurm:
    """Job 1 running on vm (its slurmd answering), read once; KillWait 10 s, SlurmdTimeout 30."""
    ex = _Slurm("gpuledger", LID, tmp_path)
    ex.kill_wait_s, ex.slurmd_timeout_s = 10.0, 30.0
    ex._runs = {1: Run(1, 0, None, slurm_id="70", started=True)}
    ex.jobs, ex.nodes_text = _job("RUNNING"), _node("ALLOCATED")
    ex.observe(END - 50.0, {})
    return ex


def _note(ex: _Slurm, at: float) -> None:
    mark = ex._checkpoint_file(1, 0).with_name("signalled")
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()
    os.utime(mark, (at, at))


def _exits(ex: _Slurm, now: float) -> list[tuple[int, str, float]]:
    return [(x.job_id, x.reason, x.at) for x in ex.observe(now, {}).exits]


def test_a_noted_term_is_not_a_kill_while_the_nodes_slurmd_does_not_answer(
    tmp_path: Path,
) -> None:
    assert END is not None
    ex = _running(tmp_path)
    _note(ex, END + 0.3)  # slurmd's TERM at the DOWN; then slurmd is killed
    ex.jobs, ex.nodes_text = _job("NODE_FAIL"), _node("IDLE*")  # resumed, slurmd dead
    for now in (END + 1.0, END + 11.0, END + 40.0, END + 100.0):
        assert _exits(ex, now) == [], now  # it may run on under its slurmstepd
    assert 1 in ex.observe(END + 101.0, {}).running
    ex.nodes_text = _node("IDLE")  # slurmd back: it kills what it should not run
    assert _exits(ex, END + 110.0) == []  # answering from the read at END + 110
    assert _exits(ex, END + 119.0) == []
    assert _exits(ex, END + 120.0) == [(1, "node_failure", END + 120.0)]


def test_a_signal_note_dated_in_the_future_counts_from_the_read_that_saw_it(
    tmp_path: Path,
) -> None:
    assert END is not None
    ex = _running(tmp_path)
    _note(ex, END + 3e7)  # the job sets its mark's time a year ahead
    ex.jobs, ex.nodes_text = _job("NODE_FAIL"), _node("IDLE")
    assert _exits(ex, END + 1.0) == []  # first seen: the note counts from here
    assert _exits(ex, END + 29.0) == []  # its slurmd not yet known alive past SlurmdTimeout
    assert _exits(ex, END + 30.0) == [(1, "node_failure", END + 11.0)]
    assert 1 not in ex.observe(END + 31.0, {}).running
