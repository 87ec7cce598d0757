"""A Slurm run's working directory and output files, checked and made the job's user's before
`sbatch`, then opened by the job's own batch script (T19 in docs/security.md). slurmstepd opens an
output file by name as the job's user with O_CREAT and no O_EXCL, after the executor's check: in
a directory another account may write without the sticky bit (a group project directory) it may
swap the name in between for a named pipe (slurmstepd then blocks, its node held, until the
planter reads the job's output) or a link (atk38-23 F3). So slurmstepd opens only /dev/null
(`sbatch --output=/dev/null`), and the output is opened by the batch script as the user:

1. `claim_outputs`, just before `sbatch`, as the job's user, by the very code the node agents'
   supervisor opens outputs with (`job_paths.open_outputs`: one rule for both engines): the
   working directory resolved name by name (no directory holding a name on the way writable by
   others without the sticky bit, a link only by the path rule, the directory the user's or
   root's) and each output file opened once (a free name made, with the
   files' umask; an existing one a regular file of the user's with no other hard link, or
   /dev/null; a link only the user's own). A refusal fails the launch with why. It keeps what it
   found: each file's inode and the working directory's real path (`Claimed`).
2. The batch script (`words.batch_script`) opens each output itself (`script_files`: never
   creating through a link, never waiting), checks the descriptor it opened (`stat -L
   /proc/self/fd/N`: a regular file of the user's, one link, *the inode claimed*), and only
   then makes it its stdout or stderr, opened again through that descriptor
   (`/proc/self/fd/N`, the same file) to append. Whatever was swapped in after the claim is
   refused there (mark `cannot-open`, exit 127: a failed launch), never written to or waited
   on. It enters the working directory and checks it is the real path claimed (`pwd -P`), the
   user's or root's.

A file or directory the service host cannot reach (missing there, closed to the user, or only on
the compute nodes) is left to the batch script's own checks, without an inode to compare. An
edge (it forks the opener as the user)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ledger.engines.accounts import RunAs, account_for
from ledger.engines.job_paths import WORKDIR, Refused, open_outputs, others_may_write
from ledger.engines.slurm.words import SBATCH_ENV, SbatchUser

log = logging.getLogger("gpuledger.slurm")

PRIVATE = 0o077
"""The umask of a run's files when its submission recorded none (the user's alone, 0600)."""


def files_umask(job_umask: int | None, names_output: bool) -> int:
    """Pure: the umask a run's output files are made with: the job's as submitted for the files
    it names (sbatch's rule), `PRIVATE` for the engine's default log in the service's directory
    and for a submission that recorded none."""
    return job_umask if job_umask is not None and names_output else PRIVATE


@dataclass(frozen=True)
class Claimed:
    """What the claim found: each output file's inode (absent: left to the job's node), the
    working directory's real path ("": none, or left to the node) and the error file Slurm may
    open itself (`steady`; "": none, slurmstepd opens /dev/null alone)."""

    inodes: dict[str, int] = field(default_factory=dict)
    workdir: str = ""
    error_file: str = ""

    def files(self, paths: Iterable[str]) -> list[tuple[str, int | None]]:
        """Pure: the batch script's files to open (`words.batch_script`'s `outputs`)."""
        return [(p, self.inodes.get(p)) for p in paths]


def claim_outputs(
    paths: Iterable[str],
    who: SbatchUser,
    timeout_s: float,
    umask: int = PRIVATE,
    workdir: str = "",
) -> Claimed | str:
    """Check the run's working directory and make its files the user's where they are free
    (with `umask`), as the user (module doc); what it found, else why not (one line, in the
    node agents' words). `who.uid` None: the service's own account runs the job."""
    files = [p for p in dict.fromkeys(paths) if p]
    for name in files:  # Slurm reads `\` in -o/-e itself: the name it opens is not this one
        if "\\" in name:
            what = "output file" if name == files[0] else "error file"
            return (
                f"the {what} {name} has a backslash, which Slurm reads as an escape (it "
                "would open another name than the one checked): name it without one"
            )
    account = _account(who)
    real = ""
    if workdir:
        got = _open(account, {"workdir": workdir}, timeout_s)
        if isinstance(got, str):
            return got
        if WORKDIR in got:
            real = os.readlink(f"/proc/self/fd/{got[WORKDIR]}")
            os.close(got[WORKDIR])
    inodes: dict[str, int] = {}
    for i, name in enumerate(files):
        got = _open(account, {"umask": f"{umask:04o}", ("stderr" if i else "stdout"): name},
                    timeout_s)  # fmt: skip
        if isinstance(got, str):
            return got
        for fd in got.values():
            inodes[name] = os.fstat(fd).st_ino
            os.close(fd)
    error = files[1] if len(files) > 1 else files[0] if files else ""
    uid = who.uid if who.uid is not None else os.geteuid()
    return Claimed(inodes, real, error if error in inodes and steady(error, uid) else "")


def steady(path: str, uid: int) -> bool:
    """Whether slurmstepd may open the run's error file `path` by its name itself (`sbatch
    --error`, so Slurm's own notes reach it as under sbatch: "CANCELLED ... DUE TO TIME
    LIMIT", its "error:" lines), as the claim left it: an absolute name, every directory from
    `/` to the file's own a directory (no link on the way) of user `uid`'s or root's that no
    other account may write (`job_paths.others_may_write`: with the sticky bit they may not
    rename or remove what is not theirs), the file itself a regular file of the user's, no
    link. Then no other account can put anything in its place between the claim and Slurm's
    open (atk38-23 F3); anywhere else slurmstepd opens /dev/null alone. Ownership and modes
    only their owners (the user, root) can change, so checking them here holds."""
    names = path.split("/")
    if not path.startswith("/") or any(n in (".", "..") for n in names):
        return False
    here = "/"
    try:
        for name in [*(n for n in names[:-1] if n), None]:
            st = os.lstat(here)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (uid, 0):
                return False
            if others_may_write(st.st_mode):
                return False
            if name is not None:
                here = os.path.join(here, name)
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == uid


def _account(who: SbatchUser) -> dict[str, Any] | None:
    """The opener's account (`job_paths.open_outputs`): the job's user with its groups
    (initgroups), None for the service's own account."""
    if who.uid is None:
        return None
    gid = who.gid if who.gid is not None else who.uid
    groups = os.getgrouplist(who.name, gid) if who.name else []
    return {"uid": who.uid, "gid": gid, "groups": groups}


def _open(
    account: dict[str, Any] | None, spec: dict[str, Any], timeout_s: float
) -> dict[str, int] | str:
    """`open_outputs` as `account`: its descriptors ({} when what it names cannot be reached
    from here: left to the job's node), or why it is refused."""
    try:
        return open_outputs({**spec, "account": account}, timeout_s)
    except Refused as refused:
        if refused.unreachable:
            log.info("left to the job's node: %s", refused)
            return {}
        return str(refused)


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
