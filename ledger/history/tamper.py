"""The audit's tamper evidence: the hash chain recomputed over the store and its copies.

Every stored event carries `prev_hash`, the link to the event before it
(`projections.chain`: under v2, the SHA-256 of the previous stored row's position, stream
version, tag and payload; under v1, of its payload alone), the first event "". `verify_chain`
recomputes every link under the rule it is written in, checks each row on its own, and names
what broke:

- `edited`: a row no longer matches what its successor's link recorded (the edited row's
  position is reported; its successor is where the link breaks). When a row's own link is broken
  too, that row is the edited one (its `prev_hash` was changed with it). Checked on every row
  whatever its successor says: its stored tag must be its event's type, its stream version its
  position, its stream the ledger's, and a link to it kept elsewhere (an *anchor*: a snapshot,
  the projection's tracking) must still name it; so an edit of any column of any row, the last
  one too when an anchor covers it, is named at its row;
- `broken-link`: the last event's `prev_hash` does not match its predecessor. Nothing after it
  tells whether the predecessor was edited or the last event's link was changed, so the break
  is named as what it is, at the last event;
- `deleted`: positions are missing (a gap), or a link points at bytes found nowhere in the log
  right after an intact event whose version numbering jumps;
- `reordered`: an event links to an event that is not its predecessor;
- `corrupt`: bytes that are not an event (no readable `prev_hash`), or a row whose value is not
  stored as bytes (rewritten outside the ledger, e.g. as TEXT: checked as its UTF-8 bytes);
- `downgraded`: a v1 link after the log moved to v2 links;
- `mismatch`, `extra`, `foreign` (copies): the Kafka copy's checks (`ledger.history.copy_check`).

The last event has no successor, so an edit of its payload alone is only visible against an
anchor: the head link the report prints (keep it elsewhere), the projection's tracking, a
snapshot at its position, or the Kafka copy (`ledger.history.copy_check.verify_copy`).

Pure: `verify_chain`. Edges: `store_records`, `store_anchors`.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

import msgspec

from ledger.store import EVENTS_DB, has_log, relay_progress, snapshots
from ledger.store.locate import open_source, stored_rows
from ledger.store.snapshots import STREAM_ID
from projections.chain import frame, link, names, prev_hash, rule
from projections.source import follow
from projections.store import Store, projection_path
from schemas import codec
from schemas.errors import LedgerError

if TYPE_CHECKING:
    import duckdb


class AuditError(LedgerError):
    """The audit cannot run (no log, Kafka unreachable, ...); not a finding."""

    code = "audit"


class ChainRecord(NamedTuple):
    """One stored event as the chain sees it: every column of its row."""

    position: int
    data: bytes
    version: int | None = None
    """The store's stream version (position and version move together in a one-stream log)."""
    stored_as: str = "blob"
    """The SQLite type the value was stored as (the ledger writes blobs)."""
    tag: str | None = None
    """The stored tag (None: not checked, as for a copy that holds no tags)."""
    stream: str | None = None
    """The stored stream id (None: not checked)."""


class Anchor(NamedTuple):
    """A link to one stored event kept outside the log's own chain."""

    position: int
    link: str
    source: str
    """Who keeps it: "snapshot", "projection", ..."""


