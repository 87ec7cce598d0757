"""Audit: the invariant checker (the hash chain is `ledger.history.tamper`'s).

Invariants. `check_history(events)` scans a history for what must never happen: a GPU held by two
jobs, a preemption inside a contract (admin preemptions with a reason are listed apart, as `noted`,
not as violations), a placement on a node that is not active, a share, member, manager, admin,
account, node or token change by someone not authorised at that moment (the rules of
`ledger.core.authz.authorisation_failure`, the domain's own, replayed against the `State` folded up
to the event; decisions and placements by anyone but the dispatcher included), a decision record
decided or recorded before the previous one (`DECIDED_BACKWARDS`), and, over
the engines' reports of each run (its real start and GPUs in `JobEngineLinked`, its real end in
`JobEngineEnded` or `JobRunEnded`), a GPU held by two live runs (`RUN_GPU_HELD_TWICE`) or a job
alive in two launches (`JOB_RUN_TWICE`), and usage charged outside a run's real start and end
(`_Charges`: a charge from before the run's start, for a placement that never started, or past the
end its engine reported), each charge counted by the usage rule in force when it closed (the ranking
version of the decision records before it). `check_charges(store)` checks the projection charges no
usage to an unfunded job.

Pure: `check`, `check_history`, `check_live`. Edges: `check_charges`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Literal

import msgspec

from ledger.core.authz import authorisation_failure
from ledger.core.evolve import evolve
from ledger.core.state import DRAINED_NOTE, NODE_LOST, Job, State, is_system
from projections import history
from projections.fairshare import (
    CHARGE_PLACEMENT,
    CHARGE_REAL,
    OWN_START_KEPT_S,
    RANKING_VERSION,
    charge_of,
)
from projections.store import Store
from schemas import events as e

# --- invariants --------------------------------------------------------------------------------

ViolationCode = Literal[
    "GPU_HELD_TWICE",
    "LIVE_GPU_HELD_TWICE",
    "RUN_GPU_HELD_TWICE",
    "JOB_RUN_TWICE",
    "PREEMPTED_IN_CONTRACT",
    "ADMIN_PREEMPTED_IN_CONTRACT",
    "DRAINED_IN_CONTRACT",
    "REQUEUED_IN_CONTRACT",
    "PLACED_ON_INACTIVE_NODE",
    "PLACED_ON_STOPPING_GPU",
    "UNFUNDED_CHARGED",
    "CHARGED_BEFORE_START",
    "CHARGED_WITHOUT_RUN",
    "CHARGED_AFTER_END",
    "NOT_AUTHORISED",
    "DECIDED_BACKWARDS",
    "INCONSISTENT",
]

CLOCK_STEP_S = 1.0
"""How far back a decision record's times may step without a violation (`DECIDED_BACKWARDS`):
a wall clock stepped back, or two servers' clocks apart across a hand-over (docs/ha.md)."""


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    """One thing that must never happen, found at a log position."""

    position: int
    at: float
    code: ViolationCode
    message: str
    job_id: int | None = None

    def line(self) -> str:
        return f"position {self.position}: {self.code}: {self.message}"


class CheckReport(msgspec.Struct, frozen=True, kw_only=True):
    events: int
    violations: tuple[Violation, ...] = ()
    noted: tuple[Violation, ...] = ()
    """Allowed exceptions, listed as such: admin preemptions inside a contract with a reason."""

    @property
    def ok(self) -> bool:
        return not self.violations


class _Span(msgspec.Struct, kw_only=True):
    """One run of a job as its engine reported it: from its real start to its real end (None
    while no end is reported), on the GPUs the engine says it got."""

    job: int
    run: int
    position: int
    start: float
    gpus: tuple[tuple[str, int], ...]
    end: float | None = None


