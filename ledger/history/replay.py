"""Replay: every past decision rebuilt from the log alone, re-run, and compared with the record.

A `CycleDecided` at log position Q says: based on position P, at `decided_at`, policy version V
with config C, these placements, preemptions and considered jobs (sort keys, reasons). To check
it, as numbered steps:

1. the read side at P: a fresh in-memory DuckDB projection (`Store(":memory:")` + `Projector`)
   caught up to exactly P; nothing is read from today's tables;
2. the write side at P: `ledger.core.domain` `evolve` over the events 1..P (the fold the ledger
   keeps);
3. utilisation at P: `ledger.core.utilisation.UtilTracker` over the events 1..P, with the squat
   threshold that C records (`squat_util_pct`, else the tracker's default);
4. ranks at `decided_at` from the projection (usage counted as C says: `window_s`, `half_life_s`,
   else the 7-day window), the snapshot (`snapshot_from_state`), and `decide()` with the policy
   rebuilt from V and C (`registry.config_from_record`: a version whose code is gone is a clear
   error);
5. compare with the record, field by field: `compare` names every difference.

Replaying many cycles (`Replayer`) walks the log once, in order: one in-memory projection
advancing monotonically and one state folded incrementally. The projection is either caught up to
exactly each P (`exact=True`) or run ahead in large steps and read as of P through views that
hide every row written after P (`AS_OF_SQL`; the default for many decisions, several times
faster, and the same rows). Either way every step reads only log records up to P.

The pure part (`compare`, `usage_from_config`, `replay_policy`, `WithSettings`) takes values; the
`Replayer` and `find_decisions` are the edges that read a log.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import sqlite3
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ledger.core.domain import State, evolve
from ledger.core.utilisation import UtilTracker
from ledger.cycle.inputs import snapshot_from_state
from ledger.dispatch.engine import Decision, decide
from ledger.dispatch.ordering import SortKey
from ledger.dispatch.policy import Policy
from ledger.dispatch.preemption import Victim
from ledger.dispatch.registry import config_from_record, policy_from_config
from ledger.dispatch.snapshot import PendingJob, RunningJob, Snapshot
from ledger.store.embedded import EVENTS_DB, EmbeddedSource
from ledger.store.snapshots import Folded, folded, unfolded
from projections import queries
from projections.chain import chain_hash
from projections.fairshare import RANKING_VERSION, WEEK_S, UsagePolicy
from projections.projector import Projector
from projections.source import EventSource, follow, gc_paused
from projections.store import Store, projection_path
from schemas import codec
from schemas import events as e
from schemas.digest import rank_digest, summarise
from schemas.errors import InvalidCommand, LedgerError, UnknownEntity

log = logging.getLogger("gpuledger.replay")
DECIDED_TAGS = (e.tag_of(e.CycleDecided), e.tag_of(e.CycleDecidedV1))
"""Every stored version of the decision record."""
DEFAULT_SQUAT_UTIL_PCT = UtilTracker().threshold_pct
RANKLESS = frozenset({"fifo", "legacy"})
"""Policies whose decisions never read fair-share ranks (their order and victims ignore them):
replay skips the rank query for them."""
USAGE_KEYS = ("window_s",)
"""Config keys that describe how the rank source counts usage rather than the policy itself."""


class ReplayError(LedgerError):
    """A decision cannot be replayed: the log ends before its position, it goes backwards, ..."""

    code = "replay"


# --- pure: the policy and usage a decision recorded -------------------------------------------


class WithSettings:
    """A policy that records more (or other spellings of its) settings than its own `config()`.

    Pure: delegates every decision to `inner`; only `config()` overlays `extra`. The what-if
    uses it to record the usage window a decision was ranked with (`window_s`), so replay ranks
    it the same way; replay uses it to record a config exactly as the decision wrote it.
    """

    def __init__(self, inner: Policy, extra: Mapping[str, str]) -> None:
        self.inner = inner
        self.extra = dict(extra)

    @property
    def version(self) -> str:
        return self.inner.version

    @property
    def search_budget(self) -> int:
        return self.inner.search_budget

    def config(self) -> dict[str, str]:
        return {**self.inner.config(), **self.extra}

    def order(self, snapshot: Snapshot) -> list[tuple[SortKey, PendingJob]]:
        return self.inner.order(snapshot)

    def may_preempt(self, job: PendingJob) -> bool:
        return self.inner.may_preempt(job)

    def victim_group(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        return self.inner.victim_group(job, snapshot)

    def victim_key(self, job: RunningJob, now: float) -> tuple[float, ...]:
        return self.inner.victim_key(job, now)

    def victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        return self.inner.victims(job, candidates, snapshot, now)

    @property
    def least_loss(self) -> bool:
        return self.inner.least_loss

    @property
    def least_loss_gangs(self) -> bool:
        return self.inner.least_loss_gangs

    def budget_of(self, job: PendingJob) -> tuple[str, int]:
        return self.inner.budget_of(job)

    def reserved(self, snapshot: Snapshot) -> frozenset[str]:
        return self.inner.reserved(snapshot)

    def weigh(
        self, job: PendingJob, victims: Sequence[Victim], snapshot: Snapshot, now: float
    ) -> str | None:
        return self.inner.weigh(job, victims, snapshot, now)


def _seconds(config: Mapping[str, str], key: str) -> float:
    try:
        value = float(config[key])
    except ValueError as err:
        raise InvalidCommand(
            f"the recorded config has {key}={config[key]!r}, not a number of seconds",
            hint="the decision's config was edited",
        ) from err
    if not value > 0:
        raise InvalidCommand(f"the recorded config has {key}={config[key]!r}: it must be > 0")
    return value


def usage_of(settings: e.UsageSettings) -> UsagePolicy:
    """Pure: the usage counting a v2 record names."""
    return UsagePolicy(
        window_s=settings.window_s, half_life_s=settings.half_life_s, weights=settings.weights
    )


def usage_from_config(config: Mapping[str, str]) -> UsagePolicy:
    """Pure: how the ranks of a decision counted usage: `window_s` (default 7 days) and
    `half_life_s` (Slurm-style decay) when the config records them."""
    window = _seconds(config, "window_s") if "window_s" in config else WEEK_S
    half_life = _seconds(config, "half_life_s") if "half_life_s" in config else None
    return UsagePolicy(window_s=window, half_life_s=half_life)


def squat_threshold(config: Mapping[str, str]) -> float:
    """Pure: the utilisation % below which a job counted as low for this decision."""
    raw = config.get("squat_util_pct")
    if raw is None:
        return DEFAULT_SQUAT_UTIL_PCT
    try:
        return float(raw)
    except ValueError as err:
        raise InvalidCommand(f"the recorded config has squat_util_pct={raw!r}") from err


def replay_policy(version: str, config: Mapping[str, str]) -> tuple[Policy, UsagePolicy]:
    """Pure: the policy (`registry.config_from_record`) and the usage counting a decision
    recorded. The policy records the config exactly as the decision did.

    Raises UnknownEntity naming the version when this build lacks its code."""
    own = {k: v for k, v in config.items() if k not in USAGE_KEYS}
    policy = policy_from_config(config_from_record(version, own))
    # the decision records the config as written ("3600" and "3600.0" are the same setting)
    return WithSettings(policy, config), usage_from_config(config)


# --- pure: comparing a record with a replay ---------------------------------------------------


class Difference(msgspec.Struct, frozen=True, kw_only=True):
    """One way a replayed decision differs from the recorded one."""

    what: str
    """placement | preemption | considered | order | fragmentation | wake_at | config | ..."""
    job_id: int | None = None
    recorded: str
    replayed: str

    def text(self) -> str:
        who = f" of job {self.job_id}" if self.job_id is not None else ""
        return f"{self.what}{who}: recorded {self.recorded}, replayed {self.replayed}"


def slots_text(slots: Sequence[e.GpuSlot]) -> str:
    """Pure: `n1[0,1,2,3]+n2[0,1]`."""
    return "+".join(f"{s.node}[{','.join(map(str, s.gpu_indices))}]" for s in slots) or "-"


def _preemption_text(p: e.Preemption) -> str:
    why = f"{p.reason} for job {p.for_job}" if p.for_job is not None else p.reason
    return f"{why} ({p.note})" if p.note else why


def _absent(what: str) -> str:
    return f"no {what}"


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """A recorded decision's placements and preemptions in full: the `JobPlaced` and
    `JobPreempted` events of its cycle that follow the record (it holds them by reference)."""

    placements: tuple[e.Placement, ...] = ()
    preemptions: tuple[e.Preemption, ...] = ()


def outcome_of(recorded: e.CycleDecided, following: Iterable[e.AnyEvent]) -> Outcome:
    """Pure: the outcome of `recorded` from the events appended with it, in the record's order."""
    placed: dict[int, e.Placement] = {}
    preempted: dict[int, e.Preemption] = {}
    for ev in following:
        if isinstance(ev, e.JobPlaced) and ev.cycle_id == recorded.cycle_id:
            placed[ev.job_id] = e.Placement(job_id=ev.job_id, slots=ev.slots)
        elif isinstance(ev, e.JobPreempted) and ev.cycle_id == recorded.cycle_id:
            preempted[ev.job_id] = e.Preemption(
                job_id=ev.job_id, reason=ev.reason, for_job=ev.for_job, note=ev.note
            )
    return Outcome(
        placements=tuple(placed[j] for j in recorded.placed if j in placed),
        preemptions=tuple(preempted[j] for j in recorded.preempted if j in preempted),
    )


