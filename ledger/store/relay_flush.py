"""A stopping relay service's flush: every event committed before `stop()` published within
`flush_s`, while the lease (if any) is its server's, and said so only over the topic it
published to.

Split from `ledger.store.relay_service` (the service's threads, its health and its rounds stay
there). An edge (the network, the store).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ledger.store.relay import ConnectEnded, Relay, RelayError, RelayUnavailable

if TYPE_CHECKING:
    from ledger.store.relay_service import RelayService

log = logging.getLogger("gpuledger.relay")


def flush(service: RelayService) -> None:
    """Publish what was committed before stop(), within `flush_s` (its deadline ends the
    round under way too), while the lease (if any) is this server's."""
    deadline = service._deadline or time.monotonic() + service.flush_s
    while service._going_on() and not service._cut:
        try:
            published = service._publish()
            relay = service.relay
            assert relay is not None
            if relay.position >= relay.store_head():
                flushed(service, relay, published)
                return
        except ConnectEnded:  # the flush's deadline passed while it connected
            break
        except RelayError as e:
            if not service._going_on():  # the lease went meanwhile: no fault (atk56-25 F3)
                log.info("relay: round ended, the lease is another server's: %s", e.line())
                break
            if not isinstance(e, RelayUnavailable):
                log.error("relay stopped: %s", e.line())
                service._set("stopped", error=e.line())
                return
            service._unavailable(e)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    head = service._store_head()
    if head <= service.health.position:
        return
    log.error(
        "relay: %d event(s) not published at exit (topic at position %d, store at %d): the "
        "next relay publishes them",
        head - service.health.position,
        service.health.position,
        head,
    )


def flushed(service: RelayService, relay: Relay, published: int) -> None:
    """Say the flush is done: "flushed" only over a topic found the one the relay published
    to since the watcher's last interval (a commit of this round, or asked now); it said
    "flushed" 4 s after the topic was deleted, an idle relay not having looked (atk56-25
    F3)."""
    from ledger.store.relay_topic import same_topic  # looked up now (tests replace it)

    late = not published and service.clock.now() - service._checked > service.check_s + 1
    mark = relay.mark
    if late and not (mark and same_topic(service.bootstrap, service.topic, mark.topic_id, 2.0)):
        log.warning("relay: topic %s is not the one the relay published to (deleted or made "
                    "again): not flushed; the next relay publishes the store's log to it",
                    service.topic)  # fmt: skip
        return
    log.info("relay: flushed, topic at position %d", relay.position)
