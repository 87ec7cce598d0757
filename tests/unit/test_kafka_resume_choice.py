"""Where a restarted Kafka reader resumes (`KafkaSource._offset_after`): right after the FIRST
record, in offset order, at its position that the projection's anchor names. An exact copy of
that record carries the same link; planted at the tail after copies of an old record (positions
out of order), it drew the binary search there and the reader resumed after it, skipping every
real event between (atk47-25 F6). Unit: the pure choice and the source over a fake consumer;
the real broker's case is tests/integration/test_kafka_resume.py."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from kafka import TopicPartition

from projections.chain import link
from projections.kafka_resume import first_anchored
from projections.kafka_source import KafkaSource
from projections.kafka_wire import POSITION_HEADER, TAG_HEADER, record_headers

TAG = "job.submitted.v2"
TOPIC = "t"


class Rec(NamedTuple):
    offset: int
    headers: list[tuple[str, bytes]]
    value: bytes | None


def log(n: int) -> list[tuple[int, bytes]]:
    """`n` events, each linked to the one before."""
    out, prev = [], ""
    for position in range(1, n + 1):
        data = json.dumps({"prev_hash": prev, "n": position}).encode()
        out.append((position, data))
        prev = link(position, TAG, data)
    return out


def on_topic(events: list[tuple[int, bytes]]) -> list[Rec]:
    return [Rec(o, record_headers(p, TAG, d, None), d) for o, (p, d) in enumerate(events)]


def f6_topic() -> tuple[list[tuple[int, bytes]], list[Rec]]:
    """The attack: positions 1..30, 2,000 copies of position 1, the relay's 31..35, then one
    exact copy of position 12 (the reader's last record)."""
    events = log(35)
    order = events[:30] + [events[0]] * 2_000 + events[30:35] + [events[11]]
    return events, on_topic(order)


class Topic:
    """What the source's probe consumer is asked, over a list of records."""

    def __init__(self, records: list[Rec]) -> None:
        self.records, self.at = records, 0

    def beginning_offsets(self, tps: Any, timeout_ms: int = 0) -> dict[Any, int]:
        return {tp: 0 for tp in tps}

    def end_offsets(self, tps: Any, timeout_ms: int = 0) -> dict[Any, int]:
        return {tp: len(self.records) for tp in tps}

    def seek(self, _tp: Any, offset: int) -> None:
        self.at = offset

    def position(self, _tp: Any) -> int:
        return self.at

    def poll(self, timeout_ms: int = 0, max_records: int = 64, **_kw: Any) -> dict[Any, list[Rec]]:
        got = self.records[self.at : self.at + max_records]
        self.at += len(got)
        return {TopicPartition(TOPIC, 0): got} if got else {}


def source(records: list[Rec]) -> KafkaSource:
    src = object.__new__(KafkaSource)
    src._probe = src._consumer = Topic(records)
    src.tp, src.topic, src.bootstrap = TopicPartition(TOPIC, 0), TOPIC, "127.0.0.1:9"
    src.timeout_s, src.keys, src._anchor = 30.0, None, None
    src._recent, src._offsets_of = {}, {}
    return src


def test_the_resume_point_is_the_first_record_the_anchor_names_not_a_copy_at_the_tail() -> None:
    events, records = f6_topic()
    want = link(12, TAG, events[11][1])
    rec, linked = first_anchored(records, 12, want) or (None, [])
    assert rec is not None and rec.offset == 11  # the relay's record, not the copy (2035)
    assert [(tip.position, offset) for tip, offset in linked] == [
        (p, p - 1) for p in range(11, 0, -1)
    ]
    assert first_anchored(records[12:], 12, want) is not None  # the copy, when alone
    assert first_anchored(records, 12, link(12, TAG, b"{}")) is None  # another log's link


def test_a_restarted_reader_resumes_after_the_real_record_not_after_its_copy() -> None:
    """Fails on the code before: the search resumed at offset 2036, after the copy."""
    events, records = f6_topic()
    src = source(records)
    src._anchor = (12, link(12, TAG, events[11][1]))
    offset, tip = src._offset_after(12)
    assert (offset, tip.position) == (12, 12)
    assert sorted(src._recent) == list(range(1, 13))  # forks before it are named as before


@pytest.mark.parametrize("after", [1, 12, 30, 35])
def test_a_reader_on_an_in_order_topic_resumes_right_after_its_record(after: int) -> None:
    events = log(35)
    junk = Rec(0, [(POSITION_HEADER, b"40"), (TAG_HEADER, TAG.encode())], b"{}")
    records = [r._replace(offset=r.offset + 1) for r in on_topic(events)]
    src = source([junk, *records])
    src._anchor = (after, link(after, TAG, events[after - 1][1]))
    assert src._offset_after(after)[0] == after + 1


def test_without_the_anchor_a_copy_is_no_resume_point_either() -> None:
    _events, records = f6_topic()
    src = source(records)
    offset, tip = src._offset_after(12)  # no anchor: the chain verified from the start
    assert (offset, tip.position) == (12, 12)


def test_the_choice_takes_records_in_the_order_given() -> None:
    events = log(3)
    a = Rec(5, record_headers(2, TAG, events[1][1], None), events[1][1])
    b = a._replace(offset=9)
    want = link(2, TAG, events[1][1])
    assert first_anchored([a, b], 2, want) == (a, [])
    assert first_anchored([SimpleNamespace(headers=[], value=None, offset=0)], 2, want) is None
