"""An account filter (`jobs -A`, the Finished page's `account=`, the preemptions report) is the
account and its subtree, and a person's node below an account her jobs there, by name: `_` and
`%`, which account names may hold, are not patterns (atk34-29 F1: `account=team_a` listed
`teamxa/p`'s jobs, and `account=%` every account's)."""

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
        # a person's node: her jobs in that account (atk48-29 F6: the Queue and Finished pages
        # gave none while the preemption report read it so)
        ("team_a/p/u", ["team_a/p"]),
        ("team_a/p/v", []),
        ("team_a/u", ["team_a"]),
    ],
)
def test_an_account_filter_is_the_account_and_its_subtree_by_name(
    account: str, want: list[str]
) -> None:
    clause = dict(_JOB_FILTERS)["account"]
    con = duckdb.connect()
    con.execute("CREATE TABLE j (account VARCHAR, user_name VARCHAR)")
    con.executemany("INSERT INTO j VALUES (?, 'u')", [[a] for a in ACCOUNTS])
    got = con.execute(
        f"SELECT j.account FROM j WHERE {clause} ORDER BY j.account", {"account": account}
    ).fetchall()
    assert [a for (a,) in got] == sorted(want)
