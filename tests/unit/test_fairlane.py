"""Whose read runs next in a lane of the read pool (`ledger.server.fairlane.Turns`,
docs/security.md row T5): people in turn, each spending credit of their own that fills at an
equal share of the lane's quarter of the time, so one person's rests never hold another."""

from __future__ import annotations

import time

import pytest

from ledger.server.cache import ReadCache
from ledger.server.fairlane import FairLane, Turns


def test_people_are_served_in_turn_whoever_queued_more() -> None:
    turns = Turns()
    for n in range(3):
        turns.add("alice", f"a{n}")
    turns.add("bob", "b0")
    turns.add("carol", "c0")
    order = []
    while (got := turns.next(0.0)) is not None:
        assert isinstance(got, tuple)
        order.append(got[1])
        turns.ran(got[0], 0.0, 0.0)
    assert order == ["a0", "b0", "c0", "a1", "a2"]


def test_a_person_has_one_read_under_way_at_a_time() -> None:
    turns = Turns()
    turns.add("alice", "a0")
    turns.add("alice", "a1")
    assert turns.next(0.0) == ("alice", "a0")
    assert turns.next(0.0) is None  # her second waits for her first, not for a thread
    turns.add("bob", "b0")
    assert turns.next(0.0) == ("bob", "b0")  # the other thread takes his at once
    turns.ran("alice", 0.1, 0.1)
    assert turns.next(0.1) == ("alice", "a1")


def test_one_person_alone_looping_rests_three_times_each_read_once_their_burst_is_spent() -> None:
    turns = Turns(rest=3.0, burst_s=1.0)
    now, n = 0.0, 0
    while True:  # reads of 0.25 s back to back while the burst lasts
        turns.add("alice", n)
        got = turns.next(now)
        if not isinstance(got, tuple):
            break
        now += 0.25
        turns.ran("alice", 0.25, now)
        n += 1
    assert n == 6  # 1 s of burst, plus what a quarter of the time earned meanwhile
    assert isinstance(got, float)
    for _ in range(3):  # from then on: three times as long as each read, between reads
        assert turns.next(got) == ("alice", n)
        now = got + 0.25
        turns.ran("alice", 0.25, now)
        n += 1
        turns.add("alice", n)
        got = turns.next(now)
        assert isinstance(got, float) and got - now == pytest.approx(3 * 0.25)


def test_another_persons_read_never_waits_for_a_looping_persons_rest() -> None:
    turns = Turns(rest=3.0, burst_s=1.0)
    turns.add("alice", "a0")
    assert turns.next(0.0) == ("alice", "a0")
    turns.ran("alice", took=5.0, now=5.0)  # deep in debt
    turns.add("alice", "a1")
    turns.add("bob", "b0")
    turns.add("bob", "b1")
    assert turns.next(5.0) == ("bob", "b0")  # her debt does not hold him
    turns.ran("bob", took=0.2, now=5.2)
    assert turns.next(5.2) == ("bob", "b1")  # he has credit left: no rest of his own either
    turns.ran("bob", took=0.2, now=5.4)
    ready = turns.next(5.4)
    assert isinstance(ready, float) and ready <= 5.4 + 10.0 + 1e-9  # capped at the time limit


def test_a_person_full_again_and_waiting_for_nothing_is_forgotten() -> None:
    turns = Turns(rest=3.0, burst_s=1.0)
    turns.add("alice", "a0")
    assert turns.next(0.0) == ("alice", "a0")
    turns.ran("alice", took=0.5, now=0.5)
    turns.add("bob", "b0")
    assert turns.next(100.0) == ("bob", "b0")
    turns.ran("bob", took=0.1, now=100.1)
    assert set(turns.credit) == {"bob"}


class Clock:
    """A lane's clock that moves only when a read says it worked (no timing)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def settled(lane: FairLane, person: str) -> None:
    """Until the lane has counted `person`'s read (it does so after handing its answer over)."""
    deadline = time.monotonic() + 10
    while person in lane.turns.running or person not in lane.turns.credit:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_a_shared_value_computed_in_a_read_is_not_charged_to_its_reader() -> None:
    """alice's job page at a new log position computes the dispatcher's preview of the whole
    queue, which the queue page, /metrics and everyone's explain then share (`ReadCache`): 5 s
    of it and 0.1 s of her own are charged 0.1 s, and her next read runs at once. Before, she
    was charged 5.1 s and rested (issue 29: the job page and a warm scrape of the page
    benchmark waited 0.2-1.3 s for 0.03-0.12 s of work)."""
    clock = Clock()
    lane = FairLane(Turns(rest=3.0, burst_s=1.0), clock=clock, work=clock)
    cache = ReadCache()

    def preview() -> str:
        clock.t += 5.0  # the whole queue's preview
        return "preview"

    def page() -> str:
        clock.t += 0.1  # the page's own part
        return cache.shared("live-preview", 7, 0.0, preview)

    try:
        assert lane.submit("alice", page).result(timeout=10) == "preview"
        settled(lane, "alice")
        assert lane.turns.balance("alice", clock.t) == pytest.approx(0.9)
        # her next read (the preview kept: nothing shared to compute) takes its turn at once
        assert lane.submit("alice", page).result(timeout=5) == "preview"
        settled(lane, "alice")
        assert lane.turns.balance("alice", clock.t) == pytest.approx(0.9 + 0.1 / 4 - 0.1)
        assert lane.reads == 2 and lane.waited_s == 0.0
    finally:
        lane.stop()


def test_a_readers_own_work_is_still_charged_beside_a_shared_value() -> None:
    clock = Clock()
    lane = FairLane(Turns(rest=3.0, burst_s=1.0), clock=clock, work=clock)
    cache = ReadCache()

    def window() -> int:
        clock.t += 5.0  # /metrics' window figures, shared
        return 1

    def heavy() -> int:
        clock.t += 2.0  # her own
        return cache.recent("metrics-ledger", 3, 0.0, window)

    try:
        assert lane.submit("alice", heavy).result(timeout=10) == 1
        settled(lane, "alice")
        assert lane.turns.balance("alice", clock.t) == pytest.approx(-1.0)  # she rests
    finally:
        lane.stop()


def test_a_read_is_charged_its_work_not_its_wait_for_a_cpu() -> None:
    """A read's time in the lane that is no work of its own (its thread waiting for a CPU on a
    loaded machine, or for the interpreter lock) is not charged to its reader: at load 18 a
    project's Budget review took 70-100 ms of CPU in 250-630 ms, was charged the 630, and the
    same person's next pages waited 0.7-1.8 s for their turn (s61-dash)."""
    lane = FairLane(Turns(rest=3.0, burst_s=1.0))

    def waits() -> str:
        time.sleep(0.4)  # off the CPU, as a thread the kernel leaves waiting
        return "read"

    try:
        assert lane.submit("alice", waits).result(timeout=10) == "read"
        settled(lane, "alice")
        assert lane.turns.balance("alice", lane.clock()) > 0.9  # before: 0.6
    finally:
        lane.stop()
