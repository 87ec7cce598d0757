"""Two servers advertising one URL (atk45ha L2): told from the servers' reports (`others_at`),
refused at `serve`'s start (tests/integration/test_ha_same_address.py) and, for two started
together, said in the log and health (`address_error`) while this server takes no lease."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.server.ha import Leadership
from ledger.server.peers import others_at
from ledger.store.lease import Member


def _m(holder: str, address: str, seen_s_ago: float = 0.5) -> Member:
    return Member(holder, address, "standby", 10, seen_s_ago)


@pytest.mark.parametrize(
    ("case", "members", "want"),
    [
        ("alone at its address", [_m("me", "http://a"), _m("x", "http://b")], []),
        ("another reports there", [_m("me", "http://a"), _m("x", "http://a")], ["x"]),
        ("another was there, silent now (gone)", [_m("x", "http://a", 9.0)], []),
        ("itself only", [_m("me", "http://a")], []),
    ],
)
def test_others_at_this_server_s_address(case: str, members: list[Member], want: list[str]) -> None:
    assert others_at(members, "http://a", "me", 5.0) == want, case


class Lease:
    """A lease whose store answers; `members` as given; counts its takes."""

    epoch, lease_s, address, holder, node = 0, 2.0, "http://a", "me", None

    def __init__(self, members: list[Member]) -> None:
        self.listed, self.takes = members, 0

    def may_act(self) -> bool:
        return False

    def acquire(self) -> bool:
        self.takes += 1
        return False

    def leader(self) -> Any:
        return None

    def refusal(self, leader: Any) -> None:
        return None

    def report(self, *args: Any) -> None:
        pass

    def members(self) -> list[Member]:
        return self.listed

    def refused_older(self) -> list[Any]:
        return []

    def keep_bound(self, *args: Any) -> None:
        return None


def test_two_servers_started_together_at_one_address_say_so_and_take_no_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = Lease([_m("me", "http://a"), _m("x", "http://a")])
    ha = Leadership(lease)  # type: ignore[arg-type]
    ha._tick(report=True)
    ha._tick(report=True)
    assert ha.same_address is not None and "http://a (x)" in ha.same_address
    assert lease.takes == 1  # the first turn, before its report said so; none since
    assert caplog.text.count("another server reports at this server's address") == 1
    lease.listed = [_m("me", "http://a")]  # the other one stopped
    ha._tick(report=True)  # its report finds it alone ...
    assert ha.same_address is None and lease.takes == 1
    ha._tick()  # ... and the next turn tries to take the lease
    assert lease.takes == 2
