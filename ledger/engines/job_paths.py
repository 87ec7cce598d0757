"""The path rule of a job's working directory and output files, one code for every engine
(T19 in docs/security.md): run as the job's user by the supervisor's opener on `up` and the node
agents (`open_outputs`, a child that hands descriptors back), by the Slurm executor's claim
(`ledger.engines.slurm.outputs`) and by `submit` (`path_refusal`, what the submitting host can
see). Each name is resolved from `/` one at a time (openat, O_NOFOLLOW): no directory that holds
a name on the way may be writable by accounts other than its owner without the sticky bit, a
symbolic link is followed only when it is the user's own in a directory no other account may
write, every directory on the way (and an output's own directory) must be the user's or root's
(`owner_refused`), the working directory must be the user's or root's, an existing output must
be a regular file of the user's with one link. It imports only the standard library."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import stat
from collections.abc import Sequence
from typing import Any

from ledger.engines.command_names import runs_script, simple_commands


def umask_of(spec: dict[str, Any]) -> str:
    """The job's umask for its leader (`WRAPPER`'s $4): four octal digits, "" when its
    submission recorded none (the spec is the service's; checked anyway)."""
    mask = str(spec.get("umask") or "")
    return mask if len(mask) == 4 and all(ch in "01234567" for ch in mask) else ""


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


def owner_refused(where: str, owner: int, uid: int, what: str, shown: str) -> str:
    """Pure: the path rule for the owner of a directory on the way to a job's working directory
    or output file (and of an output's own directory): refused ("" when not) unless it is the
    user's (`uid`) or root's. Its owner may rename anything in it, whatever its mode says (a
    0755 directory of another account's: it may put a directory or link of its own in place of
    the name the job goes through, atk40-23 F5). `where` as in `dir_refused`."""
    if owner in (uid, 0):
        return ""
    place = where or "the working directory"
    return (
        f"the {what} {shown} is reached through {place}, which belongs to another account (uid "
        f"{owner}: it may rename anything in it, a directory or link of its own into the place "
        "of a name the job goes through): refused; use a path whose directories are yours or "
        "root's"
    )


def _walk(
    path: str, what: str, shown: str, links: list[int], base: int | None, holder: bool = False
) -> tuple[int, str, str]:
    """As this process's user: the directory holding `path`'s last name (an O_PATH descriptor,
    each name opened with O_NOFOLLOW from `/`, or from `base` for a relative path), that name
    and the directory's path as followed ("": the working directory, or `base`).
    Every directory that holds a name on the way (not the last name) must pass `dir_refused` and
    `owner_refused` (with `holder`, the one holding the last name `owner_refused` too), and a
    link on the way is followed only by `link_refused`'s rule, else `Refused`; OSError when a
    name is missing, closed to the user or not a directory."""
    names = [n for n in path.split("/") if n]
    cur = os.open("/" if path.startswith("/") else ".", _DIR, dir_fd=base)
    where = "/" if path.startswith("/") else ""
    try:
        while len(names) > 1:
            name = names.pop(0)
            here = os.fstat(cur)
            unsafe = dir_refused(where, here.st_mode, what, shown) or owner_refused(
                where, here.st_uid, os.getuid(), what, shown
            )
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
                    why = link_refused(st.st_uid, here.st_mode, os.getuid(), last=False)
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
        if holder and (unsafe := owner_refused(where, os.fstat(cur).st_uid, os.getuid(), what,
                                               shown)):  # fmt: skip
            raise Refused(unsafe)
    except BaseException:
        os.close(cur)
        raise
    return cur, (names[0] if names else "."), where


def open_workdir(path: str) -> int:
    """As the job's user: its working directory, an O_PATH descriptor the job is started in
    (never the name again, which another account could swap meanwhile), resolved one name at a
    time by `link_refused`'s rule; the directory itself must be the user's or root's (a
    directory of another account's in its place decides what the job runs: atk38-23 F10)."""
    links = [0]
    try:
        fd, _, _ = _walk(path.rstrip("/") + "/.", "working directory", path, links, None)
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
    """As this process's user (the submitter, at submit: `cli.submit.path_warnings`): why the
    path rule would refuse the way to `directory` (the working directory, or an output file's
    directory, for `what` `shown`; the directory itself the user's or root's), or "" when it
    would not or cannot say from here (a name missing or closed: the launch checks again, on
    the job's node). Nothing is opened but O_PATH descriptors."""
    try:
        fd, _, _ = _walk(directory.rstrip("/") + "/.", what, shown, [0], None)
        owner = os.fstat(fd).st_uid
        os.close(fd)
        if owner not in (os.getuid(), 0):
            if what == WORKDIR:
                return f"the {what} {shown} belongs to another user"
            return owner_refused(directory, owner, os.getuid(), what, shown)
    except Refused as refused:
        return "" if refused.unreachable else str(refused)
    except OSError:
        return ""
    return ""


PROGRAM, SCRIPT = "program", "script"
"""What the path rule calls the names a job's command runs by (`check_command`)."""


def check_command(command: Sequence[str], wd: str = "", relative: bool = True) -> None:
    """As the job's user, in its working directory (or, at submit, relative to `wd`): the path
    rule for the names in its command that decide what it runs, opened by name when it starts
    (atk43 F1): its program when named by a path (`./train.sh`, `/srv/x/run`; a bare name is
    looked up in PATH), then each later word in turn up to the first that names something
    (`check_program`): the script its interpreter runs (`/bin/sh /srv/x/q.sh`, what `submit
    q.sh` records; `python train.py`). A word is passed over only when it names nothing by a
    way the rule allows, so another account cannot make the script's name vanish at the check
    and come back after it (a word holding a NUL names nothing: it cannot start). Without
    `relative`, only absolute words are looked at (at submit, when the working directory's way
    is refused already: the same warning once). Raises `Refused` with why."""

    for words, where in simple_commands(command, wd):
        _check_simple(words, where, relative, own_wd=where == wd)


def _check_simple(command: Sequence[str], wd: str, relative: bool, own_wd: bool) -> None:
    """`check_command` for one simple command (`command_names.simple_commands`): its program
    when named by a path; for an interpreter or launcher (`command_names.runs_script`), the
    script it runs: its later words up to the first that names something, except a long
    option's value that looks like no script (a directory, a file with neither an execute bit
    nor a script's suffix: `--config_file cfg.yaml`, `--log-dir DIR`), which is checked and the
    walk goes on (`accelerate launch --config_file cfg.yaml /srv/x/t.py` ran a teammate's t.py,
    atk43n F1; after `--standalone train.py` the walk refused the script's data, atk44n F7); the
    value of `--name=VALUE` is checked too; `-c CODE`, `-m MODULE`, `-e CODE` end the walk (no
    script follows). Other programs' words are their data (`cat`, `tar`, `tee`: atk44n F8, F12).
    The bare-name exception holds in the job's own working directory only (`own_wd`), not in
    one a wrapper moves to."""

    def at(word: str) -> str:
        return os.path.join(wd, word) if wd else word

    def check(word: str, what: str) -> bool:
        bare = in_workdir(word) if own_wd else ""
        return check_program(at(bare or word), what, word, in_workdir=bool(bare))

    def looked(word: str) -> bool:
        return bool(word) and "\0" not in word and (relative or word.startswith("/"))

    if command and "/" in command[0] and "\0" not in command[0]:
        check(command[0], PROGRAM)
    if not command or not runs_script(command[0]):
        return
    after_option = False
    for word in command[1:]:
        if word in ("-c", "-m", "-e", "--eval", "--command"):
            return  # code or a module from the command line: no script file follows
        if word.startswith("--") and "=" in word:
            value = word.split("=", 1)[1]
            if looked(value):
                check(value, SCRIPT)
        elif looked(word) and check(word, SCRIPT) and not (after_option and not _script(at(word))):
            return
        after_option = word.startswith("--") and word != "--" and "=" not in word


SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".pl", ".rb", ".js", ".mjs", ".R", ".r", ".jl",
                   ".lua", ".php")  # fmt: skip
