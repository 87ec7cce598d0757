"""`audit verify --kafka` walks the topic as a reader does (`ledger.history.copy_check`): exact
copies of records it took are passed over and counted, records that do not follow are named
foreign by offset, and a position never reached while later ones are on the topic is the gap,
named first (atk47-25 F2: copies made ahead of time blamed genuine positions, "the store does
not hold position 16" with the store holding 1..24; F7: forty lines about copies of genuine
signed records, cut without a word, hid the one missing position)."""

from __future__ import annotations

from ledger.history.copy_check import CopyRecord, verify_copy
from ledger.history.tamper import ChainRecord
from tests.unit.test_relay_tail import TAG, chain

STORE = chain(30)


def store(head: int = 30) -> list[ChainRecord]:
    return [ChainRecord(p, d, p, tag=TAG) for p, d in STORE[:head]]


def topic(*positions: int, foreign: dict[int, str] | None = None) -> list[CopyRecord]:
    """Records of the store's events at `positions`, in that order, offsets 0, 1, ..."""
    return [
        CopyRecord(o, p, STORE[p - 1][1], TAG, (foreign or {}).get(o))
        for o, p in enumerate(positions)
    ]


def lines(report: object) -> list[str]:
    return [p.text() for p in report.problems]  # type: ignore[attr-defined]


def test_the_relays_log_with_exact_copies_passed_over_is_intact() -> None:
    report = verify_copy(store(), topic(*range(1, 25), 1, 1, 12, *range(25, 31), 30))
    assert report.ok and report.copies == 4 and report.last_position == 30
    assert report.behind == 0 and report.more == 0


def test_copies_made_ahead_of_time_are_foreign_and_no_genuine_position_is_blamed() -> None:
    """F2: exact copies of 18 and 19 sent after 15 (the server down), then the relay's 16..24:
    the relay and the readers set offsets 15 and 16 aside and hold 1..24."""
    report = verify_copy(store(24), topic(*range(1, 16), 18, 19, *range(16, 25)))
    assert report.chain.ok and report.last_position == 24 and report.copies == 0
    assert lines(report) == [
        f"position {p}: foreign: the copy's record at offset {o} claims position {p} before its "
        "turn: it does not follow the last one taken before it (readers set it aside); "
        "unsigned: a copy of the relay's record out of its turn and another producer's "
        "cannot be told apart"
        for o, p in [(15, 18), (16, 19)]
    ]


def test_the_relays_own_signed_records_sent_early_are_counted_not_blamed() -> None:
    """atk51-25 F2/F5: a topic made again under a running relay before s52 got its next events
    at offset 0, then the log again from 1 ([25, 26, 1, ..., 26]). With keys they carry the
    relay's signature and equal the records taken at their turn: readers pass over them, and
    verify counts them as the relay's own (it called them foreign: "not the relay's"). A signed
    record ahead whose bytes differ from the one taken is still named."""
    signed = [r._replace(signed=True) for r in topic(25, 26, *range(1, 27))]
    report = verify_copy(store(26), signed)
    assert report.ok and report.early == 2 and report.last_position == 26, lines(report)
    other = signed[1]._replace(data=STORE[3][1])  # signed, yet not the record at 26
    report = verify_copy(store(26), [signed[0], other, *signed[2:]])
    assert report.early == 1 and lines(report) == [
        "position 26: foreign: the copy's record at offset 1 claims position 26 before its "
        "turn: it does not follow the last one taken before it (readers set it aside)"
    ]


def test_a_missing_position_is_named_first_however_many_copies_and_foreign_records() -> None:
    """F7 with keys: copies of genuine signed records (20 of 15, 3,000 of 1), unsigned copies
    marked foreign by the keys, and position 26 never published: the gap is the first line,
    the copies a count, and a list cut says how many it left out."""
    unsigned = {o: "not signed" for o in range(3_045, 3_070)}
    positions = [*range(1, 16), *[15] * 20, *[1] * 3_000, *range(16, 26)]
    positions += [27] * 25 + [27, 28, 29, 30]
    report = verify_copy(store(), topic(*positions, foreign=unsigned))
    assert not report.ok and report.copies == 3_020 and report.last_position == 25
    first = lines(report)[0]
    assert first.startswith(
        "position 26: deleted: position 26 is missing: the copy holds later positions (27 at "
        "offset 3070, 28 at offset 3071"
    ), first
    assert "none follows position 25; every reader stops there" in first
    assert len(report.problems) == 20 and report.more == 6  # 25 foreign and the gap: 26
    assert all(": foreign: the copy's record at offset " in line for line in lines(report)[1:])


def test_another_record_at_a_position_held_is_foreign_and_no_header_too() -> None:
    other = CopyRecord(3, 2, STORE[5][1], TAG)
    bare = CopyRecord(4, None, b"x")
    report = verify_copy(store(4), [*topic(1, 2, 3), other, bare, *topic(4)[0:0]])
    assert [p.kind for p in report.problems] == ["foreign", "foreign"]
    assert "offset 3 claims position 2, which it holds already with other bytes" in (
        report.problems[0].detail
    )
    assert report.problems[1].detail == "the copy's record at offset 4 has no position header"


