"""Group commit (`Ledger.execute_each`): one store transaction, each command decided on its own."""

from __future__ import annotations

from pathlib import Path

from ledger.store.appended import Appended
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from schemas import commands as c
from schemas.errors import InvalidCommand, LedgerError, NotAuthorised


def ledger(tmp_path: Path) -> Ledger:
    led = Ledger(tmp_path, SimClock(1_000.0), seeded_ids(3))
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


def test_a_bad_command_never_fails_its_neighbours(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    head = led.position
    submit = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1)
    out = led.execute_each(
        [
            submit,
            c.SubmitJob(actor="mallory", account="ai2/olmo", gpus=1),  # not a member
            c.CancelJob(actor="alice", job_id=1, expected_position=-5),  # invalid
            submit,
            c.CancelJob(actor="alice", job_id=1),  # sees job 1 from the same batch
        ]
    )
    assert isinstance(out[1], NotAuthorised) and isinstance(out[2], InvalidCommand)
    ok = [o for o in out if isinstance(o, Appended)]
    assert [o.position for o in ok] == [head + 1, head + 2, head + 3]
    assert [e.job_id for o in ok for e in o.events] == [1, 2, 1]  # type: ignore[union-attr]
    # all of it is in the store, in order, chained, and reads back the same after a restart
    again = Ledger(tmp_path)
    assert again.position == head + 3
    assert [ev for _, ev in again.read(head, 10)] == [e for o in ok for e in o.events]
    assert again.state.jobs[1].status == "finished" and again.state.jobs[2].status == "pending"


def test_a_batch_of_only_rejections_appends_nothing(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    head = led.position
    out = led.execute_each(
        [c.CancelJob(actor="alice", job_id=9), c.GrantAdmin(actor="x", user="y")]
    )
    assert all(isinstance(o, LedgerError) for o in out)
    assert Ledger(tmp_path).position == head


def test_one_command_alone_is_folded_once_and_a_rejection_changes_nothing(tmp_path: Path) -> None:
    """A batch is decided on the live state itself (no copy): its events are folded once, and a
    rejected command leaves the state as it was."""
    led = ledger(tmp_path)
    head, version = led.position, led.version
    (out,) = led.execute_each([c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2)])
    assert isinstance(out, Appended) and out.position == head + 1 == led.position
    assert led.version == version + 1 and list(led.state.jobs) == [1]
    assert led.state.jobs[1].spec.gpus == 2 and led.state.next_job_id == 2
    (bad,) = led.execute_each([c.SubmitJob(actor="mallory", account="ai2/olmo", gpus=1)])
    assert isinstance(bad, NotAuthorised)
    assert (led.position, led.version, list(led.state.jobs)) == (head + 1, version + 1, [1])
    again = Ledger(tmp_path)  # what was stored folds to the same state
    assert again.state.jobs == led.state.jobs and again.last_hash == led.last_hash


def test_a_batch_another_writer_beat_is_decided_again_on_the_log(tmp_path: Path) -> None:
    """The batch folds into the live state as it is decided; when another writer appended first,
    the state is read back from the log and the batch decided again on top of it."""
    led = ledger(tmp_path)
    other = Ledger(tmp_path, SimClock(1_000.0), seeded_ids(9))
    other.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=3))  # job 1, unseen by led
    submit = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1)
    out = led.execute_each([submit, submit])
    assert [e.job_id for o in out for e in o.events] == [2, 3]  # type: ignore[union-attr]
    fresh = Ledger(tmp_path)
    assert led.position == fresh.position and led.last_hash == fresh.last_hash
    assert led.state.jobs == fresh.state.jobs and led.state.next_job_id == 4


def test_a_batch_the_store_failed_leaves_the_state_as_the_log(tmp_path: Path) -> None:
    """A store error acknowledges nobody and leaves no trace of the batch in the state."""
    led = ledger(tmp_path)
    head, jobs = led.position, dict(led.state.jobs)

    def broken(*_: object, **__: object) -> None:
        raise OSError("disk full")

    real = led.recorder.insert_events
    led.recorder.insert_events = broken  # type: ignore[assignment,method-assign]
    try:
        led.execute_each([c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1)] * 2)
    except OSError:
        pass
    else:
        raise AssertionError("the store error was swallowed")
    finally:
        led.recorder.insert_events = real  # type: ignore[method-assign]
    assert led.position == head and led.state.jobs == jobs and led.state.next_job_id == 1
    (out,) = led.execute_each([c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1)])
    assert isinstance(out, Appended) and [e.job_id for e in out.events] == [1]  # type: ignore[attr-defined]


def test_a_quiet_server_snapshots_ahead_of_the_commit_that_would(tmp_path: Path) -> None:
    """`serve`'s idle work stores the live state's snapshot once half the interval has passed,
    so the commit crossing the interval does not have to; before that it stores nothing."""
    from ledger.server.run import snapshot_ahead

    ledger(tmp_path).close()
    live = Ledger(tmp_path, SimClock(2_000.0), seeded_ids(4), live=True, snapshot_every=10)
    assert live.snapshot_state()  # the interval counts from here
    start = live.snapshot_position
    submit = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1)
    live.execute_each([submit] * 4)
    snapshot_ahead(live)
    assert live.snapshot_position == start  # 4 of 10: not yet
    live.execute_each([submit])
    snapshot_ahead(live)
    assert live.snapshot_position == live.position == start + 5
    again = Ledger(tmp_path, live=True)
    assert again.restored_from == start + 5 and again.state.jobs == live.state.jobs


def test_a_group_commits_events_are_kept_decoded_as_the_log_holds_them(tmp_path: Path) -> None:
    """The batch's dry run reads the events after an `expected_position` from those the ledger
    kept decoded (`Ledger.kept`, atk44w); a group commit kept none, so a submit made that way
    was never there."""
    led = ledger(tmp_path)
    head = led.position
    submit = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1)
    led.execute_each([submit, c.SubmitJob(actor="mallory", account="ai2/olmo", gpus=1), submit])
    led.execute_each([c.CancelJob(actor="alice", job_id=1)])
    kept = led.kept(head, led.position)
    assert kept is not None and [p for p, _ in kept] == list(range(head + 1, led.position + 1))
    assert kept == list(Ledger(tmp_path).follow(head))  # as the store holds them
    assert led.kept(head, led.position + 1) is None  # not all kept: never a guess
    assert led.kept(led.position, led.position) == []


def test_the_bytes_a_users_unfinished_jobs_hold_are_kept_as_jobs_come_and_go(
    tmp_path: Path,
) -> None:
    """`State.held_of` (serve.toml `max_job_bytes_per_user`, atk44z F7): kept by `evolve` and
    carried by `copy`, equal to the sum built afresh from the live jobs."""
    from ledger.core.state import held_bytes

    led = ledger(tmp_path)
    assert led.state.held_of("alice") == 0  # built (empty), then kept
    big = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, command=("x" * 4000, "y"),
                      env={"A": "b" * 300}, array=(0, 1, 2))  # fmt: skip
    led.execute_each([big, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1)])
    view = led.state.copy()
    led.execute_each([c.CancelJob(actor="alice", job_id=2)])
    fresh = sum(held_bytes(led.state.jobs[j].spec) for j in led.state.active)
    assert led.state.held_of("alice") == fresh > 2 * held_bytes(big)  # two tasks and job 4
    assert view.held_of("alice") == fresh + held_bytes(led.state.jobs[2].spec)  # its own
    assert Ledger(tmp_path).state.held_of("alice") == fresh  # folded from the log
