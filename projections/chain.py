"""The hash chain: what links each stored event to the one before it, and how a reader checks it.

Every stored event carries `prev_hash`, the *link* to the event stored before it (the first event
""). A link names its rule by its form, so a log written partly under an older rule still
verifies, each link under its own rule:

- **v2** (written since issue 25): `"v2:" + SHA-256 hex` of the previous event's *whole stored
  row*: its position, its stream version, its tag and its payload bytes (`frame`). An edit of any
  column of a stored row (the tag alone, the position, the version, one byte of the payload)
  breaks the next event's link.
- **v1** (older logs): the SHA-256 hex of the previous event's payload bytes alone. Its tag,
  position and version are not covered; the audit checks them row by row instead
  (`ledger.history.audit`).

Once a log carries a v2 link, every later link is v2: a v1 link after a v2 link is a break
(`Tip.problem`), so nobody can fall back to the weaker rule by rewriting one link.

`link` is the rule for everyone who computes a link (the writer, `ledger.store.application`,
chaining what it appends; snapshots, replay checkpoints and projections anchored to a position;
the audit recomputing the chain; every reader of a copy). `Tip` is what a reader of a copy (the
Kafka topic) keeps of the last record it accepted: the next record must carry the next position
and link to that record (`Tip.problem`). A record that does not is not part of the log (another
producer wrote it), whatever its headers say. `names` tells whether a stored link (an anchor: a
snapshot's, a checkpoint's, a projection's tracking) names a given record.

In the ledger's one stream the stream version of an event equals its position (the audit checks
it on every row), so a reader of a copy, which sees positions only, links with version =
position.

The chain alone cannot tell the relay from someone who read the topic and computed the right
`prev_hash`; a signature can (`projections.kafka_wire.SigningKeys`).

Pure. This module never imports `ledger`.
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

import msgspec

V2 = "v2:"
"""The prefix of a v2 link."""
FRAME = b"gpuledger.chain.v2\x00"
_HEAD = struct.Struct(">QQI")


def frame(position: int, tag: str, data: bytes, version: int | None = None) -> bytes:
    """Pure: the bytes a v2 link hashes: every column of a stored row (position, stream version,
    tag, payload), each of fixed size or length-prefixed, so no two rows frame alike."""
    raw_tag = tag.encode("utf-8", "surrogateescape")
    head = _HEAD.pack(position, position if version is None else version, len(raw_tag))
    return FRAME + head + raw_tag + data


def link(position: int, tag: str, data: bytes, version: int | None = None) -> str:
    """Pure: the link to the event stored at `position` with `tag` and payload `data` (and
    stream `version`, default the position) under the current rule (v2): what the next event's
    `prev_hash` holds."""
    return V2 + hashlib.sha256(frame(position, tag, data, version)).hexdigest()


def link_v1(data: bytes) -> str:
    """Pure: the v1 link to an event: SHA-256 hex of its payload bytes alone (older logs)."""
    return hashlib.sha256(data).hexdigest()


def rule(text: str) -> int | None:
    """Pure: the rule a link is written under (2 or 1), None when it is neither (not a link)."""
    if text.startswith(V2):
        return 2 if _is_hex(text[len(V2) :]) else None
    return 1 if _is_hex(text) else None


def _is_hex(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def names(anchor: str, position: int, tag: str, data: bytes, version: int | None = None) -> bool:
    """Pure: whether `anchor` (a stored link: a snapshot's, a checkpoint's, a projection's) is
    the link to this record, under the rule `anchor` is written in."""
    got = rule(anchor)
    if got == 2:
        return anchor == link(position, tag, data, version)
    return got == 1 and anchor == link_v1(data)


class _Link(msgspec.Struct):
    prev_hash: str | None = None


_link_decoder = msgspec.json.Decoder(_Link)


def prev_hash(data: bytes | None) -> str | None:
    """Pure: the `prev_hash` an event's bytes carry, read without decoding the event; None when
    they are not a JSON object with a string `prev_hash` (the writer always writes one)."""
    if data is None:
        return None
    try:
        return _link_decoder.decode(data).prev_hash
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class Tip(NamedTuple):
    """The last record of a log a reader accepted: what the next one must link to."""

    position: int
    """Its position (0: none yet, the start of the log)."""
    v1: str
    """Its v1 link ("" at the start)."""
    v2: str
    """Its v2 link ("" at the start)."""
    upgraded: bool = False
    """A v2 link has been met: no later record may link under v1."""

    @classmethod
    def of(
        cls,
        position: int,
        tag: str,
        data: bytes,
        version: int | None = None,
        *,
        upgraded: bool = False,
    ) -> Tip:
        """Pure: the tip at this record (`upgraded`: the log moved to v2 links before it; so it
        did when the record itself carries a v2 link)."""
        upgraded = upgraded or rule(prev_hash(data) or "") == 2
        return cls(position, link_v1(data), link(position, tag, data, version), upgraded)

    def after(self, position: int, tag: str, data: bytes, version: int | None = None) -> Tip:
        """Pure: the tip once the record after this one (which `problem` accepted) is taken."""
        return Tip.of(position, tag, data, version, upgraded=self.upgraded)

    def named_by(self, anchor: str) -> bool:
        """Pure: whether the stored link `anchor` names this tip's record (under its rule)."""
        got = rule(anchor)
        return self.position > 0 and anchor == (self.v2 if got == 2 else self.v1 if got else None)

    @property
    def current(self) -> str:
        """The link to this tip under the current rule ("" at the start)."""
        return self.v2

    def problem(self, data: bytes | None) -> str | None:
        """Pure: why the record `data` does not link to this tip (None: it does). The position
        is checked by the caller (`kafka_wire.envelope`)."""
        return self.problem_of(prev_hash(data))

    def problem_of(self, got: str | None) -> str | None:
        """Pure: why a record whose value carries the `prev_hash` `got` (None: none readable)
        does not link to this tip (None: it does)."""
        if got is None:
            return "no readable prev_hash in the value"
        at = f"position {self.position}" if self.position else "the start of the log"
        if self.position == 0:
            return None if got == "" else f"prev_hash {_short(got)} does not match {at}"
        kind = rule(got)
        if kind == 2 and got == self.v2:
            return None
        if kind == 1 and got == self.v1:
            if self.upgraded:
                return (
                    f"a v1 link {_short(got)} after the log moved to v2 links (at or before {at})"
                )
            return None
        want = self.v1 if kind == 1 and not self.upgraded else self.v2
        return f"prev_hash {_short(got)} does not match {at} (link {_short(want)})"


START = Tip(0, "", "")
"""The tip before the first record: it links to nothing (`prev_hash` "")."""


def broken_link(data: bytes | None, tip: Tip) -> str | None:
    """Pure: why the record `data` does not continue the chain after `tip` (None: it does)."""
    return tip.problem(data)


def _short(digest: str) -> str:
    return f'"{digest[:16]}..."' if len(digest) > 16 else f'"{digest}"'
