"""A refused token is a fresh exception each time (atk36-25 F2): one shared exception object
raised again and again kept every raise's frames on its traceback, 5-10 KB a request for good."""

from __future__ import annotations

import pytest

from ledger.core.state import State
from ledger.server.identity import from_bearer
from schemas.errors import NotAuthenticated


def test_each_refusal_is_its_own_exception_with_a_short_traceback() -> None:
    seen = []
    for header in [None, "Basic x", "Bearer nope"] * 200:
        with pytest.raises(NotAuthenticated) as err:
            from_bearer(State(), header, 0.0)
        seen.append(err.value)
    assert len({id(x) for x in seen}) == len(seen)
    depth, tb = 0, seen[-1].__traceback__
    while tb is not None:
        depth, tb = depth + 1, tb.tb_next
    assert depth < 10, depth
    assert seen[-1].__context__ is None