class _Runs:
    """The engines' reports of every run (`JobEngineLinked`: start and GPUs; `JobEngineEnded`
    and `JobRunEnded`: the real end), and what two of them overlapping means: a GPU held by two
    live runs, or a job alive in two launches. Only reported ends count as evidence: a run
    whose end was never reported is not called overlapping."""

    def __init__(self) -> None:
        self.spans: dict[tuple[int, int], _Span] = {}
        self.current: dict[int, tuple[int, str]] = {}
        """Job -> (run, engine job id) of its last linked run."""

    def linked(self, pos: int, ev: e.JobEngineLinked, job: Job | None) -> None:
        slots = ev.gpus or (job.slots if job is not None else ())
        gpus = tuple((sl.node, i) for sl in slots for i in sl.gpu_indices)
        start = ev.at if ev.started_at is None else ev.started_at
        self.spans[(ev.job_id, ev.run)] = _Span(
            job=ev.job_id, run=ev.run, position=pos, start=start, gpus=gpus
        )
        self.current[ev.job_id] = (ev.run, ev.engine_job_id)

    def ended(self, job: int, run: int | None, engine_job_id: str, at: float) -> None:
        """A run's end: the current run's (`run` None: the run its engine job id names) as its
        engine ended it, or a stopped run's once every process of it is gone (the later of
        two reports counts)."""
        if run is None:
            cur = self.current.get(job)
            if cur is None or cur[1] != engine_job_id:
                return
            run = cur[0]
        span = self.spans.get((job, run))
        if span is not None:
            span.end = at if span.end is None else max(span.end, at)

    def violations(self) -> list[Violation]:
        out: list[Violation] = []
        by_job: dict[int, list[_Span]] = {}
        by_gpu: dict[tuple[str, int], list[_Span]] = {}
        for span in self.spans.values():
            by_job.setdefault(span.job, []).append(span)
            for gpu in span.gpus:
                by_gpu.setdefault(gpu, []).append(span)
        for job, spans in sorted(by_job.items()):
            for a, b in _overlaps(spans):
                out.append(
                    Violation(
                        position=b.position,
                        at=b.start,
                        code="JOB_RUN_TWICE",
                        message=f"job {job}'s run {b.run} started while its run {a.run} "
                        f"was alive (until {a.end:.3f}, {a.end - b.start:.3f} s later)",  # type: ignore[operator]
                        job_id=job,
                    )
                )
        for (node, index), spans in sorted(by_gpu.items()):
            for a, b in _overlaps(spans):
                if a.job == b.job:
                    continue  # the job's own two runs: said above
                out.append(
                    Violation(
                        position=b.position,
                        at=b.start,
                        code="RUN_GPU_HELD_TWICE",
                        message=f"GPU {index} of node {node!r} held by job {b.job} (run "
                        f"{b.run}) while job {a.job} (run {a.run}) still ran on it, "
                        f"{a.end - b.start:.3f} s",  # type: ignore[operator]
                        job_id=b.job,
                    )
                )
        return sorted(out, key=lambda v: (v.position, v.code, v.message))


def _overlaps(spans: list[_Span]) -> list[tuple[_Span, _Span]]:
    """Pure: (earlier, later) pairs of runs where the earlier's reported end is after the
    later's start."""
    ordered = sorted(spans, key=lambda s: (s.start, s.job, s.run))
    return [
        (a, b)
        for i, a in enumerate(ordered)
        for b in ordered[i + 1 :]
        if a.end is not None and a.end > b.start
    ]


class _Charge(msgspec.Struct, kw_only=True):
    """One placement of a funded job as usage charges it: its run's real start (None until its
    JobStarted) and, once released, the interval it was charged for."""

    job: int
    run: int
    position: int
    gpus: int
    placed: float
    began: float | None = None
    charged: tuple[float, float] | None = None
    """(from, to) as the rule in force at its release charged it; None while open."""
    rule: str = ""
    closed_at: int = 0
    run_end: float | None = None
    """Its run's end as its engine first reported it: the charge ends there when earlier."""
    released: tuple[float, int] | None = None
    """(release time, position) of a placement released before any `JobStarted`: a
    `JobRunEnded` that says when its run started charges it from then (`run_ended`)."""


