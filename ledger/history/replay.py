"""Replay: every past decision rebuilt from the log alone, re-run, and compared with the record.

A `CycleDecided` at log position Q says: based on position P, at `decided_at`, policy version V
with settings C, these placements, preemptions and considered jobs (by reference and digest). To
check it, as numbered steps:

1. the read side at P: a fresh in-memory DuckDB projection (`Store(":memory:")` + `Projector`)
   caught up to exactly P; nothing is read from today's tables;
2. the write side at P: `ledger.core.evolve` `evolve` over the events 1..P (the fold the ledger
   keeps);
3. utilisation at P: `ledger.core.utilisation.UtilTracker` over the events 1..P, with the squat
   threshold that C records (`squat_util_pct`, else the tracker's default);
4. ranks at `decided_at` from the projection (usage counted as the record's rank inputs say,
   else the 7-day window), the snapshot (`snapshot_kept`), and `decide_carried()` with the policy
   rebuilt from C (`registry.build`; a record without C, whose version's code is gone or whose
   old string settings no code wrote, is a clear error);
5. compare with the record, field by field: `compare` names every difference.

Replaying many cycles (`Replayer`) walks the log once, in order: one in-memory projection
advancing monotonically and one state folded incrementally. The projection is either caught up to
exactly each P (`exact=True`) or run ahead in large steps and read as of P through views that
hide every row written after P (`AS_OF_SQL`; the default for many decisions, several times
faster, and the same rows). Either way every step reads only log records up to P.

Rooms: this module walks the log (`Replayer`, `find_decisions`, `replay_home`); what a record
says and how a replay differs from it is pure, in `ledger.history.compare`; the projection read
as of a position is `projections.as_of`; checkpoints of the walk are
`ledger.history.checkpoints`.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.core.utilisation import DEFAULT_SQUAT_UTIL_PCT, UtilTracker
from ledger.cycle.inputs import Views, snapshot_kept
from ledger.cycle.record import SERVICE
from ledger.dispatch import registry
from ledger.dispatch.decision import Carry
from ledger.dispatch.engine import decide_carried
from ledger.dispatch.policy import Policy
from ledger.dispatch.snapshot import Snapshot
from ledger.history.checkpoints import (
    CHECKPOINT_EVERY,
    CHECKPOINTS_DB,
    Checkpoint,
    Checkpoints,
    Tracked,
)
from ledger.history.compare import (
    CycleReplay,
    Outcome,
    SkippedBound,
    compare,
    cycle_replay,
    decided_at,
    following_events,
    outcome_of,
    recorded_policy,
    recorded_usage,
    squat_threshold,
    usage_of,
)
from ledger.store import EVENTS_DB, has_log
from ledger.store.locate import LogSource, open_source
from ledger.store.snapshots import folded, state_key, unfolded
from projections import queries
from projections.as_of import AS_OF_SQL, AsOf, DiskAsOf
from projections.chain import link, names
from projections.fairshare import FairTree, UsagePolicy
from projections.projector import Projector
from projections.source import EventSource, follow
from projections.store import Store, projection_path
from projections.usage import FOLD, UsageFold, open_accounts
from schemas import codec
from schemas import events as e
from schemas.codec import gc_paused
from schemas.digest import rank_digest
from schemas.errors import InvalidCommand, LedgerError, UnknownEntity

log = logging.getLogger("gpuledger.replay")
DECIDED_TAGS = (e.tag_of(e.CycleDecided), *map(e.tag_of, e.OLDER_TYPES))
"""Every stored version of the decision record."""


class ReplayError(LedgerError):
    """A decision cannot be replayed: the log ends before its position, it goes backwards, ..."""

    code = "replay"


# --- walking the log ------------------------------------------------------------------------------

PAGE = 131_072
READ_AHEAD = 100_000
LARGE_CATCH_UP = 20_000
"""As-of mode: how far past a decision's position the projection may run in one catch-up."""

Ranks = tuple[dict[str, int], dict[str, float]]


@dataclass
class Timings:
    """Where a replay spent its time (seconds)."""

    fold_s: float = 0.0
    project_s: float = 0.0
    ranks_s: float = 0.0
    decide_s: float = 0.0

    def total(self) -> float:
        return self.fold_s + self.project_s + self.ranks_s + self.decide_s


