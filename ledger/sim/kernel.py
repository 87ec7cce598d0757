"""The simulation kernel: one loop (`drive`) and one executor (`KernelExecutor`), for `simulate`,
`whatif`, the benchmarks and the tests that run the dispatcher on a virtual clock.

The executor is pure apart from its own state: no clock (every call takes `now`), no I/O.

- Every launch starts at once (`carry_out` says so). A job runs until its work is done:
  `work[job_id]` when given (the what-if knows each job's remaining work at the start of its
  period), else the launch's `duration_s`; None runs until stopped. Exits come in (time, job id)
  order (`observe`).
- Checkpoints keep work: a resumable job relaunched after a preemption runs only the work left
  after its last checkpoint (`checkpoint`); a non-resumable one starts over (the ledger ends it;
  the loop may resubmit it as a new job).
- The signal contract: a job for which `on_sigterm(job_id)` is true checkpoints when it is
  stopped (SIGTERM, within the grace period), so a preemption costs it no work.
- Time limits, where `limit_runs` says so (a lab's Slurm: `slurm-lab-2`): a run ends at its
  launch's `time_limit_s` after its launch, its work unfinished (`Exit` reason `time_limit`,
  as Slurm's TIMEOUT); `timed_out[job_id]` keeps the work it had done by then.
- Restarts cost time: a relaunch (a launch of a job that was preempted, `Launch.run > 0`, or of
  a job in `relaunched`, a resubmission) spends `relaunch_s` restarting before its work goes on.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from ledger.cycle.executor import Exit, Launch, Observed, Orders, Start

if TYPE_CHECKING:
    from ledger.core.state import Node
    from ledger.cycle.dispatcher import CycleResult, Dispatcher
    from ledger.store.clock import SimClock


def _never(job_id: int) -> bool:
    return False


class KernelExecutor:
    """The one simulated executor (see the module docstring)."""

    relaunch_placed = False

    def __init__(
        self,
        work: Mapping[int, float | None] | None = None,
        on_sigterm: Callable[[int], bool] = _never,
        engine: str = "",
        relaunch_s: float = 0.0,
        relaunched: Callable[[int], bool] = _never,
        limit_runs: bool = False,
    ) -> None:
        self.engine = engine
        self.limit_runs = limit_runs
        """Runs end at their time limits (TIMEOUT); otherwise a job runs until its work is done."""
        self.timed_out: dict[int, float] = {}
        """Job -> the work it had done when its last run ended at its time limit."""
        self.relaunch_s = relaunch_s
        """The restart overhead of a relaunch."""
        self.relaunched = relaunched
        """Jobs whose first launch is a relaunch (the resubmission of a preempted job)."""
        """The engine's name in JobEngineLinked/JobEngineEnded ("": neither is recorded)."""
        self.work: dict[int, float | None] = dict(work or {})
        """Job -> its total work in seconds, where the launch's duration is not it."""
        self.on_sigterm = on_sigterm
        self.saved: dict[int, float] = {}
        """Seconds of work kept by a job's checkpoints (survives a preemption)."""
        self._live: dict[int, tuple[int, float, float]] = {}
        """Running job -> (launch number, when its work began (after any restart overhead),
        work saved at launch)."""
        self._ends: list[tuple[float, int, int]] = []
        """(end time, job id, launch number): a stopped job's old end is stale."""
        self._launches = 0
        self._runs: dict[int, int] = {}
        """Running job -> which run of it this is (`Launch.run`)."""
        self._limited: dict[int, int] = {}
        """Running job -> the launch that ends at its time limit, its work unfinished."""
        self._stopped: list[Exit] = []
        """Runs stopped since the last `observe`, whose end an engine that names its runs
        reports (`Observed.stopped`): a stop here ends the run at once."""

    # --- the executor protocol -----------------------------------------------------------------

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        """The jobs whose work is done by `now` exit (in (time, job id) order)."""
        exits = self._ended(now)
        stopped, self._stopped = self._stopped, []
        return Observed(exits=tuple(exits), running=frozenset(self._live), stopped=tuple(stopped))

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        """Stop (a job that keeps the signal contract checkpoints first), then launch: every
        launch starts at once."""
        for job_id in orders.stops:
            self._stop(job_id, now)
        for job in orders.launches:
            self._launch(job, now)
        return tuple(Start(job.job_id) for job in orders.launches)

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        return {job_id for job_id in runs if job_id in self._live}

    def shutdown(self, now: float) -> list[Exit]:
        return []

    def heard_from(self) -> Mapping[str, float]:
        return {}

    def next_event_at(self) -> float | None:
        while self._ends:
            _, job_id, launch = self._ends[0]
            live = self._live.get(job_id)
            if live is not None and live[0] == launch:
                return self._ends[0][0]
            heapq.heappop(self._ends)
        return None

    # --- what the simulation tells it ----------------------------------------------------------

    def checkpoint(self, job_id: int, at: float) -> None:
        live = self._live.get(job_id)
        if live is not None:
            self.saved[job_id] = live[2] + max(0.0, at - live[1])

    # --- internals -----------------------------------------------------------------------------

    def _launch(self, job: Launch, now: float) -> None:
        self._launches += 1
        saved = self.saved.get(job.job_id, 0.0)
        restart = job.run > 0 or self.relaunched(job.job_id)
        begins = now + (self.relaunch_s if restart else 0.0)
        self._live[job.job_id] = (self._launches, begins, saved)
        self._runs[job.job_id] = job.run
        total = self.work.get(job.job_id, job.duration_s)
        end = None if total is None else begins + max(0.0, total - saved)
        if self.limit_runs and job.time_limit_s is not None:
            cap = now + job.time_limit_s  # the limit runs from the launch, restart included
            if end is None or end > cap:
                end = cap
                self._limited[job.job_id] = self._launches
        if end is not None:
            heapq.heappush(self._ends, (end, job.job_id, self._launches))

    def _stop(self, job_id: int, now: float) -> None:
        self._limited.pop(job_id, None)
        if self.on_sigterm(job_id):
            self.checkpoint(job_id, now)
        if self._live.pop(job_id, None) is not None and self.engine:  # its end, as engines say
            run = self._runs.get(job_id, 0)
            self._stopped.append(Exit(job_id, -15, now, engine_job_id=f"{job_id}.{run + 1}",
                                      run=run))  # fmt: skip

    def _ended(self, now: float) -> list[Exit]:
        out = []
        while self._ends and self._ends[0][0] <= now:
            at, job_id, launch = heapq.heappop(self._ends)
            live = self._live.get(job_id)
            if live is not None and live[0] == launch:
                del self._live[job_id]
                self.saved.pop(job_id, None)
                if self._limited.pop(job_id, None) == launch:
                    self.timed_out[job_id] = live[2] + max(0.0, at - live[1])
                    out.append(Exit(job_id, -15, at, "time_limit"))
                else:
                    out.append(Exit(job_id, 0, at))
        return out


