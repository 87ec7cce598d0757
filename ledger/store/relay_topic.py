"""The relay's topic and what it says of it: the relay's errors; the topic created with its
settings or checked (`ensure_topic`), its record limit (`max.message.bytes`) read from the broker,
the producer's batches sized to it (`producer_sizes`), and the limit raised where an older topic
would refuse a stored event (`raise_record_limit`).

Kafka applies `max.message.bytes` to a producer's record *batch*, not to each record: ten records
of 100 KB sent as one 1 MB batch to a topic of 200,000 bytes were refused together, and the relay
stood still for good although each fits (atk44z F4). An older topic's low limit raised to 8 MiB:
a 1.2 MB event, taken before events were bounded, stopped the relay for good on a topic with
Kafka's default 1,048,588 bytes (atk44-25 F8). Incremental: no other setting changes."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, OffsetSpec
from kafka.errors import KafkaError, TopicAlreadyExistsError, UnknownTopicOrPartitionError
from kafka.record.default_records import DefaultRecordBatchBuilder

from projections.kafka_wire import (
    PARTITION,
    RECORD_MAX_BYTES,
    REQUIRED_CONFIG,
    TOPIC,
    TOPIC_CONFIG,
    client_config,
    patience,
    unreachable,
)
from schemas.errors import LedgerError

T = TypeVar("T")

log = logging.getLogger("gpuledger.relay")

DEFAULT_TIMEOUT_S = 30.0
"""How long the relay's broker requests may take by default (`Relay(timeout_s=...)`)."""
BATCH_BYTES = 1 << 20
"""The producer's batch on a topic that takes more: a flush and commit per 5,000 events cost a
few milliseconds, so larger batches would gain nothing."""


class RelayError(LedgerError):
    """The relay cannot go on: a wrong topic, a topic that disagrees with the store, ..."""

    code = "relay"


class RelayUnavailable(RelayError):
    """Kafka did not answer in time or failed a request: retry with a fresh producer."""

    code = "unavailable"


class ConnectEnded(RelayUnavailable):
    """A connect told to end (the round's `going_on` false or its deadline passed: a stop, the
    lease gone) before its next step: a step-down's relay went on connecting for 8-18 s and
    the next relay of its server waited for it (atk56-25 F2). Retried like any other."""

    code = "ended"


class RelayHeld(RelayUnavailable):
    """Another producer holds a transaction open on the topic: read_committed readers (the relay's
    bookmark too) see nothing past it until it ends. Retried: the relay never guesses."""

    code = "held"


class RecordTooLarge(RelayUnavailable):
    """The next event is larger than the topic takes and the relay may not raise its limit."""

    code = "record_too_large"


class TopicRefused(RelayError):
    """The topic no longer keeps the whole log (its start gone, settings that lose events): the
    relay stops; a service's stopped relay looks at the topic every few seconds and goes on once
    it is deleted or made again (`RelayService`, atk51-25 F6)."""

    code = "relay"


class RelayFenced(RelayError):
    """Another relay with the same transactional id took over: this one must stop."""

    code = "fenced"


def ensure_topic(
    bootstrap: str,
    topic: str = TOPIC,
    config: Mapping[str, Any] | None = None,
    connect_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> int:
    """Create the topic explicitly: one partition, unlimited retention. Idempotent. Returns the
    largest record the topic takes (its `max.message.bytes`).

    An existing topic must have one partition and the settings in REQUIRED_CONFIG; otherwise
    this raises RelayError rather than publish into a topic that reorders or forgets events.
    """
    why = unreachable(bootstrap, connect_timeout_s)
    if why is not None:
        raise RelayUnavailable(
            f"Kafka at {bootstrap} is unreachable ({why})",
            hint="is the broker up? (`scripts/kafka/kafka status`)",
        )
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="gpuledger-admin",
        **patience(connect_timeout_s),
        **client_config(config),
    )
    try:
        try:
            admin.create_topics(
                {
                    topic: {
                        "num_partitions": 1,
                        "replication_factor": -1,  # the broker's default.replication.factor
                        "configs": TOPIC_CONFIG,
                    }
                },
                wait_for_metadata=True,
            )
            return RECORD_MAX_BYTES
        except TopicAlreadyExistsError:
            pass
        return _check_topic(admin, topic, connect_timeout_s)
    finally:
        admin.close()


