"""`gpuledger project follow --kafka HOST:PORT`: another reader of the log, in its own process.

It follows the relay's topic into a projection of its own (`<home>/projections/ledger.duckdb`
under its own data directory; no event store needed there), e.g. on another machine. Its position
lives in that DuckDB file with the rows, so a restart, even after SIGKILL, resumes exactly.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import msgspec

from ledger.cli._common import Ctx, pass_ctx
from ledger.cli.output import log_level_option, setup_logging
from ledger.cli.views import projection_group
from projections.errors import ProjectionMismatch, TopicGap
from projections.kafka_wire import TOPIC, TOPIC_ENV, connect_timeout, quiet_kafka_logs
from projections.projector import DEFAULT_BATCH

if TYPE_CHECKING:
    from projections.store import Store

# The Kafka client, the relay's store readers and the follower are imported by the commands that
# use them: `projection status` loads this module too (`follow` is its subcommand), and they were
# ~0.4 s of CPU at each


@click.command("follow")
@click.option(
    "--kafka",
    envvar="GPULEDGER_KAFKA",
    required=True,
    metavar="HOST:PORT",
    help="Kafka bootstrap servers (or $GPULEDGER_KAFKA).",
)
@click.option(
    "--topic",
    envvar=TOPIC_ENV,
    default=TOPIC,
    show_default=True,
    help="The topic the relay writes (or $GPULEDGER_KAFKA_TOPIC).",
)
@click.option(
    "--quarantine",
    is_flag=True,
    help="Record poison records in the dead_letters table and go on "
    "(default: stop at the first one, naming its topic, partition and offset).",
)
@click.option(
    "--home",
    "home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Data directory of this projection (default: the global --home).",
)
@click.option(
    "--until", type=int, default=None, metavar="POSITION", help="Exit at this log position."
)
@click.option("--once", is_flag=True, help="Catch up with the topic as it is now, then exit.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=DEFAULT_BATCH,
    show_default=True,
    help="Events per transaction at most.",
)
@log_level_option
@pass_ctx
def follow(
    ctx: Ctx,
    kafka: str,
    topic: str,
    quarantine: bool,
    home: Path | None,
    until: int | None,
    once: bool,
    batch_size: int,
    log_level: str,
) -> None:
    """Follow the Kafka topic into a projection of its own, until SIGTERM or SIGINT.

    Reads with read_committed, positions from the records' gpuledger.position header; at DEBUG
    level it logs every committed batch."""
    setup_logging(log_level)
    quiet_kafka_logs(log_level)
    log = logging.getLogger("gpuledger.follow")
    home = home or ctx.home
    from projections.kafka_follow import follow as follow_topic
    from projections.kafka_source import KafkaSource
    from projections.projector import Projector
    from projections.quarantine import quarantined, signed_ahead
    from projections.store import Store

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def progress(position: int, head: int) -> None:
        log.debug("applied through position %d (log head %d)", position, head)

    with (
        Store.open(home) as store,
        KafkaSource(kafka, topic, connect_timeout_s=connect_timeout()) as source,
    ):
        if quarantine:
            _require_dead_letters(store)
        projector = Projector(store, source, batch_size=batch_size, quarantine=quarantine)
        log.info("following %s on %s into %s from %d", topic, kafka, home, store.position())
        position = follow_topic(
            projector,
            stop,
            until=until,
            once=once,
            progress=progress,
            on_error=lambda err: log.warning("kafka: %s", err.line()),
        )
        status = store.status()
        dead = quarantined(store.con) or 0
        ahead = signed_ahead(store.con, position) if quarantine and once and dead else None
    click.echo(f"position {position:,}, {status.events:,} events, {dead} quarantined")
    if ahead is not None:  # the relay's records set aside, the positions before them missing
        count, offset, first = ahead
        raise TopicGap(
            f"topic {topic} lacks positions {position + 1} to {first - 1}: {count:,} record(s) "
            f"the relay signed for later positions were set aside (the first at offset "
            f"{offset:,}, position {first:,}): the topic's start was deleted, or it was made "
            "again",
            hint="read a topic the relay wrote from its start; to rebuild the store, restore "
            "it from such a topic or a copy, and publish to a new topic",
            topic=topic,
            position=position,
        )


def _require_dead_letters(store: Store) -> None:
    """A projection file made before `dead_letters` existed cannot quarantine."""
    from projections.quarantine import quarantined

    if quarantined(store.con) is None:
        raise ProjectionMismatch(
            f"the projection {store.path} has no dead_letters table (an older file)",
            hint="delete it and follow again: it is rebuilt from the topic",
            path=str(store.path),
        )


projection_group.add_command(follow)
"""`follow` is a subcommand of `projection` (and of its alias `project`, which shares the
group's commands): `gpuledger project follow`."""


@click.group("relay")
def relay_group() -> None:
    """The relay that publishes the log to Kafka (run by `gpuledger up --kafka`)."""


@relay_group.command("status")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the health record as JSON, with the lag from the store's head read now "
    "(`head`, `lag` when exact, `lag_at_least`, `lag_known`, `behind`, `stale`).",
)
@pass_ctx
def relay_status(ctx: Ctx, as_json: bool) -> None:
    """What the service's relay is doing: publishing, stalled (a send that does not come back,
    with the lag), unavailable (retried), stopped (by an error) or exited (the service
    stopped), its position on the topic, how far behind the store, and the error. True within
    the service's check interval (about a second); a record no service updates any more is
    called stale, and a topic not checked for a few intervals says how old its check is.
    Exits 1 unless it is publishing, fresh, its topic checked lately."""
    from ledger.store.clock import SystemClock
    from ledger.store.relay import RelayError
    from ledger.store.relay_health import read_health

    health = read_health(ctx.home)
    now = SystemClock().now()
    if health is None or health.state == "exited" or health.stale(now):
        # a standby runs no relay (or ran one once it led, and was killed -9 since: its record
        # left as it was, atk54-25 F3): the server's health names the leader's, as the leader
        # reported it to the store (atk52-ha F4: nothing)
        told = _servers_relay(ctx)
        if told is not None:
            line, ok, report = told
            click.echo(msgspec.json.encode(report).decode() if as_json else line)  # F4
            sys.exit(0 if ok else 1)
    if health is None:
        raise RelayError(
            f"no relay has run in {ctx.home}",
            hint="start the service with `gpuledger up --kafka HOST:PORT`",
        )
    head, unread = _store_head(ctx.home)
    health = _checked_now(health, now)
    if as_json:  # the lag read as the line reads it, not the record's own head
        click.echo(msgspec.json.encode(health.report(now, head, unread)).decode())
    else:
        click.echo(health.line(now, head, unread))
    if health.state != "publishing" or health.stale(now) or health.unchecked_s(now):
        sys.exit(1)


