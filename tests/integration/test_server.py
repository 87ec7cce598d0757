"""`gpuledger serve` as a real process: lifecycle, status, config, client mode, crash safety."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ledger.store.application import Ledger
from schemas import events as e
from tests.integration.serverkit import (
    BUDGET,
    Server,
    cli,
    make_token,
    set_up_ledger,
    start_server,
)


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


def test_clients_that_never_read_their_answers_do_not_hold_a_stopping_server(
    tmp_path: Path,
) -> None:
    """atk34-25 F1b: five clients ask for a large page and never read it; SIGTERM waited for
    their answers to be sent (over 60 s, its data directory held, a new server refused). The
    stop waits `SEND_WAIT_S` (10 s) for them, then closes their connections."""
    import socket

    from schemas import commands as c

    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    led = Ledger(home)
    try:
        for _ in range(40):
            led.execute_all([c.SubmitJob(actor="bob", account="ai2/olmo", gpus=8)] * 250)
    finally:
        led.close()
    token = make_token(home, "--user", "bob")
    server = start_server(home, "--interval", "1s")
    stuck = []
    try:
        for _ in range(5):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(f"GET /v1/jobs?limit=10000 HTTP/1.1\r\nHost: x\r\n"
                         f"Authorization: Bearer {token}\r\n\r\n".encode())  # fmt: skip
            stuck.append(sock)
            time.sleep(1.0)  # admitted one after another (two at once per person)
        time.sleep(2.0)
        began = time.monotonic()
        code = server.stop(signal.SIGTERM, timeout=90)
        took = time.monotonic() - began
    finally:
        for sock in stuck:
            sock.close()
        server.stop(signal.SIGKILL)
    assert code == 0 and took < 25, (code, took, server.log_path.read_text()[-2000:])


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
        return [r["event"] for r in log if r["event"]["type"] == "service.configured.v2"]

    (first,) = configured()
    assert first["policy"] == {"version": "fifo-1"} and first["executor"] == "record"
    assert first["grace_s"] == 30  # the service's --grace (atk48-23 F4)
    again = start_server(home, "--config", str(good), log_name="again.log")
    assert again.stop() == 0
    assert len(configured()) == 1
    other = start_server(home, "--policy", "fairshare", "--margin", "0.3", log_name="o.log")
    assert other.stop() == 0
    assert configured()[-1]["policy"]["margin"] == 0.3  # type: ignore[index]


AT = "<at>"
"""Every read that depends on the clock is asked at one moment in every mode: the test puts
there a moment after the log's last event (a moment in the future is refused)."""

READ_COMMANDS: dict[str, list[str]] = {
    "accounts": ["account", "tree", "--json"],
    "nodes": ["node", "list", "--json"],
    "jobs": ["jobs", "--json", "--at", AT],
    "log": ["log", "--json", "--after", "3", "--limit", "50"],
    "shares": ["shares", "--json", "--at", AT],
    "usage": ["usage", "--json", "--at", AT, "--by", "user"],
    "delivered": ["report", "delivered", "--json", "--at", AT, "--window", "3650d"],
    "queue": ["queue", "--json", "--at", AT],
    "queue_total": ["queue", "--limit", "1", "--at", AT],  # "1 of N shown" under the table
    "priority": ["priority", "--json", "--at", AT],
    "explain": ["explain", "4", "--json", "--at", AT],
    "squatters": ["squatters", "--json", "--at", AT, "--threshold", "100", "--after", "0s"],
    "projection": ["projection", "status", "--json"],
    "audit_preemptions": ["audit", "preemptions", "--json"],
    "preemptions": ["report", "preemptions", "--json", "--since", "2000-01-01", "--at", AT],
    "audit_budget_changes": ["audit", "budget-changes", "--json"],
}
"""One CLI command per read the API serves (the test checks none is missing)."""

MORE = [
    ["jobs", "--json", "--status", "finished", "--limit", "5"],
    ["log", "--json", "--tail", "5"],
    ["token", "list", "--json"],
    ["explain", "1", "--json", "--at", AT],
    ["explain", "2", "--json", "--at", AT],
    ["queue", "--json", "--at", AT, "--policy", "fifo", "--state", "pending"],
    # the audit tables in every format (POST /v1/audit/table beside a server)
    ["audit", "sql", "SELECT tag, count(*) AS n FROM events GROUP BY tag ORDER BY tag"],
    ["audit", "sql", "SELECT * FROM events ORDER BY position", "--format", "csv"],
    ["audit", "sql", "SELECT position, tag FROM events ORDER BY position", "--json"],
    ["audit", "job", "2", "--format", "csv"],
    ["audit", "job", "2", "--json"],
    ["audit", "job", "1"],
    ["audit", "preemptions", "--format", "csv"],
    ["audit", "budget-changes", "--format", "csv"],
    ["audit", "budget-changes"],
    ["audit", "verify"],
    ["audit", "verify", "--json"],
    ["audit", "check"],
    ["audit", "check", "--json"],
    ["budget", "apply", "budget2.toml", "--dry-run"],
    ["budget", "apply", "budget2.toml", "--dry-run", "--prune"],
]


