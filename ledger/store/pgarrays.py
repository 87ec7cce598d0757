"""The append's four arrays in PostgreSQL's binary array format, packed here in one pass.

psycopg dumps a Python list by looking at its elements for their type (`ListBinaryDumper`:
`get_key`, `upgrade`, a dumper per element) at every execute, since every statement gets a new
transformer: for the four arrays of a group commit of 8 events ~45 us each at load ~38, most of the
worker thread's cost of the statement's parameters under bench_pg (2026-12-07). The types here are
fixed (uuid, int8, text, bytea, no NULLs), so the bytes are written directly: a `Packed` value is
given to psycopg as is, with its array type's oid (`PackedDumper`). The bytes are psycopg's own
(`tests/unit/test_pgarrays.py` compares them). Importing this module registers the dumpers in
psycopg's global adapters, which every connection made afterwards copies.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import ClassVar
from uuid import UUID

from psycopg import adapters
from psycopg.adapt import Dumper
from psycopg.pq import Format

_HEAD = struct.Struct(">iiIii")  # ndim, has nulls, element oid, length, lower bound
_INT8 = struct.Struct(">iq")  # an element's length (8) and its value
_LENGTH = struct.Struct(">i")
_UUID_LENGTH = _LENGTH.pack(16)

UUID_OID, INT8_OID, TEXT_OID, BYTEA_OID = 2950, 20, 25, 17


class Packed(bytes):
    """A one-dimensional array without NULLs in PostgreSQL's binary format."""

    array_oid: ClassVar[int] = 0


class UuidArray(Packed):
    array_oid = 2951


class Int8Array(Packed):
    array_oid = 1016


class TextArray(Packed):
    array_oid = 1009


class ByteaArray(Packed):
    array_oid = 1001


def uuids(values: Sequence[UUID | str]) -> UuidArray:
    return UuidArray(
        _HEAD.pack(1, 0, UUID_OID, len(values), 1)
        + b"".join([_UUID_LENGTH + (v if isinstance(v, UUID) else UUID(v)).bytes for v in values])
    )


def int8s(values: Sequence[int]) -> Int8Array:
    return Int8Array(
        _HEAD.pack(1, 0, INT8_OID, len(values), 1) + b"".join([_INT8.pack(8, v) for v in values])
    )


def texts(values: Sequence[str]) -> TextArray:
    return TextArray(
        _HEAD.pack(1, 0, TEXT_OID, len(values), 1) + _joined([v.encode() for v in values])
    )


def byteas(values: Sequence[bytes]) -> ByteaArray:
    return ByteaArray(_HEAD.pack(1, 0, BYTEA_OID, len(values), 1) + _joined(values))


def _joined(values: Sequence[bytes]) -> bytes:
    return b"".join([_LENGTH.pack(len(v)) + v for v in values])


class PackedDumper(Dumper):
    """Gives a `Packed` array to PostgreSQL as it is, in binary, with its array type."""

    format = Format.BINARY

    def dump(self, obj: Packed) -> bytes:
        return obj


def _dumper(kind: type[Packed]) -> type[PackedDumper]:
    return type(f"{kind.__name__}Dumper", (PackedDumper,), {"oid": kind.array_oid})


for _kind in (UuidArray, Int8Array, TextArray, ByteaArray):
    adapters.register_dumper(_kind, _dumper(_kind))  # every connection made after the import
