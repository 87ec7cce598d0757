"""Turn a batch of log records into Arrow tables, the inputs of `apply.sql`.

Pure: bytes in, Arrow tables out; no I/O. Every record is decoded by the codec
(`schemas.codec`: its one decoder, its clamping and its upcasts, so the tables hold the latest
version of every event; a record that fails stops the batch with `CorruptEvent` naming its
position). A record whose tag this code does not know is kept if it is a JSON object (forward
compatibility) and counted; anything else is corrupt.

Speed: decoding builds hundreds of thousands of short-lived objects per second; the cyclic garbage
collector would walk them all again and again, so it is paused while a batch decodes (the objects
hold no cycles and die with the batch).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from projections.chain import link
from projections.errors import CorruptEvent
from projections.source import LogRecord, Row
from schemas import codec
from schemas import events as e
from schemas.codec import gc_paused
from schemas.errors import EventDecodeError
from schemas.events import TAGS

_object_decoder = msgspec.json.Decoder(dict[str, Any])
"""Records of tags this code does not know: kept when they are JSON objects."""
_TAG_OF: dict[type, str] = {cls: tag for tag, cls in codec.TYPE_OF.items()}

_JSON = pa.json_(pa.large_string())
"""`raw` as Arrow's JSON type: DuckDB takes it as its JSON type without parsing every value to
check it (the decoder has parsed them all)."""

_SLOTS = pa.list_(pa.struct([("node", pa.string()), ("gpu_indices", pa.list_(pa.int32()))]))

SCHEMAS: dict[str, pa.Schema] = {
    "b_events": pa.schema(
        [
            ("position", pa.int64()),
            ("tag", pa.string()),
            ("known", pa.bool_()),
            ("raw", _JSON),
        ]
    ),
    "b_accounts": pa.schema(
        [
            ("account", pa.string()),
            ("position", pa.int64()),
            ("changed_at", pa.float64()),
            ("tag", pa.string()),
            ("parent", pa.string()),
            ("kind", pa.string()),
            ("shares", pa.int32()),
            ("open", pa.bool_()),
            ("reason", pa.string()),
        ]
    ),
    "b_nodes": pa.schema(
        [
            ("node", pa.string()),
            ("position", pa.int64()),
            ("changed_at", pa.float64()),
            ("tag", pa.string()),
            ("cluster", pa.string()),
            ("gpu_type", pa.string()),
            ("gpus", pa.int32()),
            ("state", pa.string()),
            ("reason", pa.string()),
        ]
    ),
    "b_submitted": pa.schema(
        [
            ("job_id", pa.int64()),
            ("account", pa.string()),
            ("user_name", pa.string()),
            ("gpus", pa.int32()),
            ("gpu_type", pa.string()),
            ("cluster", pa.string()),
            ("min_runtime_s", pa.int64()),
            ("resumable", pa.bool_()),
            ("priority", pa.int32()),
            ("debug", pa.bool_()),
            ("time_limit_s", pa.int64()),
            ("duration_s", pa.float64()),
            ("submitted_at", pa.float64()),
            ("submitted_position", pa.int64()),
            ("command", pa.list_(pa.string())),
            ("job_name", pa.string()),
            ("workdir", pa.string()),
            ("array_job_id", pa.int64()),
            ("array_task_id", pa.int64()),
        ]
    ),
    "b_placed": pa.schema(
        [
            ("job_id", pa.int64()),
            ("position", pa.int64()),
            ("event_at", pa.float64()),
            ("cycle_id", pa.string()),
            ("slots", _SLOTS),
        ]
    ),
    "b_preempted": pa.schema(
        [
            ("position", pa.int64()),
            ("preempted_at", pa.float64()),
            ("job_id", pa.int64()),
            ("reason", pa.string()),
            ("for_job", pa.int64()),
            ("cycle_id", pa.string()),
            ("note", pa.string()),
            ("actor", pa.string()),
        ]
    ),
    "b_finished": pa.schema(
        [
            ("position", pa.int64()),
            ("outcome", pa.string()),
            ("exit_code", pa.int32()),
            ("reason", pa.string()),
            ("note", pa.string()),
            ("ended_at", pa.float64()),
        ]
    ),
    "b_started": pa.schema(
        [
            ("position", pa.int64()),
            ("logs", pa.list_(pa.string())),
            ("started_at", pa.float64()),
        ]
    ),
    "b_run_ended": pa.schema(
        [
            ("position", pa.int64()),
            ("job_id", pa.int64()),
            ("run", pa.int64()),
            ("ended_at", pa.float64()),
            ("event_at", pa.float64()),
            ("started_at", pa.float64()),
            ("exit_code", pa.int32()),
            ("by_itself", pa.bool_()),
        ]
    ),
    "b_engine_ended": pa.schema(
        [
            ("position", pa.int64()),
            ("reason", pa.string()),
        ]
    ),
    "b_engine_linked": pa.schema(
        [
            ("position", pa.int64()),
            ("engine_job_id", pa.string()),
        ]
    ),
    "b_cycles": pa.schema(
        [
            ("position", pa.int64()),
            ("decided_at", pa.float64()),
            ("cycle_id", pa.string()),
            ("based_on", pa.int64()),
            ("policy_version", pa.string()),
            ("placed_jobs", pa.list_(pa.int64())),
            ("preempted_jobs", pa.list_(pa.int64())),
            ("considered", pa.int32()),
            ("fragmentation_gpus", pa.int32()),
            ("policy", pa.string()),
        ]
    ),
}


@dataclass(frozen=True)
class Batch:
    """One batch ready for `apply.sql`: one Arrow table per input (some empty) and counts."""

    first: int
    last: int
    events: int
    unknown: int
    tables: dict[str, pa.Table]
    counts: dict[str, int]
    """Rows per input of `apply.sql`, including the views read back from `events`."""
    chain: str | None = None
    """The chain hash of the batch's last record (what the next record must link to); None
    when the batch moves no record (only poison set aside)."""


class Group:
    """The events of one type in a batch: positions and decoded events, in log order. Only the
    types a table is built from (`KEPT`) keep their events, and of some types (`REDUCED`) only
    the one field a table reads; the others are validated and dropped at once, keeping only
    their positions (holding every decoded event of a batch alive cost three times the
    decoding itself)."""

    __slots__ = ("events", "positions")

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.events: list[Any] = []


KEPT: frozenset[type] = frozenset(
    {
        e.AccountOpened,
        e.SharesSet,
        e.AccountClosed,
        e.NodeRegistered,
        e.NodeDrainRequested,
        e.NodeDrained,
        e.NodeReturned,
        e.NodeRemoved,
        e.NodeLost,
        e.JobSubmitted,
        e.JobPlaced,
        e.JobStarted,
        e.JobPreempted,
        e.JobFinished,
        e.JobEngineEnded,
        e.JobEngineLinked,
        e.JobRunEnded,
        e.CycleDecided,
    }
)
"""The event types whose fields the batch tables read (`apply.sql` takes the rest from `raw`)."""

REDUCED: dict[type, Callable[[Any], Any]] = {
    e.JobStarted: attrgetter("logs", "started_at"),
    e.JobEngineLinked: attrgetter("engine_job_id"),
}
"""Kept types of which a group keeps one value per event instead of the event (many events, one
small field read)."""


def _drop(_: Any) -> None:
    return None


def _keeping(group: Group, latest: type, cls: type) -> Callable[[Any], None]:
    """How `decode_records` keeps an event of type `cls` in the group of `latest`: upcast on the
    way in (readers see the latest version), reduced to its field when the type is REDUCED."""
    if latest not in KEPT:
        return _drop
    keep = group.events.append
    reduce = REDUCED.get(latest)
    if reduce is not None:
        keep = _then(reduce, keep)
    return keep if latest is cls else _then(codec.upcast, keep)


def _then(f: Callable[[Any], Any], g: Callable[[Any], None]) -> Callable[[Any], None]:
    return lambda ev: g(f(ev))


def decode_records(records: Sequence[Row]) -> tuple[dict[type, Group], list[int]]:
    """Pure: validate every record and group the events by type (only the types of `KEPT`
    keep their events); also return the positions of the records whose tag this code does not
    know.

    Raises CorruptEvent for the first record that is not a valid event of its (known) tag, or that
    has an unknown tag and is not a JSON object.
    """
    groups: dict[type, Group] = {}
    sinks: dict[str, tuple[type, Callable[[int], None], Callable[[Any], None]]] = {}
    unknown: list[int] = []
    decode = codec.decode_stored
    with gc_paused():
        for rec in records:
            position, tag, data = rec
            sink = sinks.get(tag)
            if sink is None and tag in TAGS:
                cls = codec.TYPE_OF[tag]
                latest = codec.LATEST[cls]
                group = groups.get(latest) or groups.setdefault(latest, Group())
                sink = sinks[tag] = (cls, group.positions.append, _keeping(group, latest, cls))
            if sink is not None:
                try:
                    ev = decode(data)  # clamped into the bounds when stored before them
                except EventDecodeError as err:
                    why = err.__cause__ or err
                    raise _corrupt(rec, f"event {tag!r} is invalid: {why}", known=True) from err
                if type(ev) is not sink[0]:
                    raise _corrupt(
                        rec,
                        f"the log says {tag!r} but the bytes hold {_TAG_OF[type(ev)]!r}",
                        known=True,
                    )
                sink[1](position)
                sink[2](ev)
            else:
                try:
                    _object_decoder.decode(data)
                except (msgspec.DecodeError, msgspec.ValidationError) as err:
                    raise _corrupt(
                        rec,
                        f"unknown event type {tag!r} is not a JSON object: {err}",
                        known=False,
                    ) from err
                unknown.append(position)
    return groups, unknown


def _pick(seq: Sequence[Any], idx: list[int]) -> list[Any]:
    """seq[i] for i in idx, as a list (one C call, not a Python loop)."""
    if len(idx) == 1:
        return [seq[idx[0]]]
    return list(itemgetter(*idx)(seq))


def _decode_grouped(
    positions: list[int], tags: pa.Array, datas: list[bytes]
) -> tuple[dict[type, Group], list[int]] | None:
    """Pure: what `decode_records` returns, found tag by tag without a Python step per record:
    the records are grouped by tag (Arrow), each group is decoded by C-level `map`s with the
    codec's decoder, the events of types no table reads freed at once, and the group checked to
    hold only its tag's type; the versions of one type are upcast and merged in log order. None
    when any record is not a plain valid event of its tag (invalid, clamped, another type than
    its tag, an unknown tag that is not a JSON object): `decode_records` then handles the batch
    record by record, with its errors."""
    encoded = tags.dictionary_encode()
    order = pc.array_sort_indices(encoded.indices).to_pylist()  # stable: log order per tag
    runs = pc.run_end_encode(encoded.indices.take(order))
    names = encoded.dictionary.to_pylist()
    decode = codec.decode_exact
    groups: dict[type, Group] = {}
    merged: set[type] = set()
    unknown: list[int] = []
    start = 0
    try:
        for code, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist(), strict=True):
            idx = order[start:end]
            start = end
            tag = names[code]
            cls = codec.TYPE_OF.get(tag) if tag in TAGS else None
            if cls is None:  # a tag this code does not know: kept if it is a JSON object
                if set(map(type, map(_object_decoder.decode, _pick(datas, idx)))) != {dict}:
                    return None
                unknown.extend(_pick(positions, idx))
                continue
            latest = codec.LATEST[cls]
            group = Group()
            group.positions = _pick(positions, idx)
            if latest in KEPT:
                group.events = list(map(decode, _pick(datas, idx)))
                if set(map(type, group.events)) != {cls}:
                    return None
                if latest is not cls:
                    group.events = list(map(codec.upcast, group.events))
                if latest in REDUCED:
                    group.events = list(map(REDUCED[latest], group.events))
            elif set(map(type, map(decode, _pick(datas, idx)))) != {cls}:
                return None
            if latest in groups:  # another version of the same type: merged below
                merged.add(latest)
                _extend(groups[latest], group)
            else:
                groups[latest] = group
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    for latest in merged:
        _in_log_order(groups[latest])
    unknown.sort()
    return groups, unknown


def _extend(group: Group, more: Group) -> None:
    group.positions += more.positions
    group.events += more.events


def _in_log_order(group: Group) -> None:
    """Sort a group merged from several versions back into log order."""
    order = sorted(range(len(group.positions)), key=group.positions.__getitem__)
    group.positions = [group.positions[i] for i in order]
    if group.events:
        group.events = [group.events[i] for i in order]


def _corrupt(row: Row, what: str, *, known: bool) -> CorruptEvent:
    rec = LogRecord(*row)
    return CorruptEvent(
        f"log position {rec.position}: {what}",
        hint="the event log is damaged at that position; restore it from a copy (the projector "
        "stops there and skips nothing)",
        position=rec.position,
        tag=rec.tag,
        known=known,
    )


def build_batch(records: Sequence[Row], rows: pa.Table | None = None) -> Batch:
    """Pure: decode `records` (in log order) into the Arrow inputs of `apply.sql`; `rows`: their
    `events` input if `events_rows` made it already."""
    with gc_paused():
        return _build(records, rows)


def events_rows(records: Sequence[Row]) -> pa.Table:
    """Pure: the `events` input of a batch alone, made before its records are decoded (so that
    DuckDB can insert them while the rest decodes). Raises CorruptEvent for bytes that are not
    UTF-8; a record that does not decode is found by `build_batch`."""
    with gc_paused():
        positions, tags, datas = _columns(records)
        return _events(records, positions, tags, datas)


def empty_tables() -> dict[str, pa.Table]:
    """Empty inputs, to bind the views of `apply.sql` before the first batch."""
    return {name: schema.empty_table() for name, schema in SCHEMAS.items()}


def _columns(records: Sequence[Row]) -> tuple[list[int], pa.Array, list[bytes]]:
    """The records' positions, tags (Arrow) and bytes."""
    positions = list(map(_POSITION, records))
    tags = pa.array(map(_TAG, records), pa.string(), size=len(records))
    return positions, tags, list(map(_DATA, records))


