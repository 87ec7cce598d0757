"""A real `gpuledger serve` process on 127.0.0.1 (random port) for integration tests, plus a
ledger set up with people in every role and a token for each."""

from __future__ import annotations

import atexit
import functools
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.wire import SOCKET_NAME

GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"

BUDGET = """
[accounts."ai2"]
kind = "program"

[accounts."ai2/olmo"]
kind = "project"
members = ["alice", "bob"]
managers = ["mgr"]

[accounts."ai2/tulu"]
kind = "project"
members = ["carol"]
managers = ["othermgr"]
"""


def env_for(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env["GPULEDGER_HOME"] = str(home)
    env.update(extra)
    return env


_WORKDIRS: dict[Path, Path] = {}


def workdir(home: Path) -> Path:
    """Where the CLI runs for the ledger at `home`: a submission's working directory (and its
    default output file, `gpuledger-%j.out`). Its own directory under /tmp that every account may
    enter and write (a job of another user may run as `nobody`), never the repository."""
    got = _WORKDIRS.get(home)
    if got is None:
        got = _WORKDIRS[home] = Path(tempfile.mkdtemp(prefix="gpuledger-work-"))
        got.chmod(0o1777)
        atexit.register(shutil.rmtree, got, True)
    return got


def cli(
    home: Path,
    *args: str,
    ok: bool = True,
    timeout: float = 60,
    cwd: Path | None = None,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [GPULEDGER, *args], env=env_for(home, **env), capture_output=True, text=True,
        timeout=timeout, cwd=cwd if cwd is not None else workdir(home),
    )  # fmt: skip
    if ok:
        assert proc.returncode == 0, f"{args}: {proc.stderr}"
    return proc


def make_token(home: Path, *args: str, actor: str = "root") -> str:
    out = cli(home, "token", "create", *args, GPULEDGER_USER=actor)
    return out.stdout.strip()


@dataclass
class Server:
    home: Path
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"Content-Type": "application/json", **(headers or {})}
        if token is not None:
            headers["Authorization"] = token if token.startswith("Bearer") else f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, raw

    def read(self, path: str, token: str | None, patience_s: float = 90) -> Any:
        """A GET as the CLI makes it: a 429 (the caller's reads at once, or a minute's worth) is
        waited out for up to `patience_s`, then the answer must be a 200."""
        give_up = time.monotonic() + patience_s
        status, body = self.request("GET", path, token=token)
        while status == 429 and time.monotonic() < give_up:
            time.sleep(1)
            status, body = self.request("GET", path, token=token)
        assert status == 200, (path, status, body)
        return body

    def head(self) -> int:
        status, body = self.request("GET", "/v1/health")
        assert status == 200, body
        return int(body["head"])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def socket_read(home: Path, path: str, timeout: float = 60) -> Any:
    """A GET of the server running on `home` over its Unix socket, as the CLI's own read there:
    as the test's OS user, root (the kernel's peer credentials; root's reads are never metered),
    no token. OSError when no server answers there (none started, stopped, killed mid-read)."""
    conn = _UnixHTTP(str(home / SOCKET_NAME), timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        status, body = resp.status, resp.read()
    finally:
        conn.close()
    assert status == 200, (path, status, body)
    return json.loads(body)


def read_served(home: Path, query: str, *cli_args: str) -> Any:
    """Root's read `GET /v1/QUERY` of the server running on `home` (`socket_read`): the rows
    the CLI's `CLI_ARGS --json` prints through it, without a `gpuledger` process a read (a
    poll that started one every ~0.1 s spent ~0.2 s of CPU each, its imports); while no
    server answers there (stopped, killed, not started yet), the CLI's, which reads the
    store."""
    try:
        return socket_read(home, f"/v1/{query}")
    except OSError:  # no server there, or it went away mid-read
        return json.loads(cli(home, *cli_args, "--json", GPULEDGER_USER="root").stdout)


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def start_server(
    home: Path,
    *args: str,
    log_name: str = "serve.log",
    env: dict[str, str] | None = None,
    files: int | tuple[int, int] | None = None,
) -> Server:
    """`gpuledger serve` on `home`: with `--executor record` (placements recorded, nothing runs)
    unless `args` name an executor; the tests' users are ledger names, so with an executor that
    runs processes the jobs run as the service's account unless `args` say `--run-as`.
    `files`: the server's soft and hard limits of open files (as systemd's `LimitNOFILE=`; a
    pair: soft, hard)."""
    if "--executor" not in args:
        args = ("--executor", "record", *args)
    elif "--run-as" not in args and not {"none", "record"} & set(args):
        args = (*args, "--run-as", "service")
    log_path = home.parent / log_name
    with open(log_path, "ab") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [GPULEDGER, "serve", "--listen", "127.0.0.1:0", *args],
            env=env_for(home, **(env or {})),
            stdout=out,
            stderr=out,
            preexec_fn=None if files is None else functools.partial(_limit_files, files),
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        m = re.search(r"listening on (https?://127\.0\.0\.1:\d+)", text)
        if m:
            return Server(home, proc, m.group(1), log_path)
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}:\n{text}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"serve did not start:\n{log_path.read_text()}")


def _limit_files(files: int | tuple[int, int]) -> None:
    import resource

    resource.setrlimit(
        resource.RLIMIT_NOFILE, files if isinstance(files, tuple) else (files, files)
    )


def init_on_store(
    home: Path, tmp: Path, store: str, node: str = "n1", gpus: int = 8, gpu_type: str = "h100"
) -> None:
    """A ledger on `store` (PostgreSQL's DSN): root admin, the budgets of `BUDGET`, one node."""
    cli(home, "init", "--admin", "root", "--store", store)
    budget = tmp / "budget.toml"
    budget.write_text(BUDGET)
    cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root")
    cli(home, "node", "add", node, "--gpus", str(gpus), "--gpu-type", gpu_type,
        GPULEDGER_USER="root")  # fmt: skip


@dataclass
class ServerWorld:
    """A test module's server and the tokens of the people it signs in as."""

    server: Server
    tokens: dict[str, str]


def set_up_long_queue(home: Path, tmp: Path) -> None:
    """`set_up_ledger`, then 3,000 pending 8-GPU jobs of bob's with 400-byte labels: pages of
    the queue large enough that one left unread fills a connection's buffers."""
    from ledger.store.application import Ledger
    from schemas import commands as c

    set_up_ledger(home, tmp)
    ledger = Ledger(home)
    try:
        submit = c.SubmitJob(actor="bob", account="ai2/olmo", gpus=8, min_runtime_s=3600,
                             labels={"note": "x" * 400})  # fmt: skip
        for _ in range(30):
            ledger.execute_all([submit] * 100)
    finally:
        ledger.close()


def set_up_ledger(home: Path, tmp: Path) -> None:
    """root admin; ai2/olmo (alice, bob; manager mgr), ai2/tulu (carol; manager othermgr);
    node n1 with 8 GPUs; job 1 by alice, resumable."""
    cli(home, "init", "--admin", "root")
    budget = tmp / "budget.toml"
    budget.write_text(BUDGET)
    cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root")
    cli(home, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100", GPULEDGER_USER="root")
    cli(
        home, "submit", "-A", "ai2/olmo", "-G", "1", "--resumable", "--min-runtime", "1h",
        GPULEDGER_USER="alice",
    )  # fmt: skip
