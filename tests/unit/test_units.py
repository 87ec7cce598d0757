"""Durations and times, parsed and printed in one place (`schemas.units`): what each reader accepts
and refuses, the exact text of each format (the CLI's tables and sentences print them), and the
config types that keep a duration as written."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import units
from schemas.bounds import TEN_YEARS_S, YEAR_3000, describe
from schemas.errors import InvalidCommand
from schemas.units import Duration, Interval


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("90", 90),
        ("90s", 90),
        (" 15m ", 900),
        ("1.5h", 5400),
        ("7d", 604_800),
        ("1w", 604_800),
        ("0", 0),
        ("0.5m", 30),
    ],
)
def test_a_duration_is_whole_seconds(text: str, want: int) -> None:
    assert units.parse_duration(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("soon", "invalid duration 'soon' (use e.g. 30s, 15m, 8h, 7d)"),
        ("-1d", "invalid duration '-1d'"),
        ("1e400s", "invalid duration '1e400s'"),
        ("9" * 400, "invalid duration '999"),  # a float too large is no duration, not a crash
        ("0.4", "0.4 s is not a whole number of seconds"),
        ("90 s", "invalid duration '90 s'"),
        ("2y", "invalid duration '2y'"),
        ("-t 90", "invalid duration"),  # Slurm's time formats are not read (yet)
        ("1:30:00", "invalid duration"),
    ],
)
def test_what_is_no_duration_is_one_clear_error(text: str, want: str) -> None:
    with pytest.raises(InvalidCommand) as err:
        units.parse_duration(text)
    assert want in err.value.line()


def test_a_window_is_positive_and_bounded() -> None:
    assert units.parse_window("7d") == 604_800
    with pytest.raises(InvalidCommand, match="invalid --window: must be int >= 1, got 0"):
        units.parse_window("0s")
    with pytest.raises(InvalidCommand, match="invalid --half-life"):
        units.parse_window(f"{TEN_YEARS_S + 1}", "--half-life")


def test_an_interval_may_have_a_fraction_and_names_its_option() -> None:
    assert units.parse_interval("0.2s") == 0.2
    assert units.parse_interval("1.5m") == 90.0
    with pytest.raises(InvalidCommand) as err:
        units.parse_interval("2x", "--tick")
    assert err.value.line() == "invalid --tick '2x' (use e.g. 0.5s, 10s, 1m)"
    with pytest.raises(InvalidCommand, match="invalid --interval: "):
        units.parse_interval("0s")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2026-11-29T12:00", 1_795_953_600.0),
        ("2026-11-29T13:00+01:00", 1_795_953_600.0),
        ("1795953600", 1_795_953_600.0),
        ("1795953600.5", 1_795_953_600.5),
    ],
)
def test_a_time_is_iso_8601_in_utc_or_epoch_seconds(text: str, want: float) -> None:
    assert units.parse_time(text) == want


@pytest.mark.parametrize("text", ["yesterday", "-1", "nan", "inf", "32503680001"])
def test_what_is_no_time_is_refused(text: str) -> None:
    with pytest.raises(InvalidCommand):
        units.parse_time(text)


@pytest.mark.parametrize(
    ("seconds", "exact", "elapsed", "rounded"),
    [
        (None, "-", None, "-"),
        (0, "0s", "0s", "0s"),
        (45, "45s", "45s", "45s"),
        (119.6, "119s", "1m59s", "120s"),
        (129, "129s", "2m09s", "2m"),
        (900, "15m", "15m00s", "15m"),
        (3_900, "65m", "1h05m", "65m"),
        (7_200, "2h", "2h00m", "2.0h"),
        (28_800, "8h", "8h00m", "8.0h"),
        (90_061, "90061s", "1d1h", "25.0h"),
        (604_800, "168h", "7d0h", "7.0d"),
        (-5, "-5s", "0s", "-5s"),
    ],
)
def test_the_three_duration_formats(
    seconds: float | None, exact: str, elapsed: str | None, rounded: str
) -> None:
    assert units.format_duration(seconds) == exact
    if seconds is not None:
        assert units.span(seconds) == elapsed
    assert units.approx(seconds) == rounded


def test_a_moment_is_one_token_in_tables_and_has_a_space_in_sentences() -> None:
    at = 1_795_953_600.75
    assert units.format_time(at) == "2026-11-29T12:00:00Z"
    assert units.when(at) == "2026-11-29 12:00:00Z"
    assert units.format_time(None) == units.when(None) == "-"


@given(st.integers(0, TEN_YEARS_S))
def test_the_exact_format_reads_back(seconds: int) -> None:
    assert units.parse_duration(units.format_duration(seconds)) == seconds


@given(st.floats(0, YEAR_3000 - 1))
def test_a_formatted_time_reads_back_to_the_second(at: float) -> None:
    assert units.parse_time(units.format_time(at)) == math.floor(at)


def test_a_config_duration_keeps_its_text_and_compares_by_seconds() -> None:
    d = Duration("1h")
    assert (d.seconds, str(d), repr(d)) == (3600, "1h", "Duration('1h')")
    assert d == Duration("60m") and hash(d) == hash(Duration("3600"))
    assert d != Interval("1h") and Interval("0.2s").seconds == 0.2
    with pytest.raises(InvalidCommand, match=r"invalid --check-every: must be float >= 0\.001"):
        Interval("0", "--check-every")


class _Config(msgspec.Struct, forbid_unknown_fields=True):
    grace: Duration = Duration("30s")
    tick: Interval = Interval("2s")


@pytest.mark.parametrize(
    ("toml", "want"),
    [
        (b'grace = "1m"\ntick = "0.5s"', _Config(grace=Duration("60s"), tick=Interval("0.5s"))),
        (b"", _Config()),
    ],
)
def test_msgspec_reads_config_durations_from_strings(toml: bytes, want: _Config) -> None:
    assert msgspec.toml.decode(toml, type=_Config, dec_hook=units.dec_hook) == want


@pytest.mark.parametrize(
    ("toml", "want"),
    [
        (b'grace = "soon"', "invalid duration 'soon' (use e.g. 30s, 15m, 8h, 7d) - at `$.grace`"),
        (b"grace = 30", 'Expected a duration such as "30s", got `int` - at `$.grace`'),
        (b'tick = "0s"', "invalid interval: must be float >= 0.001, got 0.0 - at `$.tick`"),
    ],
)
def test_a_bad_config_duration_names_its_key(toml: bytes, want: str) -> None:
    with pytest.raises(msgspec.ValidationError) as err:
        msgspec.toml.decode(toml, type=_Config, dec_hook=units.dec_hook)
    assert str(err.value) == want


def test_raw_times_in_recorded_notes_read_as_the_cli_writes_times() -> None:
    """A squatter's preemption note of fairshare-8 and older (`t=%g`, kept byte for byte in the
    log) printed raw epoch seconds in `explain` and `report preemptions`."""
    from schemas.units import times_in, when

    assert times_in("low utilisation since t=1.76723e+09") == (
        f"low utilisation since about {when(1.76723e9)}"
    )
    assert times_in("room at t=1767225600 when the contracts end") == (
        "room at 2026-01-01 00:00:00Z when the contracts end"
    )
    assert times_in("unfunded") == "unfunded"


def test_a_jobs_end_in_explain_shows_a_notes_raw_times_as_times() -> None:
    """atk48-29 F1: a squatting preemption's note (`low utilisation since t=1.79646e+09`, the
    policy's, kept byte for byte for replay) was shown raw at the job's end in `explain` and the
    job page, where the preempted line already showed it as a time."""
    from ledger.reads.explain import finish_line
    from schemas import events as e

    ev = e.JobFinished(event_id="x", at=1_796_460_000.0, actor="@dispatcher", job_id=1,
                       outcome="failed", reason="preempted",
                       note="low utilisation since t=1.79646e+09")  # fmt: skip
    line = finish_line(ev)
    assert "t=1.79646e+09" not in line and "about 2026-12-05" in line, line


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"shares": null}', "`shares` must be int, got null"),
        (b'{"shares": "7"}', "`shares` must be int, got '7'"),
    ],
)
def test_a_wrong_type_is_told_by_its_value_once(body: bytes, said: str) -> None:
    """The value given, once: not msgspec's type name and then the value ("`shares` must be
    int, got `null`, got None": the what-if's empty box, atk48-29 F10)."""

    class Ask(msgspec.Struct):
        shares: int

    with pytest.raises(msgspec.ValidationError) as err:
        msgspec.json.decode(body, type=Ask)
    assert describe(err.value, msgspec.json.decode(body)) == said


def test_plural_separates_thousands() -> None:
    """Explain said "1802 jobs needing 6980 GPUs" beside a range of "3,034" (atk61-29c)."""
    assert units.plural(1802, "job") == "1,802 jobs"
    assert units.plural(1, "GPU") == "1 GPU" and units.plural(0, "GPU") == "0 GPUs"
