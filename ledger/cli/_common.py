"""What every command shares: the data directory, the actor, JSON output, one-line errors."""

from __future__ import annotations

import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import msgspec

from schemas.commands import AnyCommand, InitLedger
from schemas.errors import InvalidCommand, LedgerError

if TYPE_CHECKING:  # the store is imported only by commands that open it (client mode never)
    from ledger.application import Appended, Ledger

EVENTS_DB = "events.sqlite"

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


def os_user() -> str:
    """The name of the OS user running this process (the actor when nobody says --as)."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


class Ctx:
    """Where commands go: a server (client mode: `--url`/$GPULEDGER_URL, or the Unix socket of a
    server running on the data directory) or the ledger itself (embedded mode). Opened lazily so
    commands that need neither stay cheap."""

    def __init__(self, home: Path, actor: str | None, url: str | None = None) -> None:
        self.home = home
        self._actor = actor
        self._url = url
        self._ledger: Ledger | None = None
        self._client: Any = None

    @property
    def actor(self) -> str:
        """Who acts: --as (or $GPULEDGER_USER) when given, else the caller: the OS user here, the
        authenticated identity at a server ("" tells the server to fill it in)."""
        if self._actor and self._actor.startswith("@"):
            raise InvalidCommand(
                f"{self._actor!r} is a system actor", hint="people act under their own names"
            )
        if self._actor:
            return self._actor
        return "" if self.remote is not None else os_user()

    @property
    def remote(self) -> Any:
        """The server's client, or None in embedded mode."""
        if self._client is None:
            from ledger.server.client import Client, load_token, local_socket

            if self._url:
                self._client = Client(self._url, load_token())
            else:
                sock = local_socket(self.home)
                self._client = Client(f"unix:{sock}") if sock is not None else False
        return self._client or None

    def execute(self, cmd: AnyCommand) -> Appended:
        """Append one command, here or at the server."""
        if self.remote is not None:
            result: Appended = self.remote.execute(cmd)
            return result
        return self.ledger().execute(self._embedded(cmd))

    def execute_all(self, cmds: list[AnyCommand]) -> Appended:
        if self.remote is not None:
            result: Appended = self.remote.execute_all(cmds)
            return result
        return self.ledger().execute_all([self._embedded(cmd) for cmd in cmds])

    def read(self, name: str, *, quiet: bool = True, **fields: Any) -> Any:
        """A read of the read layer (`ledger.server.reads`), here or at the server; the same
        view Structs either way."""
        from ledger.server.reads import READS

        spec = READS[name]
        given = {k: x for k, x in fields.items() if x is not None}
        try:
            args = msgspec.convert(given, spec.args)
        except msgspec.ValidationError as e:
            raise InvalidCommand(f"invalid {_field_name(str(e))}: {e}") from e
        if self.remote is not None:
            query = {k: x for k, x in msgspec.to_builtins(args).items() if k in given}
            return self.remote.get(spec.path, query, type=spec.returns)
        with _LocalHandles(self, quiet) as handles:
            return spec.run(handles, args)

    def _embedded(self, cmd: AnyCommand) -> AnyCommand:
        """Embedded mode: the OS user is the real actor; acting as someone else is `--as`, which
        the domain allows admins only (and records)."""
        me = os_user()
        if isinstance(cmd, InitLedger) or cmd.actor == me:
            return cmd
        return msgspec.structs.replace(cmd, real_actor=me)

    def ledger(self, *, must_exist: bool = True) -> Ledger:
        if self.remote is not None:
            raise InvalidCommand(
                "this command needs the data directory, and a server owns it",
                hint="run it on the server's host with the server stopped, or use the API",
            )
        if self._ledger is None:
            if must_exist and not (self.home / EVENTS_DB).exists():
                raise InvalidCommand(
                    f"no ledger in {self.home}",
                    hint="run `gpuledger init --admin USER` or pass --home",
                )
            from ledger.application import Ledger

            self._ledger = Ledger(self.home)
        return self._ledger


class _LocalHandles:
    """The read layer's handles in embedded mode: the ledger, the projection opened (and caught
    up) only when a read asks for it, the wall clock."""

    def __init__(self, ctx: Ctx, quiet: bool) -> None:
        import contextlib

        self.ctx = ctx
        self.quiet = quiet
        self._stack = contextlib.ExitStack()
        self._store: Any = None

    def __enter__(self) -> _LocalHandles:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def ledger(self) -> Ledger:
        return self.ctx.ledger()

    def store(self) -> Any:
        if self._store is None:
            from ledger.cli.views import projection

            self._store = self._stack.enter_context(projection(self.ctx, quiet=self.quiet))
        return self._store

    def now(self) -> float:
        from ledger.clock import SystemClock

        return SystemClock().now()


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
