"""The reverse proxy docs/server.md documents, run: Debian's nginx with the documented block
(TLS left out, the server's port in place of 8470) in front of a real `gpuledger serve`. The
dashboard, `/`, `/metrics` and the API answer through it as they do directly, and its read
timeout fits the longest request, the budget review's what-if (atk50-29 F2: the block proxied
`/v1/` only, the dashboard was nginx's 404, and its 120 s cut a 4-week what-if); a proxy that
does give up is said as such by the page, not as a JSON parse error."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from ledger.server.commands import MAX_BODY
from ledger.server.whatifs import TIMEOUT_S
from tests.integration.dashkit import Dashboard, build, cycled
from tests.integration.ports import free_port
from tests.integration.serverkit import Server, cli, make_token, start_server
from tests.integration.test_dashboard import browser, signed_in, watched
from tests.integration.test_dashboard_whatif import _child_of

__all__ = ["browser"]  # the module fixture, shared

DOC = Path(__file__).parents[2] / "docs" / "server.md"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def documented_block() -> str:
    """The nginx block of docs/server.md's "TLS and reverse proxies"."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## TLS and reverse proxies") :]
    found = re.search(r"```nginx\n(.*?)```", section, re.S)
    assert found, "no nginx block in docs/server.md"
    return found.group(1)


def seconds(block: str, directive: str) -> float:
    value = re.search(rf"^\s*{directive}\s+(\d+)s;", block, re.M)
    assert value, f"{directive} not in the block"
    return float(value.group(1))


def plain(block: str, upstream: int, listen: int, read_timeout: str | None = None) -> str:
    """The block on plain HTTP: TLS lines out, `listen` and the server's port in."""
    lines = [ln for ln in block.splitlines() if "ssl_certificate" not in ln]
    out = "\n".join(lines).replace("listen 443 ssl;", f"listen 127.0.0.1:{listen};")
    out = out.replace("127.0.0.1:8470", f"127.0.0.1:{upstream}")
    if read_timeout is not None:
        out = re.sub(r"proxy_read_timeout \d+s;", f"proxy_read_timeout {read_timeout};", out)
    return out


@dataclass
class Proxied:
    dash: Dashboard
    server: Server
    boss: str
    tokens: dict[str, str]
    tmp: Path


