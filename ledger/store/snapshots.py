"""Snapshots of the folded write-side state: start from the newest one that verifies plus the tail.

Stored with eventsourcing's snapshot store (`Application.snapshots`: its `snapshots` table in the
same SQLite file, written in its own transaction) as one stored record per snapshot: originator
= the ledger's stream, version = the log position the snapshot folds, topic = `SNAPSHOT_TOPIC`,
state = the encoded snapshot. eventsourcing's `Snapshot` class is not used: it snapshots an
`Aggregate` object by its `__dict__` and topic, and the ledger's state is a plain folded value
(`ledger.core.state.State`) over one stream, not an eventsourcing aggregate.

A snapshot names the position and the chain link it folds (`projections.chain.link` of the
stored event at that position, the link the next event carries; older snapshots hold a v1 link)
and a digest of its own payload. It verifies when the payload digest matches and the store still
holds that event at that position (`chain.names`); one that does not verify is skipped with a
warning, and the next older one is tried.

Only live states are snapshotted (`State.live_only`): finished jobs have left, so a snapshot's
size follows live work, not history.

**Trust** (docs/security.md, row T7). A plain digest proves nothing against someone who can
write the store: they recompute it. A snapshot therefore carries an HMAC (`mac`) over its
position, version, chain link and payload under the service's state key (`state_key`: a file
made 0600 beside the store, or `GPULEDGER_STATE_KEY_FILE` to keep it outside the data
directory). A start trusts a snapshot whose MAC verifies; one without a good MAC (made before
the key, the key lost, or forged) is checked against the fold of the log up to its position
(`same`: slow, like a start without snapshots, but sure) and, when they differ, refused with an
error naming it. `audit verify` refolds the log and checks every snapshot that way, key or not.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from uuid import NAMESPACE_URL, uuid5

import msgspec

from ledger.core.state import Account, Job, Node, State, StoppedRun, Token
from projections.chain import names
from projections.source import LogRecord
from schemas import events as e
from schemas.codec import configured_v1_to_v2
from schemas.errors import LedgerError

log = logging.getLogger("gpuledger.snapshots")

STREAM_ID = uuid5(NAMESPACE_URL, "gpuledger:ledger")
"""The ledger's one stream: the originator of every event and of every snapshot."""

SNAPSHOT_TOPIC = "ledger.snapshot.v1"
SNAPSHOT_EVERY = 10_000
"""A live ledger snapshots once this many events have been folded since the last snapshot."""
KEEP = 3
"""How many of the newest snapshots a start tries before folding from the beginning."""


class SnapshotError(LedgerError):
    """A stored snapshot does not verify."""

    code = "snapshot"


class Folded(msgspec.Struct, frozen=True, kw_only=True):
    """A live `State` as data (holders and per-node job sets are rebuilt from the jobs' slots)."""

    initialised: bool
    cluster: str
    min_runtime_cap_s: int
    admins: list[str]
    accounts: list[Account]
    members: dict[str, list[str]]
    managers: dict[str, list[str]]
    nodes: list[Node]
    jobs: list[Job]
    next_job_id: int
    events: int
    finished: int
    tokens: list[Token] = []
    """Bearer tokens (their hashes) and the recorded service settings: identity and the queue's
    policy need them after a start from a snapshot."""
    service: e.ServiceConfigured | e.ServiceConfiguredV1 | None = None
    """(A snapshot made before `service.configured.v2` holds a v1, read upcast.)"""
    ends: list[tuple[int, str, float, int | None]] = []
    """Recent job ends kept for dependencies (`State.ends`), oldest first."""
    stopped_runs: list[StoppedRun] | None = None
    """Stopped runs whose end is awaited (`State.stopped_runs`), oldest first; None in a
    snapshot made before they were kept (`same` then compares the rest)."""
    run_ends: list[tuple[int, int, float]] | None = None
    """Runs whose end is recorded (`State.run_ends`: job, run, when), oldest first; None in a
    snapshot made before they were kept (`same` then compares the rest)."""


class StateSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    position: int
    version: int
    chain_hash: str
    """The chain link to the stored event at `position` (`projections.chain.link`; v1 in older
    snapshots)."""
    digest: str
    """SHA-256 of `payload`."""
    payload: bytes
    """The msgpack bytes of a `Folded`."""
    mac: str = ""
    """HMAC-SHA256 of the rest under the service's state key (`signed`; "": none)."""


STATE_KEY = "state.key"
STATE_KEY_ENV = "GPULEDGER_STATE_KEY_FILE"


