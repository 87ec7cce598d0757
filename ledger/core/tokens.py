"""Bearer tokens: their format, the hash the ledger keeps, and the one rule for a valid token.

Pure: no I/O, no clock, no randomness (`now` is a parameter; a new secret's random parts come
from the edge that makes ids, `ledger.store.clock.new_token_secret`).

A token's secret looks like `glt_<token id>_<secret part>`: 16 hex digits of id and 256 random
bits (43 URL-safe base64 characters). The ledger keeps only the token id and the SHA-256 of the
whole string (a `token.issued.v1` event); the secret is printed once and never stored, logged or
sent back. The secret part is random, so a plain SHA-256 is enough (no password stretching is
needed for a value nobody chose), and comparison is constant-time.

`valid` is the only check of a secret: the server's bearer tokens (`ledger.server.identity`) and
the local agents' node tokens (`ledger.agent.local`) both ask it. A job token is valid only
while the run it was minted for holds its GPUs.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from ledger.core.state import State, Token
from schemas import commands as c
from schemas import events as e

PREFIX = "glt_"
_FORMAT = re.compile(r"^glt_([0-9a-f]{16})_[A-Za-z0-9_-]{43}$")
_NO_HASH = "0" * 64


def secret(token_id: str, secret_part: str) -> str:
    """Pure: the secret string of token `token_id` (16 hex digits) with its random part."""
    return f"{PREFIX}{token_id}_{secret_part}"


def digest(secret: str) -> str:
    """Pure: what the ledger keeps of a secret (`secret_sha256`)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def issue(
    actor: str,
    user: str,
    secret: str,
    *,
    name: str = "",
    expires_at: float | None = None,
    scope: e.TokenScope = "user",
    scope_node: str | None = None,
    scope_job: int | None = None,
) -> c.IssueToken:
    """Pure: the command that records a new token's hash (the secret is not in it)."""
    m = _FORMAT.match(secret)
    if m is None:
        raise ValueError("not a token secret (see ledger.store.clock.new_token_secret)")
    return c.IssueToken(
        actor=actor,
        token_id=m.group(1),
        user=user,
        secret_sha256=digest(secret),
        name=name,
        expires_at=expires_at,
        scope=scope,
        scope_node=scope_node,
        scope_job=scope_job,
    )


def valid(state: State, secret: str, now: float) -> Token | None:
    """Pure: the token `secret` proves at `now`, or None when it is malformed, unknown, wrong,
    revoked or expired (one answer for all of them, so a caller cannot tell them apart)."""
    m = _FORMAT.match(secret)
    if m is None:
        return None
    token = state.tokens.get(m.group(1))
    # compare even when the id is unknown, so timing does not tell ids apart
    ok = hmac.compare_digest(digest(secret), token.secret_sha256 if token else _NO_HASH)
    if token is None or not ok or token.revoked:
        return None
    if token.expires_at is not None and now >= token.expires_at:
        return None
    if token.scope == "job" and not _run_alive(state, token):
        return None
    return token


def owner(state: State, token: Token) -> str:
    """Pure: whose jobs a token's connections also count against (docs/server.md,
    "Connections"): a job token's, its job's owner's jobs' (every user may mint one for each
    job of theirs: counted each as its own account, one user with 64 running jobs held 1,024
    connections, atk37-25 F1; counted as the owner's own, a manager's job tokens for a
    member's job locked the member out of the API, atk38-25 F6); any other, the actor it acts
    as (a user, a node)."""
    if token.scope == "job" and token.scope_job is not None:
        job = state.jobs.get(token.scope_job)
        if job is not None:
            return job.spec.user
    return token.acts_as


def _run_alive(state: State, token: Token) -> bool:
    """Pure: whether a job token's job holds its GPUs now. A job token works only while its
    job runs (docs/security.md, row T13): once the run ends (finished, preempted, requeued) it
    proves nothing; the engines mint a new one for each run, and a token its owner made for
    the job works again only while a later run holds its GPUs."""
    job = state.jobs.get(token.scope_job) if token.scope_job is not None else None
    return job is not None and job.status in ("placed", "running")
