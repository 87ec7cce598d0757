"""A Slurm run's output and error files, made the job's user's before `sbatch` (T19 in
docs/security.md). slurmstepd opens them as the job's user with O_CREAT and no O_EXCL, so a file
another account planted at the name (in a directory both may write: /tmp, a 1777 project dir) is
appended to and a link there is followed, and whoever planted it reads the job's output. So the
executor does first, as the job's user, what the node agents' supervisor does
(`supervise.open_own`): a name that is free is taken (created empty, O_EXCL: in a sticky
directory nobody else can remove or replace it then), one the user owns is left to append to,
one another account owns (a file or a link) or one that is not a regular file (a named pipe, a
socket, a directory, a device other than /dev/null) refuses the launch with why. Unlike the
supervisor, which opens the file once and hands that descriptor to the job, this checks names:
slurmstepd opens the file again later, so in a directory another account may write without the
sticky bit it may swap the name in between (T19). A file that cannot be made here (its directory
is missing or closed to the user, or only on the compute nodes) is left to Slurm, which fails
the launch then (JobLaunchFailure) or opens it where it runs. An edge (it runs a shell as the
user)."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

from ledger.engines.accounts import RunAs, account_for
from ledger.engines.slurm.words import SBATCH_ENV, SbatchUser

log = logging.getLogger("gpuledger.slurm")

CLAIM = r"""umask "$1"
shift
mine() { [ -n "$(find "$1" -maxdepth 0 -user "$(id -u)" 2>/dev/null)" ]; }
usable() { [ -f "$1" ] || [ "$1" -ef /dev/null ]; }
for f in "$@"; do
  # a free name is taken: O_CREAT|O_EXCL, which neither follows a link nor opens (or waits on)
  # anything planted there meanwhile (dash's `set -C; : >f` opens an existing named pipe)
  dd if=/dev/null of="$f" conv=excl status=none 2>/dev/null && continue
  if [ -L "$f" ]; then
    if ! mine "$f"; then printf 'other %s\n' "$f"
    elif [ -e "$f" ] && ! usable "$f"; then printf 'special %s\n' "$f"; fi
  elif [ -e "$f" ]; then
    if ! usable "$f"; then printf 'special %s\n' "$f"
    elif ! mine "$f" && [ -f "$f" ]; then printf 'other %s\n' "$f"; fi
  fi
done
exit 0
"""
"""As the job's user, $1 the umask to make them with, the rest the files: takes the free ones
(made empty, O_EXCL); prints `other NAME` for each one another account owns (a file or a link)
and `special NAME` for each one that is not a regular file (a named pipe, socket, directory or
device, /dev/null aside: slurmstepd would wait on a pipe for ever, or write to whoever reads it).
A name it cannot make or see is left to Slurm."""

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
    for name in files:  # Slurm reads `\` in -o/-e itself: the name it opens is not this one
        if "\\" in name:
            what = "output file" if name == files[0] else "error file"
            return (
                f"the {what} {name} has a backslash, which Slurm reads as an escape (it "
                "would open another name than the one checked): name it without one"
            )
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", CLAIM, "gpuledger-claim", f"{umask:04o}", *files],
            capture_output=True, text=True, timeout=timeout_s, check=False, cwd="/",
            env={"PATH": "/usr/bin:/bin"}, **_as(who),
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as err:  # as a file it cannot make: Slurm's
        log.warning("cannot check the output files %s: %s", files, err)
        return ""
    for line in done.stdout.splitlines():
        said, _, name = line.partition(" ")
        if name in files and said in ("other", "special"):
            what = "output file" if name == files[0] else "error file"
            if said == "other":
                return f"the {what} {name} exists and belongs to another user"
            return f"the {what} {name} exists and is {_kind(name)}, not a regular file"
    return ""


def _kind(path: str) -> str:
    """What `path` is, in words (for the refusal only: the check was the user's shell's)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "not a regular file"
    kinds = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory",
             stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}  # fmt: skip
    return kinds.get(stat.S_IFMT(mode), "not a regular file")


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
