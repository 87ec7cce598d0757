"""A child the server hands work to (a what-if, a job page's replay) always runs at a lower
priority than the server, whatever the server's own (`ledger.server.children.lowered`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ledger.server.children import STEPS, lowered

SERVER = """
import asyncio, os, sys
from ledger.server import children
os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[1]))
said = asyncio.run(children.run("tests.unit.child_probe", str(os.getpid()).encode(), 60))
print(os.getpriority(os.PRIO_PROCESS, 0), said.decode().strip())
"""
"""A stand-in server at the nice level it is given, starting one child as the server does."""


@pytest.mark.parametrize(
    ("server_nice", "want_nice", "want_idle"),
    [(-5, 5, False), (0, 10, False), (9, 19, False), (10, 19, True), (15, 19, True),
     (19, 19, True)],
)  # fmt: skip
def test_a_child_is_always_below_the_server(
    server_nice: int, want_nice: int, want_idle: bool
) -> None:
    assert lowered(server_nice) == (want_nice, want_idle)
    nice, idle = lowered(server_nice)
    assert nice - server_nice == STEPS or idle  # 10 levels below, or below every level


@pytest.mark.parametrize("server_nice", [0, 9, 12, 19])
def test_the_child_of_a_server_runs_below_it(server_nice: int) -> None:
    """atk52-29 F2: the child was lowered to nice 10 only when the server ran below 10: beside a
    server at nice 19 it ran at 19 too, its equal, and others' reads were ~3x slower while a
    what-if ran. Now it runs 10 levels below the server, and under `SCHED_IDLE` (below every
    nice level) when the server's level leaves no room for those 10."""
    # never skipped: a run that cannot raise a process's priority fails here, saying why
    assert server_nice >= os.getpriority(os.PRIO_PROCESS, 0) or os.geteuid() == 0, (
        f"a stand-in server at nice {server_nice} needs root or a test run at nice <= it"
    )
    out = subprocess.run(
        [sys.executable, "-c", SERVER, str(server_nice)],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    server, child, policy = int(out[0]), int(out[1]), int(out[2])
    assert server == server_nice
    idle = policy == os.SCHED_IDLE
    assert child > server or idle, (server, child, policy)  # below the server, always
    assert (child, idle) == lowered(server_nice), (server, child, policy)
