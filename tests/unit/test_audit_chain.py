"""The hash chain, pure: `verify_chain` over records built in memory names what broke and where,
for logs linked under v2 (every column of a row) and under v1 (payloads only: logs written before
v2), and for logs that moved from v1 to v2 part way."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.history.tamper import Anchor, ChainRecord, verify_chain
from projections.chain import link
from schemas import codec
from schemas import events as e

T0 = 1_000.0
TAG = "node.registered.v1"
STREAM = "s1"


def chain(n: int, rule: int = 2, upgrade_at: int = 0) -> list[ChainRecord]:
    """`n` chained events, positions and versions 1..n, linked under `rule` (under v1 up to
    position `upgrade_at` and v2 after it, when given)."""
    out: list[ChainRecord] = []
    prev = ""
    for i in range(1, n + 1):
        ev = e.NodeRegistered(
            event_id=f"e{i}",
            at=T0 + i,
            actor="root",
            cluster="c",
            node=f"n{i}",
            gpu_type="h100",
            gpus=8,
            prev_hash=prev,
        )
        data = codec.encode(ev)
        out.append(ChainRecord(i, data, i, tag=TAG, stream=STREAM))
        v1 = rule == 1 or i < upgrade_at
        prev = hashlib.sha256(data).hexdigest() if v1 else link(i, TAG, data, i)
    return out


def edit(rec: ChainRecord) -> ChainRecord:
    return rec._replace(data=rec.data.replace(b'"gpus":8', b'"gpus":9'))


def found(records: list[ChainRecord], **kw: object) -> list[tuple[int, str]]:
    return [(p.position, p.kind) for p in verify_chain(records, stream=STREAM, **kw).problems]  # type: ignore[arg-type]


@pytest.mark.parametrize("rule", [1, 2])
def test_an_intact_chain_has_no_problems_and_names_its_head(rule: int) -> None:
    records = chain(10, rule)
    report = verify_chain(records)
    assert report.ok and report.events == 10 and report.head == 10
    assert report.head_hash == link(10, TAG, records[-1].data, 10)


def test_a_log_that_moved_from_v1_to_v2_links_verifies_each_link_under_its_rule() -> None:
    records = chain(10, upgrade_at=6)
    assert verify_chain(records).ok
    assert records[5].data.count(b'"prev_hash":"v2:') == 0  # position 6 links under v1
    assert records[6].data.count(b'"prev_hash":"v2:') == 1  # position 7 links under v2


def test_a_v1_link_after_the_log_moved_to_v2_is_a_downgrade() -> None:
    records = chain(10, upgrade_at=6)
    v1 = hashlib.sha256(records[6].data).hexdigest()
    old = records[7].data.split(b'"prev_hash":"')[1].split(b'"')[0]
    downgraded = records[7]._replace(data=records[7].data.replace(old, v1.encode()))
    got = found([*records[:7], downgraded, *records[8:]])
    assert (8, "downgraded") in got


def test_an_empty_log_is_intact() -> None:
    assert verify_chain([]).ok


def swap(records: list[ChainRecord], i: int, j: int) -> list[ChainRecord]:
    out = list(records)
    out[i] = records[j]._replace(position=records[i].position, version=records[i].version)
    out[j] = records[i]._replace(position=records[j].position, version=records[j].version)
    return out


def renumber(records: list[ChainRecord]) -> list[ChainRecord]:
    return [r._replace(position=i) for i, r in enumerate(records, start=1)]


Tamper = Callable[[list[ChainRecord]], list[ChainRecord]]

CASES: dict[str, tuple[Tamper, list[tuple[int, str]]]] = {
    "payload of position 4 edited": (
        lambda r: [*r[:3], edit(r[3]), *r[4:]],
        [(4, "edited")],
    ),
    "first event edited": (lambda r: [edit(r[0]), *r[1:]], [(1, "edited")]),
    "position 6 edited with its own link": (
        lambda r: [
            *r[:5],
            r[5]._replace(data=r[5].data.replace(b'"prev_hash":"', b'"prev_hash":"0')),
            *r[6:],
        ],
        [(6, "edited")],
    ),
    "position 5 deleted": (lambda r: [*r[:4], *r[5:]], [(5, "deleted")]),
    "positions 3 to 5 deleted": (lambda r: [*r[:2], *r[5:]], [(3, "deleted")]),
    "position 1 deleted": (lambda r: r[1:], [(1, "deleted")]),
    "position 5 deleted and the rest renumbered": (
        lambda r: renumber([*r[:4], *r[5:]]),
        [(5, "deleted")],
    ),
    "positions 3 and 4 swapped": (
        lambda r: swap(r, 2, 3),
        [(3, "reordered"), (4, "reordered"), (5, "reordered")],
    ),
    "the last event's prev_hash changed": (
        lambda r: [
            *r[:9],
            r[9]._replace(data=r[9].data.replace(b'"prev_hash":"', b'"prev_hash":"0')),
        ],
        [(10, "broken-link")],
    ),
    "bytes that are not an event at 7": (
        lambda r: [*r[:6], r[6]._replace(data=b"not json"), *r[7:]],
        [(7, "corrupt"), (7, "edited")],
    ),
}


@pytest.mark.parametrize("rule", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_tampering_is_found_where_it_happened(case: str, rule: int) -> None:
    tamper, want = CASES[case]
    assert found(tamper(chain(10, rule))) == want


def column(**changes: object) -> Tamper:
    return lambda r: [*r[:3], r[3]._replace(**changes), *r[4:]]  # type: ignore[arg-type]


COLUMNS: dict[str, Tamper] = {
    "the tag": column(tag="node.removed.v1"),
    "the stream version": column(version=40),
    "the stream id": column(stream="s2"),
    "the position (moved to the end)": lambda r: [*r[:3], *r[4:], r[3]._replace(position=11)],
}


@pytest.mark.parametrize("rule", [1, 2])
@pytest.mark.parametrize("what", list(COLUMNS))
def test_an_edit_of_any_column_names_its_row(what: str, rule: int) -> None:
    got = found(COLUMNS[what](chain(10, rule)))
    assert got and got[0][0] == 4, got


def test_the_last_event_is_protected_by_an_anchor_or_the_head_link() -> None:
    records = chain(5)
    edited = [*records[:4], edit(records[4])]
    report = verify_chain(edited)
    assert report.ok  # nothing links to it ...
    assert report.head_hash != verify_chain(records).head_hash  # ... but the head link moves
    kept = Anchor(5, link(5, TAG, records[4].data, 5), "projection")
    assert found(edited, anchors=[kept]) == [(5, "edited")]  # ... and a kept link names it
    assert found(records, anchors=[kept]) == []


def test_the_last_events_tag_and_version_are_checked_on_their_row() -> None:
    records = chain(5)
    assert found([*records[:4], records[4]._replace(tag="node.removed.v1")]) == [(5, "edited")]
    assert found([*records[:4], records[4]._replace(version=9)]) == [(5, "edited")]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=30),
    rule=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_any_edit_of_any_event_but_the_last_is_found_at_its_position(
    n: int, rule: int, data: st.DataObject
) -> None:
    records = chain(n, rule)
    k = data.draw(st.integers(min_value=0, max_value=n - 2), label="index")
    at = data.draw(st.integers(min_value=0, max_value=len(records[k].data) - 1), label="byte")
    raw = bytearray(records[k].data)
    raw[at] = (raw[at] + 1) % 256
    tampered = [*records[:k], records[k]._replace(data=bytes(raw)), *records[k + 1 :]]
    report = verify_chain(tampered)
    assert not report.ok
    first = report.problems[0]
    if k == n - 2 and first.kind == "broken-link":
        # only the last link breaks: the last event's link may have changed as well
        assert first.position == n
    else:
        assert first.position == k + 1  # positions are 1-based
