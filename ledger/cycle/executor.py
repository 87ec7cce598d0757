"""The executor protocol: what the dispatcher says to an engine, once per cycle each way.

The ledger is the truth; an executor only carries out its decisions and reports what really
happened. One protocol, every engine: `ledger.sim.kernel.KernelExecutor` (virtual time: the
simulator's, the what-if's and the tests'), `ledger.engines.supervised.SupervisedExecutor`
(processes on this host that outlive the service: `gpuledger up --executor local`, node agents),
`ledger.engines.agents.AgentExecutor` (node agents over the API), `ledger.engines.slurm`'s
`SlurmExecutor` (a Slurm partition) and `ledger.engines.none.NoExecutor` (placements only
recorded).

A cycle talks to its executor twice, Kueue's and Nomad's shape (observe, decide, act):

- `observe(now, nodes) -> Observed`: everything the engine saw since it was last asked, in one
  value: node changes (a node Slurm marked DOWN, or whose agent has been silent past the
  node-lost timeout, is `lost`), runs that began, checkpoints, utilisation samples, runs that
  ended, the GPUs work outside the ledger holds, and the jobs that really have a run in the
  engine. `nodes` is the ledger's view, which engines that own node health compare theirs with.
- `carry_out(orders, now) -> starts`: stop the runs the ledger no longer runs (signal, the grace,
  then kill; their exits go unreported), then launch the placements, each with all its parts;
  returns the runs that began at once (engines whose launches start at once say so here).

A service also needs, around the cycles: `adopt` (after a restart, compare the ledger with the
engine: the service reconciles from facts, never guesses), `shutdown` and, for a virtual clock,
`next_event_at`. The ledger side of all this, the one path from an `Observed` to commands, is
`ledger.cycle.record`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from ledger.core.jobs import expand_output
from schemas.commands import RunEnd
from schemas.events import GpuSlot, JobSubmitted, RunPart

if TYPE_CHECKING:
    from ledger.core.state import Job, Node


@dataclass(frozen=True)
class Launch:
    """One placement to run: a part per slot (node), each with only that node's GPUs."""

    job_id: int
    slots: tuple[GpuSlot, ...]
    command: tuple[str, ...]
    duration_s: float | None
    user: str
    account: str
    run: int = 0
    """Which placement of the job this is (its preemptions so far): names the engine's run."""
    time_limit_s: int | None = None
    """Stop the job this long after it started (SIGTERM, grace, SIGKILL); None: no limit."""
    grace_s: float | None = None
    """SIGTERM-to-SIGKILL grace of this job; None: the executor's default."""
    debug: bool = False
    master_addr: str = ""
    """Host of rank 0's node for the rendezvous variables; "" lets the executor say."""
    job_token: str = ""
    """The job's own token (`GPULEDGER_JOB_TOKEN`), when a server minted one."""
    workdir: str = ""
    """The absolute directory the job starts in ("" the engine's default)."""
    env: tuple[tuple[str, str], ...] = ()
    """The job's environment as submitted (after `--export`); the engine adds the ledger's own
    variables and the user's HOME, USER, LOGNAME and SHELL."""
    stdout: str = ""
    """The output file, its pattern written out (`output_files`); "" the engine's default."""
    stderr: str = ""
    """The error file ("" = the same as stdout)."""
    job_name: str = ""
    array_job_id: int | None = None
    """A job array's first task id (`GPULEDGER_ARRAY_JOB_ID`, Slurm's `SLURM_ARRAY_JOB_ID`)."""
    array_task_id: int | None = None
    """This task's index (`GPULEDGER_ARRAY_TASK_ID`, `SLURM_ARRAY_TASK_ID`)."""
    umask: int | None = None
    """The submitter's umask: the job's, and its named output files' (None: the engine's old
    rule, those files 0600 and the job with the service's umask)."""
    ulimits: tuple[tuple[str, int], ...] | None = None
    """The submitter's soft resource limits by name (-1 unlimited; `JobSubmitted.ulimits`):
    the job starts with them, never above its node's hard limits. None: none recorded (or
    `--propagate=NONE`'s empty), the limits the engine gives it."""


def launch_of(job_id: int, job: Job, user: str) -> Launch:
    """Pure: a placed or running job as the engine runs it, run as `user`: its contract and its
    whole world as the submission recorded it (directory, environment, output files with their
    patterns written out, umask, name, array). The one builder: the dispatcher's launches and
    the runs an executor hands out again after a restart (atk38-23 F8) are the same."""
    spec = job.spec
    stdout, stderr = output_files(spec, job.slots)
    return Launch(
        job_id,
        job.slots,
        spec.command,
        spec.duration_s,
        user,
        spec.account,
        run=job.run,
        time_limit_s=spec.time_limit_s,
        grace_s=spec.grace_s,
        debug=spec.debug,
        workdir=spec.workdir,
        env=tuple(spec.env.items()),
        stdout=stdout,
        stderr=stderr,
        job_name=spec.job_name,
        array_job_id=spec.array_job_id,
        array_task_id=spec.array_task_id,
        umask=spec.umask,
        ulimits=None if spec.ulimits is None else tuple(spec.ulimits.items()),
    )


