"""Durations and times: every one the project reads from people is parsed here, and every one it
prints is formatted here.

Pure: text in, numbers out, and back; no clock (`now` is never needed).

Reading:
- `parse_duration` whole seconds, 0 allowed: a grace, a lifetime ('90', '90s', '15m', '1.5h',
  '7d', '1w'); `parse_window` the same, positive and bounded (a usage window).
- `parse_job_time` a job's time as sbatch reads `-t/--time` (a time limit, a min runtime): a bare
  number is minutes, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`, and the ledger's
  own '90s', '2h', '1.5h', '7d'.
- `parse_interval` how often a loop runs: positive, a fraction allowed ('0.2s', '1.5m').
- `parse_time` an ISO-8601 time (UTC when no zone is given) or seconds since the epoch.
- `Duration` and `Interval`: the first two as config files and flags write them ("2s"), kept
  with their seconds; msgspec decodes them from strings with `dec_hook`.

Writing:
- `format_time` a moment as one ISO-8601 token (tables, log lines); `when` the same moment in a
  sentence.
- `format_duration` a duration exactly, in the largest unit that divides it ('2h', '90m'): what
  `parse_duration` reads back; `span` an elapsed time in two units ('1h05m'); `approx` in one
  rounded unit ('1.5h'), for report summaries.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from schemas.bounds import (
    TEN_YEARS_S,
    YEAR_3000,
    Epoch,
    PositiveInterval,
    PositiveSeconds,
    Seconds,
    check,
)
from schemas.errors import InvalidCommand

_WRITTEN = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _seconds(text: str) -> float | None:
    """The seconds `text` writes ('1.5h' -> 5400.0), or None when it writes no finite duration."""
    m = _WRITTEN.match(text.strip())
    if not m:
        return None
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    return seconds if math.isfinite(seconds) else None


# --- reading -------------------------------------------------------------------------------------


def parse_duration(text: str) -> int:
    """'90', '90s', '15m', '1.5h', '7d', '1w' -> whole seconds ('0.4' is refused, never 0)."""
    seconds = _seconds(text)
    if seconds is None:
        raise InvalidCommand(f"invalid duration {text!r}", hint="use e.g. 30s, 15m, 8h, 7d")
    if seconds != int(seconds):
        raise InvalidCommand(
            f"invalid duration {text!r}: {seconds:g} s is not a whole number of seconds",
            hint="durations are whole seconds, e.g. 1s, 90s, 2m",
        )
    return int(seconds)


_SLURM_TIME = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")
_SLURM_FORMS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or 90s, 2h, 7d"


def parse_job_time(text: str, option: str = "--time") -> int:
    """A job's time as Slurm's sbatch reads `-t/--time`, in whole seconds: a bare number is
    whole minutes ('90' is 90 minutes, as in Slurm), 'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM',
    'D-HH:MM:SS'; a number with a unit is the ledger's own duration ('90s', '15m', '1.5h', '7d',
    '1w'). Minutes and seconds after a colon are below 60 and hours after a day are below 24 (a
    typo is an error, not another length); bounded like every duration (ten years)."""
    written = text.strip()
    if _WRITTEN.match(written) and written[-1:].isalpha():
        seconds = parse_duration(written)
    else:
        seconds = _slurm_seconds(written, option, text)
    return int(check(seconds, Seconds, option))


def _slurm_seconds(written: str, option: str, text: str) -> int:
    m = _SLURM_TIME.match(written)
    bare = _WRITTEN.match(written)
    if m is None and bare is not None:  # '1.5': Slurm reads whole minutes only
        raise InvalidCommand(
            f"invalid {option} {text!r}: a bare number is whole minutes",
            hint=f"use {_SLURM_FORMS}",
        )
    if m is None:
        raise InvalidCommand(f"invalid {option} {text!r}", hint=f"use {_SLURM_FORMS}")
    days, parts = m["days"], [int(x) for x in (m["a"], m["b"], m["c"]) if x is not None]
    if days is None:  # minutes | MM:SS | HH:MM:SS
        scale = {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(parts)]
        limits = {1: (None,), 2: (None, 60), 3: (None, 60, 60)}[len(parts)]
    else:  # D-HH | D-HH:MM | D-HH:MM:SS
        scale = (3600, 60, 1)[: len(parts)]
        limits = (24, 60, 60)[: len(parts)]
    for value, limit in zip(parts, limits, strict=True):
        if limit is not None and value >= limit:
            raise InvalidCommand(
                f"invalid {option} {text!r}: {value} is out of range in that place",
                hint=f"use {_SLURM_FORMS}",
            )
    seconds = sum(v * s for v, s in zip(parts, scale, strict=True))
    return seconds + (int(days) * 86_400 if days is not None else 0)


def parse_window(text: str, option: str = "--window") -> int:
    """A positive duration (a usage window, a half-life): bounded like every other value (the
    bound told in days, the unit a window is written in)."""
    seconds = parse_duration(text)
    if seconds > TEN_YEARS_S:
        raise InvalidCommand(
            f"invalid {option} {text!r}: at most {TEN_YEARS_S // 86400}d (ten years)",
            hint="give a shorter window, or --since a moment",
        )
    return int(check(seconds, PositiveSeconds, option))


def parse_interval(text: str, option: str = "--interval") -> float:
    """A positive, finite number of seconds that may have a fraction ('0.2s', '1.5m'): how
    often a loop runs, not a contract."""
    seconds = _seconds(text)
    if seconds is None:
        raise InvalidCommand(f"invalid {option} {text!r}", hint="use e.g. 0.5s, 10s, 1m")
    return float(check(seconds, PositiveInterval, option))


def parse_time(text: str, option: str = "--at") -> float:
    """An ISO-8601 time (UTC when no zone is given) or seconds since the epoch; finite and
    inside the bounds of an event time."""
    try:
        at = float(text)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text)
        except ValueError as e:
            raise InvalidCommand(
                f"invalid time {shorten(text)}", hint="use ISO 8601, e.g. 2026-11-29T12:00"
            ) from e
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        at = dt.timestamp()
    # in the option's own words, not the type's ("must be float >= 0.0, got -3600.0",
    # atk61-29b); the value cut (a 10,000-character one was echoed whole)
    why = (
        "not a time" if not math.isfinite(at)
        else "before 1970-01-01T00:00:00Z, the earliest time the ledger keeps" if at < 0
        else "after 3000-01-01T00:00:00Z, the latest time the ledger keeps" if at > YEAR_3000
        else None
    )  # fmt: skip
    if why is not None:
        raise InvalidCommand(
            f"invalid {option} {shorten(text)}: {why}",
            hint="use ISO 8601, e.g. 2026-11-29T12:00, or seconds since 1970",
        )
    return float(check(at, Epoch, option))


def shorten(text: str, most: int = 60) -> str:
    """Pure: `text` quoted as an error names it, cut to `most` characters with its length said
    (an `-A` of 10,000 characters was echoed whole in one error line, atk61-29b)."""
    if len(text) <= most:
        return repr(text)
    return f"{text[:most]!r}... ({len(text):,} characters)"


class _Written:
    """A length of time as a config file or a flag writes it, kept with its seconds."""

    __slots__ = ("seconds", "text")
    seconds: float
    text: str

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Written)
            and type(other) is type(self)
            and other.seconds == self.seconds
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.seconds))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.text!r})"

    def __str__(self) -> str:
        return self.text


class Duration(_Written):
    """A duration as a config file or a flag writes it ("30s", "15m", "1h"), with its whole
    seconds (`parse_duration`). Two durations are equal when their seconds are ("60s" == "1m")."""

    __slots__ = ()
    seconds: int

    def __init__(self, text: str, option: str | None = None) -> None:
        del option  # a duration's error names its text, as `parse_duration` says it
        self.text = text
        self.seconds = parse_duration(text)


class Interval(_Written):
    """How often a loop runs, as a config file or a flag writes it ("0.2s", "2s"), with its
    seconds (`parse_interval`: positive, a fraction allowed); its error names `option`."""

    __slots__ = ()

    def __init__(self, text: str, option: str | None = None) -> None:
        self.text = text
        self.seconds = parse_interval(text, option or "interval")


def dec_hook(typ: type, obj: Any) -> Any:
    """msgspec's decoding hook for `Duration` and `Interval` (a config file's strings); an error
    becomes a ValidationError that names the key."""
    if typ in (Duration, Interval):
        if isinstance(obj, typ):
            return obj
        if not isinstance(obj, str):
            raise TypeError(f'Expected a duration such as "30s", got `{type(obj).__name__}`')
        try:
            return typ(obj)
        except InvalidCommand as err:
            raise ValueError(err.line()) from None
    raise NotImplementedError(typ)


# --- writing -------------------------------------------------------------------------------------


def format_time(at: float | None) -> str:
    """A moment as one ISO-8601 token in UTC ('2026-11-29T12:00:00Z'): sorts, greps and reads
    back through `parse_time`; '-' for none."""
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def when(at: float | None) -> str:
    """`format_time` in a sentence ('2026-11-29 12:00:00Z')."""
    return format_time(at).replace("T", " ")


_RAW_TIME = re.compile(r"\bt=(\d+(?:\.\d+)?(?:e\+?\d+)?)")


def times_in(text: str) -> str:
    """A recorded note or reason with its raw `t=<epoch seconds>` times as `when` times: the
    notes of older policy versions (`low utilisation since t=1.76722e+09`) are kept byte for
    byte in the log (replay compares them) and shown as the CLI shows times. A time written
    with six digits (`%g`) is up to an hour off, and says `about`."""

    def one(m: re.Match[str]) -> str:
        raw = m.group(1)
        return ("about " if "e" in raw else "") + when(float(raw))

    return _RAW_TIME.sub(one, text)


def key_text(key: Sequence[float | int | str]) -> str:
    """A dispatcher's sort key with its times as `when` times and no scientific notation
    (`queue`, `explain`; the pages show those times in the viewer's zone)."""
    parts = []
    for x in key:
        if isinstance(x, float) and x > 1e8:
            parts.append(when(x))
        elif isinstance(x, float):
            parts.append(f"{x:g}" if abs(x) < 1e6 else f"{x:.0f}")
        else:
            parts.append(str(x))
    return "(" + ", ".join(parts) + ")"


def format_duration(seconds: float | None) -> str:
    """A whole duration exactly, in the largest unit that divides it ('2h', '90m', '45s'):
    `parse_duration` reads it back. '-' for none."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s % 3600 == 0 and s:
        return f"{s // 3600}h"
    if s % 60 == 0 and s:
        return f"{s // 60}m"
    return f"{s}s"


def span(seconds: float) -> str:
    """An elapsed time or a wait in two units, cut to whole seconds ('3d4h', '1h05m', '2m09s',
    '7s'); a negative one is 0s."""
    s = int(max(0.0, seconds))
    if s >= 86400:
        return f"{s // 86400}d{(s % 86400) // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def limit_words(seconds: float) -> str:
    """A time limit in words, exact: '2m', '55s', '8m30s (510s)', '1d23h (172710s)'."""
    exact = format_duration(seconds)
    return exact if seconds < 60 or not exact.endswith("s") else f"{span(seconds)} ({exact})"


def approx(seconds: float | None) -> str:
    """A duration in one rounded unit ('45s', '15m', '1.5h', '2.0d'), for summaries that compare
    many of them; '-' for none."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 2 * 86_400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86_400:.1f}d"


def plural(n: int, word: str) -> str:
    """`1 GPU`, `2 GPUs`, `0 jobs`, `1,802 jobs` (thousands separated, as the ranges print
    counts: explain's "1802 jobs needing 6980 GPUs", atk61-29c)."""
    return f"{n} {word}" if n == 1 else f"{n:,} {word}s"
