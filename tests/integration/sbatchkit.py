"""A researcher's ledger for the sbatch-like tests (test_sbatch_like.py, test_true_records.py):
the OS account its jobs run as, an initialised ledger copied from one made once, and a
`serve --executor local` that runs jobs as their owners."""

from __future__ import annotations

import atexit
import grp
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.integration import userkit
from tests.integration.serverkit import cli, make_token, start_server
from tests.integration.waits import wait_for

USER = "gl23alice"
"""A person's OS account the test creates (uid >= 1000), in a supplementary group `TEAM`."""
TEAM = "gl23team"
BUDGET = f"""
[accounts."ai2"]
kind = "program"

[accounts."ai2/olmo"]
kind = "project"
members = ["{USER}", "ghost"]
managers = ["mgr"]
"""


def os_user(name: str = USER, group: str = TEAM) -> pwd.struct_passwd:
    """The OS account `name` with a home directory and the supplementary group `group`,
    made when missing (kept between runs: the same name each time)."""
    assert os.geteuid() == 0, "the run-as tests create OS accounts: run them as root"
    with userkit.accounts_locked():
        try:
            grp.getgrnam(group)
        except KeyError:
            subprocess.run(["groupadd", group], check=True)
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-G", group, name], check=True)
            pw = pwd.getpwnam(name)
    assert pw.pw_uid >= 1000, pw
    return pw


TOKEN_USERS = (USER, "ghost", "mgr", "root")
"""The people `Served` has a token of."""
_MADE: list[tuple[Path, dict[str, str]]] = []
"""The ledger `ledger_home` copies, made once a process, and its tokens."""
_TOKENS: dict[Path, dict[str, str]] = {}
"""The tokens of each home `ledger_home` gave (the copied ones)."""


def ledger_home(tmp_path: Path) -> Path:
    """An initialised ledger (admin root), the budget above, node n1 with 8 GPUs, and a token of
    each of `TOKEN_USERS`: a copy of one made once (each test its own fresh ledger; making it
    took 7 `gpuledger` processes a test, ~40 of the file's and test_true_records')."""
    os_user()
    if not _MADE:
        made = Path(tempfile.mkdtemp(prefix="gpuledger-sbatch-home-")) / "home"
        atexit.register(shutil.rmtree, made.parent, True)
        cli(made, "init", "--admin", "root", GPULEDGER_USER="root")
        budget = made.parent / "budget.toml"
        budget.write_text(BUDGET)
        cli(made, "budget", "apply", str(budget), GPULEDGER_USER="root")
        cli(made, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100", GPULEDGER_USER="root")
        _MADE.append((made, {u: make_token(made, "--user", u) for u in TOKEN_USERS}))
    made, tokens = _MADE[0]
    home = tmp_path / "home"
    shutil.copytree(made, home)
    _TOKENS[home] = tokens
    return home


class Served:
    """A `serve --executor local` that runs jobs as their owners, and tokens for its users."""

    def __init__(self, home: Path, *extra: str) -> None:
        self.home = home
        made = _TOKENS.get(home)
        self.tokens = made or {u: make_token(home, "--user", u) for u in TOKEN_USERS}
        self.server = start_server(
            home, "--executor", "local", "--run-as", "submitter", "--interval", "0.2s", *extra,
        )  # fmt: skip

    def cli(self, user: str, *args: str, ok: bool = True, cwd: Path | None = None) -> Any:
        return cli(
            self.home, *args, ok=ok, cwd=cwd, GPULEDGER_URL=self.server.url,
            GPULEDGER_TOKEN=self.tokens[user],
        )  # fmt: skip

    def submit(self, *args: str, user: str = USER) -> int:
        out = self.cli(user, "submit", "-A", "ai2/olmo", "-G", "1", "--json", *args)
        got = json.loads(out.stdout)
        return int(got["job_id"] if isinstance(got, dict) else got[0]["job_id"])

    def jobs(self) -> dict[int, dict[str, Any]]:
        rows = json.loads(self.cli("root", "jobs", "--json", "--limit", "1000").stdout)
        return {r["job_id"]: r for r in rows}

    def events(self) -> list[dict[str, Any]]:
        rows = json.loads(self.cli("root", "log", "--json", "--limit", "10000").stdout)
        return [r["event"] | {"position": r["position"]} for r in rows if r["event"]]

    def wait(self, what: str, job_id: int, status: str, timeout: float = 60) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:  # root's read of the server, as `jobs()` makes
            # it without a `gpuledger` process a poll
            rows = self.server.read(f"/v1/jobs?job_ids={job_id}", self.tokens["root"])
            row = next((r for r in rows if r["job_id"] == job_id), None)  # (an array: its tasks)
            return row if row is not None and row["status"] == status else None

        return wait_for(f"{what} (job {job_id} {status})", reached, timeout, self.why)

    def why(self) -> str:
        return self.server.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        assert self.server.stop() == 0