def _check_topic(admin: Any, topic: str, timeout_s: float) -> int:
    (described,) = admin.describe_topics([topic])
    partitions = len(described["partitions"])
    if partitions != 1:
        raise RelayError(
            f"topic {topic} has {partitions} partitions; the relay needs exactly 1 to keep order",
            hint="delete the topic (or pick another name) and let the relay create it",
        )
    keys = [*REQUIRED_CONFIG, "max.message.bytes"]
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, keys)
    found = admin.describe_configs([resource], config_filter="all")["topic"][topic]
    settings = tuple((k, str(found[k]["value"])) for k in REQUIRED_CONFIG)
    if any(TOPIC_CONFIG[k] != v for k, v in settings):  # the offsets decide the fix (`unkept`)
        mark = topic_mark(admin, topic, timeout_s)
        refusal = unkept(topic, mark or TopicMark("", 0, 0, settings))
        if refusal is not None:
            raise refusal
    return int(found["max.message.bytes"]["value"])


def offsets_text(offsets: Sequence[int]) -> str:
    """Kafka offsets as a short list for a log line or a report (the first ten, then a count)."""
    shown = ", ".join(map(str, offsets[:10]))
    return shown + (f", ... ({len(offsets) - 10} more)" if len(offsets) > 10 else "")


def batch_bytes(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> int:
    """The most a batch of this one record takes on the wire, as the broker checks it against
    `max.message.bytes` and the producer against its `max_request_size` (kafka-python's own
    estimate, so the two never disagree)."""
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers))


def producer_sizes(record_limit: int) -> dict[str, int]:
    """The producer's `batch_size` and `max_request_size` on a topic whose `max.message.bytes`
    is `record_limit`: the broker checks a whole batch against it (its header included, which
    kafka-python counts in `batch_size`), and a record larger than a batch goes alone. So a batch
    of several records never passes the limit, and any record the relay sends (one whose batch
    alone fits it: `batch_bytes`, `Relay._fitting`) is taken."""
    return {
        "batch_size": max(1, min(BATCH_BYTES, record_limit)),
        "max_request_size": max(1, record_limit),
    }


def raise_record_limit(
    bootstrap: str, topic: str, config: Mapping[str, Any] | None, connect_timeout_s: float
) -> str | None:
    """Set `topic`'s `max.message.bytes` to RECORD_MAX_BYTES (IncrementalAlterConfigs: nothing
    else touched). None when the broker took it, else why not, in one line (no AlterConfigs
    right on the topic, a broker before 2.3): the relay then says what to run."""
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="gpuledger-admin",
            **patience(connect_timeout_s),
            **client_config(config),
        )
    except KafkaError as e:
        return f"{type(e).__name__}: {e}"
    try:
        wanted = {"max.message.bytes": str(RECORD_MAX_BYTES)}
        admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, wanted)], incremental=True
        )
    except (KafkaError, ValueError) as e:
        log.warning("relay: could not raise topic %s's max.message.bytes: %s", topic, e)
        return f"{type(e).__name__}: {e}"
    finally:
        admin.close()
    log.warning("relay: raised topic %s's max.message.bytes to %d", topic, RECORD_MAX_BYTES)
    return None


DEFAULT_TRANSACTIONAL_ID = "gpuledger-relay"
"""The default topic's relay's transactional id (every earlier version's, whatever its topic)."""


def transactional_id_for(topic: str) -> str:
    """The relay's transactional id when none is set (GPULEDGER_KAFKA_TRANSACTIONAL_ID): one per
    topic, the same for every server and start of the ledger that publishes to it (so a zombie
    leader's relay is still fenced), never another ledger's (two ledgers on one cluster have
    two topics: the shared `gpuledger-relay` fenced each other's relays, atk55-25 F6). The
    default topic keeps `gpuledger-relay` (its ACLs, and a relay of an earlier version)."""
    return DEFAULT_TRANSACTIONAL_ID if topic == TOPIC else f"{DEFAULT_TRANSACTIONAL_ID}.{topic}"


def asks_broker(method: Callable[..., T]) -> Callable[..., T]:
    """A relay's method that waits on the broker (its topic's metadata, a reconnect): its
    `waiting_since` from the call's start (restored after: they nest), which the service's
    `stalled` times (`Relay._send`'s sends and commits restart it as they are answered)."""

    @functools.wraps(method)
    def asking(self: Any, *args: Any, **kwargs: Any) -> T:
        before, self.waiting_since = self.waiting_since, time.monotonic()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.waiting_since = before

    return asking


# --- the topic under a running relay ------------------------------------------------------------

TOPIC_CHECK_S = 2.0
"""How often a running relay asks whether its topic is still the one it published to."""


TIMESTAMP_TYPE = "message.timestamp.type"


