"""The append path on a PostgreSQL store (`ledger.store.postgres`): one statement per group commit
(fence, rows and commit in one round trip, no table lock), and what that must keep true: the
committed rows are always a prefix of the log (a reader tailing it never passes a position that
is filled in later), two writers never both append a position, a deposed leader's append stores
nothing, an append whose answer was lost is known as its own, and a server killed -9 in the
middle of group commits loses and doubles no acknowledged submit of many concurrent clients.
"""

from __future__ import annotations

import http.client
import json
import random
import secrets
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest

from ledger.core.decide import decide
from ledger.store import lease, locate
from ledger.store.application import Ledger
from ledger.store.creating import NewLedger
from ledger.store.pgread import PgSource
from ledger.store.requests import KEY_PART, keyed_id
from schemas import commands as c
from schemas.errors import Conflict, Unavailable
from tests.integration import waits
from tests.integration.hakit import log_events, make_group
from tests.integration.serverkit import cli, init_on_store, make_token


def base(home: Path, dsn: str) -> Ledger:
    locate.remember(home, dsn)
    led = NewLedger(home)  # makes the store's tables
    led.execute(c.InitLedger(actor="root", admin="root"))
    led.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    return led


def submit(actor: str = "alice") -> c.SubmitJob:
    return c.SubmitJob(actor=actor, account="ai2/olmo", gpus=1, min_runtime_s=60)


def test_two_writers_and_a_tailing_reader_see_one_gapless_log(
    tmp_path: Path, pg_store: str
) -> None:
    """Two ledgers on one store append group commits as fast as they can (each losing races to
    the other and deciding again); a reader tails the log meanwhile. The reader never sees a
    position before the one it last saw has been committed (no gap it would pass over), every
    command is in the log exactly once, and the chain holds."""
    first = base(tmp_path / "a", pg_store)
    second = Ledger(tmp_path / "b", store=pg_store)
    start = first.position
    per, batch = 30, 5
    errors: list[BaseException] = []
    done = threading.Event()

    def write(led: Ledger, who: str) -> None:
        try:
            for i in range(per):
                cmds = [submit() for _ in range(batch)]
                keys = [f"{who}-{i}-{k}" for k in range(batch)]
                while True:
                    try:  # all of the 20 tries lost to the other writer: again, the same keys
                        done = led.execute_each(cmds, keys)
                    except Conflict:
                        continue
                    break
                for got in done:
                    assert not isinstance(got, Exception), got
        except BaseException as err:
            errors.append(err)

    seen: list[int] = []

    def tail() -> None:
        with PgSource(pg_store) as source:
            after = start
            while not done.is_set() or source.head() > after:
                for rec in source.read(after, 1000):
                    seen.append(rec.position)
                    after = rec.position

    writers = [threading.Thread(target=write, args=(led, who))
               for led, who in ((first, "a"), (second, "b"))]  # fmt: skip
    reader = threading.Thread(target=tail)
    reader.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=300)
    done.set()
    reader.join(timeout=120)
    assert errors == []
    total = 2 * per * batch
    assert seen == list(range(start + 1, start + total + 1))
    events = [ev for _, ev in first.read(start, total + 10)]
    ids = [ev.event_id[:KEY_PART] for ev in events]  # (actor, key); the rest names the request
    want = {keyed_id("alice", f"{w}-{i}-{k}")[:KEY_PART]
            for w in "ab" for i in range(per) for k in range(batch)}  # fmt: skip
    assert len(ids) == total and set(ids) == want
    first.close()
    second.close()
    out = cli(tmp_path / "a", "audit", "verify").stdout
    assert f"chain intact over {start + total} events" in out, out


