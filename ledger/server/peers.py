"""The servers of a store as every server tells them (`status`, health): who leads now, who
would take the lease once the leader's runs out, which earlier-version servers the store
refuses. Pure: built from what the servers last reported (`ledger.store.lease.Member`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ledger.store.lease import Member
from schemas import api

REFUSED_ROLE = "refused"
"""The role a standby that takes no lease reports (its settings are not the store's:
`Leadership.refused`), so that every server can say nobody would take the lease over."""


def no_taker(
    members: list[Member], leader: str, older: frozenset[str], silent_s: float
) -> str | None:
    """Pure: why none of the servers `members` (as they last reported) would take the lease
    once the leader's (at `leader`) runs out, in words; None when a standby that reported
    within `silent_s` would. A standby refused by its settings (`REFUSED_ROLE`) takes none,
    nor does one of an earlier version (`older`: the holders the database refused; by holder,
    not address: this version's server started where an earlier one was refused, as an
    in-place upgrade does, was counted as it for an hour, atk44ha F4). Before, `status`
    said "a standby takes it" with every standby refused, and nobody led (atk43ha F4)."""
    fresh = [m for m in members if m.seen_s_ago <= silent_s and m.address != leader]
    if any(m.role == "standby" and m.holder not in older for m in fresh):
        return None
    refused = sorted({m.address for m in fresh if m.role == REFUSED_ROLE})
    if refused:
        return (f"every running standby is refused, its settings are not the ones the store "
                f"records ({', '.join(refused)}: see its `settings` line)")  # fmt: skip
    if any(m.holder in older for m in fresh):
        return "the only running standbys are of an earlier version, which the store refuses"
    return "no standby runs"


def role_now(said: str, address: str, leader: str) -> str:
    """Pure: a server's role as the lease has it now: `said` is what it last reported."""
    if leader and address == leader:
        return "leader"
    return "ex-leader" if said == "leader" else said


def older_words(
    refused: list[tuple[str, str, int]],
    members: Sequence[Member] = (),
    silent_s: float = 5.0,
) -> tuple[frozenset[str], str | None]:
    """Pure: the holders of the earlier-version servers the store refused (`refused`: one
    (address, holder, count) per holder, a holder per start of one), and their addresses in
    words, one entry per address with its count, e.g. "http://s2:8470 (12)" (None: none).
    An address where a server the store did not refuse reported within `silent_s`
    (`members`) runs this version now (an in-place upgrade): the refusals there are past, not
    named (they were, for an hour: atk44ha F4). Before, an address was listed once per start
    of it (atk43ha F4)."""
    holders = {h for _, h, _ in refused}
    upgraded = {m.address for m in members if m.seen_s_ago <= silent_s and m.holder not in holders}
    counts: dict[str, int] = {}
    for address, _, n in refused:
        if address not in upgraded:
            counts[address] = counts.get(address, 0) + n
    older = frozenset(h for a, h, _ in refused if a not in upgraded)
    return older, ", ".join(f"{a} ({n})" for a, n in counts.items()) or None


def server_states(members: list[Member], leader: str, head: int) -> list[api.ServerState]:
    """Pure: every server of `members` with its lag behind `head`. Only the server that holds
    the lease now (`leader`) is called leader: one that said so last but holds it no more
    (dead, paused, cut off, deposed) is an `ex-leader` (atk33-28 F11: two "leader" rows, or one
    under "leader none")."""
    return [
        api.ServerState(
            address=m.address,
            role=role_now(m.role, m.address, leader),
            position=m.position,
            lag=max(0, head - m.position),
            seen_s_ago=round(m.seen_s_ago, 3),
        )
        for m in members
    ]


Key = frozenset[tuple[str, int]]
"""What server an address names (`address_key`): the (IP address, port) pairs it reaches."""


def others_at(
    members: Sequence[Member],
    address: str,
    holder: str,
    silent_s: float,
    key: Callable[[str], Key] | None = None,
) -> list[str]:
    """Pure (given `key`): the other servers (holders) that reported within `silent_s` at
    `address`, this server's own (`holder`): two servers advertising one URL (atk45ha L2).
    Clients and agents reach one of them at random, a standby forwards writes to "the leader"
    that may be the other, and `status` shows one row for both; nothing said so before.
    `key`: what server an address names (`address_key`), so that two texts of one address are
    one (`http://H:P/`, `HTTP://H:P`, `http://localhost:P` beside `http://127.0.0.1:P` were
    accepted, and the one that led took no write: atk46-ha F3); None: the text."""
    named = key or (lambda a: frozenset({(a, 0)}))
    mine = named(address)
    live = [m for m in members if m.seen_s_ago <= silent_s and m.holder != holder]
    return sorted(m.holder for m in live if named(m.address) & mine)


def address_key(address: str, resolve: Callable[[str, int], Sequence[str]]) -> Key:
    """Pure (given `resolve`: a host and port's IP addresses, none when it does not resolve):
    what server the advertised `address` names: the IP addresses its host resolves to, with its
    port (the scheme's default when it names none); the scheme's case, the path and a trailing
    `/` do not count. An address that is no `http(s)://` URL of a host (`unix:PATH`), or
    whose host does not resolve, is its text (the host lowercased, no trailing `/`)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(address.strip())
        port = parts.port
    except ValueError:  # a port that is no number: the text
        return frozenset({(address.strip().rstrip("/"), 0)})
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        return frozenset({(address.strip().rstrip("/"), 0)})
    port = port if port is not None else (443 if scheme == "https" else 80)
    return frozenset((ip, port) for ip in (resolve(host, port) or [host]))


def same_address_words(address: str, holders: Sequence[str]) -> str:
    """Pure: why two servers at one address is refused, in one line."""
    return (f"another server reports at this server's address {address} ({', '.join(holders)}): "
            "each server needs its own --advertise (the URL the clients, the agents and the "
            "other servers reach it at)")  # fmt: skip