def state_key(home: Path, *, create: bool = True) -> bytes | None:
    """The service's key for snapshots: `GPULEDGER_STATE_KEY_FILE`, else `home/state.key`,
    made (32 random bytes, 0600) when missing and `create`; None when it cannot be read."""
    path = Path(os.environ.get(STATE_KEY_ENV) or home / STATE_KEY)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if not create:
            return None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_bytes() or None
        except OSError:
            return None
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        return path.read_bytes()
    except OSError:
        return None
    return data or None


def _mac(key: bytes, position: int, version: int, chain_hash: str, payload: bytes) -> str:
    head = f"gpuledger.snapshot.v1\0{position}\0{version}\0{chain_hash}\0".encode()
    return hmac.new(key, head + payload, hashlib.sha256).hexdigest()


def signed(snap: StateSnapshot, key: bytes | None) -> bool:
    """Whether `snap` carries a MAC that verifies under `key`."""
    if key is None or not snap.mac:
        return False
    want = _mac(key, snap.position, snap.version, snap.chain_hash, snap.payload)
    return hmac.compare_digest(want, snap.mac)


def same(a: State, b: State) -> bool:
    """Pure: whether two live states hold the same data (order aside). A state unfolded from a
    snapshot made before `State.stopped_runs` (or `State.run_ends`) was kept is compared
    without them."""
    kept = a.stopped_runs_kept and b.stopped_runs_kept
    ends = a.run_ends_kept and b.run_ends_kept
    x, y = _canonical(a, kept, ends), _canonical(b, kept, ends)
    if any(r.job_name is None for r in [*(x.stopped_runs or ()), *(y.stopped_runs or ())]):
        x, y = _unnamed(x), _unnamed(y)  # a snapshot made before stopped runs kept their name
    if _graceless(x) or _graceless(y):  # made before a run kept its placement's grace
        x, y = _without_grace(x), _without_grace(y)
    return x == y


def _graceless(f: Folded) -> bool:
    """Whether a placed run or a stopped one lacks its placement's grace (`service_grace_s`):
    a snapshot made before it was kept."""
    placed = [j for j in f.jobs if j.placed_at is not None]
    return any(r.service_grace_s is None for r in [*placed, *(f.stopped_runs or ())])


def _without_grace(f: Folded) -> Folded:
    jobs = [msgspec.structs.replace(j, service_grace_s=None) for j in f.jobs]
    runs = [msgspec.structs.replace(r, service_grace_s=None) for r in f.stopped_runs or ()]
    return msgspec.structs.replace(
        f, jobs=jobs, stopped_runs=runs if f.stopped_runs is not None else None
    )


def _unnamed(f: Folded) -> Folded:
    runs = [msgspec.structs.replace(r, job_name=None) for r in f.stopped_runs or ()]
    return msgspec.structs.replace(f, stopped_runs=runs if f.stopped_runs is not None else None)


def _canonical(state: State, stopped_runs: bool = True, run_ends: bool = True) -> Folded:
    f = folded(state)
    return msgspec.structs.replace(
        f,
        stopped_runs=f.stopped_runs if stopped_runs else None,
        run_ends=f.run_ends if run_ends else None,
        accounts=sorted(f.accounts, key=lambda a: a.path),
        nodes=sorted(f.nodes, key=lambda n: n.name),
        jobs=sorted(f.jobs, key=lambda j: j.spec.job_id),
        tokens=sorted(f.tokens, key=lambda t: t.token_id),
    )


_encoder = msgspec.msgpack.Encoder()
_folded = msgspec.msgpack.Decoder(Folded)
_snapshot = msgspec.msgpack.Decoder(StateSnapshot)


def folded(state: State) -> Folded:
    """Pure: the data of a live state."""
    return Folded(
        initialised=state.initialised,
        cluster=state.cluster,
        min_runtime_cap_s=state.min_runtime_cap_s,
        admins=sorted(state.admins),
        accounts=list(state.accounts.values()),
        members={k: sorted(v) for k, v in state.members.items()},
        managers={k: sorted(v) for k, v in state.managers.items()},
        nodes=list(state.nodes.values()),
        jobs=list(state.jobs.values()),
        next_job_id=state.next_job_id,
        events=state.events,
        finished=state.finished,
        tokens=list(state.tokens.values()),
        service=state.service,
        ends=[(job_id, *end) for job_id, end in state.ends.items()],
        stopped_runs=list(state.stopped_runs.values()),
        run_ends=[(job, run, at) for (job, run), at in state.run_ends.items()],
    )


