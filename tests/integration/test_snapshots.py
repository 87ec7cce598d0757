"""Snapshots of the live write-side state in the real store: a start is the newest snapshot that
verifies plus the tail; one that does not verify is skipped with a warning."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest

from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.store import snapshots
from ledger.store.application import STREAM_ID, Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.live import LiveView
from schemas import codec
from schemas import commands as c
from schemas.errors import InvalidTransition

GOLDEN = Path(__file__).parent.parent / "golden" / "events-v1.jsonl"


def busy_ledger(home: Path, *, live: bool, every: int = 10) -> Ledger:
    ledger = Ledger(home, SimClock(1_000.0), seeded_ids(3), live=live, snapshot_every=every)
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    for _ in range(12):
        ledger.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60))
    for job in (1, 4, 7):
        ledger.execute(c.CancelJob(actor="alice", job_id=job))
    return ledger


def live_part(full: State) -> State:
    """Pure: what a live state holds of a full one."""
    live = full.copy()
    live.live_only = True
    live.jobs = {k: j for k, j in full.jobs.items() if j.active}
    return live


def stored_snapshots(home: Path) -> list[int]:
    con = sqlite3.connect(home / "events.sqlite")
    try:
        rows = con.execute(
            "SELECT originator_version FROM stored_snapshots WHERE originator_id = ? "
            "ORDER BY originator_version",
            (STREAM_ID.hex,),
        ).fetchall()
    finally:
        con.close()
    return [r[0] for r in rows]


def test_a_live_state_is_the_full_state_without_finished_jobs() -> None:
    full, live = State(), State(live_only=True)
    for raw in GOLDEN.read_bytes().splitlines():
        ev = codec.decode(raw)
        evolve(full, ev)
        evolve(live, ev)
    assert live == live_part(full)
    assert live.finished == full.finished == 4
    assert snapshots.unfolded(snapshots.folded(live)) == live


def test_a_restart_starts_from_the_snapshot_and_folds_only_the_tail(tmp_path: Path) -> None:
    first = busy_ledger(tmp_path, live=True)
    assert first.snapshot_position > 0
    first.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=60))
    state, position = first.state, first.position
    first.close()  # a clean stop snapshots the tail
    again = Ledger(tmp_path, SimClock(2_000.0), live=True)
    assert (again.snapshot_position, again.position) == (position, position)
    assert again.state == state
    full = Ledger(tmp_path, SimClock(2_000.0))
    assert again.state == live_part(full.state)
    assert sorted(full.state.jobs) == list(range(1, 14)) and sorted(again.state.jobs) == [
        2, 3, 5, 6, 8, 9, 10, 11, 12, 13
    ]  # fmt: skip
    with pytest.raises(InvalidTransition, match="job 4 is finished"):
        again.execute(c.CancelJob(actor="alice", job_id=4))
    again.execute(c.CancelJob(actor="alice", job_id=5))
    assert 5 not in again.state.jobs and again.state.finished == 4
    assert len(stored_snapshots(tmp_path)) <= snapshots.KEEP


def test_a_snapshot_that_does_not_verify_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = busy_ledger(tmp_path, live=True, every=5)
    ledger.close()
    newest = stored_snapshots(tmp_path)[-1]
    # tamper: the newest snapshot now names a chain hash the log does not have at its position
    con = sqlite3.connect(tmp_path / "events.sqlite")
    (data,) = con.execute(
        "SELECT state FROM stored_snapshots WHERE originator_version = ?", (newest,)
    ).fetchone()
    snap, _ = snapshots.decode(data)
    forged = snapshots._encoder.encode(
        snapshots.StateSnapshot(
            position=snap.position,
            version=snap.version,
            chain_hash="0" * 64,
            digest=snap.digest,
            payload=snap.payload,
        )
    )
    con.execute(
        "UPDATE stored_snapshots SET state = ? WHERE originator_version = ?", (forged, newest)
    )
    con.commit()
    con.close()
    with caplog.at_level(logging.WARNING, logger="gpuledger.ledger"):
        again = Ledger(tmp_path, SimClock(2_000.0), live=True)
    assert f"snapshot at position {newest}: the chain hash differs" in caplog.text
    assert again.snapshot_position < newest  # the older snapshot, then the tail
    assert again.state == live_part(Ledger(tmp_path, SimClock(2_000.0)).state)


def test_a_damaged_snapshot_payload_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = busy_ledger(tmp_path, live=True, every=5)
    ledger.close()
    con = sqlite3.connect(tmp_path / "events.sqlite")
    con.execute("UPDATE stored_snapshots SET state = x'00ff'")
    con.commit()
    con.close()
    with caplog.at_level(logging.WARNING, logger="gpuledger.ledger"):
        again = Ledger(tmp_path, SimClock(2_000.0), live=True)
    assert caplog.text.count("snapshot skipped: unreadable snapshot") == snapshots.KEEP
    assert again.snapshot_position == 0 and again.position == 24  # folded from the start
    assert again.state == live_part(Ledger(tmp_path, SimClock(2_000.0)).state)


def test_serve_starts_from_the_snapshot_its_clean_stop_left(tmp_path: Path) -> None:
    """`serve` keeps the live state: a clean stop snapshots its position, and the next start
    folds only what came after that snapshot (never the whole log)."""
    from tests.integration.serverkit import cli, set_up_ledger, start_server

    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    first = start_server(home, "--interval", "1h", log_name="first.log")
    assert first.stop() == 0, first.log_path.read_text()
    stopped_at = json.loads(cli(home, "log", "--json", "--tail", "1").stdout)[-1]["position"]
    tail = Ledger(home)  # the full state takes no snapshot: this event stays a tail
    tail.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=60))
    tail.close()
    again = start_server(home, "--interval", "1h", log_name="again.log")
    try:
        text = again.log_path.read_text()
        assert f"state: the snapshot at position {stopped_at} and 1 events after it" in text, text
    finally:
        assert again.stop() == 0


# --- the read-only live view the CLI's reads start -------------------------------------------


def test_a_read_starts_from_the_same_snapshot_and_tail_as_the_live_ledger(tmp_path: Path) -> None:
    busy_ledger(tmp_path, live=True).close()  # snapshots at its stop
    writer = Ledger(tmp_path, SimClock(2_000.0), live=True)
    writer.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=60))
    writer.execute(c.CancelJob(actor="alice", job_id=5))  # a tail after the newest snapshot
    view = LiveView.open(tmp_path)
    assert view is not None
    assert (view.position, view.state) == (writer.position, writer.state)
    assert stored_snapshots(tmp_path)[-1] < view.position  # it stored nothing
    writer.execute(c.CancelJob(actor="alice", job_id=6))
    assert view.catch_up() == writer.position and view.state == writer.state
    assert 6 not in view.state.jobs and view.state.finished == writer.state.finished == 5


def test_a_read_skips_a_snapshot_that_does_not_verify(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    busy_ledger(tmp_path, live=True, every=5).close()
    newest = stored_snapshots(tmp_path)[-1]
    con = sqlite3.connect(tmp_path / "events.sqlite")
    con.execute(
        "UPDATE stored_snapshots SET state = x'00ff' WHERE originator_version = ?", (newest,)
    )
    con.commit()
    con.close()
    with caplog.at_level(logging.WARNING):
        view = LiveView.open(tmp_path)
    assert caplog.text.count("snapshot skipped: unreadable snapshot") == 1
    assert view is not None and view.state == Ledger(tmp_path, live=True).state


def test_a_read_folds_a_log_without_snapshots_and_leaves_a_long_tail_to_the_ledger(
    tmp_path: Path,
) -> None:
    full = busy_ledger(tmp_path, live=False)  # a full ledger stores no snapshot
    assert stored_snapshots(tmp_path) == []
    view = LiveView.open(tmp_path)
    assert view is not None and view.position == full.position == 24
    assert view.state == live_part(full.state)
    assert LiveView.open(tmp_path, max_tail=23) is None  # a live ledger would snapshot this
    assert stored_snapshots(tmp_path) == []
