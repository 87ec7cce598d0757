"""Every read's answer is charged its bytes to its reader, kept answers too (atk47-29 F1: one
user re-reading a kept 1.25 MB queue page ~54 times a second, within her 50 requests a second
and her minute's 1,200 reads, slowed everyone else's pages 8-60x; a kept answer took no turn in
the read pool and nothing charged its bytes). A fake clock: the rule, not the machine."""

from __future__ import annotations

import pytest

from ledger.server import connections as cn
from ledger.server import meters
from ledger.server.readpool import ReadPool, sent_from_env
from schemas.errors import InvalidCommand, TooBusy

PAGE = 1_246_536
"""The bytes of the attacker's kept page: 1,000 queue rows."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _no_worker(fn: object) -> object:
    raise AssertionError("not used")


def _pool(clock: Clock) -> ReadPool:
    return ReadPool(lambda: None, _no_worker, clock=clock)  # type: ignore[arg-type,return-value]


def _read(pool: ReadPool, who: str, size: int) -> bool:
    """One request the server serves: admitted (a kept answer looked up, as `pages.kept`
    does), its answer of `size` bytes sent, then released. False: refused 429."""
    with cn._holding() as holds:
        try:
            with pool.admitted(who, read=True):
                pass  # a kept answer: nothing computed, no turn in a lane
        except TooBusy:
            return False
        holds.sent = size
    for release in holds.releases:
        release()
    return True


def test_kept_big_pages_looped_are_refused_past_the_persons_bytes_and_anothers_are_not() -> None:
    clock = Clock()
    pool = _pool(clock)
    answered = 0
    for _ in range(540):  # ten seconds at the attacker's ~54 a second
        answered += _read(pool, "mallory", PAGE)
        clock.now += 1 / 54
    # the burst (32 MiB: 27 pages) then 4 MiB a second (~3.4 pages): ~60, never 540; the old
    # code answered all 540 (only 1,200 a minute counted, not their bytes)
    burst = meters.READ_BYTES_BURST / PAGE
    rate = meters.READ_BYTES_PER_S / PAGE
    assert burst + 9 * rate <= answered <= burst + 10 * rate + 2
    assert pool.refused == 540 - answered
    # another person, meanwhile, is answered at once, every read
    for _ in range(20):
        assert _read(pool, "victim", 200_000)
        clock.now += 0.5
    # refused with a Retry-After that says when her allowance is back
    with pytest.raises(TooBusy) as err:
        for _ in range(100):
            with cn._holding() as holds, pool.admitted("mallory", read=True):
                holds.sent = PAGE
            for release in holds.releases:
                release()
    assert 1 <= int(err.value.fields["retry_after"]) <= 2  # type: ignore[call-overload]
    assert "MiB" in str(err.value)


def test_a_dashboard_refreshing_every_two_seconds_is_never_refused() -> None:
    """Its four parts (a 100-row queue page, teams, a job, the nodes: ~0.3 MB) for an hour."""
    clock = Clock()
    pool = _pool(clock)
    for _ in range(1800):
        for size in (125_000, 60_000, 20_000, 90_000):
            assert _read(pool, "alice", size)
            clock.now += 0.05
        clock.now += 1.8
    assert pool.refused == 0


def test_a_largest_page_is_answered_from_a_full_allowance_then_rests() -> None:
    clock = Clock()
    pool = _pool(clock)
    assert _read(pool, "alice", 32 << 20)  # one page of `pooled.MAX_PAGE_BYTES`
    assert _read(pool, "alice", 1)  # checked before, charged after: the allowance is at zero
    clock.now += 1.0
    assert _read(pool, "alice", 8 << 20)  # back above zero
    assert not _read(pool, "alice", 1)  # below it now: refused until 1 s later
    clock.now += 1.01
    assert _read(pool, "alice", 1)


def test_an_audit_query_is_not_charged_and_outside_a_request_nothing_is() -> None:
    clock = Clock()
    pool = _pool(clock)
    with cn._holding() as holds, pool.admitted("alice"):  # an audit query: its own limits
        holds.sent = 64 << 20
    for release in holds.releases:
        release()
    with pool.admitted("alice", read=True):  # no request served (in-process)
        pass
    assert pool.sent.level == {}


def test_the_allowance_is_set_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    got = sent_from_env()
    assert (got.per_s, got.burst) == (meters.READ_BYTES_PER_S, meters.READ_BYTES_BURST)
    monkeypatch.setenv(meters.READ_RATE_ENV, "1000")
    monkeypatch.setenv(meters.READ_BURST_ENV, "5000")
    got = sent_from_env()
    assert (got.per_s, got.burst) == (1000.0, 5000.0)
    monkeypatch.setenv(meters.READ_RATE_ENV, "-1")
    with pytest.raises(InvalidCommand, match=meters.READ_RATE_ENV):
        sent_from_env()
