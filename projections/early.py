"""The relay's own records sent before their turn ("early copies"), told apart from others'.

A topic deleted and made again under a running relay got the relay's next events (up to 2 s of
them, before its check) at offset 0, committed, and then the whole log again from position 1:
[30, 31, 32, 1, ..., 36]. A reader without `--quarantine` stopped at offset 0 for good ("position
30 does not follow position 0 ... the topic's start was deleted"), although the topic held every
position in order after them (atk51-25 F2). The relay no longer commits such a batch (it asks for
the topic's id before each commit), but topics written before keep them.

A record is such an early copy, and readers pass over it, when it carries the relay's signature
(the reader's keys verify it), claims a position past the reader's next one, and the topic holds,
after it, the relay's signed record for the reader's next position linked to the reader's last
record: the log goes on there, so passing over records before it loses nothing (each later
position is taken where its turn comes, linked as every record is). Unsigned topics cannot tell
the relay's records from others': their readers stop as before.

`EarlyCopies` keeps what it found for the reader's current position, so the topic is read ahead
at most once per position (a cut topic, whose next position never comes, is not read again for
each of its records). Pure but for the records it is handed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from projections.chain import Tip
from projections.kafka_wire import SigningKeys, envelope

log = logging.getLogger("gpuledger.kafka_source")

EARLY = "a copy of a record the relay signed, found before its turn"
"""How a reader names an early copy (logs, `store restore`'s line): what is known of it, not
why it is there (a topic made again under the relay before it noticed, or a topic writer who
put back saved records: atk53-25 F3, the first alone told the operator the cause was
harmless)."""


class EarlyCopies:
    """Which records past a reader's next position are the relay's own early copies."""

    def __init__(self, topic: str, keys: SigningKeys | None) -> None:
        self.topic = topic
        self.keys = keys
        self._at: int | None = None
        """The reader's position the search below is for."""
        self._scanned = 0
        """The offset the search read up to (exclusive)."""
        self._found: int | None = None
        """The offset of the relay's record for the next position (None: not found yet)."""
        self.passed: list[int] = []
        """Offsets passed over, in order (a reader's report)."""

    def early(
        self,
        rec: Any,
        position: int | None,
        tag: str | None,
        tip: Tip,
        scan: Callable[[int, int], Iterator[Any]],
        end: Callable[[], int],
    ) -> bool:
        """Whether `rec` (after the reader's `tip`) is an early copy. `scan(start, stop)`: the
        committed records with offsets in [start, stop); `end()`: the last stable offset."""
        keys = self.keys
        if keys is None or position is None or tag is None or position <= tip.position + 1:
            return False
        if keys.problem(rec.headers, rec.value, position, tag) is not None:
            return False
        if self._at != tip.position:
            self._at, self._scanned, self._found = tip.position, rec.offset + 1, None
        if self._found is None:
            stop = end()
            start = max(self._scanned, rec.offset + 1)
            if start < stop:
                self._found = self._next_of(scan(start, stop), tip)
                self._scanned = stop
        if self._found is None or rec.offset >= self._found:
            return False
        if not self.passed or self.passed[-1] < rec.offset:
            if not self.passed or self.passed[-1] + 1 < rec.offset:
                log.warning(
                    "topic %s: offset %d holds %s (position %d; a topic made again under the "
                    "relay, or someone replaying saved records): passed over, position %d "
                    "follows at offset %d",
                    self.topic, rec.offset, EARLY, position, tip.position + 1, self._found,
                )  # fmt: skip
            self.passed.append(rec.offset)
        return True

    def _next_of(self, records: Iterator[Any], tip: Tip) -> int | None:
        """The offset of the first record that is the relay's next one after `tip` (None)."""
        assert self.keys is not None
        want = tip.position + 1
        for rec in records:
            position, tag, problem = envelope(rec.headers, rec.value, tip.position)
            if problem is not None or position != want or tag is None:
                continue
            if tip.problem(rec.value) is None and not self.keys.problem(
                rec.headers, rec.value, position, tag
            ):
                return int(rec.offset)
        return None
