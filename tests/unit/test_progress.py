"""The one progress display (`ledger.cli.output.progress`): on a terminal, done/total on
stderr; nothing at all when stderr is not a terminal."""

from __future__ import annotations

import contextlib
import io

import pytest

from ledger.cli.output import progress
from ledger.cli.sim import submissions_made
from ledger.core.budget import BudgetFile
from ledger.sim.workload import SimJob, Workload


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_when_stderr_is_not_a_terminal() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), progress("events", 10) as update:
        for i in range(11):
            update(i)
        update(10, 12)
    assert err.getvalue() == ""


def test_a_terminal_sees_done_of_a_known_total() -> None:
    err = _Terminal()
    with contextlib.redirect_stderr(err), progress("events verified", 1234) as update:
        update(617)
    text = err.getvalue()
    # thousands separated, as every result line prints counts (atk47-29 F3)
    assert "events verified" in text and "617/1,234" in text, text
    assert "?" not in text.split("events verified", 1)[1].split("\n")[0]


def test_a_total_learned_late_replaces_the_unknown_one() -> None:
    err = _Terminal()
    with contextlib.redirect_stderr(err), progress("events") as update:
        update(5, 50)
    assert "5/50" in err.getvalue()


def test_an_80_column_terminal_keeps_the_whole_count_of_a_long_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`audit verify`'s long stage-3 name at a default 80 columns: the bar gives way, the known
    total stays whole (atk48-29 F4: "1,010,086/1,010…")."""
    monkeypatch.setenv("COLUMNS", "80")
    err = _Terminal()
    with contextlib.redirect_stderr(err), progress("verify 1/3: chain") as update:
        update(5, 1_010_254, "verify 3/3: projection, events rebuilt")
        update(1_010_086)
    assert "1,010,086/1,010,254" in err.getvalue(), err.getvalue()


def test_simulate_counts_the_jobs_submitted_of_a_known_total() -> None:
    """`simulate run`'s bar counts the jobs submitted so far of those inside the days run, a
    count that moves with the bar (atk48-29 F4: whole days, "0/1 days" until the end)."""
    jobs = tuple(
        SimJob(
            key=f"j{i}",
            account="p/t",
            user="u",
            submit_s=s,
            duration_s=60,
            gpus=1,
            min_runtime_s=0,
            resumable=False,
        )
        for i, s in enumerate((0, 10, 3_600, 90_000))
    )
    made = submissions_made(Workload("w", jobs, BudgetFile(accounts={})), days=1.0)
    assert [made(t) for t in (0.0, 5.0, 10.0, 7_200.0, 86_400.0, float("inf"))] == [
        1,
        1,
        2,
        3,
        3,
        3,
    ]
