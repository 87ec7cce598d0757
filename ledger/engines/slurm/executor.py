"""The Slurm executor: gpu-ledger decides, a Slurm partition runs the processes. An edge.

It runs `scontrol`, `sbatch`, `scancel` and `sacct` and reads their answers with
`ledger.engines.slurm.words` (pure). What the ledger owns and what Slurm owns is in docs/slurm.md.
Each cycle's `observe` reads every job once, then the partition's nodes: a run that ended with its
node (NODE_FAIL) comes with the node's loss, which the ledger records first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ledger.core.state import Node
from ledger.cycle.executor import Exit, Launch, NodeChange, Observed, Orders, Start
from ledger.engines.slurm.words import (
    ENDED,
    HOLDING,
    NEVER_STARTS,
    WAITING,
    SlurmJob,
    SlurmNode,
    batch_script,
    check_config,
    end_reason,
    exit_code,
    node_changes,
    parse_jobs,
    parse_nodes,
    register_commands,
    sbatch_args,
)
from ledger.store.application import Ledger
from schemas.errors import EngineError, InvalidCommand
from schemas.events import AnyEvent, EndReason, GpuSlot

log = logging.getLogger("gpuledger.slurm")

ENGINE = "slurm"


def ledger_id(ledger: Ledger) -> str:
    """This ledger's name in Slurm comments: 12 hex digits of its first event's id."""
    first = ledger.read(0, 1)
    return name_of(first[0][1] if first else None)


def name_of(first: AnyEvent | None) -> str:
    """Pure: the ledger's name in Slurm comments from its first event (`ledger_id`)."""
    if first is None:
        raise InvalidCommand("the ledger is not initialised", hint="run `gpuledger init`")
    return re.sub(r"[^0-9a-f]", "", first.event_id.lower())[:12] or "0"


def open_executor(
    ledger: Ledger, partition: str | None, log_dir: Path, grace_s: float, actor: str
) -> SlurmExecutor:
    """The executor of `partition`, after checking Slurm lets gpu-ledger own it, with the
    partition's GPU nodes registered in the ledger by `actor` (an admin). One clear error when
    the partition is missing, cannot be owned or has no GPU node; nothing appended then."""
    if not partition:
        raise InvalidCommand(
            "the Slurm executor needs the partition gpu-ledger owns",
            hint="pass --partition P (serve: `partition` in the config file)",
        )
    slurm = SlurmExecutor(partition, ledger_id(ledger), log_dir, grace_s=grace_s)
    slurm.check()
    found = slurm.nodes()
    if not found:
        raise EngineError(
            f"Slurm partition {partition!r} has no nodes with GPUs (Gres=gpu:...)",
            hint="see docs/slurm.md",
        )
    cmds = register_commands(found, ledger.state.nodes, actor)
    if cmds:
        ledger.execute_all(cmds)
    return slurm


@dataclass
class _Run:
    job_id: int
    run: int
    launch: Launch | None
    slurm_id: str | None = None
    """None while the launch waits for its GPUs to be free in Slurm (a victim still stopping)."""
    started: bool = False
    missing_since: float | None = None
    submitted_at: float | None = None
    """When it was handed to Slurm (its start is awaited from then on)."""
    """When a read of Slurm first lacked this run (None while Slurm lists it)."""


@dataclass
class _Stopping:
    since: float
    cancelled: bool = False


