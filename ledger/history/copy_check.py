"""The audit of the log's Kafka copy (`audit verify --kafka`): the topic walked as a reader walks
it, compared with the store.

A reader takes the record that follows its last one (the next position) and sets aside every
other: a record that does not follow (ahead of the next position, or a position it holds with
other bytes) is foreign, and an exact copy of a record it took (the same position and bytes) is
passed over (docs/kafka.md). `verify_copy` gives the same verdicts: the records taken must be
1, 2, 3, ... with the store's bytes and an intact chain; a position the walk never reaches while
the copy holds later ones is the gap every reader stops at, named first; records that do not
follow are named `foreign` by offset; exact copies are counted, not blamed (it compared offset i
with position i + 1, so copies made ahead of time were reported as genuine positions deleted,
reordered and "extra, the store does not hold" (atk47-25 F2), and forty lines about copies of
signed records buried the one missing position under a list cut without a word (F7)).

Pure: `verify_copy`. Edge: `kafka_records`.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import msgspec

from ledger.history.tamper import (
    AuditError,
    ChainProblem,
    ChainRecord,
    ChainReport,
    verify_chain,
)
from ledger.store.relay_topic import START_GONE_HINT


class CopyRecord(NamedTuple):
    """One record of a copy of the log (the Kafka topic), in the copy's order."""

    offset: int
    position: int | None
    """The log position its header carries (None: no header)."""
    data: bytes
    tag: str | None = None
    """The event tag its header carries (None: not known): a v2 link covers it."""
    foreign: str | None = None
    """Why it cannot be the relay's (with signing keys: it fails the signature), or None."""
    signed: bool = False
    """It carries the relay's signature (the reader's signing keys verify it)."""


class CopyReport(msgspec.Struct, frozen=True, kw_only=True):
    records: int
    last_position: int
    """The last position the walk took (where a reader stands at the end of the copy)."""
    store_head: int
    chain: ChainReport
    problems: tuple[ChainProblem, ...] = ()
    copies: int = 0
    """Exact copies of records taken before them (readers pass over them): not problems."""
    early: int = 0
    """Copies of records the relay signed, found before their turn, each the exact record taken
    later at its position (a topic made again under a relay before s52 noticed, or someone
    replaying saved records: readers pass over them, `projections.early`): not problems."""
    more: int = 0
    """Problems found beyond the `problems` shown (a list is cut, and says so)."""

    @property
    def ok(self) -> bool:
        return not self.problems and self.chain.ok

    @property
    def behind(self) -> int:
        """Events the copy does not hold yet (a relay catching up): not a problem."""
        return max(0, self.store_head - self.last_position)