@dataclass
class Replayer:
    """One in-memory projection and one folded state, advanced monotonically through a log.

    `replay(position, recorded)` rebuilds what the decision saw at its `based_on` P (advancing
    the fold to P), re-runs `decide()` and compares. Decisions must come in log order.

    The projection is read at P in one of two ways, with the same result:

    - `exact=True`: `Projector.catch_up(until=P)` before each rank query, then the tables;
    - `exact=False` (as-of, the default): the projector catches up in large steps (up to
      `READ_AHEAD` events past P) and ranks read the tables as of P through `AS_OF_SQL`. A
      small catch-up costs a dozen DuckDB statements (tens of ms) whatever its size; reading
      as of P costs nothing extra, so replaying every decision of a history is several times
      faster. The tests check both ways give the same ranks on every decision.
    """

    source: EventSource
    thresholds: Iterable[float] = (DEFAULT_SQUAT_UTIL_PCT,)
    """The squat thresholds the decisions to replay record: one tracker each, fed from the start."""
    exact: bool = False
    page: int = PAGE
    state: State = field(default_factory=lambda: State(live_only=True))
    position: int = 0
    timings: Timings = field(default_factory=Timings)
    checkpoints: Checkpoints | None = None
    """Where to store checkpoints while walking, and to start from the nearest one (this needs
    `projection`: the in-memory projection cannot start from one)."""
    projection: Path | None = None
    """The data directory's projection, read as of each position it is anchored at (not with
    `exact`)."""
    folds: Iterable[UsagePolicy] = ()
    """How the decisions whose ranks came from the in-memory usage fold (`computed_by` "fold",
    the simulator's) counted usage: one fold each, fed from the start, ranks them again."""

    def __post_init__(self) -> None:
        self.store = Store(":memory:")
        self.projector = Projector(self.store, self.source, batch_size=self.page)
        self.trackers = {float(t): UtilTracker(threshold_pct=float(t)) for t in self.thresholds}
        self.usage_folds = {_usage_key(u): UsageFold(u) for u in self.folds}
        self._projected = 0
        self._history: tuple[list[int], list[int], list[float]] | None = None
        self._tree: FairTree | None = None
        """The Fair Tree the last ranks were read from (its usage and shares: `fairshare-10`)."""
        self._views: Views | None = None
        self._carry: Carry | None = None
        """What the last snapshot and `decide()` hand the next (`snapshot_kept`,
        `decide_carried`): the same decisions, less rebuilt."""
        self._threads(1)
        self.as_of: AsOf | None = None
        if not self.exact:
            self.store.con.execute(AS_OF_SQL)
            self.as_of = AsOf(self.store)
        self.disk: DiskAsOf | None = None
        if self.projection is not None and not self.exact:
            try:
                self.disk = DiskAsOf(self.projection)
            except LedgerError as err:  # busy (a running service holds it) or missing
                log.info("replay builds its own projection: %s", err.line())
        self._checkpointed = 0
        self.decided: float | None = None
        """When the last decision record folded was decided (None: none yet)."""
        self.began: float | None = None
        """The time of the log's first event (None: not folded from the start)."""

    def close(self) -> None:
        if self.as_of is not None:
            self.as_of.con.close()
        if self.disk is not None:
            self.disk.close()
        self.store.close()

    # the nearest checkpoint, and new ones while walking
    def _start_from_checkpoint(self, until: int) -> None:
        """Jump the write side to the newest checkpoint at or before `until` that verifies
        (its chain hash is the log's at its position) and holds every tracker we need."""
        if self.checkpoints is None or self.disk is None or self.usage_folds:
            return  # a usage fold needs every event from the start
        for cp in self.checkpoints.before(until):
            if cp.position <= self.position:
                return
            have = {t.threshold_pct: t for t in cp.trackers}
            if not set(self.trackers) <= set(have):
                continue
            records = self.source.read(cp.position - 1, 1)
            if not records or records[0].position != cp.position:
                continue
            if not names(cp.chain_hash, cp.position, records[0].tag, records[0].data):
                log.warning("replay checkpoint at %d skipped: the chain hash differs", cp.position)
                continue
            self.state = unfolded(cp.state)
            for threshold, tracker in self.trackers.items():
                tracker.low_since = dict(have[threshold].low_since)
            self.position = self._checkpointed = cp.position
            self.decided, self.began = self._looked_back(cp.position)
            return

    def _looked_back(self, position: int) -> tuple[float | None, float | None]:
        """The decided-at of the last decision record at or before `position`, read back from
        there page by page (after a jump to a checkpoint), and the time of the log's first
        event."""
        first = self.source.read(0, 1)
        began = codec.decode(first[0].data).at if first else None
        stop = position
        while stop > 0:
            start = max(0, stop - 4096)
            records = [r for r in self.source.read(start, stop - start) if r.position <= stop]
            for rec in reversed(records):
                if rec.tag in DECIDED_TAGS:
                    ev = codec.decode(rec.data)
                    if isinstance(ev, e.CycleDecided):
                        return decided_at(ev), began
            stop = start
        return None, began

    def _checkpoint(self, tag: str, data: bytes) -> None:
        """Store a checkpoint at our position (`tag`, `data`: the stored event there)."""
        if self.checkpoints is None or self.position - self._checkpointed < CHECKPOINT_EVERY:
            return
        self.checkpoints.put(
            Checkpoint(
                position=self.position,
                chain_hash=link(self.position, tag, data),
                state=folded(self.state),
                trackers=[
                    Tracked(t, sorted(tr.low_since.items())) for t, tr in self.trackers.items()
                ],
            )
        )
        self._checkpointed = self.position

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # 1-3. the write side and utilisation at P (the read side follows in `ranks`)
    def advance(self, until: int) -> None:
        """Fold the events after our position up to `until` into the state and the trackers."""
        if until < self.position:
            raise ReplayError(
                f"cannot go back from position {self.position} to {until}",
                hint="replay decisions in log order, or use a fresh Replayer",
            )
        started = time.perf_counter()
        self._start_from_checkpoint(until)
        trackers = list(self.trackers.values())
        folds = list(self.usage_folds.values())
        state = self.state
        decode = codec.decode
        decided_type = e.CycleDecided
        for records in follow(self.source, self.position, until, page=self.page):
            with gc_paused():
                if self.began is None and self.position == 0 and records:
                    self.began = decode(records[0].data).at
                for rec in records:
                    ev = decode(rec.data)
                    if type(ev) is decided_type:
                        self.decided = decided_at(ev)
                    evolve(state, ev)
                    for tracker in trackers:
                        tracker.observe(ev)
                    for fold in folds:
                        fold.apply(ev)
            self.position = records[-1].position
            self._checkpoint(records[-1].tag, records[-1].data)
        self.timings.fold_s += time.perf_counter() - started
        if self.position < until:
            raise ReplayError(
                f"the log ends at position {self.position}, before {until}",
                hint="is this the ledger the decision was recorded in?",
                position=self.position,
            )

    def ranks(self, at: float, usage: UsagePolicy, position: int | None = None) -> Ranks:
        """Fair-share ranks at `at` from the in-memory projection as of `position` (default: our
        position; never past it)."""
        position = self.position if position is None else min(position, self.position)
        if self.exact:
            started = time.perf_counter()
            if self._projected != position:
                if self._projected > position:
                    raise ReplayError(
                        f"the projection is at {self._projected}, past the ranks' {position}",
                        hint="replay this decision alone (exact mode reads forward only)",
                    )
                self._catch_up(position)
            mid = time.perf_counter()
            tree = self._tree = queries.fair_share(self.store, at, usage)
            self.timings.project_s += mid - started
            self.timings.ranks_s += time.perf_counter() - mid
            return tree.leaf_ranks(), tree.level_fs()
        if self.disk is not None:
            records = self.source.read(position - 1, 1)
            if records and self.disk.holds(position, records[0].data):
                started = time.perf_counter()
                self.disk.at(position)
                tree = self._tree = queries.fair_share(self.disk, at, usage)
                self.timings.ranks_s += time.perf_counter() - started
                return tree.leaf_ranks(), tree.level_fs()
        assert self.as_of is not None
        return self._ranks_as_of(self.as_of, position, at, usage)

    def _folded(self, at: float, usage: UsagePolicy) -> Ranks:
        """Ranks at `at` from the usage fold of these settings, as the simulator computed them
        (the state's open accounts at our position)."""
        fold = self.usage_folds.get(_usage_key(usage))
        if fold is None:
            raise ReplayError(
                "no usage fold for the usage settings this decision's ranks were folded with",
                hint="pass every usage setting the decisions fold with to the Replayer (folds)",
            )
        started = time.perf_counter()
        out = fold.ranks(at, open_accounts(self.state.accounts.values()))
        self.timings.ranks_s += time.perf_counter() - started
        return out

    def _ranks_as_of(self, reader: AsOf, position: int, at: float, usage: UsagePolicy) -> Ranks:
        """Ranks from the projection read as of `position`, catching it up past there first
        (in one large step) when it is behind."""
        started = time.perf_counter()
        if self._projected < position:
            self._catch_up(min(self.projector.source.head(), position + READ_AHEAD))
            if self._projected < position:
                raise ReplayError(
                    f"the log ends at position {self._projected}, before {position}",
                    hint="is this the ledger the decision was recorded in?",
                )
        mid = time.perf_counter()
        reader.at(position)
        tree = self._tree = queries.fair_share(
            reader, at, usage, history=self._history_at(position)
        )
        out = tree.leaf_ranks(), tree.level_fs()
        self.timings.project_s += mid - started
        self.timings.ranks_s += time.perf_counter() - mid
        return out

    def _catch_up(self, target: int) -> None:
        """`Projector.catch_up(until=target)`. DuckDB runs large catch-ups on every core; the
        small queries of a replay (and small catch-ups) run faster on one thread, where no
        per-statement thread start-up is paid."""
        large = target - self._projected >= LARGE_CATCH_UP
        if large:
            self._threads(0)
        self._projected = self.projector.catch_up(until=target).position
        if large:
            self._threads(1)
        self._history = None

    def _history_at(self, position: int) -> queries.HistoryKey:
        """What `account_history` holds as of `position` (the key `queries.fair_share` would
        read with one more statement), from its rows read once per catch-up."""
        if self._history is None:
            rows = self.store.con.execute(
                "SELECT position, changed_at FROM main.account_history ORDER BY position"
            ).fetchall()
            positions = [int(p) for p, _ in rows]
            totals = list(itertools.accumulate(positions))
            latest = list(itertools.accumulate((c for _, c in rows), max))
            self._history = (positions, totals, latest)
        positions, totals, latest = self._history
        k = bisect.bisect_right(positions, position)
        if k == 0:
            return (0, None, None, None)
        return (k, positions[k - 1], totals[k - 1], latest[k - 1])

    def _threads(self, n: int) -> None:
        self.store.con.execute("RESET threads" if n == 0 else f"SET threads = {n}")

    def snapshot(self, recorded: e.CycleDecided) -> tuple[Snapshot, Policy, str | None]:
        """The snapshot and policy the recorded decision had (advances to its `based_on`), and
        the digest of the ranks it was given (None for a policy that reads no ranks: what a
        server recorded of them then is not an input of the decision, and is not compared).
        Ranks are read where the record says they were (`ranks.position`, which trails
        `based_on` when the projection lagged), counting usage as it says."""
        config = recorded_policy(recorded)
        policy, usage = registry.build(config), recorded_usage(recorded, config)
        inputs = recorded.ranks
        now = decided_at(recorded)
        self.advance(recorded.based_on)
        ranked_by = registry.ranked(config)
        if not ranked_by:  # its order and victims ignore ranks
            ranks: dict[str, int] = {}
            level_fs: dict[str, float] = {}
        elif inputs is not None and inputs.computed_by == FOLD:
            ranks, level_fs = self._folded(now, usage)
        else:
            ranks, level_fs = self.ranks(now, usage, None if inputs is None else inputs.position)
        threshold = squat_threshold(recorded)
        tracker = self.trackers.get(threshold)
        if tracker is None:
            raise ReplayError(
                f"no utilisation tracker for a squat threshold of {threshold:g}%",
                hint="pass every threshold the decisions record to the Replayer",
            )
        usage_of: Mapping[str, float] = {}
        shares: Mapping[str, float] = {}
        if ranked_by and getattr(policy, "reads_usage", False):  # `fairshare-10`: as the cycle
            if inputs is not None and inputs.computed_by == FOLD:
                fold = self.usage_folds[_usage_key(usage)]
                usage_of, shares = fold.usage_shares(
                    now, open_accounts(self.state.accounts.values())
                )
            elif self._tree is not None:
                usage_of, shares = self._tree.usage_shares()
        snapshot, self._views = snapshot_kept(
            self.state,
            ranks,
            now,
            self._views,
            level_fs=level_fs,
            usage=usage_of,
            shares=shares,
            low_util_since=tracker.low_since,
            position=recorded.based_on,
            hold_stopping=recorded.stopping_held,  # as its cycle counted stopping GPUs
            hold_lost=recorded.lost_held,  # and a `node lost`'s runs (s50)
            hold_placed=recorded.placed_held,  # and runs stopped while placed (s52)
            from_start=on_slurm(self.state),  # as its cycle counted (atk62b G3)
            longest_s=self.state.max_time_s,  # the MaxTime its cycle decided with (atk62b G3)
            hold_grace=recorded.grace_held,  # and its rule (s63)
        )
        ranked = registry.ranked(config)
        return snapshot, policy, rank_digest(ranks, level_fs) if ranked else None

    def replay(self, position: int, recorded: e.CycleDecided) -> CycleReplay:
        """4-5. Re-run the recorded decision and compare. A decision that cannot be replayed
        (its policy version is gone, its config was edited) comes back with `error` set."""
        try:
            snapshot, policy, digest = self.snapshot(recorded)
        except (UnknownEntity, InvalidCommand) as err:
            return cycle_replay(position, recorded, error=err.line())
        started = time.perf_counter()
        decision, self._carry = decide_carried(snapshot, policy, decided_at(recorded), self._carry)
        self.timings.decide_s += time.perf_counter() - started
        outcome = self.outcome(position, recorded)
        # the settings in force at P, the position before Q, as the service recorded them (an
        # admin's `service.configure` changes what previews use, not what a running service
        # decides with: its honest records would all differ)
        service = self.state.service
        ran = service is not None and service.actor == SERVICE
        differences = compare(
            recorded,
            outcome,
            decision,
            digest,
            self.skipped_bound(recorded),
            configured=service.policy if ran and service is not None else None,
        )
        return cycle_replay(position, recorded, differences)

    def skipped_bound(self, recorded: e.CycleDecided) -> SkippedBound | None:
        """How many empty cycles a record of a service can say came before it (None: the log
        was not written by a service, which records its settings when it starts; or nothing
        says when its cycles began)."""
        if self.state.service is None:
            return None
        since = self.decided if self.decided is not None else self.began
        if since is None:
            return None
        return SkippedBound(since=since, until=decided_at(recorded))

    def outcome(self, position: int, recorded: e.CycleDecided) -> Outcome:
        """The placements and preemptions of the record at `position`, from the events after it."""
        if not recorded.placed and not recorded.preempted:
            return Outcome()
        records = self.source.read(position, following_events(recorded))
        return outcome_of(recorded, (codec.decode(r.data) for r in records))


