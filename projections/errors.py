"""Errors of the read side. All are `LedgerError`s: one clear line, a hint, typed fields."""

from __future__ import annotations

from schemas.errors import EventDecodeError, LedgerError


class ProjectionError(LedgerError):
    """Something is wrong with a projection store or its source."""

    code = "projection"


class SourceUnavailable(ProjectionError):
    """The event log cannot be opened or read."""

    code = "unavailable"


class ProjectionBusy(ProjectionError):
    """Another process holds the projection file (DuckDB allows one read-write process)."""

    code = "busy"


class ProjectionMismatch(ProjectionError):
    """The projection does not fit the log or this code (ahead of the log, older schema)."""

    code = "mismatch"


class ProjectionOutdated(ProjectionMismatch):
    """The projection file was made by code with another schema version. It is derived from the
    log: a writer makes it again (`projections.store.Store.open`), a reader asks for that."""


class CorruptEvent(EventDecodeError):
    """A record of the log that this code cannot apply: the projector stops at it.

    `position` names the record; nothing after it is applied and nothing is skipped.
    """

    def __init__(
        self, message: str, *, position: int, tag: str | None, known: bool, hint: str = ""
    ) -> None:
        super().__init__(message, tag=tag, known=known, position=position, hint=hint)
        self.position = position


class PoisonRecord(EventDecodeError):
    """A record of a Kafka topic that is not a well-formed log record: no value, no tag header,
    a missing, garbled or out-of-order position header. Named by where it sits in the topic.

    The source stops right before it (the records before it are handed out); nothing after it is
    read. In quarantine mode the projector records it in `dead_letters` and steps past it.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str,
        partition: int,
        offset: int,
        position: int | None,
        tag: str | None,
        reason: str,
        data: bytes | None,
        hint: str = "",
    ) -> None:
        super().__init__(
            message,
            tag=tag,
            known=False,
            hint=hint,
            topic=topic,
            partition=partition,
            offset=offset,
            position=position,
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.position = position
        self.reason = reason
        self.data = data


class LogForked(ProjectionError):
    """Two records of a copy of the log (the Kafka topic) claim one position and both link to
    the record before it: one of them was not written by the relay, and the reader cannot tell
    which without signing keys (or the relay's keys were used by someone else). The reader
    stops at the second one, naming both; nothing after it is applied."""

    code = "fork"


class SigningKeyMismatch(ProjectionError):
    """Records that continue the log one after the other all fail the signature check: the
    reader's keys are not the relay's (or the topic is not signed). The reader stops."""

    code = "key"


def wrong_keys(topic: str, what: str, position: int, after: int) -> SigningKeyMismatch:
    """`what` (records of `topic`, the last at `position`) fails the signature check although
    it is the relay's: the reader's keys are wrong; nothing after `after` is applied."""
    return SigningKeyMismatch(
        f"topic {topic}: {what}: these signing keys are not the relay's",
        hint="give the reader the relay's GPULEDGER_KAFKA_SIGNING_KEYS (or none, when the relay "
        "does not sign; a topic the relay began unsigned, signing turned on since, is read with "
        "none: move the relay and keyed readers to a new topic, docs/kafka.md); nothing after "
        f"position {after} is applied",
        topic=topic,
        position=position,
    )


class TopicGap(ProjectionError):
    """A quarantining reader set aside records the relay signed for positions it never reached:
    the topic lacks the positions before them (its start deleted, or it was made again)."""

    code = "gap"


class QuarantineStopped(ProjectionError):
    """A quarantining reader set aside this many records in a row: it stops rather than set
    aside a run of real records and report success."""

    code = "quarantine"
