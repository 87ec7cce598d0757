"""A server started while only the primary's postmaster is stopped (SIGSTOP: its port accepts and
never answers; its backends run on): libpq's multi-host DSN times out on the primary and finds
the standby read-only. The start's one line names each host's cause, the primary's timeout
first. Before, it named only the last host's, "port <standby> failed: session is read-only",
and an operator looked at the standby (atk50b-ha F4)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from tests.integration.hakit import GPULEDGER, free_port
from tests.integration.pgoutkit import pg_pair  # noqa: F401 (the fixture)
from tests.integration.serverkit import cli, env_for
from tests.integration.test_pg_failover import Pg
from tests.integration.test_pg_outage_hung import signal_all


def test_a_start_with_the_primary_s_postmaster_stopped_names_the_primary_s_timeout(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_pair.dsn)
    hosts = urlsplit(pg_pair.dsn).netloc.rpartition("@")[2].split(",")
    primary, standby = hosts
    postmaster = int((pg_pair.data / "primary" / "postmaster.pid").read_text().split()[0])
    signal_all([postmaster], signal.SIGSTOP)
    try:
        out = subprocess.run(
            [GPULEDGER, "serve", "--store", pg_pair.dsn, "--listen", f"127.0.0.1:{free_port()}",
             "--lease", "2s"],
            env=env_for(home), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        signal_all([postmaster], signal.SIGCONT)
    lines = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    line = lines[0]
    print(f"\n{line}")
    at_primary, at_standby = f"{primary}: ", f"{standby}: "
    assert at_primary in line and at_standby in line, line
    assert line.index(at_primary) < line.index(at_standby), line
    assert "timeout" in line.split(at_primary, 1)[1].split(";", 1)[0], line
