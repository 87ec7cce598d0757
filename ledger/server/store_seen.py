"""What a server of several says about its own link to the store (docs/ha.md, "A server's own
link to the store"; atk45ha F3): a link that drops packets fails one lease statement in a few,
and the next one answers. Before, health cleared `store_error` at the first statement that
answered, so it was almost never seen; `status` took the lease row this server had last read
(seconds old while its statements hung) for a leader that stopped renewing; and a standby that
could not read the log answered reads from what it last folded, saying nothing. Now:

- `store_trouble`: health's `store_error` says any failed lease statement for one lease after
  it, and a statement that has had no answer for a third of the lease (one renewal);
- `stale_s`: a standby whose last read of the log is older than one lease marks every read it
  answers (`X-Gpuledger-Stale`, seconds), as Consul's followers say their last contact
  (`X-Consul-LastContact`) rather than refusing: while the store is away every server is
  behind, and reads go on (the issue's "PostgreSQL down: keep serving reads"); the CLI says it
  in one line on stderr. A leader's reads are never stale: it is the only writer while its
  lease runs, and it stops leading when the lease does.

Pure: `now` and the times are parameters (monotonic seconds)."""

from __future__ import annotations

STALE_HEADER = "x-gpuledger-stale"
"""On a read a standby answered from a read of the log older than one lease: how old (s)."""


def store_trouble(
    now: float,
    unreachable: str | None,
    erred: tuple[float, str] | None,
    asking_since: float | None,
    lease_s: float,
) -> str | None:
    """Pure: health's `store_error`: why the store does not answer the lease (`unreachable`,
    the last statement failed), else a lease statement that failed (`erred`: when, why) less
    than one lease ago, else one that has had no answer for a third of the lease
    (`asking_since`: when it was sent); None when the link answers."""
    if unreachable is not None:
        return unreachable
    if asking_since is not None and now - asking_since > lease_s / 3:
        return f"a lease statement has had no answer for {now - asking_since:.1f} s"
    if erred is not None and 0 <= now - erred[0] < lease_s:
        return f"a lease statement failed {now - erred[0]:.1f} s ago: {erred[1]}"
    return None


def stale_s(now: float, read_at: float, acting: bool, lease_s: float) -> float | None:
    """Pure: how old (s) the log a server answers reads from may be, when more than one lease
    (`read_at`: its last read of the log that answered; 0: none yet); None when fresh, or
    when it leads (`acting`)."""
    if acting or not read_at:
        return None
    age = now - read_at
    return age if age > lease_s else None


def unelected(
    now: float, row_left: float | None, asking_since: float | None, answer_s: float
) -> str | None:
    """Pure: why a standby takes no write while it would wait for an election, when its store
    does not answer it: no lease runs as it last read the row (`row_left`, seconds until the
    leader's lease expires moved on by its own clock: negative, it ran out; None: no leader,
    or one that released the lease) and the lease statement it sent at `asking_since` has had
    no answer for a statement's time (`answer_s`). Nobody takes the lease without the store,
    so no election is under way as far as it knows: it says the store is away (before, it held
    a write `TAKEOVER_WAIT_S` as for an election, then called itself "a standby", and health
    named no reason for a third of the lease: s61). None otherwise (a live leader, the
    statement answered, or not yet long unanswered)."""
    if asking_since is None or (row_left is not None and row_left > 0):
        return None
    if now - asking_since < answer_s:
        return None
    ran_out = (
        "no server holds the lease as this server last read it"
        if row_left is None
        else f"the leader's lease as this server last read it ran out {-row_left:.1f} s ago"
    )
    return f"a lease statement has had no answer for {now - asking_since:.1f} s; {ran_out}"


def lapsed(
    now: float, deadline: float, renewing: float | None, answered_at: float, answer_s: float
) -> str | None:
    """Pure: why a server whose own lease ran out takes no write, when its store does not answer
    it: the lease ran out by its own clock (`deadline`, `Lease.deadline`: 0 when it holds none,
    lost it to a renewal that found another holder, or handed it over), the renewal sent at
    `renewing` has had no answer for a statement's time (`answer_s`; None: the last renewal
    answered), and no lease statement answered after the deadline (`answered_at`). None
    otherwise: a leader paused or starved past its lease reads the row at its next turn and
    names the leader, or takes the lease again."""
    if not deadline or now < deadline or renewing is None or answered_at >= deadline:
        return None
    if now - renewing < answer_s:
        return None
    return (
        f"its renewal of this server's lease has had no answer for {now - renewing:.1f} s; "
        f"the lease ran out {now - deadline:.1f} s ago"
    )
