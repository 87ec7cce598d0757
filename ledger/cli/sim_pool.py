"""The process pools of `simulate compare --parallel` and `simulate sweep`: runs in worker
processes that a Ctrl-C stops at once, to the whole group (a terminal's) or to the parent alone
(`kill -INT`, `timeout -s INT`, a supervisor), and a sweep's record of the runs it finished
(`HOME/report/runs.jsonl`), which a rerun of the same sweep goes on from."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import shutil
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import click

from ledger.cli import output
from ledger.sim import report
from ledger.sim.runner import RunResult, SimConfig
from ledger.sim.runner import simulate as run_simulation
from ledger.sim.workload import Workload

_SUBMITTED: Any = None
"""A pool process's shared counts of jobs submitted, one a run (`_share`)."""


def _share(counts: Any = None) -> None:
    """A pool process's start: its shared counts, and a Ctrl-C that ends it quietly (the CLI's
    handler it inherits printed a traceback from each idle one, atk61-29b F4)."""
    global _SUBMITTED
    _SUBMITTED = counts
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def stopping_pool(workers: int, counts: Any = None) -> Iterator[ProcessPoolExecutor]:
    """A process pool whose runs end with the command: when the block is left by an error or
    a Ctrl-C, its worker processes are killed at once (SIGTERM) instead of waited for. A
    Ctrl-C to the parent alone froze the bar until every run had ended, and once in four it
    was lost: the runs finished, a report was written, exit 0 (atk61-29c F1). A Ctrl-C the
    CLI saw but that some library swallowed is raised again when the block ends. Inside, a
    Ctrl-C is raised only where the block checks `output.interrupted()` (after each `wait`):
    raised inside `wait`, it left a future's lock held and the command hung at its exit."""
    with output.sigint_at_safe_points():
        pool = ProcessPoolExecutor(max_workers=workers, initializer=_share, initargs=(counts,))
        try:
            yield pool
            if output.interrupted():
                raise KeyboardInterrupt
        except BaseException:
            processes = list((pool._processes or {}).values())
            for p in processes:
                with contextlib.suppress(OSError):
                    p.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            for p in processes:
                p.join(timeout=5)
            raise
        pool.shutdown(wait=True)
        if output.interrupted():
            raise KeyboardInterrupt


def _stop_if_interrupted() -> None:
    """A Ctrl-C seen inside `stopping_pool`, raised at this safe point."""
    if output.interrupted():
        raise KeyboardInterrupt


def submissions_made(workload: Workload, days: float) -> Callable[[float], int]:
    """Pure: how many of the workload's jobs inside `days` are submitted `s` seconds into the
    run: `simulate run`'s bar counts them, a known total that moves with the work (atk48-29 F4:
    whole days, "0/1 days" while the bar moved)."""
    from bisect import bisect_right

    at = sorted(j.submit_s for j in workload.jobs if j.submit_s < days * 86_400.0)
    return lambda s: bisect_right(at, s)


def _run_counted(
    slot: int, workload: Workload, config: SimConfig, home: Path, days: float
) -> RunResult:
    """One policy of a parallel compare (a pool process): its jobs submitted so far in its slot
    of the shared counts, which the parent's bar sums."""
    made = submissions_made(workload, days)

    def told(done: float, total: float, events: int) -> None:
        _SUBMITTED[slot] = made(done)

    return run_simulation(workload, config, home, told)


def run_parallel(
    runs: list[tuple[str, SimConfig, Path]], workload: Workload, days: float, parallel: int
) -> list[RunResult]:
    """The policies of a compare (`(policy, config, home)`) in up to `parallel` processes at
    once (each run is its own ledger, seeded, so the results are those of one run after
    another); one bar of the jobs submitted summed over the runs (no bar at all showed,
    atk61-29b F2), a line on stderr as each ends, results in the order asked."""
    counts = multiprocessing.get_context().Array("q", len(runs), lock=False)
    total = submissions_made(workload, days)(float("inf")) * len(runs)
    with (
        output.progress("compare", total, unit="jobs submitted") as update,
        stopping_pool(min(parallel, len(runs)), counts) as pool,
    ):
        futures = {
            pool.submit(_run_counted, k, workload, config, home, days): policy
            for k, (policy, config, home) in enumerate(runs)
        }
        done: dict[str, RunResult] = {}
        waiting = set(futures)
        while waiting:
            ended, waiting = wait(waiting, timeout=0.5, return_when=FIRST_COMPLETED)
            _stop_if_interrupted()
            update(sum(counts))
            for future in ended:
                result = future.result()
                done[futures[future]] = result
                m = result.metrics
                click.echo(
                    f"{futures[future]}: done ({m.wall_s:.1f} s, {m.events:,} events)", err=True
                )
    return [done[p] for p, _, _ in runs]


