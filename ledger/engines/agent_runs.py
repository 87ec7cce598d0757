"""A placement handed to node agents (`AgentRun`), the part each of its nodes gets (`part_for`),
and what its parts' reports make of the run, for the node agents' executor
(`ledger.engines.agents`): its start once every part has started (`run_started`), its end once a
part failed (not by its time limit) or every part ended (`run_ended`), its GPU utilisation once
every part has sent a sample (`AgentRun.sampled`). No I/O but a log line; `now` is a
parameter."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ledger.core.state import NODE_LOST
from ledger.cycle.executor import Exit, Launch, Reaping, Sample, Start, command_code
from schemas import agent as a
from schemas.events import GpuSlot, RunPart

if TYPE_CHECKING:
    from ledger.core.state import Job, Node, StoppedRun

log = logging.getLogger("gpuledger.agents")


@dataclass
class AgentRun:
    """A placement handed to agents, and what they said about it."""

    job_id: int
    run: int
    nodes: tuple[str, ...]
    slots: tuple[GpuSlot, ...] = ()
    started: dict[str, a.PartStarted] = field(default_factory=dict)
    exits: dict[str, a.PartExited] = field(default_factory=dict)
    samples: dict[str, tuple[float, ...]] = field(default_factory=dict)
    start_reported: bool = False
    exit_reported: bool = False
    grace_s: float = 30.0
    reaping: dict[str, a.PartReaping] = field(default_factory=dict)
    reaping_reported: bool = False

    @property
    def name(self) -> str:
        return f"{self.job_id}.{self.run + 1}"

    def sampled(self, node: str, values: tuple[float, ...]) -> Sample | None:
        """A part's utilisation sample; the run's once every part has sent one (then counted
        afresh)."""
        self.samples[node] = values
        if len(self.samples) != len(self.nodes):
            return None
        out = Sample(self.job_id, tuple(v for n in self.nodes for v in self.samples[n]))
        self.samples.clear()
        return out


def run_reaping(r: AgentRun) -> Reaping | None:
    """Every part's command has exited (some leaving processes their supervisors reap): the
    run's reaping, once (its latest SIGKILL); None until then."""
    if r.reaping_reported or r.exit_reported or not r.start_reported or not r.reaping:
        return None
    if any(n not in r.reaping and n not in r.exits for n in r.nodes):
        return None
    r.reaping_reported = True
    said = r.reaping.values()
    code = command_code(r.reaping[n].exit_code if n in r.reaping else r.exits[n].exit_code
                        for n in r.nodes)  # fmt: skip
    return Reaping(r.job_id, r.run, max(x.leader_ended_at for x in said),
                   max(x.left for x in said), max(x.kill_at for x in said), code)  # fmt: skip


def part_for(job: Launch, grace: float, master_addr: str, token: str) -> a.Part:
    """The part of `job` its nodes' agents get: its rank-0 node's address for the rendezvous,
    its job token, and `grace` (ours when the job has none: the fence counts on it)."""
    return a.Part(
        job_id=job.job_id,
        run=job.run,
        slots=job.slots,
        command=job.command,
        user=job.user,
        account=job.account,
        duration_s=job.duration_s,
        time_limit_s=None if job.time_limit_s is None else int(job.time_limit_s),
        grace_s=round(grace),  # ours when the job has none: the fence counts on it
        debug=job.debug,
        master_addr=master_addr,
        job_token=token,
        workdir=job.workdir,
        env=job.env,
        stdout=job.stdout,
        stderr=job.stderr,
        job_name=job.job_name,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        umask=job.umask,
        ulimits=None if job.ulimits is None else dict(job.ulimits),  # type: ignore[arg-type]
    )


def run_started(r: AgentRun, named: Callable[[], str]) -> Start | None:
    """Every part has started: the run has, when its last part did, with what each agent
    observed of its part (pid, cgroup) and the GPUs it was given. `named`: the output file the
    job's submission names, "" when it names none."""
    if r.start_reported or len(r.started) < len(r.nodes):
        return None
    r.start_reported = True
    parts = [(n, r.started[n]) for n in r.nodes]
    # a part whose agent did not say (a start first told by its exit): the submission's
    named_output = named()
    logs = tuple(f"{n}:{p.log or named_output}" for n, p in parts if p.log or named_output)
    times = [p.started_at for _, p in parts if p.started_at is not None]
    return Start(
        r.job_id,
        engine_job_id=r.name,
        run=r.run,
        gpus=r.slots,
        logs=logs,
        started_at=max(times) if times else None,
        parts=tuple(
            RunPart(node=n, gpu_indices=_gpus_on(r.slots, n), pid=p.pid, tree=p.tree)
            for n, p in parts
        ),
    )