def _build(records: Sequence[Row], rows: pa.Table | None) -> Batch:
    positions, tags, datas = _columns(records)
    found = _decode_grouped(positions, tags, datas)
    groups, unknown = decode_records(records) if found is None else found
    tables = {
        "b_events": _events(records, positions, tags, datas) if rows is None else rows,
        "b_accounts": _accounts(groups),
        "b_nodes": _nodes(groups),
        "b_submitted": _submitted(groups),
        "b_placed": _placed(groups),
        "b_preempted": _preempted(groups),
        "b_finished": _finished(groups),
        "b_started": _started(groups),
        "b_engine_ended": _engine_ended(groups),
        "b_run_ended": _run_ended(groups),
        "b_engine_linked": _engine_linked(groups),
        "b_cycles": _cycles(groups),
    }
    counts = {name: t.num_rows for name, t in tables.items()}
    counts["b_jobev"] = sum(len(groups[c].positions) for c in _LIFECYCLE if c in groups)
    unplaced = len(groups[e.JobUnplaced].positions) if e.JobUnplaced in groups else 0
    counts["ends"] = counts["b_preempted"] + counts["b_finished"] + unplaced  # `b_ends`
    counts["starts"] = counts["b_started"]
    del groups  # free the decoded events while the collector is paused
    return Batch(
        first=records[0][0],
        last=records[-1][0],
        events=len(records),
        unknown=len(unknown),
        tables=tables,
        counts=counts,
        chain=link(records[-1][0], records[-1][1], records[-1][2]),
    )


