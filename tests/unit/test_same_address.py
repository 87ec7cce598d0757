"""Two servers advertising one URL (atk45ha L2): told from the servers' reports (`others_at`),
refused at `serve`'s start (tests/integration/test_ha_same_address.py) and, for two started
together, said in the log and health (`address_error`) while this server takes no lease."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from ledger.server.ha import Leadership, resolved
from ledger.server.peers import address_key, others_at
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


def _resolve(host: str, port: int) -> list[str]:
    """A resolver as getaddrinfo answers on a host whose localhost is both families."""
    return {"localhost": ["127.0.0.1", "::1"], "127.0.0.1": ["127.0.0.1"], "::1": ["::1"],
            "h1.example": ["10.0.0.1"], "h2.example": ["10.0.0.2"]}.get(host, [])  # fmt: skip


@pytest.mark.parametrize(
    "other",
    [
        "http://127.0.0.1:8470/",
        "HTTP://127.0.0.1:8470",
        "http://localhost:8470",
        "https://127.0.0.1:8470",
        "http://127.0.0.1:8470/api/",
        " http://127.0.0.1:8470 ",
    ],
)
def test_another_text_of_one_address_is_the_same_server(other: str) -> None:
    """atk46-ha F3: the check compared the text: each of these beside `http://127.0.0.1:8470`
    was accepted, and when it led every write went to the other server, a standby."""
    key = functools.partial(address_key, resolve=_resolve)
    members = [_m("me", "http://127.0.0.1:8470"), _m("x", other)]
    assert others_at(members, "http://127.0.0.1:8470", "me", 5.0, key) == ["x"], other
    assert others_at(members, other, "x", 5.0, key) == ["me"], other


@pytest.mark.parametrize(
    ("mine", "other"),
    [
        ("http://127.0.0.1:8470", "http://127.0.0.1:8471"),
        ("http://h1.example:8470", "http://h2.example:8470"),
        ("http://127.0.0.1", "https://127.0.0.1"),  # ports 80 and 443
        ("unix:/srv/a/gpuledger.sock", "unix:/srv/b/gpuledger.sock"),
        ("http://nowhere.invalid:8470", "http://elsewhere.invalid:8470"),  # not resolved: text
    ],
)
def test_two_addresses_are_two_servers(mine: str, other: str) -> None:
    key = functools.partial(address_key, resolve=_resolve)
    assert others_at([_m("me", mine), _m("x", other)], mine, "me", 5.0, key) == []


def test_the_default_port_and_a_host_s_case_are_the_address_s() -> None:
    key = functools.partial(address_key, resolve=_resolve)
    assert key("http://H1.EXAMPLE") == key("http://h1.example:80/") == {("10.0.0.1", 80)}
    assert key("https://h1.example") == {("10.0.0.1", 443)}
    assert key("http://nowhere.invalid:8470/") == {("nowhere.invalid", 8470)}


def test_localhost_resolves_to_the_loopback_address() -> None:
    """The real resolver (getaddrinfo) says what the leadership compares."""
    assert "127.0.0.1" in resolved("localhost", 8470)
    assert resolved("127.0.0.1", 8470) == ["127.0.0.1"]
    assert resolved("no-such-host.invalid", 8470) == []


def test_a_server_reporting_at_another_text_of_this_address_is_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = Lease([_m("me", "http://127.0.0.1:8470"), _m("x", "http://localhost:8470/")])
    lease.address = "http://127.0.0.1:8470"
    ha = Leadership(lease)  # type: ignore[arg-type]
    ha._tick(report=True)
    assert ha.same_address is not None and "(x)" in ha.same_address
