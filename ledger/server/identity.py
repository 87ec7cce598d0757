"""Who is calling: bearer tokens and Unix peer credentials, turned into an actor at the edge.

A bearer token is valid when `ledger.core.tokens.valid` says so (its format, hash, expiry and
revocation are checked there and only there); this module reads the header and the socket.

The authorisation rules themselves live in `ledger.core.authz`: this module only says who the actor
is. Node and job tokens act as the narrow system actors `@node:NAME` and `@job:ID`, which the
domain confines to their node or job.
"""

from __future__ import annotations

import pwd
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from ledger.core import tokens
from ledger.core.state import State
from schemas import commands as c
from schemas.errors import NotAuthenticated

PEER_UID = "gpuledger.peer_uid"
"""Scope key the Unix-socket protocol sets from SO_PEERCRED (never from anything the client
sends)."""


@dataclass(frozen=True)
class Identity:
    """An authenticated caller: the actor its commands act as, and how it proved it."""

    actor: str
    via: str
    """"token:<id>" or "peer:<uid>"."""
    jobs_of: str = ""
    """A job token's: the job's owner, whose jobs' tokens share one allowance (`whose`)."""

    @property
    def whose(self) -> str:
        """The account its connections and requests count against (docs/server.md,
        "Connections"): its actor, a user, a node (`@node:N`) or a job (`@job:N`: a job's
        tokens have an allowance of their own, `GPULEDGER_CONNECTIONS_PER_JOB`, and all the
        jobs of one owner together `pool`'s; counted as the job's owner's own, a manager's job
        tokens for a member's job locked her out of the API, atk38-25 F6; each token its own,
        one user's 64 jobs held 1,024, atk37-25 F1)."""
        return self.actor

    @property
    def writes_as(self) -> str:
        """The account its bytes written count against (the write meter, one large body at a
        time: `commands.CommandPath`): a job token's, its job's owner's, whose jobs' tokens
        share her allowance (each token its own multiplied it by her running jobs: 267 MiB in
        30 s past her 32 MiB, atk45-25 F4); any other caller's, `whose`."""
        return self.jobs_of or self.whose

    @property
    def pool(self) -> str | None:
        """The allowance its connections count against beside `whose`'s: a job token's, its
        job's owner's jobs' together (`Tally.claim`); None for any other."""
        return f"jobs of {self.jobs_of}" if self.jobs_of else None


def _denied() -> NotAuthenticated:
    """The one refusal, made anew at each raise: one shared exception object raised again and
    again kept every raise's frames on its traceback (5-10 KB each, for good: an outsider's
    40,000 requests without a token grew the server by ~400 MB; atk36-25 F2)."""
    return NotAuthenticated(
        "not authenticated: a valid bearer token is needed",
        hint="set GPULEDGER_TOKEN, or create one with `gpuledger token create`",
    )


def denied() -> NotAuthenticated:
    """The one refusal of a caller without a valid token (a new exception each call)."""
    return _denied()


def from_bearer(state: State, header: str | None, now: float) -> Identity:
    """The identity a `Authorization: Bearer ...` header proves, or NotAuthenticated (the same
    error for a missing, malformed, unknown, wrong, expired or revoked token)."""
    if not header or not header.startswith("Bearer "):
        raise _denied()
    token = tokens.valid(state, header[len("Bearer ") :].strip(), now)
    if token is None:
        raise _denied()
    jobs_of = tokens.owner(state, token) if token.scope == "job" else ""
    return Identity(actor=token.acts_as, via=f"token:{token.token_id}", jobs_of=jobs_of)


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED), from the kernel."""
    if sock.family != socket.AF_UNIX:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def from_peer(uid: int, os_accounts: Mapping[str, str] | None = None) -> Identity:
    """A local caller on the Unix socket acts as the ledger user its OS account is
    (`socket_user`: its OS user name, or the ledger user serve.toml's `os_accounts` maps to
    it; how Slurm trusts its head node)."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError as err:
        raise NotAuthenticated(f"uid {uid} has no user name on this host") from err
    actor = socket_user(name, os_accounts or {})
    if isinstance(actor, NotAuthenticated):
        raise actor
    return Identity(actor=actor, via=f"peer:{uid}")


def socket_user(os_name: str, os_accounts: Mapping[str, str]) -> str | NotAuthenticated:
    """Pure: the ledger user the OS account `os_name` acts as on the Unix socket, the inverse
    of `os_accounts` (ledger user -> the OS account its jobs run as): the ledger user mapped to
    it (`L = "O"`: O's caller is L), else its own name, unless that name is a ledger user
    mapped to another account (its jobs run as that one: OS user L is not ledger user L,
    whose jobs would run as O, another person's code as O: atk46-23 F4); refused too when
    several ledger users map to it (who it is cannot be said). A refusal is one line; a token
    still works."""
    mapped = sorted(u for u, account in os_accounts.items() if account == os_name and u != os_name)
    if len(mapped) == 1:
        return mapped[0]
    hint = "send a token of the ledger user (GPULEDGER_TOKEN), or an admin fixes os_accounts"
    if mapped:
        return NotAuthenticated(
            f"OS account {os_name!r} is the account of several ledger users in serve.toml's "
            f"os_accounts ({', '.join(mapped)}): it cannot be told which one on the socket",
            hint=hint,
        )
    if os_accounts.get(os_name, os_name) != os_name:
        return NotAuthenticated(
            f"OS account {os_name!r} is not the ledger user {os_name!r}: serve.toml's "
            f"os_accounts runs that user's jobs as OS account {os_accounts[os_name]!r}, whose "
            "caller on the socket is that user",
            hint=hint,
        )
    return os_name


def act(identity: Identity, cmd: c.AnyCommand) -> c.AnyCommand:
    """The command as the caller may send it: the actor is the caller unless the body names
    someone else (`--as`, which the domain allows admins only); `real_actor` is always set by
    us, never taken from the body."""
    import msgspec

    actor = cmd.actor or identity.actor
    real = identity.actor if actor != identity.actor else None
    return msgspec.structs.replace(cmd, actor=actor, real_actor=real)
