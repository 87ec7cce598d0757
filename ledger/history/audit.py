"""Audit: tamper evidence (the hash chain) and the invariant checker.

Tamper evidence. Every stored event carries `prev_hash`, the SHA-256 of the previous event's
stored bytes (`projections.chain.chain_hash`), the first event "". `verify_chain` recomputes
the chain over records in position order and names what broke:

- `edited`: an event's bytes no longer hash to what its successor recorded (the edited event's
  position is reported; its successor is where the link breaks). When an event's own link is
  broken too, that event is the edited one (its `prev_hash` was changed with it);
- `broken-link`: the last event's `prev_hash` does not match its predecessor. Nothing after it
  tells whether the predecessor was edited or the last event's link was changed, so the break
  is named as what it is, at the last event;
- `deleted`: positions are missing (a gap), or a link points at bytes found nowhere in the log
  right after an intact event whose version numbering jumps;
- `reordered`: an event links to an event that is not its predecessor;
- `corrupt`: bytes that are not an event (no readable `prev_hash`), or a row whose value is not
  stored as bytes (rewritten outside the ledger, e.g. as TEXT: checked as its UTF-8 bytes);
- `mismatch` (copies): the Kafka copy's bytes differ from the store's at a position, or its
  positions are not 1, 2, 3, ...

The last event has no successor, so an edit of it is only visible against an anchor: the head
hash the report prints (keep it elsewhere), or the Kafka copy (`verify_copy`).

Invariants. `check_history(events)` scans a history for what must never happen: a GPU held by two
jobs, a preemption inside a contract (admin preemptions with a reason are listed apart, as
`noted`, not as violations), a placement on a node that is not active, a share, member, manager,
admin, account, node or token change by someone not authorised at that moment (the rules of
`ledger.core.authz.authorisation_failure`, the domain's own, replayed against the `State` folded up
to the event). `check_charges(store)`
checks the projection charges no usage to an unfunded job.

Pure: `verify_chain`, `verify_copy`, `check`, `check_history`. Edges: `store_records`,
`kafka_records`, `check_charges`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Literal, NamedTuple

import msgspec

from ledger.core.authz import authorisation_failure
from ledger.core.evolve import evolve
from ledger.core.state import Job, State, is_system
from ledger.store.embedded import EVENTS_DB
from ledger.store.locate import has_log, open_source, stored_rows
from projections import history
from projections.chain import chain_digest, prev_hash
from projections.source import follow
from projections.store import Store
from schemas import events as e
from schemas.errors import LedgerError

# --- tamper evidence ---------------------------------------------------------------------------


class AuditError(LedgerError):
    """The audit cannot run (no log, Kafka unreachable, ...); not a finding."""

    code = "audit"


class ChainRecord(NamedTuple):
    """One stored event as the chain sees it."""

    position: int
    data: bytes
    version: int | None = None
    """The store's stream version (position and version move together in a one-stream log)."""
    stored_as: str = "blob"
    """The SQLite type the value was stored as (the ledger writes blobs)."""


ProblemKind = Literal[
    "edited", "broken-link", "deleted", "reordered", "corrupt", "mismatch", "extra"
]


class ChainProblem(msgspec.Struct, frozen=True, kw_only=True):
    position: int
    """The position the problem is about: the edited event, the first missing position, ..."""
    kind: ProblemKind
    detail: str

    def text(self) -> str:
        return f"position {self.position}: {self.kind}: {self.detail}"