def output_files(spec: JobSubmitted, slots: tuple[GpuSlot, ...]) -> tuple[str, str]:
    """Pure: a job's output and error files as its launch names them: the submitted patterns
    with `%j %u %x %a %A %N` written out, relative ones under the job's working directory
    ("" when it names none: the engine's default; an empty error file is the output file)."""

    def path(pattern: str) -> str:
        if not pattern:
            return ""
        name = expand_output(
            pattern,
            job_id=spec.job_id,
            user=spec.user,
            job_name=spec.job_name,
            array_job_id=spec.array_job_id,
            array_task_id=spec.array_task_id,
            node=slots[0].node if slots else "",
        )
        return posixpath.join(spec.workdir, name) if spec.workdir else name

    return path(spec.stdout), path(spec.stderr)


@dataclass(frozen=True)
class Orders:
    """What one cycle asks of the engine, carried out in this order."""

    stops: tuple[int, ...] = ()
    """Jobs the ledger no longer runs (preempted, cancelled, ended elsewhere)."""
    launches: tuple[Launch, ...] = ()
    """Placements to run."""
    kills: tuple[int, ...] = ()
    """Jobs whose run the ledger stopped and then ordered killed at once (a second cancel:
    `StoppedRun.kill`): SIGKILL now, whatever is left of their grace. Sent again until their
    ends are recorded; an engine with no such run stopping ignores it."""
    epoch: int = 0
    """The leader epoch the orders were decided under (servers sharing a PostgreSQL store,
    docs/ha.md; 0: the only server). An engine that hands work to others passes it on (node
    agents refuse a list from an older epoch than one they have seen)."""


@dataclass(frozen=True)
class Exit:
    job_id: int
    exit_code: int
    at: float
    """When the run really ended (the engine's word when it has one, else when observed)."""
    reason: RunEnd = "exited"
    """`exited`: the job ended by itself; `time_limit`: stopped at its limit; `lost`: its
    process vanished with no exit code recorded; `drained`: stopped by its node's agent on the
    way out (the ledger requeues it when resumable); `launch_failed`: it could not be started;
    others as the engine says (Slurm)."""
    engine_job_id: str = ""
    """The engine's id of the run (Slurm job id); empty for engines that do not name runs."""
    engine_state: str = ""
    note: str = ""
    """What else the engine says (why a launch failed, processes left that were killed)."""
    run: int | None = None
    """Which run of the job it was, when the engine's run id does not say (Slurm's)."""
    by_itself: bool = False
    """A stopped run (`Observed.stopped`) whose command ended by itself before the stop's
    signal reached it, as the engine knows (`ConfirmRunEnded.by_itself`)."""
    started_at: float | None = None
    """A stopped run's own start, where the ledger recorded none (`ConfirmRunEnded.started_at`:
    stopped while placed, though its command ran)."""
    killed: bool | None = None
    """A run's end (`Observed.exits`): its processes outlived their grace and were killed, as
    the engine knows (`FinishJob.killed`, `JobEngineEnded.killed`); None: not said. A stopped
    run's says it by `engine_state` "KILLED"."""


@dataclass(frozen=True)
class Reaping:
    """A run's command has exited (on every part) leaving processes its engine reaps: SIGKILL
    at `kill_at` at the latest (`ReportLeaderEnded`)."""

    job_id: int
    run: int
    leader_ended_at: float
    left: int
    kill_at: float
    exit_code: int | None = None
    """Its command's exit code (a gang's: `command_code`); None: not said."""


def command_code(codes: Iterable[int | None]) -> int | None:
    """Pure: a run's command's exit code from its parts' (`Reaping.exit_code`): the first
    non-zero, else 0; None when a part's is not known."""
    known = list(codes)
    if any(c is None for c in known):
        return None
    return next((c for c in known if c), 0)


@dataclass(frozen=True)
class Start:
    """A run began (every part of it has started)."""

    job_id: int
    engine_job_id: str = ""
    run: int = 0
    gpus: tuple[GpuSlot, ...] = ()
    """The GPUs the engine says the run got (engines that say)."""
    logs: tuple[str, ...] = ()
    """Where its parts' output goes (engines that know)."""
    started_at: float | None = None
    """When it really started (engines that know; None: when observed)."""
    parts: tuple[RunPart, ...] = ()
    """What the engine observed of each part (pid, cgroup), for the record."""


@dataclass(frozen=True)
class Sample:
    """A job's GPU utilisation, % per GPU of the job, in its slots' order."""

    job_id: int
    gpu_utilisation: tuple[float, ...]


NodeChangeKind = Literal["lost", "drain", "return", "unplace"]