def _raw(datas: Sequence[bytes]) -> pa.Array:
    """The records' bytes as one Arrow string column, built from buffers (no per-row objects)."""
    lengths = pa.array(map(len, datas), pa.int64(), size=len(datas))
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(lengths)])
    data = pa.py_buffer(b"".join(datas))
    return pa.Array.from_buffers(pa.large_string(), len(datas), [None, offsets.buffers()[1], data])


_POSITION, _TAG, _DATA = itemgetter(0), itemgetter(1), itemgetter(2)
_KNOWN_TAGS = pa.array(sorted(TAGS), pa.string())


def _events(
    records: Sequence[Row],
    positions: list[int],
    tags: pa.Array,
    datas: list[bytes],
) -> pa.Table:
    """Every record as it is stored; `apply.sql` extracts the common fields from the JSON.
    `known`: the tag is one this code decodes (the others are the batch's unknown records)."""
    known = pc.is_in(tags, value_set=_KNOWN_TAGS)
    raw = _raw(datas)
    try:
        raw.validate(full=True)  # UTF-8: msgspec does not check the fields it skips
    except pa.ArrowInvalid:
        for rec in records:
            try:
                rec[2].decode("utf-8")
            except UnicodeDecodeError as err:
                raise _corrupt(
                    rec, f"the bytes are not UTF-8: {err}", known=rec[1] in TAGS
                ) from err
        raise
    return pa.Table.from_arrays(
        [pa.array(positions, pa.int64()), tags, known, pa.ExtensionArray.from_storage(_JSON, raw)],
        schema=SCHEMAS["b_events"],
    )


