"""A standby whose own link to PostgreSQL goes silent (atk45ha F3; a proxy that forwards
nothing, as a network dropping every packet): real PostgreSQL, real servers, the real CLI.
Before, it answered reads from what it had last folded and said nothing, and `gpuledger jobs`
right after `gpuledger submit` (two commands) could be answered by it without the submit. Now
its health says the store's error, its reads say how old its log is (`X-Gpuledger-Stale`, a
CLI note), and the CLI's next read asks for its last write's position, which the standby has
not folded: it answers 503 and the CLI reads from the leader (docs/ha.md, "A server's own link
to the store")."""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from pathlib import Path

from tests.integration import waits
from tests.integration.hakit import Member, alices_ledger, lead_behind, make_group
from tests.integration.serverkit import GPULEDGER, env_for
from tests.integration.test_ha import Proxy


def _cli(token: str, urls: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPULEDGER, *args],
        env=env_for(Path("/nonexistent"), GPULEDGER_URL=urls, GPULEDGER_TOKEN=token),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_standby_cut_from_postgresql_marks_its_reads_and_the_cli_reads_its_own_writes(
    tmp_path: Path, pg_store: str
) -> None:
    home, token = alices_ledger(tmp_path, pg_store)
    proxy = Proxy(pg_store)
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    leader, cut = g.members
    cut.dsn = proxy.via
    try:
        g.start(leader)
        assert g.leader() is leader
        g.start(cut)
        assert g.leader() is leader
        submit = ("submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h")
        done = _cli(token, f"{leader.url},{cut.url}", *submit)
        assert done.returncode == 0, done.stderr
        waits.wait_for("the standby to fold job 1", lambda: '"job_id":1' in _get(cut, token)[1]
                       .replace(" ", ""), 30, g.why)  # fmt: skip
        proxy.cut.set()
        waits.wait_for("the standby's health to say the store's error", lambda: (
            cut.health() or {}).get("store_error"), 30, g.why)  # fmt: skip
        stale = waits.wait_for("the standby's reads to say how old its log is",
                               lambda: _get(cut, token)[0], 30, g.why)  # fmt: skip
        assert float(stale) >= 2.0  # older than its lease (2 s)
        assert ((cut.health() or {}).get("stale_s") or 0) >= 2.0
        # a read through the standby alone: answered, and said in one line
        jobs = _cli(token, cut.url, "jobs", "--json")
        assert jobs.returncode == 0, jobs.stderr
        assert jobs.stderr.startswith(f"note: {cut.url} answered from the log as it read it "), (
            jobs.stderr
        )
        # the next command reads its own write, whichever server answers first
        done = _cli(token, f"{leader.url},{cut.url}", *submit)
        assert done.returncode == 0, done.stderr
        jobs = _cli(token, f"{cut.url},{leader.url}", "jobs", "--json")
        assert jobs.returncode == 0, jobs.stderr
        assert sorted(int(r["job_id"]) for r in json.loads(jobs.stdout)) == [1, 2], (
            jobs.stdout,
            g.why(),
        )
    finally:
        g.stop()
        proxy.close()


RENEWAL = b"stamp = stamp + 1 WHERE id = 1 AND holder"
"""A text only the lease's renewal sends (`Lease.renew`)."""


