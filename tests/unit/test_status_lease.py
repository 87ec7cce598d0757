"""`gpuledger status`'s line on the leader's lease (ledger.cli.serve._lease_line)."""

from __future__ import annotations

import pytest

from ledger.cli.serve import _lease_line
from ledger.server.peers import REFUSED_ROLE, no_taker, older_words
from ledger.store.lease import Member
from schemas.api import Health


def health(lease_s: float | None, expires_in: float | None, renewed_ago: float | None,
           no_taker: str | None = None) -> Health:  # fmt: skip
    return Health(status="up", version="0", started_at=0.0, head=0, cycles=0, last_cycle_at=None,
                  last_cycle_s=None, projection_position=0, projection_lag=0, relay_position=None,
                  relay_lag=None, role="standby", leader="http://a:1", epoch=3, lease_s=lease_s,
                  lease_expires_in_s=expires_in, lease_renewed_s_ago=renewed_ago,
                  no_taker=no_taker)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "lease_s", "expires_in", "renewed_ago", "want"),
    [
        ("renewed in time", 6.0, 4.8, 1.2, "6 s, renewed 1.2 s ago, expires in 4.8 s"),
        (
            "renewal late",
            6.0,
            2.5,
            3.5,
            "6 s, renewed 3.5 s ago, expires in 2.5 s (late: the leader renews every 2.0 s)",
        ),
        (
            "ran out, nobody took it yet",
            5.0,
            -0.4,
            5.4,
            "5 s, renewed 5.4 s ago, expired 0.4 s ago: the leader does not renew it (down, paused "
            "or cut off from the store); a standby takes it at its next try",
        ),
        ("no lease seen", None, None, None, ""),
        ("released by a clean stop", 5.0, None, None, ""),
    ],
)
def test_lease_line(
    case: str,
    lease_s: float | None,
    expires_in: float | None,
    renewed_ago: float | None,
    want: str,
) -> None:
    assert _lease_line(health(lease_s, expires_in, renewed_ago)) == want, case


def test_an_expired_lease_nobody_would_take_is_said_so() -> None:
    """atk43ha F4: every standby refused, `status` said "a standby takes it at its next try"."""
    line = _lease_line(health(2.0, -7.0, 9.0, "every running standby is refused, ..."))
    assert line == (
        "2 s, renewed 9.0 s ago, expired 7.0 s ago: the leader does not renew it (down, paused "
        "or cut off from the store); no server takes it: every running standby is refused, ...; "
        "start one with the recorded settings (docs/ha.md)"
    )


def _m(address: str, role: str, seen_s_ago: float = 0.5) -> Member:
    return Member(f"h:{address}", address, role, 10, seen_s_ago)


@pytest.mark.parametrize(
    ("case", "members", "older", "want"),
    [
        ("a standby", [_m("a", "leader"), _m("b", "standby")], (), None),
        ("a refused standby beside one that is not",
         [_m("a", "leader"), _m("b", REFUSED_ROLE), _m("c", "standby")], (), None),
        ("every standby refused", [_m("a", "leader"), _m("b", REFUSED_ROLE), _m("c", REFUSED_ROLE)],
         (), "every running standby is refused, its settings are not the ones the store "
         "records (b, c: see its `settings` line)"),
        ("the only standby silent", [_m("a", "leader"), _m("b", "standby", 9.0)], (),
         "no standby runs"),
        ("the leader alone", [_m("a", "leader")], (), "no standby runs"),
        ("a standby of an earlier version", [_m("a", "leader"), _m("b", "standby")], ("h:b",),
         "the only running standbys are of an earlier version, which the store refuses"),
    ],
)  # fmt: skip
def test_no_taker(
    case: str, members: list[Member], older: tuple[str, ...], want: str | None
) -> None:
    assert no_taker(members, "a", frozenset(older), 5.0) == want, case


def test_an_earlier_version_s_server_is_listed_once_per_address() -> None:
    refused = [("http://a:1", "old:1", 4), ("http://a:1", "old:2", 4), ("http://b:1", "old:3", 1)]
    at, words = older_words(refused)
    assert at == frozenset({"old:1", "old:2", "old:3"})
    assert words == "http://a:1 (8), http://b:1 (1)"
    assert older_words([]) == (frozenset(), None)


def test_this_version_s_standby_where_an_earlier_one_was_refused_takes_the_lease() -> None:
    """atk44ha F4: after an in-place upgrade (this version's server started at the address
    where the store refused an earlier one), health `no_taker` and `status` said for an hour
    that only an earlier version stands by, while the standby took the lease on the leader's
    death. Refusals are by holder; an address where an unrefused server reports runs this
    version now."""
    refused = [("b", "oldhost:4242:deadbeef", 1), ("c", "oldhost:4343:beef", 2)]
    members = [
        _m("a", "leader"),
        _m("b", "standby"),
        Member("oldhost:4343:beef", "c", "standby", 1, 0.5),
    ]
    older, words = older_words(refused, members, 5.0)
    assert words == "c (2)"  # b is this version's now: its refusal is past
    assert older == frozenset({"oldhost:4343:beef"})
    assert no_taker(members, "a", older, 5.0) is None  # b takes it
    assert no_taker(members[:1] + members[2:], "a", older, 5.0) == (
        "the only running standbys are of an earlier version, which the store refuses"
    )
    silent = [_m("a", "leader"), _m("b", "standby", 9.0)]  # b gone silent: its refusal stands
    assert older_words(refused, silent, 5.0)[1] == "b (1), c (2)"
