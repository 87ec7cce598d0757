"""The relay service's health: `<home>/relay.json` (`RelayHealth`), how `relay status` and
`gpuledger status` tell its lag, and the run of foreign transactions that held readers back
(`HeldRun`). Split from `ledger.store.relay_service` (the service that writes it) at its
800-line limit.

Pure but for `read_health`, `write_durably` and `_previous` (files).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, NamedTuple

import msgspec

# RelayError and offsets_text are relay_topic's, imported where used: that module loads the Kafka
# client (and the relay psycopg), and every server reads this one (its health) at its start

HEALTH_FILE = "relay.json"

RelayState = Literal["connecting", "publishing", "stalled", "unavailable", "stopped", "exited"]
"""`stalled`: a send or commit has not come back for `stall_s` while events wait; `stopped`:
an error retrying cannot fix; `exited`: the service stopped (after its flush)."""
DEFAULT_CHECK_S = 1.0
CHECK_LATE = 3
"""How many check intervals a live relay's topic may go unchecked before `relay status` says
how old its last check is, and claims no exact lag (`RelayHealth.unchecked_s`)."""
RELAY_STALE = "stale"
"""The relay state a standby's health tells when the leader's last report of its relay is older
than its reporting interval allows (`ledger.server.ha.relay_word_s`)."""
RELAY_UNREPORTED = "unreported"
"""The relay state a standby's health tells when the leader, of an earlier version (a rolling
upgrade), reports nothing of its relay to the store."""


def unreported_words(leader: str, kafka: str) -> str:
    """Pure: what a standby says of the relay of a leader of an earlier version."""
    return (
        f"the leader ({leader}) runs an earlier version, which does not report its relay to "
        f"the store (a rolling upgrade; this server relays to Kafka at {kafka} when it leads): "
        f"its position and lag are not known here; the leader's own health tells them "
        f"({leader}/v1/health)"
    )


SKIPPED_SHOWN = 10
"""Foreign offsets relay.json names (the rest a count): `RelayHealth.skipped`."""


class RelayHealth(msgspec.Struct, frozen=True, kw_only=True):
    """What the relay of a running service is doing: `<home>/relay.json`, rewritten when its
    state changes and about once a second while it publishes."""

    state: RelayState
    bootstrap: str
    topic: str
    position: int = 0
    """The last log position committed on the topic."""
    store_head: int = 0
    """The store's head when this was written."""
    error: str = ""
    """Why publishing stopped (state `unavailable`: retried; `stopped`: not retried)."""
    skipped: tuple[int, ...] = ()
    """Offsets of the first foreign records found after the relay's last record (skipped), at
    most `SKIPPED_SHOWN` of them: every one kept made relay.json 2.1 MB for 300,000 junk
    records, rewritten every few seconds (atk49-25 F7)."""
    foreign: int = 0
    """How many foreign records were skipped in all (0: as many as `skipped` names)."""
    remade: str = ""
    """The last time the relay found its topic deleted and made again (or truncated) under it:
    why; it published the store's log again from position 1 then (atk50-25 F1)."""
    remade_from: int = 1
    """The position the relay published the log again from after `remade`: 1, or m+1 where it
    found positions 1..m of the log on the topic made again already, in order (a relay of this
    ledger committed them there before it stopped or lost its lease: atk58 F2). It said
    "published again from position 1" there too (stop 58's closing note)."""
    again_to: int = 0
    """While the relay publishes the store's log again from position 1 (its topic deleted, made
    again or truncated under it: `remade`), the store's head when it began, until its position
    reaches it (0: it does not). atk54-25 F6: health said "unavailable" with the old error for
    16 s while the relay published the log again from 5,000 to 45,000."""
    appended: bool | None = None
    """Whether the topic stamps its records with the broker's append time (`LogAppendTime`, as
    the relay makes it), as read at the relay's last connect; False: the producer's time
    (`CreateTime`): the relay's progress names no time, and its bookmark is checked by its
    commit marker alone (`relay status` said nothing of it, stop 54); None: not known yet."""
    checked: float = 0.0
    """Wall-clock time the topic was last found to be the one the relay published to (the
    watcher's check every `check_s`, a connect or a commit; 0: not known). Older than
    `CHECK_LATE` checks, the position is no longer sure to be the topic's (atk55-25 F2: an
    idle relay under load saw a deleted topic only 4-28 s later, and said "publishing,
    0 behind" meanwhile)."""
    began: float = 0.0
    """Wall-clock time this relay service started (0: not known, a record from before it was
    kept). A relay that has not found its topic since (one that stopped at its start: a topic
    ahead of the store) counts its check's age from it: at least that old (`checked_s_ago`)."""
    topic_id: str = ""
    """The id of the topic the relay published to, as its last connect read it ("": unknown):
    `relay status` asks the broker for it when the record's check is old (`checked`)."""
    since: float = 0.0
    """Wall-clock time the state began."""
    updated: float = 0.0
    check_s: float = DEFAULT_CHECK_S
    """How often the service rewrites this record: older than a few of these, it is stale."""

    @property
    def lag(self) -> int:
        return max(0, self.store_head - self.position)

    @property
    def republishing(self) -> str:
        """While it publishes the log again from position 1, that and how far (else "")."""
        if not self.again_to or self.position >= self.again_to:
            return ""
        why = f" ({self.remade})" if self.remade else ""
        return (
            f"publishing the store's log again from {self.remade_text}{why}: position "
            f"{self.position:,} of {self.again_to:,}"
        )

    @property
    def remade_text(self) -> str:
        """Where the log was published again from: "position 1", or "position m+1 (positions
        1..m were on it already)"."""
        start = max(1, self.remade_from)
        kept = f" (positions 1..{start - 1:,} were on it already)" if start > 1 else ""
        return f"position {start:,}{kept}"

    def stale(self, now: float) -> bool:
        """Whether a running service should have rewritten this record by `now`."""
        late = 3 * self.check_s + 2
        # a record from the future (an edit, or a clock stepped back since it was written) is
        # no word either: it said `publishing`, exit 0, with no service (atk49-25 F10)
        return self.state != "exited" and abs(now - self.updated) > late

    def watched(self, now: float | None = None) -> bool:
        """Whether a live relay watches the topic, so that its position is the topic's: not
        while it connects (a topic found deleted at start is being written again from position
        1 while the record keeps the last one published), not once it stopped or exited (the
        topic may lose records since), not in a record no service updates, nor where its topic
        was not checked lately (`unchecked_s`)."""
        live = self.state in WATCHING
        return live and not (now is not None and (self.stale(now) or self.unchecked_s(now)))

    def checked_s_ago(self, now: float) -> float | None:
        """How long ago (s) the topic was last found the one the relay published to (None: not
        known, a record from before `checked` was kept): the one computation of the check's age
        that `relay status` (`unchecked_s`), `/v1/health` (`relay_checked_s_ago`) and `/metrics`
        (`gpuledger_relay_topic_checked_age_seconds`) tell. A relay that has not found its topic
        since it started counts from its start (`began`), whatever its state: a relay stopped
        at its start gave None, which reads as "no relay here" (atk60-ha)."""
        at = self.checked or self.began
        return max(0.0, now - at) if at else None

    def unchecked_s(self, now: float) -> float | None:
        """How long a live relay's topic has gone unchecked, when longer than `CHECK_LATE`
        checks (None: checked lately, or a record from before `checked` was kept)."""
        age = self.checked_s_ago(now)
        if age is None or self.state not in WATCHING:
            return None
        return age if age > CHECK_LATE * self.check_s + 1 else None

    def behind(self, now: float | None = None, head: int | None = None, unread: str = "") -> str:
        """How far the topic is behind the store, in words: `head` is the store's head read
        now (None: the record's own `store_head`). atk51-25 F3: "0 behind the store" was said
        from the record's head (0 while it connects, old in a record no service updates), over
        events never on the topic; where the position is not the topic's for sure (`watched`),
        the lag is a floor ("at least"), and none is claimed where it would be 0. `unread`: why
        the store's head could not be read now (no lag is claimed then either)."""
        if unread:
            return f"cannot tell how far behind the store ({unread})"
        head = self.store_head if head is None else head
        lag = max(0, head - self.position)
        unchecked = None if now is None or self.stale(now) else self.unchecked_s(now)
        if unchecked is not None:
            return (
                f"{lag:,} behind the store as of its topic's last check, {unchecked:,.0f} s "
                f"ago (it checks every {self.check_s:g} s: the topic may have been deleted or "
                "cut since)"
            )
        kind = lag_kind(lag, self.watched(now))
        if kind == "exact":
            return f"{lag:,} behind the store"
        if kind == "floor":
            return f"at least {lag:,} behind the store"
        return (
            f"cannot tell how far behind the store (its head is {head:,}; the relay is not "
            "watching the topic, which may have lost records since)"
        )

    def report(self, now: float, head: int | None, unread: str = "") -> dict[str, object]:
        """`relay status --json`: the record, and the lag as the line tells it, from the store's
        head read now (`head`; None: unread, `unread` says why). The record alone (its own
        `store_head`, 0 while connecting) was printed, so a script read "0 behind" where the
        line said "cannot tell" (s51)."""
        lag = None if head is None else max(0, head - self.position)
        kind = "unknown" if lag is None else lag_kind(lag, self.watched(now))
        record: dict[str, object] = msgspec.to_builtins(self)
        return record | {
            "head": head,
            "lag": lag if kind == "exact" else None,
            "lag_at_least": lag if kind == "floor" else None,
            "lag_known": kind,
            "behind": self.behind(now, head, unread),
            "stale": self.stale(now),
        }

    def line(self, now: float | None = None, head: int | None = None, unread: str = "") -> str:
        """`relay status`'s line; `head`, `unread`: the store's head read now (`behind`)."""
        state = str(self.state)
        if now is not None and self.stale(now):
            if self.updated > now:
                ahead = f"{self.updated - now:,.0f} s ahead of this host's clock"
                state = f"{state} (written {ahead}: no service updates it)"
            else:
                state = f"{state} (as of {now - self.updated:,.0f} s ago: no service updates it)"
        text = (
            f"relay {state}: {self.topic} at {self.bootstrap}, position {self.position:,}, "
            f"{self.behind(now, head, unread)}"
        )
        if self.skipped:
            from ledger.store.relay_topic import offsets_text

            count = max(self.foreign, len(self.skipped))
            shown = offsets_text(self.skipped)
            if count > len(self.skipped):
                shown += f", ... ({count - len(self.skipped):,} more)"
            text += f", {count:,} foreign record(s) skipped (offsets {shown})"
        if self.appended is False:
            text += (
                f"; topic {self.topic} keeps no append time (message.timestamp.type=CreateTime): "
                "the relay's progress names no time, and its last record is checked by its "
                "commit marker alone"
            )
        if self.republishing:
            text += f"; {self.republishing}"
        elif self.remade:
            text += f"; {self.remade}: published again from {self.remade_text}"
        return text + (f": {self.error}" if self.error else "")


