"""What every command shares: the data directory, the actor, JSON output, one-line errors."""

from __future__ import annotations

import errno
import logging
import os
import re
import sqlite3
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import msgspec

from schemas.bounds import Epoch, PositiveInterval, PositiveSeconds, check, describe
from schemas.commands import AnyCommand, InitLedger
from schemas.errors import EnvironmentProblem, InvalidCommand, LedgerError

if TYPE_CHECKING:  # the store is imported only by commands that open it (client mode never)
    from rich.console import Console

    from ledger.cycle.dispatcher import LiveState
    from ledger.store.application import Appended, Ledger
    from ledger.store.live import LiveView

EVENTS_DB = "events.sqlite"
SERVER_SOCKET = "gpuledger.sock"
"""Where a server running on the data directory listens (`ledger.wire.client.local_socket`)."""

T = TypeVar("T")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> int:
    """'90', '90s', '15m', '1.5h', '7d', '1w' -> whole seconds ('0.4' is refused, never 0)."""
    m = _DURATION.match(text.strip())
    if not m:
        raise InvalidCommand(f"invalid duration {text!r}", hint="use e.g. 30s, 15m, 8h, 7d")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds != int(seconds):
        raise InvalidCommand(
            f"invalid duration {text!r}: {seconds:g} s is not a whole number of seconds",
            hint="durations are whole seconds; 0 means none (an unfunded contract)",
        )
    return int(seconds)


def parse_interval(text: str, option: str = "--interval") -> float:
    """A positive, finite number of seconds that may have a fraction ('0.2s', '1.5m'): how
    often a loop runs, not a contract."""
    m = _DURATION.match(text.strip())
    if not m:
        raise InvalidCommand(f"invalid {option} {text!r}", hint="use e.g. 0.5s, 10s, 1m")
    return float(bounded(float(m.group(1)) * _UNITS[m.group(2)], PositiveInterval, option))


def parse_window(text: str, option: str = "--window") -> int:
    """A positive duration (a usage window, a half-life): bounded like every other value."""
    return int(bounded(parse_duration(text), PositiveSeconds, option))


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
                f"invalid time {text!r}", hint="use ISO 8601, e.g. 2026-11-29T12:00"
            ) from e
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        at = dt.timestamp()
    return float(bounded(at, Epoch, option))


bounded = check
"""`value` inside the bounds of a `schemas.bounds` type, else one InvalidCommand line."""


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
        raise InvalidCommand(f"invalid {_field_name(str(e))}: {describe(e, fields)}") from e


