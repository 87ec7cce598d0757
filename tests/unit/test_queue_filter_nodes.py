"""The queue's `-A` filter (pure): a job's place in the budget tree is its account and, below
it, its user's node, as the preemption report reads it (atk48-29 F6); an account the tree does
not hold is an error, not an empty queue."""

from __future__ import annotations

import pytest

from ledger.core.state import Account, State
from ledger.reads.preview import _under, known_account
from schemas.errors import UnknownEntity


@pytest.mark.parametrize(
    ("root", "kept"),
    [
        (None, True),
        ("prog", True),
        ("prog/", True),
        ("prog/proj", True),
        ("prog/proj/alice", True),
        ("prog/proj/alice/", True),
        ("prog/proj/bob", False),
        ("prog/proj/ali", False),
        ("prog/pro", False),
        ("other", False),
    ],
)
def test_a_job_is_under_its_account_and_its_users_node(root: str | None, kept: bool) -> None:
    assert _under("prog/proj", root, "alice") is kept


def test_an_account_the_tree_does_not_hold_is_unknown() -> None:
    state = State()
    for path, parent, kind in (
        ("prog", None, "program"),
        ("prog/proj", "prog", "project"),
        ("prog/proj/alice", "prog/proj", "user"),
    ):
        state.accounts[path] = Account(path=path, parent=parent, kind=kind)  # type: ignore[arg-type]
    for known in (None, "prog", "prog/proj/", "prog/proj/alice"):
        known_account(state, known)
    with pytest.raises(UnknownEntity, match="no account 'nope'"):
        known_account(state, "nope")