@dataclass
class Nginx:
    proc: subprocess.Popen[bytes]
    port: int

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGQUIT)  # graceful: its workers end with it
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_nginx(tmp: Path, server_block: str) -> Nginx:
    """nginx in the foreground, every file of its own under `tmp` (stopped by its pid)."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = int(re.search(r"listen 127\.0\.0\.1:(\d+);", server_block).group(1))  # type: ignore[union-attr]
    user = "user root;\n" if os.geteuid() == 0 else ""  # its workers may use the temp dirs
    conf = tmp / "nginx.conf"
    conf.write_text(
        f"{user}worker_processes 1;\ndaemon off;\npid {tmp}/nginx.pid;\n"
        f"error_log {tmp}/error.log;\nevents {{ worker_connections 64; }}\n"
        f"http {{\n access_log {tmp}/access.log;\n client_body_temp_path {tmp}/body;\n"
        f" proxy_temp_path {tmp}/proxy;\n fastcgi_temp_path {tmp}/fcgi;\n"
        f" uwsgi_temp_path {tmp}/uwsgi;\n scgi_temp_path {tmp}/scgi;\n{server_block}\n}}\n"
    )
    with open(tmp / "stderr.log", "wb") as err:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [NGINX, "-p", str(tmp), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=err
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp / "stderr.log").read_text() + conf.read_text()
        probe = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            probe.connect()
            return Nginx(proc, port)
        except OSError:
            time.sleep(0.05)
        finally:
            probe.close()
    proc.kill()
    raise AssertionError("nginx did not listen")


def fetch(
    port: int, method: str, path: str, token: str, body: bytes | None = None
) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S + 60)
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    tmp = tmp_path_factory.mktemp("proxy")
    dash = build(tmp / "ledger", days=2.0)
    boss = dash.project_b.split("/")[0]
    cli(dash.home, "manager", "grant", "boss", boss, GPULEDGER_USER="root")
    tokens = {who: make_token(dash.home, "--user", who) for who in ("root", "boss")}
    server = start_server(dash.home)
    try:
        cycled(server, 1, 60)
        yield Proxied(dash, server, boss, tokens, tmp)
    finally:
        assert server.stop() == 0, server.log_path.read_text()


def test_the_documented_block_fits_the_servers_longest_request_and_body() -> None:
    block = documented_block()
    assert re.search(r"^\s*location / \{", block, re.M), block  # the whole server, not /v1/ only
    assert seconds(block, "proxy_read_timeout") > TIMEOUT_S  # the what-if's limit fits
    size = re.search(r"client_max_body_size (\d+)m;", block)
    assert size and int(size.group(1)) * 1024 * 1024 >= MAX_BODY, block


def test_the_dashboard_and_the_api_answer_through_the_documented_proxy(proxied: Proxied) -> None:
    p = proxied
    nginx = start_nginx(p.tmp / "nginx", plain(documented_block(), p.server.port, free_port()))
    try:
        root = p.tokens["root"]
        for path in ("/", "/ui/teams", "/ui/budget", "/ui/static/app.js", "/ui/static/base.js",
                     "/ui/api/teams", "/metrics", "/v1/health", "/v1/whoami"):  # fmt: skip
            direct = fetch(p.server.port, "GET", path, root)
            through = fetch(nginx.port, "GET", path, root)
            assert through[0] == direct[0] and direct[0] in (200, 302), (path, direct[0], through)
            assert through[1] == direct[1], (path, direct[1], through[1])
        kids = json.loads(cli(p.dash.home, "shares", "--json", GPULEDGER_USER="root").stdout)
        account = sorted(s["account"] for s in kids if s["parent"] == p.boss)[0]
        ask = json.dumps({"account": account, "shares": 7}).encode()
        route = "/ui/api/budget/whatif"
        status, kind, body = fetch(nginx.port, "POST", route, p.tokens["boss"], ask)
        assert status == 200 and kind.startswith("application/json"), (status, body[:300])
        assert json.loads(body)["shares"] == 7
    finally:
        nginx.stop()


def test_a_proxy_that_gives_up_is_said_as_such_by_the_page(
    proxied: Proxied, browser: Browser
) -> None:
    """A proxy timing out answers its own HTML 504: the page said `Unexpected token '<'`."""
    p = proxied
    block = plain(documented_block(), p.server.port, free_port(), read_timeout="1s")
    nginx = start_nginx(p.tmp / "nginx-short", block)
    try:
        kids = json.loads(cli(p.dash.home, "shares", "--json", GPULEDGER_USER="root").stdout)
        account = sorted(s["account"] for s in kids if s["parent"] == p.boss)[0]
        page, errors = watched(signed_in(browser, p.tokens["boss"]))
        page.goto(f"http://127.0.0.1:{nginx.port}/ui/budget")
        page.wait_for_selector("#budget tbody tr")
        said = page.evaluate(
            "async (a) => { try { await post('/ui/api/budget/whatif', {account: a, shares: 9});"
            " return 'answered'; } catch (err) { return err.message; } }",
            account,
        )
        assert "504" in said and "proxy" in said and "Unexpected token" not in said, said
        assert [e for e in errors if "504" not in e] == [], errors
    finally:
        nginx.stop()


def test_a_streamed_what_if_outlasts_a_short_proxy_read_timeout(
    proxied: Proxied, browser: Browser
) -> None:
    """atk50-29 F2 (its rest): nginx's read timeout runs per read, and a what-if answered
    nothing while it waited its turn and ran: behind another's it was cut however long the
    timeout. The page's what-if, streamed (a line every 2 s at least), passes a proxy whose
    read timeout is 4 s while it waits behind another what-if and runs, and is answered."""
    import threading

    p = proxied
    nginx = start_nginx(
        p.tmp / "nginx-stream", plain(documented_block(), p.server.port, free_port(), "4s")
    )
    try:
        kids = json.loads(cli(p.dash.home, "shares", "--json", GPULEDGER_USER="root").stdout)
        account = sorted(s["account"] for s in kids if s["parent"] == p.boss)[0]
        ask = json.dumps({"account": account, "shares": 5}).encode()
        ahead: list[tuple[int, str, bytes]] = []
        first = threading.Thread(
            target=lambda: ahead.append(
                fetch(p.server.port, "POST", "/ui/api/budget/whatif", p.tokens["root"], ask)
            )
        )
        began = time.monotonic()
        first.start()
        # the one ahead held 6 s (SIGSTOP), past the proxy's 4 s: a what-if of this small
        # history ran both in 3.2 s once, and the stream had nothing to outlast
        deadline = time.monotonic() + 120
        while not (held := _child_of(p.server.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held, "the first what-if's child never started"
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        resumed = threading.Timer(6.0, lambda: [os.kill(x, signal.SIGCONT) for x in held])
        resumed.start()
        page, errors = watched(signed_in(browser, p.tokens["boss"]))
        page.goto(f"http://127.0.0.1:{nginx.port}/ui/budget")
        page.wait_for_selector("#budget tbody tr")
        said = page.evaluate(
            "async (a) => { const turns = []; try { const r = await streamed("
            "'/ui/api/budget/whatif?stream=true', {account: a, shares: 9}, (t) => turns.push(t));"
            " return [r.shares, turns.length, Math.max(...turns.map((t) => t.ahead))]; }"
            " catch (err) { return err.message; } }",
            account,
        )
        whole_s = time.monotonic() - began
        resumed.join()
        first.join(TIMEOUT_S)
        assert said[0] == 9 and said[1] >= 2 and said[2] == 1, said
        assert [s for s, _, _ in ahead] == [200] and whole_s > 4.0, (ahead, whole_s)
        assert errors == [], errors
    finally:
        nginx.stop()