def following_events(recorded: e.CycleDecided) -> int:
    """Pure: how many events after the record may belong to its append: a JobPlaced per
    placement, a JobPreempted (and a JobRequeued) per preemption, a NodeDrained per node."""
    return len(recorded.placed) + 2 * len(recorded.preempted) + 64


def compare(
    recorded: e.CycleDecided,
    outcome: Outcome,
    replayed: Decision,
    ranks: str | None = None,
) -> list[Difference]:
    """Pure: every difference between a recorded decision (with its `outcome`) and its replay
    (empty: identical). `ranks`: the digest of the ranks the replay used.

    Placements and preemptions are compared per job and then in order; the waiting jobs by
    count, per code, the first ones listed and the digest of the whole order (ids, sort keys,
    reasons); then fragmentation, the wake-up time, the policy version and config, and the rank
    inputs (a different rank digest says why the rest differs)."""
    out: list[Difference] = []
    # 0. what both claim to have placed and preempted
    if tuple(p.job_id for p in outcome.placements) != recorded.placed:
        out.append(
            Difference(
                what="record",
                recorded=f"placed {list(recorded.placed)}",
                replayed=f"placement events for {[p.job_id for p in outcome.placements]}",
            )
        )
    # 1. placements
    rec = {p.job_id: p.slots for p in outcome.placements}
    rep = {p.job_id: p.slots for p in replayed.placements}
    for job in sorted(set(rec) | set(rep)):
        a, b = rec.get(job), rep.get(job)
        if a != b:
            out.append(
                Difference(
                    what="placement",
                    job_id=job,
                    recorded=_absent("placement") if a is None else slots_text(a),
                    replayed=_absent("placement") if b is None else slots_text(b),
                )
            )
    if not out and [p.job_id for p in outcome.placements] != [
        p.job_id for p in replayed.placements
    ]:
        out.append(
            Difference(
                what="placement order",
                recorded=str([p.job_id for p in outcome.placements]),
                replayed=str([p.job_id for p in replayed.placements]),
            )
        )
    # 2. preemptions
    before = len(out)
    prec = {p.job_id: p for p in outcome.preemptions}
    prep = {p.job_id: p for p in replayed.preemptions}
    for job in sorted(set(prec) | set(prep)):
        x, y = prec.get(job), prep.get(job)
        if x != y:
            out.append(
                Difference(
                    what="preemption",
                    job_id=job,
                    recorded=_absent("preemption") if x is None else _preemption_text(x),
                    replayed=_absent("preemption") if y is None else _preemption_text(y),
                )
            )
    if len(out) == before and [p.job_id for p in outcome.preemptions] != [
        p.job_id for p in replayed.preemptions
    ]:
        out.append(
            Difference(
                what="preemption order",
                recorded=str([p.job_id for p in outcome.preemptions]),
                replayed=str([p.job_id for p in replayed.preemptions]),
            )
        )
    # 3. the waiting jobs: counts, the first listed, the whole order by digest
    out += _compare_waiting(recorded.waiting, summarise(replayed.considered))
    # 4. the rest of the record
    if recorded.fragmentation_gpus != replayed.fragmentation_gpus:
        out.append(
            Difference(
                what="fragmentation_gpus",
                recorded=str(recorded.fragmentation_gpus),
                replayed=str(replayed.fragmentation_gpus),
            )
        )
    if recorded.wake_at != replayed.wake_at:
        out.append(
            Difference(
                what="wake_at", recorded=repr(recorded.wake_at), replayed=repr(replayed.wake_at)
            )
        )
    if recorded.policy_version != replayed.policy_version:
        out.append(
            Difference(
                what="policy_version",
                recorded=recorded.policy_version,
                replayed=replayed.policy_version,
            )
        )
    if recorded.config != replayed.config:
        keys = sorted(
            k
            for k in set(recorded.config) | set(replayed.config)
            if recorded.config.get(k) != replayed.config.get(k)
        )
        out.append(
            Difference(
                what="config",
                recorded=", ".join(f"{k}={recorded.config.get(k)}" for k in keys),
                replayed=", ".join(f"{k}={replayed.config.get(k)}" for k in keys),
            )
        )
    out += _compare_ranks(recorded.ranks, ranks)
    return out


