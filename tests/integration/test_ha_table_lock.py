"""A DBA's table lock on the log (`LOCK TABLE gpuledger_events IN ACCESS EXCLUSIVE MODE`, as
VACUUM FULL, CLUSTER or some ALTER TABLE take it) held for 20 s while clients write (atk61-ha
F4): the leader's store call stalls and it hands the lease over; the server that takes it
cannot take up the leader's work until the lock goes. Before, that server said "standby" with
itself as the leader for the whole lock, each write waited 3 s and was refused "this server is
a standby; the leader is <its own URL>", and the old leader logged a 45-line traceback per
failed cycle. Now no server names itself the leader it does not act as, its health and its
refusals say it took the lease and its store call waits (the store is locked or slow), and a
cycle that the lock fails is one line."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import psycopg

from tests.integration import waits
from tests.integration.hakit import alices_ledger, make_group
from tests.integration.test_ha_store_link import _write

LOCK_S = 20.0


def test_a_table_lock_leaves_no_server_naming_itself_and_no_traceback(
    tmp_path: Path, pg_store: str
) -> None:
    home, token = alices_ledger(tmp_path, pg_store)
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    g.lease = "5s"
    first, second = g.members
    stop = threading.Event()
    try:
        g.start(first)
        assert g.leader() is first
        g.start(second)
        waits.wait_for("the standby to name the leader", lambda: (second.health() or {}).get(
            "leader") == first.url, 30, g.why)  # fmt: skip
        assert _write(first, token)[0] == 200

        def writes() -> None:  # the leader's append meets the lock
            while not stop.is_set():
                for m in g.members:
                    threading.Thread(target=_quiet_write, args=(m, token), daemon=True).start()
                stop.wait(1.0)

        with psycopg.connect(pg_store) as con:
            con.execute("LOCK TABLE gpuledger_events IN ACCESS EXCLUSIVE MODE")
            locked = time.monotonic()
            threading.Thread(target=writes, daemon=True).start()
            seen: list[tuple[str, dict[str, object]]] = []
            said: list[str] = []
            while time.monotonic() - locked < LOCK_S:
                for m in g.members:
                    h = m.health() or {}
                    seen.append((m.url, h))
                    if h.get("role") == "standby" and "taking up" in str(h.get("store_error")):
                        status, _, text, _ = _write(m, token)
                        said.append(f"{status} {json.loads(text).get('message')}")
                time.sleep(0.25)
            con.rollback()
        stop.set()
        for url, h in seen:  # a server never names itself the leader while it says standby
            assert not (h.get("role") == "standby" and h.get("leader") == url), (url, h)
        assert any("locked or slow" in str(h.get("store_error")) for _, h in seen), (
            seen[-20:], g.why())  # fmt: skip
        assert said, ([h for _, h in seen][-10:], g.why())
        assert said[0].startswith("503 this server took the lease (epoch "), said
        assert "taking up the leader's work: its store call has waited" in said[0], said
        for line in said:  # (a later one may come once it handed the lease over: it says why)
            assert line.startswith("503 "), said
            assert "the leader is" not in line, said
        g.leader(timeout=60)
        for m in g.members:
            assert "Traceback" not in m.text(), m.text()[-4000:]
    finally:
        stop.set()
        g.stop()


def _quiet_write(m: object, token: str) -> None:
    with contextlib.suppress(OSError):
        _write(m, token)  # type: ignore[arg-type]
