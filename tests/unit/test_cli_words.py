"""The CLI's small words (atk61-29b nits): one number format in `replay`'s bar and summary, a
time before 1970 refused in the option's words, not its type's, and a long value cut in an
error line with its length said."""

from __future__ import annotations

import pytest

from ledger.cli.audit import replay_summary
from schemas.errors import InvalidCommand
from schemas.units import parse_time, shorten


def test_the_replay_summary_counts_as_its_bar_does() -> None:
    line = replay_summary(1778, 2.0, 1777, 1, 0)
    assert line.startswith("1,778 decisions replayed in 2.00 s (889.0/s): 1,777 identical"), line


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1969-12-31T23:00:00Z", "invalid --since '1969-12-31T23:00:00Z': before "
         "1970-01-01T00:00:00Z, the earliest time the ledger keeps"),
        ("-1", "invalid --since '-1': before 1970-01-01T00:00:00Z, the earliest time the "
         "ledger keeps"),
        ("nan", "invalid --since 'nan': not a time"),
        ("inf", "invalid --since 'inf': not a time"),
        ("3001-01-01", "invalid --since '3001-01-01': after 3000-01-01T00:00:00Z, the latest "
         "time the ledger keeps"),
    ],
)  # fmt: skip
def test_a_time_out_of_bounds_is_refused_in_the_options_words(text: str, want: str) -> None:
    with pytest.raises(InvalidCommand) as e:
        parse_time(text, "--since")
    assert e.value.message == want
    assert "float" not in e.value.line()


def test_a_long_value_is_cut_in_the_error_with_its_length() -> None:
    assert shorten("prog1/team01") == "'prog1/team01'"
    cut = shorten("x" * 10_000)
    assert cut == f"'{'x' * 60}'... (10,000 characters)"
    with pytest.raises(InvalidCommand) as e:
        parse_time("y" * 10_000, "--since")
    assert len(e.value.line()) < 200 and "(10,000 characters)" in e.value.line()
