"""Every CLI error line names a long value cut, at the one place errors are printed
(`output.fail`): a 10,000-character option value was echoed whole in a 10,049-10,485-character
line by click's "Invalid value for ..." and the duration, status and file parsers (atk61-29c F3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli import cli
from ledger.cli.output import cut_values

LONG = "x" * 10_000

CASES = [
    ["report", "preemptions", "--window", LONG],
    ["jobs", "--status", LONG],
    ["log", "--tail", LONG],
    ["explain", LONG],
    ["jobs", "--before-id", LONG],
    ["queue", "--state", LONG],
    ["simulate", "run", "--synthetic", "--policy", LONG],
    ["simulate", "run", "--synthetic", "--set", LONG],
    ["whatif", "--budgets", LONG],
    ["budget", "apply", LONG],
    ["report", "preemptions", "--since", LONG],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(w[:12] for w in a))
def test_a_long_value_is_cut_in_the_error_line(args: list[str], tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["--home", str(tmp_path / "h"), *args])
    assert out.exit_code == 1, out.output
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[:300]
    assert "x" * 61 not in lines[0] and len(lines[0]) < 800, lines[0][:300]
    assert "(10,000 characters)" in lines[0], lines[0]  # the value's length is said


def test_cut_values_cuts_quoted_values_and_long_words_only() -> None:
    line = f"invalid --set '{LONG}': can't read {'y' * 120}: no such file"
    assert cut_values(line) == (
        f"invalid --set '{'x' * 60}'... (10,000 characters): can't read "
        f"'{'y' * 60}'... (120 characters): no such file"
    )
    whole = f"don't 'a b' \"{'z' * 100}\" {'w' * 100}, it's"
    assert cut_values(whole) == whole
