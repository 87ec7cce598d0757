"""`job_paths.open_own`: a job's output file is opened once, and only a regular file of the
user's (or /dev/null) is taken; anything else at the name is refused at once, never written to
or waited on (atk37-23 F1, F5). Real files in a temporary directory; links and files of
another account need root (the suite's user)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from ledger.engines.job_paths import Refused, open_own


def _other(path: Path) -> None:
    assert os.geteuid() == 0, "another account's file needs root: run the suite as CI does"
    nobody = pwd.getpwnam("nobody")
    os.lchown(path, nobody.pw_uid, nobody.pw_gid)


@pytest.mark.parametrize(
    ("case", "want"),
    [
        ("a named pipe nobody reads", "exists and is a named pipe, not a regular file"),
        ("a named pipe someone reads", "exists and is a named pipe, not a regular file"),
        ("a directory", "exists and is a directory, not a regular file"),
        ("another account's file", "exists and belongs to another user"),
        ("another account's link to the user's file", "exists and belongs to another user"),
        ("the user's link to a named pipe", "exists and is a named pipe, not a regular file"),
    ],
)
def test_what_is_not_the_users_regular_file_is_refused(
    tmp_path: Path, case: str, want: str
) -> None:
    name = tmp_path / "out.txt"
    mine = tmp_path / "mine.txt"
    mine.write_text("kept\n")
    reader = -1
    if "named pipe" in case and "link" not in case:
        os.mkfifo(name)
        if "someone reads" in case:
            reader = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
    elif case == "a directory":
        name.mkdir()
    elif case == "another account's file":
        name.write_text("theirs\n")
        _other(name)
    elif case == "another account's link to the user's file":
        name.symlink_to(mine)
        _other(name)
    else:
        os.mkfifo(tmp_path / "pipe")
        name.symlink_to(tmp_path / "pipe")
    named = tmp_path / "pipe" if "link to a named pipe" in case else name  # the name it holds
    try:
        with pytest.raises(Refused, match=f"the output file {named} {want}"):
            open_own(str(name), "output file")
        if reader >= 0:
            assert os.read(reader, 10) == b""  # nothing was ever written to it
    finally:
        if reader >= 0:
            os.close(reader)
    assert mine.read_text() == "kept\n"


def test_a_free_name_is_made_and_the_users_own_file_link_or_dev_null_taken(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        made = open_own(str(tmp_path / "new.out"), "output file")
    finally:
        os.umask(old)
    os.write(made, b"a\n")
    os.close(made)
    assert (tmp_path / "new.out").stat().st_mode & 0o777 == 0o640
    (tmp_path / "link.out").symlink_to("new.out")  # the user's own link, relative
    again = open_own(str(tmp_path / "link.out"), "output file")
    os.write(again, b"b\n")  # appended, through the descriptor opened
    os.close(again)
    assert (tmp_path / "new.out").read_text() == "a\nb\n"
    null = open_own("/dev/null", "output file")
    assert os.get_blocking(null)
    os.close(null)


def test_the_descriptor_is_the_file_made_whatever_the_name_becomes(tmp_path: Path) -> None:
    """F5: the name swapped for a link once made moves the name, never the output."""
    name = tmp_path / "race.out"
    fd = open_own(str(name), "output file")
    name.rename(tmp_path / "race.out.moved")
    (tmp_path / "steal.txt").write_text("")
    name.symlink_to(tmp_path / "steal.txt")
    os.write(fd, b"private\n")
    os.close(fd)
    assert (tmp_path / "race.out.moved").read_text() == "private\n"
    assert (tmp_path / "steal.txt").read_text() == ""
