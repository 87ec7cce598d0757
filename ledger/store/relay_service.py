"""The relay as a service runs it: in its own thread, never blocking scheduling, never silent.

`RelayService` runs a `ledger.store.relay.Relay` next to the dispatcher (`gpuledger up
--kafka`, `gpuledger serve --kafka`): every error is logged (once per outage) and kept in its
health (`<home>/relay.json`, `gpuledger relay status`); scheduling never waits on it; `stop()`
flushes every committed event (bounded by GPULEDGER_KAFKA_FLUSH_TIMEOUT).

The health is truthful within its check interval (`check_s`): a watcher thread rewrites it every
interval from what it sees itself, not from what the publishing thread last said: the store's
head (its own read-only connection), the last position committed on the topic, a send or commit
that has not come back for `stall_s` (`stalled`, with the lag), a broker that stops answering
while there is nothing to send (`unavailable`: it asks the broker for its API versions, so
a hung broker that still accepts connections counts), and a stopped service (`exited`). A
relay `stopped` by an error or `connecting` is rewritten as it stands (atk52-25 F3).
`relay status` calls health older than a few intervals stale.

An edge (threads, the network, a file).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from eventsourcing.persistence import ApplicationRecorder

from ledger.store.clock import SystemClock
from ledger.store.relay import (
    DEFAULT_TIMEOUT_S,
    ConnectEnded,
    RawSource,
    Relay,
    RelayError,
    RelayFenced,
    RelayUnavailable,
    open_store,
)
from ledger.store.relay_flush import flush
from ledger.store.relay_health import (
    DEFAULT_CHECK_S,
    SKIPPED_SHOWN,
    HeldRun,
    RelayHealth,
    RelayState,
    _previous,
    appended_of,
    health_path,
    not_ready,
    quiet_head,
    unsure_text,
    write_durably,
)
from ledger.store.relay_topic import TopicRefused, transactional_id_for
from ledger.store.snapshots import state_key
from projections.kafka_wire import (
    DEFAULT_CONNECT_TIMEOUT_S,
    TOPIC,
    SigningKeys,
    env_seconds,
    signing_keys,
    unanswered,
)

DEFAULT_FLUSH_S = 10.0
MARK_EVERY_S = 10.0
"""How often a service's watcher asks for its topic's offsets and settings (three requests more)
while the topic's id, asked every check, is the one the relay published to."""

log = logging.getLogger("gpuledger.relay")


def flush_timeout() -> float:
    """GPULEDGER_KAFKA_FLUSH_TIMEOUT (seconds): how long a stopping service may wait to publish
    its last events; default DEFAULT_FLUSH_S."""
    return env_seconds("GPULEDGER_KAFKA_FLUSH_TIMEOUT", DEFAULT_FLUSH_S)


