"""A store error that means PostgreSQL does not answer is a 503 in one line, which the CLI
retries with the command's idempotency key, never a 500 (atk34-28 F2: a committed submit answered
"internal error: OperationalError" after the pool's timeout, wrapped by eventsourcing; the user
submitted again and had the job twice)."""

from __future__ import annotations

import psycopg
import psycopg_pool
import pytest
from eventsourcing.persistence import InterfaceError, OperationalError

from ledger.server.app import _store_away


def wrapped(outer: type[Exception], inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as e:
            raise outer(str(e)) from e
    except Exception as err:
        return err
    raise AssertionError


@pytest.mark.parametrize(
    "err",
    [
        psycopg_pool.PoolTimeout("couldn't get a connection after 3.00 sec"),
        psycopg.OperationalError("connection refused"),
        wrapped(OperationalError, psycopg_pool.PoolTimeout("couldn't get a connection")),
        wrapped(InterfaceError, psycopg.InterfaceError("the connection is closed")),
        OperationalError("server closed the connection unexpectedly"),
        wrapped(RuntimeError, wrapped(OperationalError, psycopg.OperationalError("gone"))),
    ],
    ids=[
        "pool timeout",
        "psycopg",
        "eventsourcing over the pool",
        "interface",
        "eventsourcing",
        "deeper",
    ],
)
def test_the_stores_connection_errors_say_it_does_not_answer(err: Exception) -> None:
    assert _store_away(err)


@pytest.mark.parametrize(
    "err", [ValueError("a bug"), psycopg.IntegrityError("duplicate key"), KeyError("x")]
)
def test_other_errors_stay_internal(err: Exception) -> None:
    assert not _store_away(err)