def _field_name(message: str) -> str:
    m = re.search(r"at `\$\.([A-Za-z_]+)", message)
    if m is None:
        return "input"
    name = m.group(1).removesuffix("_s")  # options leave the unit out: window_s is --window
    return f"--{name.replace('_', '-')}"


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
        self._view: LiveView | None = None
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
            if not self._url and not (self.home / SERVER_SOCKET).exists():
                self._client = False  # embedded: the HTTP client is never imported
                return None
            from ledger.wire.client import Client, load_token, local_socket

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
        return self.ledger(live=True).execute(self._embedded(cmd))

    def execute_all(self, cmds: list[AnyCommand]) -> Appended:
        if self.remote is not None:
            result: Appended = self.remote.execute_all(cmds)
            return result
        return self.ledger(live=True).execute_all([self._embedded(cmd) for cmd in cmds])

    def read(self, name: str, *, quiet: bool = True, **fields: Any) -> Any:
        """A read of the read layer (`ledger.reads.table`), here or at the server; the same
        view Structs either way."""
        from ledger.reads.table import READS

        spec = READS[name]
        given = {k: x for k, x in fields.items() if x is not None}
        args = build(spec.args, **given)
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

    def require(self) -> None:
        """A clear error when the data directory holds no ledger (without opening it)."""
        if self.remote is None and self._ledger is None and not (self.home / EVENTS_DB).exists():
            raise InvalidCommand(
                f"no ledger in {self.home}", hint="run `gpuledger init --admin USER` or pass --home"
            )

    def local_only(self) -> None:
        """Commands that read the data directory itself (the store, the projection file) are
        refused beside a running server, before they open anything: the server owns it."""
        if self.remote is not None:
            raise InvalidCommand(
                "this command needs the data directory, and a server owns it",
                hint="run it on the server's host with the server stopped, or use the API",
            )

    def ledger(self, *, must_exist: bool = True, live: bool = False) -> Ledger:
        """The ledger; `live=True` for commands that need only live work (writes, the queue, the
        service): it starts from the newest snapshot plus the tail and keeps no finished jobs."""
        self.local_only()
        if self._ledger is None or (self._ledger.state.live_only and not live):
            if must_exist and not (self.home / EVENTS_DB).exists():
                raise InvalidCommand(
                    f"no ledger in {self.home}",
                    hint="run `gpuledger init --admin USER` or pass --home",
                )
            from ledger.store.application import Ledger

            self._ledger = Ledger(self.home, live=live)
        return self._ledger

    def reader(self) -> LiveState:
        """The live state for a read of the read layer, which asks a ledger for its `state` and
        `catch_up()` only: a read-only `LiveView` when one can start (no eventsourcing loaded,
        nothing written), else the live ledger (which stores the snapshot a long tail calls
        for)."""
        self.local_only()
        if self._ledger is None and self._view is None:
            self.require()
            from ledger.store.live import LiveView

            self._view = LiveView.open(self.home)
        if self._ledger is None and self._view is not None:
            return self._view
        return self.ledger(live=True)


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
    def ledger(self) -> LiveState:
        # live work only: the newest snapshot plus the tail, never the whole history (reads of
        # finished jobs come from the projection)
        return self.ctx.reader()

    def store(self) -> Any:
        if self._store is None:
            from ledger.cli.views import projection

            self._store = self._stack.enter_context(projection(self.ctx, quiet=self.quiet))
            # one engine thread: a read's statements are small, and a second thread costs more
            # CPU than it saves time (the audit's and what-if's long queries keep both)
            self._store.con.execute("SET threads = 1")
        return self._store

    def now(self) -> float:
        from ledger.store.clock import SystemClock

        return SystemClock().now()

    @property
    def viewer(self) -> str:
        """Who reads: the actor, as at a server; `--as` someone else is an admin's alone (as for
        commands), anyone else reads as the OS user."""
        me = os_user()
        actor = self.ctx.actor
        return actor if actor == me or self.ledger.state.is_admin(me) else me


pass_ctx = click.make_pass_decorator(Ctx)

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def echo_json(data: Any) -> None:
    """Strict JSON (keys sorted, two-space indent): a non-finite float is written as `null`,
    never `Infinity` or `NaN`; views that can hold one say so with a flag."""
    text = msgspec.json.format(msgspec.json.encode(data, order="sorted"), indent=2)
    click.echo(text.decode())


PIPE_WIDTH = 200
"""A pipe gets full-width lines of at least this many columns, not a table squeezed to 80."""


def console() -> Console:
    """rich's console for this output: the terminal's width, or `PIPE_WIDTH` for a pipe."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table without borders, as rich prints one (`box=None`). On a pipe, a table of plain
    ASCII cells is written directly, one line per row: byte for byte what rich would print when
    it fits `PIPE_WIDTH` columns, and wider lines where rich would wrap cells onto several (a
    script or `grep` gets whole rows), at ~10x less cost (rich lays out every cell: ~0.1-0.2 s
    for 50-200 rows, and ~40 ms to import). A terminal, and cells that are not plain ASCII, go
    through rich."""
    cells = (c for row in (header, *rows) for c in row)
    if not sys.stdout.isatty() and all(c.isascii() and c.isprintable() for c in cells):
        widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
        lines = (
            " " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " "
            for row in (header, *rows)
        )
        click.echo("\n".join(lines))
        return
    from rich.table import Table

    t = Table(*header, box=None)
    for row in rows:
        t.add_row(*row)
    console().print(t)