def create_time_text(topic: str) -> str:
    """Pure: the relay's one warning on a topic whose records carry the producer's time."""
    return (
        f"relay: topic {topic} has {TIMESTAMP_TYPE}=CreateTime (made before the relay set "
        "LogAppendTime, or changed since): its progress keeps no append time, so a record "
        "written again at the offset it names after the broker lost the end of the topic "
        "passes for its own when a transactional writer put it there (docs/kafka.md); set "
        f"`kafka-configs --alter --entity-type topics --entity-name {topic} --add-config "
        f"{TIMESTAMP_TYPE}=LogAppendTime`"
    )


class TopicMark(NamedTuple):
    """What a relay knows of its topic: Kafka's topic id and its partition's first and end
    offsets. A topic deleted and made again has another id; one truncated (DeleteRecords) a
    higher first offset."""

    topic_id: str
    begin: int
    end: int
    settings: tuple[tuple[str, str], ...] = ()
    """The topic's REQUIRED_CONFIG settings as the broker gave them (empty: not asked)."""
    appended: bool = False
    """The broker stamps its records with the append time (`message.timestamp.type=
    LogAppendTime`): the relay's sends report it, and its progress keeps it."""


def open_admin(bootstrap: str, config: Mapping[str, Any] | None, timeout_s: float) -> Any:
    return KafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="gpuledger-admin",
        **patience(timeout_s),
        **client_config(config),
    )


def topic_mark(admin: Any, topic: str, timeout_s: float) -> TopicMark | None:
    """The topic's id and offsets as the broker says now (None: no such topic)."""
    (described,) = admin.describe_topics([topic])
    if described.get("error_code") == UnknownTopicOrPartitionError.errno:
        return None
    tp = TopicPartition(topic, PARTITION)
    ms = int(timeout_s * 1000)
    try:
        begin = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST}, timeout_ms=ms)[tp]
        end = admin.list_partition_offsets({tp: OffsetSpec.LATEST}, timeout_ms=ms)[tp]
        keys = [*REQUIRED_CONFIG, TIMESTAMP_TYPE]
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, keys)
        found = admin.describe_configs([resource], config_filter="all")["topic"][topic]
    except UnknownTopicOrPartitionError:
        return None
    settings = tuple((k, str(found[k]["value"])) for k in REQUIRED_CONFIG if k in found)
    topic_id = str(described.get("topic_id") or "")
    appended = str(found.get(TIMESTAMP_TYPE, {}).get("value")) == "LogAppendTime"
    return TopicMark(topic_id, int(begin.offset), int(end.offset), settings, appended)


def unkept(topic: str, mark: TopicMark) -> TopicRefused | None:
    """Pure: the relay's refusal of a topic whose settings would not keep every event (None: they
    do, or were not asked). A RelayError, not retried: the service says `stopped` with it.

    atk51-25 F1/F4: the settings were read only at connect, so `cleanup.policy=compact` set under
    a running relay let the broker drop every record but the last ones (they share one key),
    while `relay status` said "publishing, 0 behind"; the relay's running check asks for them
    too (`topic_mark`). The hint is what makes the topic whole again for readers: a compacted
    topic with records has lost some that no setting brings back, and the relay cannot put them
    back before the ones left (readers stop at those); so a new topic, or the topic deleted. Only
    an empty topic, or a retention not yet applied (its first offset still 0), is fixed by
    setting the values back."""
    wrong = {k: v for k, v in mark.settings if k in TOPIC_CONFIG and v != TOPIC_CONFIG[k]}
    if not wrong:
        return None
    shown = ", ".join(f"{k}={v}" for k, v in sorted(wrong.items()))
    setting = ", ".join(f"{k}={TOPIC_CONFIG[k]}" for k in sorted(wrong))
    line = f"topic {topic} has {shown}: it would not keep every event"
    if mark.end <= mark.begin == 0:
        return TopicRefused(line, hint=f"set {setting} on the topic and start the service again")
    if "cleanup.policy" not in wrong and mark.begin == 0:
        return TopicRefused(
            line + " (its start is still there: first offset 0)",
            hint=f"set {setting} on the topic at once, before the broker deletes by it (at its "
            "next retention check), and start the service again; if the topic's first offset "
            f"is above 0 by then: {START_GONE_HINT}",
        )
    if "cleanup.policy" in wrong:
        line += (
            " (compaction keeps only the last records of the one key the relay's records "
            "share: the topic may have lost events already, and setting cleanup.policy=delete "
            "back does not bring them back)"
        )
    return TopicRefused(line, hint=START_GONE_HINT)


