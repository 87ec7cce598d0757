"""A quarantining reader holding through a run of large foreign records keeps a bounded number
of their bytes, then applies the relay's next record (atk45-25 F1)."""

from __future__ import annotations

import queue
import threading

from projections.errors import PoisonRecord
from projections.quarantine import POISON_BYTES, QuarantineBatch, read_ahead
from projections.source import LogRecord
from schemas import codec
from schemas import events as e
from schemas.events import tag_of

BIG = b"x" * 7_000_000  # one object: the test counts bytes handed on, not its own memory


class Holding:
    """A source that, after position `after`, sets aside `foreign` records (signed under a key
    id the reader lacks) before the relay's next record comes."""

    def __init__(self, after: int, foreign: int) -> None:
        self.after, self.left, self.offset = after, foreign, 100
        event = e.SharesSet(event_id="e1", actor="root", at=1000.0, account="a", shares=3)
        self.real = LogRecord(after + 1, tag_of(type(event)), codec.encode(event))

    def read(self, after: int, limit: int) -> list[LogRecord]:
        assert after == self.after  # held: never moved past what it has not verified
        if self.left:
            raise PoisonRecord(
                "forged",
                topic="t",
                partition=0,
                offset=self.offset,
                position=after + 1 + (60 - self.left),
                tag="job.submitted.v2",
                reason="signed with unknown key id 'k9'",
                data=BIG,
            )
        self.after = after + 1
        return [self.real]

    def skip(self, poison: PoisonRecord) -> None:
        assert poison.offset == self.offset
        self.left -= 1
        self.offset += 1

    def head(self) -> int:
        return self.after + 1

    def close(self) -> None:
        pass


def test_a_run_of_foreign_records_is_handed_on_bounded_in_bytes_and_the_next_real_one_applied():
    source = Holding(after=787, foreign=60)
    out: queue.Queue[object] = queue.Queue()
    read_ahead(source, 787, 788, 100, out, threading.Event())  # type: ignore[arg-type]
    batches: list[QuarantineBatch] = []
    while (item := out.get_nowait()) is not None:
        assert isinstance(item, QuarantineBatch), item
        batches.append(item)
    held = [sum(len(d.data or b"") for d in b.dead) for b in batches]
    assert max(held) < POISON_BYTES + len(BIG) < 32 << 20  # was 420 MB in one batch
    assert sum(len(b.dead) for b in batches) == 60  # every one recorded
    assert [b.last for b in batches[:-1]] == [787] * (len(batches) - 1)  # held at 787
    assert batches[-1].last == 788 and batches[-1].events == 1  # the relay's record applied
