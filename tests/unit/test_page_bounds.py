"""The dashboard's pages are bounded (docs/security.md, row T5): a page of the queue, the
decisions or the preemptions is at most `PAGE_MAX` rows, and a page parameter out of its
bounds or not a number is one 400 line from the query gate before any work (issue 29, F5, F11,
F12)."""

from __future__ import annotations

import pytest

from ledger.server import query
from ledger.server.app import PAGE_SHELLS, offline_app
from ledger.server.pages import PAGE_MAX
from schemas.errors import InvalidCommand


def schemas() -> dict[str, query.Schema]:
    gate = query.QueryGate(lambda _r: None, lambda h: bool(set(h.paths) & PAGE_SHELLS))
    out = {}
    for route in offline_app().routes:
        for handler in getattr(route, "route_handlers", ()):
            if "GET" in handler.http_methods:
                out[route.path] = gate.schema(handler)
    return out


def check(path: str, q: str) -> None:
    query.check(schemas()[path], query.parse(q.encode()), f"GET {path}")


@pytest.mark.parametrize(
    ("path", "q", "said"),
    [
        ("/ui/api/decisions", "limit=100000", "Expected `int` <= 1000 - at `limit`"),
        ("/ui/api/decisions", "limit=0", "Expected `int` >= 1 - at `limit`"),
        ("/ui/api/decisions", "before=0", "Expected `int` >= 1 - at `before`"),
        ("/ui/api/decisions", f"before={2**62 + 1}", f"Expected `int` <= {2**62} - at `before`"),
        ("/ui/api/decisions", "since=nan", "'since' of GET /ui/api/decisions is not a finite"),
        ("/ui/api/decisions", "until=-1", "Expected `float` >= 0.0 - at `until`"),
        ("/ui/api/decisions", "offset=3", "takes no query parameter 'offset' (it takes: before, "),
        ("/ui/api/preemptions", "limit=1001", "Expected `int` <= 1000 - at `limit`"),
        ("/ui/api/preemptions", "offset=-1", "Expected `int` >= 0 - at `offset`"),
        ("/ui/api/preemptions", "offset=x", "'offset' of GET /ui/api/preemptions is not an"),
        ("/ui/api/queue", "limit=5000", "Expected `int` <= 1000 - at `limit`"),
    ],
)
def test_a_page_parameter_out_of_its_bounds_is_one_line(path: str, q: str, said: str) -> None:
    with pytest.raises(InvalidCommand) as err:
        check(path, q)
    line = err.value.line()
    assert said in line and "\n" not in line, line


@pytest.mark.parametrize(
    ("path", "q"),
    [
        ("/ui/api/decisions", f"limit={PAGE_MAX}&before={2**62}&since=0&until=1.5"),
        ("/ui/api/preemptions", f"limit={PAGE_MAX}&offset=0&account=*&window=all"),
        ("/ui/api/queue", f"limit={PAGE_MAX}&offset=1000000000"),
    ],
)
def test_a_page_within_its_bounds_passes(path: str, q: str) -> None:
    check(path, q)


def test_the_largest_page_is_a_thousand_rows() -> None:
    assert PAGE_MAX == 1000


def test_a_page_of_rows_ends_before_the_row_that_would_pass_its_bytes() -> None:
    """atk44-25 F10: pages were bounded in rows only (52 rows made a 214 MB answer)."""
    from ledger.server.pooled import MAX_PAGE_BYTES, bounded_rows

    row = b"x" * (MAX_PAGE_BYTES // 4)
    assert bounded_rows([row] * 3) == ([row] * 3, False)
    assert bounded_rows([row] * 5) == ([row] * 3, True)  # the fourth and its comma would pass
    huge = b"y" * (MAX_PAGE_BYTES * 2)
    assert bounded_rows([huge, row]) == ([huge], True)  # one row at least