ProblemKind = Literal[
    "edited",
    "broken-link",
    "deleted",
    "reordered",
    "corrupt",
    "downgraded",
    "mismatch",
    "extra",
    "foreign",
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
    """The link to the last event under the current rule (every column of its row): an anchor
    to keep elsewhere (the chain cannot protect the last event on its own)."""
    problems: tuple[ChainProblem, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


class _Break(NamedTuple):
    i: int
    position: int
    want: str


def _row_problems(
    rec: ChainRecord, stream: str | None, anchors: Mapping[int, list[Anchor]]
) -> list[ChainProblem]:
    """Pure: what is wrong with one row on its own (its tag, version, stream, type, anchors)."""
    out = []

    def edited(detail: str, kind: ProblemKind = "edited") -> None:
        out.append(ChainProblem(position=rec.position, kind=kind, detail=detail))

    if rec.stored_as != "blob":
        edited(
            f"stored as {rec.stored_as}, not as bytes: the row was rewritten outside the ledger "
            "(checked as its UTF-8 bytes)",
            "corrupt",
        )
    if rec.tag is not None:
        typed = codec.peek_tag(rec.data)
        if typed is not None and typed != rec.tag:
            edited(f"its stored tag {rec.tag!r} is not its event's type {typed!r}")
    if stream is not None and rec.stream is not None and rec.stream != stream:
        edited(f"its stream id {rec.stream!r} is not the ledger's ({stream!r})")
    for a in anchors.get(rec.position, ()):
        if not names(a.link, rec.position, rec.tag or "", rec.data, rec.version):
            edited(f"it no longer matches the link the {a.source} keeps for position {a.position}")
    return out


def verify_chain(
    records: Iterable[ChainRecord],
    limit: int = 20,
    *,
    stream: str | None = None,
    anchors: Iterable[Anchor] = (),
) -> ChainReport:
    """Pure: recompute the hash chain over `records` (in position order), each link under the
    rule it is written in, check every row on its own (its tag, its version, its `stream` id, the
    `anchors` at its position) and classify every broken link (see the module docstring).
    Memory: 64 bytes per event for the digests (v1 and v2), so a broken link can be matched
    against any earlier or later event."""
    by_position: dict[int, list[Anchor]] = {}
    for a in anchors:
        by_position.setdefault(a.position, []).append(a)
    digests = {1: bytearray(), 2: bytearray()}
    positions: list[int] = []
    links_ok: list[bool] = []
    problems: list[ChainProblem] = []
    breaks: list[_Break] = []
    gaps: set[int] = set()
    offsets: list[int | None] = []
    last = {1: "", 2: ""}
    renumbered: str | None = None
    prev_pos, upgraded = 0, False
    near = _Near()
    for i, rec in enumerate(records):
        near.add(i, rec)
        v1 = hashlib.sha256(rec.data).digest()
        v2 = hashlib.sha256(frame(rec.position, rec.tag or "", rec.data, rec.version)).digest()
        positions.append(rec.position)
        offsets.append(None if rec.version is None else rec.version - rec.position)
        got = prev_hash(rec.data)
        if rec.position != prev_pos + 1:
            if rec.position > prev_pos + 1:
                gaps.add(i)
                end = rec.position - 1
                span = f"position {prev_pos + 1}" + ("" if end == prev_pos + 1 else f" to {end}")
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
        problems += _row_problems(rec, stream, by_position)
        kind = rule(got) if got else None
        if got is None:
            problems.append(
                ChainProblem(
                    position=rec.position,
                    kind="corrupt",
                    detail="the stored bytes are not an event (no readable prev_hash)",
                )
            )
            links_ok.append(False)
        elif kind == 1 and upgraded:
            problems.append(
                ChainProblem(
                    position=rec.position,
                    kind="downgraded",
                    detail="it links under v1 (its predecessor's payload only) after the log "
                    "moved to v2 links (every column)",
                )
            )
            links_ok.append(False)
        elif got == last[kind or 2] or (kind == 2 and got == renumbered):
            links_ok.append(True)  # (a link to a renumbered row: `_versions` names it)
        else:
            breaks.append(_Break(i, rec.position, got))
            links_ok.append(False)
            if kind == 2:
                near.wanted(i, rec.position, got)
        upgraded = upgraded or kind == 2
        digests[1] += v1
        digests[2] += v2
        last = {1: v1.hex(), 2: "v2:" + v2.hex()}
        renumbered = None
        if rec.version is not None and rec.version != rec.position:  # as it was numbered
            renumbered = link(rec.version, rec.tag or "", rec.data, rec.version)
        prev_pos = rec.position
    near.flush()
    problems += _versions(offsets, positions, gaps)
    problems += _classify(breaks, digests, positions, links_ok, gaps, near.moved)
    seen: set[tuple[int, str]] = set()
    unique = []
    for p in sorted(problems, key=lambda p: p.position):
        if (p.position, p.kind) in seen and p.kind == "edited":
            continue  # named at its row already (a column check and the next link agree)
        seen.add((p.position, p.kind))
        unique.append(p)
    return ChainReport(
        events=len(positions),
        head=prev_pos,
        head_hash=last[2],
        problems=tuple(unique[:limit]),
    )


class _Near:
    """Pure: under v2 a link names its event at the position it had, so an event moved a few
    rows away is found by trying the rows near a broken link at the positions near it (a few
    hundred hashes per break, for the first breaks only)."""

    REACH = 4
    TRIES = 200

    def __init__(self) -> None:
        self.rows: collections.deque[tuple[int, ChainRecord]] = collections.deque()
        self.pending: list[tuple[int, int, str]] = []
        self.moved: dict[int, int] = {}
        """Index of a broken link -> index of the row it names (moved)."""
        self.tries = 0

    def add(self, i: int, rec: ChainRecord) -> None:
        self.rows.append((i, rec))
        if len(self.rows) > 2 * self.REACH + 1:
            self.rows.popleft()
        while self.pending and self.pending[0][0] + self.REACH <= i:
            self._resolve(*self.pending.pop(0))

    def wanted(self, i: int, position: int, want: str) -> None:
        if self.tries < self.TRIES:
            self.tries += 1
            self.pending.append((i, position, want))

    def flush(self) -> None:
        while self.pending:
            self._resolve(*self.pending.pop(0))

    def _resolve(self, i: int, position: int, want: str) -> None:
        for j, rec in self.rows:
            if j == i - 1:
                continue
            for p in range(position - 1 - self.REACH, position + self.REACH):
                if p > 0 and link(p, rec.tag or "", rec.data, p) == want:
                    self.moved[i] = j
                    return


def _versions(
    offsets: list[int | None], positions: list[int], gaps: set[int]
) -> list[ChainProblem]:
    """Pure: rows whose stream version is not their position. A version offset that changes and
    stays changed is a renumbering after removed events (`deleted`, unless a gap in the
    positions says so already; the row joins `gaps`); a row whose offset differs from the rows
    around it was edited."""
    out = []
    base = 0
    for i, off in enumerate(offsets):
        if off is None or off == base:
            continue
        at = positions[i]
        if i + 1 < len(offsets) and offsets[i + 1] == off:
            base = off
            if i not in gaps:
                gaps.add(i)
                out.append(
                    ChainProblem(
                        position=at,
                        kind="deleted",
                        detail=f"the stream version jumps by {off + 1} before position {at}: "
                        "events were removed and renumbered",
                    )
                )
        else:
            detail = f"its stream version {at + off} is not its position"
            out.append(ChainProblem(position=at, kind="edited", detail=detail))
    return out


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
    digests: dict[int, bytearray],
    positions: list[int],
    links_ok: list[bool],
    gaps: set[int],
    moved: Mapping[int, int],
) -> list[ChainProblem]:
    out: list[ChainProblem] = []
    kind: ProblemKind
    broken = {b.i for b in breaks}
    for b in breaks:
        i = b.i
        kind_of = rule(b.want) or 1
        try:
            want = bytes.fromhex(b.want.removeprefix("v2:"))
        except ValueError:
            want = b""
        found = _find(digests[kind_of], want) if len(want) == 32 else None
        found = moved.get(i) if found is None else found
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


def store_records(home: Path, page: int = 50_000) -> Iterator[ChainRecord]:
    """Edge: the stored events of `home`'s log in position order, every column of each row."""
    path = home / EVENTS_DB
    if not has_log(home):
        raise AuditError(f"no event log at {path}", hint="pass --home, or run `gpuledger init`")
    with open_source(home) as source:
        for rows in follow(stored_rows(source), page=page):
            for r in rows:
                yield ChainRecord(
                    r.position,
                    _as_bytes(r.data),
                    _as_int(r.version),
                    r.stored_as,
                    tag=str(r.tag),
                    stream=str(r.stream),
                )


Steps = Callable[[str, int, int], None]
"""How far a whole-log audit is: (stage, done, total), the stage one of `STAGES`; told every
1,000 events at most, and may raise to stop the audit (the server's, when its caller left or it
stops)."""

STAGES = ("chain", "snapshots", "projection")
"""`verify_store`'s stages in order: the chain over the store's events; its snapshots checked
against one fold of the log; the projection's rows against a fresh build of the log."""


def verify_store(
    home: Path,
    projection: Anchor | None = None,
    rows: duckdb.DuckDBPyConnection | None = None,
    progress: Steps | None = None,
) -> ChainReport:
    """Edge: `verify_chain` over `home`'s store, with the anchors the store keeps (its
    snapshots) and the projection's (its tracking link, when given); each snapshot checked
    against the fold of the log, and the projection's rows (`rows`: a connection to it, else
    its file when no service holds it) against a fresh build (`ledger.history.forged`).
    `progress` is told each stage's events done of its total (`Steps`)."""
    from ledger.history import forged

    step = progress if progress is not None else _no_steps
    anchors = store_anchors(home)
    if projection is not None:
        anchors.append(projection)
    head = store_head(home)
    records = _counted(store_records(home), lambda n: step("chain", n, max(head, n)))
    report = verify_chain(records, stream=STREAM_ID.hex, anchors=anchors)
    if not report.ok:  # the log itself is damaged: folding it would stop at the damage
        return report
    found = forged.snapshot_problems(home, step) + forged.projection_rows(home, rows, step)
    for edit in relay_progress.edits(home, report.head):  # atk47-25 F1, F4
        found.append(ChainProblem(position=report.head, kind="edited", detail=edit))
    problems = tuple(sorted((*report.problems, *found), key=lambda p: p.position))
    return msgspec.structs.replace(report, problems=problems)


def _no_steps(_stage: str, _done: int, _total: int) -> None:
    pass


def _counted(
    records: Iterator[ChainRecord], progress: Callable[[int], None]
) -> Iterator[ChainRecord]:
    n = 0
    for r in records:
        yield r
        n += 1
        if n % 1_000 == 0:  # a bar through a server moves on a log of a few thousand too
            progress(n)
    progress(n)


def store_head(home: Path) -> int:
    """Edge: the position of `home`'s last event (the total `audit verify` reads; 0: none),
    in its SQLite file or the PostgreSQL store it records."""
    if not has_log(home):
        return 0
    with open_source(home) as source:
        return int(source.head())


def projection_anchor(store: Store) -> Anchor | None:
    """Edge: the link the projection keeps to the last event it applied (None: none yet, or a
    file made before it kept links)."""
    position, link = store.position(), store.chain()
    return Anchor(position, link, "projection") if position and link else None


def file_anchor(home: Path) -> Anchor | None:
    """Edge: `projection_anchor` of `home`'s projection file read as it is (None: no file, or
    a running service holds it: the service verifies with its own)."""
    from projections.errors import ProjectionError

    if not projection_path(home).exists():
        return None
    try:
        with Store.open(home, read_only=True) as store:
            return projection_anchor(store)
    except ProjectionError:
        return None


def store_anchors(home: Path) -> list[Anchor]:
    """Edge: the links the store's snapshots keep to the events they fold (unreadable ones are
    left out: the ledger skips them too)."""
    with open_source(home) as source:
        found = source.snapshots(STREAM_ID.hex, snapshots.KEEP)
    return [Anchor(position, link, "snapshot") for position, link in snapshots.anchors(found)]


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