def run_ended(
    r: AgentRun, now: float, named: Callable[[], str]
) -> tuple[Start | None, Exit] | None:
    """A part failed (its end is the run's), or every part has ended: the run's end, after
    its start when none was reported yet (a start first told by an exit). None until then. A
    part its time limit stopped is no failure of its own: every part's agent stops its own at
    that limit, with its own SIGTERM and grace (an agent back late gives its part SIGTERM and
    min(grace, 10 s) then), so the run ends at its last part's end, not at the first one's:
    that ended the job, and the other part, which the ledger then no longer ran, was killed
    at once within its grace (atk58 F3: 6.4 s after its SIGTERM, the job's end recorded before
    its death)."""
    if r.exit_reported:
        return None
    failed = [(n, x) for n, x in r.exits.items() if x.exit_code != 0 or x.reason != "exited"]
    own = [n for n, x in failed if x.reason != "time_limit"]
    if not own and len(r.exits) < len(r.nodes):
        return None  # a gang job ends when every part has, unless one fails
    launched = not any(x.reason == "launch_failed" for _, x in failed)
    start = None
    if not r.start_reported and launched:
        for n in r.nodes:
            r.started.setdefault(n, a.PartStarted(job_id=r.job_id, run=r.run))
        start = run_started(r, named)
    r.exit_reported = True
    node, x = failed[0] if failed else (r.nodes[0], r.exits[r.nodes[0]])
    if failed:
        log.info("job %s: its part on %s ended with %s (%s)", r.job_id, node, x.exit_code,
                 x.reason)  # fmt: skip
    times = [e.ended_at for e in r.exits.values() if e.ended_at is not None]
    at = max(times) if times else now
    notes = "; ".join(dict.fromkeys(e.note for e in r.exits.values() if e.note))
    return start, Exit(r.job_id, x.exit_code, at, x.reason, r.name, note=notes)


def _gpus_on(slots: tuple[GpuSlot, ...], node: str) -> tuple[int, ...]:
    return next((sl.gpu_indices for sl in slots if sl.node == node), ())


def reported_jobs(rep: a.Report) -> set[int]:
    """Pure: the jobs a report tells about (started, exited, sampled, checkpointed, stopped,
    reaping)."""
    items = (rep.started, rep.exited, rep.samples, rep.checkpoints, rep.stopped, rep.reaping)
    return {p.job_id for kind in items for p in kind}


class StoppedStarts:
    """When the parts of runs the ledger stopped had started, as their agents said (a run
    stopped while placed, whose start the ledger never recorded: a cancel, a preemption or a
    requeue before its start was reported): its end then says when it started (`Exit.started_at`,
    the latest part's), so the run is charged from its own start and `jobs` names where it ran,
    as Slurm accounts a cancelled job from its start (atk52-23 F4: a cancelled placed run that
    ran 36 s was not charged; atk54-23 F3). Keeps at most `KEPT` runs, the newest."""

    KEPT = 10_000

    def __init__(self) -> None:
        self._at: dict[tuple[int, int], float] = {}

    def keep(self, job_id: int, run: int, started_at: float | None) -> None:
        if started_at is None:
            return
        key = (job_id, run)
        self._at[key] = max(started_at, self._at.pop(key, started_at))
        while len(self._at) > self.KEPT:
            del self._at[next(iter(self._at))]

    def take(self, x: Exit) -> Exit:
        """`x` (a stopped run's end) with its start, when one of its parts said it."""
        at = None if x.run is None else self._at.pop((x.job_id, x.run), None)
        return x if at is None or x.started_at is not None else replace(x, started_at=at)


def launch_refusal(
    check: a.LaunchCheck, node: str, r: AgentRun | None, part: a.Part | None, job: Job | None,
    blocking: Iterable[str], deciding: bool,
) -> str:  # fmt: skip
    """Pure: why the launch `check` that `node`'s agent is about to start must not start (its
    last check, `/v1/agent/confirm`), "" when it is still its job's current placement there:
    the run the executor hands out (`r`), the part on the node's list (`part`, the same job
    token), the ledger's job placed or running on the node and its command not ended, no
    earlier run of it possibly alive (`blocking`: its nodes) and no earlier run's end being
    recorded first (`deciding`). An agent that launched from an older poll answer ran a
    command again after its job had completed (atk55-23 F1)."""
    j, run = check.job_id, check.run
    if r is None or r.run != run or node not in r.nodes or part is None or part.run != run:
        return f"run {run} of job {j} is no longer its placement on {node}"
    if part.job_token != check.job_token:
        return f"job {j}'s part on {node} was handed out again since"
    if job is None or job.status not in ("placed", "running") or job.reaping_kill_at is not None:
        return f"the ledger no longer runs job {j} (it is {'gone' if job is None else job.status})"
    if not any(sl.node == node for sl in job.slots) or node in r.exits:
        return f"job {j} no longer runs on {node}"
    held = sorted(blocking)
    if held:
        return f"an earlier run of job {j} may still be alive on {', '.join(held)}"
    if deciding:
        return f"the end of an earlier run of job {j} is being recorded first"
    return ""


def end_unheard(
    stopped: Iterable[StoppedRun], nodes: Mapping[str, Node], job_id: int, run: int, now: float,
    grace_s: float, lost_after_s: float,
) -> bool:  # fmt: skip
    """Pure: an earlier run of the job the ledger stopped, on nodes it counts up, has no end
    yet (the caller knows none in hand): its node said it is gone, its end follows, and the
    ledger may end the job by it (it completed by itself), so the next launch waits for it: an
    agent that reported a run gone before its end had the job's command run again after it
    completed (atk55-23 F1). At most until the run's grace and the node-lost timeout have
    passed since its stop (an end that never comes holds nothing forever)."""
    for sr in stopped:
        if sr.job_id != job_id or sr.run >= run or sr.why == NODE_LOST:
            continue
        if any(sl.node not in nodes or nodes[sl.node].state == "lost" for sl in sr.slots):
            continue
        if now < sr.at + sr.grace(grace_s) + lost_after_s:
            return True
    return False