def _compare_ranks(recorded: e.RankInputs | None, digest: str | None) -> list[Difference]:
    if recorded is None or digest is None:
        return []
    out = []
    if recorded.ranking_version != RANKING_VERSION:
        out.append(
            Difference(
                what="ranking version", recorded=recorded.ranking_version, replayed=RANKING_VERSION
            )
        )
    if recorded.digest != digest:
        out.append(
            Difference(
                what="ranks",
                recorded=f"digest {recorded.digest[:12]} at position {recorded.position}",
                replayed=f"digest {digest[:12]}",
            )
        )
    return out


def _compare_waiting(recorded: e.WaitSummary, replayed: e.WaitSummary) -> list[Difference]:
    out: list[Difference] = []
    if recorded.considered != replayed.considered:
        out.append(
            Difference(
                what="considered",
                recorded=f"{recorded.considered} jobs",
                replayed=f"{replayed.considered} jobs",
            )
        )
    if recorded.counts != replayed.counts:
        out.append(
            Difference(
                what="waiting",
                recorded=_counts_text(recorded.counts),
                replayed=_counts_text(replayed.counts),
            )
        )
    a = {w.job_id: w.code for w in recorded.first}
    b = {w.job_id: w.code for w in replayed.first}
    listed = 0
    for job in sorted(set(a) & set(b)):
        if a[job] != b[job]:
            out.append(Difference(what="reason", job_id=job, recorded=a[job], replayed=b[job]))
            listed += 1
    order_a = [w.job_id for w in recorded.first]
    order_b = [w.job_id for w in replayed.first]
    if order_a != order_b:
        i = next(
            (i for i, (x, y) in enumerate(zip(order_a, order_b, strict=False)) if x != y),
            min(len(order_a), len(order_b)),
        )
        out.append(
            Difference(
                what="waiting order",
                recorded=_place_text(order_a, i),
                replayed=_place_text(order_b, i),
            )
        )
        listed += 1
    if not out and recorded.order_digest != replayed.order_digest:
        out.append(
            Difference(
                what="order",
                recorded=f"digest {recorded.order_digest[:12]}",
                replayed=f"digest {replayed.order_digest[:12]} (sort keys or reasons differ)",
            )
        )
    return out