"""What a script's name ends with (a long option's value that does not is taken for data)."""


def _script(path: str) -> bool:
    """Whether a name the walk found (its way passed the rule) looks like a script: a regular
    file with an execute bit or a script's suffix."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (bool(st.st_mode & 0o111) or path.endswith(SCRIPT_SUFFIXES))


def in_workdir(word: str) -> str:
    """The name in the working directory a relative word names directly, "" for any other:
    `run.sh`, and `./run.sh` spelled with leading `./` (one file, one answer: `sh ./run.sh`
    was refused in a group project directory where `sh run.sh` and `./run.sh` ran, atk43n
    F6). Not `a/../run.sh`: `a` may be a link elsewhere."""
    while word.startswith("./"):
        word = word[2:].lstrip("/")
    return word if word and "/" not in word and word not in (".", "..") else ""


def check_program(path: str, what: str, shown: str = "", links: list[int] | None = None,
                  base: int | None = None, in_workdir: bool = False) -> bool:  # fmt: skip
    """As this process's user: `Refused` when the path rule refuses the way to `path` (`_walk`:
    every directory on the way, and the one holding it, the user's or root's and not writable by
    other accounts without the sticky bit, checked before the name in it is looked up; a link
    followed only by `link_refused`'s rule, at its last name too). The holder's mode is let be
    only for a bare name in the working directory (`in_workdir`: the documented exception, as
    for outputs); a script directly in a group project directory named by its path was run
    after a teammate renamed their own file over it (atk43n F5). True when it names
    something, False when a name on the way is missing or closed to the user."""
    shown = shown or path
    links = [0] if links is None else links
    try:
        holder, name, where = _walk(path, what, shown, links, base, holder=True)
    except OSError:
        return False
    try:
        mode = os.fstat(holder).st_mode
        if not in_workdir and (unsafe := dir_refused(where, mode, what, shown)):
            raise Refused(unsafe)  # another account may rename its own file to the name
        try:
            node = os.open(name, _NAME, dir_fd=holder)
        except OSError:
            return False
        try:
            st = os.fstat(node)
            if not stat.S_ISLNK(st.st_mode):
                return True
            links[0] += 1
            if links[0] > MAX_LINKS:
                raise Refused(f"cannot follow the {what} {shown}: too many symbolic links")
            why = link_refused(st.st_uid, mode, os.getuid(), last=False)
            if why:
                raise Refused(f"the {what} {shown} is a symbolic link, which {why}: not followed")
            target = os.readlink("", dir_fd=node)
        finally:
            os.close(node)
        return check_program(target, what, shown, links, holder)
    finally:
        os.close(holder)


def program_refusal(wd: str, command: Sequence[str], relative: bool = True) -> list[str]:
    """As this process's user (the submitter, at submit: `cli.submit.path_warnings`): why the
    path rule would refuse the command's own names (`check_command`) at launch, as far as this
    host sees them ([] when it would not)."""
    try:
        check_command(command, wd, relative)
    except Refused as refused:
        return [] if refused.unreachable else [str(refused)]
    return []


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
        holder, name, _ = _walk(path, what, shown, links, base, holder=True)
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
        return _kept_private(fd, holder, shown, what)
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
        where = os.fstat(holder)
        why = link_refused(st.st_uid, where.st_mode, os.getuid(), last=True)
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


def _kept_private(fd: int, holder: int, path: str, what: str) -> int:
    """`fd` (an existing output, `_checked`) unless `more_than_umask` refuses it (then closed)."""
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        mask = os.umask(0)
        os.umask(mask)
        why = more_than_umask(st.st_mode, os.fstat(holder).st_mode, mask)
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
    check_command(spec.get("command") or ())
    mask = umask_of(spec)
    os.umask(int(mask, 8) if mask else 0o077)
    return fds + [open_own(path, what) for what, path in named]


def open_outputs(spec: dict[str, Any], timeout_s: float = OPEN_TIMEOUT_S) -> dict[str, int]:
    """The job's working directory and the output and error files the user named, opened as the
    user (`open_workdir`, `open_own`) by a child that hands the descriptors back:
    {"working directory": fd, "output file": fd, ...}. Raises `Refused` with why when one may
    not be used."""
    files = _outputs(spec)
    named = ([(WORKDIR, spec["workdir"])] if spec.get("workdir") else []) + files
    command = spec.get("command") or ()
    if not named and not (command and ("/" in command[0] or len(command) > 1)):
        return {}  # nothing to open, no name of the command's to check (`check_command`)
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
