"""Idempotency keys on the real SQLite store (atk28 F9): a retry of the same command is answered
with its first try's events; the same key sent with a different command is refused (409, one
line), in one batch, across batches, and after a restart (the log itself tells them apart)."""

from __future__ import annotations

from pathlib import Path

from ledger.store.appended import Appended
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from schemas import commands as c
from schemas.errors import Conflict


def submit(gpus: int) -> c.SubmitJob:
    return c.SubmitJob(actor="alice", account="ai2/olmo", gpus=gpus, min_runtime_s=60)


def test_a_key_reused_for_a_different_command_is_refused_and_a_retry_is_answered(
    org_ledger: Ledger, home: Path, clock: SimClock
) -> None:
    first = org_ledger.execute_each([submit(1)], ["k-1"])[0]
    assert isinstance(first, Appended)
    again = org_ledger.execute_each([submit(1)], ["k-1"])[0]
    assert isinstance(again, Appended) and again.events == first.events
    other = org_ledger.execute_each([submit(2)], ["k-1"])[0]
    assert isinstance(other, Conflict) and other.line().startswith(
        "this key was used for a different request"
    ), other
    job = first.events[0].job_id  # type: ignore[attr-defined]
    assert f"it holds job {job}" in other.line(), other.line()  # named (atk51-ha F4)
    both = org_ledger.execute_each([submit(1), submit(3)], ["k-2", "k-2"])
    assert isinstance(both[0], Appended) and isinstance(both[1], Conflict), both
    # two copies in one batch (a standby's forward and the client's retry, atk49 F1): the
    # second is answered with the first's success, not refused while the first commits
    twice = org_ledger.execute_each([submit(4), submit(4)], ["k-3", "k-3"])
    assert all(isinstance(o, Appended) for o in twice), twice
    assert twice[0] == twice[1], twice
    later = org_ledger.execute_each([submit(4)], ["k-3"])[0]
    assert isinstance(later, Appended) and later.events == twice[0].events, later  # type: ignore[union-attr]
    bob = org_ledger.execute_each(
        [c.SubmitJob(actor="bob", account="ai2/olmo", gpus=2, min_runtime_s=60)], ["k-1"]
    )[0]
    assert isinstance(bob, Appended) and bob.events != first.events  # keys are per caller
    position = org_ledger.position
    org_ledger.close()
    reopened = Ledger(home, clock, seeded_ids(2))  # the keys are read back from the log
    try:
        refused = reopened.execute_each([submit(2)], ["k-1"])[0]
        assert isinstance(refused, Conflict) and f"it holds job {job}" in refused.line()
        retried = reopened.execute_each([submit(1)], ["k-1"])[0]
        assert isinstance(retried, Appended) and retried.events == first.events
        assert reopened.position == position
    finally:
        reopened.close()