def unfolded(f: Folded) -> State:
    """Pure: the live state a `Folded` holds, with its derived indexes rebuilt."""
    state = State(
        initialised=f.initialised,
        cluster=f.cluster,
        min_runtime_cap_s=f.min_runtime_cap_s,
        admins=set(f.admins),
        accounts={a.path: a for a in f.accounts},
        members={k: set(v) for k, v in f.members.items()},
        managers={k: set(v) for k, v in f.managers.items()},
        nodes={n.name: n for n in f.nodes},
        jobs={j.job_id: j for j in f.jobs},
        next_job_id=f.next_job_id,
        events=f.events,
        live_only=True,
        finished=f.finished,
        tokens={t.token_id: t for t in f.tokens},
        service=(
            configured_v1_to_v2(f.service)
            if isinstance(f.service, e.ServiceConfiguredV1)
            else f.service
        ),
        active={j.job_id for j in f.jobs},  # a live state holds no finished job
        ends={job_id: (why, at, array) for job_id, why, at, array in f.ends},
        stopped_runs={(r.job_id, r.run): r for r in f.stopped_runs or ()},
        stopped_runs_kept=f.stopped_runs is not None,
        run_ends={(job, run): at for job, run, at in f.run_ends or ()},
        run_ends_kept=f.run_ends is not None,
    )
    state.node_jobs = {n: set() for n in state.nodes}
    for j in f.jobs:
        for sl in j.slots:
            state.node_jobs.setdefault(sl.node, set()).add(j.job_id)
            for i in sl.gpu_indices:
                state.holders[(sl.node, i)] = j.job_id
    return state


def encode(
    state: State, position: int, version: int, chain_hash: str, key: bytes | None = None
) -> bytes:
    """Pure: the stored bytes of a snapshot of a live `state` folded up to `position` (with
    its MAC under `key` when given)."""
    if not state.live_only:
        raise ValueError("only live states are snapshotted")
    payload = _encoder.encode(folded(state))
    mac = "" if key is None else _mac(key, position, version, chain_hash, payload)
    return _encoder.encode(
        StateSnapshot(
            position=position,
            version=version,
            chain_hash=chain_hash,
            digest=hashlib.sha256(payload).hexdigest(),
            payload=payload,
            mac=mac,
        )
    )


def decode(data: bytes) -> tuple[StateSnapshot, State]:
    """The snapshot and its state; SnapshotError when the bytes or the payload digest are bad."""
    try:
        snap = _snapshot.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise SnapshotError(f"unreadable snapshot: {err}") from err
    if hashlib.sha256(snap.payload).hexdigest() != snap.digest:
        raise SnapshotError(f"snapshot at position {snap.position}: its payload digest differs")
    try:
        return snap, unfolded(_folded.decode(snap.payload))
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise SnapshotError(f"snapshot at position {snap.position}: {err}") from err


def newest(
    candidates: Iterable[bytes], stored_at: Callable[[int], LogRecord | None]
) -> tuple[StateSnapshot, State] | None:
    """The first of `candidates` (stored snapshots, newest first) that verifies, and its state:
    its bytes and payload digest are good, and the log still holds, at its position, the event
    whose chain link it names (`stored_at(position)`: the stored event there, None when the log
    has no event there). One that does not verify is skipped with a warning; None when none
    does (the fold starts from the beginning)."""
    for data in candidates:
        try:
            snap, state = decode(data)
            found = stored_at(snap.position)
            if found is None:
                raise SnapshotError(
                    f"snapshot at position {snap.position}: the log has no event there"
                )
            if not names(snap.chain_hash, found.position, found.tag, found.data):
                raise SnapshotError(
                    f"snapshot at position {snap.position}: the chain hash differs from the log's"
                )
        except SnapshotError as err:
            log.warning("snapshot skipped: %s", err.line())
            continue
        return snap, state
    return None


class _Anchor(msgspec.Struct, frozen=True, kw_only=True):
    position: int
    chain_hash: str


_anchor = msgspec.msgpack.Decoder(_Anchor)


def anchors(candidates: Iterable[bytes]) -> list[tuple[int, str]]:
    """Pure: (position, chain link) of each stored snapshot that reads, without unfolding its
    state (the audit checks the log still holds the events they name)."""
    out = []
    for data in candidates:
        try:
            got = _anchor.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        out.append((got.position, got.chain_hash))
    return out
