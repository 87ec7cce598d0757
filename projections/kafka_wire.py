"""The log on Kafka, as the relay writes it and every reader reads it: one module for both sides.

- **The topic** `gpuledger.events`: one partition (`PARTITION`, so Kafka keeps the log order),
  unlimited retention and delete policy (`TOPIC_CONFIG`; every record has the same key, so
  compaction would keep only the last one).
- **A record** per event: value = the stored event bytes, untouched; headers
  `gpuledger.position` (the log position, ASCII decimal) and `gpuledger.tag` (the event tag),
  and with signing keys `gpuledger.key` (the key id) and `gpuledger.sig` (the signature, see
  below). `record_headers` writes them, `envelope` reads them back (never raising, whatever
  they hold), `SigningKeys.problem` checks a signature.
- **Client settings** every client shares: security settings (SASL, SSL) from
  `GPULEDGER_KAFKA_<KEY>` environment variables (`client_config`), a bounded connect
  (`connect_timeout`, `patience`, `unreachable`) and kafka-python's logs kept quiet.

Signing: the hash chain (`projections.chain`) cannot tell the relay from someone who read the
topic and computed the right `prev_hash`; a signature can. The relay adds an HMAC-SHA256 under a
key it shares with the readers, named by a key id so keys can be rotated (readers accept every
id they know, the relay signs with one). The signature header names its version:

- **v2** (`v2:<hex>`, what the relay writes): the HMAC of `chain.frame(position, tag, value)`:
  the position and tag headers and the value (whose `prev_hash` is the previous hash), so a
  signed record copied under another position or tag header no longer verifies;
- **v1** (`<hex>`, older topics): the HMAC of the value alone. Accepted only on a record of the
  v1 chain (its `prev_hash` is a v1 link): a record of the v2 chain must carry a v2 signature.

Keys come from `GPULEDGER_KAFKA_SIGNING_KEYS` (`id:secret[,id:secret...]`, the first is the one
the relay signs with); without it nothing is signed or checked.

Pure, except the functions that read the environment (`client_config`, `connect_timeout`,
`env_seconds`, `signing_keys`), open a socket (`unreachable`) or set a logger's level. This
module never imports `ledger`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from projections.chain import frame, prev_hash, rule
from schemas.errors import InvalidCommand

TOPIC = "gpuledger.events"
"""The topic the relay publishes and readers follow (`TOPIC_ENV` overrides it)."""
TOPIC_ENV = "GPULEDGER_KAFKA_TOPIC"
"""The environment variable that names another topic, for every writer and reader alike."""


def topic() -> str:
    """The topic: `$GPULEDGER_KAFKA_TOPIC`, else `TOPIC` (the CLI's `--topic` options read the
    same variable)."""
    return os.environ.get(TOPIC_ENV) or TOPIC


PARTITION = 0
"""The topic has exactly one partition: that is what keeps the log's order."""
RECORD_MAX_BYTES = 8 << 20
"""The largest record the relay's topic takes (`max.message.bytes`, set when the relay creates
the topic; Kafka's default is 1,048,588): more than any event a store holds, an older one's
included (requests were at most 4 MiB before events were bounded to
`schemas.bounds.MAX_EVENT_BYTES`, 900 KiB), so no stored event stops the relay (atk44-25 F8).
The relay's producer sends requests of up to 16 MiB (`max_request_size`)."""
RECORD_OVERHEAD = 4096
"""What a record adds to its event's bytes, at most: key, headers, batch framing."""
TOPIC_CONFIG = {
    "retention.ms": "-1",  # the broker default deletes events after 7 days
    "retention.bytes": "-1",
    "cleanup.policy": "delete",  # never compact: every record has the same key (the stream id)
    # the broker stamps each batch with its clock at the append, which no producer chooses: the
    # relay keeps its last record's time in its signed progress (`relay_tail.stamped`)
    "message.timestamp.type": "LogAppendTime",
    "max.message.bytes": str(RECORD_MAX_BYTES),
    # Replication factor and min.insync.replicas come from the broker's defaults, so acks=all
    # means what the cluster's operators set (1 on the development broker).
}
REQUIRED_CONFIG = ("retention.ms", "retention.bytes", "cleanup.policy")
"""Topic settings an existing topic must have, or the topic is not a full copy of the log."""

