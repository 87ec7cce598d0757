"""`audit verify` and `audit check` through a real `gpuledger serve` show how far they are, as
they do embedded: the server says how many events each audit under way has read of the store's
head (`GET /v1/audit/progress`), and the CLI on a terminal draws the same bar from it (quiet,
asking nothing more, when not a terminal)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from projections.testing.synthetic import Shape, append_to_store, synthetic_events
from tests.integration.serverkit import GPULEDGER, Server, env_for, make_token, start_server

EVENTS = 60_000
"""Enough for each whole-log audit to take a few seconds on a loaded 2-core machine."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    home = tmp_path_factory.mktemp("progress") / "ledger"
    head = append_to_store(home, synthetic_events(EVENTS, seed=7, shape=Shape(nodes=64)))
    assert head == EVENTS
    token = make_token(home)  # root, the history's admin
    server = start_server(home, "--executor", "none")
    # the CLI's audits as a person of their own: root's rest after the progress tests (3x each
    # audit's time) passed the CLI's 30 s of waiting on a loaded machine
    # and one person a kind: the rest follows a person's every audit, so a check run right
    # after a verify by the same person waited out the verify's rest
    for kind, proj in (("verify", 0), ("check", 1)):
        server.tokens[f"cli-{kind}"] = make_token(home, "--user", f"user0_{proj}_0")
        server.tokens[f"quiet-{kind}"] = make_token(home, "--user", f"user0_{proj}_1")
    try:
        yield server, token
    finally:
        assert server.stop() == 0, server.log_path.read_text()


@pytest.mark.parametrize("kind", ["verify", "check"])
def test_the_server_says_how_far_a_whole_log_audit_is(
    served: tuple[Server, str], kind: str
) -> None:
    server, token = served
    head = server.head()
    done: list[tuple[int, Any]] = []
    # the walk's answer comes when it ends (plain JSON): its time grows with the load, past the
    # client's default 60 s in a loaded whole-suite run (stop 58: "timed out", no answer)
    audit = threading.Thread(
        target=lambda: done.append(
            server.request("GET", f"/v1/audit/{kind}", token=token, timeout=600)
        )
    )
    audit.start()
    seen: list[dict[str, int]] = []
    while audit.is_alive():
        status, body = server.request("GET", "/v1/audit/progress", token=token)
        assert status == 200, body
        if body[kind] is not None:
            seen.append(body[kind])
        time.sleep(0.05)
    audit.join()
    assert done and done[0][0] in (200, 201), done
    assert seen, "no progress seen while the audit ran"
    assert all(0 <= s["done"] <= s["total"] for s in seen), seen
    first = "chain" if kind == "verify" else "check"  # the walk over the whole log
    assert all(s["total"] >= head for s in seen if s["stage"] == first), seen
    for stage in {s["stage"] for s in seen}:  # each stage only forward
        done = [s["done"] for s in seen if s["stage"] == stage]
        assert done == sorted(done), (stage, seen)
    assert any(0 < s["done"] < s["total"] for s in seen), seen  # seen part way
    status, body = server.request("GET", "/v1/audit/progress", token=token)
    assert status == 200 and body == {"verify": None, "check": None}, body


def on_a_terminal(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run `args` with stderr on a pseudo-terminal; its exit code and what the terminal got."""
    main, other = pty.openpty()
    proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=other)
    os.close(other)
    got = b""
    while True:
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None:
            break
    os.close(main)
    return proc.wait(timeout=60), got.decode(errors="replace")


@pytest.mark.parametrize(
    ("kind", "stages"),
    [
        # each stage of a verify named as it runs: the bar stood full and still for the 59%
        # of a verify after the chain's walk (atk47-29 F3)
        ("verify", ["verify 1/3: chain", "verify 2/3: snapshots", "verify 3/3: projection"]),
        ("check", ["events checked"]),
    ],
)
def test_the_cli_through_the_server_shows_the_audits_progress_on_a_terminal(
    served: tuple[Server, str], tmp_path: Path, kind: str, stages: list[str]
) -> None:
    server, token = served
    token = server.tokens[f"cli-{kind}"]
    env = env_for(server.home, GPULEDGER_URL=server.url, GPULEDGER_TOKEN=token, COLUMNS="120")
    env.pop("GPULEDGER_HOME")  # through the server alone
    code, shown = on_a_terminal([GPULEDGER, "audit", kind], env, tmp_path)
    assert code == 0, shown
    counts = [(int(a.replace(",", "")), int(b.replace(",", "")))
              for a, b in re.findall(r"(\d[\d,]*)/(\d[\d,]*)", shown)]  # fmt: skip
    assert all(what in shown for what in stages), shown
    assert any(0 < a < b and b >= EVENTS for a, b in counts), shown
    assert re.search(r"\d,\d{3}/\d{2},\d{3}", shown), shown  # counts as the result prints them
    assert "/?" not in shown, shown  # the total from the first frame (atk36-29 F2: "0/?")
    # not a terminal: the same answer, no bar
    env["GPULEDGER_TOKEN"] = server.tokens[f"quiet-{kind}"]
    quiet = subprocess.run([GPULEDGER, "audit", kind], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
