"""Executors run what the dispatcher placed. An edge: processes, signals, a virtual clock.

The ledger is the truth; an executor only carries out its decisions and reports what really
happened. One interface, three engines: `ledger.sim.kernel.KernelExecutor` (virtual time: the
simulator's, the what-if's and the tests'), `ledger.engines.supervised.SupervisedExecutor`
(processes on this host that outlive the service: `gpuledger up`, node agents) and
`ledger.engines.slurm.SlurmExecutor` (a Slurm partition):

- `launch` a placement with all its parts (every slot of a gang);
- `stop` a run the ledger no longer counts as running (preempted, cancelled): signal, the grace,
  then kill; its exit goes unreported;
- `starts` and `poll` report the runs that began and the runs that ended (exit code and reason);
- `running` lists what really runs in the engine for the ledger, and `adopt` (services) compares
  the ledger with the engine after a restart: the service reconciles from facts, never guesses.

An executor that is also `Reporting` reports checkpoints and GPU utilisation samples; one that
is also `OwnsNodes` (Slurm) says which nodes are out of service or lost and which GPUs work
outside the ledger holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from schemas.events import EndReason, GpuSlot

if TYPE_CHECKING:
    from ledger.core.state import Node
    from schemas.commands import AnyCommand


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


@dataclass(frozen=True)
class Exit:
    job_id: int
    exit_code: int
    at: float
    reason: EndReason = "exited"
    """`exited`: the job ended by itself; `time_limit`: stopped at its limit; `lost`: its
    process vanished with no exit code recorded; others as the engine says (Slurm)."""
    engine_job_id: str = ""
    """The engine's id of the run (Slurm job id); empty for engines that do not name runs."""
    engine_state: str = ""


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


@dataclass(frozen=True)
class Reports:
    """What an executor that runs real processes observed since it was last asked."""

    checkpoints: list[int] = field(default_factory=list)
    """Jobs that reported a checkpoint."""
    samples: list[tuple[int, tuple[float, ...]]] = field(default_factory=list)
    """(job, GPU utilisation % per GPU of the job)."""


class Executor(Protocol):
    engine: str
    """The engine's name in JobEngineLinked/JobEngineEnded ("" records neither: sim, local)."""

    def launch(self, job: Launch, now: float) -> None:
        """Carry out a placement: every slot of it, on exactly the nodes and GPUs it names."""

    def stop(self, job_id: int, now: float) -> None:
        """Stop a job the ledger no longer runs (preempted, cancelled): signal, then kill after
        the grace; its exit goes unreported."""

    def starts(self, now: float) -> list[Start]:
        """Launched runs that began running since the last call, in launch order."""

    def poll(self, now: float) -> list[Exit]:
        """Runs that ended since the last call, with exit code and reason."""

    def running(self) -> set[int]:
        """Jobs that really have a run in the engine (launched and not yet reported ended)."""

    def next_event_at(self) -> float | None:
        """When something will happen without outside input (a simulated job ending), if known."""


class ServiceExecutor(Executor, Protocol):
    """An executor a long-running service owns: it can be restarted under running work."""

    relaunch_placed: bool
    """After a restart, a job the ledger placed that the engine never received is launched
    again (True: the engine keeps runs across our restarts, so "unknown" means "never sent"), or
    recorded as lost (False: runs die with the service)."""

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        """After a restart: `runs` maps each job the ledger holds GPUs for to its current run.
        Take over the engine's runs that match, stop the engine's runs of ours that the ledger no
        longer runs, and return the job ids the engine really has."""

    def shutdown(self, now: float) -> list[Exit]:
        """The service stops: the exits to record (runs this executor ends with the service)."""


@runtime_checkable
class Reporting(Protocol):
    """An executor that reports checkpoints and utilisation of the jobs it runs."""

    def reports(self, now: float) -> Reports: ...


@runtime_checkable
class OwnsNodes(Protocol):
    """An engine that owns node health and may run work the ledger does not own (Slurm)."""

    def node_changes(self, nodes: Mapping[str, Node]) -> list[AnyCommand]:
        """The commands (drain, lost, return) that make the ledger's `nodes` follow the
        engine's; [] when the engine cannot be read now."""

    def foreign(self) -> Mapping[str, frozenset[int]]:
        """GPUs (node -> indices) busy with work outside the ledger: never placed on."""