_EMPTY_GROUP = Group()


def _table(name: str, columns: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pydict(columns, schema=SCHEMAS[name])


def _accounts(groups: dict[type, Group]) -> pa.Table:
    rows: list[tuple[Any, ...]] = []
    for cls in (e.AccountOpened, e.SharesSet, e.AccountClosed):
        g = groups.get(cls, _EMPTY_GROUP)
        tag = _TAG_OF[cls]
        for pos, ev in zip(g.positions, g.events, strict=True):
            if cls is e.AccountOpened:
                rows.append((ev.path, pos, ev.at, tag, ev.parent, ev.kind, None, True, ""))
            elif cls is e.SharesSet:
                rows.append((ev.account, pos, ev.at, tag, None, None, ev.shares, None, ev.reason))
            else:
                rows.append((ev.path, pos, ev.at, tag, None, None, None, False, ev.reason))
    return _rows_table("b_accounts", rows)


_NODE_STATE: dict[type, str] = {
    e.NodeRegistered: "active",
    e.NodeDrainRequested: "draining",
    e.NodeDrained: "drained",
    e.NodeReturned: "active",
    e.NodeRemoved: "removed",
    e.NodeLost: "lost",
}


def _nodes(groups: dict[type, Group]) -> pa.Table:
    rows: list[tuple[Any, ...]] = []
    for cls, state in _NODE_STATE.items():
        g = groups.get(cls, _EMPTY_GROUP)
        tag = _TAG_OF[cls]
        for pos, ev in zip(g.positions, g.events, strict=True):
            if cls is e.NodeRegistered:
                rows.append((ev.node, pos, ev.at, tag, ev.cluster, ev.gpu_type, ev.gpus, state, ""))
            else:
                reason = getattr(ev, "reason", "")
                rows.append((ev.node, pos, ev.at, tag, None, None, None, state, reason))
    return _rows_table("b_nodes", rows)


def _rows_table(name: str, rows: list[tuple[Any, ...]]) -> pa.Table:
    names = SCHEMAS[name].names
    columns = zip(*rows, strict=True) if rows else ([] for _ in names)
    return _table(name, dict(zip(names, (list(c) for c in columns), strict=True)))


def _submitted(groups: dict[type, Group]) -> pa.Table:
    g = groups.get(e.JobSubmitted, _EMPTY_GROUP)
    evs = g.events
    return _table(
        "b_submitted",
        {
            "job_id": [ev.job_id for ev in evs],
            "account": [ev.account for ev in evs],
            "user_name": [ev.user for ev in evs],
            "gpus": [ev.gpus for ev in evs],
            "gpu_type": [ev.gpu_type for ev in evs],
            "cluster": [ev.cluster for ev in evs],
            "min_runtime_s": [ev.min_runtime_s for ev in evs],
            "resumable": [ev.resumable for ev in evs],
            "priority": [ev.priority for ev in evs],
            "debug": [ev.debug for ev in evs],
            "time_limit_s": [ev.time_limit_s for ev in evs],
            "duration_s": [ev.duration_s for ev in evs],
            "submitted_at": [ev.at for ev in evs],
            "submitted_position": g.positions,
            "command": _string_lists([ev.command for ev in evs]),
            "job_name": [ev.job_name for ev in evs],
            "workdir": [ev.workdir for ev in evs],
            "array_job_id": [ev.array_job_id for ev in evs],
            "array_task_id": [ev.array_task_id for ev in evs],
        },
    )


def _string_lists(lists: list[tuple[str, ...]]) -> pa.Array:
    """Tuples of strings as list<string>, from one flat column and offsets (several times
    faster than converting each tuple)."""
    lengths = pa.array(map(len, lists), pa.int32(), size=len(lists))
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(lengths)])
    flat = pa.array(itertools.chain.from_iterable(lists), pa.string())
    return pa.ListArray.from_arrays(offsets, flat)


