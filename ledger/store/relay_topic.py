"""The relay raising its topic's record limit (`max.message.bytes`) when an older topic would
refuse a stored event: the relay's own topic, created before the relay set the limit at its
creation (atk44-25 F8: a 1.2 MB event, taken before events were bounded, stopped the relay for
good on a topic with Kafka's default 1,048,588 bytes). Incremental: no other setting changes."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError

from projections.kafka_wire import RECORD_MAX_BYTES, client_config, patience

log = logging.getLogger("gpuledger.relay")


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
