"""Red team, a person's own dashboard tabs (threat model row T5, docs/security.md; issue 25,
atk39-25 F3): a person's reads are 2 at once, and her own tabs refreshing together were refused
each other's turn: "could not update: 'X' has 2 queries running already" until the next poll.
Against a real `gpuledger serve` in Debian's chromium (Playwright): while two of alice's reads
are held (two 10,000-row pages she does not read), her queue tab is refused, then served once
they end, and never says "could not update"; the bound itself stays (a third raw read 429).

The tab is given its refusal once the server has recorded the two reads' end (a third read
answered): handed over at once, its two retries (1-3 s in all) raced the server's noticing the
closed connections, and at load ~24 lost ("could not update: 'alice' has 2 queries running
already", s57-tabs, 1 run in 3): an end the test waited for by time, not by state."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Route, sync_playwright

from tests.integration.security.test_security_connections import answer
from tests.integration.serverkit import ServerWorld as World
from tests.integration.serverkit import make_token, set_up_long_queue, start_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PAGE = "/v1/jobs?limit=10000"
"""About 2.4 MB: more than the kernel's buffers hold for a client that reads nothing."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("tabs")
    home = tmp / "ledger"
    set_up_long_queue(home, tmp)
    tokens = {who: make_token(home, "--user", who) for who in ("alice",)}
    # the unread pages held while the browser starts, however long that takes under load
    server = start_server(home, "--interval", "0.5s", env={"GPULEDGER_SEND_STALL_S": "300"})
    try:
        yield World(server, tokens)
    finally:
        assert server.stop() == 0


def unread_page(w: World) -> socket.socket:
    """A connection of alice's asking four 10,000-row pages and reading none of them (more
    than the kernel's buffers hold): one of her reads admitted is held until it is closed."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", w.server.port))
    s.sendall(f"GET {PAGE} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
              f"{w.tokens['alice']}\r\n\r\n".encode() * 4)  # fmt: skip
    return s


def third_read(w: World) -> int:
    with socket.create_connection(("127.0.0.1", w.server.port)) as s:
        s.sendall(f"GET /v1/jobs?limit=1 HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
                  f"{w.tokens['alice']}\r\n\r\n".encode())  # fmt: skip
        return answer(s)[0]


def held_reads(w: World) -> list[socket.socket]:
    """Two of alice's reads held: the server refuses her a third (429)."""
    held = [unread_page(w), unread_page(w)]
    deadline = time.monotonic() + 60
    while third_read(w) != 429:  # both held: the bound is real
        assert time.monotonic() < deadline, "alice's two reads were never held"
        time.sleep(0.2)
    return held


def ended(w: World, held: list[socket.socket]) -> None:
    """`held` closed, once the server records their end: a third read of alice's answered."""
    for s in held:
        s.close()
    held.clear()
    deadline = time.monotonic() + 60
    while third_read(w) != 200:
        assert time.monotonic() < deadline, "alice's closed reads never ended"
        time.sleep(0.2)


def test_a_persons_tab_refused_by_her_own_reads_is_served_once_they_end(world: World) -> None:
    w = world
    if not Path(CHROMIUM).exists():
        pytest.fail(f"chromium is not installed ({CHROMIUM})", pytrace=False)
    held: list[socket.socket] = []
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=args)
            try:
                ctx = browser.new_context()
                ctx.add_init_script(
                    f"localStorage.setItem('gpuledger.token', {json.dumps(w.tokens['alice'])});"
                    # every line the status shows, kept
                    "window.__said = []; new MutationObserver(() => { const s = "
                    "document.getElementById('status'); if (s) window.__said.push(s.textContent)"
                    "}).observe(document, {subtree: true, childList: true, characterData: true});"
                )
                page = ctx.new_page()
                refused: list[str] = []
                page.on("response", lambda r: refused.append(r.url) if r.status == 429 else None)

                def first_refused(route: Route) -> None:
                    """The tab's first page read, asked of the server while alice's two are
                    held: refused; given to the tab once they have ended."""
                    got = route.fetch()
                    assert got.status == 429, got.status
                    ended(w, held)
                    route.fulfill(response=got)

                page.route(re.compile(r"/ui/api/queue\?"), first_refused, times=1)
                held.extend(held_reads(w))
                page.goto(w.server.url + "/ui/queue")
                page.wait_for_selector("#queue tbody tr", timeout=60_000)
                said = page.evaluate("window.__said")
            finally:
                browser.close()
    finally:
        for s in held:
            s.close()
    assert refused, "the tab's reads were never refused"
    assert not [x for x in said if "could not update" in x], said
    assert any(x.startswith("updated") for x in said), said