_LIFECYCLE = (
    e.JobPlaced,
    e.JobStarted,
    e.JobPreempted,
    e.JobRequeued,
    e.JobUnplaced,
    e.JobFinished,
    e.CheckpointReported,
    e.JobHeld,
    e.JobReleased,
    e.JobEngineEnded,
    e.JobEngineLinked,
)
"""The job events that `apply.sql` reads back from the batch's rows of `events` (b_jobev)."""


def _placed(groups: dict[type, Group]) -> pa.Table:
    g = groups.get(e.JobPlaced, _EMPTY_GROUP)
    evs = g.events
    return _table(
        "b_placed",
        {
            "job_id": [ev.job_id for ev in evs],
            "position": g.positions,
            "event_at": [ev.at for ev in evs],
            "cycle_id": [ev.cycle_id for ev in evs],
            "slots": _slots(evs),
        },
    )


def _slots(placements: list[Any]) -> pa.Array:
    """The placements' slots as list<struct<node, list<int>>>, from flat columns and offsets
    (several times faster than converting nested Python objects)."""
    nodes: list[str] = []
    indices: list[int] = []
    index_offsets = [0]
    slot_offsets = [0]
    for ev in placements:
        for sl in ev.slots:
            nodes.append(sl.node)
            indices.extend(sl.gpu_indices)
            index_offsets.append(len(indices))
        slot_offsets.append(len(nodes))
    gpu_indices = pa.ListArray.from_arrays(
        pa.array(index_offsets, pa.int32()), pa.array(indices, pa.int32())
    )
    slot = pa.StructArray.from_arrays(
        [pa.array(nodes, pa.string()), gpu_indices], fields=list(_SLOTS.value_type)
    )
    return pa.ListArray.from_arrays(pa.array(slot_offsets, pa.int32()), slot)