def _checked_now(health: Any, now: float) -> Any:
    """`health`, its topic checked on this read when the service's own check is older than a
    few intervals (`RelayHealth.unchecked_s`: a loaded host ran it 4-28 s late, atk55-25 F2):
    the same topic id now makes the record's word as good as a check; a topic deleted or made
    again since, or a broker that does not answer within 2 s, leaves it unchecked (the line
    says how old its check is, exit 1)."""
    from ledger.store.relay_topic import open_admin, topic_id_of

    if not health.topic_id or health.unchecked_s(now) is None:
        return health
    quiet_kafka_logs("warning")  # its reconnect lines are not this command's output
    admin = None
    try:
        admin = open_admin(health.bootstrap, None, 2.0)
        same = topic_id_of(admin, health.topic) == health.topic_id
    except Exception:  # unreachable: the record's word stays as old as it is
        return health
    finally:
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()
    return msgspec.structs.replace(health, checked=now) if same else health


def _servers_relay(ctx: Ctx) -> tuple[str, bool, dict[str, Any]] | None:
    """`relay status` from the server of this home, when it serves one and its health names a
    relay this home's record does not (a standby tells the leader's): the line, whether it
    publishes, and the same as `--json` prints it. None: no server answers, or it names no relay
    (the home's record is the word)."""
    from ledger.store.relay_health import RELAY_STALE
    from schemas.api import Health

    try:
        remote = ctx.remote
        h = None if remote is None else remote.get("health", type=Health)
    except Exception:
        return None
    if h is None or h.relay_state is None or h.role != "standby":
        return None
    line = (
        f"relay {h.relay_state}: position {h.relay_position or 0:,}, "
        f"lag {h.relay_lag or 0:,} behind this standby's log"
    )
    if h.relay_position is None:  # told no position (a leader of an earlier version): no "0"
        line = f"relay {h.relay_state}: position and lag unknown"
    report = {
        "state": h.relay_state,
        "position": h.relay_position,
        "lag": h.relay_lag,
        "error": h.relay_error or "",
        "told_by": "standby",
        "stale": h.relay_state == RELAY_STALE,
    }
    ok = h.relay_state == "publishing"
    return line + (f" ({h.relay_error})" if h.relay_error else ""), ok, report


def _store_head(home: Path) -> tuple[int | None, str]:
    """The head of the home's store (SQLite or PostgreSQL), read now: the lag `relay status`
    shows is against it, not against the head the service last wrote in relay.json (atk51-25
    F3: "0 behind the store", exit 0, with an event appended since the service was killed).
    (None, why) when it cannot be read."""
    from ledger.store.relay import RawSource, open_store

    try:
        recorder = open_store(home)
    except Exception as e:
        return None, f"cannot read the store's head: {type(e).__name__}: {e}"
    try:
        return RawSource(recorder).head(), ""
    except Exception as e:
        return None, f"cannot read the store's head: {type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(Exception):
            recorder.datastore.close()  # type: ignore[attr-defined]


COMMANDS: list[click.Command] = [relay_group]
"""`relay` at the top level; `follow` is registered under `projection` above."""