LagKind = Literal["exact", "floor", "unknown"]


def lag_kind(lag: int, watched: bool) -> LagKind:
    """Pure: how a lag counted from the relay's last position may be told (`relay status`,
    `gpuledger status`): `exact` where a live relay watches the topic (publishing, stalled,
    unavailable); elsewhere (connecting: a topic found deleted is written again from 1 while the
    position is the last one published; stopped; exited; stale) a `floor` ("at least N") when
    above 0, and `unknown` where it would be 0 (atk51-25 F3: "0 behind" over a topic being
    written again)."""
    if watched:
        return "exact"
    return "floor" if lag else "unknown"


WATCHING = ("publishing", "stalled", "unavailable")
"""The states of a relay that watches its topic (`RelayHealth.watched`)."""


def health_path(home: Path) -> Path:
    return home / HEALTH_FILE


def read_health(home: Path) -> RelayHealth | None:
    """The health the service's relay last wrote (None: no relay ran in this home)."""
    try:
        return msgspec.json.decode(health_path(home).read_bytes(), type=RelayHealth)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        from ledger.store.relay_topic import RelayError

        raise RelayError(
            f"cannot read {health_path(home)}: {e}", hint="the service rewrites it; try again"
        ) from e


class HeldRun(NamedTuple):
    """Foreign transactions that held the topic's last stable offset back one after another,
    with no moment free between them (as `RelayService._watch_held` saw them). The broker's cap
    (`transaction.max.timeout.ms`) is per transaction: a writer opening a new one before the
    last ends keeps every reader behind for as long as it likes (atk47-25 F9: 35-60 s behind
    for 100 s, while `relay status` named one transaction)."""

    offsets: tuple[int, ...] = ()
    """The last stable offset each one held, in order."""
    since: float = 0.0
    """When the first was seen (monotonic)."""

    def seen(self, offset: int, at: float) -> HeldRun:
        """Pure: the run after an open transaction at `offset` was seen (first seen `at`)."""
        if self.offsets and self.offsets[-1] == offset:
            return self
        return HeldRun((*self.offsets, offset), self.since if self.offsets else at)

    def text(self, now: float) -> str:
        """Pure: what the status adds once more than one held the readers in a row."""
        if len(self.offsets) < 2:
            return ""
        return (
            f"; {len(self.offsets)} transactions in a row (offsets "
            f"{', '.join(map(str, self.offsets[-5:]))}) have held readers back for "
            f"{now - self.since:,.0f} s: the broker's cap is per transaction, so only ACLs "
            "that give no other principal Write on transactional ids stop it"
        )


