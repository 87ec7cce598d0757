"""Following a topic: `follow()` keeps a projection up to date with its source (the loop of
`gpuledger project follow`; `KafkaSource` is `projections.kafka_source`'s).

This module never imports `ledger`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from projections.errors import SourceUnavailable
from projections.kafka_source import KafkaSource
from projections.projector import CatchUp, Progress, Projector

log = logging.getLogger("gpuledger.kafka_source")


def follow(
    projector: Projector,
    stop: threading.Event,
    *,
    until: int | None = None,
    once: bool = False,
    wait_s: float = 0.5,
    progress: Progress | None = None,
    on_error: Callable[[SourceUnavailable], None] | None = None,
) -> int:
    """Keep `projector`'s store up to date with its source until `stop` is set; returns the
    tracked position at the end.

    `until`: return once the projection reaches that position. `once`: return after catching up
    with the log as it is now (a topic: every record before its end offset at the start).
    Between catch-ups it blocks in the source's long poll (`wait`),
    so a new event is applied as soon as the broker hands it out. A broker that is away is
    reported to `on_error` once per outage and retried (backing off 0.2 s to 2 s; the retries are
    logged at DEBUG level); poison stops the loop with its error, unless the projector
    quarantines it.
    """
    source = projector.source
    delay = 0.2
    position = projector.store.position()
    end: int | None = None  # --once: the topic's end offset at the first catch-up
    failing = False

    def failed(err: SourceUnavailable) -> None:
        nonlocal failing
        if not failing and on_error is not None:
            on_error(err)
        else:
            log.debug("still unavailable: %s", err.line())
        failing = True

    while not stop.is_set():
        try:
            result: CatchUp = projector.catch_up(until=until, progress=progress)
        except SourceUnavailable as err:  # poison and mismatches end the loop
            failed(err)
            stop.wait(delay)
            delay = min(delay * 2, 2.0)
            continue
        if failing:
            log.warning("kafka: reachable again, at position %d", result.position)
            failing = False
        delay = 0.2
        position = result.position
        if until is not None and position >= until:
            break
        # --once: to the topic's end as of the start, not its last record's claim (atk46-25 F5)
        if once:
            kafka = source if isinstance(source, KafkaSource) and source._head else None
            end = end if end is not None or kafka is None else kafka._head[0]  # type: ignore[index]
            if kafka is None or end is None or not result.applied or kafka.read_to(end):
                break
        if result.applied == 0 or position >= result.head:
            waiter = getattr(source, "wait", None)
            try:
                if waiter is None:
                    stop.wait(wait_s)
                else:
                    waiter(position, wait_s)
            except SourceUnavailable as err:
                failed(err)
                stop.wait(delay)
    return position