def test_the_next_events_bytes_under_another_tag_header_are_named_not_the_genuine_next() -> None:
    """atk49-25 F1: a copy of the store's event 23 with its tag header relabelled (or none
    readable: two tag headers) sent before the relay's 23: verify took it as position 23, then
    blamed the relay's genuine 24 for a broken link. It is named foreign by offset; the relay's
    23 after it is taken and the chain is intact."""
    for tag in ("zz.unknown.v1", None):
        records = topic(*range(1, 23))
        records.append(CopyRecord(22, 23, STORE[22][1], tag))
        records += [r._replace(offset=r.offset + 1) for r in topic(*range(1, 31))[22:]]
        report = verify_copy(store(), records)
        assert report.chain.ok and report.last_position == 30, lines(report)
        said = "no single tag header" if tag is None else f"tag header {tag!r}"
        assert lines(report) == [
            f"position 23: foreign: the copy's record at offset 22 claims position 23 with "
            f"{said}, the store's event there is {TAG!r}: it is not the relay's"
        ]


def test_a_copy_whose_start_is_gone_is_named_first() -> None:
    """atk50-25 F4: a topic whose first offset is 5 (DeleteRecords) read as a relay that had not
    started: "0 records ... chain intact", exit 0. The first offset names it first, whatever
    follows, even nothing."""
    report = verify_copy(store(), [], first_offset=lambda: 5)
    assert not report.ok and lines(report) == [
        "position 1: deleted: the topic's start is gone (first offset 5): the records before it "
        "were deleted (Kafka DeleteRecords, or a retention); no reader or restore can rebuild "
        "the log from this topic, and the relay refuses it: publish to a new topic "
        "(GPULEDGER_KAFKA_TOPIC or --topic): the relay writes the whole log there; or delete the "
        "topic, and the relay makes it again and writes the whole log to it (a service's "
        "stopped relay looks every 5 s)"
    ]
    later = [r._replace(offset=r.offset + 5) for r in topic(*range(6, 31))]
    got = lines(verify_copy(store(), later, first_offset=lambda: 5))
    assert got[0].startswith("position 1: deleted: the topic's start is gone (first offset 5)")
    assert got[1].startswith("position 1: deleted: position 1 is missing"), got
    assert verify_copy(store(), topic(*range(1, 31)), first_offset=lambda: 0).ok


def test_a_copy_that_ends_below_the_relays_progress_lost_events_it_is_not_behind() -> None:
    """atk50-25 F4 (low): the topic ends at 20 while the store's progress row says the relay
    committed 26 there: "20 events ... chain intact, 10 events behind the store", exit 0, as a
    relay catching up. The positions up to the progress were deleted from the topic."""
    report = verify_copy(store(), topic(*range(1, 21)), progress=26)
    assert not report.ok  # was ok, "behind" 10
    assert lines(report) == [
        "position 21: deleted: the copy ends at position 20, yet the relay committed up to "
        "position 26 on it (the store's progress row): positions 21 to 26 were deleted from the "
        "topic, not waiting to be published"
    ]
    # at or below the copy's end the progress says nothing; a relay past it is catching up
    assert verify_copy(store(), topic(*range(1, 21)), progress=20).ok
    assert verify_copy(store(), topic(*range(1, 21)), progress=None).behind == 10


def test_a_signed_record_under_a_tag_the_store_no_longer_holds_blames_the_store() -> None:
    """atk53-25 F3: after a stored event's tag was edited, verify with keys said the genuine
    record the relay signed (its tag header under the signature) "is not the relay's". The
    store's row is what changed: named a mismatch of the store's, the record taken as readers
    take it; an unsigned one under another tag is still foreign (atk49-25 F1)."""
    records = [r._replace(signed=True) for r in topic(*range(1, 31))]
    edited = [*store(22), store()[22]._replace(tag="job.cancelled.v1"), *store()[23:]]
    report = verify_copy(edited, records)
    assert report.chain.ok and report.last_position == 30, lines(report)
    assert lines(report) == [
        f"position 23: mismatch: the copy's record at offset 22 carries the relay's signature "
        f"over tag header {TAG!r}; the store's event there is 'job.cancelled.v1': the store's "
        "row differs from what the relay published (an edited store? `gpuledger audit verify` "
        "checks the store's chain)"
    ]  # was "foreign: ... it is not the relay's"


def test_copies_of_signed_records_found_early_are_named_by_what_is_known() -> None:
    """atk53-25 F3: restore, readers and verify called signed records put back by a topic
    writer "the relay's own, sent before their turn into the topic made again under it",
    telling the operator the cause was harmless. They name what is known: copies of records
    the relay signed, out of their turn, and both causes."""
    from ledger.cli.audit import _print_copy
    from ledger.cli.store import _aside_lines
    from projections.early import EARLY

    said = " ".join(_aside_lines("t", [4, 5], [5], [3], signed=True))
    assert "copies of records the relay signed, found before their turn" in said
    assert "copies of the relay's records out of their turn" in said
    assert "someone replaying saved records" in said and "the relay's own" not in said
    assert EARLY == "a copy of a record the relay signed, found before its turn"
    signed = [r._replace(signed=True) for r in topic(25, 26, *range(1, 27))]
    import click.testing

    runner = click.testing.CliRunner()
    with runner.isolation() as (out, _err, *_rest):
        _print_copy("t", verify_copy(store(26), signed))
    text = out.getvalue().decode()
    assert "2 copies of records the relay signed, found before their turn" in text, text
    assert "someone replaying saved records" in text and "relay's own" not in text, text
