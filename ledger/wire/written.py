"""Read-your-writes across commands and failovers (docs/ha.md, "Reading your own writes"): the
client asks every read for at least the position of its last write (`X-Gpuledger-Min-Position`),
and a standby that has not folded it waits for it or answers 503, so the CLI reads elsewhere.
That position lived in the client's memory, one command long: `gpuledger submit` through the
leader and then `gpuledger jobs` answered by a standby whose link to the store lagged (atk45ha
F3) showed the ledger before the submit. Now the CLI keeps it on disk, one small file per OS
user and list of servers (`written_file`), raised by every write (`remember`) and read by the
next command (`last_written`). Standard library only: the client starts fast."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path


def written_file(urls: Sequence[str]) -> Path:
    """Where the position of this user's last write through the servers `urls` (a list, in
    any order) is kept: `$XDG_STATE_HOME/gpuledger/written-<digest>`, else under
    `~/.local/state`."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    digest = hashlib.sha256("\n".join(sorted(urls)).encode()).hexdigest()[:16]
    return Path(base) / "gpuledger" / f"written-{digest}"


def last_written(path: Path | None) -> int:
    """The position kept at `path` (0: none, or it does not read as one)."""
    if path is None:
        return 0
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return 0
    return _position(text)


def _position(text: str) -> int:
    """A kept position's text as a position: digits, at most 19 (a log position is a 64-bit
    integer), else 0 (a file of 4,300 digits or more made every command of its user an internal
    error: Python refuses to read such an int, atk46-ha F2)."""
    return int(text) if text.isdigit() and len(text) <= 19 else 0


def remember(path: Path | None, position: int) -> None:
    """Raise the position kept at `path` to `position` (never lower it: another command of
    the same user may have written later), under a lock of the file. Best effort: a home that
    cannot be written keeps read-your-writes within one command, as before."""
    if path is None or position <= 0:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
            text = os.read(fd, 32).decode("ascii", errors="replace").strip()
            if position > _position(text):
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                os.write(fd, f"{position}\n".encode())
        finally:
            os.close(fd)


def stale_line(url: str, stale_s: float) -> str:
    """The CLI's one line (stderr) when a server answered a read from a log it last read
    `stale_s` seconds ago, more than its lease (`X-Gpuledger-Stale`)."""
    return (
        f"note: {url} answered from the log as it read it {stale_s:.0f} s ago (it cannot read "
        "its store now): newer changes may be missing; `gpuledger status` there says why\n"
    )