class _Charges:
    """Usage charged per placement, checked against the run's real start (`JobStarted`'s
    `started_at`) and the end its engine reported (`_Runs`: the later of `JobEngineEnded` and
    `JobRunEnded`). The usage rule in force is the one the last decision record named
    (`RankInputs.ranking_version`; before any, the current one): `fairtree-1` charged from the
    placement, `fairtree-2` and `fairtree-3` from the run's start; all to the release
    (`JobPreempted`, or `JobFinished` at the run's real end), `fairtree-2` to the run's real end
    as its engine first reported it (`JobRunEnded`, or `JobEngineEnded`: a run that ended with
    its node) when that is earlier, `fairtree-3` to that real end whenever it is reported (a
    stopped run holds its GPUs through its grace)."""

    def __init__(self) -> None:
        self.rule = charge_of(RANKING_VERSION)
        self.open: dict[int, _Charge] = {}
        self.closed: list[_Charge] = []
        self.by_run: dict[tuple[int, int], _Charge] = {}
        self.last: dict[int, _Charge] = {}
        """Job -> the charge of its last placement."""
        self.runs: dict[int, int] = {}
        """Job -> its runs preempted or taken back unstarted so far: the run of its next
        placement (as executors number runs, `JobEngineLinked.run`)."""

    def decided(self, ev: e.CycleDecided) -> None:
        if ev.ranks is not None:
            self.rule = charge_of(ev.ranks.ranking_version)

    def placed(self, pos: int, ev: e.JobPlaced, job: Job | None) -> None:
        run = self.runs.get(ev.job_id, 0)
        if job is None or job.spec.min_runtime_s <= 0:
            return  # unfunded: never charged
        ch = _Charge(job=ev.job_id, run=run, position=pos, gpus=job.spec.gpus, placed=ev.at)
        self.open[ev.job_id] = self.by_run[(ev.job_id, run)] = self.last[ev.job_id] = ch

    def started(self, ev: e.JobStarted) -> None:
        ch = self.open.get(ev.job_id)
        if ch is not None and ch.began is None:
            ch.began = ev.at if ev.started_at is None else ev.started_at

    def run_ended(self, ev: e.JobRunEnded | e.JobEngineEnded) -> None:
        """A run's end as its engine first reports it: a `JobRunEnded` names its run, a
        `JobEngineEnded` ends the job's last placement."""
        if isinstance(ev, e.JobRunEnded):
            ch = self.by_run.get((ev.job_id, ev.run))
        elif e.fenced(ev):  # the fence's presumption: its node's report is the real end
            return
        else:
            ch = self.last.get(ev.job_id)
        if ch is None or ch.run_end is not None:
            return
        ch.run_end = ev.at if ev.ended_at is None else ev.ended_at
        own = ev.started_at if isinstance(ev, e.JobRunEnded) else None
        kept = ch.released is not None and ev.at <= ch.placed + OWN_START_KEPT_S
        if own is not None and ch.began is None and kept and ch.released is not None:
            ch.began = max(ch.placed, own)  # its own start (atk44s F3), as usage charges it
            end, pos = ch.released
            if self.rule != CHARGE_PLACEMENT:  # to its real end (`violations`)
                ch.charged, ch.rule, ch.closed_at = (ch.began, end), self.rule, pos
                self.closed.append(ch)

    def released(self, pos: int, job: int, end: float, preempted: bool) -> None:
        """The placement's GPUs released at `end`; `preempted`: its job's next run is a new one
        (a preemption, or a run taken back unstarted)."""
        if preempted:
            self.runs[job] = self.runs.get(job, 0) + 1
        ch = self.open.pop(job, None)
        if ch is None:
            return
        start = ch.placed if self.rule == CHARGE_PLACEMENT else ch.began
        if start is None:
            ch.released = (end, pos)
        elif end > start:
            ch.charged, ch.rule, ch.closed_at = (start, end), self.rule, pos
            self.closed.append(ch)

    def violations(self, runs: _Runs) -> list[Violation]:
        out: list[Violation] = []
        for ch in self.closed:
            assert ch.charged is not None
            start, end = ch.charged
            if ch.rule == CHARGE_REAL and ch.run_end is not None:
                end = ch.run_end  # to the run's real end, before or after its release
            elif ch.rule != CHARGE_PLACEMENT and ch.run_end is not None:
                end = min(end, ch.run_end)  # as fairtree-2's run rule charges a stopped run
            if end <= start:
                continue
            what = f"job {ch.job}'s run {ch.run} was charged from {start:.3f} to {end:.3f}"
            what += f" (charged from the {'placement' if ch.rule == CHARGE_PLACEMENT else 'run'})"
            if ch.began is None:
                gpu_s = ch.gpus * (end - start)
                why = f"but never started: {gpu_s:.1f} GPU-s outside any run"
                out.append(self._v(ch, "CHARGED_WITHOUT_RUN", start, f"{what} {why}"))
                continue
            if start < ch.began:
                gpu_s = ch.gpus * (min(end, ch.began) - start)
                why = f"but started at {ch.began:.3f}: {gpu_s:.1f} GPU-s before its run"
                out.append(self._v(ch, "CHARGED_BEFORE_START", start, f"{what} {why}"))
            span = runs.spans.get((ch.job, ch.run))
            if span is not None and span.end is not None and end > span.end:
                gpu_s = ch.gpus * (end - max(start, span.end))
                why = f"but its engine says it ended at {span.end:.3f}: {gpu_s:.1f} GPU-s after it"
                out.append(self._v(ch, "CHARGED_AFTER_END", span.end, f"{what} {why}"))
        return out

    @staticmethod
    def _v(ch: _Charge, code: ViolationCode, at: float, message: str) -> Violation:
        return Violation(position=ch.closed_at, at=at, code=code, message=message, job_id=ch.job)


