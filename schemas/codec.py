"""One encoder and one decoder for the whole event vocabulary, built once at import.

Upcasting lives here and only here: `decode` reads every stored version of an event and returns
its latest version (`upcast`), so no reader handles old versions; values stored before their
fields had bounds are clamped into them (`clamp`). The golden corpus under `tests/golden/` holds
stored bytes of every older version that must keep decoding.
"""

from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Iterator
from typing import Any

import msgspec

from schemas.digest import summarise
from schemas.errors import EventDecodeError, InvalidCommand, LedgerError
from schemas.events import (
    EVENT_TYPES,
    OLDER_TYPES,
    TAGS,
    AnyEvent,
    CycleDecided,
    CycleDecidedV1,
    CycleDecidedV2,
    CycleDecidedV3,
    Event,
    JobEngineEnded,
    JobEngineEndedV1,
    JobFinished,
    JobFinishedV1,
    JobRunEnded,
    JobRunEndedV1,
    JobSubmitted,
    JobSubmittedV1,
    RankInputs,
    ServiceConfigured,
    ServiceConfiguredV1,
    StoredEvent,
    UsageSettings,
    Waiting,
    tag_of,
)
from schemas.policy import WEEK_S, from_settings

_encoder = msgspec.json.Encoder(order="deterministic")
_decoder = msgspec.json.Decoder(StoredEvent)


class _TagOnly(msgspec.Struct):
    type: str | None = None


_tag_decoder = msgspec.json.Decoder(_TagOnly)

decode_exact = _decoder.decode
"""The one decoder itself: one event as stored, validated, neither clamped nor upcast; raises
msgspec's errors. For readers that map it over many records at C speed (`projections.batch`);
everyone else calls `decode`."""


def encode(event: AnyEvent) -> bytes:
    """Canonical bytes of an event: the same event always gives the same bytes."""
    return _encoder.encode(event)


def peek_tag(data: bytes) -> str | None:
    """The event tag of raw bytes, or None when the bytes are not a JSON object with one."""
    try:
        return _tag_decoder.decode(data).type
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


_BOUND = re.compile(
    r"^Expected `(?P<kind>int|float|str|array|object)`(?: of length)? (?P<op><=|>=)"
    r" (?P<n>[-0-9.e+]+) - at `\$(?P<path>[^`]*)`$"
)
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def clamp(data: bytes) -> StoredEvent | None:
    """Pure: an event stored before its fields had bounds, with every value that is outside them
    clamped into them (numbers to the nearest bound, text and lists cut to their longest), or
    None when the bytes fail for another reason. The stored bytes (and the hash chain over them)
    stay as they are; every reader sees the same clamped event."""
    try:
        obj: Any = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    for _ in range(1_000):
        try:
            event: StoredEvent = _decoder.decode(msgspec.json.encode(obj))
            return event
        except msgspec.ValidationError as e:
            m = _BOUND.match(str(e))
            if m is None:
                return None
            path = m["path"]
            n = float(m["n"])
            if "[...]" in path:  # a key or value of a mapping: cut every key and value to n
                path, limit = path.split("[...]", 1)[0], int(n)
                if m["kind"] != "str" or m["op"] != "<=":
                    return None
            else:
                limit = None
            steps = [(k, int(i)) if i else (k, None) for k, i in _STEP.findall(path)]
            parent: Any = obj
            for key, index in steps[:-1]:
                parent = parent[key] if index is None else parent[index]
            key, index = steps[-1]
            slot: Any = key if index is None else index
            if limit is not None:
                parent[slot] = {
                    str(k)[:limit]: v[:limit] if isinstance(v, str) else v
                    for k, v in parent[slot].items()
                }
            elif m["kind"] in ("int", "float"):
                parent[slot] = int(n) if m["kind"] == "int" else n
            elif m["op"] == "<=" and m["kind"] == "object":
                parent[slot] = dict(list(parent[slot].items())[: int(n)])
            elif m["op"] == "<=":
                parent[slot] = parent[slot][: int(n)]
            else:
                return None  # too short: nothing to clamp to
    return None


# --- upcasters: older version -> latest version (pure) ------------------------------------------


