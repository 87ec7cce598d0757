"""The relay's Kafka producer: made, committed with a bound, told fenced, discarded.

Split from `ledger.store.relay` (the relay's publishing and its bookmark stay there): the
transactional producer's settings, the commit that waits at most `timeout_s` (kafka-python's own
has no bound), whether an error means another relay took the transactional id, and closing a
producer without waiting long. An edge (the network).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from kafka import KafkaProducer
from kafka.errors import (
    InvalidProducerEpochError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
)

from ledger.store.relay_topic import producer_sizes
from projections.kafka_wire import client_config, patience


def new_producer(
    bootstrap: str,
    transactional_id: str,
    record_limit: int,
    timeout_s: float,
    connect_timeout_s: float,
    config: Mapping[str, Any],
) -> Any:
    """A transactional producer for the relay, its batches sized to the topic's `record_limit`
    (raises KafkaError when it cannot be made)."""
    ms = int(timeout_s * 1000)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=transactional_id,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        **producer_sizes(record_limit),  # the broker checks batches against it
        max_block_ms=ms,
        request_timeout_ms=min(ms, 30_000),
        delivery_timeout_ms=max(ms, 30_000) + 5_000,  # > linger + request timeout
        client_id="gpuledger-relay",
        # never make the topic by sending to it (a broker with Kafka's default
        # auto.create.topics.enable would make a deleted one with its own shape): the
        # relay makes it, with its settings (`ensure_topic`), atk50-25 F1
        allow_auto_create_topics=False,
        **patience(connect_timeout_s),
        **client_config(config),
    )
    no_epoch_bump(producer)
    return producer


def no_epoch_bump(producer: Any) -> None:
    """Turn off kafka-python's own recovery from a batch refused for its epoch (KIP-360: it
    bumps the epoch, and when the broker refuses that, initialises the transactional id afresh
    from its sender thread): under a lease, a refused epoch means another producer of the
    ledger's transactional id initialised since, and only the relay may decide, by the store's
    answer on the lease, whether to initialise again. A resumed ex-leader's batch in flight
    was refused and its client's fresh init fenced the new leader's relay (atk58 F5); the new
    leader's came back READY with its transaction lost ("Invalid transition ... READY to
    COMMITTING_TRANSACTION", taken for a broker outage). Off, the refusal is fatal: `fenced`."""
    manager = getattr(producer, "_transaction_manager", None)
    if manager is not None and hasattr(manager, "_supports_epoch_bump"):
        manager._supports_epoch_bump = lambda: False


INIT_STEP_S = 0.2
"""How long one wait on `init_transactions`' answer lasts before the relay looks at its stop."""


def init_transactions(
    producer: Any, timeout_s: float, goes_on: Callable[[], bool], stopped: Callable[[], bool]
) -> bool:
    """kafka-python's `init_transactions`, its answer waited for in steps of `INIT_STEP_S`
    (kafka-python: "retrying after a KafkaTimeoutError will continue to wait for the prior
    request"), at most `timeout_s` in all (then KafkaTimeoutError). False once `goes_on()` said
    no before the answer, or `stopped()` said yes and did not when it began (a flush's own
    connect waits till its deadline): the producer is to be discarded. Its own wait is
    `max_block_ms`, set when the producer was made: one begun before a stop waited its whole
    30 s, the broker down, and the stopping server's relay thread with it (stop 57's note)."""
    config = getattr(producer, "config", None)
    if not isinstance(config, dict) or "max_block_ms" not in config:  # another client version
        producer.init_transactions()
        return True
    block, end, began_stopped = config["max_block_ms"], time.monotonic() + timeout_s, stopped()
    try:
        while True:
            left = end - time.monotonic()
            config["max_block_ms"] = max(1, int(min(INIT_STEP_S, left) * 1000))
            try:
                producer.init_transactions()
                return True
            except KafkaTimeoutError:
                if left <= INIT_STEP_S:
                    raise
            if not goes_on() or (stopped() and not began_stopped):
                return False
    finally:
        config["max_block_ms"] = block


def commit(producer: Any, timeout_s: float) -> None:
    """Commit the producer's open transaction, waiting at most `timeout_s` for the broker.

    kafka-python's `commit_transaction()` waits for the EndTxn answer without a bound, so a broker
    lost between the flush and the commit would hold the relay (and the health it reports) until
    the broker returned. A commit that is not answered in time raises KafkaTimeoutError: the
    relay reopens, and the next producer's `init_transactions` completes or aborts the
    transaction before the position is read back from the topic, so nothing is lost or doubled.
    """
    manager, sender = (
        getattr(producer, "_transaction_manager", None),
        getattr(producer, "_sender", None),
    )
    if manager is None or sender is None:  # another client version: its own commit
        producer.commit_transaction()
        return
    result = manager.begin_commit()
    sender.wakeup()
    if not result.wait(timeout_ms=int(timeout_s * 1000)):
        raise KafkaTimeoutError(f"the broker did not answer the commit in {timeout_s:g} s")


def fenced(producer: Any, e: BaseException) -> bool:
    """Whether `e` means another producer took our transactional id.

    kafka-python raises ProducerFencedError once; later calls on the same producer raise a plain
    KafkaError ("... in an error state: ProducerFencedError"), so look at its last error too. A
    batch the broker refused for its epoch (another producer of the id initialised since, in
    the middle of a transaction) puts the producer in its KIP-360 recovery, BUMPING_PRODUCER_EPOCH,
    and the next send or commit fails with an IllegalStateError ("Cannot call send in state
    BUMPING_PRODUCER_EPOCH", "Invalid transition ..."): fenced too. It was taken for a broker
    outage, and the relay's health blamed the broker (atk58 F5).
    """
    if isinstance(e, (ProducerFencedError, InvalidProducerEpochError)):
        return True
    manager = getattr(producer, "_transaction_manager", None)
    if isinstance(getattr(manager, "last_error", None), (ProducerFencedError,
                                                          InvalidProducerEpochError)):  # fmt: skip
        return True
    bumping = getattr(manager, "is_bumping_epoch", None)
    return bool(callable(bumping) and bumping()) or "BUMPING_PRODUCER_EPOCH" in str(e)


def discard(producer: Any) -> None:
    """Close a producer without waiting long: a half-sent transaction is left to be aborted
    by the next producer's init_transactions (or by the broker's transaction timeout)."""
    try:
        producer.close(timeout=1)
    except KafkaError:
        # close() flushes first and gives up with the sender thread still running (a timeout,
        # or a batch the broker refused: "Future not done", which failed every reconnect and
        # `close()`, atk44z F4); stop it.
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            with contextlib.suppress(Exception):
                sender.force_close()
                sender.join(5)
