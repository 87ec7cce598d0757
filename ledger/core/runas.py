"""Who a job runs as: the ledger's rule from a ledger user to an OS account.

Pure: the OS account database is read by the edge and handed in (`Lookup`); no I/O here. A job
runs as its owner's OS account: the ledger user's own name, or the name a site maps it to
(`RunAs.accounts`, `os_accounts` in serve.toml: an admin's file). The account must exist and be a
person's, not the system's: its uid at least `min_uid` (1000 by default, as on most
distributions). `root` runs only root's own jobs, and only when the site allows it
(`root_jobs`); a job is never run as root on someone else's behalf.

The rule is asked three times, so nothing runs as an account it should not: at a submission
(the server refuses it with one line, nothing appended: `admit`), when a job is handed to an
engine (the dispatcher records `launch_failed` instead of launching it: a job submitted to the
data directory with no server, or whose account went away), and when a member is added (only
admins may add a system account as a member: `admit`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import msgspec

from ledger.core.secret_shapes import SECRET_NAMES, secret_value
from ledger.core.state import State, held_bytes
from schemas import commands as c
from schemas.bounds import MAX_ARRAY_TASKS
from schemas.errors import NotAuthorised

DEFAULT_MIN_UID = 1000
DEFAULT_MAX_UID = 60000
"""Debian's UID_MAX (login.defs): above it come the system's dynamically allocated accounts
(60000-64999, Debian's `slurm` is 64030) and `nobody` (65534)."""
NOLOGIN_SHELLS = frozenset(
    {"/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false", "/bin/sync"}
)
"""Login shells that mark an account as the system's, not a person's."""


@dataclass(frozen=True)
class OsAccount:
    """An OS account as the password database has it."""

    name: str
    uid: int
    gid: int
    home: str = ""
    shell: str = ""
    groups: tuple[str, ...] = ()
    """The names of its groups (primary and supplementary)."""


PRIVILEGED_GROUPS = frozenset(
    {
        "root", "sudo", "wheel", "admin", "adm", "systemd-journal", "ssl-cert", "slurm",
        "munge", "shadow", "disk", "kmem", "sys", "docker", "lxd", "libvirt",
    }
)  # fmt: skip
"""Groups whose members can act for the system or read and write as root: sudo, read its logs
(`adm`, the whole journal: `systemd-journal`), run Slurm, read /etc/shadow (`shadow`), TLS
private keys (`ssl-cert`), the raw disks (`disk`) or memory (`kmem`), start root containers or
VMs (`docker`, `lxd`, `libvirt`), Debian's `sys`; a site adds its own service groups (serve.toml
`privileged_groups`). A member in one may be added by an admin alone; its jobs are its own or an
admin's (`RunAs.account`)."""


Lookup = Callable[[str], OsAccount | None]
"""The OS account of a name, or None when there is none (the edge reads pwd)."""


@dataclass(frozen=True)
class RunAs:
    """The site's rule (serve.toml: `min_uid`, `root_jobs`, `os_accounts`, `privileged_groups`)."""

    min_uid: int = DEFAULT_MIN_UID
    max_uid: int = DEFAULT_MAX_UID
    """The highest uid of a person's account (Debian's UID_MAX): above it are the system's."""
    root_jobs: bool = False
    """Root's own jobs may run as root (never anyone else's)."""
    accounts: Mapping[str, str] = field(default_factory=dict)
    """Ledger user -> OS account name, where they differ."""
    privileged_groups: frozenset[str] = PRIVILEGED_GROUPS
    """The groups with the system's rights: the built-in ones and the site's own."""

    def os_name(self, user: str) -> str:
        return self.accounts.get(user, user)

    def account(
        self, user: str, lookup: Lookup, *, by: str | None = None, admin: bool = False
    ) -> OsAccount:
        """Pure: the OS account `user`'s jobs run as, or NotAuthorised saying why none may.

        `by` submitted the job (`admin`: an admin of the ledger). An account with the system's
        rights (`privileged`) runs its own jobs and an admin's, never another's: a manager who
        added a member before it joined `sudo` (or `disk`, `docker`...) cannot run as it since.
        Asked at each submission and again before each launch, with the groups as they are."""
        name = self.os_name(user)
        found = lookup(name)
        mapped = f" (mapped to {name!r})" if name != user else ""
        if found is None:
            raise NotAuthorised(
                f"{user!r}{mapped} has no OS account here, and jobs run as their owner's account",
                hint="an admin creates the account, or maps the user in serve.toml's os_accounts",
                user=user,
            )
        if found.uid == 0:
            if user == "root" and self.root_jobs:
                return found
            whose = "root's own jobs only, and only" if user == "root" else "root's own jobs only"
            raise NotAuthorised(
                f"jobs of {user!r}{mapped} would run as root: a job runs as root for "
                f"{whose} when serve.toml sets root_jobs = true",
                user=user,
            )
        why = self.not_a_person(found)
        if why:
            raise NotAuthorised(
                f"{name!r} is a system account ({why}): jobs do not run as system accounts",
                hint="submit as a person's account (see docs/slurm-users.md, 'Who a job runs as')",
                user=user,
            )
        groups = self.privileged(found)
        if groups and by is not None and by != user and not admin:
            raise NotAuthorised(
                f"{by!r} may not run jobs as {name!r}: it has the system's rights (group "
                f"{groups}), and only an admin or {user!r} itself submits its jobs",
                hint="see docs/slurm-users.md, 'Who a job runs as'",
                user=user,
            )
        return found

    def not_a_person(self, found: OsAccount) -> str:
        """Pure: why an account is the system's rather than a person's ("" for a person's): a
        uid outside [min_uid, max_uid], or a login shell that allows no login (nologin)."""
        if found.uid < self.min_uid:
            return f"uid {found.uid} < min_uid {self.min_uid}"
        if found.uid > self.max_uid:
            return f"uid {found.uid} > max_uid {self.max_uid}"
        if found.shell in NOLOGIN_SHELLS:
            return f"its shell is {found.shell}"
        return ""

    def system(self, user: str, lookup: Lookup) -> OsAccount | None:
        """Pure: the OS account of `user` when it is a system account (`not_a_person`: root,
        a uid outside [min_uid, max_uid], a nologin shell) or one with the system's rights
        (in a `PRIVILEGED_GROUPS` group, a sudoer); None for a person's account or no account
        at all."""
        found = lookup(self.os_name(user))
        if found is None:
            return None
        return found if self.not_a_person(found) or self.privileged(found) else None

    def privileged(self, found: OsAccount) -> str:
        """Pure: the privileged groups an account is in, in words ("" when none)."""
        return ", ".join(sorted(self.privileged_groups & set(found.groups)))


@dataclass(frozen=True)
class SubmitLimits:
    """What one user may queue (serve.toml: `max_jobs_per_user`, `max_array_size`; 0: no
    limit), like Slurm's MaxSubmitJobs and MaxArraySize."""

    max_jobs_per_user: int = 0
    """Unfinished jobs (pending, placed, running; each array task one) a user may own."""
    max_array_size: int = 0
    """Tasks one array may have."""
    max_job_bytes_per_user: int = 0
    """About the bytes (`state.held_bytes`) a user's unfinished jobs' specs may hold in the
    server's memory, all together: 20,000 jobs of a 900 KiB command each were taken, ~40 GB of
    the server's memory for one plain user (atk44z F7)."""

    def check(self, state: State, cmd: c.SubmitJob) -> None:
        """Pure: NotAuthorised (one line) when `cmd` would go past a limit."""
        tasks = max(1, len(set(cmd.array)))
        if self.max_array_size and tasks > self.max_array_size:
            raise NotAuthorised(
                f"an array of {tasks:,} tasks is more than the {self.max_array_size:,} one "
                "array may have here (max_array_size)",
                hint="split it into smaller arrays, or ask an admin to raise the limit",
                actor=cmd.actor,
            )
        user = cmd.user or cmd.actor
        if self.max_jobs_per_user:
            now = state.active_of(user)
            if now + tasks > self.max_jobs_per_user:
                raise NotAuthorised(
                    f"{user!r} has {now:,} unfinished jobs, and {tasks:,} more would pass the "
                    f"{self.max_jobs_per_user:,} one user may have here (max_jobs_per_user)",
                    hint="wait for some to end, or cancel some",
                    actor=cmd.actor,
                )
        if self.max_job_bytes_per_user:
            held, more = state.held_of(user), tasks * held_bytes(cmd)
            if held + more > self.max_job_bytes_per_user:
                raise NotAuthorised(
                    f"{user!r}'s unfinished jobs hold {_mib(held)} of commands, environments, "
                    f"paths and dependencies, and {tasks:,} more of {_mib(more)} would pass the "
                    f"{_mib(self.max_job_bytes_per_user)} one user may have here "
                    "(max_job_bytes_per_user)",
                    hint="wait for some to end, cancel some, or send smaller commands "
                    "or dependencies",
                    actor=cmd.actor,
                )


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def admit(
    state: State,
    cmd: c.AnyCommand,
    *,
    lookup: Lookup,
    rule: RunAs,
    submissions: bool,
    secret: str = SECRET_NAMES,
    limits: SubmitLimits | None = None,
) -> c.AnyCommand:
    """Pure: `cmd` as the ledger may take it at `state`, or NotAuthorised (nothing appended).

    0. who acts as someone else (`real_actor`) is checked first, as `decide` would: a refusal
       never tells a caller how the service runs jobs;
    1. a member who is a system account may be added by an admin alone;
    2. with `submissions` (the service runs jobs as their owners), a job's user must map to an
       OS account the rule accepts;
    3. a job's environment loses the names that match `secret`;
    4. a submission stays within the site's `limits` (jobs per user, tasks per array)."""
    if cmd.real_actor is not None:
        from ledger.core.authz import check_act_as

        check_act_as(state, cmd.real_actor, cmd.actor)
    if isinstance(cmd, c.AddMember):
        found = rule.system(cmd.user, lookup)
        if found is not None and not state.is_admin(cmd.actor):
            raise NotAuthorised(
                f"{cmd.actor!r} may not add {cmd.user!r}: it is a system account "
                f"({rule.not_a_person(found) or 'in group ' + rule.privileged(found)}), "
                "which only an admin may add as a member",
                actor=cmd.actor,
            )
        return cmd
    if not isinstance(cmd, c.SubmitJob):
        return cmd
    if limits is not None:
        limits.check(state, cmd)
    if submissions:
        rule.account(cmd.user or cmd.actor, lookup, by=cmd.actor, admin=state.is_admin(cmd.actor))
    pattern = re.compile(secret)
    if any(pattern.search(k) or secret_value(v) for k, v in cmd.env.items()):
        env = {k: v for k, v in cmd.env.items() if not (pattern.search(k) or secret_value(v))}
        return msgspec.structs.replace(cmd, env=env)
    return cmd


def admission_meaning(admission: dict[str, object]) -> dict[str, object]:
    """Pure: the admission settings (`ledger.wire.config.admission_of`'s keys) as what they mean,
    so that settings written otherwise that mean the same are recorded alike (a standby so
    written could not start: atk40-28 F3), and what an earlier version recorded, which wrote
    them as given, is compared by what it meant (`ledger.store.lease.earlier_admission`):
    `max_array_size` 0 is the most an array may have (10,000); the privileged groups are the
    built-in ones (`runas.PRIVILEGED_GROUPS`, which every server adds) and the site's, sorted,
    so listing `sudo` or not is the same; an `os_accounts` entry that maps a user to its own
    name (the server's own account, say `root = "root"`) is the same as none."""
    out = dict(admission)
    if out.get("max_array_size") == 0:
        out["max_array_size"] = MAX_ARRAY_TASKS
    groups = out.get("privileged_groups")
    if isinstance(groups, list | tuple | set | frozenset):
        out["privileged_groups"] = sorted(PRIVILEGED_GROUPS | {str(g) for g in groups})
    accounts = out.get("os_accounts")
    if isinstance(accounts, dict):
        out["os_accounts"] = {k: v for k, v in sorted(accounts.items()) if k != v}
    return out