def test_a_deposed_leader_s_append_stores_nothing(tmp_path: Path, pg_store: str) -> None:
    led = base(tmp_path / "a", pg_store)
    lease.setup(pg_store)
    mine = lease.Lease(pg_store, "server-a", "http://a", 5.0)
    assert mine.acquire()
    led.fence(mine.epoch)
    led.execute(submit())
    head = led.position
    with psycopg.connect(pg_store, autocommit=True) as con:  # another server took it over
        con.execute(
            f"UPDATE {lease.LEADER_TABLE} SET epoch = epoch + 1, stamp = stamp + 1, "
            "holder = 'server-b'"
        )
    with pytest.raises(Unavailable, match="not the leader"):
        led.execute(submit())
    with pytest.raises(Unavailable, match="not the leader"):
        led.execute_each([submit(), submit()], ["k1", "k2"])
    with PgSource(pg_store) as source:
        assert source.head() == head
    led.fence(None)
    led.close()
    mine.close()


def test_an_append_run_after_the_lease_ran_out_stores_nothing(
    tmp_path: Path, pg_store: str
) -> None:
    """An append sent before PostgreSQL hung runs when it wakes: after its server answered 503
    (the store away) and, when nobody took the lease meanwhile, at the epoch the row still holds.
    The row's expiry has passed by then: the fence refuses it (before, it committed a write its
    client had been told was not taken)."""
    led = base(tmp_path / "a", pg_store)
    lease.setup(pg_store)
    mine = lease.Lease(pg_store, "server-a", "http://a", 5.0)
    assert mine.acquire()
    led.fence(mine.epoch)
    led.execute(submit())
    head = led.position
    with psycopg.connect(pg_store, autocommit=True) as con:  # the lease ran out, nobody took it
        con.execute(
            f"UPDATE {lease.LEADER_TABLE} SET expires_at = clock_timestamp() - interval '1 s', "
            "stamp = stamp + 1"
        )
    with pytest.raises(Unavailable, match="not the leader"):
        led.execute(submit())
    with PgSource(pg_store) as source:
        assert source.head() == head
    led.fence(None)
    led.close()
    mine.close()


def test_a_renewal_run_after_the_lease_ran_out_extends_nothing(pg_store: str) -> None:
    """A renewal sent before PostgreSQL hung, abandoned, runs when it wakes: the lease had run
    out and its holder stood down; it must not give that holder another lease (no standby
    could take it meanwhile). Before, it extended the lease."""
    lease.setup(pg_store)
    mine = lease.Lease(pg_store, "server-a", "http://a", 5.0)
    assert mine.acquire()
    assert mine.renew()
    with psycopg.connect(pg_store, autocommit=True) as con:
        con.execute(
            f"UPDATE {lease.LEADER_TABLE} SET expires_at = clock_timestamp() - interval '1 s', "
            "stamp = stamp + 1"
        )
        assert not mine.renew()
        row = con.execute(
            f"SELECT expires_at < clock_timestamp() FROM {lease.LEADER_TABLE}"
        ).fetchone()
    assert row == (True,)
    assert not mine.may_act()
    assert mine.acquire()  # its own expired row: taken again, at a new epoch
    mine.close()


def test_an_append_whose_answer_was_lost_is_known_as_its_own(tmp_path: Path, pg_store: str) -> None:
    """The store committed, the answer was lost, the retry meets its own rows: the ledger takes
    them as appended (byte for byte the same), and another writer's rows are not taken so."""
    led = base(tmp_path / "a", pg_store)
    head = led.position
    events = decide(led.state, submit(), led.clock.now(), led.ids)
    rows, _, _ = led._stored(events)
    assert led.recorder.insert_events(rows) == [head + 1]  # committed; "the answer was lost"
    assert led._insert(rows) == [head + 1]  # the retry: its own rows
    other, _, _ = led._stored(decide(led.state, submit(), led.clock.now(), led.ids))
    assert led._insert(other) is None  # the same position, other bytes: another writer's
    led.close()