class _Walk:
    """The reader's walk over a copy, with the store's events in position order beside it."""

    def __init__(self, store: Iterable[ChainRecord]) -> None:
        self.stored = iter(store)
        self.current: ChainRecord | None = next(self.stored, None)
        self.head = 0
        self.last = 0
        self.taken = bytearray()
        """SHA-256 of each record taken, by position (32 bytes each)."""
        self.chain: list[ChainRecord] = []
        self.problems: list[ChainProblem] = []
        self.ahead = array("q")
        """(offset, position) of each record that claimed a position past the next one."""
        self.signed_ahead: dict[int, bytes] = {}
        """Offset -> SHA-256 of those that carry the relay's signature (only the relay's)."""
        self.copies = 0
        self.early = 0

    def store_at(self, position: int) -> ChainRecord | None:
        while self.current is not None and self.current.position < position:
            self.head = self.current.position
            self.current = next(self.stored, None)
        if self.current is not None and self.current.position == position:
            return self.current
        return None

    def take(self, rec: CopyRecord, position: int) -> None:
        mine = self.store_at(position)
        if mine is None:
            self.problems.append(
                ChainProblem(
                    position=position,
                    kind="extra",
                    detail=f"the copy holds position {position} (offset {rec.offset}), the "
                    "store does not",
                )
            )
        elif mine.data != rec.data:
            self.problems.append(
                ChainProblem(
                    position=position,
                    kind="mismatch",
                    detail=f"the copy's bytes (offset {rec.offset}) differ from the store's",
                )
            )
        # the copy's own chain, under the rule of each link: a v2 link covers the position, the
        # stream version (the position: one stream), the tag (its header) and the payload
        known = rec.tag is not None
        self.chain.append(ChainRecord(position, rec.data, position if known else None, tag=rec.tag))
        self.taken += hashlib.sha256(rec.data).digest()
        self.last = position

    def step(self, rec: CopyRecord) -> None:
        position = rec.position
        if rec.foreign is not None:  # named by its offset; the store is compared with the rest
            at = "" if position is None else f" (it claims position {position})"
            self.foreign(rec, f"the copy's record at offset {rec.offset}{at} is not the "
                         f"relay's: {rec.foreign}")  # fmt: skip
        elif position is None:
            self.foreign(rec, f"the copy's record at offset {rec.offset} has no position header")
        elif position == self.last + 1:
            mine = self.store_at(position)
            if mine is not None and mine.tag is not None and rec.tag != mine.tag and rec.signed:
                # the relay signed this record, its tag header with it: the store's row is what
                # changed since it was published (atk53-25 F3: "it is not the relay's" blamed
                # the genuine record); readers take it, so does the walk
                self.problems.append(
                    ChainProblem(
                        position=position,
                        kind="mismatch",
                        detail=f"the copy's record at offset {rec.offset} carries the relay's "
                        f"signature over tag header {rec.tag!r}; the store's event there is "
                        f"{mine.tag!r}: the store's row differs from what the relay published "
                        "(an edited store? `gpuledger audit verify` checks the store's chain)",
                    )
                )
                self.take(rec, position)
                return
            if mine is not None and mine.tag is not None and rec.tag != mine.tag:
                # the store's bytes under another tag header: a reader that took it stops at
                # the next position, the relay's record for this one coming after it (atk49-25
                # F1: the genuine next position was blamed for a broken link)
                said = "no single tag header" if rec.tag is None else f"tag header {rec.tag!r}"
                self.foreign(rec, f"the copy's record at offset {rec.offset} claims position "
                             f"{position} with {said}, the store's event there is "
                             f"{mine.tag!r}: it is not the relay's")  # fmt: skip
                return
            self.take(rec, position)
        elif position > self.last:
            self.ahead.extend((rec.offset, position))
            if rec.signed:
                self.signed_ahead[rec.offset] = hashlib.sha256(rec.data).digest()
        elif position > 0 and self._same(position, rec.data):
            self.copies += 1
        else:
            self.foreign(
                rec,
                f"the copy's record at offset {rec.offset} claims position {position}, which "
                f"it holds already with other bytes: it does not follow position {self.last} "
                "(readers set it aside)",
            )

    def _same(self, position: int, data: bytes) -> bool:
        at = (position - 1) * 32
        return self.taken[at : at + 32] == hashlib.sha256(data).digest()

    def foreign(self, rec: CopyRecord, detail: str) -> None:
        self.problems.append(
            ChainProblem(position=rec.position or self.last + 1, kind="foreign", detail=detail)
        )

    def end(self) -> list[ChainProblem]:
        """The gap (first) and the records ahead of their turn, once the walk is over."""
        while self.current is not None:
            self.head = self.current.position
            self.current = next(self.stored, None)
        pairs = list(zip(self.ahead[::2], self.ahead[1::2], strict=True))
        past = [(o, p) for o, p in pairs if p > self.last]
        out: list[ChainProblem] = []
        if past:
            shown = ", ".join(f"{p} at offset {o}" for o, p in past[:5])
            rest = f" and {len(past) - 5:,} more" if len(past) > 5 else ""
            missing = self.last + 1
            out.append(
                ChainProblem(
                    position=missing,
                    kind="deleted",
                    detail=f"position {missing} is missing: the copy holds later positions "
                    f"({shown}{rest}) but none follows position {self.last}; every reader "
                    f"stops there (or sets every later record aside)",
                )
            )
        for o, p in pairs:
            at = (p - 1) * 32
            if p <= self.last and self.signed_ahead.get(o) == bytes(self.taken[at : at + 32]):
                self.early += 1  # the relay's own, sent early: readers pass over it
            elif p <= self.last:
                out.append(
                    ChainProblem(
                        position=p,
                        kind="foreign",
                        detail=f"the copy's record at offset {o} claims position {p} before "
                        "its turn: it does not follow the last one taken before it (readers "
                        "set it aside)"
                        + (
                            ""
                            if o in self.signed_ahead
                            else "; unsigned: a copy of the relay's record out of its turn "
                            "and another producer's cannot be told apart"
                        ),
                    )
                )
        return out


def verify_copy(
    store: Iterable[ChainRecord],
    copy: Iterable[CopyRecord],
    limit: int = 20,
    first_offset: Callable[[], int] = lambda: 0,
    *,
    topic: str = "",
    progress: int | None = None,
) -> CopyReport:
    """Pure: walk the copy as a reader does (module docstring): the records taken hold
    positions 1, 2, 3, ... in order, each with the store's bytes, and their chain is intact.
    The copy may end before the store (its relay is behind); it may not go beyond. Records
    marked `foreign` (they fail the signature) and records that do not follow are named by
    offset; a gap is named first; exact copies are counted. At most `limit` problems are kept,
    the rest counted in `more`. `first_offset()`, asked once the copy is read: the topic's first
    offset (its log start): above 0, the topic's start is gone, named first, whatever follows
    (a topic truncated by DeleteRecords read as a relay that had not started: atk50-25 F4).
    `progress`: the position the store's progress row says the relay committed on the topic
    (one that verifies): a copy that ends below it lost committed events (`deleted`), it is not
    a relay catching up ("N events behind the store", exit 0, counted them as waiting)."""
    walk = _Walk(store)
    n = 0
    for rec in copy:
        n += 1
        walk.step(rec)
    ended = walk.end()
    begin = first_offset()
    gone = [
        ChainProblem(
            position=1,
            kind="deleted",
            detail=f"the topic's start is gone (first offset {begin:,}): the records before it "
            "were deleted (Kafka DeleteRecords, or a retention); no reader or restore can "
            "rebuild the log from this topic, and the relay refuses it: "
            + START_GONE_HINT,
        )
    ] if begin > 0 else []  # fmt: skip
    ordered = gone + [p for p in ended if p.kind == "deleted"] + walk.problems
    ordered += [p for p in ended if p.kind != "deleted"]
    report = CopyReport(
        records=n,
        last_position=walk.last,
        store_head=walk.head,
        chain=verify_chain(walk.chain, limit),
        problems=tuple(ordered[:limit]),
        copies=walk.copies,
        early=walk.early,
        more=max(0, len(ordered) - limit),
    )
    return below_progress(report, progress)


