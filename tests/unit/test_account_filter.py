"""An account filter (`jobs -A`, the Finished page's `account=`, the preemptions report) is the
account and its subtree, by name: `_` and `%`, which account names may hold, are not patterns
(atk34-29 F1: `account=team_a` listed `teamxa/p`'s jobs, and `account=%` every account's)."""

from __future__ import annotations

import duckdb
import pytest

from projections.history import _JOB_FILTERS

ACCOUNTS = ["team_a", "team_a/p", "teamxa", "teamxa/p", "team_ab/p", "%", "%/q", "other/p"]


@pytest.mark.parametrize(
    ("account", "want"),
    [
        ("team_a", ["team_a", "team_a/p"]),
        ("teamxa", ["teamxa", "teamxa/p"]),
        ("%", ["%", "%/q"]),
        ("team", []),
    ],
)
def test_an_account_filter_is_the_account_and_its_subtree_by_name(
    account: str, want: list[str]
) -> None:
    clause = dict(_JOB_FILTERS)["account"]
    con = duckdb.connect()
    con.execute("CREATE TABLE j (account VARCHAR)")
    con.executemany("INSERT INTO j VALUES (?)", [[a] for a in ACCOUNTS])
    got = con.execute(
        f"SELECT j.account FROM j WHERE {clause} ORDER BY j.account", {"account": account}
    ).fetchall()
    assert [a for (a,) in got] == sorted(want)
