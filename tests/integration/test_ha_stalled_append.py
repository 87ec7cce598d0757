"""A leader whose appends stall while its lease renewals go through (a slow link: atk60-ha F5):
real PostgreSQL, two real servers. Its appends are held 12 s on their way to PostgreSQL; the
rest passes. Before, it kept the lease, said "leader", and every write waited for the append
(17 s in the attack; a standby forwards writes to it, so no way round). Now the leader hands the
lease over once its append has waited a lease (5 s at least: `ha.append_stall_s`), the write
waiting on it is answered 503 with its outcome unknown (atk60-ha F1), the other server leads,
and the write asked again there under its key is stored once: the stalled append, delivered
after the takeover, is refused by the fence (docs/ha.md, "A slow link")."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

from tests.integration import waits
from tests.integration.hakit import (
    Member,
    PgProxy,
    alices_ledger,
    lead_behind,
    log_events,
    make_group,
)

HOLD_S = 12.0


class SlowAppends(PgProxy):
    """Holds every append (the fenced INSERT, by its text or its prepared statement's name on
    that connection) `HOLD_S` on its way to PostgreSQL, once `slow` is set; the connection's
    later bytes wait behind it, as over a slow link. Everything else passes."""

    def __init__(self, dsn: str) -> None:
        self.slow = threading.Event()
        self.held_at: list[float] = []
        self._names: dict[int, bytes] = {}
        super().__init__(dsn)

    def passing(self, data: bytes, upward: bool, link: threading.Event) -> bytes | None:
        if not upward:
            return data
        at = data.find(b"gpuledger_fence(")
        if at >= 0 and data[:1] == b"P":  # Parse: 'P', int32 length, the name, NUL, the SQL
            self._names[id(link)] = data[5 : data.index(b"\x00", 5) + 1]
        name = self._names.get(id(link))
        append = at >= 0 or (name is not None and len(name) > 1 and name in data)
        if append and self.slow.is_set():
            self.held_at.append(time.monotonic())
            time.sleep(HOLD_S)  # this connection's pump: its bytes wait, the others' do not
        return data


def _submit(m: Member, token: str, key: str) -> tuple[int, dict[str, str], str, float]:
    body = json.dumps({"actor": "", "account": "ai2/olmo", "gpus": 1}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=40)
    began = time.monotonic()
    try:
        conn.request("POST", "/v1/commands/submit", body=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json",
            "Idempotency-Key": key})  # fmt: skip
        resp = conn.getresponse()
        text = resp.read().decode()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        return resp.status, headers, text, time.monotonic() - began
    finally:
        conn.close()


def test_a_leader_whose_append_stalls_hands_over_and_the_write_is_stored_once(
    tmp_path: Path, pg_store: str
) -> None:
    home, token = alices_ledger(tmp_path, pg_store)
    proxy = SlowAppends(pg_store)
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    try:
        slow, other = lead_behind(g, proxy.via)
        status, _, text, _ = _submit(slow, token, "warm-up")  # its append statement prepared
        assert status == 200, text
        assert g.leader() is slow
        proxy.slow.set()
        status, headers, text, took = _submit(slow, token, "stalled")
        assert proxy.held_at, g.why()
        # answered within the stall bound (5 s) + a lease turn, not when the append lands
        assert (status, headers.get("x-gpuledger-outcome")) == (503, "unknown"), (
            status, headers, text, g.why())  # fmt: skip
        assert took < 8.0, (took, text)
        assert "it may still be stored" in json.loads(text)["message"], text
        assert "handing the lease over" in slow.text(), g.why()
        assert g.leader() is other
        status, _, text, _ = _submit(other, token, "stalled")  # the client asks again
        assert status == 200, (status, text, g.why())
        job = json.loads(text)["events"][0]["job_id"]
        # the held append reaches PostgreSQL after the takeover: the fence refuses it
        waits.wait_for("the held append to be delivered", lambda: time.monotonic()
                       > proxy.held_at[0] + HOLD_S + 2.0, 30, g.why)  # fmt: skip
        assert (slow.health() or {}).get("role") == "standby", g.why()

        def submitted() -> list[int]:  # read through server-0 once it folded the new leader's
            return [e["job_id"] for e in log_events(home) if e["type"] == "job.submitted.v2"]

        waits.wait_for("job 2 in the log", lambda: job in submitted(), 30, g.why)
        assert submitted() == [1, job], (submitted(), g.why())  # the stalled append: fenced
    finally:
        g.stop()
        proxy.close()
