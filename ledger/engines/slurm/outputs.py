"""A Slurm run's output and error files, made the job's user's before `sbatch` (T19 in
docs/security.md). slurmstepd opens them as the job's user with O_CREAT and no O_EXCL, so a file
another account planted at the name (in a directory both may write: /tmp, a 1777 project dir) is
appended to and a link there is followed, and whoever planted it reads the job's output. So the
executor does first, as the job's user, what the node agents' wrapper does (`supervise.WRAPPER`):
a name that is free is taken (created empty, 0600, O_EXCL: in a sticky directory nobody else can
remove or replace it then), one the user owns is left to append to, one another account owns (a
file or a link) refuses the launch with why. A file that cannot be made here (its directory is
missing or closed to the user, or only on the compute nodes) is left to Slurm, which fails the
launch then (JobLaunchFailure) or opens it where it runs. An edge (it runs a shell as the user)."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

from ledger.engines.accounts import RunAs, account_for
from ledger.engines.slurm.words import SBATCH_ENV, SbatchUser

log = logging.getLogger("gpuledger.slurm")

CLAIM = r"""umask "$1"
shift
for f in "$@"; do
  if [ -L "$f" ] || [ -e "$f" ]; then
    if [ -L "$f" ] || [ -f "$f" ]; then
      [ -n "$(find "$f" -maxdepth 0 -user "$(id -u)" 2>/dev/null)" ] || printf '%s\n' "$f"
    fi
  else
    (set -C; : >"$f") 2>/dev/null
  fi
done
exit 0
"""
"""As the job's user, $1 the umask to make them with, the rest the files: prints each one
another account owns; takes the free ones."""

PRIVATE = 0o077
"""The umask of a run's files when its submission recorded none (the user's alone, 0600)."""


def files_umask(job_umask: int | None, names_output: bool) -> int:
    """Pure: the umask a run's output files are made with: the job's as submitted for the files
    it names (sbatch's rule), `PRIVATE` for the engine's default log in the service's directory
    and for a submission that recorded none."""
    return job_umask if job_umask is not None and names_output else PRIVATE


def claim_outputs(
    paths: Iterable[str], who: SbatchUser, timeout_s: float, umask: int = PRIVATE
) -> str:
    """Make the run's files the user's where they are free (with `umask`); "" when Slurm may
    open them all, else why not (one line, in the node agents' words). `who.uid` None: the
    service's own account runs the job, and the shell runs as it."""
    files = [p for p in dict.fromkeys(paths) if p]
    if not files:
        return ""
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", CLAIM, "gpuledger-claim", f"{umask:04o}", *files],
            capture_output=True, text=True, timeout=timeout_s, check=False, cwd="/",
            env={"PATH": "/usr/bin:/bin"}, **_as(who),
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as err:  # as a file it cannot make: Slurm's
        log.warning("cannot check the output files %s: %s", files, err)
        return ""
    taken = [ln for ln in done.stdout.splitlines() if ln in files]
    if not taken:
        return ""
    kind = "output file" if taken[0] == files[0] else "error file"
    return f"the {kind} {taken[0]} exists and belongs to another user"


def _as(who: SbatchUser) -> dict[str, Any]:
    """`subprocess` arguments that run as the job's user with its groups (initgroups)."""
    if who.uid is None:
        return {}
    gid = who.gid if who.gid is not None else who.uid
    groups = os.getgrouplist(who.name, gid) if who.name else []
    return {"user": who.uid, "group": gid, "extra_groups": groups}


def sbatch_user(user: str, run_as: RunAs) -> SbatchUser | str:
    """Who a job of `user` runs as (`account_for`, the rule of every engine), as sbatch's
    `--uid` and `--gid` (none when it is the service's own account), or why it may not run."""
    account = account_for(user, run_as, os.geteuid())
    if isinstance(account, str):
        return account
    other = account.uid != os.geteuid()
    return SbatchUser(
        uid=account.uid if other else None,
        gid=account.gid if other else None,
        name=account.name,
        home=account.home,
        shell=account.shell,
    )


def sbatch_env(service_env: Mapping[str, str], umask: int = PRIVATE) -> dict[str, str]:
    """Pure: sbatch's own environment: PATH, where the cluster is (`SBATCH_ENV`) and
    SLURM_UMASK. sbatch hands its environment to the job, so nothing else of the service's goes
    in (its secrets, its HOME, `SBATCH_*` options)."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    # the umask slurmstepd makes the output files with (`files_umask`; the batch script gives
    # the job its own umask)
    env["SLURM_UMASK"] = f"{umask:04o}"
    env.update({k: service_env[k] for k in SBATCH_ENV if k in service_env})
    return env
