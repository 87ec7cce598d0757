"""The first start on a store (or of a new version) makes the lease's tables under the schema's
advisory lock. When another start holds that lock and its commit waits for a synchronous standby
that is away (a start of another host killed there: nothing of this host can tell it dead), the
start says so in one line within `START_WAIT_S` and exits 1, and SIGTERM stops it at once.
Before, it tried again for 60 s, silent, then ended "internal error: LockNotAvailable"
(atk50b-ha F2)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import psycopg

from ledger.store.lease import START_WAIT_S
from ledger.store.leaseschema import SCHEMA_LOCK
from tests.integration import waits
from tests.integration.hakit import GPULEDGER, free_port
from tests.integration.pgoutkit import pg_pair  # noqa: F401 (the fixture)
from tests.integration.serverkit import cli, env_for
from tests.integration.test_pg_failover import Pg
from tests.integration.test_pg_outage_hung import signal_all
from tests.integration.test_pg_outage_start import CAUSE

BLOCKER = "gpuledger:elsewhere:1:start"


def _serve(home: Path, dsn: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [GPULEDGER, "serve", "--store", dsn, "--listen", f"127.0.0.1:{free_port()}",
             "--lease", "2s", "--interval", "0.5s"],
            env=env_for(home), stdout=out, stderr=out,
        )  # fmt: skip


def test_a_start_behind_another_start_s_schema_commit_says_so_in_one_line_and_stops_at_once(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_pair.dsn)
    frozen = pg_pair.pids("standby")
    signal_all(frozen, signal.SIGSTOP)
    blocker = psycopg.connect(pg_pair.dsn, autocommit=True, application_name=BLOCKER)
    # another start's schema script: the lock had, its commit waiting for the standby
    held = threading.Thread(target=lambda: blocker.execute(
        f"BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); CREATE TABLE elsewhere (x int); "
        "COMMIT;"), daemon=True)  # fmt: skip
    log = tmp_path / "serve.log"
    try:
        held.start()

        def waiting() -> bool:
            with psycopg.connect(pg_pair.dsn, autocommit=True) as con:
                row = con.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND wait_event = 'SyncRep'",
                    (BLOCKER,),
                ).fetchone()
            return bool(row and row[0])

        waits.wait_for("the other start's commit to wait on the standby", waiting, 30)
        # 1 one line, exit 1, within START_WAIT_S
        began = time.monotonic()
        proc = _serve(home, pg_pair.dsn, log)
        code = proc.wait(timeout=120)
        took = time.monotonic() - began
        said = log.read_text()
        print(f"\nthe start ended in {took:.1f} s: {said.splitlines()[-1:]}")
        lines = [x for x in said.splitlines() if x.startswith("error: ")]
        assert code == 1 and len(lines) == 1 and CAUSE in lines[0], said
        assert BLOCKER in lines[0] and "internal error" not in said, said
        assert took <= START_WAIT_S + 5, said
        # 2 SIGTERM during such a start: seconds
        before = len(log.read_text())
        proc = _serve(home, pg_pair.dsn, log)
        waits.wait_for("the start's first line", lambda: len(log.read_text()) > before, 30)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        took = time.monotonic() - began
        print(f"SIGTERM of the start: {took:.2f} s, exit {code}")
        assert code in (0, 1) and took <= 5.0, log.read_text()[before:]
    finally:
        signal_all(frozen, signal.SIGCONT)
        held.join(timeout=30)
        blocker.close()
