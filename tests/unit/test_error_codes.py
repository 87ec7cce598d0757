"""Every error code of `schemas.errors` comes back through a server as the class raised: the
HTTP client picks the class by code (`ERROR_CODES`). `TooLarge`, `EnvironmentProblem` and
`EventDecodeError` were missing, so through a server the CLI printed `[error]` for a refused
oversized write where embedded it printed `[too_large]` (atk50-29 F7)."""

from __future__ import annotations

import inspect

import msgspec

from schemas import errors
from schemas.api import Problem


def test_every_code_of_the_module_comes_back_as_its_class() -> None:
    from ledger.wire.client import _error

    classes = [
        c for _n, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.LedgerError) and "code" in vars(c)
    ]  # fmt: skip
    assert {c.code for c in classes} == set(errors.ERROR_CODES), sorted(errors.ERROR_CODES)
    for cls in classes:
        problem = Problem(
            title="t", status=400, code=cls.code, detail="it went wrong (do this)",
            message="it went wrong", hint="do this",
        )  # fmt: skip
        body = msgspec.json.encode(problem)
        got = _error(400, body)
        assert type(got) is cls and got.code == cls.code and got.line() == "it went wrong (do this)"
