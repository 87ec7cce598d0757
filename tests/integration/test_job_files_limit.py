"""A job gets the open-files limit its server started with, never the one `serve` raised its
own to so its connection caps fit (atk39-25: a job under a server started with soft 1,024 and
hard 20,000 ran with 20,000 open files). Real `serve --executor local`, a real job."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.serverkit import cli, set_up_ledger, start_server
from tests.integration.userkit import shared_dir


def test_a_job_runs_with_the_servers_own_soft_files_limit_not_the_raised_one(
    tmp_path: Path,
) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    with shared_dir() as where:  # alice's job runs as nobody here
        where.chmod(0o777)
        _ran_with(home, where / "nofile")


def _ran_with(home: Path, seen: Path) -> None:
    server = start_server(home, "--interval", "0.2s", "--executor", "local", "--run-as",
                          "service", files=(1024, 4096))  # fmt: skip
    try:
        assert "open files: 4096" in server.log_path.read_text()  # the server raised its own
        # a submission that records no limits of its own (older, or `--propagate=NONE`); the
        # submitter's are in tests/integration/test_node_agents.py
        cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--propagate=NONE", "--", "sh", "-c",
            f"echo $(ulimit -Sn) $(ulimit -Hn) > {seen}", GPULEDGER_USER="alice")  # fmt: skip
        deadline = time.monotonic() + 60
        while not (seen.exists() and seen.read_text().strip()):
            assert time.monotonic() < deadline, server.log_path.read_text()[-3000:]
            time.sleep(0.1)
        assert seen.read_text().split() == ["1024", "4096"]
    finally:
        assert server.stop() == 0
