"""The per-job supervisor: `python -m ledger.engines.supervise RUNDIR`.

Like slurmstepd, one small process per job part is the job's parent, so the service (or a node
agent) can stop, crash or restart without touching the job. It detaches (a new session, then a
fork whose parent exits at once, so init adopts it), makes the part's process tree
(`ledger.engines.tree`: its cgroups, or its session), starts the job in it and, once the tree is
empty, writes the part's end to `RUNDIR/exit` (atomically).

The job's leader is a small POSIX shell (`WRAPPER`) running **as the job's user**, in the job's
session and groups, started in the working directory the user's opener opened (`open_workdir`:
never its name resolved again), it checks that the command can be started, runs it, and writes
the command's exit code to `RUNDIR/record` through a descriptor it inherited (the command itself
does not): the tree's own record, which survives a supervisor killed with -9. Its stdout and
stderr are the output and error files the user named, opened before by a child of the supervisor
running as the user (`open_outputs`: created by the user, with the user's rights, each opened
once and checked on the descriptor). Times are never the leader's word (it runs as the job's
user, with the job's PATH and environment): the end is the supervisor's own clock when the
leader exits, or, when the supervisor died, the record file's modification time (the kernel's
clock at the leader's write). A command it cannot start is recorded `launch_failed` with the
reason, never as a job that ran. The engine's defaults (the run's work directory, the log file
under the service's job directory) are entered and opened by the supervisor before it drops to
the user, as they are the service's paths.

When the leader ends and processes of the tree are left (children it did not wait for), they get
SIGTERM at once and SIGKILL after the job's grace; the part ends when the tree is empty, and the
record says how many were left and whether they had to be killed. Files it writes:

    RUNDIR/supervisor   "PID START" of the supervisor (START: /proc start time)
    RUNDIR/job          "PID START STARTED_AT" of the leader (its session and process group id
                        is PID; STARTED_AT: when it started, seconds since the epoch)
    RUNDIR/record       the leader's own record: "exit CODE", or "failed REASON" (its mtime is
                        when the leader wrote it)
    RUNDIR/exit         the part's end, JSON: code, ended_at, leader_ended_at, left, killed,
                        launch_failed (an older supervisor wrote the bare exit code)
    RUNDIR/launch.log   what the supervisor said of a launch that failed (or the leader, with
                        no output file of the user's)
    RUNDIR/watchdog     "PID START" of the part's lease watchdog (`start_watchdog`)

Exit codes are the shell's: the command's status, or 128 + N when signal N killed it (Slurm's
convention); 127 with `launch_failed` when it could not start. SIGTERM, SIGINT and SIGHUP sent to
the supervisor are passed on to the whole tree. It imports only the standard library and
`ledger.engines.proc`/`tree`: it is started once per job part.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

from ledger.engines.lease_file import NodeLease
from ledger.engines.proc import start_time, write_atomic
from ledger.engines.tree import Containment, Tree, wait_empty

CANNOT_START = 127
FENCE_CHECK_S = 1.0
"""How often a part with a lease looks at it."""
FENCED_MARK = "fenced"
"""`RUNDIR/fenced`: left by whichever fence (the supervisor's or the watchdog's) signals the
tree first, before it signals: the exit then says `fenced` whatever the job's exit code (a job
that exits 0 on SIGTERM, as the signal contract asks, is never taken for a completion)."""
SHELL = "/bin/sh"
WRAPPER = r"""wd=$1 job_mask=$2
shift 2
trap : TERM INT HUP
fail() { printf 'gpuledger: %s\n' "$1" >&2; printf 'failed %s\n' "$1" >&9; exit 127; }
if [ -n "$wd" ] && [ "$wd" -ef . ]; then PWD=$wd; export PWD; fi
if [ -n "$job_mask" ]; then umask "$job_mask"; fi
case $1 in
*/*) [ -f "$1" ] && [ -x "$1" ] || fail "cannot start $1: no such executable file" ;;
*) command -v -- "$1" >/dev/null 2>&1 || fail "cannot start $1: not found in PATH" ;;
esac
printf 'started\n' >&9
exec 8>&2 2>/dev/null
("$@" 2>&8 8>&- 9>&-)
code=$?
printf 'exit %s\n' "$code" >&9
exit "$code"
"""
"""The leader of every job part (module doc): $1-$2 are the working directory the user gave
("": the supervisor's) and the job's umask as submitted (four octal digits; "": none recorded),
then the command; fd 9 is the record, and its stdout and stderr are already the job's output and
error files (`open_outputs` opened them as the user, once). With a umask, the job runs with it;
without, it keeps the umask it inherited.
The shell's own stderr is closed while the command runs (it would say "Terminated" of a job
that was stopped, in the job's own output)."""
RECORD_FD = 9


def _identity(pid: int, *extra: str) -> bytes:
    return " ".join([str(pid), str(start_time(pid)), *extra]).encode() + b"\n"


def detach(rundir: Path) -> int:
    """Fork the supervisor off and return at once: the supervisor is then nobody's child but
    init's, so the process that started it may exit or be killed at any time without a zombie
    or a signal reaching the job. Its identity is written before this returns."""
    with contextlib.suppress(PermissionError):  # already a session leader when started so
        os.setsid()
    pid = os.fork()
    if pid == 0:
        os._exit(run(rundir))
    write_atomic(rundir / "supervisor", _identity(pid))
    return 0


def code_of(returncode: int) -> int:
    """Pure: a Popen return code as the shell says it (-N, killed by signal N: 128 + N)."""
    return returncode if returncode >= 0 else 128 - returncode


def tree_of(spec: dict[str, Any], sid: int | None = None) -> Tree:
    """The part's tree as its spec names it (`sid`: the leader's pid, its session)."""
    containment = Containment.from_json(spec.get("containment"))
    return Tree(str(spec.get("cgroup") or ""), containment, sid)


class Record(NamedTuple):
    """What the leader recorded: its command's exit code, or why it could not start it; and
    when it wrote that (the file's mtime, the kernel's clock: never a time the job wrote)."""

    code: int | None = None
    ended_at: float | None = None
    failed: str = ""


def record_says_started(rundir: Path) -> bool:
    """Whether the leader got past its working directory and output files (`started` in its
    record): the job's command runs (a launch that failed before never says so)."""
    try:
        with open(rundir / "record", "rb") as f:
            return b"started\n" in f.read(2000)
    except OSError:
        return False


def read_record(rundir: Path) -> Record | None:
    """The leader's record (module doc), if it wrote one. Bounded, and only two numbers or a
    reason are read: the leader runs as the job's user."""
    try:
        with open(rundir / "record", "rb") as f:
            written = os.fstat(f.fileno()).st_mtime
            raw = f.read(2000)
    except OSError:
        return None
    for line in raw.decode(errors="replace").splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "failed":
            return Record(code=CANNOT_START, failed=rest.strip()[:1000])
        if kind == "exit":
            try:
                return Record(code=int(rest.split()[0]), ended_at=written)
            except (ValueError, IndexError):
                return None
    return None


def _user(spec: dict[str, Any]) -> dict[str, Any]:
    """Popen arguments that run the job as the spec's uid, gid and groups (the executor looked
    them up, and refused root on someone else's behalf)."""
    who = spec.get("account")
    if not who:
        return {}
    return {"user": who["uid"], "group": who["gid"], "extra_groups": who["groups"]}


def run(rundir: Path) -> int:
    spec = json.loads((rundir / "spec.json").read_bytes())
    tree = tree_of(spec)
    grace_s = float(spec.get("grace_s") or 30.0)
    job: subprocess.Popen[bytes] | None = None
    early: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if job is None:
            early.append(signum)  # passed on as soon as the job exists
            return
        tree.signal(signum)

    # handlers (not SIG_IGN): ignored signals would be inherited by the job across exec
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    failed = ""
    try:
        job = _start(rundir, spec, tree)
    except Refused as why:
        failed = str(why)
        with _private(rundir / "launch.log") as said:
            said.write(f"gpuledger: {failed}\n".encode())
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
        command = (spec.get("command") or ["true"])[0]
        failed = f"cannot start {command!r}: " + (
            e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        )
        with _private(rundir / "launch.log") as said:
            said.write(f"gpuledger: {failed}\n".encode())
    if job is None:
        _write_exit(rundir, CANNOT_START, time.time(), launch_failed=failed)
        tree.remove()
        return 0
    tree.sid = job.pid
    write_atomic(rundir / "job", _identity(job.pid, f"{time.time():.6f}"))
    for signum in early:
        forward(signum, None)
    lease = str(spec.get("lease") or "")
    if lease:
        start_watchdog(rundir, tree, lease, grace_s)
    returncode, fenced = wait_leader(job, tree, lease, grace_s, rundir / FENCED_MARK)
    code = code_of(returncode)
    leader_ended = time.time()  # the supervisor's own clock, never the job's word (module doc)
    left, killed = end_of_tree(tree, grace_s)
    record = read_record(rundir) or Record()
    _write_exit(
        rundir,
        code,
        time.time() if left else leader_ended,
        leader_ended_at=leader_ended,
        left=left,
        killed=killed,
        launch_failed=record.failed,
        fenced=fenced,
    )
    tree.remove()
    return 0


def _umask(spec: dict[str, Any]) -> str:
    """The job's umask for its leader (`WRAPPER`'s $4): four octal digits, "" when its
    submission recorded none (the spec is the service's; checked anyway)."""
    mask = str(spec.get("umask") or "")
    return mask if len(mask) == 4 and all(ch in "01234567" for ch in mask) else ""


def _private(path: Path) -> Any:
    """`path` opened to append, made 0600 (what a job says may name its paths)."""
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")


class Refused(Exception):
    """The part may not start, and why in one line (recorded `launch_failed`): its working
    directory or an output file the user named cannot be used. `unreachable`: the path could
    not be followed at all (a name missing or closed to the user), not refused by a rule (the
    Slurm executor leaves such a file to the job's node, which may have it)."""

    def __init__(self, why: str, unreachable: bool = False) -> None:
        super().__init__(why)
        self.unreachable = unreachable


OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""How a job's output file is opened: never through a link at its name (`open_own` follows only
the user's own), never blocked by a named pipe (O_NONBLOCK: one with no reader fails ENXIO)."""
NULL_DEVICE = os.makedev(1, 3)
"""`/dev/null`, the one file that is not a regular file a job may write to (`-o /dev/null`)."""
MAX_LINKS = 40
"""Symbolic links followed in one path at most (the kernel's own limit)."""
OPEN_TIMEOUT_S = 60.0
"""How long the user's opener may take (a hung network file system): then the launch fails."""
_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_NAME = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_UNREACHABLE = (errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.EPERM)


def others_may_write(mode: int) -> bool:
    """Pure: whether accounts other than a directory's owner may add, rename or remove what it
    holds (group or world write, no sticky bit): a link or file there may be another's doing."""
    return bool(mode & 0o022) and not mode & stat.S_ISVTX


def link_refused(link_uid: int, dir_mode: int, uid: int, last: bool) -> str:
    """Pure: the path rule for a symbolic link met while resolving a job's working directory or
    output file as user `uid` ("" when it is followed, else why not): a link is followed only
    when it is the user's own (or, on the way to the last name, root's: `/var/run`) and sits in
    a directory no other account may write without the sticky bit (there another account may
    have renamed someone's link into place: atk38-23 F1, F2, F10). The kernel's
    `protected_symlinks` asks this only in sticky world-writable directories."""
    if link_uid != uid and (last or link_uid != 0):
        return "belongs to another user"
    if others_may_write(dir_mode):
        return "is in a directory other accounts may write (one of them may have put it there)"
    return ""


def dir_refused(where: str, mode: int, what: str, shown: str) -> str:
    """Pure: the path rule for a directory that holds a name on the way to a job's working
    directory or output file (not the last name of an output: `_open_last`): refused ("" when
    not) when accounts other than its owner may write it without the sticky bit, as they may then
    rename anything in it, a directory or link of theirs (or of the user's own) into the place
    of the name the job goes through (POSIX; atk39-23 F1, F2). `where` is its path ("": the
    working directory, for a relative output)."""
    if not others_may_write(mode):
        return ""
    place = where or "the working directory"
    fix = where or "."
    return (
        f"the {what} {shown} is reached through {place}, which other accounts may write "
        f"(mode {stat.S_IMODE(mode):04o}, no sticky bit: one of them could put a directory or "
        f"link of their own in place of a name in it): refused; make it safe with "
        f"`chmod +t {fix}` or `chmod go-w {fix}`"
    )


def _walk(path: str, what: str, shown: str, links: list[int], base: int | None) -> tuple[int, str]:
    """As this process's user: the directory holding `path`'s last name (an O_PATH descriptor,
    each name opened with O_NOFOLLOW from `/`, or from `base` for a relative path) and that name.
    Every directory that holds a name on the way (not the last name) must pass `dir_refused`,
    and a link on the way is followed only by `link_refused`'s rule, else `Refused`; OSError when
    a name is missing, closed to the user or not a directory."""
    names = [n for n in path.split("/") if n]
    cur = os.open("/" if path.startswith("/") else ".", _DIR, dir_fd=base)
    where = "/" if path.startswith("/") else ""
    try:
        while len(names) > 1:
            name = names.pop(0)
            unsafe = dir_refused(where, os.fstat(cur).st_mode, what, shown)
            if unsafe:
                raise Refused(unsafe)
            node = os.open(name, _NAME, dir_fd=cur)
            try:
                st = os.fstat(node)
                if stat.S_ISLNK(st.st_mode):
                    link = os.path.join(where, name)
                    links[0] += 1
                    if links[0] > MAX_LINKS:
                        raise Refused(f"cannot open the {what} {shown}: too many symbolic links")
                    why = link_refused(st.st_uid, os.fstat(cur).st_mode, os.getuid(), last=False)
                    if why:
                        raise Refused(f"the {what} {shown} goes through the symbolic link {link}, "
                                      f"which {why}: not followed")  # fmt: skip
                    text = os.readlink("", dir_fd=node)
                    names = [n for n in text.split("/") if n] + names
                    if text.startswith("/"):
                        os.close(cur)
                        cur, where = os.open("/", _DIR), "/"
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
            except BaseException:
                os.close(node)
                raise
            os.close(cur)
            cur, where = node, os.path.join(where, name)
    except BaseException:
        os.close(cur)
        raise
    return cur, (names[0] if names else ".")


def open_workdir(path: str) -> int:
    """As the job's user: its working directory, an O_PATH descriptor the job is started in
    (never the name again, which another account could swap meanwhile), resolved one name at a
    time by `link_refused`'s rule; the directory itself must be the user's or root's (a
    directory of another account's in its place decides what the job runs: atk38-23 F10)."""
    links = [0]
    try:
        fd, _ = _walk(path.rstrip("/") + "/.", "working directory", path, links, None)
    except OSError as err:
        raise Refused(f"cannot enter the working directory {path}", unreachable=True) from err
    try:
        owner = os.fstat(fd).st_uid
        if owner not in (os.getuid(), 0):
            raise Refused(f"the working directory {path} belongs to another user")
        os.fchdir(fd)  # search permission, as the user
    except OSError as err:
        os.close(fd)
        raise Refused(f"cannot enter the working directory {path}", unreachable=True) from err
    except BaseException:
        os.close(fd)
        raise
    return fd


def path_refusal(directory: str, what: str, shown: str) -> str:
    """As this process's user (the submitter, at submit: `cli.submit`): why the path rule would
    refuse the way to `directory` (the working directory, or an output file's directory, for
    `what` `shown`), or "" when it would not or cannot say from here (a name missing or closed:
    the launch checks again, on the job's node). Nothing is opened but O_PATH descriptors."""
    try:
        fd, _ = _walk(directory.rstrip("/") + "/.", what, shown, [0], None)
    except Refused as refused:
        return "" if refused.unreachable else str(refused)
    except OSError:
        return ""
    os.close(fd)
    return ""


def open_own(
    path: str, what: str, base: int | None = None, shown: str = "", links: list[int] | None = None
) -> int:
    """As the job's user (its uid is this process's): `path` opened once to append, a
    descriptor that becomes the job's stdout or stderr (T19 in docs/security.md). Its
    directories are resolved one name at a time (`_walk`: a symbolic link on the way is followed
    only by `link_refused`'s rule). A free name is created (O_EXCL, with the umask in force); an
    existing one must be, on the descriptor opened (fstat, never the name checked and then opened
    again, which another account could swap in between), a regular file of the user's with no
    other hard link (`_checked`), or /dev/null. A symbolic link at the name is followed only by
    the same rule (the user's own, in a directory others may not write), the name it holds opened
    by this same rule; a named pipe, socket, device or directory is refused, never waited on or
    written to."""
    shown = shown or path
    links = [0] if links is None else links
    try:
        holder, name = _walk(path, what, shown, links, base)
    except OSError as err:
        raise _why_not(shown, what, err) from err
    try:
        return _open_last(holder, name, what, shown, links)
    finally:
        os.close(holder)


def _open_last(holder: int, name: str, what: str, shown: str, links: list[int]) -> int:
    """`open_own` of the last name, in the directory `holder`."""
    try:
        fd = os.open(name, OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=holder)
        return _checked(fd, shown, what)
    except FileExistsError:
        pass
    except OSError as err:
        raise _why_not(shown, what, err) from err
    try:
        fd = _checked(os.open(name, OPEN_FLAGS, dir_fd=holder), shown, what)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise _why_not(shown, what, err) from err
    else:
        return _kept_private(fd, os.fstat(holder).st_mode, shown, what)
    links[0] += 1
    if links[0] > MAX_LINKS:
        raise Refused(f"cannot open the {what} {shown}: too many symbolic links")
    try:
        link = os.open(name, _NAME, dir_fd=holder)
    except OSError as err:
        raise _why_not(shown, what, err) from err
    try:
        st = os.fstat(link)
        if not stat.S_ISLNK(st.st_mode):
            raise Refused(f"cannot open the {what} {shown}: it changed while it was opened")
        why = link_refused(st.st_uid, os.fstat(holder).st_mode, os.getuid(), last=True)
        if why == "belongs to another user":
            raise Refused(f"the {what} {shown} exists and belongs to another user")
        if why:
            raise Refused(f"the {what} {shown} is a symbolic link, which {why}: not followed")
        target = os.readlink("", dir_fd=link)
    finally:
        os.close(link)
    return open_own(target, what, holder, os.path.join(os.path.dirname(shown), target), links)


def more_than_umask(file_mode: int, dir_mode: int, umask: int) -> str:
    """Pure: why an existing output file found in a directory other accounts may write without
    the sticky bit is refused ("" when it is not): its mode grants more than the job's umask
    allows. Any of them may have renamed another file of the user's (her notes, 0644) to the
    output's name, and would read there what a job submitted under umask 077 writes (atk39-23
    F6); a file the job's umask made (a run before, a relaunch) passes."""
    extra = stat.S_IMODE(file_mode) & 0o777 & umask
    if not extra or not others_may_write(dir_mode):
        return ""
    return (
        f"exists with mode {stat.S_IMODE(file_mode):04o}, more than the job's umask {umask:04o} "
        "allows, in a directory other accounts may write without the sticky bit (one of them "
        "may have renamed another file of yours there): refused; remove it, or `chmod "
        f"go-rwx` it, or submit under a umask that allows its mode"
    )


def _kept_private(fd: int, dir_mode: int, path: str, what: str) -> int:
    """`fd` (an existing output, `_checked`) unless `more_than_umask` refuses it (then closed)."""
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        mask = os.umask(0)
        os.umask(mask)
        why = more_than_umask(st.st_mode, dir_mode, mask)
        if why:
            os.close(fd)
            raise Refused(f"the {what} {path} {why}")
    return fd


def _checked(fd: int, path: str, what: str) -> int:
    """`fd` when it is a regular file of this user's with no other hard link (or /dev/null),
    made blocking again; else closed, never written to, and the launch refused. A second link is
    a name the user may not have made: another account may link a group-writable file of the
    user's to the output's name (`protected_hardlinks` allows it), and read there what the job
    writes under its umask (atk38-23 F1)."""
    try:
        st = os.fstat(fd)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == NULL_DEVICE:
            pass
        elif not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise Refused(f"the {what} {path} exists and is {kind}, not a regular file")
        elif st.st_uid != os.getuid():
            raise Refused(f"the {what} {path} exists and belongs to another user")
        elif st.st_nlink > 1:
            raise Refused(
                f"the {what} {path} exists and has {st.st_nlink} hard links (another name for "
                "it may not be the user's): refused, remove the other names or the file"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _why_not(path: str, what: str, err: OSError) -> Refused:
    """Why `path` could not be opened, in one line (the name looked at only for the words)."""
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
            return Refused(f"the {what} {path} exists and is {kind}, not a regular file")
        if st.st_uid != os.getuid():
            return Refused(f"the {what} {path} exists and belongs to another user")
    return Refused(
        f"cannot open the {what} {path}: {err.strerror or err}",
        unreachable=err.errno in _UNREACHABLE,
    )


def _outputs(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """The files the user named that the part's stdout and stderr go to: (what, path)."""
    out, err = spec.get("stdout") or "", spec.get("stderr") or ""
    named = [("output file", out)] if out else []
    return named + ([("error file", err)] if err and err != out else [])


WORKDIR = "working directory"
"""`open_outputs`'s key of the working directory's descriptor."""


def _open_as_user(spec: dict[str, Any], named: list[tuple[str, str]]) -> list[int]:
    """In a child of the supervisor: become the job's user (its groups too), open its working
    directory (`open_workdir`, first when it has one) and enter it, take its umask (0077 when
    none was recorded) and open the files it named."""
    who = spec.get("account")
    if who:
        os.setgroups(who["groups"])
        os.setgid(who["gid"])
        os.setuid(who["uid"])
    wd = spec.get("workdir") or ""
    fds = []
    if wd:
        fds.append(open_workdir(wd))
    else:
        try:
            os.chdir(spec.get("cwd") or "/")
        except OSError:
            os.chdir("/")  # no working directory of its own: the names it gave are absolute
    mask = _umask(spec)
    os.umask(int(mask, 8) if mask else 0o077)
    return fds + [open_own(path, what) for what, path in named]


def open_outputs(spec: dict[str, Any], timeout_s: float = OPEN_TIMEOUT_S) -> dict[str, int]:
    """The job's working directory and the output and error files the user named, opened as the
    user (`open_workdir`, `open_own`) by a child that hands the descriptors back:
    {"working directory": fd, "output file": fd, ...}. Raises `Refused` with why when one may
    not be used."""
    files = _outputs(spec)
    named = ([(WORKDIR, spec["workdir"])] if spec.get("workdir") else []) + files
    if not named:
        return {}
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the opener: never returns into the caller's code
        code = 1
        try:
            mine.close()
            try:
                socket.send_fds(theirs, [b"ok"], _open_as_user(spec, files))
            except Refused as refused:
                flag = b"u" if refused.unreachable else b"r"
                theirs.sendall(b"no" + flag + str(refused).encode(errors="replace")[:2000])
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    try:
        mine.settimeout(timeout_s)
        msg, fds, _, _ = socket.recv_fds(mine, 4096, len(named))
    except OSError as err:  # it hangs (a dead network file system): it never gets to answer
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        raise Refused(f"cannot open the {named[0][0]} {named[0][1]}: {err}") from err
    finally:
        mine.close()
        os.waitpid(pid, 0)
    if msg != b"ok" or len(fds) != len(named):
        for fd in fds:
            os.close(fd)
        why = msg[3:].decode(errors="replace") if msg.startswith(b"no") else ""
        raise Refused(why or f"cannot open the {named[0][0]} {named[0][1]}", msg[2:3] == b"u")
    return {what: fd for (what, _), fd in zip(named, fds, strict=True)}


def _start(rundir: Path, spec: dict[str, Any], tree: Tree) -> subprocess.Popen[bytes]:
    """The leader, born in the part's groups: the supervisor joins them for the fork only. It
    starts in the working directory the user's opener opened (`/proc/self/fd/N`: that
    directory, never its name resolved again)."""
    tree.create(spec.get("gpus", ()), constrain=bool(spec.get("constrain", True)))
    with contextlib.ExitStack() as files:
        named = open_outputs(spec)  # first: a refusal leaves nothing made
        for fd in named.values():
            files.callback(os.close, fd)
        wd = named.pop(WORKDIR, None)
        log = files.enter_context(open(spec["log"], "ab")) if spec.get("log") else None
        said = files.enter_context(_private(rundir / "launch.log"))
        out = named.get("output file", log or said)
        err = named.get("error file", out)
        record = os.open(rundir / "record", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        files.callback(os.close, record)
        if record != RECORD_FD:
            os.dup2(record, RECORD_FD)
            files.callback(os.close, RECORD_FD)
        before = tree.join()
        try:
            return subprocess.Popen(
                [SHELL, "-c", WRAPPER, "gpuledger-job", spec.get("workdir") or "",
                 _umask(spec), *(spec["command"] or ["true"])],
                env=spec["env"],
                cwd=f"/proc/self/fd/{wd}" if wd is not None else spec.get("cwd") or None,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(RECORD_FD,),
                start_new_session=True,
                **_user(spec),
            )  # fmt: skip
        finally:
            tree.leave(before)


def wait_leader(
    job: subprocess.Popen[bytes], tree: Tree, lease: str, grace_s: float, mark: Path | None = None
) -> tuple[int, bool]:
    """Wait for the leader; (its return code, whether the node's fence stopped it). With a
    lease, the part's own fence: once the lease has run out (its agent has not reached the
    server for as long as the server waits before it may run the job elsewhere), the tree gets
    SIGTERM, and SIGKILL after the grace: a partitioned or abandoned node never runs a job the
    ledger may have started again elsewhere."""
    if not lease:
        return job.wait(), False
    fd = os.pidfd_open(job.pid)
    fenced_at: float | None = None
    node_lease = NodeLease(lease)
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], FENCE_CHECK_S)
            if ready:  # the watchdog may have signalled first: its mark says so
                return job.wait(), fenced_at is not None or (mark is not None and mark.exists())
            now = time.time()
            if fenced_at is None and node_lease.passed(now):
                fenced_at = now
                _mark_fenced(mark)
                tree.signal(signal.SIGTERM)
            elif fenced_at is not None and now >= fenced_at + grace_s:
                tree.kill()
    finally:
        os.close(fd)


def _mark_fenced(mark: Path | None) -> None:
    """Say the fence signalled, before it does (whichever fence comes first)."""
    if mark is not None:
        with contextlib.suppress(OSError):
            write_atomic(mark, f"{time.time():.6f}\n".encode(), sync=False)


def start_watchdog(rundir: Path, tree: Tree, lease: str, grace_s: float) -> None:
    """The part's second fence, which does not depend on the supervisor: a process of its own
    (init's child, outside the job's tree, `RUNDIR/watchdog`) that stops the tree once the node's
    lease has run out, as `wait_leader` does, and exits when the tree is empty. A supervisor
    killed with -9 (OOM killer, an operator, a job running as the service's user) then leaves
    the lease enforced: a node cut off from the server never runs a job past its fence."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)  # the middle process exits at once: init adopts the watchdog
        return
    code = 0
    try:
        if os.fork():
            return
        write_atomic(rundir / "watchdog", _identity(os.getpid()))
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the supervisor's tree signals are not for it
        watch_lease(tree, lease, grace_s, rundir / FENCED_MARK)
    except BaseException:  # the forked watchdog never returns into the caller
        code = 1
    finally:
        os._exit(code)


def watch_lease(tree: Tree, lease: str, grace_s: float, mark: Path | None = None) -> None:
    """Until the tree is empty: once the lease has run out, SIGTERM to the tree, SIGKILL after
    the grace (the watchdog's loop); `mark` is left before the SIGTERM (`FENCED_MARK`)."""
    fenced_at: float | None = None
    node_lease = NodeLease(lease)
    while not tree.empty():
        now = time.time()
        if fenced_at is None and node_lease.passed(now):
            fenced_at = now
            _mark_fenced(mark)
            tree.signal(signal.SIGTERM)
        elif fenced_at is not None and now >= fenced_at + grace_s:
            tree.kill()
        time.sleep(FENCE_CHECK_S)


def end_of_tree(tree: Tree, grace_s: float) -> tuple[int, bool]:
    """The leader has ended: (processes it left, whether they had to be killed). They get
    SIGTERM now and SIGKILL after the grace; returns once the tree is empty."""
    left = len(tree.pids())
    if not left:
        return 0, False
    tree.signal(signal.SIGTERM)
    if wait_empty(tree, grace_s):
        return left, False
    while not tree.empty():
        tree.kill()
        wait_empty(tree, 1.0)
    return left, True


def _write_exit(rundir: Path, code: int, ended_at: float, **more: Any) -> None:
    record = {"code": code, "ended_at": ended_at, **more}
    write_atomic(rundir / "exit", json.dumps(record).encode() + b"\n")


class Forked:
    """A supervisor's starter made by forking this process: the child closes every inherited
    descriptor (the state directory's lock above all, so it never outlives us), then detaches
    the supervisor exactly as `python -m ledger.engines.supervise` does, and exits."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def start(cls, rundir: Path) -> Forked:
        pid = os.fork()
        if pid == 0:  # the starter: never returns into the caller's code
            code = 1
            try:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.closerange(3, 65536)
                code = detach(rundir)
            finally:
                os._exit(code)
        return cls(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


if __name__ == "__main__":
    sys.exit(detach(Path(sys.argv[1])))