class _Checker:
    """The scan behind `check`: its own books of who holds which GPU and since when, plus the
    domain's `State` folded event by event for authorisation and node states, and the runs
    the engines reported (`_Runs`)."""

    def __init__(self) -> None:
        self.runs = _Runs()
        self.charges = _Charges()
        self.state = State()
        self.holder: dict[tuple[str, int], int] = {}
        self.held: dict[int, list[tuple[str, int]]] = {}
        self.placed_at: dict[int, float] = {}
        self.violations: list[Violation] = []
        self.noted: list[Violation] = []
        self.n = 0
        self.initialised = False
        self.decided_at: tuple[float, float] | None = None
        """When the last decision record was decided and recorded."""
        self.held_rule: tuple[str, bool, bool] = ("", False, False)
        """The last decision record's cycle and which stopped runs its snapshot held:
        (cycle id, `lost_held`, `placed_held`), its cycle id "" when it held none
        (`stopping_held` False)."""
        self.held_runs: frozenset[tuple[int, int]] = frozenset()
        """The stopped runs when that record was made (not those its own preemptions stop)."""

    def flag(
        self, pos: int, ev: e.AnyEvent, code: ViolationCode, msg: str, job: int | None = None
    ) -> None:
        self.violations.append(
            Violation(position=pos, at=ev.at, code=code, message=msg, job_id=job)
        )

    def note(
        self, pos: int, ev: e.AnyEvent, code: ViolationCode, msg: str, job: int | None = None
    ) -> None:
        """An allowed exception: reported beside the violations, not as one."""
        self.noted.append(Violation(position=pos, at=ev.at, code=code, message=msg, job_id=job))

    def visit(self, pos: int, ev: e.AnyEvent) -> None:
        self.n += 1
        failed = authorisation_failure(self.state, ev)
        if failed is not None:
            self.flag(pos, ev, "NOT_AUTHORISED", failed)
        if isinstance(ev, e.LedgerInitialised):
            if self.initialised:
                self.flag(pos, ev, "INCONSISTENT", "the ledger is initialised a second time")
            self.initialised = True
        elif isinstance(ev, e.JobPlaced):
            self._placed(pos, ev)
            self.charges.placed(pos, ev, self.state.jobs.get(ev.job_id))
        elif isinstance(ev, e.JobStarted):
            self.charges.started(ev)
        elif isinstance(ev, e.JobPreempted):
            self._preempted(pos, ev)
            self._release(ev.job_id)
            self.charges.released(pos, ev.job_id, ev.at, preempted=True)
        elif isinstance(ev, e.JobUnplaced):  # never started: no contract cut, nothing ran
            self._release(ev.job_id)
            self.charges.released(pos, ev.job_id, ev.at, preempted=True)
        elif isinstance(ev, e.JobFinished):
            self._drained(pos, ev)
            self._release(ev.job_id)
            end = ev.at if ev.ended_at is None else ev.ended_at
            self.charges.released(pos, ev.job_id, end, preempted=False)
        elif isinstance(ev, e.CycleDecided):
            self.charges.decided(ev)
            self._decided_in_order(pos, ev)
            self.held_rule = (ev.cycle_id if ev.stopping_held else "", ev.lost_held,
                              ev.placed_held)  # fmt: skip
            self.held_runs = frozenset(self.state.stopped_runs) if ev.stopping_held else frozenset()
        elif isinstance(ev, e.JobEngineLinked):
            self.runs.linked(pos, ev, self.state.jobs.get(ev.job_id))
        elif isinstance(ev, e.JobEngineEnded):
            end = ev.at if ev.ended_at is None else ev.ended_at
            self.runs.ended(ev.job_id, None, ev.engine_job_id, end)
            self.charges.run_ended(ev)
        elif isinstance(ev, e.JobRunEnded):
            end = ev.at if ev.ended_at is None else ev.ended_at
            self.runs.ended(ev.job_id, ev.run, ev.engine_job_id, end)
            self.charges.run_ended(ev)
        try:
            evolve(self.state, ev)
        except (KeyError, AttributeError) as err:
            self.flag(
                pos,
                ev,
                "INCONSISTENT",
                f"{e.tag_of(type(ev))} refers to unknown {err}",
                getattr(ev, "job_id", None),
            )

    def _decided_in_order(self, pos: int, ev: e.CycleDecided) -> None:
        """Decisions are decided and recorded in log order (beyond `CLOCK_STEP_S`): a record
        decided, or recorded, an hour before the previous one was edited. (A record's `at` and
        its `decided_at` are not compared with each other: a harness may decide for a moment
        its clock has not reached.)"""
        decided = ev.at if ev.decided_at is None else ev.decided_at
        last = self.decided_at
        self.decided_at = (decided, ev.at)
        if last is None:
            return
        for what, mine, theirs in (("decided", decided, last[0]), ("recorded", ev.at, last[1])):
            if mine < theirs - CLOCK_STEP_S:
                self.flag(
                    pos,
                    ev,
                    "DECIDED_BACKWARDS",
                    f"{ev.cycle_id} is {what} at {mine:.3f}, {theirs - mine:g} s before the "
                    f"previous decision record ({theirs:.3f})",
                )
                return

    def _placed(self, pos: int, ev: e.JobPlaced) -> None:
        job = ev.job_id
        if job in self.held:
            self.flag(
                pos,
                ev,
                "GPU_HELD_TWICE",
                f"job {job} is placed again while it still holds GPUs",
                job,
            )
        for sl in ev.slots:
            node = self.state.nodes.get(sl.node)
            if node is None or node.state != "active":
                now = "unknown" if node is None else node.state
                self.flag(
                    pos,
                    ev,
                    "PLACED_ON_INACTIVE_NODE",
                    f"job {job} placed on node {sl.node!r}, which is {now}",
                    job,
                )
            self._on_stopping(pos, ev, sl)
            for i in sl.gpu_indices:
                other = self.holder.get((sl.node, i))
                if other is not None and other != job:
                    self.flag(
                        pos,
                        ev,
                        "GPU_HELD_TWICE",
                        f"GPU {i} of node {sl.node!r} given to job {job} while job {other} "
                        "holds it",
                        job,
                    )
                self.holder[(sl.node, i)] = job
            self.held.setdefault(job, []).extend((sl.node, i) for i in sl.gpu_indices)
        self.placed_at[job] = ev.at

    def _on_stopping(self, pos: int, ev: e.JobPlaced, sl: e.GpuSlot) -> None:
        """A placement its decision made on a GPU of a stopped run its own record says it
        held (`stopping_held`, and by `lost_held`/`placed_held` a `node lost`'s run and one
        stopped while placed) whose end was not recorded: the decision's snapshot was not
        what the log folds to (`PLACED_ON_STOPPING_GPU`)."""
        cycle, lost, placed = self.held_rule
        if not cycle or ev.cycle_id != cycle:
            return
        gpus: set[int] = set()
        runs: list[str] = []
        for key, sr in self.state.stopped_runs.items():
            if key not in self.held_runs:
                continue  # stopped by this decision's own preemptions
            if (sr.why == NODE_LOST and not lost) or (sr.placed and not placed):
                continue
            for held in sr.slots:
                both = set(held.gpu_indices) & set(sl.gpu_indices)
                if held.node == sl.node and both:
                    gpus |= both
                    runs.append(f"job {sr.job_id}'s run {sr.run} (stopped {sr.at:.3f})")
        if runs:
            self.flag(
                pos,
                ev,
                "PLACED_ON_STOPPING_GPU",
                f"job {ev.job_id} placed on node {sl.node!r} GPUs {sorted(gpus)}, where "
                f"{', '.join(runs)} was not reported gone ({cycle} held stopping runs)",
                ev.job_id,
            )

    def _preempted(self, pos: int, ev: e.JobPreempted) -> None:
        job = self.state.jobs.get(ev.job_id)
        placed = self.placed_at.get(ev.job_id)
        if job is None or placed is None:
            return
        ends = placed + job.spec.min_runtime_s
        if ev.at >= ends or self._lost_with_node(job, ev) or self._taken_back_unstarted(job, ev):
            return
        left = ends - ev.at
        what = (
            f"job {ev.job_id} preempted ({ev.reason}) by {ev.actor!r} {left:g} s before its "
            f"contract ends"
        )
        owner = ev.actor == job.spec.user or self.state.manages(ev.actor, job.spec.account)
        if owner and not is_system(ev.actor) and ev.note.startswith("requeued by "):
            self.note(pos, ev, "REQUEUED_IN_CONTRACT", f"{what}: {ev.note}", ev.job_id)
        elif is_system(ev.actor) and ev.reason == "maintenance" and ev.note == DRAINED_NOTE:
            # `agent --drain`: host maintenance, which a contract allows (as an admin's drain)
            reason = f"{what}: its node was drained for maintenance (agent --drain)"
            self.note(pos, ev, "DRAINED_IN_CONTRACT", reason, ev.job_id)
        elif self.state.is_admin(ev.actor) and not is_system(ev.actor) and ev.note.strip():
            reason = f"{what}: admin preemption, reason: {ev.note.strip()}"
            self.note(pos, ev, "ADMIN_PREEMPTED_IN_CONTRACT", reason, ev.job_id)
        else:
            self.flag(pos, ev, "PREEMPTED_IN_CONTRACT", what, ev.job_id)

    def _drained(self, pos: int, ev: e.JobFinished) -> None:
        """A job `agent --drain` stopped inside its contract (not resumable: it ends with no
        preemption recorded) is host maintenance, which a contract allows: listed as allowed."""
        job = self.state.jobs.get(ev.job_id)
        placed = self.placed_at.get(ev.job_id)
        if job is None or placed is None or not (is_system(ev.actor) and ev.note == DRAINED_NOTE):
            return
        ends = placed + job.spec.min_runtime_s
        end = ev.at if ev.ended_at is None else ev.ended_at
        if end < ends:
            what = (
                f"job {ev.job_id} stopped by {ev.actor!r} {ends - end:g} s before its contract ends"
            )
            reason = f"{what}: its node was drained for maintenance (agent --drain)"
            self.note(pos, ev, "DRAINED_IN_CONTRACT", reason, ev.job_id)

    @staticmethod
    def _taken_back_unstarted(job: Job, ev: e.JobPreempted) -> bool:
        """An engine's take-back of a placement it cannot start (`RequeueJob` by a system
        actor, "requeued by @executor: node N cannot run it: ...", `unplace_commands`; Slurm's
        leaked GPUs, atk46-s F3) of a job not started yet (`placed`, folded before the event):
        the run never ran, so no contract of its was cut short."""
        return job.status == "placed" and is_system(ev.actor) and ev.note.startswith("requeued by ")

    def _lost_with_node(self, job: Job, ev: e.JobPreempted) -> bool:
        """A contract cannot outlive its node: a requeue because a node it runs on is lost
        (`NodeLost`, folded just before) or because the engine says the run ended with its
        node (an executor's report) breaks no contract."""
        if ev.reason != "node_failure":
            return False
        return is_system(ev.actor) or any(
            (n := self.state.nodes.get(sl.node)) is not None and n.state == "lost"
            for sl in job.slots
        )

    def _release(self, job: int) -> None:
        for gpu in self.held.pop(job, []):
            if self.holder.get(gpu) == job:
                del self.holder[gpu]
        self.placed_at.pop(job, None)


