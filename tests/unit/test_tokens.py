"""The one token check (`ledger.core.tokens.valid`): every way a secret fails gives the same
answer, and only a known, unrevoked, unexpired token with the right secret passes."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from ledger.core import tokens
from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.store.clock import new_token_secret
from schemas import commands as c

T0 = 1_000.0
SECRET = tokens.secret("0123456789abcdef", "A" * 43)
OTHER = tokens.secret("0123456789abcdef", "B" * 43)


def with_token(
    state: State, new_id: Callable[[], str], cmd: c.IssueToken, *more: c.AnyCommand
) -> State:
    for command in (cmd, *more):
        for ev in decide(state, command, T0, new_id):
            evolve(state, ev)
    return state


CASES: dict[str, tuple[str, dict[str, object], float, bool]] = {
    "the right secret": (SECRET, {}, T0, True),
    "another secret of the same id": (OTHER, {}, T0, False),
    "an unknown id": (tokens.secret("fedcba9876543210", "A" * 43), {}, T0, False),
    "a malformed secret": ("glt_0123_short", {}, T0, False),
    "not a token at all": ("", {}, T0, False),
    "before it expires": (SECRET, {"expires_at": T0 + 60}, T0 + 59, True),
    "when it expires": (SECRET, {"expires_at": T0 + 60}, T0 + 60, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_secret_is_valid_only_when_everything_holds(
    case: str, org_state: State, counter_ids: Callable[[], str]
) -> None:
    given, changes, now, want = CASES[case]
    cmd = msgspec.structs.replace(tokens.issue("alice", "alice", SECRET), **changes)
    state = with_token(org_state, counter_ids, cmd)
    got = tokens.valid(state, given, now)
    assert (got is not None) == want
    if want:
        assert got is not None and got.token_id == cmd.token_id and got.acts_as == "alice"


def test_a_revoked_token_is_not_valid(org_state: State, counter_ids: Callable[[], str]) -> None:
    cmd = tokens.issue("alice", "alice", SECRET)
    revoke = c.RevokeToken(actor="alice", token_id=cmd.token_id)
    assert tokens.valid(with_token(org_state, counter_ids, cmd, revoke), SECRET, T0) is None


def test_the_ledger_keeps_only_the_hash_of_a_new_secret() -> None:
    secret = new_token_secret()
    cmd = tokens.issue("root", "root", secret, scope="user")
    assert secret.startswith(f"{tokens.PREFIX}{cmd.token_id}_")
    assert (
        cmd.secret_sha256 == tokens.digest(secret)
        and secret not in msgspec.json.encode(cmd).decode()
    )
    assert new_token_secret() != secret
    with pytest.raises(ValueError):
        tokens.issue("root", "root", "glt_not_a_secret")


def _job_token(state: State, job_status: str, placed_at: float | None, issued_at: float) -> State:
    from ledger.core.state import Job, Token
    from schemas import events as e

    spec = e.JobSubmitted(
        event_id="e0", at=T0, actor="alice", job_id=7, account="ai2/olmo", user="alice",
        gpus=1, min_runtime_s=60,
    )  # fmt: skip
    state.jobs[7] = Job(spec=spec, status=job_status, placed_at=placed_at)  # type: ignore[arg-type]
    state.tokens["0123456789abcdef"] = Token(
        token_id="0123456789abcdef", user="alice", name="job 7", scope="job", scope_job=7,
        secret_sha256=tokens.digest(SECRET), issued_at=issued_at,
    )  # fmt: skip
    return state


@pytest.mark.parametrize(
    ("status", "placed_at", "issued_at", "want"),
    [
        ("placed", T0, T0, True),  # minted as its run was placed
        ("running", T0, T0 + 5, True),
        ("finished", T0, T0 + 5, False),  # its run ended
        ("pending", T0, T0 + 5, False),  # preempted and requeued
        ("running", T0 + 100, T0 + 5, True),  # made before the run: it works while it runs
    ],
)
def test_a_job_token_lives_as_long_as_its_run(
    status: str, placed_at: float, issued_at: float, want: bool
) -> None:
    state = _job_token(State(), status, placed_at, issued_at)
    got = tokens.valid(state, SECRET, T0 + 10)
    assert (got is not None) == want
    assert got is None or got.acts_as == "@job:7"