def on_slurm(state: State) -> bool:
    """Pure: whether the service that decided ran on Slurm (its recorded executor), whose cycles
    count a run's contract and time limit from Slurm's start (`snapshot_kept`'s `from_start`,
    `Dispatcher._cycle`): a replay counting them from the placement gave another `wake_at`
    (atk62b G3: recorded 1796637635.0, Slurm's whole-second start plus the limit; replayed
    1796637634.64, the placement's)."""
    return state.service is not None and state.service.executor == "slurm"


# --- edge: which decisions ----------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which recorded decisions to replay (all given criteria must hold)."""

    cycle: str | None = None
    job: int | None = None
    start: float | None = None
    end: float | None = None
    span: tuple[int, int | None] | None = None
    """With `job`: the job's span of the log (its submission to its end, None: not ended),
    found by `find_decisions`; every decision in it considered the job (waiting, running or
    placed), whether or not the record lists it among its first waiting jobs."""

    def wants(self, d: e.CycleDecided, position: int = 0) -> bool:
        if self.cycle is not None and d.cycle_id not in (self.cycle, f"cycle-{self.cycle}"):
            return False
        at = decided_at(d)
        if self.start is not None and at < self.start:
            return False
        if self.end is not None and at > self.end:
            return False
        if self.job is not None:
            j = self.job
            if j in d.placed or j in d.preempted or any(w.job_id == j for w in d.waiting.first):
                return True
            if self.span is None:
                return False
            first, last = self.span
            return first < position and (last is None or position <= last)
        return True


