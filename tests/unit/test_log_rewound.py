"""A log that moved back under a server (atk51-ha F2): a failover to a standby that never got the
last commits, which PostgreSQL had shown to every session on the old primary, so servers folded
them. The live state and the projection built on them are read back and made again from the log
the store holds; before, the projection's check failed every cycle for ever ("the projection is
at position N but the log ends at N-1") and the live state kept the lost events. The store here
is the SQLite file, whose rows a test can drop (what the store does is the same for both)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ledger.cycle.loop import ServiceLoop
from ledger.dispatch import registry
from ledger.engines.none import NoExecutor
from ledger.store import EVENTS_DB
from ledger.store.application import Ledger
from ledger.store.creating import NewLedger
from schemas import commands as c


def _ledger(home: Path) -> Ledger:
    led = NewLedger(home)
    led.execute(c.InitLedger(actor="root", admin="root"))
    led.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    return led


def _submit(gpus: int = 1) -> c.SubmitJob:
    return c.SubmitJob(actor="alice", account="ai2/olmo", gpus=gpus, min_runtime_s=60)


def _drop_from(home: Path, position: int) -> None:
    with sqlite3.connect(home / EVENTS_DB) as con:
        con.execute("DELETE FROM stored_events WHERE originator_version >= ?", (position,))


def test_a_follower_whose_log_ends_before_its_position_reads_the_state_and_projection_back(
    tmp_path: Path,
) -> None:
    home = tmp_path / "h"
    _ledger(home).execute(_submit())
    follower = Ledger(home, live=True)
    loop = ServiceLoop(follower, NoExecutor(), registry.build("fairshare-7"), placing=False)
    loop.open(lead=False)
    try:
        lost = Ledger(home).execute(_submit(2))
        assert loop.follow() == lost.position and loop.store is not None
        assert loop.store.position() == lost.position
        _drop_from(home, lost.position)  # the store lost it
        assert loop.follow() == lost.position - 1
        assert follower.rewound == 1 and loop.store.position() == lost.position - 1
        assert sorted(j.spec.gpus for j in follower.state.jobs.values()) == [1]
        # then another event at that position, and one after it: folded on the log's own
        again = Ledger(home).execute(_submit(3))
        assert again.position == lost.position
        assert loop.follow() == again.position and loop.store.position() == again.position
        assert sorted(j.spec.gpus for j in follower.state.jobs.values()) == [1, 3]
    finally:
        loop.close()


def test_a_follower_whose_position_was_filled_by_another_event_reads_the_log_back(
    tmp_path: Path,
) -> None:
    """The log lost position N and a new leader appended other events at N and N + 1: the
    follower at N saw nothing amiss by positions and folded N + 1 on its own N. Now the first
    event it folds must link to the last one it folded."""
    home = tmp_path / "h"
    _ledger(home)
    follower = Ledger(home)
    lost = Ledger(home).execute(_submit(2))
    assert follower.catch_up() == lost.position
    _drop_from(home, lost.position)
    writer = Ledger(home)
    writer.execute(_submit(3))
    writer.execute(_submit(4))
    assert follower.refresh() == writer.position
    assert sorted(j.spec.gpus for j in follower.state.jobs.values()) == [3, 4]  # was [2, 4]
    assert follower.rewound == 1
