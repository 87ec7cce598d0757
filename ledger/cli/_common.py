"""What every command shares: the data directory, the actor, where commands and reads go (a
server or the ledger itself), the projection caught up. What they print: `ledger.cli.output`."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import msgspec

from ledger.cli.output import echo_json, json_option
from ledger.store import has_log
from ledger.wire import SOCKET_NAME
from schemas.bounds import check, describe
from schemas.commands import AnyCommand, InitLedger
from schemas.errors import EnvironmentProblem, InvalidCommand, LedgerError

if TYPE_CHECKING:  # the store is imported only by commands that open it (client mode never)
    from ledger.cycle.dispatcher import LiveState
    from ledger.store.appended import Appended
    from ledger.store.application import Ledger
    from ledger.store.live import LiveView
    from ledger.store.locate import LogSource
    from projections.store import Store


T = TypeVar("T")

bounded = check
"""`value` inside the bounds of a `schemas.bounds` type, else one InvalidCommand line."""


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
        self._source: LogSource | None = None
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
    def own_actor(self) -> str:
        """Who acts in this process itself (`serve`: the admin starting it, who registers the
        Slurm partition's nodes), whatever server a client of this host would reach: --as (or
        $GPULEDGER_USER), else the OS user. `actor` was "" for a `serve` with $GPULEDGER_URL
        exported (as docs/ha.md has clients do on every host) and every take of the lease
        failed, "no actor given", handed back about twice a second (atk46-ha F5)."""
        return self.actor if self._actor else os_user()

    @property
    def remote(self) -> Any:
        """The server's client, or None in embedded mode."""
        if self._client is None:
            if not self._url and not (self.home / SOCKET_NAME).exists():
                self._client = False  # embedded: the HTTP client is never imported
                return None
            from ledger.wire.client import Client, load_token, local_socket

            if self._url:
                self._client = Client(self._url, load_token())
            else:
                sock = local_socket(self.home)
                self._client = Client(f"unix:{sock}") if sock is not None else False
        return self._client or None

    def execute(self, cmd: AnyCommand, key: str | None = None) -> Appended:
        """Append one command, here or at the server; under the idempotency `key` when given
        (a command sent again with it is answered with what its first send appended)."""
        if self.remote is not None:
            result: Appended = self.remote.execute(cmd, key)
            return result
        if key is None:
            return self.ledger(live=True).execute(self._embedded(cmd))
        (done,) = self.ledger(live=True).execute_each([self._embedded(cmd)], [key])
        if isinstance(done, LedgerError):
            raise done
        return done

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

    def viewer(self, state: Any) -> str:
        """Embedded mode: who reads: the actor, as at a server; `--as` someone else is an
        admin's alone (as for commands), anyone else reads as the OS user."""
        me = os_user()
        actor = self.actor
        return actor if actor == me or state.is_admin(me) else me

    def _embedded(self, cmd: AnyCommand) -> AnyCommand:
        """Embedded mode: the OS user is the real actor; acting as someone else is `--as`, which
        the domain allows admins only (and records)."""
        me = os_user()
        if isinstance(cmd, InitLedger) or cmd.actor == me:
            return cmd
        return msgspec.structs.replace(cmd, real_actor=me)

    def require(self) -> None:
        """A clear error when the data directory holds no ledger (without opening it)."""
        if self.remote is None and self._ledger is None and not has_log(self.home):
            raise InvalidCommand(
                f"no ledger in {self.home}", hint="run `gpuledger init --admin USER` or pass --home"
            )

    def local_only(self) -> None:
        """Commands that read the data directory itself (the store, the projection file) are
        refused beside a running server, before they open anything: the server owns it."""
        if self._url and self.remote is not None:  # sent away by the setting, not by a server
            raise EnvironmentProblem(  # here ("a server owns it" of a new home: atk49 F6)
                f"this command works on the data directory {self.home}, and GPULEDGER_URL (or "
                "--url) sends commands to a server",
                hint="run it without GPULEDGER_URL and --url (`env -u GPULEDGER_URL gpuledger "
                "...`), on the server's host with the server stopped for a server's directory",
            )
        if self.remote is not None:  # not the command's fault: where it runs (`environment`)
            raise EnvironmentProblem(
                "this command needs the data directory, and a server owns it",
                hint="run it on the server's host with the server stopped, or use the API",
            )

    def ledger(self, *, must_exist: bool = True, live: bool = False) -> Ledger:
        """The ledger; `live=True` for commands that need only live work (writes, the queue, the
        service): it starts from the newest snapshot plus the tail and keeps no finished jobs."""
        self.local_only()
        if self._ledger is None or (self._ledger.state.live_only and not live):
            if must_exist and not has_log(self.home):
                raise InvalidCommand(
                    f"no ledger in {self.home}",
                    hint="run `gpuledger init --admin USER` or pass --home",
                )
            from ledger.store.application import Ledger
            from ledger.store.creating import NewLedger  # `init`: a new store's tables

            self._ledger = (Ledger if must_exist else NewLedger)(self.home, live=live)
        return self._ledger

    def close(self) -> None:
        """At the command's end: the read-only view's connection (a PostgreSQL store's is a
        server session)."""
        if self._view is not None:
            self._view.close()
            self._view = None
        if self._source is not None:
            self._source.close()
            self._source = None

    def source(self) -> LogSource:
        """The log, read-only, opened once per command and shared by the read's live view and
        its projection (a PostgreSQL store's is a server session: one per command, not two);
        closed by `close`."""
        if self._source is None:
            from ledger.store.locate import open_source

            self._source = open_source(self.home, light=True)
        return self._source

    def reader(self) -> LiveState:
        """The live state for a read of the read layer, which asks a ledger for its `state` and
        `catch_up()` only: a read-only `LiveView` when one can start (no eventsourcing loaded,
        nothing written), else the live ledger (which stores the snapshot a long tail calls
        for)."""
        self.local_only()
        if self._ledger is None and self._view is None:
            self.require()
            from ledger.store.live import LiveView

            self._view = LiveView.open(self.home, source=self.source())
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
            self._store = self._stack.enter_context(projection(self.ctx, quiet=self.quiet))
            # one engine thread: a read's statements are small, and a second thread costs more
            # CPU than it saves time (the audit's and what-if's long queries keep both)
            self._store.con.execute("SET threads = 1")
        return self._store

    def now(self) -> float:
        from ledger.store.clock import SystemClock

        return SystemClock().now()

    def foreign(self) -> dict[str, frozenset[int]]:
        return {}  # no service observes an engine in an embedded read

    def stopping(self) -> dict[str, frozenset[int]]:
        return {}

    def heard_from(self) -> dict[str, float]:
        return {}  # no service hears from nodes in an embedded read

    def longest_s(self) -> float | None:
        return None  # no service observes an engine in an embedded read

    @property
    def viewer(self) -> str:
        return self.ctx.viewer(self.ledger.state)