def check(events: Iterable[e.AnyEvent | tuple[int, e.AnyEvent]]) -> CheckReport:
    """Pure: scan a history (events, or (position, event) pairs; bare events get positions 1,
    2, ...) for violations of the ledger's invariants, and list the allowed exceptions."""
    checker = _Checker()
    for i, item in enumerate(events, start=1):
        pos, ev = item if isinstance(item, tuple) else (i, item)
        checker.visit(pos, ev)
    violations = (
        checker.violations + checker.runs.violations() + checker.charges.violations(checker.runs)
    )
    return CheckReport(events=checker.n, violations=tuple(violations), noted=tuple(checker.noted))


def check_history(events: Iterable[e.AnyEvent | tuple[int, e.AnyEvent]]) -> list[Violation]:
    """Pure: the violations of a history (empty when it is clean). For simulation tests:
    `assert check_history(ev for _, ev in ledger.read(0, ledger.position)) == []`."""
    return list(check(events).violations)


def check_charges(store: Store) -> list[Violation]:
    """Edge: usage is charged from the projection's intervals flagged funded; none may belong
    to an unfunded job (min runtime 0)."""
    return [
        Violation(
            position=int(pos),
            at=float(at),
            code="UNFUNDED_CHARGED",
            message=f"the interval of unfunded job {job} from position {pos} is charged to {leaf}",
            job_id=int(job),
        )
        for job, pos, at, leaf in history.unfunded_charges(store.con)
    ]


