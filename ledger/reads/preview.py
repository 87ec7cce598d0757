"""Previews: what the dispatcher would decide now, read without appending anything.

The queue (dispatch order, reasons, estimated starts) and `priority` (the sort key part by
part, like `sprio`). Each function takes a `LiveState` and a caught-up projection `Store` and an
explicit `now`; it returns the view Structs of `schemas.views`. `explain` (why a job waits, or
its history told in words) is `ledger.reads.explain_job`; the rest of the read layer is
`ledger.reads.layer`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, Literal, NamedTuple

from ledger.dispatch.ordering import jobs_of, key_at
from ledger.reads.estimates import (
    NOTHING_PLACED,
    blocked_keys,
    estimated_starts,
    placing,
)
from ledger.reads.explain import protected_note
from ledger.reads.keyparts import key_parts as key_parts
from ledger.reads.layer import utilisation
from ledger.reads.stopping import kill_words, stopping_note
from schemas import views as v
from schemas.bounds import job_grace
from schemas.errors import InvalidCommand, UnknownEntity
from schemas.units import format_duration, shorten, span, when

if TYPE_CHECKING:  # a read loads what it uses: the dispatcher only when it previews
    from ledger.core.jobs import Blocked
    from ledger.core.state import Job, State, StoppedRun
    from ledger.cycle.dispatcher import Carried, LiveState
    from ledger.dispatch.decision import Decision
    from ledger.dispatch.engine import Unplaceable
    from ledger.dispatch.ordering import SortKey
    from ledger.dispatch.policy import Policy
    from ledger.dispatch.snapshot import PendingJob, Snapshot
    from projections.store import Store


def live(
    ledger: LiveState,
    store: Store,
    policy: Policy,
    now: float,
    foreign: Mapping[str, frozenset[int]] | None = None,
    longest_s: float | None = None,
) -> tuple[Snapshot, Decision]:
    """What the dispatcher would decide at `now` (nothing is appended), with the GPUs `foreign`
    work holds (node -> indices, as the service last observed its engine) busy, as the
    dispatcher counts them, and the jobs whose time limit is over `longest_s` (the engine's
    longest, as last observed: `too_long_waits`) left out, as it leaves them out."""
    snapshot, decision, _ = live_carried(ledger, store, policy, now, foreign, longest_s=longest_s)
    return snapshot, decision


def live_carried(
    ledger: LiveState,
    store: Store,
    policy: Policy,
    now: float,
    foreign: Mapping[str, frozenset[int]] | None = None,
    carried: Carried | None = None,
    *,
    longest_s: float | None = None,
) -> tuple[Snapshot, Decision, Carried]:
    """`live`, made from what an earlier one handed on (`carried`; None: nothing), and what to
    hand the next (`ledger.cycle.dispatcher.preview_carried`: the same answer, byte for byte,
    with only what changed since looked at again)."""
    from ledger.cycle.dispatcher import StoreRanks, preview_carried

    util = utilisation(store, ledger.state)
    return preview_carried(
        ledger, StoreRanks(store), policy, now, carried, util.low_since, unavailable=foreign,
        longest_s=longest_s,
    )  # fmt: skip


TOO_LONG: Final = "PARTITION_TIME_LIMIT"
"""The wait code of a job whose time limit is over the longest its engine starts (Slurm's
reason for such a job, `PartitionTimeLimit`)."""


NO_LIMIT: Final = (
    "it has no time limit (it was submitted when no MaxTime was recorded: while the partition "
    "had none, or before a version that gives such a job MaxTime's limit) and the partition's "
    "MaxTime is {}: Slurm would stop it there, so it is not placed until an admin makes MaxTime "
    "UNLIMITED (or it is cancelled and submitted again: it then takes its limit from MaxTime)"
)
"""Why a job with no time limit waits on a partition with a MaxTime (atk61-slurm F3): one
submitted while a MaxTime is recorded takes its limit from it (`JobSubmitted.max_time_s`), so
only one submitted before waits so: while no MaxTime was recorded, or before s62 (atk62-slurm
F3: the reason said "while the partition had no MaxTime" of jobs an older version kept waiting
under a MaxTime it had seen)."""


def too_long_waits(state: State, longest_s: float | None) -> dict[int, Blocked]:
    """Pure: the pending (not held) jobs `too_long` for `longest_s` (the engine's longest:
    Slurm's partition `MaxTime`, as the service last recorded it; None: no limit), by job id,
    with why: a time limit over it, in Slurm's whole minutes, or a limit, grace and minute that
    do not fit in it (atk62b G2: a MaxTime lowered after the submit). The dispatcher leaves them
    out of its snapshot (`ledger.cycle.inputs.too_long`): they are never placed, nor room made
    for them, until the limit is raised, so no start is estimated (atk60-slurm F4: `queue` said
    `NEXT_CYCLE` with a start 25 s ahead, `explain` "placed in the next cycle", for as long as
    it waited)."""
    from ledger.core.jobs import TAKEN_MARGIN_S, Blocked, needs_s
    from ledger.cycle.inputs import slurm_minutes, too_long

    if longest_s is None:
        return {}
    out: dict[int, Blocked] = {}
    for job_id in sorted(state.active):
        job = state.jobs[job_id]
        limit = job.spec.time_limit_s
        grace = job_grace(job.spec.grace_s, state.grace_s)
        if job.status != "pending" or job.held or not too_long(limit, grace, longest_s):
            continue
        if limit is None:  # Slurm would stop it at MaxTime (atk61-slurm F3)
            out[job_id] = Blocked(TOO_LONG, NO_LIMIT.format(format_duration(longest_s)))
            continue
        minutes = slurm_minutes(limit)
        counted = "" if minutes * 60 == limit else f", {minutes}m in Slurm's whole minutes"
        taken = job.spec.max_time_s
        was = "" if taken is None else f", taken from its MaxTime of {format_duration(taken)}"
        again = "" if taken is None else " (or it is submitted again: it takes today's MaxTime)"
        longest = format_duration(longest_s)
        if minutes * 60 > longest_s:
            why = (f"its time limit ({format_duration(limit)}{counted}{was}) is over the "
                   f"partition's MaxTime ({longest}): Slurm would never start it "
                   "(PartitionTimeLimit)")  # fmt: skip
        else:  # Slurm would start it, and stop it before the ledger's SIGKILL (atk62b G2)
            # in minutes and seconds as MaxTime is said ("need 270s; MaxTime is 3m": atk63 L1)
            need = int(needs_s(limit, grace))
            needs = format_duration(need) if need % 60 == 0 or need < 60 else span(need)
            # the service's grace, which may have changed since the submit (atk63 L2)
            whose = ", the service's" if job.spec.grace_s is None else ""
            why = (f"its time limit ({format_duration(limit)}{was}), its grace "
                   f"({format_duration(grace)}{whose}) and a minute need {needs}; the "
                   f"partition's MaxTime is {longest}: Slurm's TIMEOUT would come before the "
                   "ledger's SIGKILL")  # fmt: skip
            fits = int(longest_s - limit - TAKEN_MARGIN_S)
            if taken is None and fits >= 0:
                grace_fits = format_duration(fits)
                again = f" (or it is submitted again with a --grace of at most {grace_fits})"
        out[job_id] = Blocked(
            TOO_LONG, f"{why}, so it is not placed until an admin raises MaxTime{again}"
        )
    return out


def held_waits(state: State, longest_s: float | None) -> dict[int, Blocked]:
    """Pure: every pending job the dispatcher does not consider yet, by job id, with why: a
    dependency or an array's limit (`jobs.blocked_now`), a time limit over the engine's longest
    (`too_long_waits`)."""
    from ledger.core.jobs import blocked_now

    return too_long_waits(state, longest_s) | blocked_now(state)


_RAW_TIME = re.compile(r"\bt=(\d+(?:\.\d+)?(?:e\+?\d+)?)")


def readable(text: str, until: float | None = None) -> str:
    """Pure: the dispatcher's reasons with their raw `t=1.76723e+09` times as UTC times (the
    exact `until` when the wait has one: the raw text keeps only six digits).

    Recorded decisions keep the dispatcher's text byte for byte (replay compares it); reads show
    times people can read."""
    return _RAW_TIME.sub(lambda m: when(until if until is not None else float(m.group(1))), text)


def _reason(
    wait: Unplaceable,
    policy: Policy,
    snapshot: Snapshot,
    job: PendingJob | None,
    now: float,
    state: State,
) -> str:
    """A waiting job's reason as reads show it: readable times, what protects the victims a
    preemption would take (`protected_note`) and the stopping GPUs it waits for
    (`stopping_note`; the recorded reason is the dispatcher's)."""
    return (
        readable(wait.reason, wait.until)
        + protected_note(policy, snapshot, job, wait, now)
        + stopping_note(state, snapshot, job, wait)
    )


def _under(account: str, root: str | None, user: str | None) -> bool:
    """Pure: whether a job of `account` by `user` is in `root`'s subtree: a job's place in the
    tree is its account and, below it, its user's node (`-A prog/proj/alice`), as the
    preemption report reads it (`projections.history.preemption_report`)."""
    return root is None or f"{account}/{user or ''}/".startswith(root.rstrip("/") + "/")


def known_account(state: State, account: str | None) -> None:
    """Pure: UnknownEntity when the filter's `account` names no node of the budget tree (a
    closed one counts: its jobs stay), as the preemption report answers; not an empty page."""
    if account is not None and account.rstrip("/") not in state.accounts:
        raise UnknownEntity(
            f"no account {shorten(account)}", hint="see `gpuledger account tree`", param="account"
        )


def queue(
    ledger: LiveState,
    store: Store,
    policy: Policy,
    now: float,
    f: v.QueueFilter,
    preview: tuple[Snapshot, Decision] | None = None,
    longest_s: float | None = None,
) -> list[v.QueueRow]:
    """Pending (and held) work in dispatch order with its sort key, why it waits and an
    estimated start, filtered like squeue (-u, -A, --state), the first `f.limit` rows. `preview`:
    `live(...)` at `now` when the caller already holds it (of the same `longest_s`: the
    engine's longest time limit, as the service last observed it, `too_long_waits`).

    Only the rows shown are built (their reason text, their estimated start, which needs the
    jobs ahead of them alone): at 10k pending a page of 50 costs what 50 rows cost. No preview
    is decided when no schedulable pending job passes the filter (`--state held`, an empty
    queue): its rows would be none."""
    state = ledger.state
    known_account(state, f.account)
    rows: list[v.QueueRow] = []
    held: list[tuple[Snapshot, Decision]] = [preview] if preview is not None else []

    def preview_of() -> tuple[Snapshot, Decision]:
        if not held:
            held.append(live(ledger, store, policy, now, longest_s=longest_s))
        return held[0]

    if f.state in QUEUED and (preview is not None or _any_pending(state, f)):
        snapshot, decision = preview_of()
        pending = {p.job_id: p for p in snapshot.pending}
        shown: list[tuple[int, SortKey, PendingJob]] = []
        for i, (key, queued) in enumerate(decision.order):
            if len(shown) >= f.limit:
                break
            p = pending[queued.job_id]
            if (f.user and p.user != f.user) or not _under(p.account, f.account, p.user):
                continue
            shown.append((i, key, p))
        through = shown[-1][2].job_id if shown else None
        starts = _starts(state, snapshot, decision, policy, now, through) if shown else {}
        waiting = decision.waiting
        for i, key, p in shown:
            wait = waiting.get(p.job_id)
            rows.append(
                v.QueueRow(
                    order=i + 1, job_id=p.job_id, account=p.account, user=p.user, gpus=p.gpus,
                    funded=p.funded, debug=p.debug, state="pending", sort_key=list(key),
                    code=wait.code if wait else "NEXT_CYCLE",
                    reason=_reason(wait, policy, snapshot, p, now, state) if wait else _next(state),
                    submitted_at=p.submitted_at, waiting_s=max(0.0, now - p.submitted_at),
                    estimated_start_at=starts.get(p.job_id), time_limit_s=p.time_limit_s,
                )
            )  # fmt: skip
    if f.state in QUEUED:
        room = f.limit - len(rows)
        rows += _blocked_rows(state, f, now, room, preview_of, policy, longest_s)
    if f.state in ("held", "queued", "all") and len(rows) < f.limit:
        for job in sorted(state.jobs.values(), key=lambda j: j.job_id):
            if len(rows) >= f.limit:
                break
            if not job.held or job.status != "pending":
                continue
            s = job.spec
            if (f.user and s.user != f.user) or not _under(s.account, f.account, s.user):
                continue
            rows.append(
                v.QueueRow(
                    order=None, job_id=s.job_id, account=s.account, user=s.user, gpus=s.gpus,
                    funded=job.funded, debug=s.debug, state="held", sort_key=[], code="HELD",
                    reason="held: `gpuledger release` lets it be scheduled",
                    submitted_at=s.at, waiting_s=max(0.0, now - s.at), estimated_start_at=None,
                    time_limit_s=s.time_limit_s,
                )
            )  # fmt: skip
    if f.state in ("running", "all") and len(rows) < f.limit:
        rows += _holding_rows(state, f, now, f.limit - len(rows))
    return rows[: f.limit]


QUEUED = ("pending", "queued", "all")
"""The states whose rows include the pending jobs (`queued`: pending and held; `all`: those
and the running ones)."""

QUEUE_SORTS = ("order", "job", "user", "account", "gpus", "state", "code", "submitted")
"""The columns a queue page sorts by (`order`: dispatch order, then blocked, then held)."""


class QueuePage(NamedTuple):
    total: int
    """The jobs passing the filter (and `code`), all of them, not only this page's."""
    codes: dict[str, int]
    """The jobs passing the filter by code (before `code` applies)."""
    rows: list[v.QueueRow]


def queue_page(
    ledger: LiveState,
    store: Store,
    policy: Policy,
    now: float,
    f: v.QueueFilter,
    *,
    code: str | None = None,
    sort: str = "order",
    descending: bool = False,
    offset: int = 0,
    preview: tuple[Snapshot, Decision] | None = None,
    held: HeldBack | None = None,
    kept: Callable[[Callable[[], Starts]], Starts] | None = None,
    longest_s: float | None = None,
) -> QueuePage:
    """The queue `queue` gives (the same rows, the same filters), sorted by one column, the
    `f.limit` rows from `offset`, with the true total. The whole queue is sorted on what every
    job has at hand (account, user, GPUs, code, submit time); only the page's rows are built in
    full (their reason text, their estimated start: which needs the jobs ahead of the last one
    shown in dispatch order, alone). `held`: `held_back(...)` of the same state and
    snapshot when the caller has it (the server's, once per position); of the jobs it holds
    only the page's rows are built (atk50-29 F9). `kept(compute)`: the whole queue's estimated
    starts (`compute()`), kept by the caller with the preview (the server's: once per
    position), used for a page that shows a held-back job or a pending one past the first
    `SHALLOW` in dispatch order (each such page computed them again: 0.1-0.3 s of CPU at 1M
    events, atk51-29 F5). `longest_s`: the engine's longest time limit, as the service last
    observed it (`too_long_waits`), of `preview` and `held` too when given."""
    if sort not in QUEUE_SORTS:
        raise InvalidCommand(f"no such column to sort by: {sort!r}", hint=", ".join(QUEUE_SORTS))
    state = ledger.state
    known_account(state, f.account)
    entries: list[tuple[int | None, int, str, str, int, str, str, float]] = []
    snapshot: Snapshot | None = None
    decision: Decision | None = None
    waits_at: list[Unplaceable | None] | None = None
    if f.state in QUEUED and (preview is not None or _any_pending(state, f)):
        snapshot, decision = preview or live(ledger, store, policy, now, longest_s=longest_s)
        pending = {p.job_id: p for p in snapshot.pending}
        # each place's wait read from the decision's runs, the jobs without their sort keys:
        # of the whole queue the page needs its order, codes and counts, nothing else built
        waits_at = decision.waiting.at()
        for i, job in enumerate(jobs_of(decision.order)):
            p = pending[job.job_id]
            if (f.user and p.user != f.user) or not _under(p.account, f.account, p.user):
                continue
            wait = waits_at[i]
            kind = wait.code if wait else "NEXT_CYCLE"
            entries.append((i + 1, p.job_id, p.user, p.account, p.gpus, "pending", kind,
                            p.submitted_at))  # fmt: skip
    # the jobs a dependency or an array's limit holds: only those on the page are built, their
    # estimates from the whole queue's (2,000 blocked array tasks built every one, and those
    # estimates, on every page: 130 -> 240 ms a page at 10k pending, atk50-29 F9)
    others: dict[int, v.QueueRow | None] = {}
    waits: dict[int, Blocked] = {}
    every_wait: Mapping[int, Blocked] = {}
    if f.state in QUEUED:
        every_wait = held.waits if held is not None else held_waits(state, longest_s)
        for job_id, why in sorted(every_wait.items()):
            s = state.jobs[job_id].spec
            if (f.user and s.user != f.user) or not _under(s.account, f.account, s.user):
                continue
            waits[job_id] = why
            others[job_id] = None
            entries.append((None, job_id, s.user, s.account, s.gpus, "pending", why.code, s.at))
    if f.state in ("held", "queued", "all"):
        only_held = v.QueueFilter(user=f.user, account=f.account, state="held", limit=100_000)
        others |= {r.job_id: r for r in queue(ledger, store, policy, now, only_held)}
    if f.state in ("running", "all"):  # every one of them: paged, sorted and counted here
        others |= {r.job_id: r for r in _holding_rows(state, f, now, 10**9)}
    for r in others.values():
        if r is not None:
            entries.append((None, r.job_id, r.user, r.account, r.gpus, r.state, r.code,
                            r.submitted_at))  # fmt: skip
    codes: dict[str, int] = {}
    for x in entries:
        codes[x[6]] = codes.get(x[6], 0) + 1
    if code:
        entries = [x for x in entries if x[6] == code]
    column = QUEUE_SORTS.index(sort)
    if column:  # a stable sort: ties stay in dispatch order
        entries.sort(key=lambda x: x[column], reverse=descending)  # type: ignore[arg-type,return-value]
    elif descending:
        entries.reverse()
    page = entries[offset : offset + f.limit]
    rows: list[v.QueueRow] = []
    shown = [x for x in page if x[0] is not None]
    starts: dict[int, float | None] = {}
    unbuilt = any(others.get(x[1], False) is None for x in page if x[0] is None)
    if (shown or unbuilt) and (snapshot is None or decision is None):
        snapshot, decision = preview or live(ledger, store, policy, now, longest_s=longest_s)
    if held is None and snapshot is not None and (shown or unbuilt):
        held = _held(state, snapshot, policy, every_wait)
    whole = (snapshot, decision, held)

    def every_start() -> Starts:
        snap, dec, back = whole
        assert snap is not None and dec is not None
        return _starts(state, snap, dec, policy, now, None, back)

    deep = any((x[0] or 0) > SHALLOW for x in shown)
    if shown and snapshot is not None and decision is not None:
        if kept is not None and (deep or unbuilt):
            starts = kept(every_start)
        else:
            last = max(shown, key=lambda x: x[0] or 0)
            starts = _starts(state, snapshot, decision, policy, now, last[1], held)
    if unbuilt:
        every = kept(every_start) if kept is not None else every_start()
        for x in page:
            if x[0] is None and others.get(x[1], False) is None:
                others[x[1]] = _blocked_row(state.jobs[x[1]], waits[x[1]], now, every.get(x[1]))
    pending_by_id = {p.job_id: p for p in snapshot.pending} if snapshot is not None else {}
    if shown and decision is not None and waits_at is None:
        waits_at = decision.waiting.at()
    for x in page:
        if x[0] is None:
            row = others[x[1]]
            assert row is not None
            rows.append(row)
            continue
        assert decision is not None and snapshot is not None
        assert waits_at is not None
        p = pending_by_id[x[1]]
        wait = waits_at[x[0] - 1]  # the page's keys alone are built
        rows.append(
            v.QueueRow(
                order=x[0], job_id=p.job_id, account=p.account, user=p.user, gpus=p.gpus,
                funded=p.funded, debug=p.debug, state="pending",
                sort_key=list(key_at(decision.order, x[0] - 1)),
                code=x[6],
                reason=_reason(wait, policy, snapshot, p, now, state) if wait else _next(state),
                submitted_at=p.submitted_at, waiting_s=max(0.0, now - p.submitted_at),
                estimated_start_at=starts.get(p.job_id), time_limit_s=p.time_limit_s,
            )
        )  # fmt: skip
    return QueuePage(len(entries), codes, rows)


Starts = dict[int, float | None]
SHALLOW = 1_000
"""A page whose pending rows are all within this many of the queue's head estimates them alone
(the jobs ahead of its last row); a deeper one, or one showing a held-back job, uses the whole
queue's, kept per position when the caller keeps them (`queue_page`'s `kept`)."""


def _next(state: State) -> str:
    """A next-cycle job's reason: none needed, unless nothing is placed at all."""
    return "" if placing(state) else NOTHING_PLACED


def _starts(
    state: State,
    snapshot: Snapshot,
    decision: Decision,
    policy: Policy,
    now: float,
    through: int | None = None,
    held: HeldBack | None = None,
) -> dict[int, float | None]:
    """Pure: estimated starts of the queue (up to `through`), the jobs a dependency or an
    array's limit holds among it at the places the dispatcher will give them
    (`estimated_starts`); `held`: those jobs and their keys when the caller has them."""
    held = held or held_back(state, snapshot, policy)
    return estimated_starts(state, snapshot, decision, now, through, blocked=held.keys)


class HeldBack(NamedTuple):
    """The pending jobs a dependency or an array's limit holds (`jobs.blocked`, as every read
    counts them), or a time limit over the engine's longest (`too_long_waits`), and the sort
    keys of the first two (`blocked_keys`; a job too long is never placed while it is: no
    estimate): what every queue page and estimate at one position and snapshot share (the
    server's, with its preview: atk50-29 F9)."""

    waits: Mapping[int, Blocked]
    keys: list[tuple[SortKey, int]]


def held_back(
    state: State, snapshot: Snapshot, policy: Policy, longest_s: float | None = None
) -> HeldBack:
    """Pure: `HeldBack` of `state`, keyed by `policy` over `snapshot`, `longest_s` the engine's
    longest time limit (`too_long_waits`)."""
    return _held(state, snapshot, policy, held_waits(state, longest_s))


def _held(
    state: State, snapshot: Snapshot, policy: Policy, waits: Mapping[int, Blocked]
) -> HeldBack:
    keyed = {i: w for i, w in waits.items() if w.code != TOO_LONG}
    return HeldBack(waits, blocked_keys(state, snapshot, policy, keyed))


def _blocked_rows(
    state: State,
    f: v.QueueFilter,
    now: float,
    room: int,
    preview_of: Callable[[], tuple[Snapshot, Decision]],
    policy: Policy,
    longest_s: float | None = None,
) -> list[v.QueueRow]:
    """The pending jobs that may not run yet (a dependency, an array's limit, a time limit over
    the engine's longest), in job order, with why; the estimate is the earliest the dependency
    or the array's limit lets it run (what it waits for reaching its time limits) and its GPUs
    are free, at its place in the dispatch order (`_starts`); none for a time limit too long."""
    rows: list[v.QueueRow] = []
    waits = held_waits(state, longest_s)
    starts: dict[int, float | None] | None = None
    for job_id, why in sorted(waits.items()):
        if len(rows) >= room:
            break
        job = state.jobs[job_id]
        s = job.spec
        if (f.user and s.user != f.user) or not _under(s.account, f.account, s.user):
            continue
        if starts is None:
            snapshot, decision = preview_of()
            starts = _starts(state, snapshot, decision, policy, now)
        rows.append(_blocked_row(job, why, now, starts.get(job_id)))
    return rows


def _blocked_row(job: Job, why: Blocked, now: float, estimate: float | None) -> v.QueueRow:
    """Pure: the row of a pending job a dependency or an array's limit holds (`why`)."""
    s = job.spec
    return v.QueueRow(
        order=None, job_id=s.job_id, account=s.account, user=s.user, gpus=s.gpus,
        funded=job.funded, debug=s.debug, state="pending", sort_key=[], code=why.code,
        reason=why.reason, submitted_at=s.at, waiting_s=max(0.0, now - s.at),
        estimated_start_at=estimate, time_limit_s=s.time_limit_s,
    )  # fmt: skip


def _holding_rows(state: State, f: v.QueueFilter, now: float, limit: int) -> list[v.QueueRow]:
    """Pure: the first `limit` jobs that hold GPUs (placed, running or stopping), in job order,
    like `squeue -t R`: the estimated start of one is when it started (or was placed). A job
    past its time limit, or one whose record ended (cancelled, preempted) while the run the
    ledger stopped has not been reported gone by its engine, is `stopping` with its SIGKILL at
    the latest, as squeue's `CG` (`ledger.reads.stopping`)."""
    from ledger.reads.stopping import holding_reason, shown, stopped_shown

    gone = stopped_shown(state)
    live = {j: job for j, job in state.jobs.items() if job.status in ("placed", "running")}
    rows: list[v.QueueRow] = []
    for job_id in sorted(live.keys() | gone.keys()):
        if len(rows) >= limit:
            break
        if job_id in gone:
            sr = gone[job_id]
            if not (f.user and sr.user != f.user) and _under(sr.account, f.account, sr.user):
                was = state.jobs.get(job_id)
                limit_s = None if was is None else was.spec.time_limit_s
                rows.append(_stopped_row(sr, state.grace_s, now, limit_s))
            continue
        job = live[job_id]
        s = job.spec
        if (f.user and s.user != f.user) or not _under(s.account, f.account, s.user):
            continue
        began = job.started_at if job.started_at is not None else job.placed_at
        ran = None if job.started_at is None else max(0.0, now - job.started_at)
        limit_s = s.time_limit_s
        left = None if ran is None or limit_s is None else max(0.0, limit_s - ran)
        grace = job.service_grace(state.grace_s)  # its placement's (atk49-23 F1)
        word, kill_at = shown(job.status, job.started_at, limit_s, s.grace_s, now, grace,
                              job.reaping_kill_at)  # fmt: skip
        reason = holding_reason(job, kill_at, now)  # its limit, or its command's exit (F4)
        rows.append(
            v.QueueRow(
                order=None, job_id=s.job_id, account=s.account, user=s.user, gpus=s.gpus,
                funded=job.funded, debug=s.debug, state=_word(word), sort_key=[],
                code=word.upper(), reason=reason, submitted_at=s.at,
                waiting_s=max(0.0, (job.placed_at or now) - s.at), estimated_start_at=began,
                nodes=sorted({sl.node for sl in job.slots}), started_at=job.started_at,
                time_limit_s=limit_s, elapsed_s=ran, remaining_s=left, kill_at=kill_at,
            )
        )  # fmt: skip
    return rows


def _word(word: str) -> Literal["placed", "running", "stopping"]:
    """A holding job's state word, typed."""
    return "stopping" if word == "stopping" else "placed" if word == "placed" else "running"


def _stopped_row(
    sr: StoppedRun, default_s: float, now: float, limit_s: int | None = None
) -> v.QueueRow:
    """Pure: the row of a job whose record ended (cancelled, preempted) while the run the
    ledger stopped is not reported gone: `stopping` on the GPUs it held, its SIGKILL at the
    latest (`stopped_kill_at`, the service's grace `default_s` for a job with none of its own;
    at once after a second cancel, or past its limit), with its time limit `limit_s` and how
    long it has run, as `jobs` shows them (atk62-slurm F8: `time_limit_s` null here)."""
    from ledger.reads.stopping import stopped_kill_at

    kill_at = stopped_kill_at(sr, default_s)
    kill = "killed at once" if sr.kill else kill_words(kill_at, now)  # or overdue (F2)
    return v.QueueRow(
        order=None, job_id=sr.job_id, account=sr.account, user=sr.user, gpus=sr.gpus,
        funded=sr.funded, debug=sr.debug, state="stopping", sort_key=[], code="STOPPING",
        reason=f"{sr.why or 'stopped'} at {when(sr.at)}: SIGTERM sent, {kill}",
        submitted_at=sr.submitted_at, waiting_s=0.0, estimated_start_at=sr.started_at,
        nodes=sorted({sl.node for sl in sr.slots}), started_at=sr.started_at, kill_at=kill_at,
        time_limit_s=limit_s,
        elapsed_s=None if sr.started_at is None else max(0.0, now - sr.started_at),
    )  # fmt: skip


def _any_pending(state: State, f: v.QueueFilter) -> bool:
    """Pure: whether some pending job the dispatcher would consider (not held) passes `f`."""
    return any(
        job.status == "pending"
        and not job.held
        and not (f.user and job.spec.user != f.user)
        and _under(job.spec.account, f.account, job.spec.user)
        for job in state.jobs.values()
    )


def queue_codes(
    state: State, snapshot: Snapshot, decision: Decision, longest_s: float | None = None
) -> list[tuple[str, str]]:
    """Pure: each queued job's account and code as `queue` gives them (pending in dispatch
    order, then held), without the rest of its row (the counts of /metrics)."""
    accounts = {p.job_id: p.account for p in snapshot.pending}
    out = []
    waits = decision.waiting
    for _, job in decision.order:
        wait = waits.get(job.job_id)
        out.append((accounts[job.job_id], wait.code if wait else "NEXT_CYCLE"))
    stopped = held_waits(state, longest_s)
    waiting = [(state.jobs[i].spec.account, b.code) for i, b in sorted(stopped.items())]
    held = sorted(
        (j.job_id, j.spec.account) for j in state.jobs.values() if j.held and j.status == "pending"
    )
    return out + waiting + [(account, "HELD") for _, account in held]


def priority(
    ledger: LiveState,
    store: Store,
    policy: Policy,
    now: float,
    f: v.QueueFilter,
    preview: tuple[Snapshot, Decision] | None = None,
) -> list[v.PriorityRow]:
    """Every pending job's sort key with each part named, in dispatch order (like sprio).
    `preview`: `live(...)` at `now` when the caller already holds it."""
    known_account(ledger.state, f.account)
    _, decision = preview or live(ledger, store, policy, now)
    state = ledger.state
    rows: list[v.PriorityRow] = []
    for i, (key, job) in enumerate(decision.order):
        spec = state.jobs[job.job_id].spec
        if (f.user and spec.user != f.user) or not _under(spec.account, f.account, spec.user):
            continue
        if len(rows) >= f.limit:
            break
        rows.append(
            v.PriorityRow(
                order=i + 1,
                job_id=job.job_id,
                account=spec.account,
                user=spec.user,
                policy=decision.policy_version,
                parts=key_parts(decision.policy_version, key),
            )
        )
    return rows[: f.limit]
