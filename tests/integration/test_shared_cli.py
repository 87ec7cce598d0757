"""Other OS users on the host get a working CLI (F16): `scripts/install-shared DIR` installs
gpu-ledger with Debian's /usr/bin/python3 into a directory everyone can read (the checkout's
.venv points at an interpreter under /root, 0700). A real non-root user the test creates runs
it against a real server, with its own token."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.integration.serverkit import cli, make_token, start_server
from tests.integration.userkit import os_user, shared_dir

ROOT = Path(__file__).resolve().parents[2]


def test_a_user_who_is_not_root_runs_the_shared_cli_against_the_server(tmp_path: Path) -> None:
    with os_user("glcli") as user, shared_dir() as top:
        dest = top / "gpuledger"
        done = subprocess.run(
            [str(ROOT / "scripts" / "install-shared"), "--link", str(dest)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert (dest / "bin" / "python3").resolve() == Path("/usr/bin/python3").resolve()
        home = tmp_path / "home"
        cli(home, "init", "--admin", "root", GPULEDGER_USER="root")
        budget = tmp_path / "b.toml"
        budget.write_text(
            '[accounts."ai2"]\nkind = "program"\n'
            f'[accounts."ai2/olmo"]\nkind = "project"\nmembers = ["{user.name}"]\n'
        )
        cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root")
        cli(home, "node", "add", "n1", "--gpus", "1", "--gpu-type", "h100", GPULEDGER_USER="root")
        token = make_token(home, "--user", user.name)
        node = cli(home, "token", "create", "--node", "n1", GPULEDGER_USER="root")
        assert " for node n1 (expires " in node.stderr, node.stderr  # F14: not "for root"
        server = start_server(home)
        try:
            env = [
                f"GPULEDGER_URL={server.url}",
                f"GPULEDGER_TOKEN={token}",
                "HOME=" + str(user.home),
            ]

            def as_user(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    ["runuser", "-u", user.name, "--", "env", "-i", "PATH=/usr/bin:/bin", *env,
                     str(dest / "bin" / "gpuledger"), *args],
                    capture_output=True, text=True, timeout=120, cwd=user.home,
                )  # fmt: skip

            sub = as_user("submit", "-A", "ai2/olmo", "-G", "1", "--", "true")
            assert sub.returncode == 0, sub.stderr
            ran = as_user("jobs", "--json")
            assert ran.returncode == 0, ran.stderr
            (row,) = json.loads(ran.stdout)
            assert (row["user"], row["workdir"]) == (user.name, str(user.home)), row
        finally:
            assert server.stop() == 0
