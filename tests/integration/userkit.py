"""Real OS accounts for tests that run jobs as another user (the suite runs as root): made with
`useradd`, removed with `userdel` afterwards. Code run as them is a shell or Debian's
/usr/bin/python3 (the project's venv is not readable by other users)."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import grp
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path
    groups: tuple[str, ...]
    """Its supplementary groups (made for it)."""

    @property
    def gids(self) -> set[int]:
        return {self.gid} | {grp.getgrnam(g).gr_gid for g in self.groups}


ACCOUNTS_LOCK = Path(tempfile.gettempdir()) / "gpuledger-tests-accounts.lock"


@contextlib.contextmanager
def accounts_locked() -> Iterator[None]:
    """Held while a test makes or removes OS accounts and groups: the suite's workers run side by
    side, and `useradd`/`groupadd` refuse ("cannot lock /etc/passwd") rather than wait while
    another holds the account files; a check-then-make of a named account is one step under it."""
    with ACCOUNTS_LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(*args: str) -> None:
    got = subprocess.run(args, capture_output=True, text=True, check=False)
    if got.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {got.returncode}: {got.stderr.strip()} "
            "(the suite runs as root and makes its own OS accounts)"
        )


@contextlib.contextmanager
def os_user(prefix: str = "glt", groups: int = 1, uid: int | None = None) -> Iterator[User]:
    """A fresh OS account with a home directory others may traverse (its jobs read their files
    there) and `groups` supplementary groups of its own; removed afterwards."""
    assert os.geteuid() == 0, "the suite runs as root: it makes the OS accounts it runs jobs as"
    name = f"{prefix}{secrets.token_hex(3)}"
    top = Path(tempfile.mkdtemp(prefix="gpuledger-home-"))
    top.chmod(0o755)
    home = top / name
    extra = [f"{name}g{i}" for i in range(groups)]
    with accounts_locked():
        for g in extra:
            _run("groupadd", g)
    args = ["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/sh"]
    if extra:
        args += ["--groups", ",".join(extra)]
    if uid is not None:
        args += ["--non-unique", "--uid", str(uid)]
    try:
        with accounts_locked():
            _run(*args, name)
        pw = pwd.getpwnam(name)
        yield User(name, pw.pw_uid, pw.pw_gid, home, tuple(extra))
    finally:
        with accounts_locked():
            subprocess.run(["userdel", "--force", name], capture_output=True, check=False)
            with contextlib.suppress(KeyError):
                grp.getgrnam(name)
                subprocess.run(["groupdel", name], capture_output=True, check=False)
            for g in extra:
                subprocess.run(["groupdel", g], capture_output=True, check=False)
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def shared_dir(prefix: str = "gpuledger-") -> Iterator[Path]:
    """A directory other users may traverse (pytest's own tmp directories are private to
    root), removed afterwards: where a test puts what jobs of other users must reach."""
    top = Path(tempfile.mkdtemp(prefix=prefix))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def marks_dir() -> Path:
    """A directory every account may write (sticky: 1777), for the marks of jobs that run as
    nobody (the service runs as root), removed when the test process exits (the HA tests left
    one in /tmp a test)."""
    marks = Path(tempfile.mkdtemp(prefix="gpuledger-marks-"))
    marks.chmod(0o1777)
    atexit.register(shutil.rmtree, marks, True)
    return marks
