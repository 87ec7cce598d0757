"""Who is calling: bearer tokens and Unix peer credentials, turned into an actor at the edge.

Tokens look like `glt_<token id>_<secret>`. The ledger keeps only the token id and the SHA-256 of
the whole string (a `token.issued.v1` event); the secret is printed once and never stored,
logged or sent back. The secret is 256 random bits, so a plain SHA-256 is enough (no password
stretching is needed for a value nobody chose), and comparison is constant-time.

The authorisation rules themselves live in `ledger.core.domain`: this module only says who the actor
is. Node and job tokens act as the narrow system actors `@node:NAME` and `@job:ID`, which the
domain confines to their node or job.
"""

from __future__ import annotations

import hashlib
import hmac
import pwd
import re
import secrets
import socket
import struct
from dataclasses import dataclass

from ledger.core.domain import State, Token
from schemas import commands as c
from schemas.errors import NotAuthenticated

PEER_UID = "gpuledger.peer_uid"
"""Scope key the Unix-socket protocol sets from SO_PEERCRED (never from anything the client
sends)."""
PREFIX = "glt_"
_TOKEN = re.compile(r"^glt_([0-9a-f]{16})_[A-Za-z0-9_-]{43}$")


@dataclass(frozen=True)
class Identity:
    """An authenticated caller: the actor its commands act as, and how it proved it."""

    actor: str
    via: str
    """"token:<id>" or "peer:<uid>"."""


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token(
    actor: str,
    user: str,
    *,
    name: str = "",
    expires_at: float | None = None,
    scope: str = "user",
    scope_node: str | None = None,
    scope_job: int | None = None,
) -> tuple[str, c.IssueToken]:
    """A fresh secret and the command that records its hash (the secret is not in it)."""
    token_id = secrets.token_hex(8)
    secret = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    cmd = c.IssueToken(
        actor=actor,
        token_id=token_id,
        user=user,
        secret_sha256=digest(secret),
        name=name,
        expires_at=expires_at,
        scope=scope,  # type: ignore[arg-type]
        scope_node=scope_node,
        scope_job=scope_job,
    )
    return secret, cmd


_DENIED = NotAuthenticated(
    "not authenticated: a valid bearer token is needed",
    hint="set GPULEDGER_TOKEN, or create one with `gpuledger token create`",
)


def from_bearer(state: State, header: str | None, now: float) -> Identity:
    """The identity a `Authorization: Bearer ...` header proves, or NotAuthenticated (the same
    error for a missing, malformed, unknown, wrong, expired or revoked token)."""
    if not header or not header.startswith("Bearer "):
        raise _DENIED
    secret = header[len("Bearer ") :].strip()
    m = _TOKEN.match(secret)
    if m is None:
        raise _DENIED
    token: Token | None = state.tokens.get(m.group(1))
    # compare even when the id is unknown, so timing does not tell ids apart
    want = token.secret_sha256 if token is not None else "0" * 64
    ok = hmac.compare_digest(digest(secret), want)
    if token is None or not ok or token.revoked:
        raise _DENIED
    if token.expires_at is not None and now >= token.expires_at:
        raise _DENIED
    return Identity(actor=token.acts_as, via=f"token:{token.token_id}")


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED), from the kernel."""
    if sock.family != socket.AF_UNIX:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def from_peer(uid: int) -> Identity:
    """A local caller on the Unix socket acts as its OS user (how Slurm trusts its head node)."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError as err:
        raise NotAuthenticated(f"uid {uid} has no user name on this host") from err
    return Identity(actor=name, via=f"peer:{uid}")


def act(identity: Identity, cmd: c.AnyCommand) -> c.AnyCommand:
    """The command as the caller may send it: the actor is the caller unless the body names
    someone else (`--as`, which the domain allows admins only); `real_actor` is always set by
    us, never taken from the body."""
    import msgspec

    actor = cmd.actor or identity.actor
    real = identity.actor if actor != identity.actor else None
    return msgspec.structs.replace(cmd, actor=actor, real_actor=real)