# --- a sweep's runs ------------------------------------------------------------------------------


def _where(home: Path | str) -> str:
    """A run's place in its sweep (`001/fifo`), whatever directory the sweep was run from."""
    return "/".join(Path(home).parts[-2:])


def recorded_runs(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Pure but for reading `path` (a sweep's `runs.jsonl`): each whole line's run by its
    place (`001/fifo`, of `run.home`) and workload label. A line cut short (a sweep killed
    while writing it) is no record: its run is redone."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            data = json.loads(line)
            out[(_where(data["run"]["home"]), str(data["workload"]))] = data["run"]
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _clear(home: Path, top: Path) -> None:
    """Remove a run's ledger folder and its workload folder if that is then empty."""
    shutil.rmtree(home, ignore_errors=True)
    parent = home.parent
    if parent != top and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()


def run_sweep(
    tasks: list[tuple[Path, str, str, Callable[..., RunResult], tuple[Any, ...]]],
    top: Path,
    report_dir: Path,
    parallel: int,
) -> dict[Path, report.Done]:
    """A sweep's runs (`(home, workload label, policy, function, arguments)`) in up to
    `parallel` processes; each run's report appended to `report_dir/runs.jsonl` as it ends. A
    run that file already holds is not run again (a sweep cut short, run again, goes on from
    where it stopped: it was refused, "001/fifo already holds a ledger", atk61-29c F2); a
    run's folder it does not hold (a run cut short) is made anew. A sweep cut short keeps
    exactly the runs it recorded: any finished run is recorded first, then the folders of the
    others are removed."""
    runs_path = report_dir / "runs.jsonl"
    have = recorded_runs(runs_path)
    done = {h: report.Done.read(have[(_where(h), label)]) for h, label, *_ in tasks
            if (_where(h), label) in have}  # fmt: skip
    todo = [t for t in tasks if t[0] not in done]
    for home, *_ in todo:
        _clear(home, top)
    with (
        output.progress("sweep", len(tasks), unit="runs done") as update,  # atk61-29b F2
        runs_path.open("a") as runs,
    ):
        update(len(done))
        if runs.tell() and not runs_path.read_bytes().endswith(b"\n"):
            runs.write("\n")  # a line cut short by a kill stays alone, no record
        futures: dict[Future[RunResult], tuple[Path, str, str]] = {}

        def record(future: Future[RunResult]) -> None:
            home, label, policy = futures.pop(future)
            result = future.result()
            done[home] = report.Done.of(result)
            line = {"workload": label, "run": done[home].summary}
            runs.write(json.dumps(line, sort_keys=True) + "\n")
            runs.flush()
            click.echo(f"{label} {policy}: done ({result.metrics.cpu_s:.1f} s CPU)", err=True)
            update(len(done))

        try:
            with stopping_pool(max(1, min(parallel, len(todo)))) as pool:
                for home, label, policy, fn, args in todo:
                    futures[pool.submit(fn, *args, home)] = (home, label, policy)
                while futures:
                    ended, _ = wait(list(futures), timeout=0.5, return_when=FIRST_COMPLETED)
                    _stop_if_interrupted()
                    for future in ended:
                        record(future)
        except BaseException:
            for future in [f for f in futures if f.done() and not f.cancelled()]:
                if future.exception() is None:  # finished before the stop: recorded
                    with contextlib.suppress(BaseException):
                        record(future)
            for home, *_ in todo:
                if home not in done:
                    _clear(home, top)
            raise
    return done