class RenewalsFirst(Proxy):
    """Cuts a leader's renewals first (its other statements answer), then, a moment before its
    lease runs out by its own clock (the last renewal's sending + four fifths of the lease),
    the whole link: its store hangs for everything from just before the lease ran out, and the
    statement that will fail (two thirds of a lease after it was sent) has not failed yet."""

    def __init__(self, dsn: str, lease_s: float) -> None:
        self.lease_s, self.renewals_cut = lease_s, threading.Event()
        self.renewal_sent, self.timer = 0.0, None  # type: ignore[var-annotated]
        self._names: dict[int, bytes] = {}
        super().__init__(dsn)

    def _renewal(self, data: bytes, link: threading.Event) -> bool:
        """Whether `data` sends the renewal: its text, or, once psycopg prepared it (its fifth
        run on the connection: the leader started more than ~8 s before the cut, at load),
        its prepared statement's name on that connection (a Bind names it, not the text)."""
        if RENEWAL in data:
            if data[:1] == b"P":  # Parse: 'P', int32 length, the name, NUL, the SQL
                self._names[id(link)] = data[5 : data.index(b"\x00", 5) + 1]
            return True
        name = self._names.get(id(link))
        return name is not None and len(name) > 1 and b"\x00" + name in data

    def passing(self, data: bytes, upward: bool, link: threading.Event) -> bytes | None:
        if upward and self._renewal(data, link):
            if not self.renewals_cut.is_set():
                self.renewal_sent = time.monotonic()
                return super().passing(data, upward, link)
            link.set()  # the renewals' connection: nothing more goes through it
            if self.timer is None:
                runs_out = self.renewal_sent + 0.8 * self.lease_s
                self.timer = threading.Timer(runs_out - 0.8 - time.monotonic(), self.cut.set)
                self.timer.start()
        return None if link.is_set() else super().passing(data, upward, link)


