"""`jobs` / `jobs --json` show a run's own start where the ledger charged it from there: a run
the ledger stopped while placed whose command ran (atk44s F3) has no `JobStarted`, only its
`job.run_ended.v2` `started_at`; the jobs listing showed no `started_at` for it (and so no
elapsed time) though its usage counted from then (`projections.history.jobs_page`)."""

from __future__ import annotations

from pathlib import Path

from projections.history import jobs_page
from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import Store
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from tests.unit.test_charged_from_start import ORG, T0, decision, history

STARTED_AT = 17  # `jobs_page`'s column


def jobs(tmp_path: Path, cmds: list[tuple[float, c.AnyCommand]]) -> dict[int, tuple[object, ...]]:
    events = history(cmds)
    records = [LogRecord(p, e.tag_of(type(ev)), codec.encode(ev)) for p, ev in enumerate(events, 1)]  # type: ignore[arg-type]
    with Store(tmp_path / "p.duckdb") as store:
        Projector(store, ListSource(records)).catch_up()
        return {row[0]: row for row in jobs_page(store.con, v.JobFilter(limit=10))}


def test_a_job_cancelled_while_placed_whose_command_ran_shows_its_own_start(
    tmp_path: Path,
) -> None:
    """Placed at T0, cancelled at T0 + 30 before any read saw it start; its command ran from
    T0 + 40 to T0 + 100 (its engine's report): `started_at` T0 + 40."""
    got = jobs(tmp_path, [
        *ORG,
        (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60)),
        (T0, decision("c1", "fairtree-3", placed=(2,))),
        (T0 + 30, c.CancelJob(actor="alice", job_id=2)),
        (T0 + 101, c.ConfirmRunEnded(actor="@executor", job_id=2, engine="slurm",
                                     engine_job_id="9", ended_at=T0 + 100, started_at=T0 + 40)),
    ])  # fmt: skip
    assert got[2][6] == "finished" and got[2][STARTED_AT] == T0 + 40, got[2]


def test_a_job_cancelled_while_placed_that_never_ran_shows_no_start(tmp_path: Path) -> None:
    got = jobs(tmp_path, [
        *ORG,
        (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60)),
        (T0, decision("c1", "fairtree-3", placed=(2,))),
        (T0 + 30, c.CancelJob(actor="alice", job_id=2)),
        (T0 + 31, c.ConfirmRunEnded(actor="@executor", job_id=2, engine="slurm",
                                    engine_job_id="9", ended_at=T0 + 31)),
    ])  # fmt: skip
    assert got[2][6] == "finished" and got[2][STARTED_AT] is None, got[2]