class Driven(Protocol):
    """What the kernel loop asks of a simulation (`simulate`'s workload runs, the what-if)."""

    def times(self, now: float) -> list[float]:
        """The times at which something the simulation knows of is due next (submissions,
        ticks, node changes, ...); the loop adds the executor's next exit and `wake_at`."""
        ...

    def due(self, t: float) -> None:
        """Append everything due at `t` (in as few batches as it can)."""
        ...

    def needs_cycle(self, t: float) -> bool:
        """Whether a dispatcher cycle at `t` could change anything."""
        ...

    def cycled(self, t: float, result: CycleResult) -> bool:
        """Fold a cycle's events; True to cycle again at once (its victim searches ran out)."""
        ...

    def stepped(self, t: float) -> None:
        """After each step (progress reports)."""
        ...


MAX_CYCLES_PER_STEP = 4
"""Cycles at one moment while the victim-search budget keeps running out."""


def on_grid(t: float, origin: float, step_s: float) -> float:
    """Pure: the first decision moment at or after `t` on the grid `origin + k * step_s`."""
    k = math.ceil((t - origin) / step_s - 1e-9)
    return origin + k * step_s


def drive(
    sim: Driven,
    clock: SimClock,
    dispatcher: Dispatcher,
    executor: KernelExecutor,
    end: float,
    *,
    step_s: float | None = None,
    origin: float = 0.0,
) -> int:
    """The one simulation loop; returns the number of dispatcher cycles. Each step:

    1. the next time anything can happen: what `sim.times` says, the executor's next exit, the
       last decision's `wake_at`; stop when nothing is left or it is `end` or later;
    2. `sim.due(t)`: everything due then, appended in batches;
    3. dispatcher cycles (observe, snapshot, decide, append, carry out) while `sim.needs_cycle`,
       again at once while `sim.cycled` says the searches ran out (at most
       `MAX_CYCLES_PER_STEP`).

    With `step_s`, the dispatcher decides only at the moments `origin + k * step_s` (as a
    service that cycles every `step_s` would): what is due in between (a submission, a recorded
    change) is appended at its own time, an exit is recorded at its own time by the next
    decision's observation, and a cycle it calls for (or a `wake_at`) waits for the next
    moment. The number of decisions is then at most the period over `step_s` (times
    `MAX_CYCLES_PER_STEP`), whatever the number of events. Without it, a decision at every
    moment something happens.

    The clock ends at `end`.
    """
    cycles = 0
    wake: float | None = None
    owed: float | None = None
    """With `step_s`: the next decision moment, when something since calls for a cycle."""

    def moment(x: float) -> float:
        return x if step_s is None else on_grid(x, origin, step_s)

    while True:
        now = clock.now()
        cands = sim.times(now)
        nxt = executor.next_event_at()
        if nxt is not None:
            cands.append(moment(max(nxt, now)))
        if wake is not None and wake > now:
            cands.append(moment(wake))
        if owed is not None:
            cands.append(owed)
        if not cands:
            break
        t = max(now, min(cands))
        if t >= end:
            break
        clock.advance_to(t)
        sim.due(t)
        if step_s is not None and moment(t) != t:  # between two decision moments
            if owed is None and sim.needs_cycle(t):
                owed = moment(t)
            sim.stepped(t)
            continue
        owed = None
        for _ in range(MAX_CYCLES_PER_STEP):
            if not sim.needs_cycle(t):
                break
            result = dispatcher.cycle(t)
            cycles += 1
            wake = result.decision.wake_at
            if not sim.cycled(t, result):
                break
        sim.stepped(t)
    clock.advance_to(max(clock.now(), end))
    return cycles
