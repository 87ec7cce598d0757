"""Opening the Slurm executor: the ledger's name in Slurm's comments, the partition checked
and its GPU nodes registered (`open_executor`), at once when slurmctld answers, else once it
does (`SlurmOpening`): a service starts during a controller outage."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Mapping, Set
from pathlib import Path

from ledger.core.state import Node
from ledger.cycle.executor import Exit, Observed, Orders, Start
from ledger.engines.accounts import RunAs
from ledger.engines.slurm.cluster import OtherCluster, Watch
from ledger.engines.slurm.executor import ENGINE, SlurmExecutor
from ledger.engines.slurm.stops import grace_in, limit_in, lost_in
from ledger.engines.slurm.words import name_of, register_commands
from ledger.store.application import Ledger
from schemas.errors import EngineAway, EngineError, InvalidCommand

log = logging.getLogger("gpuledger.slurm")

VANISH_AFTER_ENV = "GPULEDGER_SLURM_VANISH_AFTER_S"
"""How long a submitted run may be missing from every read of Slurm's before it counts as gone
(`SlurmExecutor.vanish_after_s`, 30 s; read by the server, `ledger.server.run`): a test that
waits past it sets a shorter one (it had no setting: the tests slept 45 s)."""

PING_TIMEOUT_S = 3.0
"""`scontrol ping` answers at once whether slurmctld is up or down (a refused connection); a
controller host that drops packets is given this long."""


def ledger_id(ledger: Ledger) -> str:
    """This ledger's name in Slurm comments: 12 hex digits of its first event's id."""
    first = ledger.read(0, 1)
    return name_of(first[0][1] if first else None)


def controller_answers(slurm: SlurmExecutor) -> str:
    """Empty when slurmctld answers (`scontrol ping` says UP), else why not, in one line. Asked
    before anything that needs the controller: every other command against a controller that
    is down costs about 9 s (the client's retries); this one costs milliseconds."""
    try:
        done = subprocess.run(
            ["scontrol", "ping"],
            capture_output=True,
            text=True,
            timeout=PING_TIMEOUT_S,
            env=slurm.env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"scontrol ping failed: {err}"
    if done.returncode == 0 and " is UP" in done.stdout:
        return ""
    lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if " is " in ln]
    return lines[0] if lines else f"scontrol ping: exit {done.returncode}"


def open_executor(
    ledger: Ledger,
    partition: str | None,
    log_dir: Path,
    grace_s: float,
    actor: str,
    run_as: RunAs = "submitter",
    may_act: Callable[[], bool] | None = None,
    node_fence_s: float = 300.0,
    cluster: Mapping[str, object] | None = None,
    abandoned: Set[tuple[int, int]] = frozenset(),
    handed_over: bool = False,
    vanish_after_s: float | None = None,
) -> SlurmOpening:
    """The executor of `partition`. When slurmctld answers, it is opened now: Slurm must let
    gpu-ledger own the partition, whose GPU nodes are registered in the ledger by `actor` (an
    admin); one clear error when the partition is missing, cannot be owned or has no GPU node,
    nothing appended then. When slurmctld does not answer, the service starts all the same and
    the executor opens once it does (`SlurmOpening`); nor while another cluster than
    `cluster` (the one the store records; None: the first one read) answers in its place
    (`cluster.Watch`, asked again whenever slurmctld answers after being away). `abandoned`:
    runs (job, run) `--abandon-runs` left on another cluster, never adopted (recorded lost).
    `handed_over`: this server took the lease after its last holder's clean stop: no `sbatch`
    of its is in flight, and placed runs are submitted at once (`takeover.InFlight`).
    `vanish_after_s`: `SlurmExecutor.vanish_after_s` (`VANISH_AFTER_ENV`; None: its own)."""
    if not partition:
        raise InvalidCommand(
            "the Slurm executor needs the partition gpu-ledger owns",
            hint="pass --partition P (serve: `partition` in the config file)",
        )
    slurm = SlurmExecutor(
        partition, ledger_id(ledger), log_dir, grace_s=grace_s, run_as=run_as, may_act=may_act
    )
    if vanish_after_s is not None:  # `GPULEDGER_SLURM_VANISH_AFTER_S`
        slurm.vanish_after_s = vanish_after_s
    slurm.fence_s = node_fence_s  # `serve --node-fence`, as for the node agents
    slurm.abandoned = frozenset(abandoned)  # `--abandon-runs`: recorded lost (atk45ha L1)
    slurm.in_flight.handed_over = handed_over  # a clean handover: nothing waits
    slurm.cluster = Watch(slurm.cluster.read, cluster)
    slurm.job_grace = lambda job_id: grace_in(ledger.state, job_id, slurm.grace_s)
    slurm.job_limit = lambda job_id: limit_in(ledger.state, job_id)
    slurm.stopped_runs = lambda: ledger.state.stopped_runs  # its stops, after a restart too
    slurm.strays.recorded = lambda tag: tag in ledger.state.run_ends  # (atk46-s F1)
    slurm.lost_nodes = lambda: lost_in(ledger.state)
    opening = SlurmOpening(slurm, lambda: _open(ledger, slurm, log_dir, actor))
    away = controller_answers(slurm)
    if away:
        log.warning("slurmctld does not answer (%s): serving without placing anything; the "
                    "executor opens once it answers", away)  # fmt: skip
        opening.away = away
    else:
        try:
            opening.open_now()  # a refusal is a startup error
        except OtherCluster as err:  # a take: opened once this server's cluster answers (F5)
            opening.away = err.line()
            log.error("%s; placing nothing until it does", opening.away)
    return opening


def _open(ledger: Ledger, slurm: SlurmExecutor, log_dir: Path, actor: str) -> None:
    """Check the partition and register its GPU nodes (EngineError: Slurm refuses)."""
    slurm.check()
    if log_dir.is_dir() and log_dir.stat().st_mode & 0o022:  # an older version's 1777
        log.warning("%s was writable by others: made 0755 (the service's own directory)", log_dir)
        log_dir.chmod(0o755)
    found = slurm.nodes()
    if not found:
        raise EngineError(
            f"Slurm partition {slurm.partition!r} has no nodes with GPUs (Gres=gpu:...)",
            hint="see docs/slurm.md",
        )
    cmds = register_commands(found, ledger.state.nodes, actor)
    if cmds:
        ledger.execute_all(cmds)


class SlurmOpening:
    """The Slurm executor as the service holds it. Until slurmctld has answered and the runs
    are adopted it is not open: `adopt` raises `EngineAway` (the service retries at each step,
    placing nothing and saying why in `status`), asking `scontrol ping` at most every
    `probe_every_s`; once the controller answers it checks the partition, registers the nodes
    and adopts the runs, then hands every call to the `SlurmExecutor`. A refusal found then
    (a partition missing or one gpu-ledger may not own) keeps it closed, the refusal shown in
    `status`, and asked again at the next probe (an admin may fix the partition)."""

    engine = ENGINE
    relaunch_placed = True

    def __init__(self, slurm: SlurmExecutor, open_now: Callable[[], None]) -> None:
        self.slurm = slurm
        self._open = open_now
        self.opened = False
        """The partition checked and the nodes registered."""
        self.adopted = False
        """The runs adopted: every call goes to `slurm`."""
        self.away = ""
        """Why the executor is not open yet ("" once it is)."""
        self.probe_every_s = slurm.probe_every_s
        self._probe_at: float | None = None

    def open_now(self) -> None:
        self._open()
        self.opened = True
        self.away = ""

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        if not self.adopted:
            self._reach(now)
            try:
                known = self.slurm.adopt(runs, now)
            except EngineError as err:
                self.away = err.line()
                raise EngineAway(self.away) from err
            self.adopted = True
            self.away = ""
            return known
        return self.slurm.adopt(runs, now)

    def _reach(self, now: float) -> None:
        """Open, if slurmctld answers and the last probe is `probe_every_s` old; else
        `EngineAway` with why."""
        if self._probe_at is not None and now < self._probe_at:
            raise EngineAway(self.away)
        self._probe_at = now + self.probe_every_s
        away = controller_answers(self.slurm)
        if away:
            self.away = f"slurmctld does not answer: {away}"
            raise EngineAway(self.away)
        if not self.opened:
            try:
                self.open_now()
            except EngineError as err:
                said = "" if isinstance(err, OtherCluster) else "Slurm refuses: "
                why, self.away = self.away, f"{said}{err.line()}"
                if why != self.away:  # once per change, not at every probe (atk44ha)
                    log.warning("%s", self.away)
                raise EngineAway(self.away) from err
            log.warning("slurmctld answers: the executor is open")

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        if not self.adopted:  # nothing is known: every node unobserved, nothing decided
            return Observed(unobserved=frozenset(n for n, x in nodes.items()
                                                 if x.state != "removed"),
                            unobserved_why=self.away)  # fmt: skip
        return self.slurm.observe(now, nodes)

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        if not self.adopted:
            raise EngineAway(self.away or "the Slurm executor is not open yet")
        return self.slurm.carry_out(orders, now)

    def shutdown(self, now: float) -> list[Exit]:
        return self.slurm.shutdown(now) if self.adopted else []

    def heard_from(self) -> Mapping[str, float]:
        return self.slurm.heard_from()

    def next_event_at(self) -> float | None:
        return self.slurm.next_event_at()
