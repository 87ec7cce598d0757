"""The CLI while PostgreSQL hangs (its postmaster and every backend SIGSTOPped: TCP up, nothing
answers, as test_pg_outage_hung.py makes it): a write through the servers and a direct read of
the store (a data directory whose `store` file names it, no server) each end in bounded time,
non-zero, with one clear line on stderr, and leave nothing half-written: once PostgreSQL
answers, the refused submit is not in the log, the chain verifies and the next submit is the
next job. A read through a server answers from what it folded (docs/ha.md), as when the store
is down. (atk48-ha F5: the submit spent its 30 s and said "this server is a standby; no server
leads right now".)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from ledger.store import locate
from ledger.wire.client import Client
from schemas import commands as c
from tests.integration import waits
from tests.integration.hakit import make_group, wait_cycled_after
from tests.integration.pgoutkit import pg_pair  # noqa: F401 (the fixture)
from tests.integration.serverkit import BUDGET, cli, make_token
from tests.integration.test_pg_failover import Pg

WRITE_BOUND_S = 45.0
"""The CLI's own retry budget (`GPULEDGER_RETRY_S`, 30 s) and a margin: a write never hangs on."""
READ_BOUND_S = 30.0
"""A direct read's statement budget (`pgread`'s) and a margin."""


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _one_line(proc: object) -> str:
    err = str(getattr(proc, "stderr", ""))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_cli_write_and_direct_read_during_a_hang_end_in_one_line_and_write_nothing(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_pair.dsn)
    budget = tmp_path / "budget.toml"
    budget.write_text(BUDGET)
    cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root")
    cli(home, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100", GPULEDGER_USER="root")
    token = make_token(home, "--user", "alice")
    reader = tmp_path / "reader"  # a data directory of the store with no server: direct reads
    locate.remember(reader, pg_pair.dsn)
    g = make_group(tmp_path, pg_pair.dsn, 2, "--interval", "0.5s", home=home)
    client = Client(g.urls, token)
    env = {"GPULEDGER_URL": g.urls, "GPULEDGER_TOKEN": token}
    hung: list[int] = []
    try:
        for m in g.members:
            g.start(m)
        g.leader()
        client.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=1, min_runtime_s=60))
        waits.wait_for("every server to fold the submit", lambda: all(
            (m.health() or {}).get("projection_position", 0) >= client.position
            for m in g.members), 60, g.why)  # fmt: skip
        head = client.position

        hung = pg_pair.pids("primary")
        assert len(hung) > 3, hung
        _signal(hung, signal.SIGSTOP)
        began = time.monotonic()
        wrote = cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h",
                    ok=False, timeout=120, **env)  # fmt: skip
        write_s = time.monotonic() - began
        write_line = _one_line(wrote)

        began = time.monotonic()
        read = cli(reader, "jobs", ok=False, timeout=120, GPULEDGER_USER="root")
        read_s = time.monotonic() - began
        read_line = _one_line(read)

        served = cli(home, "jobs", timeout=60, **env)  # from what the server folded
        assert "ai2/olmo" in served.stdout, served.stderr
        _signal(hung, signal.SIGCONT)
        wait_cycled_after(g, time.time(), timeout=120)
        jobs = client.get("jobs", {"limit": 100})
        again = client.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=1, min_runtime_s=60))
    finally:
        _signal(hung, signal.SIGCONT)
        client.close()
        g.stop()
    assert wrote.returncode != 0 and write_s < WRITE_BOUND_S, (write_s, write_line)
    assert "store does not answer" in write_line and "[unavailable]" in write_line, write_line
    assert read.returncode != 0 and read_s < READ_BOUND_S, (read_s, read_line)
    assert "PostgreSQL store" in read_line and "[unavailable]" in read_line, read_line
    # nothing half-written: the refused submit is not in the log (job 1 alone, then job 2)
    assert [j["job_id"] for j in jobs] == [1], jobs
    assert again.events[0].job_id == 2  # type: ignore[union-attr]
    assert client.position > head
    verify = cli(reader, "audit", "verify", "--json", GPULEDGER_USER="root")
    assert json.loads(verify.stdout)["store"]["problems"] == [], verify.stdout