def test_many_clients_lose_and_double_no_submit_when_the_server_is_killed_mid_batch(
    tmp_path: Path, pg_store: str
) -> None:
    """16 clients submit as fast as they can, each submit with its own idempotency key, sent
    again (the same key) until it is answered; the server is killed -9 three times while group
    commits are in flight and started again. Every submit is in the log exactly once, as the job
    its answer named."""
    home = tmp_path / "server-0"
    init_on_store(home, tmp_path, pg_store)
    token = make_token(home, "--user", "alice")
    group = make_group(tmp_path, pg_store, 1, "--interval", "1h", home=home)
    server = group.members[0]
    group.start(server)
    answered: dict[str, int] = {}  # key -> the job its answer named
    resent: set[str] = set()  # keys whose request a kill cut off (sent again)
    lock = threading.Lock()
    stop = threading.Event()
    body = json.dumps({"actor": "", "account": "ai2/olmo", "gpus": 1}).encode()

    def one(key: str) -> int:
        """Send the submit keyed `key` until a server answers it; its job id."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            con = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            try:
                con.request("POST", "/v1/commands/submit", body, {
                    "Authorization": f"Bearer {token}", "Content-Type": "application/json",
                    "Idempotency-Key": key})  # fmt: skip
                resp = con.getresponse()
                data = resp.read()
            except OSError:
                with lock:
                    resent.add(key)
                time.sleep(0.05)  # the server is down: again, with the same key
                continue
            finally:
                con.close()
            if resp.status in (429, 503):  # 429: past alice's request rate (16 at once)
                time.sleep(0.05 if resp.status == 503 else 0.25)
                continue
            assert resp.status == 200, (resp.status, data)
            return int(json.loads(data)["events"][0]["job_id"])
        raise AssertionError(f"submit {key} never answered")

    failed: list[BaseException] = []

    def client() -> None:
        try:
            while not stop.is_set():
                key = secrets.token_hex(8)
                job = one(key)
                with lock:
                    answered[key] = job
        except BaseException as err:
            failed.append(err)
            raise

    def more(n: int) -> None:
        want = len(answered) + n
        waits.wait_for(f"{n} more answered submits",
                       lambda: len(answered) >= want or bool(failed), 120, group.why)  # fmt: skip
        assert failed == []

    threads = [threading.Thread(target=client, daemon=True) for _ in range(16)]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            more(100)
            time.sleep(random.uniform(0, 0.05))
            server.kill(signal.SIGKILL)  # 16 submits in flight: in a group commit, or about to
            group.start(server)
        more(50)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=180)
        group.stop()  # also when a wait failed: no server outlives the test
    assert failed == []
    submitted = [e for e in log_events(home) if e["type"].startswith("job.submitted.")]
    by_id = {e["event_id"][:KEY_PART]: e["job_id"] for e in submitted}  # (actor, key) part
    assert len(by_id) == len(submitted)  # no event twice
    keyed = {keyed_id("alice", k)[:KEY_PART]: job for k, job in answered.items()}
    assert len(submitted) == len(answered)  # exactly the answered ones: none lost, none extra
    assert by_id == keyed  # each as the job its answer named
    assert len(resent) >= 3, resent  # the kills cut requests off (in flight, not between them)


def test_a_write_the_moment_a_lone_server_listens_is_answered_not_refused(
    tmp_path: Path, pg_store: str
) -> None:
    """A server listens before its first turn takes the lease; a write in between waits for it
    to lead (it used to be refused, 503 "this server is a standby; the leader is" itself)."""
    home = tmp_path / "server-0"
    init_on_store(home, tmp_path, pg_store)
    token = make_token(home, "--user", "alice")
    group = make_group(tmp_path, pg_store, 1, "--interval", "1h", home=home)
    server = group.members[0]
    try:
        for restart in (False, True):  # a first start, and a restart after kill -9
            group.start(server)
            if restart:  # the killed process's lease names this address: it runs out first
                group.leader()
            con = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            con.request("POST", "/v1/commands/submit", b'{"actor":"","account":"ai2/olmo",'
                        b'"gpus":1}', {"Authorization": f"Bearer {token}",
                                       "Content-Type": "application/json"})  # fmt: skip
            try:
                resp = con.getresponse()
                assert resp.status == 200, (resp.status, resp.read())
            finally:
                con.close()
            server.kill(signal.SIGKILL)
    finally:
        group.stop()


def _lose_last_row(dsn: str, position: int) -> None:
    """The store loses its last row: a failover to a standby that never got it (PostgreSQL had
    shown the commit, whose wait for the standby was cancelled, to every session)."""
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute("DELETE FROM gpuledger_events WHERE notification_id = %s", (position,))


def test_an_append_over_a_position_the_store_lost_reads_the_state_back_and_leaves_no_gap(
    tmp_path: Path, pg_store: str
) -> None:
    """atk51-ha F2: the writer had folded position N, the store lost it; its next append went
    to N + 1, over the gap (`audit verify`: chain BROKEN). Now the append checks the row it
    builds on (position and link) and stores nothing otherwise; the ledger reads its state
    back (without the lost job) and appends at N."""
    led = base(tmp_path / "a", pg_store)
    led.execute(submit())
    lost = led.execute(submit())
    _lose_last_row(pg_store, lost.position)
    got = led.execute(submit())
    assert got.position == lost.position  # before: lost.position + 1, over the gap
    assert led.rewound == 1
    lost_job = lost.events[0].job_id  # type: ignore[union-attr]
    assert got.events[0].job_id == lost_job  # type: ignore[union-attr]  # the number again
    with PgSource(pg_store) as source:
        assert source.head() == lost.position
    led.close()
    assert "chain intact" in cli(tmp_path / "a", "audit", "verify").stdout


def test_a_follower_whose_log_was_replaced_past_its_position_reads_it_back(
    tmp_path: Path, pg_store: str
) -> None:
    """A server that folded position N (lost in a failover) follows a log whose new leader
    appended other events at N and N + 1: it folded N + 1 on top of its own N before, a state
    no log holds. Now the link of the first event it folds is checked: it reads the log back."""
    led = base(tmp_path / "a", pg_store)
    lost = led.execute(submit("alice"))
    follower = Ledger(tmp_path / "b", store=pg_store)
    assert follower.position == lost.position
    _lose_last_row(pg_store, lost.position)
    writer = Ledger(tmp_path / "c", store=pg_store)
    writer.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60))
    writer.execute(submit())
    follower.refresh()
    assert follower.position == writer.position
    assert {j: v.spec.gpus for j, v in follower.state.jobs.items()} == {
        j: v.spec.gpus for j, v in writer.state.jobs.items()
    }  # before: the lost job's 1 GPU where the log holds 2
    assert follower.rewound == 1
    for one in (led, follower, writer):
        one.close()


def test_an_idle_connection_goes_back_to_the_pool_at_once_one_in_a_transaction_on_its_thread(
    tmp_path: Path, pg_store: str
) -> None:
    """An append gives its connection back to the pool in its own thread (it is idle: no work
    to do), not through the pool's worker thread (a wake-up and a thread switch per append);
    the time it came back is noted (the ping after a second idle). One given back in a
    transaction is still rolled back on the pool's thread."""
    from ledger.store import postgres

    led = base(tmp_path / "a", pg_store)
    pool = led.recorder.datastore.pool  # type: ignore[attr-defined]
    queued: list[str] = []
    run_task = pool.run_task

    def noted(task: object) -> None:
        queued.append(type(task).__name__)
        run_task(task)

    pool.run_task = noted
    before = time.monotonic()
    led.execute(submit())
    assert "ReturnConnection" not in queued
    assert max(postgres._returned.values()) >= before  # noted when it came back
    conn = pool.getconn()
    conn.execute("BEGIN")
    assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    pool.putconn(conn)
    assert "ReturnConnection" in queued
    waits.wait_for(
        "the connection given back in a transaction rolled back",
        lambda: conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE,
        timeout=30,
    )
    led.execute(submit())  # the pool lends again
    led.close()