class ChainReport(msgspec.Struct, frozen=True, kw_only=True):
    events: int
    head: int
    head_hash: str
    """SHA-256 of the last event's bytes: an anchor to keep elsewhere (the chain cannot protect
    the last event on its own)."""
    problems: tuple[ChainProblem, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


class _Break(NamedTuple):
    i: int
    position: int
    want: str


def verify_chain(records: Iterable[ChainRecord], limit: int = 20) -> ChainReport:
    """Pure: recompute the hash chain over `records` (in position order) and classify every
    broken link (see the module docstring). Memory: 32 bytes per event for the digests, so a
    broken link can be matched against any earlier or later event."""
    digests = bytearray()
    positions: list[int] = []
    links_ok: list[bool] = []
    problems: list[ChainProblem] = []
    breaks: list[_Break] = []
    gaps: set[int] = set()
    last_hash, prev_pos, prev_version = "", 0, None
    for i, rec in enumerate(records):
        digest = chain_digest(rec.data)
        positions.append(rec.position)
        link = prev_hash(rec.data)
        if rec.position != prev_pos + 1:
            if rec.position > prev_pos + 1:
                gaps.add(i)
                last = rec.position - 1
                span = f"position {prev_pos + 1}" + ("" if last == prev_pos + 1 else f" to {last}")
                problems.append(
                    ChainProblem(
                        position=prev_pos + 1,
                        kind="deleted",
                        detail=f"{span} missing: the log jumps from {prev_pos} to {rec.position}",
                    )
                )
            else:
                problems.append(
                    ChainProblem(
                        position=rec.position,
                        kind="reordered",
                        detail=f"position {rec.position} comes after position {prev_pos}",
                    )
                )
        if rec.stored_as != "blob":
            problems.append(
                ChainProblem(
                    position=rec.position,
                    kind="corrupt",
                    detail=f"stored as {rec.stored_as}, not as bytes: the row was rewritten "
                    "outside the ledger (checked as its UTF-8 bytes)",
                )
            )
        if link is None:
            problems.append(
                ChainProblem(
                    position=rec.position,
                    kind="corrupt",
                    detail="the stored bytes are not an event (no readable prev_hash)",
                )
            )
            links_ok.append(False)
        elif link != last_hash:
            breaks.append(_Break(i, rec.position, link))
            links_ok.append(False)
        else:
            links_ok.append(True)
        if (
            rec.version is not None
            and prev_version is not None
            and rec.version != prev_version + 1
            and i not in gaps
        ):
            gaps.add(i)
            problems.append(
                ChainProblem(
                    position=rec.position,
                    kind="deleted",
                    detail=f"the stream version jumps from {prev_version} to {rec.version} "
                    f"before position {rec.position}: events were removed and renumbered",
                )
            )
        digests += digest
        last_hash, prev_pos, prev_version = digest.hex(), rec.position, rec.version
    problems += _classify(breaks, digests, positions, links_ok, gaps)
    problems.sort(key=lambda p: p.position)
    return ChainReport(
        events=len(positions),
        head=prev_pos,
        head_hash=last_hash,
        problems=tuple(problems[:limit]),
    )


def _find(digests: bytearray, want: bytes) -> int | None:
    """The index of the record whose digest is `want`, or None."""
    start = 0
    while True:
        at = digests.find(want, start)
        if at < 0:
            return None
        if at % 32 == 0:
            return at // 32
        start = at + 1


def _classify(
    breaks: list[_Break],
    digests: bytearray,
    positions: list[int],
    links_ok: list[bool],
    gaps: set[int],
) -> list[ChainProblem]:
    out: list[ChainProblem] = []
    kind: ProblemKind
    broken = {b.i for b in breaks}
    for b in breaks:
        i = b.i
        try:
            want = bytes.fromhex(b.want)
        except ValueError:
            want = b""
        found = _find(digests, want) if len(want) == 32 else None
        at, kind = b.position, "edited"
        if found is not None and found != i - 1:
            kind = "reordered"
            detail = (
                f"it links to the event at position {positions[found]}, not to its "
                f"predecessor{'' if i == 0 else f' at {positions[i - 1]}'}: events were moved"
            )
        elif i in gaps:
            continue  # the missing events explain the broken link
        elif i == 0:
            detail = 'the first event must link to nothing (prev_hash "")'
        elif i + 1 in broken and found is None:
            continue  # this event was edited with its own link: reported at the next break
        elif (i - 1) in broken or not links_ok[i - 1]:
            at = positions[i - 1]
            detail = (
                f"its bytes and its own link were changed: the link from position "
                f"{positions[i - 2] if i >= 2 else 0} and the link to position {b.position} "
                "both break"
            )
        elif i == len(positions) - 1:
            kind = "broken-link"
            detail = (
                f"its prev_hash ({b.want[:12]}...) does not match the bytes of "
                f"position {positions[i - 1]}: either position {positions[i - 1]} was "
                f"changed after it was written or this event's prev_hash was (nothing after "
                "it tells which; compare with a head hash kept elsewhere, or the Kafka copy)"
            )
        else:
            at = positions[i - 1]
            detail = (
                f"its bytes no longer hash to the prev_hash that position {b.position} "
                f"recorded ({b.want[:12]}...): position {at} was changed after it was "
                "written (or events after it were removed and the rest renumbered)"
            )
        out.append(ChainProblem(position=at, kind=kind, detail=detail))
    return out


class CopyRecord(NamedTuple):
    """One record of a copy of the log (the Kafka topic), in the copy's order."""

    offset: int
    position: int | None
    """The log position its header carries (None: no header)."""
    data: bytes


class CopyReport(msgspec.Struct, frozen=True, kw_only=True):
    records: int
    last_position: int
    store_head: int
    chain: ChainReport
    problems: tuple[ChainProblem, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems and self.chain.ok

    @property
    def behind(self) -> int:
        """Events the copy does not hold yet (a relay catching up): not a problem."""
        return max(0, self.store_head - self.last_position)


def verify_copy(
    store: Iterable[ChainRecord], copy: Iterable[CopyRecord], limit: int = 20
) -> CopyReport:
    """Pure: a copy of the log must hold positions 1, 2, 3, ... in order, each with the store's
    bytes at that position, and its own chain must be intact. The copy may end before the
    store (its relay is behind); it may not go beyond."""
    problems: list[ChainProblem] = []
    stored = iter(store)
    chain_input: list[ChainRecord] = []
    expected = 1
    n = 0
    last = 0
    head = 0
    current: ChainRecord | None = next(stored, None)
    for rec in copy:
        n += 1
        if rec.position is None:
            problems.append(
                ChainProblem(
                    position=expected,
                    kind="mismatch",
                    detail=f"the copy's record at offset {rec.offset} has no position header",
                )
            )
            continue
        if rec.position != expected:
            problems.append(
                ChainProblem(
                    position=expected,
                    kind="reordered" if rec.position < expected else "deleted",
                    detail=f"the copy's record at offset {rec.offset} carries position "
                    f"{rec.position}, expected {expected}",
                )
            )
        expected = rec.position + 1
        last = max(last, rec.position)
        chain_input.append(ChainRecord(rec.position, rec.data))
        while current is not None and current.position < rec.position:
            head = current.position
            current = next(stored, None)
        if current is None or current.position != rec.position:
            problems.append(
                ChainProblem(
                    position=rec.position,
                    kind="extra",
                    detail=f"the copy holds position {rec.position}, the store does not",
                )
            )
        elif current.data != rec.data:
            problems.append(
                ChainProblem(
                    position=rec.position,
                    kind="mismatch",
                    detail=f"the copy's bytes (offset {rec.offset}) differ from the store's",
                )
            )
        if len(problems) >= limit:
            break
    while current is not None:
        head = current.position
        current = next(stored, None)
    return CopyReport(
        records=n,
        last_position=last,
        store_head=head,
        chain=verify_chain(chain_input, limit),
        problems=tuple(problems[:limit]),
    )


def store_records(home: Path, page: int = 50_000) -> Iterator[ChainRecord]:
    """Edge: the stored events of `home`'s log in position order: (rowid, state, version)."""
    path = home / EVENTS_DB
    if not has_log(home):
        raise AuditError(f"no event log at {path}", hint="pass --home, or run `gpuledger init`")
    with open_source(home) as source:
        for rows in follow(stored_rows(source), page=page):
            for r in rows:
                yield ChainRecord(r.position, _as_bytes(r.data), _as_int(r.version), r.stored_as)


def _as_bytes(value: object) -> bytes:
    """A stored value as bytes, whatever type a hand-made row gave it."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return b"" if value is None else str(value).encode()


def _as_int(value: object) -> int | None:
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return None


def kafka_records(bootstrap: str, topic: str, timeout_s: float = 60.0) -> Iterator[CopyRecord]:
    """Edge: every committed record of the topic's one partition, from offset 0, in order."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    from projections.kafka_wire import (
        PARTITION,
        connect_timeout,
        envelope,
        quiet_kafka_logs,
        reader_config,
        unreachable,
    )

    quiet_kafka_logs("warning")  # kafka-python's retries and tracebacks stay off the terminal
    why = unreachable(bootstrap, connect_timeout())
    if why is not None:
        raise AuditError(f"Kafka at {bootstrap} is unreachable ({why})", hint="is the broker up?")
    tp = TopicPartition(topic, PARTITION)
    try:
        consumer = KafkaConsumer(
            **reader_config(
                bootstrap,
                "gpuledger-audit",
                connect_timeout(),
                max_partition_fetch_bytes=8 << 20,
                fetch_max_bytes=32 << 20,
            )
        )
    except KafkaError as err:
        raise AuditError(
            f"Kafka at {bootstrap}: {type(err).__name__}: {err}", hint="is the broker up?"
        ) from err
    try:
        if topic not in (consumer.topics() or set()):
            raise AuditError(f"no topic {topic} at {bootstrap}", hint="is the relay running?")
        consumer.assign([tp])
        end = consumer.end_offsets([tp], timeout_ms=int(timeout_s * 1000))[tp]
        consumer.seek(tp, 0)
        deadline = time.monotonic() + timeout_s
        while consumer.position(tp) < end:
            batch = consumer.poll(timeout_ms=500).get(tp, [])
            if batch:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                raise AuditError(f"reading {topic} stalled at offset {consumer.position(tp)}")
            for rec in batch:
                if rec.offset >= end:
                    continue
                position, _tag, _problem = envelope(rec.headers, rec.value, None)
                yield CopyRecord(rec.offset, position, bytes(rec.value or b""))
    except KafkaError as err:
        raise AuditError(f"Kafka at {bootstrap}: {type(err).__name__}: {err}") from err
    finally:
        consumer.close()


# --- invariants --------------------------------------------------------------------------------

ViolationCode = Literal[
    "GPU_HELD_TWICE",
    "LIVE_GPU_HELD_TWICE",
    "PREEMPTED_IN_CONTRACT",
    "ADMIN_PREEMPTED_IN_CONTRACT",
    "REQUEUED_IN_CONTRACT",
    "PLACED_ON_INACTIVE_NODE",
    "UNFUNDED_CHARGED",
    "NOT_AUTHORISED",
    "INCONSISTENT",
]


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    """One thing that must never happen, found at a log position."""

    position: int
    at: float
    code: ViolationCode
    message: str
    job_id: int | None = None

    def line(self) -> str:
        return f"position {self.position}: {self.code}: {self.message}"


class CheckReport(msgspec.Struct, frozen=True, kw_only=True):
    events: int
    violations: tuple[Violation, ...] = ()
    noted: tuple[Violation, ...] = ()
    """Allowed exceptions, listed as such: admin preemptions inside a contract with a reason."""

    @property
    def ok(self) -> bool:
        return not self.violations


class _Checker:
    """The scan behind `check`: its own books of who holds which GPU and since when, plus the
    domain's `State` folded event by event for authorisation and node states."""

    def __init__(self) -> None:
        self.state = State()
        self.holder: dict[tuple[str, int], int] = {}
        self.held: dict[int, list[tuple[str, int]]] = {}
        self.placed_at: dict[int, float] = {}
        self.violations: list[Violation] = []
        self.noted: list[Violation] = []
        self.n = 0
        self.initialised = False

    def flag(
        self, pos: int, ev: e.AnyEvent, code: ViolationCode, msg: str, job: int | None = None
    ) -> None:
        self.violations.append(
            Violation(position=pos, at=ev.at, code=code, message=msg, job_id=job)
        )

    def note(
        self, pos: int, ev: e.AnyEvent, code: ViolationCode, msg: str, job: int | None = None
    ) -> None:
        """An allowed exception: reported beside the violations, not as one."""
        self.noted.append(Violation(position=pos, at=ev.at, code=code, message=msg, job_id=job))

    def visit(self, pos: int, ev: e.AnyEvent) -> None:
        self.n += 1
        failed = authorisation_failure(self.state, ev)
        if failed is not None:
            self.flag(pos, ev, "NOT_AUTHORISED", failed)
        if isinstance(ev, e.LedgerInitialised):
            if self.initialised:
                self.flag(pos, ev, "INCONSISTENT", "the ledger is initialised a second time")
            self.initialised = True
        elif isinstance(ev, e.JobPlaced):
            self._placed(pos, ev)
        elif isinstance(ev, e.JobPreempted):
            self._preempted(pos, ev)
            self._release(ev.job_id)
        elif isinstance(ev, e.JobFinished):
            self._release(ev.job_id)
        try:
            evolve(self.state, ev)
        except (KeyError, AttributeError) as err:
            self.flag(
                pos,
                ev,
                "INCONSISTENT",
                f"{e.tag_of(type(ev))} refers to unknown {err}",
                getattr(ev, "job_id", None),
            )

    def _placed(self, pos: int, ev: e.JobPlaced) -> None:
        job = ev.job_id
        if job in self.held:
            self.flag(
                pos,
                ev,
                "GPU_HELD_TWICE",
                f"job {job} is placed again while it still holds GPUs",
                job,
            )
        for sl in ev.slots:
            node = self.state.nodes.get(sl.node)
            if node is None or node.state != "active":
                now = "unknown" if node is None else node.state
                self.flag(
                    pos,
                    ev,
                    "PLACED_ON_INACTIVE_NODE",
                    f"job {job} placed on node {sl.node!r}, which is {now}",
                    job,
                )
            for i in sl.gpu_indices:
                other = self.holder.get((sl.node, i))
                if other is not None and other != job:
                    self.flag(
                        pos,
                        ev,
                        "GPU_HELD_TWICE",
                        f"GPU {i} of node {sl.node!r} given to job {job} while job {other} "
                        "holds it",
                        job,
                    )
                self.holder[(sl.node, i)] = job
            self.held.setdefault(job, []).extend((sl.node, i) for i in sl.gpu_indices)
        self.placed_at[job] = ev.at

    def _preempted(self, pos: int, ev: e.JobPreempted) -> None:
        job = self.state.jobs.get(ev.job_id)
        placed = self.placed_at.get(ev.job_id)
        if job is None or placed is None:
            return
        ends = placed + job.spec.min_runtime_s
        if ev.at >= ends or self._lost_with_node(job, ev):
            return
        left = ends - ev.at
        what = (
            f"job {ev.job_id} preempted ({ev.reason}) by {ev.actor!r} {left:g} s before its "
            f"contract ends"
        )
        owner = ev.actor == job.spec.user or self.state.manages(ev.actor, job.spec.account)
        if owner and not is_system(ev.actor) and ev.note.startswith("requeued by "):
            self.note(pos, ev, "REQUEUED_IN_CONTRACT", f"{what}: {ev.note}", ev.job_id)
        elif self.state.is_admin(ev.actor) and not is_system(ev.actor) and ev.note.strip():
            reason = f"{what}: admin preemption, reason: {ev.note.strip()}"
            self.note(pos, ev, "ADMIN_PREEMPTED_IN_CONTRACT", reason, ev.job_id)
        else:
            self.flag(pos, ev, "PREEMPTED_IN_CONTRACT", what, ev.job_id)

    def _lost_with_node(self, job: Job, ev: e.JobPreempted) -> bool:
        """A contract cannot outlive its node: a requeue because a node it runs on is lost
        (`NodeLost`, folded just before) or because the engine says the run ended with its
        node (an executor's report) breaks no contract."""
        if ev.reason != "node_failure":
            return False
        return is_system(ev.actor) or any(
            (n := self.state.nodes.get(sl.node)) is not None and n.state == "lost"
            for sl in job.slots
        )

    def _release(self, job: int) -> None:
        for gpu in self.held.pop(job, []):
            if self.holder.get(gpu) == job:
                del self.holder[gpu]
        self.placed_at.pop(job, None)


def check(events: Iterable[e.AnyEvent | tuple[int, e.AnyEvent]]) -> CheckReport:
    """Pure: scan a history (events, or (position, event) pairs; bare events get positions 1,
    2, ...) for violations of the ledger's invariants, and list the allowed exceptions."""
    checker = _Checker()
    for i, item in enumerate(events, start=1):
        pos, ev = item if isinstance(item, tuple) else (i, item)
        checker.visit(pos, ev)
    return CheckReport(
        events=checker.n, violations=tuple(checker.violations), noted=tuple(checker.noted)
    )


def check_history(events: Iterable[e.AnyEvent | tuple[int, e.AnyEvent]]) -> list[Violation]:
    """Pure: the violations of a history (empty when it is clean). For simulation tests:
    `assert check_history(ev for _, ev in ledger.read(0, ledger.position)) == []`."""
    return list(check(events).violations)


def check_charges(store: Store) -> list[Violation]:
    """Edge: usage is charged from the projection's intervals flagged funded; none may belong
    to an unfunded job (min runtime 0)."""
    return [
        Violation(
            position=int(pos),
            at=float(at),
            code="UNFUNDED_CHARGED",
            message=f"the interval of unfunded job {job} from position {pos} is charged to {leaf}",
            job_id=int(job),
        )
        for job, pos, at, leaf in history.unfunded_charges(store.con)
    ]


def check_live(
    holders: Mapping[tuple[str, int], int],
    live: Iterable[tuple[int, str, int]],
    position: int,
    at: float,
) -> list[Violation]:
    """Pure: GPUs held by two jobs at once, counting processes really alive. `holders` is the
    ledger's (node, GPU) -> job at `position`; `live` the (job, node, GPU) of every live job
    process. A process of a job the ledger has ended, on a GPU the ledger gave to another job,
    is the double booking a lost process causes."""
    jobs: dict[tuple[str, int], set[int]] = {}
    for gpu, job in holders.items():
        jobs.setdefault(gpu, set()).add(job)
    for job, node, index in live:
        jobs.setdefault((node, index), set()).add(job)
    return [
        Violation(
            position=position,
            at=at,
            code="LIVE_GPU_HELD_TWICE",
            message=f"GPU {index} of node {node!r} is held by jobs "
            f"{', '.join(str(j) for j in sorted(held))} at once (ledger and live processes)",
            job_id=min(held),
        )
        for (node, index), held in sorted(jobs.items())
        if len(held) > 1
    ]


Read = Callable[[int, int], list[tuple[int, e.AnyEvent]]]


def read_all(read: Read, page: int = 10_000) -> Iterator[tuple[int, e.AnyEvent]]:
    """Edge helper: every (position, event) of a reader like `Ledger.read`."""
    after = 0
    while True:
        chunk = read(after, page)
        if not chunk:
            return
        yield from chunk
        after = chunk[-1][0]
