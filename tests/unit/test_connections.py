"""The connections' limits, pure parts (docs/security.md, row T23): who holds which
connections (`Tally`), when a send has stalled (`Progress`), the settings (`limits_from_env`),
and a request's read admission held until its answer is sent (`ReadPool.admitted`)."""

from __future__ import annotations

import pytest

from ledger.server import connections as cn
from ledger.server.readpool import ReadPool
from schemas.errors import InvalidCommand, TooBusy


def test_the_server_cap_counts_every_connection_and_frees_a_closed_one() -> None:
    t = cn.Tally(cn.Limits(max_connections=2))
    assert t.opened(1) and t.opened(2)
    assert not t.opened(3)  # answered 503, not counted
    t.closed(1)
    assert t.opened(3) and t.open == {2, 3}


def test_a_persons_cap_refuses_their_next_connection_and_serves_another_person() -> None:
    t = cn.Tally(cn.Limits(per_person=2))
    for conn in (1, 2, 3, 4):
        t.opened(conn)
    assert t.claim(1, "alice") and t.claim(2, "alice")
    assert t.claim(1, "alice")  # a connection's next request: already hers
    assert not t.claim(3, "alice")  # the third: refused
    assert t.owner.get(3) is None
    assert t.claim(3, "carol")  # another person is served
    t.closed(2)
    assert t.claim(4, "alice") and t.people == {"alice": {1, 4}, "carol": {3}}


def test_a_connection_passed_to_another_caller_counts_for_them_alone() -> None:
    t = cn.Tally(cn.Limits(per_person=1))
    t.opened(1)
    assert t.claim(1, "alice") and t.claim(1, "bob")
    assert t.people == {"bob": {1}}
    t.closed(1)
    assert t.people == {} and t.owner == {}


@pytest.mark.parametrize(
    ("case", "steps", "want_stalled"),
    [
        ("nothing buffered is never stalled", [(100, 0, 0.0), (100, 0, 60.0)], False),
        ("bytes leaving keep it alive", [(100, 90, 0.0), (100, 50, 6.0), (100, 10, 12.0)], False),
        ("no byte leaves for the limit", [(100, 90, 0.0), (100, 90, 5.0), (100, 90, 10.0)], True),
        ("not yet at the limit", [(100, 90, 0.0), (100, 90, 9.9)], False),
        # more written while the client reads nothing: still nothing left
        ("writes that pile up are no progress", [(100, 90, 0.0), (200, 190, 10.0)], True),
        (
            "drained, then waiting anew",
            [(100, 90, 0.0), (100, 0, 9.0), (200, 100, 10.0), (200, 100, 19.0)],
            False,
        ),
        (
            "drained, then stalled anew",
            [(100, 90, 0.0), (100, 0, 9.0), (200, 100, 10.0), (200, 100, 20.0)],
            True,
        ),
    ],
)
def test_a_send_is_stalled_when_no_byte_leaves_for_the_limit(
    case: str, steps: list[tuple[int, int, float]], want_stalled: bool
) -> None:
    p = cn.Progress(stall_s=10.0)
    got = [p.observe(written, buffered, now) for written, buffered, now in steps]
    assert got[-1] is want_stalled, case
    assert not any(got[:-1]), case


def test_the_settings_come_from_the_environment_and_bad_ones_are_one_line() -> None:
    assert cn.limits_from_env({}) == cn.Limits(1024, 16, 10.0)
    got = cn.limits_from_env({cn.MAX_CONNECTIONS_ENV: "50", cn.PER_PERSON_ENV: "3",
                              cn.SEND_STALL_ENV: "2.5"})  # fmt: skip
    assert got == cn.Limits(50, 3, 2.5) and got.check_s == 0.625
    for name, bad in ((cn.SEND_STALL_ENV, "0"), (cn.PER_PERSON_ENV, "x"),
                      (cn.MAX_CONNECTIONS_ENV, "-1")):  # fmt: skip
        with pytest.raises(InvalidCommand, match=name):
            cn.limits_from_env({name: bad})


def _pool() -> ReadPool:
    async def on_worker(fn: object) -> object:
        raise AssertionError("not used")

    return ReadPool(lambda: None, on_worker, per_caller=2)  # type: ignore[arg-type,return-value]


def test_a_read_counts_against_its_person_until_its_answer_is_sent() -> None:
    pool = _pool()
    with cn._holding() as holds:
        with pool.admitted("alice", read=True):
            pass
        assert pool._running == {"alice": 1}  # computed, not sent: still hers
    with (
        pool.admitted("alice", read=True),  # her second at once
        pytest.raises(TooBusy),
        pool.admitted("alice", read=True),  # a third
    ):
        pass
    for release in holds.releases:  # sent
        release()
    assert pool._running == {}


def test_a_request_is_one_read_however_many_parts_of_it_are_admitted() -> None:
    pool = _pool()
    with cn._holding() as holds:
        for _ in range(3):  # a kept answer looked up, then computed, ...
            with pool.admitted("alice", read=True):
                pass
        assert pool._running == {"alice": 1}
        assert len(pool._recent["alice\0"]) == 1  # one of her minute's reads
    for release in holds.releases:
        release()
    assert pool._running == {}


def test_outside_a_served_request_a_read_is_released_when_it_ends() -> None:
    pool = _pool()
    with pool.admitted("alice", read=True):
        assert pool._running == {"alice": 1}
    assert pool._running == {}