def _write(m: Member, token: str) -> tuple[int, str, str, float]:
    """A submit to `m` alone: (status, X-Gpuledger-Store, body, seconds to its answer)."""
    body = json.dumps({"actor": "", "account": "ai2/olmo", "gpus": 1}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=10)
    began = time.monotonic()
    try:
        conn.request("POST", "/v1/commands/submit", body=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        text = resp.read().decode()
        return (
            resp.status,
            resp.getheader("X-Gpuledger-Store") or "",
            text,
            (time.monotonic() - began),
        )
    finally:
        conn.close()


def test_a_leader_whose_lease_ran_out_while_its_store_hangs_refuses_writes_at_once_saying_so(
    tmp_path: Path, pg_store: str
) -> None:
    """Its renewals go unanswered, then everything: its lease runs out by its own clock before
    any statement has failed (the store is not yet known away). A write is answered at once,
    503 with the store away and why, and the CLI goes on to the next server. Before, it named
    itself the leader from the row it last read ("this server is a standby; the leader is"
    itself), then, past that row's expiry, held writes up to `TAKEOVER_WAIT_S` as for an
    election (stop 58's CI)."""
    home, token = alices_ledger(tmp_path, pg_store)
    proxy = RenewalsFirst(pg_store, 5.0)
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    g.lease = "5s"
    try:
        cut, other = lead_behind(g, proxy.via)
        done = _cli(token, g.urls, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h")
        assert done.returncode == 0, done.stderr
        proxy.renewals_cut.set()
        waits.wait_for("the cut leader's lease to run out", lambda: (cut.health() or {}).get(
            "role") == "standby", 30, g.why)  # fmt: skip
        assert proxy.cut.is_set()  # the whole link was cut before it ran out
        said = []
        for _ in range(2):  # the row it last read held, then expired (an election, were it on)
            status, store, text, took = _write(cut, token)
            assert (status, store) == (503, "away"), (status, store, text, g.why())
            assert took < 1.0, (took, text)
            said.append(json.loads(text)["message"])
            time.sleep(1.5)
        assert said[0].startswith("the store does not answer (its renewal of this server's "
                                  "lease has had no answer for "), said  # fmt: skip
        assert said[1].startswith("the store does not answer ("), said
        done = _cli(token, f"{cut.url},{other.url}", "submit", "-A", "ai2/olmo", "-G", "1",
                    "--min-runtime", "1h")  # fmt: skip
        assert done.returncode == 0, (done.stderr, g.why())
    finally:
        g.stop()
        proxy.close()
        if proxy.timer is not None:
            proxy.timer.cancel()


def _get(m: object, token: str) -> tuple[str, str]:
    """GET /v1/jobs of server `m`: (its X-Gpuledger-Stale, or "", the body)."""
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=10)  # type: ignore[attr-defined]
    try:
        conn.request("GET", "/v1/jobs", headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        return resp.getheader("X-Gpuledger-Stale") or "", resp.read().decode()
    except OSError:
        return "", ""
    finally:
        conn.close()


def test_a_write_the_leader_took_as_its_link_went_silent_is_answered_once_its_lease_ran_out(
    tmp_path: Path, pg_store: str
) -> None:
    """atk60-ha F1: a write that reached the leader just after its link went silent waited on
    its append for the whole partition (never answered while it lasted), while later writes
    were refused at once. Now it is answered once the leader's own lease runs out (2 s here),
    503 with its outcome unknown (it may still be stored: the append is fenced), and the CLI
    goes on to the other server."""
    home, token = alices_ledger(tmp_path, pg_store)
    proxy = Proxy(pg_store)
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    try:
        cut, other = lead_behind(g, proxy.via)
        status, _, text, _ = _write(cut, token)
        assert status == 200, text
        proxy.cut.set()
        status, _, text, took = _write(cut, token)  # its lease has a second or so left
        assert status == 503, (status, text, g.why())
        assert took < 4.0, (took, text)
        assert "it may still be stored" in json.loads(text)["message"], text
        done = _cli(token, f"{cut.url},{other.url}", "submit", "-A", "ai2/olmo", "-G", "1",
                    "--min-runtime", "1h")  # fmt: skip
        assert done.returncode == 0, (done.stderr, g.why())
    finally:
        g.stop()
        proxy.close()


def test_a_standby_whose_store_hangs_as_the_leaders_lease_runs_out_says_the_store_away(
    tmp_path: Path, pg_store: str
) -> None:
    """s61: the leader is killed, and the standby's link to PostgreSQL goes silent just before
    the leader's lease (as the standby read the row) runs out: its take hangs. Nobody can be
    elected without the store, so it says the store away: a write is answered 503 store away
    within a statement's time (5 s lease: 1.7 s), health's `store_error` says why in one line
    and names no leader, and it never says leader while cut. Before, the write waited 3 s
    (`TAKEOVER_WAIT_S`) as for an election, then said "this server is a standby"."""
    home, token = alices_ledger(tmp_path, pg_store)
    proxy = Proxy(pg_store)
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    g.lease = "5s"
    leader, standby = g.members
    standby.dsn = proxy.via
    try:
        g.start(leader)
        assert g.leader() is leader
        g.start(standby)
        waits.wait_for("the standby to name the leader", lambda: (standby.health() or {}).get(
            "leader") == leader.url, 30, g.why)  # fmt: skip
        leader.kill()

        def left() -> float:
            return float((standby.health() or {}).get("lease_expires_in_s") or 99.0)

        waits.wait_for("the leader's lease to be about to run out", lambda: left() < 0.2, 30,
                       g.why)  # fmt: skip
        proxy.cut.set()  # its take, at the row's expiry, hangs
        waits.wait_for("the row to run out", lambda: left() < -0.1, 10, g.why)
        status, store, text, took = _write(standby, token)
        assert (status, store) == (503, "away"), (status, store, text, took, g.why())
        assert took < 2.5, (took, text)  # was 3 s and more: "this server is a standby"
        # the store's words from the first refusal, also one that waited on the take (it said
        # "this server is a standby; reads still answer" for a statement's time: atk61-ha F2)
        assert json.loads(text)["message"].startswith("the store does not answer ("), text
        health = standby.health() or {}
        said = health.get("store_error") or ""
        assert "no answer" in said and "\n" not in said, health
        assert (health.get("role"), health.get("leader")) == ("standby", ""), health
        end = time.monotonic() + 4.0
        while time.monotonic() < end:  # it takes no lease without the store
            assert (standby.health() or {}).get("role") != "leader", g.why()
            time.sleep(0.25)
    finally:
        g.stop()
        proxy.close()