POSITION_HEADER = "gpuledger.position"
"""The record's log position, ASCII decimal."""
TAG_HEADER = "gpuledger.tag"
"""The record's event tag."""
SIGNATURE_HEADER = "gpuledger.sig"
"""The record's signature under the key named by KEY_HEADER: `v2:` + the HMAC-SHA256 (hex) of
its position, tag and value (`chain.frame`), or, on older topics, the HMAC of its value alone."""
SIGNATURE_V2 = "v2:"
KEY_HEADER = "gpuledger.key"
"""The id of the signing key."""
KEYS_ENV = "GPULEDGER_KAFKA_SIGNING_KEYS"
RELAY_HEADERS = frozenset({POSITION_HEADER, TAG_HEADER, KEY_HEADER, SIGNATURE_HEADER})
"""The headers a relay's record carries (`record_headers`), each once."""

SECURITY_KEYS = (
    "security_protocol",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
)
"""Client settings read from GPULEDGER_KAFKA_<KEY>."""
DEFAULT_CONNECT_TIMEOUT_S = 3.0
"""How long finding a broker may take before it counts as unreachable (the 30 s of kafka-python's
default made an unreachable broker take half a minute to report)."""


# --- records ------------------------------------------------------------------------------------


def record_headers(
    position: int, tag: str, data: bytes, keys: SigningKeys | None = None
) -> list[tuple[str, bytes]]:
    """Pure: the headers of the record of the event stored at `position` with `tag` and bytes
    `data`: its position and tag, and with signing keys its key id and HMAC."""
    headers = [(POSITION_HEADER, str(position).encode()), (TAG_HEADER, tag.encode())]
    if keys is not None:
        headers += keys.sign(position, tag, data)
    return headers


def relay_shaped(headers: Iterable[tuple[str, bytes | None]] | None) -> bool:
    """Pure: whether `headers` could be a relay record's: only the relay's headers, each once (a
    second tag header, or one the relay never writes, is another producer's: atk49-25 F1)."""
    names = [k for k, _v in headers or ()]
    return len(names) == len(set(names)) and RELAY_HEADERS.issuperset(names)


def envelope(
    headers: Iterable[tuple[str, bytes | None]] | None, value: bytes | None, previous: int | None
) -> tuple[int | None, str | None, str | None]:
    """Pure: (position, tag, problem) of a record's headers and value; `problem` is None when the
    record is a well-formed log record whose position is `previous + 1` (any position when
    `previous` is None). Never raises, whatever the headers hold."""
    positions: list[bytes | None] = []
    tags: list[bytes | None] = []
    for k, v in headers or ():
        if k == POSITION_HEADER:
            positions.append(v)
        elif k == TAG_HEADER:
            tags.append(v)
    position = tag = None
    if len(tags) == 1 and tags[0]:
        try:
            tag = tags[0].decode("ascii")
        except UnicodeDecodeError:
            tag = None
    if len(positions) != 1:
        what = "no" if not positions else f"{len(positions)}"
        return None, tag, f"{what} {POSITION_HEADER} header{'s' if positions else ''}"
    raw = positions[0] or b""
    if not (raw.isdigit() and raw[:1] != b"0"):
        return None, tag, f"garbled {POSITION_HEADER} header {raw!r}"
    position = int(raw)
    if previous is not None and position != previous + 1:
        return position, tag, f"position {position} does not follow position {previous}"
    if tag is None:
        problem = f"no {TAG_HEADER} header" if not tags else f"garbled {TAG_HEADER} header"
        return position, None, problem
    if value is None:
        return position, tag, "no value"
    return position, tag, None


def header_position(headers: Iterable[tuple[str, bytes | None]] | None) -> int | None:
    """Pure: the position a record's headers carry (None: none readable). Never raises."""
    return envelope(headers, b"", None)[0]