def _rested(home: Path, read: list[str], cwd: Path, **env: str) -> str:
    """`read`'s output through the server, waited for when refused for its person's rest: an
    audit verify that took t keeps root's next one 429 for 3 t (`AuditLane.REST`); on a loaded
    CI machine the HTTP one took ~15 s and the socket one right after was refused "retry in
    45 s" (stop 57's CI)."""
    for _ in range(3):
        proc = cli(home, *read, ok=False, cwd=cwd, **env)
        if proc.returncode == 0:
            return proc.stdout
        rest = re.search(r"ran an audit \w+ a moment ago.*retry in (\d+) s", proc.stderr)
        assert rest, f"{read}: {proc.stderr}"
        time.sleep(int(rest[1]) + 0.5)
    raise AssertionError(f"{read}: still refused: {proc.stderr}")


def test_embedded_and_client_modes_print_byte_identical_output(tmp_path: Path) -> None:
    """Every read (and every audit export, and the budget plan) prints the same bytes
    embedded, over HTTP and over the Unix socket; time-dependent reads are asked `--at` one
    moment. The HTTP client runs with a data directory that does not exist: it never opens
    the store or the projection."""
    from ledger.reads.table import READS

    assert set(READS) == set(READ_COMMANDS), "a read the API serves is missing here"
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    (tmp_path / "budget2.toml").write_text(
        BUDGET.replace('members = ["carol"]', 'members = ["carol", "dave"]')
    )
    admin = make_token(home, "--user", "root", "--name", "ops")
    url = {"GPULEDGER_URL": "", "GPULEDGER_TOKEN": admin}
    server = start_server(home, "--interval", "0.2s")
    try:
        url["GPULEDGER_URL"] = server.url
        cli(home, "submit", "-A", "ai2/olmo", "-G", "2", "--", "true", GPULEDGER_USER="bob", **url)
        deadline = time.monotonic() + 20
        while any(j["status"] != "running" for j in json.loads(cli(home, "jobs", "--json").stdout)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        cli(home, "preempt", "2", "--reason", "maintenance", **url)
        # job 4 stays pending (job 1 holds a GPU inside its contract); job 1 keeps running
        cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--", "true", GPULEDGER_USER="bob", **url)
        cli(home, "cancel", "3", **url)
        cli(home, "submit", "-A", "ai2/tulu", "-G", "8", GPULEDGER_USER="carol", **url)
    finally:
        assert server.stop() == 0
    # servers that run one cycle at start and none after (the first records its settings, the
    # second has nothing to record): nothing moves under the reads
    server = start_server(home, "--interval", "1h", log_name="serve2.log")
    _one_cycle(server)
    assert server.stop() == 0
    at = f"{time.time():.3f}"  # after the last event, before every read
    reads = [[at if word == AT else word for word in r] for r in [*READ_COMMANDS.values(), *MORE]]
    # the embedded reads on a copy of the data directory (no server runs on it), beside the
    # server's reads of the original: one log at one position, read in a process of its own
    # (the three modes one after the other were ~150 CLI processes, 170 s in CI)
    copy = tmp_path / "copy" / "ledger"
    shutil.copytree(home, copy)
    with ThreadPoolExecutor(1) as beside:
        embedding = beside.submit(lambda: [cli(copy, *r, cwd=tmp_path).stdout for r in reads])
        server = start_server(home, "--interval", "1h", log_name="serve3.log")
        nowhere = tmp_path / "no-such-home"
        try:
            url["GPULEDGER_URL"] = server.url
            _one_cycle(server)
            head = server.head()
            # one CLI process at a time: the reads are root's, and a person's queries are
            # capped (`audit sql` four at a time was refused "'root' has 2 queries running
            # already") and one `audit verify` of a person's runs at a time
            over_http = [_rested(nowhere, r, tmp_path, **url) for r in reads]
            over_socket = [_rested(home, r, tmp_path) for r in reads]
            assert server.head() == head, "the log moved under the reads"
        finally:
            assert server.stop() == 0
        embedded = embedding.result()
    assert not nowhere.exists()
    for r, a, b, c in zip(reads, over_http, over_socket, embedded, strict=True):
        assert a == c, r
        assert b == c, r
    by_name = dict(zip(READ_COMMANDS, embedded, strict=False))
    for name in ("accounts", "nodes", "jobs", "log", "shares", "usage", "queue", "priority"):
        assert by_name[name].strip() not in ("", "[]"), name  # the others may be empty
    assert json.loads(by_name["explain"])["status"] == "pending"
    assert json.loads(by_name["queue"])[0]["job_id"] == 4
    assert "+ member dave" in embedded[-2] or "dave" in embedded[-2]


def test_budget_apply_and_audit_exports_go_through_a_running_server(tmp_path: Path) -> None:
    """`budget apply` and the audit exports work beside a running server (they used to be
    refused): the plan is the server's, the apply one atomic batch as the caller, errors are
    the embedded lines, a Parquet export is the same file, and an audit SELECT cannot read the
    server's files."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    (tmp_path / "budget2.toml").write_text(
        BUDGET.replace('members = ["carol"]', 'members = ["carol", "dave"]')
    )
    (tmp_path / "bad.toml").write_text('[accounts."ai2"]\nkind = "galaxy"\n')
    embedded_bad = cli(home, "budget", "apply", "bad.toml", ok=False, cwd=tmp_path)
    embedded_denied = cli(
        home, "budget", "apply", "budget2.toml", ok=False, cwd=tmp_path, GPULEDGER_USER="alice"
    )
    server = start_server(home, "--interval", "1h")
    try:
        bad = cli(home, "budget", "apply", "bad.toml", ok=False, cwd=tmp_path)
        denied = cli(
            home, "budget", "apply", "budget2.toml", ok=False, cwd=tmp_path, GPULEDGER_USER="alice"
        )
        head = server.head()
        sql = f"SELECT * FROM events WHERE position <= {head} ORDER BY position"
        cli(home, "audit", "sql", sql, "--format", "parquet", "--output",
            str(tmp_path / "served.parquet"))  # fmt: skip
        snoop = cli(home, "audit", "sql", "SELECT * FROM read_text('/etc/passwd')", ok=False)
        applied = cli(home, "budget", "apply", "budget2.toml", cwd=tmp_path, GPULEDGER_USER="root")
        tree = json.loads(cli(home, "account", "tree", "--json").stdout)
        again = cli(home, "budget", "apply", "budget2.toml", cwd=tmp_path, GPULEDGER_USER="root")
        refused = [
            cli(home, *args, ok=False, cwd=tmp_path)
            for args in (["replay", "--all"], ["projection", "rebuild"], ["up", "--for", "1s"])
        ]
        after = server.head()
    finally:
        assert server.stop() == 0
    cli(home, "audit", "sql", sql, "--format", "parquet", "--output",
        str(tmp_path / "embedded.parquet"))  # fmt: skip
    assert (bad.returncode, bad.stderr) == (embedded_bad.returncode, embedded_bad.stderr)
    assert bad.stderr.startswith("error: bad.toml: ") and bad.stderr.count("\n") == 1
    assert (denied.returncode, denied.stderr, denied.stdout) == (
        embedded_denied.returncode, embedded_denied.stderr, embedded_denied.stdout,
    )  # fmt: skip
    assert denied.returncode == 1 and "[forbidden]" in denied.stderr
    assert (tmp_path / "served.parquet").read_bytes() == (
        tmp_path / "embedded.parquet"
    ).read_bytes()
    assert snoop.returncode == 1 and "root:" not in snoop.stdout + snoop.stderr
    assert snoop.stderr.startswith("error: ") and snoop.stderr.count("\n") == 1
    m = re.fullmatch(
        r"  \+ member dave -> ai2/tulu shares=1\n"
        r"applied 1 change as (\d+) events \(position (\d+)\)\n",
        applied.stdout,
    )
    assert m is not None, applied.stdout
    tulu = next(a for a in _walk(tree) if a["path"] == "ai2/tulu")
    assert "dave" in str(tulu)
    assert again.stdout == "no changes: the ledger matches the budget file\n"
    for r in refused:  # commands that work on the data directory itself refuse beside a server
        assert r.returncode == 1 and r.stderr == (
            "error: this command needs the data directory, and a server owns it (run it on the "
            "server's host with the server stopped, or use the API) [environment]\n"
        ), r.stderr
    assert after == head + int(m.group(1)) == int(m.group(2))
    events = [ev for _, ev in Ledger(home).read(head, 10)]
    added = [ev for ev in events if isinstance(ev, e.MemberAdded)]
    assert [(ev.user, ev.project, ev.actor, ev.real_actor) for ev in added] == [
        ("dave", "ai2/tulu", "root", None)
    ]


def _one_cycle(server: Server) -> None:
    deadline = time.monotonic() + 30
    while server.request("GET", "/v1/health")[1]["cycles"] < 1:
        assert time.monotonic() < deadline, "no cycle ran"
        time.sleep(0.1)


def _walk(nodes: list[dict[str, object]]) -> list[dict[str, object]]:
    out = []
    for n in nodes:
        out.append(n)
        out += _walk(n.get("children", []))  # type: ignore[arg-type]
    return out


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


def _post_raw(server: Server, path: str, body: bytes, token: str | None) -> tuple[int, str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type") or "", json.loads(resp.read())
    finally:
        conn.close()


def _callers_appends(server: Any, token: str, after: int, until: int) -> int:
    """How many events in (after, until] came from a caller, not the service (`@...`), once the
    projection the log is read from holds `until`."""
    give_up = time.monotonic() + 60
    while True:
        rows = server.read(f"/v1/log?after={after}&limit=1000", token)
        if max((r["position"] for r in rows), default=after) >= until or time.monotonic() > give_up:
            break
        time.sleep(0.2)
    assert max((r["position"] for r in rows), default=after) >= until, rows
    return sum(
        1 for r in rows if r["position"] <= until and not str(r["actor"] or "").startswith("@")
    )


def test_the_command_routes_answer_every_body_and_caller_as_the_framework_does(
    tmp_path: Path,
) -> None:
    """The command routes' hot path (`ledger.server.commands`) answers strict bodies itself and
    leaves the rest to the framework: lenient values still convert, malformed JSON and missing or
    revoked tokens get the framework's problem+json, rejections their LedgerError code, and every
    request is timed in the API histogram. (Lenient values are refused since bodies are strict.)"""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    alice, root = make_token(home, "--user", "alice"), make_token(home, "--user", "root")
    server = start_server(home, "--interval", "1h")
    path = "/v1/commands/submit"
    try:
        ok = _post_raw(server, path, b'{"actor":"","account":"ai2/olmo","gpus":1}', alice)
        assert ok[:2] == (200, "application/json")
        assert [(ev["type"], ev["actor"], ev["gpus"]) for ev in ok[2]["events"]] == [
            ("job.submitted.v2", "alice", 1)
        ] and ok[2]["position"] == server.head()
        # strict bodies (docs/security.md T14): a number sent as a string is refused, not coerced
        lenient = _post_raw(server, path, b'{"actor":"","account":"ai2/olmo","gpus":"2"}', alice)
        assert lenient[0] == 400 and server.head() == ok[2]["position"]
        head = server.head()
        cases = [
            (b'{"actor":"","account":', alice, 400, "invalid"),  # strict gate: one line
            (b'{"actor":"","account":"ai2/olmo","gpus":1}', None, 401, "unauthenticated"),
            (b'{"actor":"","account":"ai2/tulu","gpus":1}', alice, 403, "forbidden"),
            (b'{"actor":"","account":"ai2/olmo","gpus":1000}', alice, 400, "invalid"),
        ]
        for body, token, status, code in cases:
            got = _post_raw(server, path, body, token)
            assert got[:2] == (status, "application/problem+json"), (body, got)
            assert got[2]["status"] == status and got[2]["code"] == code, (body, got)
        revoke = {"actor": "", "token_id": alice.split("_")[1]}
        assert server.request("POST", "/v1/commands/token.revoke", revoke, root)[0] == 200
        after = server.head()
        # the rejections appended nothing: after `head` only the revoke came from a caller (the
        # submission brings the next cycle forward: the dispatcher's own appends, actors `@...`,
        # may land in between under load)
        assert _callers_appends(server, root, head, after) == 1
        denied = _post_raw(server, path, b'{"actor":"","account":"ai2/olmo","gpus":1}', alice)
        assert denied[0] == 401  # revoked: refused at once, and appended nothing (counted by
        # callers' events too: the cycle the submission brought forward may land only now)
        assert _callers_appends(server, root, after, server.head()) == 0
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {root}"})
        scrape = conn.getresponse().read().decode()
        conn.close()
        counts = {
            m.group(1): float(m.group(2))
            for m in re.finditer(
                r'gpuledger_api_request_seconds_count\{method="POST",route="/v1/commands/submit",'
                r'status="(\d+)"\} (\S+)',
                scrape,
            )
        }
        assert counts == {"200": 1.0, "400": 3.0, "401": 2.0, "403": 1.0}, counts
    finally:
        assert server.stop() == 0