def below_progress(report: CopyReport, progress: int | None) -> CopyReport:
    """Pure: `report` with the events the copy lost below the relay's `progress` named first
    (`deleted`), when it ends below it and names no gap already: a progress is written only
    after the Kafka commit it names, so the topic held them (atk50-25 F4, low: "N events
    behind the store", exit 0, read as a relay catching up). The caller passes None while
    another producer's open transaction hides the rest of the topic from the walk."""
    last = report.last_position
    if progress is None or not last < progress <= report.store_head:
        return report
    if any(p.kind == "deleted" for p in report.problems):
        return report
    lost = ChainProblem(
        position=last + 1,
        kind="deleted",
        detail=f"the copy ends at position {last:,}, yet the relay committed up to position "
        f"{progress:,} on it (the store's progress row): positions {last + 1:,} to "
        f"{progress:,} were deleted from the topic, not waiting to be published",
    )
    return msgspec.structs.replace(report, problems=(lost, *report.problems))


class KafkaCopy:
    """Edge: the topic's records for `verify_copy` (iterate it once), and its first offset,
    known once the reading began (`first_offset`)."""

    def __init__(
        self, bootstrap: str, topic: str, timeout_s: float = 60.0, keys: Any = None
    ) -> None:
        self.bootstrap, self.topic, self.timeout_s, self.keys = bootstrap, topic, timeout_s, keys
        self.begins: list[int] = []

    def __iter__(self) -> Iterator[CopyRecord]:
        return kafka_records(self.bootstrap, self.topic, self.timeout_s, self.keys, self.begins)

    def first_offset(self) -> int:
        return self.begins[0] if self.begins else 0


def kafka_records(
    bootstrap: str,
    topic: str,
    timeout_s: float = 60.0,
    keys: Any = None,
    begins: list[int] | None = None,
) -> Iterator[CopyRecord]:
    """Edge: every committed record of the topic's one partition, from its first offset (the
    log start: appended to `begins`), in order; with signing keys (`keys`, else
    GPULEDGER_KAFKA_SIGNING_KEYS) one that fails the signature is marked `foreign`. A seek to
    offset 0 below a raised log start made the client jump to the end (its default reset is
    "latest"): nothing read, "chain intact" (atk50-25 F4)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    from projections.kafka_wire import (
        PARTITION,
        connect_timeout,
        envelope,
        quiet_kafka_logs,
        reader_config,
        relay_shaped,
        signing_keys,
        unreachable,
    )

    keys = signing_keys() if keys is None else keys
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
                auto_offset_reset="earliest",  # never a silent jump to the end
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
        ms = int(timeout_s * 1000)
        end = consumer.end_offsets([tp], timeout_ms=ms)[tp]
        begin = int(consumer.beginning_offsets([tp], timeout_ms=ms)[tp])
        if begins is not None:
            begins.append(begin)
        consumer.seek(tp, begin)
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
                position, tag, _problem = envelope(rec.headers, rec.value, None)
                bad = None if keys is None else keys.problem(rec.headers, rec.value, position, tag)
                if bad is None and not relay_shaped(rec.headers):
                    bad = "it carries a header the relay never writes, or one twice"
                signed = keys is not None and bad is None
                yield CopyRecord(rec.offset, position, bytes(rec.value or b""), tag, bad, signed)
    except KafkaError as err:
        raise AuditError(f"Kafka at {bootstrap}: {type(err).__name__}: {err}") from err
    finally:
        consumer.close()


def kept_progress(home: Any, topic: str) -> int | None:
    """Edge: the relay's progress on `topic` as the store of `home` keeps it, when its row can
    be taken (its MAC verifies under the home's state key, or the home has none), else None."""
    from ledger.store import relay_progress
    from ledger.store.snapshots import state_key

    key = state_key(home, create=False)
    with relay_progress.opened(home) as recorder:
        got = relay_progress.read(recorder, topic)
        if not got:
            return None
        if key is not None:
            mac = relay_progress.read_mac(recorder, topic)
            at = relay_progress.read_anchor(recorder, topic)
            if relay_progress.verdict(recorder, key, topic, got, mac, *at) != "signed":
                return None
    return got
