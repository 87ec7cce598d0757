"""Driving a `SupervisedExecutor` with real processes as the service does: launch, stop,
observe until a condition, with deadlines (tests of the supervised executor and job trees)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ledger.cycle.executor import Exit, Launch, Observed, Orders, Start
from ledger.engines.supervised import SupervisedExecutor, live_processes
from schemas.events import GpuSlot

TERMED, KILLED = 128 + signal.SIGTERM, 128 + signal.SIGKILL
"""Exit codes of a job SIGTERM or SIGKILL ended, as the shell (and Slurm) say them."""


def kill_leftovers(state_dir: Path) -> None:
    """Tests end with no job process of theirs alive."""
    for p in live_processes(state_dir):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


_OPEN: list[SupervisedExecutor] = []


def run_dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A test's (state, log) directories; every executor it opened is closed and every job
    process it left is killed afterwards (the body of a module's `dirs` fixture)."""
    yield tmp_path / "agent", tmp_path / "jobs"
    while _OPEN:
        ex = _OPEN.pop()
        with contextlib.suppress(ValueError):  # closed by the test
            ex.close()
    kill_leftovers(tmp_path / "agent")


def job(
    job_id: int,
    script: str,
    slots: tuple[tuple[str, tuple[int, ...]], ...] = (("n0", (0,)),),
    **kw: object,
) -> Launch:
    return Launch(
        job_id,
        tuple(GpuSlot(node=n, gpu_indices=g) for n, g in slots),
        ("sh", "-c", script),
        None,
        "root",
        "ai2/olmo",
        **kw,  # type: ignore[arg-type]
    )


_BEGAN: dict[int, list[Start]] = {}
"""Runs that began at once, per executor, kept for the next `observe` (as the service records)."""
_ENDED: dict[int, list[Exit]] = {}
"""Exits `wait_starts` saw, per executor, kept for `until`."""


def launch(ex: SupervisedExecutor, *jobs: Launch) -> None:
    _BEGAN.setdefault(id(ex), []).extend(ex.carry_out(Orders(launches=jobs), time.time()))


def stop(ex: SupervisedExecutor, job_id: int) -> None:
    _BEGAN.setdefault(id(ex), []).extend(ex.carry_out(Orders(stops=(job_id,)), time.time()))


def observe(ex: SupervisedExecutor) -> Observed:
    seen = ex.observe(time.time(), {})
    began = _BEGAN.pop(id(ex), [])
    return dataclasses.replace(seen, starts=(*began, *seen.starts)) if began else seen


def until(
    ex: SupervisedExecutor, done: Callable[[list[Exit]], bool], timeout: float = 20
) -> list[Exit]:
    """Observe like the service does until `done(all exits so far)`."""
    exits: list[Exit] = _ENDED.pop(id(ex), [])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exits += observe(ex).exits
        if done(exits):
            return exits
        time.sleep(0.05)
    raise AssertionError(f"timed out; exits so far: {exits}")


def wait_starts(ex: SupervisedExecutor, timeout: float = 10) -> list[Start]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = observe(ex)
        _ENDED.setdefault(id(ex), []).extend(seen.exits)  # a short job may end at once
        if seen.starts:
            return list(seen.starts)
        time.sleep(0.02)
    raise AssertionError("no job started")


def executor(dirs: tuple[Path, Path], **kw: object) -> SupervisedExecutor:
    kw.setdefault("run_as", "service")
    ex = SupervisedExecutor(dirs[0], dirs[1], **kw)  # type: ignore[arg-type]
    _OPEN.append(ex)
    return ex
