"""What every command shares: the data directory, the actor, JSON output, one-line errors."""

from __future__ import annotations

import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from ledger.application import EVENTS_DB, Ledger
from schemas.errors import InvalidCommand, LedgerError

T = TypeVar("T")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> int:
    """'90', '90s', '15m', '8h', '7d', '1w' -> seconds."""
    m = _DURATION.match(text.strip())
    if not m:
        raise InvalidCommand(f"invalid duration {text!r}", hint="use e.g. 30s, 15m, 8h, 7d")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_time(text: str) -> float:
    """An ISO-8601 time (UTC when no zone is given) or seconds since the epoch."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as e:
        raise InvalidCommand(
            f"invalid time {text!r}", hint="use ISO 8601, e.g. 2026-11-29T12:00"
        ) from e
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def fmt_time(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s % 3600 == 0 and s:
        return f"{s // 3600}h"
    if s % 60 == 0 and s:
        return f"{s // 60}m"
    return f"{s}s"


def build(cls: type[T], /, **fields: Any) -> T:
    """A command or filter made through its msgspec type, so every bound the type declares is
    checked here exactly as the HTTP API and the TOML loader check it; a violation is one
    `InvalidCommand` line naming the field."""
    try:
        return msgspec.convert(fields, cls)
    except msgspec.ValidationError as e:
        raise InvalidCommand(f"invalid {_field_name(str(e))}: {e}") from e


def _field_name(message: str) -> str:
    m = re.search(r"at `\$\.([A-Za-z_]+)", message)
    return f"--{m.group(1).replace('_', '-')}" if m else "input"


class Ctx:
    """Lazily opens the ledger so read-only commands that do not need it stay cheap."""

    def __init__(self, home: Path, actor: str | None) -> None:
        self.home = home
        self._actor = actor
        self._ledger: Ledger | None = None

    @property
    def actor(self) -> str:
        if not self._actor:
            raise InvalidCommand("no actor given", hint="pass --as USER or set GPULEDGER_USER")
        if self._actor.startswith("@"):
            raise InvalidCommand(
                f"{self._actor!r} is a system actor", hint="people act under their own names"
            )
        return self._actor

    def ledger(self, *, must_exist: bool = True) -> Ledger:
        if self._ledger is None:
            if must_exist and not (self.home / EVENTS_DB).exists():
                raise InvalidCommand(
                    f"no ledger in {self.home}",
                    hint="run `gpuledger init --admin USER` or pass --home",
                )
            self._ledger = Ledger(self.home)
        return self._ledger


pass_ctx = click.make_pass_decorator(Ctx)

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def echo_json(data: Any) -> None:
    """Strict JSON (keys sorted, two-space indent): a non-finite float is written as `null`,
    never `Infinity` or `NaN`; views that can hold one say so with a flag."""
    text = msgspec.json.format(msgspec.json.encode(data, order="sorted"), indent=2)
    click.echo(text.decode())


class LedgerGroup(click.Group):
    """At the boundary every LedgerError becomes one line and exit code 1, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LedgerError as e:
            click.echo(f"error: {e.line()}", err=True)
            sys.exit(1)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except Exception as e:  # a bug: still one line, the traceback on request
            if os.environ.get("GPULEDGER_DEBUG"):
                raise
            click.echo(
                f"error: internal error: {type(e).__name__}: {e} "
                "(rerun with GPULEDGER_DEBUG=1 for the traceback, and report it)",
                err=True,
            )
            sys.exit(70)


def default_home() -> Path:
    return Path(os.environ.get("GPULEDGER_HOME", ".gpuledger"))
