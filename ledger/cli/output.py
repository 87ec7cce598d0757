"""Everything the command line writes: JSON, tables, rich's console, the one-line errors and the
log lines of the commands that run for a while (`serve`, `up`, `agent`, `project follow`).

Light on purpose: rich is imported only when a table goes to a terminal (or does not fit a pipe
as plain text), so `--json` through a server never loads it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click
import msgspec

from schemas.errors import EnvironmentProblem, InvalidCommand, LedgerError
from schemas.units import shorten

if TYPE_CHECKING:
    from rich.console import Console

# --- JSON ----------------------------------------------------------------------------------------

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def echo_json(data: Any) -> None:
    """Strict JSON (keys sorted, two-space indent): a non-finite float is written as `null`,
    never `Infinity` or `NaN`; views that can hold one say so with a flag."""
    text = msgspec.json.format(msgspec.json.encode(data, order="sorted"), indent=2)
    click.echo(text.decode())


# --- tables and the console ----------------------------------------------------------------------

PIPE_WIDTH = 200
"""A pipe gets full-width lines of at least this many columns, not a table squeezed to 80."""


def console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """rich's console for this output (stdout, stderr or `file`): the terminal's width, or
    `PIPE_WIDTH` for anything else; no highlighting of numbers."""
    from rich.console import Console

    out = file or (sys.stderr if stderr else sys.stdout)
    width = None if out.isatty() else PIPE_WIDTH
    if file is not None:
        return Console(highlight=False, width=width, file=file)
    return Console(highlight=False, width=width, stderr=stderr)


def fold_fields(parts: Sequence[str], width: int) -> str:
    """Pure: `parts` (a summary's fields) on one line, or on a terminal `width` wide (0: not
    one) on as many as they need, broken between fields only, the later lines indented: the
    `report preemptions` summary (120 characters) wrapped mid-field at 80 and 100 columns."""
    lines = [parts[0]] if parts else []
    for part in parts[1:]:
        if width and len(lines[-1]) + 1 + len(part) > width:
            lines.append("  " + part)
        else:
            lines[-1] += " " + part
    return "\n".join(lines)


def print_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    file: IO[str] | None = None,
    whole: Sequence[int] = (),
    records: bool = False,
    free: Sequence[int] = (),
) -> None:
    """A table without borders, as rich prints one (`box=None`), on stdout or `file`. Anywhere
    but a terminal, a table of plain ASCII cells is written directly, one line per row: byte for
    byte what rich would print when it fits `PIPE_WIDTH` columns, and wider lines where rich
    would wrap cells onto several (a script or `grep` gets whole rows), at ~10x less cost (rich
    lays out every cell: ~0.1-0.2 s for 50-200 rows, and ~40 ms to import). A terminal, a title
    and cells that are not plain ASCII go through rich. `whole`: the columns a narrow terminal
    never cuts (the names that tell rows apart); the others wrap (and fold) to make room.
    `records`: a table wider than the terminal is printed one row at a time, a line per column
    (psql's expanded display, `\\x auto`): a row of a dozen figures squeezed into 80 columns
    cut every one to "100.…" (`simulate run`, atk47-29 F6). `free`: the free-text columns
    (a rule, a path): on a terminal too narrow for the table, each row's free text goes on lines
    of its own below it, wrapped, and every other column stays whole (their headers wrap at
    spaces); too narrow even for those, a record a row (`report preemptions` at 100 columns cut
    "prog1/t…" and "2026-01-…" and wrapped the rule over 6 lines, atk61-29b F5)."""
    out = file or sys.stdout
    width = console(file=file).width if out.isatty() else 0
    if (records or free) and out.isatty() and _wider_than(width, header, rows):
        below = _free_below(width, header, rows, free) if free else None
        if below is None:
            _print_records(header, rows, file)
        else:
            click.echo("\n".join(below), file=file)
        return
    cells = (c for row in (header, *rows) for c in row)
    if title is None and not out.isatty() and all(c.isascii() and c.isprintable() for c in cells):
        widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
        lines = (
            " " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " "
            for row in (header, *rows)
        )
        click.echo("\n".join(lines), file=file)
        return
    from rich.table import Table

    t = Table(box=None, title=title)
    for i, h in enumerate(header):
        if i in whole:
            longest = max(len(str(c)) for c in (h, *(row[i] for row in rows)))
            t.add_column(h, no_wrap=True, min_width=longest)
        else:  # folded, never cut with an ellipsis: no figure loses a digit
            t.add_column(h, overflow="fold" if whole else "ellipsis")
    for row in rows:
        t.add_row(*row)
    console(file=file).print(t)


def _wider_than(width: int, header: Sequence[str], rows: Sequence[Sequence[str]]) -> bool:
    """Pure: whether the table's natural layout (each column as wide as its widest cell, two
    spaces between) passes `width` columns."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    return sum(widths) + 2 * len(widths) > width


