"""The small things people notice (issue 29): a bare `gpuledger` prints its help, Ctrl-C on
`log -f` stops it quietly, `budget apply --help` describes the file it reads, the server says it
started and finished once, and /metrics names its charset once. Real processes, no mocks."""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from ledger.core import budget
from ledger.sim.runner import Cluster, SimConfig, simulate
from ledger.sim.workload import Synthetic, synthetic
from tests.integration.serverkit import GPULEDGER, cli, env_for, make_token, start_server


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPULEDGER, *args], env=env_for(home), capture_output=True, text=True, timeout=120
    )


def test_a_bare_gpuledger_prints_its_help_not_an_error(tmp_path: Path) -> None:
    for args in ((), ("report",), ("budget",)):
        got = run(tmp_path / "ledger", *args)
        assert got.returncode == 0, got.stderr
        assert got.stdout.startswith(f"Usage: gpuledger {' '.join(args)}".rstrip()), got.stdout
        assert "Commands:" in got.stdout and got.stderr == ""
    bad = run(tmp_path / "ledger", "no-such-command")  # a wrong word is still one error line
    assert bad.returncode == 1 and bad.stderr.startswith("error: ")
    assert len(bad.stderr.strip().splitlines()) == 1


def test_ctrl_c_on_log_follow_stops_quietly(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    cli(home, "init", "--admin", "root", GPULEDGER_USER="root")
    proc = subprocess.Popen(
        [GPULEDGER, "log", "-f", "--json"],
        env=env_for(home, GPULEDGER_USER="root"),
        # a terminal's Ctrl-C, even when these tests run in the background (SIGINT ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the ledger's first event: it follows now
        assert "ledger.initialised" in first, first
        time.sleep(0.5)  # into its polling loop (either way it must stop quietly)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "error" not in err and "aborted" not in err, err


def test_budget_apply_help_describes_the_toml_it_reads(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    text = run(home, "budget", "apply", "--help").stdout
    for word in ("kind", "shares", "managers", "members", "member_shares", "--prune"):
        assert word in text, word
    # the example in the help is a budget file: it parses and plans as shown
    lines = text.split("For example:", 1)[1].split("Accounts the file", 1)[0].splitlines()
    example = "\n".join(line[6:] for line in lines if line.startswith("      "))
    parsed = budget.parse(example.encode(), "help")
    assert set(parsed.accounts) == {"ai2", "ai2/olmo"}
    cli(home, "init", "--admin", "root", GPULEDGER_USER="root")
    (tmp_path / "b.toml").write_text(example)
    plan = cli(home, "budget", "apply", str(tmp_path / "b.toml"), "--dry-run",
               GPULEDGER_USER="root")  # fmt: skip
    assert "ai2/olmo" in plan.stdout and "alice" in plan.stdout


def test_the_server_logs_start_and_end_once_and_metrics_name_one_charset(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    cli(home, "init", "--admin", "root", GPULEDGER_USER="root")
    token = make_token(home, "--user", "root")
    server = start_server(home, "--interval", "1s", "--log-level", "debug")  # uvicorn's lines
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        assert resp.status == 200
        kind = resp.getheader("content-type") or ""
        assert kind.count("charset") == 1, kind
        assert re.fullmatch(r"text/plain; version=[\d.]+; charset=utf-8", kind), kind
    finally:
        assert server.stop() == 0, server.log_path.read_text()
    deadline = time.monotonic() + 30
    while "stopped cleanly" not in server.log_path.read_text():
        assert time.monotonic() < deadline, server.log_path.read_text()
        time.sleep(0.1)
    text = server.log_path.read_text()
    assert len(re.findall(r"Started server process", text)) == 1, text
    assert len(re.findall(r"Finished server process", text)) == 1, text


def on_a_terminal(home: Path, *args: str) -> tuple[int, str, str]:
    """`gpuledger ARGS` with stderr on a pseudo-terminal: (exit code, stdout, the terminal)."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [GPULEDGER, *args],
        env=env_for(home, GPULEDGER_USER="root", COLUMNS="160"),
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    seen = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        seen += data
    out, _ = proc.communicate(timeout=600)  # reads stdout to its end and closes it
    os.close(master)
    return proc.returncode, out.decode(), seen.decode(errors="replace")


def test_long_commands_show_progress_with_a_known_total_on_a_terminal_only(
    tmp_path: Path,
) -> None:
    home = tmp_path / "ledger"
    now = math.floor(time.time())
    work = synthetic(Synthetic(seed=3, programs=2, teams=4, users=12, days=1.0,
                               capacity_gpus=48, load=2.0))  # fmt: skip
    simulate(work, SimConfig(cluster=Cluster(nodes=6), days=1.0, seed=3,
                             start_at=now - 1.5 * 86400), home)  # fmt: skip
    head = json.loads(cli(home, "audit", "verify", "--json").stdout)["store"]["head"]
    sql = "SELECT count(*) AS n FROM decisions"
    decided = json.loads(cli(home, "audit", "sql", sql, "--json").stdout)[0]["n"]
    assert head > 100 and decided > 10
    start, end = iso(now - 1.5 * 86400), iso(now - 0.5 * 86400)
    runs = {
        "projection rebuild": (("projection", "rebuild"), f"{head}/{head}"),
        "audit verify": (("audit", "verify"), f"{head}/{head}"),
        "replay": (("replay", "--all"), f"{decided}/{decided}"),
        # counted in the work it does (atk48-29 F3), shown in percent of its estimated work
        # since bfdbc149 (docs/replay-and-audit.md): no count a reader could check, to 100%
        "whatif": (("whatif", "--from", start, "--to", end), r"\b100% of the estimated work"),
    }
    for name, (args, total) in runs.items():
        code, _out, terminal = on_a_terminal(home, *args)
        assert code == 0, (name, terminal)
        plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal)
        assert re.search(total, plain) and "/?" not in plain, (name, terminal)
        piped = run(home, *args)  # not a terminal: no progress at all
        assert piped.returncode == 0 and piped.stderr == "", (name, piped.stderr)
