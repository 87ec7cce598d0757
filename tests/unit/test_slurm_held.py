"""What a Slurm job holds (`words.held_gpus`), from `scontrol -d -o show job` lines Slurm 22.05
printed (trimmed to the fields read)."""

from __future__ import annotations

import pytest

from ledger.engines.slurm.words import SlurmJob, held_gpus, parse_jobs

PINNED = {"vm": ("fake_0", "fake_1", "fake_2", "fake_3")}
GRES = "JOB_GRES=gpu:fake_0:1,gpu:fake_1:1,gpu:fake_2:0,gpu:fake_3:0 Nodes=vm CPU_IDs=0 Mem=0 "
IDX = "GRES=gpu:fake_0:1(IDX:0),gpu:fake_1:1(IDX:1),gpu:fake_2:0(IDX:),gpu:fake_3:0(IDX:) "


def line(state: str, detail: str, nodes: str = "vm") -> str:
    return (f"JobId=7 JobName=train JobState={state} Reason=None ExitCode=0:0 "
            f"StartTime=2026-12-02T06:50:57 EndTime=Unknown Partition=other NodeList={nodes} "
            f"{detail}TresPerNode=gres:gpu:2")  # fmt: skip


@pytest.mark.parametrize(
    ("case", "text", "want"),
    [
        ("running", line("RUNNING", GRES + IDX), {"vm": (0, 1)}),
        (
            "configuring: PrologSlurmctld runs, or its node boots",
            line("CONFIGURING", GRES + IDX),
            {"vm": (0, 1)},
        ),
        (
            "completing after a requeue: -d lists no IDX, JOB_GRES still says",
            line("COMPLETING", GRES + "GRES= "),
            {"vm": (0, 1)},
        ),
        ("pending without an allocation", line("PENDING", "", "(null)"), {}),
        ("ended", line("COMPLETED", GRES + "GRES= "), {}),
    ],
)
def test_what_a_slurm_job_holds(case: str, text: str, want: dict[str, tuple[int, ...]]) -> None:
    (job,) = parse_jobs(text)
    assert dict(held_gpus(job, PINNED)) == want, case


def test_a_read_parses_again_only_the_lines_that_changed() -> None:
    known: dict[str, SlurmJob] = {}
    ended, running = line("COMPLETED", GRES + "GRES= "), line("RUNNING", GRES + IDX)
    first = parse_jobs(f"{ended}\n{running}\n", known)
    again = parse_jobs(f"{ended}\n{running.replace('RUNNING', 'COMPLETING')}\n", known)
    assert again[0] is first[0]  # kept
    assert (again[1].state, first[1].state) == ("COMPLETING", "RUNNING")  # parsed again
    assert set(known) == {ended, running.replace("RUNNING", "COMPLETING")}  # this read's lines
    assert parse_jobs(ended) == [first[0]]  # the same job without `known`