def decided_v1_to_v2(ev: CycleDecidedV1) -> CycleDecidedV2:
    """Pure: a v1 decision record as v2. Placements and preemptions become references (their
    `JobPlaced`/`JobPreempted` events follow the record in the log); the considered list becomes
    the compact summary with the same order digest replay computes; the rank inputs and typed
    policy config, which v1 did not record, are None."""
    return CycleDecidedV2(
        event_id=ev.event_id,
        at=ev.at,
        actor=ev.actor,
        prev_hash=ev.prev_hash,
        cycle_id=ev.cycle_id,
        based_on=ev.based_on,
        policy_version=ev.policy_version,
        config=ev.config,
        decided_at=ev.decided_at,
        placed=tuple(p.job_id for p in ev.placements),
        preempted=tuple(p.job_id for p in ev.preemptions),
        waiting=summarise(ev.considered),
        fragmentation_gpus=ev.fragmentation_gpus,
        wake_at=ev.wake_at,
    )


def decided_v2_to_v3(ev: CycleDecidedV2) -> CycleDecidedV3:
    """Pure: a v2 decision record as v3, whose policy settings are typed only. The typed config
    v2 wrote beside its strings is kept; a record without one (upcast from v1) has its strings
    read as one (`schemas.policy.from_settings`), and its rank inputs, which it did not record,
    say how its strings counted usage (`window_s`, `half_life_s`) when they do. Strings that no
    code of this build wrote leave `policy` None: replay then says it cannot rebuild it."""
    policy, ranks = ev.policy, ev.ranks
    if policy is None or ranks is None:
        try:
            if policy is None:
                policy = from_settings(ev.policy_version, ev.config)
            if ranks is None:
                ranks = _usage_of_settings(ev.based_on, ev.config)
        except LedgerError:
            policy = None
    fields = msgspec.structs.asdict(ev)  # v3's fields, and v2's `config` strings
    del fields["config"]
    return CycleDecidedV3(**{**fields, "policy": policy, "ranks": ranks})


def decided_v3_to_v4(ev: CycleDecidedV3) -> CycleDecided:
    """Pure: a v3 decision record as v4. Only the waiting summary changes form: v3's fields are
    kept as recorded, `runs` (which v3 did not count) is 0 and `digest_of="jobs"` says its order
    digest covers one entry per job, which replay recomputes as such."""
    w = ev.waiting
    waiting = Waiting(
        considered=w.considered,
        first=w.first,
        counts=w.counts,
        order_digest=w.order_digest,
        digest_of="jobs",
    )
    return CycleDecided(**{**msgspec.structs.asdict(ev), "waiting": waiting})


def _usage_of_settings(based_on: int, settings: dict[str, str]) -> RankInputs | None:
    """How a record's strings say its ranks counted usage (read at `based_on`, as the ranks of
    records without rank inputs were), or None when they do not say."""
    if "window_s" not in settings and "half_life_s" not in settings:
        return None
    window = _seconds(settings, "window_s") if "window_s" in settings else WEEK_S
    half_life = _seconds(settings, "half_life_s") if "half_life_s" in settings else None
    return RankInputs(
        position=based_on, usage=UsageSettings(window_s=window, half_life_s=half_life)
    )


def _seconds(settings: dict[str, str], key: str) -> float:
    try:
        value = float(settings[key])
    except ValueError as err:
        raise InvalidCommand(f"the recorded config has {key}={settings[key]!r}") from err
    if not 0 < value < float("inf"):
        raise InvalidCommand(f"the recorded config has {key}={settings[key]!r}: it must be > 0")
    return value


def submitted_v1_to_v2(ev: JobSubmittedV1) -> JobSubmitted:
    """Pure: a v1 submission as v2: the same contract, its world empty (no working directory,
    environment, output pattern, name, array or dependency: the engine's defaults, as v1 jobs
    ran)."""
    return JobSubmitted(**msgspec.structs.asdict(ev))


def finished_v1_to_v2(ev: JobFinishedV1) -> JobFinished:
    """Pure: a v1 end as v2, its reason the one its outcome says (a v1 time limit or lost node
    was recorded `failed`; the engine's own word, `JobEngineEnded`, still says which)."""
    return JobFinished(**msgspec.structs.asdict(ev), reason=ev.outcome)


def run_ended_v1_to_v2(ev: JobRunEndedV1) -> JobRunEnded:
    """Pure: a v1 stopped run's end as v2: the same end, `started_at` None (v1 had no start of
    its own: its run was charged from its `JobStarted`, or, never started, not at all)."""
    return JobRunEnded(**msgspec.structs.asdict(ev))


def engine_ended_v1_to_v2(ev: JobEngineEndedV1) -> JobEngineEnded:
    """Pure: a v1 engine's end as v2: the same end, `killed` None (v1 did not say whether its
    processes were killed; its note may)."""
    return JobEngineEnded(**msgspec.structs.asdict(ev))