def _counts_text(counts: Sequence[e.WaitCount]) -> str:
    return ", ".join(f"{c.jobs} {c.code}" for c in counts) or "none"


def _place_text(order: Sequence[int], i: int) -> str:
    return f"job {order[i]} at place {i + 1}" if i < len(order) else f"nothing at place {i + 1}"


class CycleReplay(msgspec.Struct, frozen=True, kw_only=True):
    """The replay of one recorded decision."""

    position: int
    """Where the `CycleDecided` sits in the log."""
    cycle_id: str
    based_on: int
    policy_version: str
    decided_at: float
    placements: int
    preemptions: int
    considered: int
    differences: tuple[Difference, ...] = ()
    error: str | None = None
    """Why it could not be replayed (e.g. the policy version's code is gone)."""

    @property
    def identical(self) -> bool:
        return self.error is None and not self.differences

    def headline(self) -> str:
        what = (
            f"{self.cycle_id} (position {self.position}, based on {self.based_on}, "
            f"{self.policy_version})"
        )
        if self.error is not None:
            return f"{what}: cannot replay: {self.error}"
        if not self.differences:
            return (
                f"{what}: identical ({self.placements} placed, {self.preemptions} preempted, "
                f"{self.considered} considered)"
            )
        return f"{what}: {len(self.differences)} differences"