def find_decisions(
    home: Path, selection: Selection | None = None
) -> list[tuple[int, e.CycleDecided]]:
    """The recorded decisions of the embedded log that `selection` wants, in log order.

    Reads only the decision rows (every stored version) of the store (a scan of one column),
    then decodes them (as the latest version)."""
    path = home / EVENTS_DB
    if not has_log(home):
        raise ReplayError(f"no event log at {path}", hint="pass --home, or run `gpuledger init`")
    sel = selection or Selection()
    out = []
    with open_source(home) as source:
        if sel.job is not None:
            sel = replace(sel, span=_job_span(source, sel.job))
        for page in follow(source, tags=DECIDED_TAGS):
            for rec in page:
                ev = codec.decode(rec.data)
                if isinstance(ev, e.CycleDecided) and sel.wants(ev, rec.position):
                    out.append((rec.position, ev))
    return out


def _job_span(source: LogSource, job_id: int) -> tuple[int, int | None] | None:
    """The positions of `job_id`'s submission and of its end (None: not ended), from the
    submissions and ends of the log (a scan of those tags alone); None: no such job."""
    first: int | None = None
    last: int | None = None
    wanted = codec.stored_tags(e.JobSubmitted, e.JobFinished)
    for page in follow(source, tags=wanted):
        for rec in page:
            ev = codec.decode(rec.data)
            if getattr(ev, "job_id", None) != job_id:
                continue
            if isinstance(ev, e.JobSubmitted) and first is None:
                first = rec.position
            elif isinstance(ev, e.JobFinished):
                last = rec.position
    return None if first is None else (first, last)


