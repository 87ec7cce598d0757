"""`gpuledger serve` as a real process: lifecycle, status, config, client mode, crash safety."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from ledger.application import Ledger
from schemas import events as e
from tests.integration.serverkit import cli, make_token, set_up_ledger, start_server


def test_sigterm_stops_cleanly_with_exit_0_and_status_tells_up_from_down(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    server = start_server(home, "--interval", "0.2s")
    try:
        status = cli(home, "status")  # through the Unix socket in the data directory
        assert status.stdout.startswith("up: gpu-ledger ")
        health = json.loads(cli(home, "status", "--json").stdout)
        assert health["status"] == "up" and health["head"] >= 1
        assert {"last_cycle_at", "last_cycle_s", "projection_lag", "relay_lag"} <= set(health)
        deadline = time.monotonic() + 20
        while json.loads(cli(home, "jobs", "--json").stdout)[0]["status"] != "running":
            assert time.monotonic() < deadline, "job 1 never ran"
            time.sleep(0.1)
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0, server.log_path.read_text()
    assert "stopped cleanly" in server.log_path.read_text()
    assert not (home / "gpuledger.sock").exists()
    down = cli(home, "status", ok=False)
    assert down.returncode == 3 and down.stdout.startswith("down:")
    # the job the server placed is still running in the ledger: stopping never ends work
    jobs = json.loads(cli(home, "jobs", "--json", GPULEDGER_USER="root").stdout)
    assert jobs[0]["status"] == "running"


def test_the_config_file_rejects_unknown_keys_and_flags_override_it(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    cli(home, "init", "--admin", "root")
    bad = tmp_path / "bad.toml"
    bad.write_text('listen = "127.0.0.1:0"\npolicyy = "fifo"\n')
    proc = cli(home, "serve", "--config", str(bad), ok=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: config {bad}: Object contains unknown field `policyy` "
        "(see examples/serve.toml) [invalid]"
    ]
    good = tmp_path / "good.toml"
    good.write_text('listen = "127.0.0.1:1"\nlog_format = "json"\npolicy = "fifo"\n')
    server = start_server(home, "--config", str(good))  # --listen 127.0.0.1:0 overrides
    try:
        assert server.port != 1
    finally:
        assert server.stop() == 0
    lines = server.log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # --log-format json: every line is JSON
    assert any("policy fifo" in r["msg"] for r in records)

    # what the service ran with is an event; a restart with the same settings adds none
    def configured() -> list[dict[str, object]]:
        log = json.loads(cli(home, "log", "--json").stdout)
        return [r["event"] for r in log if r["event"]["type"] == "service.configured.v1"]

    (first,) = configured()
    assert first["policy"] == {"version": "fifo-1"} and first["executor"] == "none"
    again = start_server(home, "--config", str(good), log_name="again.log")
    assert again.stop() == 0
    assert len(configured()) == 1
    other = start_server(home, "--policy", "fairshare", "--margin", "0.3", log_name="o.log")
    assert other.stop() == 0
    assert configured()[-1]["policy"]["margin"] == 0.3  # type: ignore[index]


def test_embedded_and_client_modes_print_byte_identical_json(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    admin = make_token(home, "--user", "root", "--name", "ops")
    server = start_server(home, "--interval", "0.2s")
    at = "2030-01-01T00:00:00"
    reads = [
        ["jobs", "--json"],
        ["jobs", "--json", "--status", "finished", "--limit", "5"],
        ["node", "list", "--json"],
        ["account", "tree", "--json"],
        ["log", "--json", "--after", "3", "--limit", "50"],
        ["log", "--json", "--tail", "5"],
        ["token", "list", "--json"],
        ["shares", "--json", "--at", at],
        ["usage", "--json", "--at", at, "--by", "user"],
        ["report", "delivered", "--json", "--at", at, "--window", "3650d"],
        ["projection", "status", "--json"],
        ["audit", "preemptions", "--json"],
        ["audit", "budget-changes", "--json"],
    ]
    try:
        url = {"GPULEDGER_URL": server.url, "GPULEDGER_TOKEN": admin}
        cli(home, "submit", "-A", "ai2/olmo", "-G", "2", "--", "true", GPULEDGER_USER="bob", **url)
        deadline = time.monotonic() + 20
        while any(j["status"] != "running" for j in json.loads(cli(home, "jobs", "--json").stdout)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        cli(home, "preempt", "2", "--reason", "maintenance", **url)
        for job in ("1",):
            cli(home, "cancel", job, **url)  # ended jobs: nothing depends on the clock
        time.sleep(0.5)  # a cycle with nothing to do appends nothing
        over_http = [cli(home, *r, **url).stdout for r in reads]
        over_socket = [cli(home, *r).stdout for r in reads]
    finally:
        assert server.stop() == 0
    embedded = [cli(home, *r).stdout for r in reads]
    for r, a, b, c in zip(reads, over_http, over_socket, embedded, strict=True):
        assert a == c, r
        assert b == c, r
    assert all(out.strip() not in ("", "[]") for out in embedded[:8])  # the rest may be empty


def test_errors_print_the_same_line_and_exit_code_in_both_modes(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    bad = [
        (["submit", "-A", "ai2/tulu", "-G", "1"], "alice"),
        (["cancel", "99"], "alice"),
        (["node", "drain", "n1", "--reason", "x"], "alice"),
        (["share", "set", "ai2/olmo", "--", "-1"], "root"),
    ]
    embedded = [cli(home, *args, ok=False, GPULEDGER_USER=who) for args, who in bad]
    server = start_server(home, "--interval", "1h")
    try:
        served = [cli(home, *args, ok=False, GPULEDGER_USER=who) for args, who in bad]
    finally:
        assert server.stop() == 0
    for a, b in zip(embedded, served, strict=True):
        assert (a.returncode, a.stderr) == (b.returncode, b.stderr)
        assert a.returncode == 1 and a.stderr.startswith("error: ") and a.stderr.count("\n") == 1


def test_kill_9_under_8_concurrent_clients_loses_and_doubles_nothing(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    token = make_token(home, "--user", "alice")
    server = start_server(home, "--interval", "0.5s")
    acked: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def client(n: int) -> None:
        for i in range(2000):
            if stop.is_set():
                return
            req = f"c{n}-{i}"
            body = {"actor": "", "account": "ai2/olmo", "gpus": 1, "labels": {"req": req}}
            try:
                status, answer = server.request("POST", "/v1/commands/submit", body, token)
            except (OSError, http.client.HTTPException):
                return  # the server is gone: this request was never acknowledged
            if status == 200:
                with lock:
                    acked[req] = answer["events"][0]["job_id"]

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 400 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(timeout=30)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert len(acked) >= 400
    # after the crash: every acknowledged submit exactly once; nothing doubled; chain intact
    submitted = [ev for _, ev in Ledger(home).read(0, 1_000_000) if isinstance(ev, e.JobSubmitted)]
    seen = Counter(ev.labels.get("req") for ev in submitted if "req" in ev.labels)
    assert max(seen.values()) == 1
    by_req = {ev.labels["req"]: ev.job_id for ev in submitted if "req" in ev.labels}
    assert {r: by_req.get(r) for r in acked} == acked
    assert "chain intact" in cli(home, "audit", "verify").stdout
    again = start_server(home, "--interval", "1h", log_name="serve2.log")
    try:
        assert again.head() >= len(submitted)
    finally:
        assert again.stop() == 0


def test_tls_serves_https_and_the_cli_talks_to_it(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    token = make_token(home, "--user", "alice")
    server = start_server(home, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        m = re.search(r"listening on (https://127\.0\.0\.1:\d+)", server.log_path.read_text())
        assert m, server.log_path.read_text()
        env = {"GPULEDGER_URL": m.group(1), "GPULEDGER_TOKEN": token}
        out = cli(home, "jobs", "--json", GPULEDGER_CA_FILE=str(cert), **env)
        assert json.loads(out.stdout)[0]["user"] == "alice"
        untrusted = cli(home, "jobs", "--json", ok=False, **env)  # no CA: refused
        assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    finally:
        assert server.stop() == 0


def test_status_names_a_relay_that_cannot_publish_while_scheduling_goes_on(
    tmp_path: Path,
) -> None:
    """A relay that cannot reach its broker never dies silently: health and `status` carry its
    state and the reason, while the server keeps taking commands and running cycles."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{s.getsockname()[1]}"
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    server = start_server(home, "--interval", "0.2s", "--kafka", bootstrap)
    try:
        deadline = time.monotonic() + 30
        while True:
            health = json.loads(cli(home, "status", "--json").stdout)
            if health["relay_state"] == "unavailable":
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.2)
        assert bootstrap in health["relay_error"], health
        assert health["relay_lag"] >= 1
        assert "unavailable: " in cli(home, "status").stdout
        cycles = health["cycles"]
        cli(home, "--as", "alice", "submit", "-A", "ai2/olmo", "-G", "1", "--", "true")
        while json.loads(cli(home, "status", "--json").stdout)["cycles"] <= cycles:
            assert time.monotonic() < deadline + 30, "no cycle while the broker is away"
            time.sleep(0.2)
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0, server.log_path.read_text()
