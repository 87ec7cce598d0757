"""The event fold behind the run metrics: jobs, holds, waits, losses and idle time, folded from
the ledger's events in log order (`ledger.sim.metrics` computes every figure from it; its
docstring defines them).

Pure: `JobFold.apply` folds one event; no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from schemas import events as e


@dataclass
class JobRow:
    job_id: int
    account: str
    user: str
    gpus: int
    funded: bool
    debug: bool
    resumable: bool
    submitted_at: float
    work_s: float | None = None
    """The work it was submitted with (`duration_s`: simulated jobs), None when unknown."""
    gpu_type: str | None = None
    first_placed_at: float | None = None
    placed_at: float | None = None
    checkpoint_at: float | None = None
    finished_at: float | None = None
    outcome: str | None = None
    end_reason: str | None = None
    """Why its last run ended (`JobFinished.reason`: "time_limit" for a run ended at its limit)."""
    preemptions: int = 0
    resubmit_of: int | None = None
    queued_since: float | None = None
    """When its current wait began (submission or requeue); None while it holds GPUs."""
    waits: list[tuple[float, float]] = field(default_factory=list)
    """Every closed wait: (began at, seconds)."""
    relaunch: bool = False
    """Its current placement restarts it after a preemption (it pays the restart overhead)."""


LIMIT_GIVEN = "limit_given"
"""The label of a simulated job whose time limit the policy gave it (slurm-lab-2's DefaultTime),
not one it declared: its user resubmits what is left when it ends there."""


def _work(ev: e.JobSubmitted) -> float | None:
    """The work a job can do (the fixed yardstick's demand): its `duration_s`, up to the time
    limit it declared (a run ends there, and the rest of its work is never run by any policy)."""
    if ev.duration_s is None or ev.time_limit_s is None or LIMIT_GIVEN in ev.labels:
        return ev.duration_s
    return min(ev.duration_s, float(ev.time_limit_s))


LOSS_KINDS = (
    "unfunded",
    "non-resumable",
    "periodic checkpoints",
    "checkpoints on SIGTERM",
    "relaunch",
)


class Loss(NamedTuple):
    """GPU-seconds lost at a moment: a preemption's work, or a relaunch's restart overhead."""

    at: float
    job_id: int
    gpus: int
    lost_s: float
    reason: str
    """The preemption's reason; "relaunch" for a restart overhead."""
    funded: bool
    kind: str
    """One of `LOSS_KINDS`."""


class IdleSample(NamedTuple):
    """What one cycle left free, until the next (GPUs): on nodes kept for debug work, on nodes
    held for a reservation, and free GPUs no waiting job could use; and whether a funded job
    was left waiting."""

    at: float
    reserve: int
    held: int
    fragmented: int
    funded_waiting: bool = False


@dataclass
class JobFold:
    """Jobs, held GPU-time, waits, losses and idle time folded from the event log."""

    jobs: dict[int, JobRow] = field(default_factory=dict)
    held: list[tuple[float, float, int, bool, str]] = field(default_factory=list)
    """Closed holds: (start, end, GPUs, funded, account)."""
    losses: list[Loss] = field(default_factory=list)
    on_sigterm: set[int] = field(default_factory=set)
    """Resumable jobs that checkpoint on SIGTERM: a preemption loses them at most `grace_s`."""
    grace_s: float = 30.0
    relaunch_s: float = 0.0
    """The restart overhead of a relaunch (the simulated executor makes the run that long
    longer)."""
    capacity: list[tuple[float, str, int, bool]] = field(default_factory=list)
    """Node capacity changes: (at, node, gpus, delivering)."""
    node_gpus: dict[str, int] = field(default_factory=dict)
    node_type: dict[str, str] = field(default_factory=dict)
    idle_waiting_gpu_s: float = 0.0
    """GPU-seconds free on delivering nodes while a funded job was pending (`advance`d)."""
    _at: float | None = None
    _delivering: int = 0
    _holding: int = 0
    _funded_pending: int = 0
    _waiting_since: float | None = None
    funded_waiting_s: float = 0.0
    """Seconds during which at least one funded job was pending."""

    def advance(self, at: float) -> None:
        """Account for the time since the last event (what was free while funded work waited)."""
        if self._at is not None and at > self._at and self._funded_pending > 0:
            free = max(0, self._delivering - self._holding)
            self.idle_waiting_gpu_s += free * (at - self._at)
            self.funded_waiting_s += at - self._at
        if self._at is None or at > self._at:
            self._at = at

    def apply(self, ev: e.AnyEvent) -> None:
        self.advance(ev.at)
        match ev:
            case e.NodeRegistered():
                self.node_gpus[ev.node] = ev.gpus
                self.node_type[ev.node] = ev.gpu_type
                self.capacity.append((ev.at, ev.node, ev.gpus, True))
                self._delivering += ev.gpus
            case e.NodeDrained() | e.NodeRemoved() | e.NodeLost():
                self.capacity.append((ev.at, ev.node, self.node_gpus.get(ev.node, 0), False))
                self._delivering -= self.node_gpus.get(ev.node, 0)
            case e.NodeReturned():
                self.capacity.append((ev.at, ev.node, self.node_gpus.get(ev.node, 0), True))
                self._delivering += self.node_gpus.get(ev.node, 0)
            case e.JobSubmitted():
                of = ev.labels.get("resubmit_of")
                j = self.jobs[ev.job_id] = JobRow(
                    job_id=ev.job_id,
                    account=ev.account,
                    user=ev.user,
                    gpus=ev.gpus,
                    funded=ev.min_runtime_s > 0,
                    debug=ev.debug,
                    resumable=ev.resumable,
                    submitted_at=ev.at,
                    work_s=_work(ev),
                    gpu_type=ev.gpu_type,
                    resubmit_of=int(of) if of else None,
                    queued_since=ev.at,
                    relaunch=bool(of),
                )
                self._pending(j, +1)
            case e.JobPlaced():
                j = self.jobs[ev.job_id]
                if j.first_placed_at is None:
                    j.first_placed_at = ev.at
                if j.queued_since is not None:
                    j.waits.append((j.queued_since, ev.at - j.queued_since))
                    j.queued_since = None
                    self._pending(j, -1)
                j.placed_at = j.checkpoint_at = ev.at
                self._holding += j.gpus
            case e.CheckpointReported():
                self.jobs[ev.job_id].checkpoint_at = ev.at
            case e.JobPreempted():
                j = self.jobs[ev.job_id]
                if j.placed_at is not None:
                    self._preempted(j, ev)
                j.preemptions += 1
                j.placed_at = j.checkpoint_at = None
            case e.JobUnplaced():  # an engine's take-back of a run never started: it waits
                j = self.jobs[ev.job_id]  # again, nothing held, nothing lost (not a preemption)
                if j.placed_at is not None:
                    self._holding -= j.gpus
                j.placed_at = j.checkpoint_at = None
                if j.queued_since is None:
                    j.queued_since = ev.at
                    self._pending(j, +1)
            case e.JobRequeued():
                j = self.jobs[ev.job_id]
                if j.queued_since is None:
                    j.queued_since = ev.at
                    self._pending(j, +1)
                j.relaunch = True
            case e.JobFinished():
                j = self.jobs[ev.job_id]
                if j.placed_at is not None:
                    self._ended(j, ev.at)
                if j.queued_since is not None:  # cancelled while waiting
                    j.waits.append((j.queued_since, ev.at - j.queued_since))
                    j.queued_since = None
                    self._pending(j, -1)
                j.placed_at = None
                j.finished_at, j.outcome, j.end_reason = ev.at, ev.outcome, ev.reason
            case _:
                pass

    def _pending(self, j: JobRow, delta: int) -> None:
        if j.funded:
            self._funded_pending += delta

    def _overhead(self, j: JobRow, at: float) -> float:
        """The restart overhead the current run of `j` paid by `at` (0 for a first run)."""
        if not j.relaunch or j.placed_at is None or self.relaunch_s <= 0:
            return 0.0
        return min(self.relaunch_s, max(0.0, at - j.placed_at))

    def _ended(self, j: JobRow, at: float) -> None:
        """A hold ends (finished or preempted): its GPU-time and its restart overhead."""
        assert j.placed_at is not None
        self.held.append((j.placed_at, at, j.gpus, j.funded, j.account))
        self._holding -= j.gpus
        paid = self._overhead(j, at)
        if paid > 0:
            self.losses.append(Loss(at, j.job_id, j.gpus, paid, "relaunch", j.funded, "relaunch"))

    def _preempted(self, j: JobRow, ev: e.JobPreempted) -> None:
        assert j.placed_at is not None
        # the restart overhead is counted as its own loss: the work lost starts after it
        start = j.placed_at + self._overhead(j, ev.at)
        since = j.checkpoint_at if j.resumable and j.checkpoint_at else j.placed_at
        lost = max(0.0, ev.at - max(since, start))
        if not j.funded:
            kind = "unfunded"
        elif not j.resumable:
            kind = "non-resumable"
        elif j.job_id in self.on_sigterm:
            kind, lost = "checkpoints on SIGTERM", min(lost, self.grace_s)
        else:
            kind = "periodic checkpoints"
        self.losses.append(Loss(ev.at, j.job_id, j.gpus, lost, ev.reason, j.funded, kind))
        self._ended(j, ev.at)

    def running_losses(self, end: float) -> list[Loss]:
        """The restart overheads paid by `end` by runs still going then (a relaunch's restart is
        lost whether or not its run has ended; atk53-26 F4). Pure: the fold is not changed."""
        out = []
        for j in self.jobs.values():
            paid = self._overhead(j, end) if j.placed_at is not None and j.placed_at < end else 0.0
            if paid > 0:
                out.append(Loss(end, j.job_id, j.gpus, paid, "relaunch", j.funded, "relaunch"))
        return out

    @property
    def preemptions(self) -> list[Loss]:
        """The losses of preemptions (not of relaunches)."""
        return [x for x in self.losses if x.kind != "relaunch"]