def check_live(
    holders: Mapping[tuple[str, int], int],
    live: Iterable[tuple[int, str, int]],
    position: int,
    at: float,
) -> list[Violation]:
    """Pure: GPUs held by two jobs at once, counting processes really alive. `holders` is the
    ledger's (node, GPU) -> job at `position`; `live` the (job, node, GPU) of every live job
    process. A process of a job the ledger has ended, on a GPU the ledger gave to another job,
    is the double booking a lost process causes."""
    jobs: dict[tuple[str, int], set[int]] = {}
    for gpu, job in holders.items():
        jobs.setdefault(gpu, set()).add(job)
    for job, node, index in live:
        jobs.setdefault((node, index), set()).add(job)
    return [
        Violation(
            position=position,
            at=at,
            code="LIVE_GPU_HELD_TWICE",
            message=f"GPU {index} of node {node!r} is held by jobs "
            f"{', '.join(str(j) for j in sorted(held))} at once (ledger and live processes)",
            job_id=min(held),
        )
        for (node, index), held in sorted(jobs.items())
        if len(held) > 1
    ]


Read = Callable[[int, int], list[tuple[int, e.AnyEvent]]]


def read_all(read: Read, page: int = 10_000) -> Iterator[tuple[int, e.AnyEvent]]:
    """Edge helper: every (position, event) of a reader like `Ledger.read`."""
    after = 0
    while True:
        chunk = read(after, page)
        if not chunk:
            return
        yield from chunk
        after = chunk[-1][0]
