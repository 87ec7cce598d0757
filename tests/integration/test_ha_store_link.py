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
from pathlib import Path

from tests.integration import waits
from tests.integration.hakit import make_group
from tests.integration.serverkit import GPULEDGER, env_for, init_on_store, make_token
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
    home = tmp_path / "server-0"
    init_on_store(home, tmp_path, pg_store)
    token = make_token(home, "--user", "alice")
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