@dataclass(frozen=True)
class NodeChange:
    """The engine says a node's state in the ledger should change: `lost` (gone with its jobs:
    Slurm marked it DOWN, or its agent has been silent past the node-lost timeout), `drain` (it
    takes no new work in the engine), `return` (back in service) or `unplace` (the engine
    cannot start a run there at all: the jobs placed there and not started go back to the
    queue, a Slurm node the partition does not list). The engine decides when; the ledger
    records it (`ledger.cycle.record`)."""

    node: str
    change: NodeChangeKind
    reason: str = ""
    fence_s: float = 0.0
    """A node lost with a fence: its runs may still live until the fence passes, so they stay
    in doubt until its engine says how they ended or the fence passes (`NodeLost`: an agent's
    report, or on Slurm a NODE_FAIL run's own end record or its sure end); 0: they end at once
    (an admin's word)."""
    jobs: tuple[int, ...] = ()
    """For `unplace`: only these jobs go back to the queue (the GPUs they were placed on cannot
    run them: Slurm counts them allocated with no job holding them); empty: all placed there."""


@dataclass(frozen=True)
class Observed:
    """What an engine saw since it was last asked, recorded in this order (node changes first:
    a run that ended with its node is requeued rather than failed; starts before exits: a run
    that began and ended since the last look started first)."""

    nodes: tuple[NodeChange, ...] = ()
    starts: tuple[Start, ...] = ()
    checkpoints: tuple[int, ...] = ()
    """Jobs that reported a checkpoint."""
    samples: tuple[Sample, ...] = ()
    exits: tuple[Exit, ...] = ()
    foreign: Mapping[str, frozenset[int]] = field(default_factory=dict)
    """GPUs (node -> indices) busy with work outside the ledger: never placed on."""
    stopping: Mapping[str, frozenset[int]] = field(default_factory=dict)
    """GPUs (node -> indices) of runs the ledger stopped whose processes are not all gone yet
    (their grace): the engine starts nothing on them until they are; `node list` shows them
    held (`stopping`). The dispatcher places nothing on them either: it holds the GPUs of every
    stopped run whose end is not recorded (`ledger.cycle.inputs.stopping_gpus`, from the log,
    so a replay sees the same), but for a job a preemption makes room for."""
    running: frozenset[int] = frozenset()
    """Jobs that really have a run in the engine now (launched, not yet reported ended)."""
    stopped: tuple[Exit, ...] = ()
    """Runs the ledger had stopped whose processes are now all gone (`JobRunEnded`)."""
    reaping: tuple[Reaping, ...] = ()
    """Runs whose command exited leaving processes in their grace (`ReportLeaderEnded`)."""
    unobserved: frozenset[str] = frozenset()
    """Nodes the engine cannot observe now (slurmctld does not answer, a node's slurmd does
    not respond): the dispatcher decides nothing that depends on them (no placement on them, no
    preemption of their runs) until it can (outage mode)."""
    unobserved_why: str = ""
    """Why the engine observes no node at all, when that is why (slurmctld does not answer, or
    another cluster answers in its place); "" otherwise (a node's own: its slurmd)."""
    engine_note: str = ""
    """What the engine's own settings mean for the ledger's jobs, in words, for `status` (Slurm
    under sched/builtin: a gang whose nodes get different GPUs is refused); "" for nothing."""
    longest_s: float | None = None
    """The longest time limit the engine starts (Slurm: the partition's MaxTime; None: no
    limit): a pending job asking for more is neither placed nor made room for."""


class Executor(Protocol):
    """An engine, as the dispatcher cycle and the service around it see it (module doc)."""

    engine: str
    """The engine's name in JobEngineLinked/JobEngineEnded ("" records neither: sim, local)."""

    relaunch_placed: bool
    """After a restart, a job the ledger placed that the engine never received is launched
    again (True: the engine keeps runs across our restarts, so "unknown" means "never sent"), or
    recorded as lost (False)."""

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        """Everything seen since the last call; `nodes` is the ledger's view of the nodes."""
        ...

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        """Stop, then launch (every slot of a placement, on exactly the nodes and GPUs it
        names); the runs that began at once."""
        ...

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        """After a restart: `runs` maps each job the ledger holds GPUs for to its current run.
        Take over the engine's runs that match, stop the engine's runs of ours that the ledger no
        longer runs, and return the job ids the engine really has."""
        ...

    def shutdown(self, now: float) -> list[Exit]:
        """The service stops: the exits to record (runs this executor ends with the service)."""
        ...

    def heard_from(self) -> Mapping[str, float]:
        """When each node was last heard from (node agents' contact, for `/metrics`); {} for
        engines that do not track contact."""

    def next_event_at(self) -> float | None:
        """When something will happen without outside input (a simulated job ending), if known."""
        ...


@runtime_checkable
class HandsOutAgain(Protocol):
    """An executor that hands a running job's run out again after a restart (the agents': a
    node whose agent no longer has it launches it) takes each run's launch from `world`, which
    the dispatcher sets: its own launch of the job (`launch_of`, as its owner's OS account),
    never a part stripped of its world (atk38-23 F8)."""

    world: Callable[[int], Launch] | None
