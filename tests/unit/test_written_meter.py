"""Each person's bytes written to the log are metered (atk44-25 F9: looped 4 MB submits and
cancels grew the log ~15 MiB/s for good and slowed another's submits ~190x)."""

from __future__ import annotations

from ledger.server.meters import WRITE_BYTES_BURST, WRITE_BYTES_PER_S, Written


def test_a_person_past_her_bytes_waits_until_they_fill_and_others_do_not() -> None:
    meter = Written()
    assert meter.retry_in("alice", 0.0) == 0
    meter.charge("alice", WRITE_BYTES_BURST, 0.0)  # the whole allowance: the next write waits
    assert meter.retry_in("alice", 0.0) == 0
    meter.charge("alice", 900 * 1024, 0.0)  # past it: refused until it fills back
    assert meter.retry_in("alice", 0.0) == 900 * 1024 / WRITE_BYTES_PER_S
    assert meter.retry_in("alice", 5.0) == (900 * 1024 - 5 * WRITE_BYTES_PER_S) / WRITE_BYTES_PER_S
    assert meter.retry_in("alice", 8.0) == 0
    assert meter.retry_in("bob", 0.0) == 0  # each person her own


def test_a_sustained_flood_is_held_to_the_rate() -> None:
    meter, now, written = Written(), 0.0, 0
    while now < 600:  # ten minutes of 4 MB writes, each as soon as allowed
        now += meter.retry_in("alice", now)
        meter.charge("alice", 4 << 20, now)
        written += 4 << 20
    assert written <= WRITE_BYTES_BURST + now * WRITE_BYTES_PER_S + (4 << 20)  # was unbounded