def decided_at(recorded: e.CycleDecided) -> float:
    """Pure: the `now` the decision was made for (`decided_at`; older records: the event time)."""
    return recorded.at if recorded.decided_at is None else recorded.decided_at


def _result(
    position: int,
    recorded: e.CycleDecided,
    differences: Sequence[Difference] = (),
    error: str | None = None,
) -> CycleReplay:
    return CycleReplay(
        position=position,
        cycle_id=recorded.cycle_id,
        based_on=recorded.based_on,
        policy_version=recorded.policy_version,
        decided_at=decided_at(recorded),
        placements=len(recorded.placed),
        preemptions=len(recorded.preempted),
        considered=recorded.waiting.considered,
        differences=tuple(differences),
        error=error,
    )


# --- edge: walking the log --------------------------------------------------------------------

PAGE = 131_072
READ_AHEAD = 100_000
LARGE_CATCH_UP = 20_000
"""As-of mode: how far past a decision's position the projection may run in one catch-up."""

AS_OF_SCHEMA = "replay_at"
AS_OF_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {AS_OF_SCHEMA};
-- an interval as the projection at P has it: opened at or before P, open if it closed after P
CREATE OR REPLACE VIEW {AS_OF_SCHEMA}.job_intervals AS
SELECT * REPLACE (
    CASE WHEN end_position <= getvariable('replay_position') THEN end_position END AS end_position,
    CASE WHEN end_position <= getvariable('replay_position') THEN end_at END AS end_at,
    CASE WHEN end_position <= getvariable('replay_position') THEN end_reason END AS end_reason)
FROM main.job_intervals WHERE start_position <= getvariable('replay_position');
CREATE OR REPLACE VIEW {AS_OF_SCHEMA}.account_history AS
SELECT * FROM main.account_history WHERE position <= getvariable('replay_position');
CREATE OR REPLACE VIEW {AS_OF_SCHEMA}.node_history AS
SELECT * FROM main.node_history WHERE position <= getvariable('replay_position');
CREATE OR REPLACE VIEW {AS_OF_SCHEMA}.events AS
SELECT * FROM main.events WHERE position <= getvariable('replay_position');
-- tables updated in place cannot be read as of a position: reading them is an error
CREATE OR REPLACE VIEW {AS_OF_SCHEMA}.jobs AS
SELECT j.* FROM main.jobs j, (SELECT error('jobs cannot be read as of a position')) x;
CREATE OR REPLACE VIEW {AS_OF_SCHEMA}.tracking AS
SELECT t.* FROM main.tracking t, (SELECT error('tracking cannot be read as of a position')) x;
"""
"""The projection *as of position P*, read from a projection that has run ahead of P.

Every table fair share reads is append-only by position: `account_history` rows are written at
their event's position and never change; a `job_intervals` row is written at its JobPlaced
position and changes once, when the releasing event (at `end_position`) closes it. So the rows
with position <= P, with intervals closed after P reopened, are exactly the rows the projector
has after catching up to P. `jobs` and `tracking` change in place and are refused."""


class _AsOf(Store):
    """A connection (cursor) on the in-memory projection that resolves the read models to the
    as-of views (`search_path`), positioned with `at(position)`. Read only by convention; one
    per thread (DuckDB variables and settings belong to a connection)."""

    def __init__(self, store: Store) -> None:  # no super().__init__: it opens a database
        self.path = store.path
        self.read_only = True
        self.con = store.con.cursor()
        self.con.execute(f"SET search_path = '{AS_OF_SCHEMA},main'")

    def at(self, position: int) -> None:
        self.con.execute(f"SET VARIABLE replay_position = {int(position)}")


class _DiskAsOf(Store):
    """The data directory's projection, opened read-only and read *as of* a position through
    temporary views that shadow its tables (`_as_of_temp_sql`), anchored to the log: it is used
    for position P only when it has caught up to P and its stored bytes at P are the log's."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, read_only=True)
        self.caught_up = self.position()
        (db,) = self.con.execute("SELECT current_database()").fetchone() or ("",)
        self.db = str(db)
        self.con.execute(_as_of_temp_sql(self.db))
        self.anchored: dict[int, bool] = {}

    def at(self, position: int) -> None:
        self.con.execute(f"SET VARIABLE replay_position = {int(position)}")

    def holds(self, position: int, data: bytes) -> bool:
        """Whether the projection has caught up to `position` with exactly `data` there."""
        if position > self.caught_up:
            return False
        known = self.anchored.get(position)
        if known is None:
            row = self.con.execute(
                f"SELECT raw FROM {self.db}.main.events WHERE position = ?", [position]
            ).fetchone()
            raw = None if row is None else row[0]
            stored = raw.encode() if isinstance(raw, str) else raw
            known = self.anchored[position] = stored == data
        return known