@contextmanager
def projection(ctx: Ctx, *, quiet: bool = False) -> Iterator[Store]:
    """The projection caught up with the log. When a running service holds the file (DuckDB
    allows one writer), read a private in-memory copy built from the log instead."""
    ctx.require()
    with _caught_up(ctx, ctx.source(), quiet) as store:
        status = store.status()
        if status.unknown_events and not quiet:
            tags = ", ".join(f"{t} ({n})" for t, n in sorted(status.unknown_tags.items()))
            click.echo(
                f"note: {status.unknown_events} events of types this version does not know were "
                f"kept and ignored: {tags}; upgrade gpu-ledger to use them",
                err=True,
            )
        yield store


def _caught_up(ctx: Ctx, source: LogSource, quiet: bool) -> Store:
    """The projection file opened read-only when it is caught up with the log, read as it is;
    else opened read-write and caught up first."""
    from projections.errors import ProjectionBusy, ProjectionOutdated
    from projections.store import Store, projection_path

    try:
        if projection_path(ctx.home).exists():
            with suppress(ProjectionOutdated):  # made again below, read-write
                store = Store.open(ctx.home, read_only=True)
                if store.position() == source.head():
                    return store
                store.close()
        store = Store.open(ctx.home)
    except ProjectionBusy:
        if not quiet:
            click.echo("note: the service holds the projection; reading a private copy", err=True)
        store = Store(":memory:")
    try:
        if store.position() != source.head():
            from projections.projector import Projector  # (and DuckDB's Python API with it)

            Projector(store, source).catch_up()
    except BaseException:
        store.close()
        raise
    return store


pass_ctx = click.make_pass_decorator(Ctx)


def view_command(
    command: Callable[[Callable[..., None]], click.Command],
    view: str,
    *options: Callable[[Any], Any],
    fields: Callable[..., dict[str, Any]] = dict,
    note: Callable[[Ctx, Any, dict[str, Any]], str | None] | None = None,
) -> Callable[[Callable[[Any], None]], click.Command]:
    """A read command: `command` (`click.command(NAME)` or a group's `.command(NAME)`) with
    `options` and `--json` reads `view` with the `fields` its options give, and prints the
    result as JSON or as the decorated function shows it (its docstring is the help). `note`
    (given the result and the fields) may add a line: under the table, or on stderr beside
    the JSON, which stays what it was."""

    def make(show: Callable[[Any], None]) -> click.Command:
        def read(ctx: Ctx, /, as_json: bool, **given: Any) -> None:
            asked = fields(**given)
            rows = ctx.read(view, **asked)
            if as_json:
                echo_json(rows)
            else:
                show(rows)
            line = note(ctx, rows, asked) if note is not None else None
            if line:
                click.echo(line, err=as_json)

        read.__name__, read.__doc__ = show.__name__, show.__doc__
        f = json_option(pass_ctx(read))
        for option in reversed(options):
            f = option(f)
        return command(f)

    return make


def default_home() -> Path:
    return Path(os.environ.get("GPULEDGER_HOME", ".gpuledger"))
