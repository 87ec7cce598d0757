"""`gpuledger store copy|restore|where`: move a ledger between SQLite and PostgreSQL, rebuild a
lost store from the Kafka topic, say where a data directory's log lives (docs/ha.md).

Both writers check every position and link of the hash chain as they write, then read the
destination back and compare it with the source, event by event, byte for byte.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from ledger.cli._common import Ctx, pass_ctx
from ledger.cli.output import echo_json
from schemas.errors import InvalidCommand


def _place(where: str) -> tuple[Path, str | None]:
    """A store named on the command line: a PostgreSQL DSN, or a data directory (or the
    events.sqlite in one) -> (home, DSN or None)."""
    from ledger.store import EVENTS_DB, recorded
    from ledger.store.pgread import is_postgres

    if is_postgres(where):
        return Path("."), where
    path = Path(where)
    if path.name == EVENTS_DB:
        path = path.parent
    return path, recorded(path)


def _report(as_json: bool, what: str, copied: object, where: str) -> None:
    from ledger.store.copying import Copied

    assert isinstance(copied, Copied)
    if as_json:
        echo_json(
            {"events": copied.events, "head": copied.head, "last_hash": copied.last_hash,
             "snapshots": copied.snapshots, "to": where}
        )  # fmt: skip
        return
    click.echo(
        f"{what} {copied.events} events (positions 1-{copied.head}) into {where}: chain verified, "
        f"read back equal byte for byte (last hash {copied.last_hash[:16]}...)"
        + (f"; {copied.snapshots} snapshots" if copied.snapshots else "")
    )


@click.group()
def store() -> None:
    """Where the log lives: copy it between SQLite and PostgreSQL, restore it from Kafka."""


@store.command("copy")
@click.argument("src")
@click.argument("dst")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def copy(src: str, dst: str, as_json: bool) -> None:
    """Copy the log of SRC into the empty store DST (each a data directory or a PostgreSQL DSN),
    every event byte for byte, checking the chain. Stop the server of SRC first."""
    from ledger.store import has_log, locate, snapshots
    from ledger.store.copying import CopyError, same_log, write_log
    from ledger.store.pgread import redacted
    from projections.source import follow

    src_home, src_dsn = _place(src)
    dst_home, dst_dsn = _place(dst)
    if src_dsn is None and not has_log(src_home):
        raise InvalidCommand(f"no ledger in {src_home}", hint="name a data directory or a DSN")
    if dst_dsn is None and (src_dsn is None and src_home.resolve() == dst_home.resolve()):
        raise InvalidCommand("the source and the destination are the same store")
    with locate.open_source(src_home, src_dsn or "sqlite") as source:
        snaps = source.snapshot_rows(snapshots.STREAM_ID.hex, snapshots.KEEP)
        copied = write_log(follow(source), dst_home, dst_dsn, snapshot_rows=snaps)
        with locate.open_source(dst_home, dst_dsn or "sqlite") as written:
            differs = same_log(follow(source), follow(written))
    where = redacted(dst_dsn) if dst_dsn else str(dst_home)
    if differs is not None:
        raise CopyError(f"the copy differs from the source at event {differs}", hint="retry")
    _copy_progress(src_home, src_dsn, dst_home, dst_dsn)
    _report(as_json, "copied", copied, where)


def _copy_progress(src_home: Path, src: str | None, dst_home: Path, dst: str | None) -> None:
    """The relay's progress on each topic, as the source store keeps it (docs/kafka.md): the
    copy holds the same events, so the same ones are on each topic."""
    from ledger.store import relay_progress

    with relay_progress.opened(src_home, src) as source:
        kept = relay_progress.signed_rows(source)
    if not kept:
        return
    with relay_progress.opened(dst_home, dst) as recorder:
        for topic, position, mac, topic_id, offset, stamp in kept:  # each MAC as it is: it
            # names the same events, and the same records of the topic (and their append times)
            relay_progress.keep(
                recorder, topic, position, signature=mac, topic_id=topic_id, offset=offset,
                stamp=stamp,
            )  # fmt: skip


@store.command("restore")
@click.option(
    "--from-kafka",
    "bootstrap",
    envvar="GPULEDGER_KAFKA",
    required=True,
    metavar="HOST:PORT",
    help="Kafka bootstrap servers of the relay's topic (or $GPULEDGER_KAFKA).",
)
@click.option("--topic", envvar="GPULEDGER_KAFKA_TOPIC", default=None, help="[gpuledger.events]")
@click.option(
    "--to",
    "dst",
    default=None,
    help="The empty store to rebuild: a PostgreSQL DSN or a data directory (default: --home).",
)
@click.option(
    "--accept-unsigned",
    is_flag=True,
    help="Without signing keys, restore a topic whose records carry the relay's signature "
    "anyway (none verified: a topic writer's record can take a position).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def restore(
    ctx: Ctx,
    bootstrap: str,
    topic: str | None,
    dst: str | None,
    accept_unsigned: bool,
    as_json: bool,
) -> None:
    """Rebuild a lost store from the Kafka topic the relay wrote: every record checked (position,
    hash chain, and signature when GPULEDGER_KAFKA_SIGNING_KEYS is set) and written as it was.
    Records that are not the log's next one (foreign: another producer's) are set aside, as a
    quarantining reader does, and named (the relay's own signed ones apart); the topic is read
    whole before anything is written, so a restore that stops writes nothing; run again after a
    restore that was killed while it wrote, it compares what is there with the topic and writes
    the rest. Refused while another producer holds a transaction open on the topic (the relay's
    committed records behind it are unseen), and without signing keys when the topic's records
    carry the relay's signature (unless --accept-unsigned)."""
    from ledger.store import locate, recorded
    from ledger.store.copying import CopyError, same_log, write_log
    from ledger.store.pgread import redacted
    from ledger.store.relay import held_at, held_text
    from ledger.store.relay_topic import START_GONE_HINT
    from projections.errors import LogForked
    from projections.kafka_source import KafkaSource
    from projections.kafka_wire import TOPIC, connect_timeout, quiet_kafka_logs
    from projections.source import follow

    quiet_kafka_logs("warning")
    name = topic or TOPIC
    dst_home, dst_dsn = _place(dst) if dst is not None else (ctx.home, recorded(ctx.home))
    source = KafkaSource(bootstrap, name, connect_timeout_s=connect_timeout())
    gone = "the topic's start is gone ({}): {} is not a whole copy of the log; nothing was written"
    hint = (  # the relay refuses such a topic too, naming the same fix (`start_gone`)
        "restore from a copy of the store, or from a topic the relay wrote from its start; "
        + START_GONE_HINT
    )
    try:
        topic_id = _topic_id(bootstrap, name)  # before the read: the topic the log came from
        # a topic truncated (DeleteRecords) or made again restored nothing, or the part after
        # the cut, and said "chain verified, read back equal", exit 0 (atk50-25 F3)
        begin = source.first_offset()
        if begin > 0:
            raise CopyError(gone.format(f"first offset {begin:,}", name), hint=hint)
        head = source.head()
        if head == 0:
            raise CopyError(f"the topic {name} holds no events", hint="check --topic")
        # read_committed stops at an open transaction: the relay's committed events behind it
        # are unseen, and a restore to the head before it lost them saying "read back equal"
        # (atk49-25 F2). Asked after the head: one opened since is found too.
        held = held_at(bootstrap, name, timeout_s=source.timeout_s)
        if held is not None:
            raise CopyError(
                held_text(name, held) + f": a restore now would stop at position {head}, short "
                "of the relay's committed events behind it; nothing was written",
                hint="rerun once the transaction ends; give only the relay Write on the topic",
            )
        aside: list[int] = []
        own: list[int] = []  # of `aside`, those the relay signed (keys): positions not there
        ahead: dict[int, int] = {}  # of `own`, offset -> the position each claims
        try:
            last = sum(len(page) for page in _taken(source, head, aside, own, ahead))  # no write
        except LogForked as e:  # two logs on the topic (atk52-ha F2): say that nothing is lost
            raise CopyError(f"{e.message}; nothing was written", hint=e.hint) from e
        _refuse_past(name, last, ahead, hint)
        if source.keys is None and source.signed_seen and not accept_unsigned:
            raise CopyError(_UNVERIFIED.format(name, source.signed_seen), hint=_UNVERIFIED_HINT)
        if last == 0:  # no record follows position 0: every one set aside
            first = "no record is position 1" + (
                f", {len(aside):,} set aside from offset {aside[0]:,}" if aside else ""
            )
            raise CopyError(gone.format(first, name), hint=hint)
        # a restore killed while it wrote left the start of the log (pages, one transaction
        # each) and no progress row: a rerun refused it ("already holds N events", atk50-25
        # F7); it writes the rest now, the start compared byte for byte
        copied = write_log(_taken(source, head, []), dst_home, dst_dsn, resume="restore")
        with locate.open_source(dst_home, dst_dsn or "sqlite") as written:
            differs = same_log(_taken(source, head, []), follow(written))
        where = source.where(copied.head)  # the record restored last, as the last pass read it
    finally:
        source.close()
    if differs is not None:
        raise CopyError(f"the restored store differs from the topic at event {differs}")
    if copied.head != last:
        raise CopyError(f"the topic read {last} events, then {copied.head}", hint="retry")
    if not as_json:
        for line in _aside_lines(
            name, aside, own, sorted(set(source.early.passed)), source.keys is not None,
            sorted(source.copies),
        ):  # fmt: skip
            click.echo(line, err=True)
    # every event of the store is on the topic: the relay's progress there (docs/kafka.md)
    from ledger.store import relay_progress
    from ledger.store.snapshots import state_key

    # signed with the key of the home it was restored for (a data directory named by --to, or
    # --home's for a PostgreSQL store: its servers' homes, sharing GPULEDGER_STATE_KEY_FILE)
    key = state_key(dst_home) if dst_dsn is None else state_key(ctx.home, create=False)
    at = _restored_anchor(bootstrap, name, topic_id, None if where is None else where.offset)
    with relay_progress.opened(dst_home, dst_dsn) as recorder:
        topic_id, offset, stamp = at if at is not None else (None, None, None)
        relay_progress.keep(
            recorder, name, copied.head, key, topic_id=topic_id, offset=offset, stamp=stamp
        )
    if not as_json:
        click.echo(_progress_line(name, copied.head, at), err=True)
    _report(as_json, "restored", copied, redacted(dst_dsn) if dst_dsn else str(dst_home))


def _progress_line(name: str, head: int, at: tuple[str, int, int | None] | None) -> str:
    """What a restore's progress row says of the topic, plainly: what it names, and what is not
    known (a record appended under `CreateTime` carries no append time, whatever the topic's
    setting now: the row names none, and the next relay checks that record by its commit marker
    alone; atk55-25 F8: it blamed a topic since set to LogAppendTime; stop 54: a restore's row
    named no time even on a `LogAppendTime` topic, and nothing said so)."""
    from schemas.units import when

    said = f"the relay's progress on {name}: position {head:,}"
    if at is None:
        return (
            f"{said}; no record of the topic named (its last record is not followed by a commit "
            "marker, or the topic changed while it was read): the next relay reads the topic "
            "from its start to find its place"
        )
    topic_id, offset, stamp = at
    said += f", the record at offset {offset:,} (topic id {topic_id})"
    if stamp is not None:
        return f"{said}, appended by the broker at {when(stamp / 1000)} ({stamp} ms)"
    return (
        f"{said}; its append time is not known: the record carries the producer's time, not "
        "the broker's (it was appended while the topic had message.timestamp.type=CreateTime), "
        "so the row names none and the next relay checks that record by its commit marker "
        "alone (records appended while the topic has message.timestamp.type=LogAppendTime carry "
        "the broker's: docs/kafka.md)"
    )


_UNVERIFIED = (
    "the records of topic {} carry the relay's signature ({:,} of those read), and no signing "
    "keys are set: a topic writer's unsigned record would be restored as the log's own; "
    "nothing was written"
)
_UNVERIFIED_HINT = (
    "set GPULEDGER_KAFKA_SIGNING_KEYS to the relay's keys (or --accept-unsigned to restore "
    "with no signature checked)"
)
"""atk54-25 F5: a keyless restore of a signed topic took a topic writer's unsigned record that
linked to the last as event N+1, "chain verified", and a keyed relay published after it."""


def _topic_id(bootstrap: str, topic: str) -> str | None:
    """The topic's Kafka id now (None: unknown, or no such topic)."""
    from ledger.store.relay_topic import open_admin, topic_id_of
    from projections.kafka_wire import connect_timeout

    try:
        admin = open_admin(bootstrap, None, connect_timeout())
    except Exception:
        return None
    try:
        return topic_id_of(admin, topic) or None
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            admin.close()


def _restored_anchor(
    bootstrap: str, topic: str, topic_id: str | None, offset: int | None
) -> tuple[str, int, int | None] | None:
    """The topic id, offset and append time a restore's progress row names: the record of its
    last position, when it passes the checks the relay makes of its bookmark (the topic still
    the one read, by its id; the record followed by a commit marker, `relay_tail.marked`), so
    the next relay takes it (checking it again, with the store's bytes and that time) rather
    than reading the whole topic from its start, which a row without them made it do. The time
    is None on a `CreateTime` topic (its records carry the producer's). None: the row names
    none of them."""
    from ledger.store.relay_tail import appended, marked
    from projections.kafka_wire import connect_timeout

    if topic_id is None or offset is None or _topic_id(bootstrap, topic) != topic_id:
        return None
    try:
        why, record = marked(bootstrap, offset, topic, connect_timeout_s=connect_timeout())
    except Exception:
        return None
    if why is not None or record is None:
        return None
    return topic_id, offset, appended(record)  # the broker's time (None: CreateTime's)


def _aside_lines(
    name: str,
    aside: list[int],
    own: list[int],
    early: list[int],
    signed: bool,
    copies: Sequence[int] = (),
) -> list[str]:
    """What a restore says of the records it did not take, the relay's own told apart from
    another producer's (atk51-25 F5: the relay's signed early copies were called "another
    producer's", sending the operator after an intruder), and the exact copies of records it
    restored that it passed over (atk54-25 F7: it said nothing of them; `audit verify --kafka`
    named them)."""
    from ledger.store.relay_topic import offsets_text

    out = []
    if copies:
        out.append(
            f"passed over {len(copies):,} record(s) of {name} that are exact copies of records "
            "restored already (same position, bytes"
            + (" and a good signature" if signed else "")
            + "; a relay that published a batch twice, or someone replaying saved records): "
            f"nothing in them is new; offsets {offsets_text(copies)}"
        )
    if early:
        out.append(
            f"passed over {len(early)} record(s) of {name} that are copies of records the "
            "relay signed, found before their turn (a topic made again under the relay, or "
            "someone replaying saved records; each position restored where its turn came): "
            f"offsets {offsets_text(early)}"
        )
    if own:
        out.append(
            f"set aside {len(own)} record(s) of {name} that carry the relay's signature but "
            f"are not the log's next one (copies of the relay's records out of their turn: a "
            f"topic made again under it, or someone replaying saved records): offsets "
            f"{offsets_text(own)}"
        )
    others = [o for o in aside if o not in set(own)]
    if others:
        out.append(
            f"set aside {len(others)} record(s) of {name} that are not the log's next one "
            + (
                "(another producer's: they do not carry the relay's signature"
                if signed
                else "(another producer's, or the relay's own out of order: without signing "
                "keys the two cannot be told apart"
            )
            + f"; offsets {offsets_text(others)})"
        )
    return out


def _refuse_past(name: str, last: int, ahead: dict[int, int], hint: str) -> None:
    """Refuse a topic where a record set aside that carries the relay's signature claims a
    position past the log read from its start (`last`): the relay published events the topic
    does not hold in order. atk52-25 F6: a topic with a gap (1..100, then the relay's records
    from 200 on) restored 1..100, "chain verified", exit 0."""
    from ledger.store.copying import CopyError

    past = sorted((p, o) for o, p in ahead.items() if p > last)
    if not past:
        return
    position, offset = past[0]
    lacks = f"; it lacks positions {last + 1} to {position - 1}" if position > last + 1 else ""
    raise CopyError(
        f"topic {name} is not a whole copy of the log: the record at offset {offset:,} carries "
        f"the relay's signature and claims position {position}, past the log read from the "
        f"topic's start, which ends at position {last}{lacks} ({len(past):,} such record(s)): "
        "the relay published events the topic does not hold in order; nothing was written",
        hint=hint,
    )


def _taken(
    source: Any,
    head: int,
    aside: list[int],
    own: list[int] | None = None,
    ahead: dict[int, int] | None = None,
) -> Iterator[list[Any]]:
    """The topic's log up to `head` as a quarantining reader takes it: a record that is not the
    next one (it fails the signature, does not link, claims another position) is set aside and
    its offset added to `aside` (one unsigned record after the tail stopped a restore half-way,
    atk49-25 F3), and to `own` when it carries the relay's signature; a fork, wrong keys, or a
    run of `max_dead_run` set aside on an unsigned topic stop it. `ahead`: the position each
    record of `own` claims, by offset."""
    from projections.errors import PoisonRecord
    from projections.quarantine import AHEAD_SIGNED
    from projections.source import follow

    position = 0
    while True:
        try:
            for page in follow(source, position, head):
                position = page[-1].position
                yield page
            return
        except PoisonRecord as p:
            source.skip(p)
            aside.append(p.offset)
            if own is not None and AHEAD_SIGNED in p.reason:
                own.append(p.offset)
                if ahead is not None and p.position is not None:
                    ahead[p.offset] = p.position


@store.command("where")
@pass_ctx
def where(ctx: Ctx) -> None:
    """Where the data directory's log lives (its SQLite file, or its PostgreSQL DSN without the
    password)."""
    from ledger.store import locate

    click.echo(locate.describe(ctx.home))


COMMANDS = [store]