NBSP = "\u00a0"


def _free_below(
    width: int, header: Sequence[str], rows: Sequence[Sequence[str]], free: Sequence[int]
) -> list[str] | None:
    """Pure: the table's lines with the `free` columns moved below each row (`name: text; ...`,
    wrapped to `width`, indented), the others whole, their headers wrapped at spaces to the
    widest cell; None when even those pass `width`."""
    import textwrap

    kept = [i for i in range(len(header)) if i not in free]
    heads = [header[i].split(" ") for i in kept]
    widths = [
        max(max((len(str(r[i])) for r in rows), default=0), *(len(w) for w in words))
        for i, words in zip(kept, heads, strict=True)
    ]
    if sum(widths) + 2 * len(widths) > width:
        return None
    wrapped = [textwrap.wrap(header[i], w) or [""] for i, w in zip(kept, widths, strict=True)]
    tall = max(len(h) for h in wrapped)
    cells = [[""] * (tall - len(h)) + h for h in wrapped]  # bottom-aligned, as rich puts them
    rowed = [[*(c[k] for c in cells)] for k in range(tall)]
    rowed += [[str(row[i]) for i in kept] for row in rows]
    lines = []
    for k, cols in enumerate(rowed):
        lines.append(" " + "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
        if k >= tall:  # a row: its free text below it
            # a name and its value's first word on one line (no-break spaces, put back after)
            said = "; ".join(f"{header[i]}: {rows[k - tall][i]}".replace(" ", NBSP, 1 + header[i]
                             .count(" ")) for i in free)  # fmt: skip
            lines += [
                ln.replace(NBSP, " ")
                for ln in textwrap.wrap(
                    said, width - 1, initial_indent="     ", subsequent_indent="       ",
                    break_on_hyphens=False,
                )
            ]  # fmt: skip
    return [ln.rstrip() for ln in lines]


def _print_records(
    header: Sequence[str], rows: Sequence[Sequence[str]], file: IO[str] | None
) -> None:
    """Each row as a record: a `-[ n ]-` line, then one `name  value` line per column."""
    pad = max(len(h) for h in header)
    lines: list[str] = []
    for n, row in enumerate(rows, start=1):
        lines.append(f"-[ {n} ]" + "-" * max(0, pad - 4))
        lines.extend(f"{h.ljust(pad)}  {c}" for h, c in zip(header, row, strict=True))
    click.echo("\n".join(lines), file=file)


# --- errors --------------------------------------------------------------------------------------

EXIT_REJECTED = 1
"""A rejected command, bad usage or an environment problem."""
EXIT_BUG = 70
"""A genuine bug (sysexits' EX_SOFTWARE): the only failure that is not the caller's to fix."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (SIGINT): the shell's 128 + 2, and no error line (the user stopped it)."""


LONGEST_VALUE = 100
"""An error line names a value (an option's, an argument's, a path) whole up to this length;
a longer one is cut (`cut_values`)."""
_QUOTED = re.compile(
    r"""(?<!\w)(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")(?!\w)|[^\s'"]*[^\s'":,.;)]"""
)


def cut_values(line: str, most: int = LONGEST_VALUE) -> str:
    """Pure: `line` with every quoted value, and every word, longer than `most` characters cut
    as `shorten` cuts one (`'xxx…'... (10,000 characters)`): a 10,000-character `--window`,
    `jobs --status`, `log --tail`, `explain` JOB_ID, `simulate --set`, ... was echoed whole in
    a 10,049-character error line, click's "Invalid value" and the ledger's own alike
    (atk61-29c F3); every error line goes through here once (`fail`)."""

    def cut(m: re.Match[str]) -> str:
        text = m.group(0)
        quoted = text[0] in "'\"" and len(text) > 1 and text[-1] == text[0]
        inner = text[1:-1] if quoted else text
        if len(inner) <= most:
            return text
        return (
            f"{text[0]}{inner[:60]}{text[0]}... ({len(inner):,} characters)"
            if quoted
            else shorten(inner)
        )

    return _QUOTED.sub(cut, line)


def fail(message: str, code: str, exit_code: int = EXIT_REJECTED) -> None:
    """The error contract: one line on stderr, `error: <message> [<code>]`, and the exit code.
    `code` is a stable word (a LedgerError's `code`, `usage`, `environment`, `internal`); a
    long value in it is cut (`cut_values`)."""
    first = cut_values(" ".join(message.split()))
    try:
        click.echo(f"error: {first} [{code}]", err=True)
    finally:
        sys.exit(exit_code)


def _environment(e: BaseException, store: Path | None) -> str | None:
    """The words for an environment problem (a file, a directory, a database, a broker), or
    None when `e` is not one; `store` is the event store the command works on, if known."""
    if isinstance(e, sqlite3.DatabaseError):
        where = f" {store}" if store is not None else ""
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


def utf8(text: str) -> bool:
    """Whether `text` is valid UTF-8 as the OS gave it: Python hands a byte that is not (a
    Latin-1 `caf\\xe9`) over as a lone surrogate, which no request, log or JSON can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown_bytes(text: str) -> str:
    """Pure: `text` as one printable line, a byte that is not UTF-8 as `\\xe9`."""
    out = [
        f"\\x{ord(ch) - 0xDC00:02x}"
        if "\udc80" <= ch <= "\udcff"
        else ch
        if ch.isprintable()
        else repr(ch)[1:-1]
        for ch in text[:200]
    ]
    return "'" + "".join(out) + "'"


OWN_UTF8_CHECK = frozenset({"submit"})
"""Commands that name what is not UTF-8 themselves, in their own words (`submit.utf8_refusal`:
the working directory, an argument of the job's command, -o, ...)."""
_GLOBAL = {"actor": "--as (or $GPULEDGER_USER)", "url": "--url (or $GPULEDGER_URL)",
           "home": "--home (or $GPULEDGER_HOME)"}  # fmt: skip


def utf8_refusal(
    params: dict[str, Any], args: Sequence[str], environ: dict[str, str] | os._Environ[str]
) -> None:
    """Pure: one `InvalidCommand` line naming the first of a command's options (`--as`,
    `--url`, `--home`), the CLI's own variables (`$GPULEDGER_TOKEN`, ...) or its command's
    arguments that is not valid UTF-8, before anything is read or sent: a byte that is not
    UTF-8 was an `[internal]` error (a URL's host, a `jobs -u`) or went on to a server (`--as`
    in a header). `submit` names its own (`OWN_UTF8_CHECK`)."""
    bad = next(((n, str(v)) for n, v in params.items() if v is not None and not utf8(str(v))), None)
    what = _GLOBAL.get(bad[0], f"--{bad[0]}") if bad else ""
    if bad is None:
        bad = next(((k, v) for k, v in environ.items() if k.startswith("GPULEDGER_")
                    and not (utf8(k) and utf8(v))), None)  # fmt: skip
        what = f"${shown_bytes(bad[0])[1:-1]}" if bad else ""
    if bad is None and args and args[0] not in OWN_UTF8_CHECK:
        bad = next(((str(i), a) for i, a in enumerate(args[1:], 1) if not utf8(a)), None)
        what = f"argument {bad[0]} of `{shown_bytes(args[0])[1:-1]}`" if bad else ""
    if bad is not None:
        shown = "its value" if what.startswith("$GPULEDGER_") and "TOKEN" in what else None
        raise InvalidCommand(
            f"{what} is not valid UTF-8: {shown or shown_bytes(bad[1])}",
            hint="write it in UTF-8 (a name in Latin-1: `convmv -f latin1 -t utf8`, or `iconv`)",
        )


_SIGINT_SEEN = [False]
"""Set by the CLI's Ctrl-C handler (`_on_sigint`): a command's process, one command long."""


def _on_sigint(signum: int, frame: Any) -> None:
    """Python's own Ctrl-C (KeyboardInterrupt), remembered: DuckDB turns a Ctrl-C during a
    query into its own error ("Query interrupted", or a transaction then aborted), which the
    CLI took for a bug: `projection rebuild` stopped with "internal error ... report it", exit
    70 (atk47-29 F9). Any error after a Ctrl-C is the stop that was asked for: 130."""
    _SIGINT_SEEN[0] = True
    raise KeyboardInterrupt


class LedgerGroup(click.Group):
    """The error contract at the boundary: every failure is one line on stderr with a stable
    code. Exit 1 for a rejected command, bad usage (click's included) and an environment
    problem (named with its path or address); 70 only for a bug. Output piped into a reader
    that stops early (`| head`) ends quietly."""

    def store_path(self, ctx: click.Context) -> Path | None:
        """The event store the command works on, to name in an error (the CLI's group knows)."""
        return None

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        base: Any = super().main
        if not standalone_mode:
            return base(*args, standalone_mode=False, **kwargs)
        _SIGINT_SEEN[0] = False
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)
        try:
            rv = base(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:  # a bare group: its help, as asked
            click.echo(e.ctx.get_help() if e.ctx else e.format_message())
            sys.exit(0)
        except click.ClickException as e:
            name = e.ctx.command_path if isinstance(e, click.UsageError) and e.ctx else ""
            hint = f" (see `{name} --help`)" if name else ""
            fail(e.format_message() + hint, "usage")
        except click.Abort as e:
            if isinstance(e.__cause__, KeyboardInterrupt):  # Ctrl-C: stopped, as asked (130)
                sys.exit(EXIT_INTERRUPTED)
            fail("aborted", "usage")
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _quiet_pipe()
        sys.exit(rv if isinstance(rv, int) else 0)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        utf8_refusal(ctx.params, args, os.environ)  # before the group's own callback runs
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LedgerError as e:
            _stopped_if_interrupted()
            fail(e.line(), e.code)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:  # Ctrl-C: 130, and click's newline (it ends the "^C" a
            if sys.stderr.isatty():  # terminal echoed) only there: a blank line in a log file
                click.echo(err=True)  # otherwise (atk61-29b F4)
            sys.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            _quiet_pipe()
        except Exception as e:  # an environment problem, or a bug
            _stopped_if_interrupted()
            if isinstance(e, OSError) and e.errno == errno.EPIPE:
                _quiet_pipe()
            where = _environment(e, self.store_path(ctx))
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


def _note_sigint(signum: int, frame: Any) -> None:
    """A Ctrl-C remembered only, for the code that checks `interrupted()` at its safe points."""
    _SIGINT_SEEN[0] = True


@contextlib.contextmanager
def sigint_at_safe_points() -> Iterator[None]:
    """Inside the block a Ctrl-C only sets `interrupted()`, for the block to raise at a point of
    its choosing: a KeyboardInterrupt raised inside `concurrent.futures.wait` left a future's
    lock held, and the pool's thread then waited for it forever, the command never ended
    after the Ctrl-C (s61-red-B: `simulate compare --parallel`, 1 run in 3 under load)."""
    if signal.getsignal(signal.SIGINT) is not _on_sigint:
        yield
        return
    signal.signal(signal.SIGINT, _note_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, _on_sigint)


def interrupted() -> bool:
    """Whether this command's process has seen a Ctrl-C (`_on_sigint`), even one some library
    swallowed on its way up."""
    return _SIGINT_SEEN[0]


def _stopped_if_interrupted() -> None:
    """After a Ctrl-C (`_on_sigint`), whatever a command broke on the way is the stop asked
    for: exit 130, no error line."""
    if _SIGINT_SEEN[0]:
        sys.exit(EXIT_INTERRUPTED)


def _quiet_pipe() -> None:
    """The reader went away (`gpuledger log | head`): stop writing, say nothing, exit 0."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    sys.exit(0)


# --- progress ------------------------------------------------------------------------------------

Update = Callable[..., None]
"""`update(done, total=None)`: how far a long command is (`total` when it becomes known)."""


@contextlib.contextmanager
def progress(
    what: str, total: float | None = None, *, unit: str = "", percent: bool = False
) -> Iterator[Update]:
    """The one progress display of the commands that can run for more than a second (replay,
    what-if, audit verify, projection rebuild, simulate): on a terminal, a transient bar on
    stderr with done/total (thousands separated, as the result lines print them) and the time
    left; quiet when stderr is not a terminal (a pipe, a log file, CI). `unit` follows the
    counts ("days"); `percent` shows done/total as a percent instead, for a count in no unit
    a user could check (the what-if's work estimate: it was labelled "submissions", atk61-29b
    F1). `update(done, total=None, what=None)`: a `what` names the stage that
    begins (a command of several stages: `audit verify`'s chain, snapshots, projection)."""
    if not sys.stderr.isatty():
        yield lambda done, total=None, what=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, ProgressColumn, Task, TimeRemainingColumn
    from rich.table import Column
    from rich.text import Text

    class Counts(ProgressColumn):
        def render(self, task: Task) -> Text:
            if task.total is None and not task.completed:  # waiting: no "0/?" (atk36-29 F2)
                return Text("")
            if percent and task.total:
                return Text(f"{100 * task.completed / task.total:.0f}%", style="progress.download")
            of = "?" if task.total is None else f"{int(task.total):,}"
            return Text(f"{int(task.completed):,}/{of}", style="progress.download")

    counts = Counts(table_column=Column(no_wrap=True))  # the bar gives way at 80 columns
    bar = Progress(
        "{task.description}", BarColumn(), counts, unit, TimeRemainingColumn(),
        console=Console(file=sys.stderr), transient=True,
    )  # fmt: skip
    task = bar.add_task(what, total=total)

    def update(done: float, total: float | None = None, what: str | None = None) -> None:
        if what is not None and what != bar.tasks[0].description:  # a new stage: its own time
            bar.reset(task, total=total, completed=int(done), description=what)
        elif total is not None:
            bar.update(task, completed=done, total=total)
        else:
            bar.update(task, completed=done)

    with bar:
        yield update


# --- log lines -----------------------------------------------------------------------------------

LOG_LEVELS = ("debug", "info", "warning", "error")

log_level_option = click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="gpu-ledger's own log level; libraries log only their warnings, all at debug.",
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return msgspec.json.encode(out).decode()


def setup_logging(level: str, fmt: str = "text") -> None:
    """The log of every command that logs: one handler on stderr, a line of text (time, level,
    logger, message) or of JSON (`JsonFormatter`); gpu-ledger's own records (`gpuledger.*`) at
    `level`. Records of libraries (the HTTP server, the Kafka client, ...) only at debug, or
    when they warn (a broker that cannot be reached is one line of ours, not pages of client
    retries: the Kafka client is silenced where one is made, `quiet_kafka_logs`)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    if level.lower() != "debug":
        handler.addFilter(_ours_or_warning)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _ours_or_warning(record: logging.LogRecord) -> bool:
    return record.name.startswith("gpuledger") or record.levelno >= logging.WARNING
