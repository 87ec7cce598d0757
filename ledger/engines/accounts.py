"""Which OS account a job runs as, on every engine. An edge: reads the account database.

A job runs as its owner, never as root on someone else's behalf:

- a service running as **root** with `run_as = "submitter"` (the default) runs each job as the
  OS account named like its ledger user, with that account's primary group and supplementary
  groups (initgroups); a user with no OS account, or whose account is uid 0 without being
  `root`, is refused (the launch fails, recorded `launch_failed` with the reason). `root`'s own
  jobs (the ledger user `root`) run as root: the ledger decides who may submit as root (issue
  "sbatch-like": the uid minimum and the system accounts);
- a service running as root with `run_as = "service"` runs the jobs of others as `nobody`
  (HTCondor's unprivileged fallback), never as root; root's own jobs as root;
- a service **not** running as root runs every job as its own account (it cannot switch): the
  site's choice of one dedicated account for every job.

Which ledger users may exist is the ledger's rule; this is the engine's last word.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Literal

from ledger.engines.env import Account

RunAs = Literal["submitter", "service"]
FALLBACK = "nobody"
"""The account of other users' jobs when a root service runs them `as the service`."""


def _account(pw: pwd.struct_passwd) -> Account:
    return Account(
        name=pw.pw_name,
        uid=pw.pw_uid,
        gid=pw.pw_gid,
        groups=tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)),
        home=pw.pw_dir,
        shell=pw.pw_shell or "/bin/sh",
    )


def account_for(user: str, run_as: RunAs, euid: int) -> Account | str:
    """The account a job of ledger user `user` runs as, or why it may not run (module doc)."""
    if euid != 0:
        try:
            me = pwd.getpwuid(euid)
        except KeyError:
            return f"the service's own uid {euid} has no account entry to run jobs as"
        return _account(me)
    if user == "root":
        return _account(pwd.getpwuid(0))
    name = user if run_as == "submitter" else FALLBACK
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        if run_as == "submitter":
            return f"user {user!r} has no OS account on this node to run the job as"
        return f"there is no {FALLBACK!r} account to run the job of {user!r} as"
    if pw.pw_uid == 0:
        return (
            f"OS account {name!r} is root (uid 0): a job is never run as root on someone else's "
            "behalf"
        )
    return _account(pw)


def own_log(log_dir: Path, name: str, uid: int | None = None, gid: int | None = None) -> Path:
    """The engine's own output file of a job that names none: `<log_dir>/<name>`, in a
    directory only the service writes (0755), made for the job's user (`uid`, `gid`; None:
    the service's own) and readable by them alone (0600), on every engine."""
    log_dir.chmod(0o755)
    out = log_dir / name
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        if uid is not None:
            os.fchown(fd, uid, -1 if gid is None else gid)
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return out


def private_dirs(runs: Path, rundir: Path, gid: int | None) -> None:
    """The run directories of a part (`runs/<run>/<rank>`), private to the service and the
    job's owner (docs/security.md, row T13): `runs` may be traversed but not listed (0711);
    the run's and the part's own directories are the service's, entered by the job's group
    only (0710; 0700 when the job runs as the service), so the job reaches its work directory
    (its checkpoint file) and no other account reaches anything. The work directory is the
    job's (0700) and the spec, which holds the job's command, environment and token, the
    service's (0600)."""
    runs.mkdir(parents=True, exist_ok=True)
    runs.chmod(0o711)
    for d in (rundir.parent, rundir):
        d.mkdir(mode=0o700, exist_ok=True)
        if gid is not None:
            os.chown(d, -1, gid)
        d.chmod(0o700 if gid is None else 0o710)


def own_umask() -> int:
    """This process's umask, read without changing it (`/proc/self/status`; 0o022 where the
    kernel does not say): what a job's own files are made with, on every engine."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
