"""A read's time limit counts the read's work, not the time its process was stopped (atk60-29
F4: a queue read in flight across a 28 s SIGSTOP of the server was stopped at SIGCONT, "ran
past its time limit of 10 s", its caller told to narrow the filter). Real processes: a child
runs a read pool's read, the test stops the child with SIGSTOP for longer than the limit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from ledger.server.readpool import GAP_S, ReadTime, stopped_s

CHILD = r"""
import asyncio, json, sys, time
import duckdb
from ledger.history.tables import Limits
from ledger.server.readpool import ReadPool

limit_s, work_s = float(sys.argv[1]), float(sys.argv[2])  # work_s 0: endless
base = duckdb.connect()
base.execute("SET threads = 1")  # as the server's projection (ledger.server.tables)


def read(cur, _limits):
    began = time.thread_time()
    cur.execute("SELECT sum(hash(i)) FROM range(2000000) t(i)").fetchall()
    n = int(2000000 * work_s / max(time.thread_time() - began, 1e-3)) if work_s else 10**14
    print(json.dumps({"inside": True}), flush=True)
    cur.execute(f"SELECT sum(hash(i)) FROM range({n}) t(i)").fetchall()
    return time.thread_time() - began


async def on_worker(fn):
    return fn()


async def main():
    pool = ReadPool(lambda: base, on_worker, limits=Limits(timeout_s=limit_s))
    pool.awake_times = 6.0  # (a loaded machine's wall time is not what this test is about)
    pool.start().connect_now()
    began = time.monotonic()
    try:
        cpu = await pool.compute(read, read=True, person="alice")
        out = {"answered": True, "cpu": cpu}
    except duckdb.InterruptException:
        out = {"answered": False}
    out.update(wall=time.monotonic() - began, timed_out=pool.timed_out)
    print(json.dumps(out), flush=True)
    pool.stop()


asyncio.run(main())
"""


def read_with_pause(limit_s: float, work_s: float, pause_s: float) -> dict[str, Any]:
    """The child's read (`work_s` of CPU, 0: endless) under `limit_s`, the child stopped
    `pause_s` (SIGSTOP) shortly after the read began its work."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(limit_s), str(work_s)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as child:
        try:
            assert child.stdout is not None
            assert json.loads(child.stdout.readline()) == {"inside": True}
            time.sleep(0.1)
            os.kill(child.pid, signal.SIGSTOP)
            time.sleep(pause_s)
            os.kill(child.pid, signal.SIGCONT)
            out: dict[str, Any] = json.loads(child.stdout.readline())
            assert child.wait(60) == 0
            return out
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGCONT)
                child.kill()


def test_a_read_across_a_pause_of_its_process_longer_than_the_limit_is_answered() -> None:
    """About a second of work under a 3 s limit, the process stopped 5 s in the middle of it:
    answered (before: stopped at SIGCONT, its timer's 3 s of wall time long past)."""
    out = read_with_pause(limit_s=3.0, work_s=1.0, pause_s=5.0)
    assert out["answered"], out
    assert out["timed_out"] == 0 and out["wall"] > 5.0, out


def test_an_endless_read_is_still_stopped_at_its_limit_pause_or_not() -> None:
    out = read_with_pause(limit_s=1.5, work_s=0, pause_s=3.0)
    assert not out["answered"] and out["timed_out"] == 1, out
    assert out["wall"] < 3.0 + 6 * 1.5 + 5, out  # its CPU's 1.5 s, or 9 s running at most


def test_a_read_that_waits_without_working_is_stopped_at_twice_its_limit_of_running() -> None:
    took = ReadTime(cpu0=5.0, last=0.0)
    now = 0.0
    while not took.past(5.0, now, limit_s=1.0, awake_times=2.0):
        now += 0.1
    assert now == pytest.approx(2.0)
    assert took.spent == 0.0


def test_a_gap_between_two_looks_counts_gap_s_at_most() -> None:
    took = ReadTime(cpu0=0.0, last=0.0)
    assert not took.past(0.2, 30.0, limit_s=1.0, awake_times=2.0)  # 30 s stopped
    assert took.awake == GAP_S
    assert took.past(1.0, 30.1, limit_s=1.0, awake_times=2.0)  # a second of CPU: past
    no_clock = ReadTime(cpu0=None, last=0.0)
    assert not no_clock.past(None, 0.4, limit_s=1.0, awake_times=2.0)
    assert not no_clock.past(None, 0.8, limit_s=1.0, awake_times=2.0)
    assert no_clock.past(None, 1.2, limit_s=1.0, awake_times=2.0)  # running time, at 1x


def test_a_read_waiting_for_a_cpu_is_not_cut_by_its_running_time() -> None:
    """atk61-ha F3: two busy loops beside a read at nice 10 left it ~8% of a CPU, and the
    backstop (twice the limit of running time, wall time in gaps under `GAP_S`) cut a read of
    1.43 s of CPU under a 2 s limit after 9.15 s. Its time waiting for a CPU is not its own."""
    took = ReadTime(cpu0=0.0, last=0.0, queued=0.0)
    now = cpu = queued = 0.0
    while now < 17.0:  # 1.36 s of CPU in 17 s: within its 2 s
        now, cpu, queued = now + 0.1, cpu + 0.008, queued + 0.092
        assert not took.past(cpu, now, limit_s=2.0, awake_times=2.0, queued=queued), now
    while not took.past(cpu, now, limit_s=2.0, awake_times=2.0, queued=queued):
        now, cpu, queued = now + 0.1, cpu + 0.008, queued + 0.092
    assert took.spent == pytest.approx(2.0, abs=0.01)  # its CPU limit, not the backstop


def test_a_process_stopped_in_short_spells_is_not_the_reads_time() -> None:
    """A 20% duty cycle (stopped 0.4 s, run 0.1 s, as a CPU quota): the watcher's own
    oversleep, not spent waiting for a CPU, is the process stopped (`stopped_s`)."""
    assert stopped_s(0.5, 0.0, 0.1) == pytest.approx(0.35)
    assert stopped_s(0.5, 0.4, 0.1) == 0.0  # it waited for a CPU: not stopped
    assert stopped_s(0.5, None, 0.1) == 0.0  # not known: none counted
    assert stopped_s(0.1, 0.0, 0.1) == 0.0
    took = ReadTime(cpu0=0.0, last=0.0, queued=0.0)
    now = cpu = 0.0
    for _ in range(20):  # 10 s: 2 s of CPU, its limit
        now, cpu = now + 0.5, cpu + 0.098
        assert not took.past(cpu, now, 2.0, 2.0, queued=0.0, stopped=stopped_s(0.5, 0.0, 0.1))
    assert took.awake < 4.0


def test_a_read_that_waits_without_working_is_still_cut_with_the_queue_known() -> None:
    took = ReadTime(cpu0=0.0, last=0.0, queued=0.0)
    now = 0.0
    while not took.past(0.0, now, limit_s=1.0, awake_times=2.0, queued=0.0):
        now += 0.1
    assert now == pytest.approx(2.0)