FEW = 8
"""Up to this many decisions replay from checkpoints and the anchored projection."""

Progress = Callable[[int, int], None]
"""Called after each replayed decision with (done, total)."""


def folds_of(decisions: Sequence[tuple[int, e.CycleDecided]]) -> list[UsagePolicy]:
    """Pure: the usage settings of the decisions whose ranks came from the usage fold (one
    each)."""
    out: dict[tuple[object, ...], UsagePolicy] = {}
    for _, d in decisions:
        if d.ranks is not None and d.ranks.computed_by == FOLD:
            usage = usage_of(d.ranks.usage, d.ranks.ranking_version)
            out.setdefault(_usage_key(usage), usage)
    return list(out.values())


def _usage_key(usage: UsagePolicy) -> tuple[object, ...]:
    return (usage.window_s, usage.half_life_s, tuple(sorted(usage.weights.items())), usage.charge)


def thresholds_of(decisions: Sequence[tuple[int, e.CycleDecided]]) -> set[float]:
    """Pure: the squat thresholds the decisions record (the default when none does)."""
    return {squat_threshold(d) for _, d in decisions} or {DEFAULT_SQUAT_UTIL_PCT}


def replay_decisions(
    source: EventSource,
    decisions: Sequence[tuple[int, e.CycleDecided]],
    progress: Progress | None = None,
    *,
    exact: bool = False,
    checkpoints: Checkpoints | None = None,
    projection: Path | None = None,
) -> Iterator[CycleReplay]:
    """Replay `decisions` (in log order) with one `Replayer` walking the log once."""
    with Replayer(
        source,
        thresholds=thresholds_of(decisions),
        exact=exact,
        checkpoints=checkpoints,
        projection=projection,
        folds=folds_of(decisions),
    ) as replayer:
        for i, (position, recorded) in enumerate(decisions, start=1):
            yield replayer.replay(position, recorded)
            if progress is not None:
                progress(i, len(decisions))