def write_durably(tmp: Path, path: Path, data: bytes) -> None:
    """`data` as the file `path`, through `tmp`, surviving a crash of the machine: the file is
    synced before it replaces the old one (else a crash could leave the name on an empty file)
    and the directory after (else the replacement could be lost). The health carries the
    relay's progress (a home's word from before the store kept it)."""
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _previous(home: Path, topic: str) -> int | None:
    """The position the last service's relay left committed on `topic` (`<home>/relay.json`),
    this home's word on the relay's progress (the store keeps the ledger's: a home upgraded
    from before it did brings this); None: unknown (no readable health of this topic)."""
    from ledger.store.relay_topic import RelayError

    try:
        health = read_health(home)
    except RelayError:
        return None
    if health is None or health.topic != topic:
        return None
    return health.position


def not_ready(e: BaseException) -> bool:
    """Whether kafka-python's NodeNotReadyError is behind `e` (its cause, or named in it: a
    producer in an error state says so only in its message)."""
    from kafka.errors import NodeNotReadyError  # (here: every server's start reads this module)

    seen: BaseException | None = e
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, NodeNotReadyError) or "NodeNotReadyError" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def appended_of(relay: Any, known: bool | None) -> bool | None:
    """Whether the relay's topic stamps the broker's append time, as its last connect read it
    (`known`: the health's word, while no relay is connected)."""
    mark = None if relay is None else relay.mark
    return known if mark is None else mark.appended


def quiet_head(relay: Any, known: int) -> int:
    """The relay's store head (`known`, the last one read, when its store does not answer: 0
    said "its head is 0" with PostgreSQL down, atk56-25 F3)."""
    try:
        return int(relay.store_head())
    except Exception:
        return known


def unsure_text(topic: str, position: int, topic_id: str | None = None) -> str:
    """Pure: why a relay's `position` is not known to be its topic's (before its first connect:
    the store's progress row, naming `topic_id`, or the home's relay.json). A new leader said
    `connecting` (and `unavailable` while the broker was away), `relay_lag 0` and the /metrics
    gauge 0 from a row naming a topic id since deleted, the topic 25,000-30,000 short (atk58
    F4): no lag is told from it."""
    named = f" (on topic id {topic_id})" if topic_id else ""
    return (
        f"lag unknown: position {position:,} is the relay's last commit as the store (or this "
        f"home) keeps it{named}, not yet read back from topic {topic}: the relay has not "
        "connected, and the topic may have been deleted or made again since"
    )