def _as_of_temp_sql(db: str) -> str:
    """`AS_OF_SQL` as temporary views over the catalog `db` (a read-only database cannot hold
    a new schema; temporary views shadow its tables, also inside its macros)."""
    return f"""
CREATE OR REPLACE TEMP VIEW job_intervals AS
SELECT * REPLACE (
    CASE WHEN end_position <= getvariable('replay_position') THEN end_position END AS end_position,
    CASE WHEN end_position <= getvariable('replay_position') THEN end_at END AS end_at,
    CASE WHEN end_position <= getvariable('replay_position') THEN end_reason END AS end_reason)
FROM {db}.main.job_intervals WHERE start_position <= getvariable('replay_position');
CREATE OR REPLACE TEMP VIEW account_history AS
SELECT * FROM {db}.main.account_history WHERE position <= getvariable('replay_position');
CREATE OR REPLACE TEMP VIEW node_history AS
SELECT * FROM {db}.main.node_history WHERE position <= getvariable('replay_position');
CREATE OR REPLACE TEMP VIEW events AS
SELECT * FROM {db}.main.events WHERE position <= getvariable('replay_position');
CREATE OR REPLACE TEMP VIEW jobs AS
SELECT j.* FROM {db}.main.jobs j, (SELECT error('jobs cannot be read as of a position')) x;
"""


CHECKPOINTS_DB = "replay-checkpoints.sqlite"
"""Beside the store in the data directory: a cache (deleting it only makes replay slower)."""
CHECKPOINT_EVERY = 50_000
"""A replay walking the log stores a checkpoint once this many events past the last one."""


class _Tracked(msgspec.Struct, frozen=True, array_like=True):
    threshold_pct: float
    low_since: list[tuple[int, float]]


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """The write side of a replay at `position`: the live state and the utilisation trackers,
    anchored to the log by `chain_hash` (of the stored bytes at `position`)."""

    position: int
    chain_hash: str
    state: Folded
    trackers: list[_Tracked]


_checkpoint_encoder = msgspec.msgpack.Encoder()
_checkpoint_decoder = msgspec.msgpack.Decoder(Checkpoint)