def remade(topic: str, before: TopicMark, now: TopicMark | None, published_end: int) -> str | None:
    """Pure: why the topic is no longer the one the relay published to (`before`: its mark when
    the relay connected; `published_end`: the offset after the relay's last committed record),
    or None. atk50-25 F1: a topic deleted and made again under a running relay got its next
    positions only, every earlier event never on it, while `relay status` said 0 behind."""
    if now is None:
        return f"topic {topic} no longer exists (deleted)"
    if before.topic_id and now.topic_id and now.topic_id != before.topic_id:
        return (
            f"topic {topic} was deleted and made again (topic id {now.topic_id}, "
            f"was {before.topic_id})"
        )
    if now.end < published_end:
        return (
            f"topic {topic} ends at offset {now.end:,}, below the {published_end:,} the relay "
            "published to (truncated or made again)"
        )
    if now.begin > before.begin:
        return (
            f"the start of topic {topic} is gone (first offset {now.begin:,}, was {before.begin:,})"
        )
    return None


def topic_id_of(admin: Any, topic: str) -> str | None:
    """The topic's id as the broker says now ("" when it gives none; None: no such topic): one
    metadata request, cheap enough for every batch (`Relay`, before each commit)."""
    (described,) = admin.describe_topics([topic])
    if described.get("error_code") == UnknownTopicOrPartitionError.errno:
        return None
    return str(described.get("topic_id") or "")


def same_topic(bootstrap: str, topic: str, topic_id: str, timeout_s: float) -> bool:
    """Whether `topic`'s id is `topic_id` now (one request, at most `timeout_s` to connect;
    False: another id, no such topic, or no answer)."""
    admin = None
    try:
        admin = open_admin(bootstrap, None, timeout_s)
        return topic_id_of(admin, topic) == topic_id
    except Exception:
        return False
    finally:
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()


def topic_change(
    bootstrap: str, topic: str, timeout_s: float, every_s: float, stop: threading.Event
) -> str | None:
    """Wait until `topic` is "deleted" or "made again" (another id) from what it is at the
    first answer, asking every `every_s` (a broker away is asked again); None once `stop`."""
    admin: Any = None
    first: str | bool | None = False  # the topic's id at the first answer (False: none yet)
    try:
        while not stop.wait(0 if first is False else every_s):
            try:
                if admin is None:
                    admin = open_admin(bootstrap, None, timeout_s)
                now = topic_id_of(admin, topic)
            except Exception as e:  # unreachable: asked again
                log.debug("relay: cannot ask for topic %s: %s", topic, e)
                with contextlib.suppress(Exception):
                    admin.close()
                admin = None
                continue
            if first is False and now is not None:
                first = now
            elif now is None or (first and now != first):
                return "deleted" if now is None else "made again"
        return None
    finally:
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()


def sent_elsewhere(
    topic: str, before: TopicMark, topic_id: str | None, first: int | None, published_end: int
) -> str | None:
    """Pure: why the batch the relay has just flushed, not yet committed, did not go to the topic
    it published to (None: it did). `topic_id`: the topic's id asked after the flush (None: no
    such topic); `first`: the offset the broker gave the batch's first record (None: unknown);
    `published_end`: the offset after the relay's last commit. atk51-25 F2: a topic made again
    under a running relay while events flowed got up to 2 s of them (its next positions) at
    offset 0 before the relay's check, committed: its "early copies", before the log published
    again from 1, stopped every default reader for good. Asked before the commit, such a batch is
    aborted: read_committed readers never see it."""
    if topic_id is None:
        return f"topic {topic} no longer exists (deleted)"
    if before.topic_id and topic_id and topic_id != before.topic_id:
        return (
            f"topic {topic} was deleted and made again (topic id {topic_id}, was {before.topic_id})"
        )
    if first is not None and first < published_end:
        return (
            f"topic {topic} took the relay's next record at offset {first:,}, below the "
            f"{published_end:,} it published to (made again)"
        )
    return None


START_GONE_HINT = (
    "publish to a new topic (GPULEDGER_KAFKA_TOPIC or --topic): the relay writes the whole log "
    "there; or delete the topic, and the relay makes it again and writes the whole log to it "
    "(a service's stopped relay looks every 5 s)"
)
"""What to do about a topic whose start is gone: the relay, `store restore --from-kafka` and
`audit verify --kafka` name the same fix."""


def start_gone(topic: str, begin: int) -> TopicRefused:
    """The relay's refusal of a topic whose first offset is above 0 (Kafka DeleteRecords, or a
    retention: the topic's are -1): readers and restores read a topic from its first offset, so
    it can no longer give them the whole log, and appending the log again cannot put its start
    back (the records left come first: a new reader stopped at them, a restore refused the
    topic for good). A RelayError, not retried: the service says `stopped` with this line."""
    return TopicRefused(
        f"the start of topic {topic} is gone (first offset {begin:,}: its records before it were "
        "deleted): it no longer holds the whole log, and the relay cannot put it back",
        hint=START_GONE_HINT,
    )