def _preempted(groups: dict[type, Group]) -> pa.Table:
    g = groups.get(e.JobPreempted, _EMPTY_GROUP)
    evs = g.events
    return _table(
        "b_preempted",
        {
            "position": g.positions,
            "preempted_at": [ev.at for ev in evs],
            "job_id": [ev.job_id for ev in evs],
            "reason": [ev.reason for ev in evs],
            "for_job": [ev.for_job for ev in evs],
            "cycle_id": [ev.cycle_id for ev in evs],
            "note": [ev.note for ev in evs],
            "actor": [ev.actor for ev in evs],
        },
    )


def _finished(groups: dict[type, Group]) -> pa.Table:
    """JobFinished's outcome, exit code, reason, note and real end (what `b_jobev` would
    otherwise read back out of the stored JSON: decompressing every `raw` of the batch)."""
    g = groups.get(e.JobFinished, _EMPTY_GROUP)
    evs = g.events
    return _table(
        "b_finished",
        {
            "position": g.positions,
            "outcome": [ev.outcome for ev in evs],
            "exit_code": [ev.exit_code for ev in evs],
            "reason": [ev.reason for ev in evs],
            "note": [ev.note for ev in evs],
            "ended_at": [ev.ended_at for ev in evs],
        },
    )


def _started(groups: dict[type, Group]) -> pa.Table:
    """JobStarted's logs (the job's `logs` in `jobs`) and the engine's start of the run (its
    `started_at`, e.g. Slurm's StartTime: the event itself is recorded when it was seen; an
    interval is charged from it)."""
    g = groups.get(e.JobStarted, _EMPTY_GROUP)  # REDUCED: its events are (logs, started_at)
    return _table(
        "b_started",
        {
            "position": g.positions,
            "logs": _string_lists([logs for logs, _ in g.events]),
            "started_at": [at for _, at in g.events],
        },
    )