EXIT_REJECTED = 1
"""A rejected command, bad usage or an environment problem."""
EXIT_BUG = 70
"""A genuine bug (sysexits' EX_SOFTWARE): the only failure that is not the caller's to fix."""


def fail(message: str, code: str, exit_code: int = EXIT_REJECTED) -> None:
    """The error contract: one line on stderr, `error: <message> [<code>]`, and the exit code.
    `code` is a stable word (a LedgerError's `code`, `usage`, `environment`, `internal`)."""
    first = " ".join(message.split())
    try:
        click.echo(f"error: {first} [{code}]", err=True)
    finally:
        sys.exit(exit_code)


def _environment(e: BaseException, home: Path | None) -> str | None:
    """The words for an environment problem (a file, a directory, a database, a broker), or
    None when `e` is not one."""
    if isinstance(e, sqlite3.DatabaseError):
        where = f" {home / EVENTS_DB}" if home is not None else ""
        return f"the event store{where} is unreadable ({e}): restore it from a copy"
    if isinstance(e, OSError):
        where = f": {e.filename}" if e.filename else ""
        return f"{e.strerror or e}{where}"
    if type(e).__module__.startswith("duckdb") and type(e).__name__ in (
        "IOException",
        "PermissionException",
        "SerializationException",
    ):
        return f"the projection file is unusable ({str(e).splitlines()[0]})"
    return None


class LedgerGroup(click.Group):
    """The error contract at the boundary: every failure is one line on stderr with a stable
    code. Exit 1 for a rejected command, bad usage (click's included) and an environment
    problem (named with its path or address); 70 only for a bug. Output piped into a reader
    that stops early (`| head`) ends quietly."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        base: Any = super().main
        if not standalone_mode:
            return base(*args, standalone_mode=False, **kwargs)
        try:
            rv = base(*args, standalone_mode=False, **kwargs)
        except click.ClickException as e:
            name = e.ctx.command_path if isinstance(e, click.UsageError) and e.ctx else ""
            hint = f" (see `{name} --help`)" if name else ""
            fail(e.format_message() + hint, "usage")
        except click.Abort:
            fail("aborted", "usage")
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _quiet_pipe()
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LedgerError as e:
            fail(e.line(), e.code)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except BrokenPipeError:
            _quiet_pipe()
        except Exception as e:  # an environment problem, or a bug
            if isinstance(e, OSError) and e.errno == errno.EPIPE:
                _quiet_pipe()
            where = _environment(e, ctx.obj.home if isinstance(ctx.obj, Ctx) else None)
            if where is not None and not os.environ.get("GPULEDGER_DEBUG"):
                fail(where, EnvironmentProblem.code)
            if os.environ.get("GPULEDGER_DEBUG"):
                raise
            fail(
                f"internal error: {type(e).__name__}: {e} "
                "(rerun with GPULEDGER_DEBUG=1 for the traceback, and report it)",
                "internal",
                EXIT_BUG,
            )


def _quiet_pipe() -> None:
    """The reader went away (`gpuledger log | head`): stop writing, say nothing, exit 0."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    sys.exit(0)


LOG_LEVELS = ("debug", "info", "warning", "error")

log_level_option = click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="gpu-ledger's own log level; libraries (Kafka client, ...) log only at debug.",
)


def setup_logging(level: str) -> None:
    """Log gpu-ledger's own records at `level`; records of libraries only at debug (a broker
    that cannot be reached is one error line, not pages of client retries)."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(message)s")
    if level.lower() == "debug":
        return
    for handler in logging.root.handlers:
        handler.addFilter(lambda r: r.name.startswith("gpuledger"))


def default_home() -> Path:
    return Path(os.environ.get("GPULEDGER_HOME", ".gpuledger"))
