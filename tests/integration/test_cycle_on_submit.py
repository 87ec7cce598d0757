"""A submission brings the next cycle forward (issue 24: submit to running within one cycle
interval plus the engine's own start): with a one-hour interval, a job submitted to a running
server is placed by a cycle its submission brings forward, not an hour later; a second
submission within the interval waits for the regular cycle (at most one early cycle per
interval)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from tests.integration.serverkit import cli, set_up_ledger, start_server


def test_a_submission_is_placed_by_a_cycle_it_brings_forward_once_per_interval(
    tmp_path: Path,
) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)  # job 1 is pending: the first cycle at start places it
    server = start_server(home, "--interval", "1h")
    try:

        def jobs() -> dict[int, str]:
            rows = json.loads(cli(home, "jobs", "--json", GPULEDGER_USER="root").stdout)
            return {r["job_id"]: r["status"] for r in rows}

        def cycles() -> int:
            return int(json.loads(cli(home, "status", "--json").stdout)["cycles"])

        def wait(what: str, pred: object, timeout: float = 60) -> None:
            deadline = time.monotonic() + timeout
            while not pred():  # type: ignore[operator]
                assert time.monotonic() < deadline, (what, jobs(), server.log_path.read_text())
                time.sleep(0.1)

        wait("the first cycle", lambda: jobs().get(1) == "running")
        first = cycles()
        cli(home, "submit", "-A", "ai2/olmo", "-G", "1", GPULEDGER_USER="bob")
        wait("the submission's cycle", lambda: jobs().get(2) == "running")
        assert cycles() == first + 1
        cli(home, "submit", "-A", "ai2/olmo", "-G", "1", GPULEDGER_USER="bob")
        time.sleep(2)
        assert jobs()[3] == "pending" and cycles() == first + 1  # the next is the hour's
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0, server.log_path.read_text()