class Checkpoints:
    """Replay checkpoints in `<home>/replay-checkpoints.sqlite` (position, checkpoint bytes)."""

    def __init__(self, path: Path) -> None:
        self.con = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.con.execute(
            "CREATE TABLE IF NOT EXISTS checkpoints (position INTEGER PRIMARY KEY, data BLOB)"
        )

    def put(self, checkpoint: Checkpoint) -> None:
        self.con.execute(
            "INSERT OR REPLACE INTO checkpoints VALUES (?, ?)",
            (checkpoint.position, _checkpoint_encoder.encode(checkpoint)),
        )

    def before(self, position: int) -> Iterator[Checkpoint]:
        """Checkpoints at or before `position`, newest first (unreadable ones skipped)."""
        rows = self.con.execute(
            "SELECT data FROM checkpoints WHERE position <= ? ORDER BY position DESC LIMIT 8",
            (position,),
        ).fetchall()
        for (data,) in rows:
            try:
                yield _checkpoint_decoder.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                log.warning("replay checkpoint skipped: %s", err)

    def positions(self) -> list[int]:
        return [r[0] for r in self.con.execute("SELECT position FROM checkpoints ORDER BY 1")]

    def close(self) -> None:
        self.con.close()


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

    def __post_init__(self) -> None:
        self.store = Store(":memory:")
        self.projector = Projector(self.store, self.source, batch_size=self.page)
        self.trackers = {float(t): UtilTracker(threshold_pct=float(t)) for t in self.thresholds}
        self._projected = 0
        self._history: tuple[list[int], list[int], list[float]] | None = None
        self._threads(1)
        self.as_of: _AsOf | None = None
        if not self.exact:
            self.store.con.execute(AS_OF_SQL)
            self.as_of = _AsOf(self.store)
        self.disk: _DiskAsOf | None = None
        if self.projection is not None and not self.exact:
            try:
                self.disk = _DiskAsOf(self.projection)
            except LedgerError as err:  # busy (a running service holds it) or missing
                log.info("replay builds its own projection: %s", err.line())
        self._checkpointed = 0

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
        if self.checkpoints is None or self.disk is None:
            return
        for cp in self.checkpoints.before(until):
            if cp.position <= self.position:
                return
            have = {t.threshold_pct: t for t in cp.trackers}
            if not set(self.trackers) <= set(have):
                continue
            records = self.source.read(cp.position - 1, 1)
            if not records or records[0].position != cp.position:
                continue
            if chain_hash(records[0].data) != cp.chain_hash:
                log.warning("replay checkpoint at %d skipped: the chain hash differs", cp.position)
                continue
            self.state = unfolded(cp.state)
            for threshold, tracker in self.trackers.items():
                tracker.low_since = dict(have[threshold].low_since)
            self.position = self._checkpointed = cp.position
            return

    def _checkpoint(self, data: bytes) -> None:
        """Store a checkpoint at our position (`data`: the stored bytes there)."""
        if self.checkpoints is None or self.position - self._checkpointed < CHECKPOINT_EVERY:
            return
        self.checkpoints.put(
            Checkpoint(
                position=self.position,
                chain_hash=chain_hash(data),
                state=folded(self.state),
                trackers=[
                    _Tracked(t, sorted(tr.low_since.items())) for t, tr in self.trackers.items()
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
        state = self.state
        decode = codec.decode
        for records in follow(self.source, self.position, until, page=self.page):
            with gc_paused():
                for rec in records:
                    ev = decode(rec.data)
                    evolve(state, ev)
                    for tracker in trackers:
                        tracker.observe(ev)
            self.position = records[-1].position
            self._checkpoint(records[-1].data)
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
            tree = queries.fair_share(self.store, at, usage)
            self.timings.project_s += mid - started
            self.timings.ranks_s += time.perf_counter() - mid
            return tree.leaf_ranks(), tree.level_fs()
        if self.disk is not None:
            records = self.source.read(position - 1, 1)
            if records and self.disk.holds(position, records[0].data):
                started = time.perf_counter()
                self.disk.at(position)
                tree = queries.fair_share(self.disk, at, usage)
                self.timings.ranks_s += time.perf_counter() - started
                return tree.leaf_ranks(), tree.level_fs()
        assert self.as_of is not None
        return self._ranks_as_of(self.as_of, position, at, usage)

    def _ranks_as_of(self, reader: _AsOf, position: int, at: float, usage: UsagePolicy) -> Ranks:
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
        tree = queries.fair_share(reader, at, usage, history=self._history_at(position))
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

    def snapshot(self, recorded: e.CycleDecided) -> tuple[Snapshot, Policy, str]:
        """The snapshot and policy the recorded decision had (advances to its `based_on`), and
        the digest of the ranks it was given. Ranks are read where the record says they were
        (`ranks.position`, which trails `based_on` when the projection lagged), counting usage
        as it says."""
        policy, usage = replay_policy(recorded.policy_version, recorded.config)
        if recorded.policy is not None:
            # the typed config is the record's authority; its settings as strings must match
            # the strings recorded beside it (a `config` difference says they do not)
            own = {k: v for k, v in recorded.config.items() if k not in USAGE_KEYS}
            usage_keys = {k: v for k, v in recorded.config.items() if k in USAGE_KEYS}
            try:
                same = config_from_record(recorded.policy_version, own) == recorded.policy
            except (UnknownEntity, InvalidCommand):
                same = False
            policy = WithSettings(
                policy_from_config(recorded.policy), recorded.config if same else usage_keys
            )
        inputs = recorded.ranks
        if inputs is not None:
            usage = usage_of(inputs.usage)
        now = decided_at(recorded)
        self.advance(recorded.based_on)
        if recorded.config.get("policy") in RANKLESS:
            ranks: dict[str, int] = {}
            level_fs: dict[str, float] = {}
        else:
            ranks, level_fs = self.ranks(now, usage, None if inputs is None else inputs.position)
        threshold = squat_threshold(recorded.config)
        tracker = self.trackers.get(threshold)
        if tracker is None:
            raise ReplayError(
                f"no utilisation tracker for a squat threshold of {threshold:g}%",
                hint="pass every threshold the decisions record to the Replayer",
            )
        snapshot = snapshot_from_state(
            self.state,
            ranks,
            now,
            level_fs=level_fs,
            low_util_since=tracker.low_since,
            position=recorded.based_on,
        )
        return snapshot, policy, rank_digest(ranks, level_fs)

    def replay(self, position: int, recorded: e.CycleDecided) -> CycleReplay:
        """4-5. Re-run the recorded decision and compare. A decision that cannot be replayed
        (its policy version is gone, its config was edited) comes back with `error` set."""
        try:
            snapshot, policy, digest = self.snapshot(recorded)
        except (UnknownEntity, InvalidCommand) as err:
            return _result(position, recorded, error=err.line())
        started = time.perf_counter()
        decision = decide(snapshot, policy, decided_at(recorded))
        self.timings.decide_s += time.perf_counter() - started
        outcome = self.outcome(position, recorded)
        return _result(position, recorded, compare(recorded, outcome, decision, digest))

    def outcome(self, position: int, recorded: e.CycleDecided) -> Outcome:
        """The placements and preemptions of the record at `position`, from the events after it."""
        if not recorded.placed and not recorded.preempted:
            return Outcome()
        records = self.source.read(position, following_events(recorded))
        return outcome_of(recorded, (codec.decode(r.data) for r in records))


# --- edge: which decisions ----------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which recorded decisions to replay (all given criteria must hold)."""

    cycle: str | None = None
    job: int | None = None
    start: float | None = None
    end: float | None = None

    def wants(self, d: e.CycleDecided) -> bool:
        if self.cycle is not None and d.cycle_id not in (self.cycle, f"cycle-{self.cycle}"):
            return False
        at = decided_at(d)
        if self.start is not None and at < self.start:
            return False
        if self.end is not None and at > self.end:
            return False
        if self.job is not None:
            j = self.job
            return j in d.placed or j in d.preempted or any(w.job_id == j for w in d.waiting.first)
        return True


def find_decisions(
    home: Path, selection: Selection | None = None
) -> list[tuple[int, e.CycleDecided]]:
    """The recorded decisions of the embedded log that `selection` wants, in log order.

    Reads only the decision rows (every stored version) of the store (a scan of one column),
    then decodes them (as the latest version)."""
    path = home / EVENTS_DB
    if not path.exists():
        raise ReplayError(f"no event log at {path}", hint="pass --home, or run `gpuledger init`")
    sel = selection or Selection()
    out = []
    with EmbeddedSource(home) as source:
        for page in follow(source, tags=DECIDED_TAGS):
            for rec in page:
                ev = codec.decode(rec.data)
                if isinstance(ev, e.CycleDecided) and sel.wants(ev):
                    out.append((rec.position, ev))
    return out


FEW = 8
"""Up to this many decisions replay from checkpoints and the anchored projection."""

Progress = Callable[[int, int], None]
"""Called after each replayed decision with (done, total)."""


def thresholds_of(decisions: Sequence[tuple[int, e.CycleDecided]]) -> set[float]:
    """Pure: the squat thresholds the decisions record (the default when none does)."""
    out = set()
    for _, d in decisions:
        with contextlib.suppress(InvalidCommand):  # reported when that decision is replayed
            out.add(squat_threshold(d.config))
    return out or {DEFAULT_SQUAT_UTIL_PCT}


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
    checkpoints = Checkpoints(home / CHECKPOINTS_DB)
    projection = projection_path(home)
    try:
        with EmbeddedSource(home) as source:
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