def replay_home(
    home: Path,
    selection: Selection | None = None,
    progress: Progress | None = None,
    *,
    exact: bool | None = None,
) -> Iterator[CycleReplay]:
    """Replay the decisions `selection` wants from the embedded log of `home`, as of their
    positions (`exact`: a fresh projection caught up to exactly each P instead).

    Many decisions: one walk with a fresh in-memory projection (independent of the data
    directory's), storing replay checkpoints as it goes. A few (`FEW` or less): from the
    nearest checkpoint, ranked from the data directory's projection read as of P where it is
    anchored to the log (its stored bytes at P are the log's), else as for many."""
    decisions = find_decisions(home, selection)
    yield from replay_found(home, decisions, progress, exact=bool(exact))


def replay_found(
    home: Path,
    decisions: Sequence[tuple[int, e.CycleDecided]],
    progress: Progress | None = None,
    *,
    exact: bool = False,
) -> Iterator[CycleReplay]:
    """Replay `decisions` found in the embedded log of `home` (see `replay_home`)."""
    few = len(decisions) <= FEW
    checkpoints = Checkpoints(home / CHECKPOINTS_DB, state_key(home))  # trusted when signed
    projection = projection_path(home)
    try:
        with open_source(home) as source:
            yield from replay_decisions(
                source,
                decisions,
                progress,
                exact=exact,
                checkpoints=checkpoints,
                projection=projection if few and projection.exists() else None,
            )
    finally:
        checkpoints.close()
