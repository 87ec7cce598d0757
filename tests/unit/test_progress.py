"""The one progress display (`ledger.cli.output.progress`): on a terminal, done/total on
stderr; nothing at all when stderr is not a terminal."""

from __future__ import annotations

import contextlib
import io

from ledger.cli.output import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_when_stderr_is_not_a_terminal() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), progress("events", 10) as update:
        for i in range(11):
            update(i)
        update(10, 12)
    assert err.getvalue() == ""


def test_a_terminal_sees_done_of_a_known_total() -> None:
    err = _Terminal()
    with contextlib.redirect_stderr(err), progress("events verified", 1234) as update:
        update(617)
    text = err.getvalue()
    # thousands separated, as every result line prints counts (atk47-29 F3)
    assert "events verified" in text and "617/1,234" in text, text
    assert "?" not in text.split("events verified", 1)[1].split("\n")[0]


def test_a_total_learned_late_replaces_the_unknown_one() -> None:
    err = _Terminal()
    with contextlib.redirect_stderr(err), progress("events") as update:
        update(5, 50)
    assert "5/50" in err.getvalue()
