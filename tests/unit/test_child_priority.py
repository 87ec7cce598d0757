"""A child the server hands work to (a what-if, a job page's replay) always runs at a lower
priority than the server, whatever the server's own (`ledger.server.children.lowered`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ledger.server.children import STEPS, lowered, server_priority

SERVER = """
import asyncio, os, sys, threading
from ledger.server import children
os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[1]))
if len(sys.argv) > 2 and sys.argv[2] == "idle":
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
ready, done = threading.Event(), threading.Event()
def worker(nice):
    if nice.startswith("r"):  # one of the read pool's threads (`ReadPool._lower_priority`)
        children.mark_reader()
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), int(nice.lstrip("r")))
    ready.set()
    done.wait()
for nice in sys.argv[3:]:  # threads of its own at other levels (a partial renice; rN: a reader)
    ready.clear()
    threading.Thread(target=worker, args=(nice,), daemon=True).start()
    ready.wait()
said = asyncio.run(children.run("tests.unit.child_probe", str(os.getpid()).encode(), 60))
done.set()
print(os.getpriority(os.PRIO_PROCESS, 0), said.decode().strip())
"""
"""A stand-in server at the nice level it is given (`idle`: under `SCHED_IDLE`; then the nice
levels of threads of its own), starting one child as the server does."""


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


def stand_in(server_nice: int, *more: str) -> tuple[int, int, bool]:
    """The stand-in server's nice level, its child's, and whether the child ran `SCHED_IDLE`."""
    assert os.geteuid() == 0 or server_nice >= os.getpriority(os.PRIO_PROCESS, 0), (
        f"a stand-in server at nice {server_nice} needs root or a test run at nice <= it"
    )
    out = subprocess.run(
        [sys.executable, "-c", SERVER, str(server_nice), *more],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    return int(out[0]), int(out[1]), int(out[2]) == os.SCHED_IDLE


def test_the_child_runs_below_the_servers_lowest_thread() -> None:
    """atk53-29 F4: after `renice -n 0 -p SERVER` of a server started at nice 19 (the main
    thread alone reniced; its nine other threads stayed at 19) the child ran at nice 10, above
    the threads that do the server's work. Its priority is now based on the lowest of the
    server's threads."""
    one = subprocess.Popen(["sleep", "30"])  # one thread: its nice is the process's
    try:  # (not this worker's own: an earlier test may have lowered one of its threads)
        assert server_priority(one.pid)[0] == os.getpriority(os.PRIO_PROCESS, one.pid)
    finally:
        one.kill()
        one.wait()
    server, child, idle = stand_in(0, "other", "19", "5")
    assert server == 0
    assert (child, idle) == (19, True) == lowered(19)  # before: (10, False)


def test_the_child_of_a_server_under_sched_idle_runs_under_it_at_nice_19() -> None:
    """atk53-29 F3: the rule read the server's nice alone, so a server under `SCHED_IDLE` at
    nice 0 had a child at nice 10 (`SCHED_IDLE` only by inheritance). The rule reads the class
    too: the child runs under `SCHED_IDLE` at nice 19; no class is below it, so the child is
    the server's equal at best, which the server logs once (docs/dashboard.md says so)."""
    assert lowered(0, server_idle=True) == (19, True)
    server, child, idle = stand_in(0, "idle")
    assert server == 0
    assert (child, idle) == (19, True)  # before: (10, True)


def test_the_read_pools_own_lowered_threads_do_not_lower_the_child() -> None:
    """atk54-29 F1: the read pool lowers its threads to nice 10 on purpose, and the lowest-thread
    rule took them for the server's level: every child of a server at nice 0 ran `SCHED_IDLE` at
    19 (7x less CPU than at 10 under load; the page's what-if at 9,000 pending ran past its 300 s
    limit). The readers are named (`children.READER`) and passed by."""
    server, child, idle = stand_in(0, "other", "r10", "r10")
    assert server == 0
    assert (child, idle) == (10, False) == lowered(0)  # before: (19, True)
    server, child, idle = stand_in(0, "other", "r10", "19")  # a partial renice still counts
    assert (child, idle) == (19, True)