# --- signing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SigningKeys:
    """Named HMAC keys: `signer` signs, every key in `keys` verifies."""

    keys: Mapping[str, bytes]
    signer: str

    def sign(self, position: int, tag: str, data: bytes) -> list[tuple[str, bytes]]:
        """Pure: the headers that sign the record of `data` at `position` with `tag` (v2)."""
        mac = _mac(self.keys[self.signer], frame(position, tag, data))
        return [(KEY_HEADER, self.signer.encode()), (SIGNATURE_HEADER, SIGNATURE_V2.encode() + mac)]

    def problem(
        self,
        headers: Iterable[tuple[str, bytes | None]] | None,
        data: bytes | None,
        position: int | None,
        tag: str | None,
    ) -> str | None:
        """Pure: why a record is not signed by one of our keys (None: it is). `position` and
        `tag` are what its headers say (`envelope`): a v2 signature covers them."""
        ids = [v for k, v in headers or () if k == KEY_HEADER]
        sigs = [v for k, v in headers or () if k == SIGNATURE_HEADER]
        if not ids or not sigs:
            return "not signed (no gpuledger.key / gpuledger.sig header)"
        if len(ids) != 1 or len(sigs) != 1 or ids[0] is None or sigs[0] is None or data is None:
            return "garbled signature headers"
        key_id = ids[0].decode("utf-8", "replace")
        key = self.keys.get(key_id)
        if key is None:
            return f"signed with unknown key id {key_id!r}"
        sig = sigs[0]
        if sig.startswith(SIGNATURE_V2.encode()):
            if position is None or tag is None:
                return "a v2 signature on a record without its position and tag headers"
            mac = _mac(key, frame(position, tag, data))
            sig = sig[len(SIGNATURE_V2) :]
        else:
            if rule(prev_hash(data) or "") == 2:
                return "a v1 signature (the value only) on a record of the v2 chain"
            mac = _mac(key, data)
        if not hmac.compare_digest(mac, sig):
            return f"signature does not match key id {key_id!r}"
        return None


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).hexdigest().encode()


def is_signature_problem(problem: str) -> bool:
    """Pure: whether `problem` (of `SigningKeys.problem`) is about the signature alone."""
    return problem.startswith(
        ("not signed", "signed with unknown", "signature does not", "a v1 sig")
    )


_KEYS_HINT = "give id:secret pairs separated by commas; the first one signs"


def parse_keys(text: str) -> SigningKeys | None:
    """`id:secret[,id:secret...]` (the first signs); None for an empty string.

    Raises InvalidCommand naming what is wrong (never the secret)."""
    keys: dict[str, bytes] = {}
    order: list[str] = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        if not part:
            continue
        key_id, sep, secret = part.partition(":")
        if not sep or not key_id or not secret:
            raise InvalidCommand(f"{KEYS_ENV}: key {i + 1} is not ID:SECRET", hint=_KEYS_HINT)
        if key_id in keys:
            raise InvalidCommand(f"{KEYS_ENV}: key id {key_id!r} given twice", hint=_KEYS_HINT)
        keys[key_id] = secret.encode()
        order.append(key_id)
    if not keys:
        return None
    return SigningKeys(keys, order[0])


def signing_keys(environ: Mapping[str, str] | None = None) -> SigningKeys | None:
    """The keys in GPULEDGER_KAFKA_SIGNING_KEYS (None: signing is off)."""
    env = os.environ if environ is None else environ
    return parse_keys(env.get(KEYS_ENV, ""))


# --- clients ------------------------------------------------------------------------------------


