"""libpq through ctypes: the smallest PostgreSQL client that runs a read, for the CLI's direct
reads on a PostgreSQL store (`ledger.store.pgread.PgSource(light=True)`).

Why a second client beside psycopg: a CLI read is a process of ~150 ms of CPU, and importing
psycopg costs ~90 ms of it (its package loads asyncio, its 250 error classes, importlib.metadata
and ctypes.util on the way: docs/benchmarks.md, issue 28's CLI row). ctypes and libpq load in
~15 ms. This module runs one statement at a time on one autocommit connection, its rows in binary
format decoded for the few column types the store's reads return (bigint, integer, text, bytea);
everything else (servers, the store's writes, copies, the lease) keeps psycopg.

libpq is the system's (`libpq.so.5`, Debian's `libpq5`, which PostgreSQL's own packages pull in)
or the copy psycopg-binary ships; `load()` gives None when neither loads, and the caller uses
psycopg. The connection takes the same settings as psycopg's (`pgread.connect_defaults`: timeouts
and keepalives), each overridden by the DSN's own, and the DSN's multi-host lists and
`target_session_attrs` are libpq's: the same behaviour through a failover.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Sequence
from typing import Any

_OK = 0  # CONNECTION_OK
_TUPLES_OK = 2  # PGRES_TUPLES_OK
_SQLSTATE = ord("C")  # PG_DIAG_SQLSTATE
_BINARY = 1

_INT = {20: 8, 23: 4, 21: 2}  # int8, int4, int2: their widths
_TEXT = {25, 1043, 19}  # text, varchar, name
_BYTEA = 17

_lib: Any = None


class PqError(Exception):
    """A statement or a connection failed: `sqlstate` ("" when the server gave none) and
    `broken` (the connection is gone: a new one may succeed)."""

    def __init__(self, message: str, sqlstate: str = "", broken: bool = False) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.broken = broken


def _candidates() -> list[str]:
    """The system's libpq first, then psycopg-binary's copy (found without importing psycopg)."""
    import importlib.util

    found = ["libpq.so.5"]
    spec = importlib.util.find_spec("psycopg_binary")
    if spec is not None and spec.submodule_search_locations:
        site = os.path.dirname(next(iter(spec.submodule_search_locations)))
        found += sorted(glob.glob(os.path.join(site, "psycopg_binary.libs", "libpq-*.so*")))
    return found


def load() -> Any:
    """The libpq library with the signatures this module calls, or None."""
    global _lib
    if _lib is not None:
        return _lib or None
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        _declare(lib)
        _lib = lib
        return lib
    _lib = False
    return None


def _declare(lib: Any) -> None:
    p, c, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    cpp = ctypes.POINTER(ctypes.c_char_p)
    for name, args, res in [
        ("PQconnectdbParams", [cpp, cpp, i], p),
        ("PQstatus", [p], i),
        ("PQerrorMessage", [p], c),
        ("PQfinish", [p], None),
        ("PQexecParams", [p, c, i, p, cpp, p, p, i], p),
        ("PQresultStatus", [p], i),
        ("PQresultErrorMessage", [p], c),
        ("PQresultErrorField", [p, i], c),
        ("PQntuples", [p], i),
        ("PQnfields", [p], i),
        ("PQftype", [p, i], ctypes.c_uint),
        ("PQgetisnull", [p, i, i], i),
        ("PQgetlength", [p, i, i], i),
        ("PQgetvalue", [p, i, i], ctypes.POINTER(ctypes.c_char)),
        ("PQclear", [p], None),
    ]:
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res


def _strings(values: Sequence[str]) -> Any:
    return (ctypes.c_char_p * (len(values) + 1))(*[v.encode() for v in values], None)


def _first_line(raw: bytes | None, fallback: str) -> str:
    text = (raw or b"").decode(errors="replace").strip()
    return (text.splitlines() or [fallback])[0]


class Connection:
    """One autocommit connection: `rows(sql, params)` with %s placeholders (as psycopg takes
    them) and parameters of type int, str or a list of str."""

    def __init__(self, dsn: str, defaults: dict[str, str]) -> None:
        self._lib = load()
        if self._lib is None:
            raise PqError("libpq is not available")
        keys = [*defaults, "dbname"]  # the DSN's own settings come last: they win
        values = [*defaults.values(), dsn]
        self._con = self._lib.PQconnectdbParams(_strings(keys), _strings(values), 1)
        if not self._con or self._lib.PQstatus(self._con) != _OK:
            why = _first_line(self._lib.PQerrorMessage(self._con), "cannot connect")
            self.close()
            raise PqError(why, broken=True)

    @property
    def closed(self) -> bool:
        return not self._con

    def rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        lib, con = self._lib, self._con
        if not con:
            raise PqError("the connection is closed", broken=True)
        parts = sql.split("%s")
        query = "".join(
            p + (f"${n + 1}" if n < len(parts) - 1 else "") for n, p in enumerate(parts)
        )
        texts = [_param(v) for v in params]
        values = (ctypes.c_char_p * max(1, len(texts)))(*texts)
        res = lib.PQexecParams(con, query.encode(), len(texts), None, values, None, None, _BINARY)
        try:
            if lib.PQresultStatus(res) != _TUPLES_OK:
                state = (lib.PQresultErrorField(res, _SQLSTATE) or b"").decode()
                broken = lib.PQstatus(con) != _OK
                why = lib.PQresultErrorMessage(res) if res else lib.PQerrorMessage(con)
                raise PqError(_first_line(why, "the statement failed"), state, broken)
            return _decode(lib, res)
        finally:
            if res:
                lib.PQclear(res)

    def close(self) -> None:
        if self._con:
            self._lib.PQfinish(self._con)
            self._con = None


def _param(value: Any) -> bytes:
    if isinstance(value, bool):  # (an int to Python, never a parameter of these reads)
        raise TypeError("boolean parameter")
    if isinstance(value, int | str):
        return str(value).encode()
    if isinstance(value, list | tuple):  # an array of text: '{"a","b"}'
        quoted = ('"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in value)
        return ("{" + ",".join(quoted) + "}").encode()
    raise TypeError(f"unsupported parameter type {type(value).__name__}")


def _decode(lib: Any, res: Any) -> list[tuple[Any, ...]]:
    """The result's rows, each column decoded from PostgreSQL's binary format by its type."""
    n, m = lib.PQntuples(res), lib.PQnfields(res)
    kinds = [lib.PQftype(res, j) for j in range(m)]
    for k in kinds:
        if k not in _INT and k not in _TEXT and k != _BYTEA:
            raise PqError(f"unsupported column type (oid {k})")
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        row: list[Any] = []
        for j, kind in enumerate(kinds):
            if lib.PQgetisnull(res, i, j):
                row.append(None)
                continue
            raw = ctypes.string_at(lib.PQgetvalue(res, i, j), lib.PQgetlength(res, i, j))
            if kind in _INT:
                row.append(int.from_bytes(raw, "big", signed=True))
            elif kind in _TEXT:
                row.append(raw.decode())
            else:
                row.append(raw)
        out.append(tuple(row))
    return out