def configured_v1_to_v2(ev: ServiceConfiguredV1) -> ServiceConfigured:
    """Pure: v1 service settings as v2, `grace_s` None: the grace was not recorded (the reads
    count the default, `bounds.DEFAULT_GRACE_S`, as they did)."""
    return ServiceConfigured(**msgspec.structs.asdict(ev))


def upcast(event: StoredEvent) -> AnyEvent:
    """Pure: the latest version of a decoded event (the event itself when it is the latest)."""
    if isinstance(event, JobSubmittedV1):
        return submitted_v1_to_v2(event)
    if isinstance(event, JobFinishedV1):
        return finished_v1_to_v2(event)
    if isinstance(event, JobRunEndedV1):
        return run_ended_v1_to_v2(event)
    if isinstance(event, JobEngineEndedV1):
        return engine_ended_v1_to_v2(event)
    if isinstance(event, ServiceConfiguredV1):
        return configured_v1_to_v2(event)
    if isinstance(event, CycleDecidedV1):
        return decided_v3_to_v4(decided_v2_to_v3(decided_v1_to_v2(event)))
    if isinstance(event, CycleDecidedV2):
        return decided_v3_to_v4(decided_v2_to_v3(event))
    if isinstance(event, CycleDecidedV3):
        return decided_v3_to_v4(event)
    return event


def decode(data: bytes) -> AnyEvent:
    """Decode and validate one event, as the latest version of its type (`upcast`); raise
    EventDecodeError saying whether the tag is known.

    An event outside its fields' bounds (stored before they existed) is clamped into them
    (`clamp`)."""
    return upcast(decode_stored(data))


def decode_stored(data: bytes) -> StoredEvent:
    """`decode` without the upcast: the event in the version it was stored in."""
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as e:
        event = clamp(data)
        if event is not None:
            return event
        raise _error(data, e) from e
    except msgspec.DecodeError as e:
        raise _error(data, e) from e


def _family(cls: type[Event]) -> str:
    """A type's tag without its version: `cycle.decided.v1` -> `cycle.decided`."""
    return tag_of(cls).rsplit(".", 1)[0]


_LATEST_OF_FAMILY = {_family(t): t for t in EVENT_TYPES}
TYPE_OF: dict[str, type[Event]] = {tag_of(t): t for t in EVENT_TYPES + OLDER_TYPES}
"""Every tag that may be stored -> the type stored under it."""
LATEST: dict[type[Event], type[Event]] = {
    t: _LATEST_OF_FAMILY[_family(t)] for t in EVENT_TYPES + OLDER_TYPES
}
"""Every type that may be stored -> the type `upcast` makes of it (itself when latest)."""


def stored_tags(*types: type[Event]) -> list[str]:
    """Every tag stored for events that `upcast` makes into one of `types` (latest versions),
    sorted: what a reader selects from the log by type before it decodes (and so upcasts) the
    events, instead of naming versions itself."""
    wanted = set(types)
    return sorted(tag for tag, t in TYPE_OF.items() if LATEST[t] in wanted)


def _error(data: bytes, e: Exception) -> EventDecodeError:
    tag = peek_tag(data)
    known = tag in TAGS
    what = (
        f"event {tag!r} is invalid"
        if known
        else (f"unknown event type {tag!r}" if tag else "bytes are not an event")
    )
    return EventDecodeError(f"{what}: {e}", tag=tag, known=known)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector waits while many short-lived objects are made (events decoded, a
    decision made or its sort keys built): reference counting frees them, and the collections
    they would set off walk the whole live heap (20-30% of `decide()` at 50,000 pending).
    `Dispatcher.cycle` pauses it around a whole cycle; replay and previews call `decide()`
    alone, which pauses it too."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


FREEZE_EVERY_S = 600.0
"""How often a server moves its long-lived objects out of the cyclic collector's sight
(`freeze_heap`)."""


def freeze_heap() -> None:
    """Collect every generation (what an earlier call froze too), then move what survives to
    the collector's permanent generation: its later full collections walk only the objects
    made since, not a server's whole live state (at 10,000 pending such a collection took
    80-105 ms of CPU inside whichever read set it off: a cold Queue page's, or the event
    loop's, holding the GIL). Reference counting still frees a frozen object; a garbage
    cycle among them waits for the next call (`FREEZE_EVERY_S`)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
