"""The servers of a store as every server tells them (`status`, health): who leads now, who
would take the lease once the leader's runs out, which earlier-version servers the store
refuses. Pure: built from what the servers last reported (`ledger.store.lease.Member`)."""

from __future__ import annotations

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
    nor does one of an earlier version (`older`: the database refuses it). Before, `status`
    said "a standby takes it" with every standby refused, and nobody led (atk43ha F4)."""
    fresh = [m for m in members if m.seen_s_ago <= silent_s and m.address != leader]
    if any(m.role == "standby" and m.address not in older for m in fresh):
        return None
    refused = sorted({m.address for m in fresh if m.role == REFUSED_ROLE})
    if refused:
        return (f"every running standby is refused, its settings are not the ones the store "
                f"records ({', '.join(refused)}: see its `settings` line)")  # fmt: skip
    if any(m.address in older for m in fresh):
        return "the only running standbys are of an earlier version, which the store refuses"
    return "no standby runs"


def role_now(said: str, address: str, leader: str) -> str:
    """Pure: a server's role as the lease has it now: `said` is what it last reported."""
    if leader and address == leader:
        return "leader"
    return "ex-leader" if said == "leader" else said


def older_words(refused: list[tuple[str, int]]) -> tuple[frozenset[str], str | None]:
    """Pure: the addresses of the earlier-version servers the store refused (`refused`: one
    (address, count) per holder, a holder per start of one), and them in words, one entry per
    address with its count, e.g. "http://s2:8470 (12)" (None: none). Before, an address was
    listed once per start of it (atk43ha F4)."""
    counts: dict[str, int] = {}
    for address, n in refused:
        counts[address] = counts.get(address, 0) + n
    return frozenset(counts), ", ".join(f"{a} ({n})" for a, n in counts.items()) or None


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