def _run_ended(groups: dict[type, Group]) -> pa.Table:
    """When runs really ended as their engines say (the end of an interval's charge, when
    earlier than its release): `JobRunEnded` names its run; `JobEngineEnded` (run NULL) is the
    end of the job's current run, recorded with its release. A `JobRunEnded` may also say when
    its run started where no `JobStarted` did (`started_at`: `intervals_run_ended`), and its
    exit code and whether its command ended by itself (a fenced job's real code, a cancelled
    job's own: `jobs_run_exit`)."""
    g = groups.get(e.JobRunEnded, _EMPTY_GROUP)
    x = groups.get(e.JobEngineEnded, _EMPTY_GROUP)
    # a fence's end is no run's real end: its node's report is (`events.FENCED_STATE`)
    heard = [(pos, ev) for pos, ev in zip(x.positions, x.events, strict=True) if not e.fenced(ev)]
    x_positions, x_events = [p for p, _ in heard], [ev for _, ev in heard]
    evs = [*g.events, *x_events]
    return _table(
        "b_run_ended",
        {
            "position": [*g.positions, *x_positions],
            "job_id": [ev.job_id for ev in evs],
            "run": [ev.run for ev in g.events] + [None] * len(x_events),
            "ended_at": [ev.at if ev.ended_at is None else ev.ended_at for ev in evs],
            "event_at": [ev.at for ev in evs],
            "started_at": [ev.started_at for ev in g.events] + [None] * len(x_events),
            "exit_code": [ev.exit_code for ev in g.events] + [None] * len(x_events),
            "by_itself": [ev.by_itself for ev in g.events] + [False] * len(x_events),
        },
    )


def _engine_ended(groups: dict[type, Group]) -> pa.Table:
    """How the engine says a run ended (the job's `finish_reason` in `jobs`)."""
    g = groups.get(e.JobEngineEnded, _EMPTY_GROUP)
    return _table(
        "b_engine_ended", {"position": g.positions, "reason": [ev.reason for ev in g.events]}
    )


def _engine_linked(groups: dict[type, Group]) -> pa.Table:
    """The engine's id of a run (the job's `engine_job_id` in `jobs`)."""
    g = groups.get(e.JobEngineLinked, _EMPTY_GROUP)  # REDUCED: its events are their ids
    return _table("b_engine_linked", {"position": g.positions, "engine_job_id": g.events})


def _cycles(groups: dict[type, Group]) -> pa.Table:
    g = groups.get(e.CycleDecided, _EMPTY_GROUP)
    evs = g.events
    return _table(
        "b_cycles",
        {
            "position": g.positions,
            "decided_at": [ev.at for ev in evs],
            "cycle_id": [ev.cycle_id for ev in evs],
            "based_on": [ev.based_on for ev in evs],
            "policy_version": [ev.policy_version for ev in evs],
            "placed_jobs": [list(ev.placed) for ev in evs],
            "preempted_jobs": [list(ev.preempted) for ev in evs],
            "considered": [ev.waiting.considered for ev in evs],
            "fragmentation_gpus": [ev.fragmentation_gpus for ev in evs],
            "policy": [msgspec.json.encode(ev.policy).decode() for ev in evs],
        },
    )