def client_config(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Security settings from GPULEDGER_KAFKA_* environment variables, then `extra` on top,
    e.g. GPULEDGER_KAFKA_SECURITY_PROTOCOL=SASL_SSL."""
    cfg: dict[str, Any] = {}
    for k in SECURITY_KEYS:
        v = os.environ.get(f"GPULEDGER_KAFKA_{k.upper()}")
        if v is not None:
            cfg[k] = v if k != "ssl_check_hostname" else v.lower() in ("1", "true", "yes")
    cfg.update(extra or {})
    return cfg


def patience(timeout_s: float) -> dict[str, int]:
    """Client settings that bound how long a connect may take and keep reconnects quick.

    kafka-python's defaults back off up to 30 s between reconnects and wait 30 s to bootstrap,
    so a broker back after a restart would sit unused for up to half a minute.
    """
    return {"bootstrap_timeout_ms": int(timeout_s * 1000), "reconnect_backoff_max_ms": 1_000}


def reader_config(
    bootstrap: str, client_id: str, connect_timeout_s: float, **extra: Any
) -> dict[str, Any]:
    """The settings of a consumer that reads the log: committed records only (the relay writes
    in transactions, and an aborted half batch must never be read), no group and no committed
    offsets (a reader keeps its own position), never creating the topic (the relay creates it,
    with unlimited retention), a bounded connect, and the security settings of the environment,
    `extra` on top."""
    return {
        "bootstrap_servers": bootstrap,
        "client_id": client_id,
        "group_id": None,
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
        "allow_auto_create_topics": False,
        **patience(connect_timeout_s),
        **client_config(extra),
    }


def connect_timeout() -> float:
    """GPULEDGER_KAFKA_CONNECT_TIMEOUT (seconds), default DEFAULT_CONNECT_TIMEOUT_S."""
    return env_seconds("GPULEDGER_KAFKA_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT_S)


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable `name` (`default` when it is
    unset or empty); InvalidCommand otherwise."""
    text = os.environ.get(name, "")
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidCommand(f"invalid {name} {text!r}", hint="give seconds, e.g. 3")
    return value


def unreachable(bootstrap: str, timeout_s: float) -> str | None:
    """None when some `host:port` of `bootstrap` accepts a TCP connection within `timeout_s`,
    else why none does. A refused connection answers at once, where kafka-python would retry
    until its bootstrap timeout."""
    problems = []
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection(
                (host.strip("[]"), int(port)), timeout=timeout_s / max(1, len(servers))
            ):
                return None
        except (OSError, ValueError) as exc:
            problems.append(
                f"{server}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"
            )
    return "; ".join(problems) or "no host:port given"


_API_VERSIONS = (
    (18).to_bytes(2, "big")
    + (0).to_bytes(2, "big")
    + (0x6C6B).to_bytes(4, "big")
    + b"\x00\x05probe"
)
"""An ApiVersions v0 request (correlation id 0x6c6b, client id `probe`): every broker answers
it, before authentication too."""


def unanswered(bootstrap: str, timeout_s: float) -> str | None:
    """None when some `host:port` of `bootstrap` answers a real Kafka request (ApiVersions)
    within `timeout_s`, else why none does: a hung broker (SIGSTOP, a full disk) still accepts
    TCP connections, so `unreachable` alone calls it up. Over SSL it is `unreachable` (the
    request would need the handshake)."""
    if str(client_config().get("security_protocol", "")).upper().endswith("SSL"):
        return unreachable(bootstrap, timeout_s)
    problems = []
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            each = timeout_s / max(1, len(servers))
            with socket.create_connection((host.strip("[]"), int(port)), timeout=each) as sock:
                sock.settimeout(each)
                sock.sendall(len(_API_VERSIONS).to_bytes(4, "big") + _API_VERSIONS)
                answer = b""
                while len(answer) < 8:
                    got = sock.recv(8 - len(answer))
                    if not got:
                        raise OSError("the connection was closed without an answer")
                    answer += got
                if answer[4:8] == _API_VERSIONS[4:8]:
                    return None
                problems.append(f"{server}: not a Kafka answer")
        except TimeoutError:
            problems.append(f"{server}: accepts connections but does not answer in {each:g} s")
        except (OSError, ValueError) as exc:
            problems.append(
                f"{server}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"
            )
    return "; ".join(problems) or "no host:port given"


def quiet_kafka_logs(level: str) -> None:
    """kafka-python logs every failed reconnect, with tracebacks, while a broker is away: keep
    its logger out of the terminal unless the level is DEBUG (our own lines say what failed)."""
    quiet = level.upper() != "DEBUG"
    logging.getLogger("kafka").setLevel(logging.CRITICAL + 1 if quiet else logging.DEBUG)
