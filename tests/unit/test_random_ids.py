"""`random_ids`: version-4 UUIDs from the kernel's randomness, read a block at a time (each
`os.urandom` lets go of the interpreter lock: per id, the worker waited for the event loop once
per event of a group commit)."""

from __future__ import annotations

import os
import uuid

import pytest

from ledger.store.clock import RANDOM_READ, random_ids


def test_ids_are_distinct_version_4_uuids() -> None:
    ids = random_ids()
    got = [ids() for _ in range(5_000)]
    assert len(set(got)) == len(got)
    for hexed in got[:500]:
        u = uuid.UUID(hex=hexed)
        assert (u.version, u.variant, u.hex) == (4, uuid.RFC_4122, hexed)


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the kernel's randomness read from now on (`os.urandom`'s calls)."""
    reads: list[int] = []
    real = os.urandom

    def counted(n: int) -> bytes:
        reads.append(n)
        return real(n)

    monkeypatch.setattr(os, "urandom", counted)
    return reads


def test_the_kernel_is_read_once_per_block_of_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _count_reads(monkeypatch)
    ids = random_ids()
    for _ in range(RANDOM_READ // 16):
        ids()
    assert reads == [RANDOM_READ]


def test_a_forked_child_reads_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = random_ids()
    ids()  # the block is read in this process
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as a forked child sees itself
    reads = _count_reads(monkeypatch)
    ids()
    assert reads == [RANDOM_READ]
