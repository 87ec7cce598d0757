"""The append's arrays packed by `ledger.store.pgarrays` are the bytes psycopg's own list dumper
writes for the same values and element types, and psycopg sends them as they are."""

from __future__ import annotations

import uuid

import pytest
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.numeric import Int8

from ledger.store import pgarrays

IDS = [uuid.UUID(int=7), uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")]


def psycopgs(values: list[object]) -> tuple[bytes, int]:
    """psycopg's binary dump of `values` as a list, and the array type's oid."""
    dumper = Transformer().get_dumper(values, PyFormat.BINARY)
    return bytes(dumper.dump(values) or b""), dumper.oid


@pytest.mark.parametrize(
    ("pack", "values", "as_psycopg"),
    [
        ("uuids", IDS, IDS),
        ("uuids", IDS[:1], IDS[:1]),
        ("uuids", [str(i) for i in IDS], IDS),  # eventsourcing's ids may be strings
        ("int8s", [1, 2, 2**40, -3], [Int8(v) for v in (1, 2, 2**40, -3)]),
        ("texts", ["job.submitted.v1", "", "é ü"], ["job.submitted.v1", "", "é ü"]),
        ("byteas", [b"x" * 420, b"", b"\x00\xff"], [b"x" * 420, b"", b"\x00\xff"]),
        ("byteas", [], [b""][:0]),
    ],
)
def test_packed_as_psycopg_dumps_it(
    pack: str, values: list[object], as_psycopg: list[object]
) -> None:
    packed = getattr(pgarrays, pack)(values)
    if as_psycopg:
        want, oid = psycopgs(as_psycopg)
        assert bytes(packed) == want
        assert type(packed).array_oid == oid
    dumper = Transformer().get_dumper(packed, PyFormat.BINARY)
    assert dumper.oid == type(packed).array_oid
    assert dumper.dump(packed) == bytes(packed)