class SlurmExecutor:
    """Carries out the ledger's placements as Slurm jobs on one partition, and reports what Slurm
    says happened. Slurm keeps runs across our restarts, so `adopt` takes them over."""

    engine = ENGINE
    relaunch_placed = True

    def __init__(
        self,
        partition: str,
        ledger_id: str,
        log_dir: Path,
        grace_s: float = 30.0,
        timeout_s: float = 20.0,
        env: Mapping[str, str] | None = None,
        vanish_after_s: float = 30.0,
        start_within_s: float = 300.0,
    ) -> None:
        self.partition = partition
        self.ledger_id = ledger_id
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.timeout_s = timeout_s
        self.vanish_after_s = vanish_after_s
        """How long a submitted run may be missing from every read before it counts as gone: a
        controller that has just restarted may answer before it lists every job."""
        self.env = dict(env if env is not None else os.environ)
        self._runs: dict[int, _Run] = {}
        self._stopping: dict[str, _Stopping] = {}
        self._view: dict[str, SlurmJob] = {}
        self._starts: list[Start] = []
        self._exits: list[Exit] = []
        self._foreign: dict[str, frozenset[int]] = {}
        self._foreign_seen: set[str] = set()
        self._accounting: bool | None = None
        self.start_within_s = start_within_s
        """A run Slurm has not started this long after its submission is taken back
        (`launch_failed`, with Slurm's reason)."""
        self.settle_s = 30.0
        """After an outage, how long nothing is decided while Slurm's view catches up (a
        restarted slurmctld lists a run that ended meanwhile as running until its slurmd says
        otherwise: about SlurmdTimeout)."""
        self._settle_until: float | None = None
        self.probe_every_s = 5.0
        """In an outage (slurmctld does not answer), how often the executor asks again."""
        self._probe_at: float | None = None
        """When to ask Slurm again during an outage (None: not in one)."""
        self._pinned: dict[str, tuple[str, ...]] = {}
        """Node -> the GRES type of each of its GPUs, for nodes whose GPUs are pinned."""

    # --- talking to Slurm ---

    def _run(self, args: list[str], stdin: str | None = None) -> str:
        try:
            proc = subprocess.run(
                args,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=self.env,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise EngineError(
                f"{args[0]} failed: {err}", hint="is Slurm up? see docs/slurm.md"
            ) from err
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise EngineError(
                f"{' '.join(args[:2])}: {msg[-1] if msg else f'exit {proc.returncode}'}",
                hint="is Slurm up? see docs/slurm.md",
            )
        return proc.stdout

    def check(self) -> None:
        """Refuse to run on a partition where Slurm would reorder or preempt on its own."""
        text = self._run(["scontrol", "show", "config"])
        with contextlib.suppress(EngineError):  # a missing partition is reported below
            text += "\n" + self._run(["scontrol", "-o", "show", "partition", self.partition])
        problems = check_config(text, self.partition)
        if problems:
            raise EngineError(
                f"Slurm partition {self.partition!r} cannot be run by gpu-ledger: "
                + "; ".join(problems),
                hint="see docs/slurm.md, 'Partition settings'",
            )
        self._accounting = "accounting_storage/none" not in text.replace(" ", "")

    def nodes(self) -> list[SlurmNode]:
        """The partition's GPU nodes; remembers which have pinned GPUs (`words.pinned_types`)."""
        found = parse_nodes(self._run(["scontrol", "-o", "show", "node"]), self.partition)
        self._pinned = {n.name: n.pinned for n in found if n.pinned}
        return found

    def _node_changes(self, nodes: Mapping[str, Node]) -> tuple[list[NodeChange], frozenset[str]]:
        """The ledger's nodes follow Slurm's (`words.node_changes`), and the nodes whose slurmd
        Slurm cannot reach now; ([], every node) while Slurm cannot be read."""
        try:
            found = self.nodes()
        except EngineError as err:
            log.warning("slurm nodes: %s; keeping the nodes as they are", err.line())
            return [], _every(nodes)
        unseen = frozenset(n.name for n in found if n.unresponsive and not n.down)
        return node_changes(found, nodes), unseen

    @property
    def view(self) -> Mapping[str, SlurmJob]:
        """Every Slurm job as last read (`refresh`)."""
        return self._view

    def refresh(self) -> bool:
        """Read every job from Slurm once; False (and nothing changes) when Slurm is away."""
        try:
            text = self._run(["scontrol", "-d", "-o", "show", "job"])
        except EngineError as err:
            log.warning("slurm: %s; keeping the last known state", err.line())
            return False
        self._view = {j.slurm_id: j for j in parse_jobs(text)}
        return True

    def _held(self) -> dict[str, set[int]]:
        """GPUs busy in Slurm now, plus those our submitted-but-not-started runs will take."""
        held: dict[str, set[int]] = {}
        for j in self._view.values():
            if j.holding:
                for node, idx in j.gpus.items():
                    held.setdefault(node, set()).update(idx)
        for r in self._runs.values():
            if r.slurm_id is not None and not r.started and r.launch is not None:
                for sl in r.launch.slots:
                    held.setdefault(sl.node, set()).update(sl.gpu_indices)
        return held

    def _uid(self, user: str) -> str | None:
        """The user to pass as `--uid`: only when we run as root and it is another Unix user."""
        if os.geteuid() != 0 or user == "root":
            return None
        try:
            pwd.getpwnam(user)
        except KeyError:
            return None
        return user

    def _submit(self, r: _Run) -> None:
        assert r.launch is not None
        job = r.launch
        uid = self._uid(job.user)
        out = self.log_dir / f"job-{job.job_id}.log"
        if not self.log_dir.is_dir():
            self.log_dir.mkdir(parents=True)
            if os.geteuid() == 0:
                self.log_dir.chmod(0o1777)  # jobs run as their users open their own logs
        if uid is not None:
            out.touch(mode=0o600)  # the job's output: its owner's alone (security.md, T13)
            out.chmod(0o600)
            os.chown(out, pwd.getpwnam(uid).pw_uid, -1)
        args = ["sbatch", *sbatch_args(job, self.partition, out, uid, self.ledger_id, self._pinned)]
        slurm_id = self._run(args, stdin=batch_script(job)).strip().split(";")[0]
        r.slurm_id = slurm_id
        log.info("job %s run %s is Slurm job %s", job.job_id, job.run, slurm_id)

    def _try_submit(self, now: float) -> None:
        """Submit the launches whose GPUs are free in Slurm, in launch order, so Slurm hands out
        exactly the GPUs the ledger chose (it takes the lowest free indices, as the ledger does)."""
        held = self._held()
        for r in list(self._runs.values()):
            if r.slurm_id is not None or r.launch is None:
                continue
            adopted = self._find(r.job_id, r.run)  # an sbatch that timed out may have landed
            if adopted is not None:
                r.slurm_id = adopted.slurm_id
                continue
            if any(held.get(sl.node, set()) & set(sl.gpu_indices) for sl in r.launch.slots):
                continue
            earlier = self._earlier_alive(r.job_id, r.run)
            if earlier is not None:  # never two launches of a job: the old one stops first
                log.info("job %s run %s waits until Slurm job %s has ended", r.job_id, r.run,
                         earlier.slurm_id)  # fmt: skip
                continue
            try:
                self._submit(r)
                r.submitted_at = now
            except EngineError as err:
                log.warning("job %s: sbatch failed, retrying next cycle: %s", r.job_id, err.line())
                continue
            for sl in r.launch.slots:
                held.setdefault(sl.node, set()).update(sl.gpu_indices)

    def _earlier_alive(self, job_id: int, run: int) -> SlurmJob | None:
        """A Slurm job of an earlier run of `job_id` that has not ended (the launch fence)."""
        for j in self._view.values():
            tag = j.tag(self.ledger_id)
            if tag is not None and tag[0] == job_id and tag[1] < run and not j.ended:
                return j
        return None

    def _find(self, job_id: int, run: int) -> SlurmJob | None:
        for j in self._view.values():
            if j.tag(self.ledger_id) == (job_id, run):
                return j
        return None

    # --- the executor protocol ---

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        """Read every job once (starts, exits, runs to stop after their grace, foreign work),
        submit the launches whose GPUs are now free, then read the nodes: a node that went down
        with a run is seen down by then, so its loss is recorded before the run's exit."""
        changes: list[NodeChange] = []
        if self._probe_at is not None and now < self._probe_at:
            # an outage: ask again only every `probe_every_s`, so a controller that does not
            # answer does not hold the service's thread each cycle (reads and submits wait on it)
            return self._blind(nodes)
        if self.refresh():
            if self._probe_at is not None:  # back: its view may lag (slurmd re-registers)
                self._settle_until = now + self.settle_s
                log.warning("slurm answers again; deciding nothing for %.0f s while it settles",
                            self.settle_s)  # fmt: skip
            self._probe_at = None
            self._read_runs(now)
            self._try_submit(now)
            changes, unseen = self._node_changes(nodes)
            if self._settle_until is not None and now < self._settle_until:
                unseen = _every(nodes)  # what ended meanwhile is recorded; nothing is decided
            else:
                self._settle_until = None
        else:  # slurmctld does not answer: nothing is decided about what it runs (outage)
            self._probe_at = now + self.probe_every_s
            return self._blind(nodes)
        starts, self._starts = self._starts, []
        exits, self._exits = self._exits, []
        return Observed(
            nodes=tuple(changes),
            starts=tuple(starts),
            exits=tuple(exits),
            foreign=self._foreign,
            running=frozenset(self._runs),
            unobserved=unseen,
        )

    def _blind(self, nodes: Mapping[str, Node]) -> Observed:
        """What an outage observes: nothing new, every node unobserved, the runs as last known."""
        return Observed(
            foreign=self._foreign, running=frozenset(self._runs), unobserved=_every(nodes)
        )

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        """`scancel --signal=TERM` the stopped runs (`scancel` after the grace; one that never
        ran at once), then submit the launches, in order, as their GPUs are free in Slurm.
        Starts come from Slurm's word, in a later `observe`."""
        for job_id in orders.stops:
            r = self._runs.pop(job_id, None)
            if r is not None and r.slurm_id is not None:
                self._signal(r.slurm_id, now)
        for job in orders.launches:
            self._runs[job.job_id] = _Run(job.job_id, job.run, job)
        if orders.launches:
            self._try_submit(now)
        return ()

    def _signal(self, slurm_id: str, now: float) -> None:
        job = self._view.get(slurm_id)
        stopping = self._stopping.setdefault(slurm_id, _Stopping(now))
        try:
            if job is not None and job.state in WAITING:
                self._run(["scancel", slurm_id])  # never ran: nothing to save
                stopping.cancelled = True
            else:
                self._run(["scancel", "--signal=TERM", "--full", slurm_id])
        except EngineError as err:
            log.warning("slurm job %s: %s (retrying)", slurm_id, err.line())

    def _read_runs(self, now: float) -> None:
        # 1. our runs: starts, exits, vanished
        for job_id, r in list(self._runs.items()):
            if r.slurm_id is None:
                continue
            j = self._view.get(r.slurm_id)
            if j is None:
                if r.missing_since is None:
                    r.missing_since = now
                if now - r.missing_since >= self.vanish_after_s:
                    self._vanished(r, now)
                continue
            r.missing_since = None
            if j.state in WAITING and not r.started:
                why = self._never_starts(r, j, now)
                if why:
                    self._take_back(r, why, now)
                    continue
            if j.started and not r.started and (j.holding or j.ended):
                r.started = True
                gpus = tuple(GpuSlot(node=n, gpu_indices=i) for n, i in sorted(j.gpus.items()) if i)
                # charged from Slurm's real start (the ledger keeps it inside the placement)
                self._starts.append(Start(job_id, r.slurm_id, r.run, gpus, started_at=j.start_time))
                self._check_gpus(r, j)
            if j.ended:
                del self._runs[job_id]
                at = now if j.end_time is None else min(now, j.end_time)
                self._exits.append(
                    Exit(job_id, j.exit_code, at, end_reason(j.state), r.slurm_id, j.state)
                )
        # 2. runs being stopped: the grace, then scancel
        for slurm_id, st in list(self._stopping.items()):
            j = self._view.get(slurm_id)
            if j is None or j.ended:
                del self._stopping[slurm_id]
            elif not st.cancelled and now - st.since >= self.grace_s:
                try:
                    self._run(["scancel", slurm_id])
                    st.cancelled = True
                except EngineError as err:
                    log.warning("slurm job %s: %s (retrying)", slurm_id, err.line())
        # 3. foreign jobs on any partition: their GPUs on the ledger's nodes are busy, they are
        #    never touched
        foreign: dict[str, set[int]] = {}
        ours = {r.slurm_id for r in self._runs.values()} | set(self._stopping)
        for j in self._view.values():
            if j.slurm_id in ours:
                continue
            if j.tag(self.ledger_id) is not None:
                if (
                    j.partition == self.partition
                    and not j.ended
                    and j.slurm_id not in self._stopping
                ):
                    log.warning("slurm job %s is a run the ledger no longer runs: stopping it", j)
                    self._signal(j.slurm_id, now)
                continue
            if j.holding:
                for node, idx in j.gpus.items():
                    foreign.setdefault(node, set()).update(idx)
                if j.slurm_id not in self._foreign_seen:
                    self._foreign_seen.add(j.slurm_id)
                    log.info("foreign Slurm job %s holds GPUs %s", j.slurm_id, dict(j.gpus))
        self._foreign = {n: frozenset(i) for n, i in foreign.items()}

    def _never_starts(self, r: _Run, j: SlurmJob, now: float) -> str:
        """Why Slurm will not start this run (its reason says it never will, or it has waited
        past `start_within_s`); "" while it may still start."""
        if j.reason in NEVER_STARTS:
            return f"Slurm will not start it: {j.reason}"
        since = r.submitted_at
        if since is None:
            r.submitted_at = since = now  # adopted: its wait counts from now
        if now - since >= self.start_within_s:
            return (
                f"Slurm did not start it within {self.start_within_s:.0f} s "
                f"(Slurm's reason: {j.reason or 'none'})"
            )
        return ""

    def _take_back(self, r: _Run, why: str, now: float) -> None:
        """Cancel a run Slurm will not start; its job ends `launch_failed` with why."""
        assert r.slurm_id is not None
        log.warning("job %s run %s (Slurm job %s): %s; taking it back", r.job_id, r.run,
                    r.slurm_id, why)  # fmt: skip
        self._signal(r.slurm_id, now)  # it never ran: scancel at once
        del self._runs[r.job_id]
        self._exits.append(Exit(r.job_id, -1, now, "launch_failed", r.slurm_id, "PENDING", why))

    def _vanished(self, r: _Run, now: float) -> None:
        """A run Slurm no longer lists (past MinJobAge, or the controller lost its state)."""
        assert r.slurm_id is not None
        state, code = "", -1
        if self._accounting:
            try:
                rows = self._run(
                    ["sacct", "-n", "-P", "-X", "-j", r.slurm_id, "-o", "State,ExitCode"]
                )
                first = rows.strip().splitlines()[0].split("|") if rows.strip() else []
                if len(first) == 2:
                    state, code = first[0].split()[0], exit_code(first[1])
            except EngineError as err:
                log.warning("sacct: %s", err.line())
        if state in WAITING or state in HOLDING:
            return
        del self._runs[r.job_id]
        reason: EndReason = end_reason(state) if state in ENDED else "lost"
        self._exits.append(Exit(r.job_id, code, now, reason, r.slurm_id, state or "UNKNOWN"))

    def _check_gpus(self, r: _Run, j: SlurmJob) -> None:
        if r.launch is None:
            return
        want = {sl.node: tuple(sl.gpu_indices) for sl in r.launch.slots}
        got = {n: tuple(i) for n, i in j.gpus.items() if i}
        if j.holding and got and got != want:
            log.warning("job %s: Slurm gave GPUs %s, the ledger chose %s", r.job_id, got, want)

    def heard_from(self) -> Mapping[str, float]:
        return {}

    def next_event_at(self) -> float | None:
        return None

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        if not self.refresh():
            raise EngineError(
                "Slurm cannot be read, so the ledger cannot be reconciled with it",
                hint="start slurmctld (scripts/slurm/slurm up) and retry",
            )
        for j in sorted(self._view.values(), key=lambda j: int(j.slurm_id.split("_")[0])):
            tag = j.tag(self.ledger_id)
            if tag is None or j.partition != self.partition:
                continue
            job_id, run = tag
            if runs.get(job_id) == run:
                self._runs[job_id] = _Run(job_id, run, None, j.slurm_id)
                log.info("adopted Slurm job %s as job %s run %s", j.slurm_id, job_id, run)
        adopted = set(self._runs)
        self._read_runs(now)  # runs that ended while we were away: exits at the next `observe`
        return adopted

    def shutdown(self, now: float) -> list[Exit]:
        """Slurm runs on without us; the next start adopts the runs."""
        return []


def _every(nodes: Mapping[str, Node]) -> frozenset[str]:
    """Pure: the ledger's nodes in service (all of them are the partition's)."""
    return frozenset(n for n, x in nodes.items() if x.state != "removed")
