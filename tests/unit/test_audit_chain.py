"""The hash chain, pure: `verify_chain` over records built in memory names what broke and where."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.history.audit import ChainRecord, verify_chain
from schemas import codec
from schemas import events as e

T0 = 1_000.0


def chain(n: int) -> list[ChainRecord]:
    """`n` chained events, positions and versions 1..n."""
    out, prev = [], ""
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
        out.append(ChainRecord(i, data, i))
        prev = hashlib.sha256(data).hexdigest()
    return out


def edit(rec: ChainRecord) -> ChainRecord:
    return rec._replace(data=rec.data.replace(b'"gpus":8', b'"gpus":9'))


def found(records: list[ChainRecord]) -> list[tuple[int, str]]:
    return [(p.position, p.kind) for p in verify_chain(records).problems]


def test_an_intact_chain_has_no_problems_and_names_its_head() -> None:
    records = chain(10)
    report = verify_chain(records)
    assert report.ok and report.events == 10 and report.head == 10
    assert report.head_hash == hashlib.sha256(records[-1].data).hexdigest()


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


@pytest.mark.parametrize("case", list(CASES))
def test_tampering_is_found_where_it_happened(case: str) -> None:
    tamper, want = CASES[case]
    assert found(tamper(chain(10))) == want


def test_the_last_event_is_only_protected_by_the_head_hash() -> None:
    records = chain(5)
    edited = [*records[:4], edit(records[4])]
    report = verify_chain(edited)
    assert report.ok  # nothing links to it ...
    assert report.head_hash != verify_chain(records).head_hash  # ... but the anchor moves


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=30),
    data=st.data(),
)
def test_any_edit_of_any_event_but_the_last_is_found_at_its_position(
    n: int, data: st.DataObject
) -> None:
    records = chain(n)
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