class RelayService:
    """The relay in its own thread, as `gpuledger up --kafka` runs it next to the dispatcher.

    It never blocks the caller and never dies silently: connecting (which can take
    `connect_timeout_s` when the broker is away) and publishing happen in the thread; a broker
    error is logged once per outage (warning) and retried; a failure that retrying cannot fix
    (fenced, a topic of another ledger) stops publishing with an error. Either way the state is
    in `health` and in `<home>/relay.json`, and scheduling goes on from the store.

    `stop()` flushes: every event committed before it is published before it returns, or the
    `flush_s` bound passes (then the next relay publishes them, and it says so).
    """

    def __init__(
        self,
        home: Path,
        bootstrap: str,
        *,
        topic: str = TOPIC,
        transactional_id: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        flush_s: float = DEFAULT_FLUSH_S,
        interval_s: float = 0.05,
        keys: SigningKeys | None = None,
        check_s: float = DEFAULT_CHECK_S,
        stall_s: float | None = None,
        mark_every_s: float = MARK_EVERY_S,
        may_act: Callable[[], bool] | None = None,
        holds: Callable[[], bool] | None = None,
        after: RelayService | None = None,
    ) -> None:
        self.home = home
        self.bootstrap = bootstrap
        self.topic = topic
        self.transactional_id = transactional_id or transactional_id_for(topic)
        """Its Kafka transactional id (None: one per topic, `transactional_id_for`)."""
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.flush_s = flush_s
        self.interval_s = interval_s
        self.check_s = check_s
        self.stall_s = max(2 * check_s, 2.0) if stall_s is None else stall_s
        """A send or commit out this long while events wait is `stalled`."""
        self.keys = keys if keys is not None else signing_keys()
        self.mark_every_s = mark_every_s
        """How often the watcher asks for the topic's offsets and settings while its id stays
        the one the relay published to (`_watch_topic`)."""
        self._marked_at = 0.0
        self.may_act = may_act
        """The lease this server leads by (None: no lease): once false the round ends at once,
        uncommitted, and nothing is flushed (the next leader's relay publishes it)."""
        self.holds = holds
        """The store's answer on that lease (None: no lease), asked before the producer's init
        and each transaction (`Relay`), and when fenced: an ex-leader's relay gives up quietly,
        the leader's connects again at once (atk58 F5)."""
        self._refenced = 0  # fenced in a row under the lease: the first reconnect waits for none
        self._after = after
        """This server's previous relay (stopped on a step-down): this one connects only once
        its thread ended (two of one process fenced each other: atk55-25 F3)."""
        self._flushing = True
        self._cut = False
        self._checked = 0.0
        """When its topic was last found the one the relay published to (`RelayHealth.checked`)."""
        """The connect under way at the stop was cut, its broker silent: the flush tries none."""
        """Whether `stop()` flushes (a step-down does not: `stop(flush=False)`)."""
        self._deadline: float | None = None
        """When a stopping service's last round ends (monotonic): `stop()`'s time + `flush_s`."""
        self.relay: Relay | None = None
        self._recorder: ApplicationRecorder | None = None
        self.clock = SystemClock()
        now = self.clock.now()
        previous = _previous(home, topic)
        self._published = previous or 0
        """The last position known committed on the topic (kept when a relay is replaced; read
        back from the health the last service left, and written on: it is this home's word on
        the relay's progress, which decides which unsigned records on the topic may be its own;
        the store's word, which every server shares, is the relay's own: `relay_progress`)."""
        self._progress_known = previous is not None
        self._word: int | None = None
        """Before the relay's first connect, the position the store's progress row names (every
        server's relay writes it; verified, within the head; `_read_word`): shown, not the
        home's relay.json, which another server's relay may have left far behind or ahead."""
        self._word_id: str | None = None  # the topic id the row names
        self._remakes = 0
        """The relay's `remakes` last seen: when it grows, its position went back to 1."""
        """A health file of this topic was found: `_published` is this home's progress."""
        self._remade_why: str | None = None
        """Why the next relay made publishes from position 1 (`_topic_changed`)."""
        self._again_to = 0
        """The store's head when the relay began to publish the log again from position 1,
        until it reaches it (`RelayHealth.again_to`)."""
        self.health = RelayHealth(
            state="connecting",
            bootstrap=bootstrap,
            topic=topic,
            position=self._published,
            began=now,
            since=now,
            updated=now,
            check_s=check_s,
        )
        self._stop = threading.Event()
        self._worded = threading.Event()
        self._thread = threading.Thread(target=self._main, name="relay", daemon=True)
        self._watcher = threading.Thread(target=self._watch, name="relay-health", daemon=True)
        self._lock = threading.Lock()
        """Held while the health is replaced and written (two threads write it)."""
        self._written = 0.0
        self._busy_since: float | None = None
        """When the publishing call under way began (None: none is)."""
        self._probed_down = False
        """The watcher found the broker unreachable while nothing was being sent."""
        self._not_ready_since: float | None = None
        """When the client's connections first said NodeNotReadyError in a row (`_quiet`)."""
        self._held: str | None = None
        """Why readers are stalled though the relay publishes (another producer's open
        transaction on the topic), as `_watch_held` last found it (every `held_every_s`)."""
        self._held_shown: str | None = None
        self.held_every_s = max(check_s, 5.0)
        self._holder = threading.Thread(target=self._watch_held, name="relay-held", daemon=True)

    def start(self) -> RelayService:
        """The threads started, once the store's progress row is read (`_read_word`, the
        thread's first step, waited for up to `connect_timeout_s`): a new leader's first
        health showed its relay.json's position for a moment (atk55-25 F7: a lag of 55,036)."""
        self._thread.start()
        self._worded.wait(self.connect_timeout_s)
        with self._lock:
            self._write()
        self._watcher.start()
        self._holder.start()
        return self

    def stop(self, flush: bool = True) -> RelayHealth:
        """Stop publishing after a flush (bounded by `flush_s`, the round under way included:
        it ends at the deadline too); the health at the end. `flush=False` (a step-down: the
        lease is another's): the round under way ends at its next batch, or within
        `ANSWERED_EVERY` records of it, uncommitted, and nothing more is published. The thread
        is waited for (bounded); one still running is `lingering`, and the next relay of this
        process waits for it (`after`)."""
        self._flushing = flush
        self._deadline = time.monotonic() + (self.flush_s if flush else 0.0)
        self._stop.set()
        self._thread.join((self.flush_s if flush else 0.0) + self.connect_timeout_s + 5)
        if self.lingering:
            log.warning("relay: the relay thread has not ended yet; the next relay of this "
                        "server waits for it")  # fmt: skip
        self._watcher.join(self.check_s + self.connect_timeout_s + 5)
        if self.health.state != "stopped":
            self._set("exited", error=self.health.error if self.health.lag else "")
        return self.health

    # --- the watcher ------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Every `check_s`: the health from what this thread sees (see the module docstring)."""
        recorder = None
        try:
            while not self._stop.wait(self.check_s):
                try:
                    # its own recorder of the home's store, SQLite or PostgreSQL (the home's
                    # SQLite file alone failed a PostgreSQL server's watcher for good, and
                    # skipped every check: atk49-25 F4)
                    if recorder is None:
                        recorder = open_store(self.home)
                    head = RawSource(recorder).head()
                except Exception as e:  # a report: the store's own errors show elsewhere
                    log.debug("relay health: cannot read the store's head: %s", e)
                    head = self.health.store_head  # the checks that need no store still run
                self._check(head)
        finally:
            if recorder is not None:
                with contextlib.suppress(Exception):
                    recorder.datastore.close()  # type: ignore[attr-defined]

    def _check(self, head: int) -> None:
        state = self.health.state
        if state == "exited":
            return
        if state in ("unavailable", "connecting") and self._moving():
            # a round that (re)connected and publishes: the log again from position 1 after a
            # remake, a backlog after an outage; it says so when it returns, which took 16 s
            # of "unavailable" with the old error over 40,000 events (atk54-25 F6)
            self._probed_down = False
            self._set("publishing", head=head, expect=state)
            return
        if state in ("stopped", "connecting"):
            # rewritten as it stands (its time, the store's head): a live service whose relay
            # stopped, or connects (a 52k-event republish), was called one no service updates
            # (atk52-25 F3); the state is kept unless the publishing thread changed it since
            self._set(state, error=self.health.error, head=head, expect=state)
            return
        held = self._held
        if state in ("publishing", "stalled") and held != self._held_shown:
            self._held_shown = held
            if held is not None:
                log.warning("relay: %s", held)
                self._set("stalled", error=held, head=head)
            else:
                self._set("publishing", head=head)
            return
        if held is not None and state in ("publishing", "stalled"):
            self._set("stalled", error=held, head=head)
            return
        busy = self._busy_since
        lag = max(0, head - self._position())
        if state in ("publishing", "stalled") and busy is not None:
            # the send or commit in flight, each answer restarting it, not the round: a
            # republish moving every 7 s was `stalled` for its 2 minutes (atk55-25 F1)
            since = self.relay.waiting_since if self.relay is not None else None
            waited = 0.0 if since is None else time.monotonic() - since
            if waited > self.stall_s and lag:
                self._set(
                    "stalled",
                    error=f"a send to the broker has not come back for {waited:.0f} s with "
                    f"{lag:,} event(s) waiting",
                    head=head,
                )
                return
            if state == "stalled":  # answered since: the round goes on
                self._set("publishing", head=head, expect=state)
                return
        elif busy is None and (state == "publishing" or self._probed_down):
            why = unanswered(
                self.bootstrap, min(self.connect_timeout_s, max(2 * self.check_s, 2.0))
            )
            if why is not None and state == "publishing":
                error = f"Kafka at {self.bootstrap} is unreachable ({why})"
                log.warning(
                    "relay: %s; publishing paused and retried, scheduling goes on from the store",
                    error,
                )
                self._probed_down = True
                self._set("unavailable", error=error, head=head)
                return
            if why is None and self._probed_down:
                log.warning("relay: publishing again, topic at position %d", self._position())
                self._probed_down = False
                self._set("publishing", head=head)
                return
        self._set(state, error=self.health.error, head=head, expect=state)

    def _moving(self) -> bool:
        """Whether the round under way commits to the topic: the relay's position moved since
        the health's (or went back to 1 to publish the log again, `Relay.remakes`)."""
        relay = self.relay
        if relay is None or self._busy_since is None or relay.position <= 0:
            return False
        return relay.remakes != self._remakes or relay.position > self._published

    def _watch_held(self) -> None:
        """In a thread of its own (a hung broker blocks these questions, never the watcher):
        every `check_s`, whether the topic is still the one the relay published to
        (`_watch_topic`), asked whatever the publishing thread does; every `held_every_s`,
        between publish rounds, whether another producer holds a transaction open on the topic
        (the relay publishes past it, but no reader sees anything after it). atk52-25 F2: the
        topic was asked only with the held question, every 5 s and skipped whenever a publish
        round ran (an idle relay runs one every `interval_s`), so for 8-20 s after the topic was
        made again under an idle relay every status said "publishing, 0 behind"."""
        from ledger.store.relay import held_at, held_text

        seen: int | None = None  # the last stable offset of an open transaction seen last time
        run = HeldRun()
        admin: Any = None
        due = time.monotonic() + self.held_every_s
        while not self._stop.wait(self.check_s):
            admin = self._watch_topic(admin)
            if time.monotonic() < due or self._busy_since is not None:
                continue  # our own transaction may be the open one: ask when we hold none
            due = time.monotonic() + self.held_every_s
            try:
                held = held_at(
                    self.bootstrap, self.topic, None, self.connect_timeout_s, self.connect_timeout_s
                )
            except RelayError:
                continue  # unreachable: the watcher's probe says so
            if self._busy_since is not None:
                continue
            if held is None:
                seen, self._held = None, None
                run = HeldRun()
                continue
            if held[0] == seen:  # the same one, twice, with none of ours open: another's
                run = run.seen(held[0], time.monotonic() - self.held_every_s)
                self._held = held_text(self.topic, held) + run.text(time.monotonic())
            seen = held[0]
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    def _watch_topic(self, admin: Any) -> Any:
        """Whether the topic is still the one the relay published to (the relay asks itself
        too, while events wait); if not, the relay is told (`Relay.flag`) and its next round
        publishes the log again from position 1 (atk50-25 F1: deleted while idle, `relay
        status` said "publishing, 0 behind"). Safe while a round publishes: the relay's mark is
        read before the broker's word and it is flagged only if no commit moved it since.
        Returns the admin client to reuse.

        Each check asks one metadata request (the topic's id: deleted or made again); the
        offsets and settings (a start cut, compaction or a retention set under it: three
        requests more) only every `mark_every_s`, or at once when the id changed. Every check
        asked for all four (stop 54: four admin requests a second per running relay)."""
        from ledger.store.relay_topic import open_admin, remade, topic_id_of, topic_mark, unkept

        relay = self.relay
        if relay is None or self.health.state in ("stopped", "exited"):
            return admin  # a stopped relay's topic is `_topic_changed`'s to watch
        mark, end = relay.published_mark  # before the broker's word: both only grow
        if mark is None:
            return admin
        try:
            if admin is None:
                admin = open_admin(self.bootstrap, None, self.connect_timeout_s)
            due = time.monotonic() - self._marked_at >= self.mark_every_s
            if mark.topic_id and not due and topic_id_of(admin, self.topic) == mark.topic_id:
                self._checked = self.clock.now()  # the same topic (`RelayHealth.checked`)
                return admin  # its offsets and settings at the next full check
            now = topic_mark(admin, self.topic, self.timeout_s)
            self._marked_at = time.monotonic()
            why = remade(self.topic, mark, now, end)
        except Exception as e:  # unreachable: the watcher's probe says so
            log.debug("relay: cannot ask for topic %s: %s", self.topic, e)
            with contextlib.suppress(Exception):
                admin.close()
            return None
        refusal = unkept(self.topic, now) if now is not None else None
        if refusal is not None:  # compacted or given a retention under it (atk51-25 F1, F4)
            relay.refuse(refusal)
            return admin
        if why and relay.published_mark == (mark, end):
            relay.flag(why)
        elif not why:
            self._checked = self.clock.now()
        return admin

    def _position(self, head: int | None = None) -> int:
        """The last position committed on the topic; `head`: the store's now, the target of a
        republish that began (`_again_to`)."""
        relay = self.relay
        if relay is not None:
            if relay.remakes != self._remakes:  # the topic made again: published from 1 anew
                self._remakes, self._published = relay.remakes, relay.position
                self._again_to = (
                    head if head is not None else quiet_head(relay, self.health.store_head)
                )
            # the topic's word once connected: the higher of it and the home's relay.json said
            # "position 45,021, lag 0" and `connecting` over a topic at 25,000 (atk56-25 F2)
            self._published, self._word = relay.position, None
        elif self._word is not None:  # before the first connect: the store's progress row
            return self._word
        if self._published >= self._again_to:
            self._again_to = 0
        return self._published

    # --- the thread -------------------------------------------------------------------------------

    @property
    def lingering(self) -> bool:
        """Whether the publishing thread was started and still runs."""
        return self._thread.is_alive()

    def _going_on(self) -> bool:
        """Whether a round goes on: not once stopped without a flush, nor once the lease this
        server leads by ran out (`Relay.publish_pending`)."""
        if self._stop.is_set() and not self._flushing:
            return False
        return self.may_act is None or self.may_act()

    def _round_deadline(self) -> float | None:
        """When the round under way ends (monotonic; None: no end set), read by it before each
        batch, flush and commit (`Relay.publish_pending`): `stop()`'s deadline, set after the
        round began too (a round under way at SIGTERM flushed and committed with the full
        `timeout_s`, and its server exited after 28-51 s: atk56-25 F1); now, once the lease this
        server leads by ran out (a step-down's flush or commit begun after it waits 0.1 s)."""
        if self.may_act is not None and not self.may_act():
            return time.monotonic()
        return self._deadline

    def _wait_for_previous(self) -> None:
        """Until this server's previous relay thread ended (its round ends within a batch)."""
        previous = self._after
        if previous is None or not previous.lingering:
            return
        log.info("relay: waiting for this server's previous relay to stop")
        while previous.lingering and not self._stop.is_set():
            previous._thread.join(0.2)

    def unsure(self) -> str:
        """Why the position shown is not known to be the topic's ("": the relay connected, or 0)."""
        p = self.health.position  # 0 claims nothing: its lag, the whole log, is never too low
        return "" if self.relay or not p else unsure_text(self.topic, p, self._word_id)

    def _read_word(self) -> None:
        """The store's progress row, shown as the position until the relay connects (`_word`;
        no word: relay.json's). A new leader said relay.json's `position 45021, lag 0` while
        it connected for 38 s, the topic at 25,000 (atk56-25 F2)."""
        from ledger.store.relay_progress import Kept

        try:
            head = RawSource(self._store()).head()
            word = Kept(self._store(), self.topic, key=state_key(self.home)).word(head)
        except Exception as e:  # the store's own errors show elsewhere; the connect retries
            log.debug("relay: cannot read the store's progress: %s", e)
            return
        if word.position is not None and word.verified and word.position <= head:
            self._word, self._word_id = word.position, word.topic_id
            self._set(self.health.state, error=self.health.error, head=head, expect="connecting")

    def _main(self) -> None:
        try:
            try:
                self._read_word()
            finally:
                self._worded.set()
            self._wait_for_previous()
            self._publish_until_stopped()
            if self.health.state != "stopped" and self._flushing and self._going_on():
                flush(self)
            elif self.health.state != "stopped" and self.may_act is not None and self.may_act():
                # taken again at once: not "another server's" (atk56-25 F3)
                log.info("relay: stopped at position %d, not flushed (this server's lease ran "
                         "out and it took the lease again: its next relay publishes the rest)",
                         self._published)  # fmt: skip
            elif self.health.state != "stopped":
                log.info("relay: stopped at position %d, not flushed (the lease is another "
                         "server's: its relay publishes the rest)", self._published)  # fmt: skip
        except BaseException as e:  # never die silently
            log.exception("relay: stopped by an unexpected error")
            self._set("stopped", error=f"{type(e).__name__}: {e}")
        finally:
            if self.relay is not None:
                self.relay.close()

    def _publish_until_stopped(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            if not self._going_on():  # the lease ran out: the worker's turn stops it
                self._stop.wait(self.interval_s)
                continue
            try:
                published = self._publish()
            except RelayUnavailable as e:
                if self._quiet(e):
                    self._stop.wait(0.1)
                    continue
                if isinstance(e, ConnectEnded):  # told to end: no fault (atk56-25 F2)
                    log.info("%s", e.line())
                    self._cut = self._stop.is_set()  # unanswered at the stop: no flush tried
                    continue
                if not self._going_on():  # an error after the lease went is no fault (F3)
                    log.info("relay: round ended, the lease is another server's: %s", e.line())
                    continue
                self._unavailable(e)
                self._stop.wait(delay)
                delay = min(delay * 2, 2.0)
                continue
            except RelayError as e:  # fenced, another ledger's topic, no store: not retried
                if not self._going_on():  # the lease ran out: the new leader's relay fenced it
                    log.info("relay: round ended, the lease is another server's: %s",
                             "its relay took the producer over" if isinstance(e, RelayFenced)
                             else e.line())  # fmt: skip
                    continue
                if isinstance(e, RelayFenced) and self.may_act is not None:
                    self._fenced_under_lease(e)
                    continue
                log.error("relay stopped: %s", e.line())
                self._published = max(self._published, int(str(e.fields.get("published", 0))))
                self._set("stopped", error=e.line())
                if isinstance(e, TopicRefused) and self._topic_changed():
                    continue  # deleted or made again, as the hint says: the log to it anew
                return
            delay = 0.2
            self._not_ready_since = None
            if published:
                self._refenced = 0
            if not published:
                self._stop.wait(self.interval_s)

    def _fenced_under_lease(self, e: RelayError) -> None:
        """Fenced while this server holds the lease (the store says so): by another producer of
        this ledger's transactional id, an ex-leader whose connect went on after the takeover
        (paused or cut off in the middle of it). It connects again at once (its init fences the
        other), waiting 0.2 s, 0.4 s, ... up to `held_every_s` only if fenced again in a row, and
        its health says so: it waited 5 s, or, fenced in the middle of a transaction, stalled
        up to `timeout_s` (30 s) and blamed the broker (atk58 F5). The store saying the lease is
        another's: the round ends quietly, as after a step-down."""
        if self.holds is not None and not self.holds():
            log.info("relay: round ended, the lease is another server's: its relay took the "
                     "producer over")  # fmt: skip
            return
        why = (f"fenced by another producer of this ledger (an ex-leader) after position "
               f"{self._position()} (its transactional id {self.transactional_id!r}, which every "
               "server of the ledger shares): connecting again")  # fmt: skip
        self._refenced += 1
        wait = 0.0 if self._refenced == 1 else min(self.held_every_s, 0.1 * 2**self._refenced)
        log.warning("relay: %s %s", why, f"after {wait:.1f} s" if wait else "at once")
        self._set("connecting", error=why)
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.close()
        self._stop.wait(wait)

    def _topic_changed(self) -> bool:
        """After the relay refused its topic (`TopicRefused`: its start gone, settings that lose
        events): wait until the topic is deleted or made again (`relay_topic.topic_change`);
        then the relay is made anew (it makes the topic if missing) and publishes the store's
        log to it from position 1: True. False once the service stops. atk51-25 F6: the hint
        said "delete the topic, and the relay makes it again", yet a stopped relay never looked
        again: `relay status` said stopped over a topic gone until a restart."""
        from ledger.store.relay_topic import topic_change

        change = topic_change(self.bootstrap, self.topic, self.connect_timeout_s,
                              self.held_every_s, self._stop)  # fmt: skip
        if change is None:
            return False
        log.warning("relay: topic %s was %s since the relay stopped: publishing the store's log "
                    "to it again, after what of it the topic holds from position 1", self.topic,
                    change)  # fmt: skip
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.close()
        self._remakes = -1  # the next relay's position is the health's (`_position`)
        # its first connect vouches for no record on the new topic, only the log in order from
        # its start (a replayed copy of the progress's record was its bookmark, and the events
        # before it never reached the topic: atk52-25 F1c)
        self._remade_why = f"topic {self.topic} was {change} since the relay stopped"
        self._set("connecting", again=True)
        return True

    def _quiet(self, e: RelayError) -> bool:
        """Whether `e` is retried without a word: kafka-python's NodeNotReadyError says its own
        connection to the broker is not made yet or still in its reconnect backoff (at most a
        second: `kafka_wire.patience`), not that the broker is away. Right after a broker came
        back, the first send got it although the broker had just answered the watcher's probe,
        and the relay said `unavailable` (and warned) for a moment (CI, stop 50). Quiet for up
        to `connect_timeout_s` in a row; then it is reported as any other error."""
        if not not_ready(e):
            self._not_ready_since = None
            return False
        now = time.monotonic()
        if self._not_ready_since is None:
            self._not_ready_since = now
        if now - self._not_ready_since >= self.connect_timeout_s:
            return False
        log.debug("relay: %s; retried", e.line())
        return True

    def _publish(self) -> int:
        """One round: connect if needed, publish what is pending; unexpected errors become
        RelayUnavailable (retried with a fresh producer)."""
        self._busy_since = time.monotonic()
        try:
            return self._publish_once()
        finally:
            self._busy_since = None

    def _publish_once(self) -> int:
        connects = self.relay is None or self.relay.reconnects  # this round (re)connects
        try:
            if self.relay is None:
                self.relay = Relay(
                    self._store(),
                    self.bootstrap,
                    topic=self.topic,
                    transactional_id=self.transactional_id,
                    timeout_s=self.timeout_s,
                    connect_timeout_s=self.connect_timeout_s,
                    keys=self.keys,
                    progress=self._published if self._progress_known else None,
                    state_key=state_key(self.home),
                    remade=self._remade_why,
                    going_on=self._going_on,  # its connect too ends once told (atk56-25 F2)
                    deadline=self._round_deadline,
                    stopped=self._stop.is_set,
                    holds=self.holds,
                )
                self._remade_why = None
            published = self.relay.publish_pending(self._going_on, self._round_deadline)
            relay = self.relay
            if self._published > relay.position and self._published > relay.store_head():
                # an edited relay.json: no word (the relay took none), never its health's
                # position ("position 10,000, 0 behind" with 26 missing: atk47-25 F4)
                self._published = relay.position
        except RelayError:
            raise
        except Exception as e:
            if self.relay is None:
                log.debug("relay: unexpected error", exc_info=e)
                raise RelayUnavailable(
                    f"relay failed to start: {type(e).__name__}: {e}",
                    hint="retried; run with --log-level debug for the traceback",
                ) from e
            raise self.relay.failed(e) from e
        # The broker answered when something was published or a producer was (re)connected;
        # an idle round did not ask it (the watcher probes it then), nor one that ended before
        # its reconnect ("publishing again" with the broker down: atk56-25 F3).
        if published or (
            connects and not self.relay.reconnects
        ):  # a connect read the topic's mark; a commit asked its id
            self._checked = self.clock.now()
            if self.health.state == "unavailable":
                log.warning("relay: publishing again, topic at position %d", self.relay.position)
            self._probed_down = False
            if published or self.health.state != "publishing":
                self._set("publishing")
        return published

    def _unavailable(self, e: RelayError) -> None:
        if self.health.state != "unavailable":
            log.warning(
                "relay: %s; publishing paused and retried, scheduling goes on from the store",
                e.line(),
            )
        else:
            log.debug("relay: %s", e.line())
        self._set("unavailable", error=e.line())

    def _store_head(self) -> int:
        if self.relay is not None:
            return quiet_head(self.relay, self.health.store_head)
        try:
            return RawSource(self._store()).head()
        except Exception:
            return self.health.store_head

    def _store(self) -> ApplicationRecorder:
        """The store's recorder, opened once (a relay that cannot connect is made again)."""
        if self._recorder is None:
            self._recorder = open_store(self.home)
        return self._recorder

    def _set(
        self,
        state: RelayState,
        error: str = "",
        head: int | None = None,
        again: bool = False,
        expect: RelayState | None = None,
    ) -> None:
        """The health replaced and written; `stopped` stays unless `again` (the publishing
        thread itself goes on: `_topic_changed`). `expect`: only if the state is still that
        one (the watcher's rewrite of what it read, never over a state set since)."""
        if state == "publishing" and self._held is not None:  # readers see none of it
            state, error = "stalled", self._held
        with self._lock:
            now = self.clock.now()
            relay = self.relay
            old = self.health
            if expect is not None and old.state != expect:
                return
            if old.state == "stopped" and state != "stopped" and not again:
                # stopped is for good (the thread returned): the watcher's check, begun while
                # it was publishing, wrote `publishing` over it with the stop's error (s51)
                return
            if head is None:
                head = (
                    quiet_head(relay, old.store_head) if relay is not None else self._store_head()
                )
            self.health = RelayHealth(
                state=state,
                bootstrap=self.bootstrap,
                topic=self.topic,
                position=self._position(head),
                store_head=head,
                again_to=self._again_to,
                error=error,
                skipped=relay.skipped[:SKIPPED_SHOWN] if relay is not None else old.skipped,
                foreign=len(relay.skipped) if relay is not None else old.foreign,
                remade=relay.remade_note if relay is not None else old.remade,
                remade_from=relay.remade_from if relay is not None else old.remade_from,
                appended=appended_of(relay, old.appended),
                checked=self._checked,
                began=old.began,
                topic_id=relay.mark.topic_id if relay and relay.mark else old.topic_id,
                since=old.since if state == old.state else now,
                updated=now,
                check_s=self.check_s,
            )
            self._write()

    def _write(self) -> None:
        self._written = time.monotonic()
        path = health_path(self.home)
        tmp = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")
        try:
            write_durably(tmp, path, msgspec.json.encode(self.health))
        except OSError as e:  # the health file is a report: never stop publishing over it
            log.debug("relay: cannot write %s: %s", path, e)
