"""The Slurm executor: gpu-ledger decides, a Slurm partition runs the processes. An edge.

It runs `scontrol`, `sbatch`, `scancel` and `sacct` and reads their answers with
`ledger.engines.slurm.words` (pure). What the ledger owns and what Slurm owns is in docs/slurm.md.
Each cycle's `observe` reads every job once, then the partition's nodes: a run that ended with its
node (NODE_FAIL) comes with the node's loss, which the ledger records first."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import replace
from pathlib import Path

from ledger.core.state import Node, StoppedRun
from ledger.cycle.executor import Exit, Launch, NodeChange, Observed, Orders, Reaping, Start
from ledger.engines.accounts import RunAs, own_log, own_umask
from ledger.engines.job_paths import Refused
from ledger.engines.slurm import tracked
from ledger.engines.slurm.cluster import (
    OtherCluster,
    Watch,
    read_text,
    scancel_args,
    term_args,
)
from ledger.engines.slurm.components import joined
from ledger.engines.slurm.ends import (
    Ending,
    answering,
    ends_after_term_s,
    kill_wait,
    own_end_after_s,
)
from ledger.engines.slurm.foreign import others
from ledger.engines.slurm.launching import (
    LAUNCHED,
    TAKEN_BACK,
    MarksSeen,
    WrongGpus,
    mark_stopping,
    mark_taken_back,
    mark_time,
    marked,
    never_ran,
    node_fail_end,
    reaping_said,
    run_script,
)
from ledger.engines.slurm.leaked_runs import holding, unplace_leaked
from ledger.engines.slurm.leaks import Leaks, held_with, unsure
from ledger.engines.slurm.outage import Probe
from ledger.engines.slurm.outputs import claim_outputs, files_umask, sbatch_env, sbatch_user
from ledger.engines.slurm.paused import paused_why, unplace_paused
from ledger.engines.slurm.refusals import (
    het_refusal,
    sbatch_refusal,
    scheduler_note,
    scheduler_type,
)
from ledger.engines.slurm.restarts import Restarts
from ledger.engines.slurm.run_loop import read_own_runs
from ledger.engines.slurm.stop_loop import carry_stops, kill, resume_stops
from ledger.engines.slurm.stops import (
    GONE_ALREADY,
    Quarantine,
    Stopping,
    Tag,
    completing,
    earlier_alive,
    grace_of,
    in_service,
    kill_due,
    no_grace,
    note_unanswered,
    own_ends_first,
    stopping_gpus,
    tagged,
    unplaceable,
)
from ledger.engines.slurm.strays import Strays
from ledger.engines.slurm.takeover import InFlight, adoptable, take_up_copies
from ledger.engines.slurm.tracked import Run, note_stop, past_limit
from ledger.engines.slurm.words import (
    UNTRACKED_OK,
    WAITING,
    SbatchUser,
    SlurmJob,
    SlurmNode,
    check_config,
    epilog_note,
    held_gpus,
    node_changes,
    parse_jobs,
    parse_nodes,
    partition_max_time,
    partition_state,
    sbatch_args,
)
from schemas.errors import EngineError

log = logging.getLogger("gpuledger.slurm")

ENGINE = "slurm"
_Changes = tuple[list[NodeChange], frozenset[str]]


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
        run_as: RunAs = "submitter",
        may_act: Callable[[], bool] | None = None,
    ) -> None:
        self.partition = partition
        self.may_act = may_act if may_act is not None else lambda: True
        """The leader's lease by this server's own clock (servers sharing a PostgreSQL store,
        docs/ha.md): checked before every sbatch and scancel, so a deposed leader's executor
        never launches or stops a run, even one it decided on while it still led."""
        self.ledger_id = ledger_id
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.timeout_s = timeout_s
        self.vanish_after_s = vanish_after_s
        """How long a submitted run may be missing from every read before it counts as gone: a
        controller that has just restarted may answer before it lists every job."""
        self.env = dict(env if env is not None else os.environ)
        self.run_as: RunAs = run_as  # who jobs run as: never root on another's behalf
        self._runs: dict[int, Run] = {}
        self._stopping: dict[str, Stopping] = {}
        self._view: dict[str, SlurmJob] = {}
        self._parsed: dict[str, SlurmJob] = {}  # the last read's lines (`parse_jobs`)
        self._starts: list[Start] = []
        self._exits: list[Exit] = []
        self._unplaced: list[NodeChange] = []  # runs read taken back (`leaked_runs.doubted`)
        self._completing: dict[str, float] = {}
        """Our Slurm job -> the last read showing it COMPLETING (`processes_end`)."""
        self._stopped: list[Exit] = []
        """Ends of runs the ledger stopped (cancel, requeue, preemption): `JobRunEnded`."""
        self._completed: set[int] = set()
        """Jobs a stopped run of which ended by itself (`ended_by_itself`): the ledger may end
        them by that exit (atk38-24 F3, atk53-23 F3), so their next run is not submitted in the
        `observe` that reports it (the `carry_out` after it stops the run if so)."""
        self.job_grace: Callable[[int], float | None] = no_grace
        """A job's own grace by id (the ledger's) where its run's comment says none."""
        self.job_limit: Callable[[int], float | None] = no_grace
        self.stopped_runs: Callable[[], Mapping[Tag, StoppedRun]] = dict
        """The runs the ledger stopped whose end is not recorded yet (`State.stopped_runs`):
        each read carries them to their end, after a restart too (`resumed_stops`)."""
        self.lost_nodes: Callable[[], Set[str]] = frozenset
        """The nodes the ledger counts lost: nothing is submitted onto them (`unplaceable`)."""
        self._down: frozenset[str] = frozenset()  # nodes Slurm showed DOWN in the last read
        self._unheard: frozenset[str] = frozenset()  # ... DOWN or not responding (F8)
        self._slurmd_started: dict[str, float] = {}  # node -> SlurmdStartTime (atk44s F2)
        self._reported: set[str] = set()  # stopped runs whose end was reported, not yet recorded
        self.strays = Strays(log_dir)  # stops of runs never recorded started, on disk (F1)
        """A job's time limit by job id (`open_executor` reads the ledger's), for runs adopted
        after a restart, whose exact limit Slurm does not keep (it rounds up to minutes)."""
        self._foreign: dict[str, frozenset[int]] = {}
        self._gres_used: dict[str, tuple[int, ...]] = {}
        self._leaks = Leaks()
        self._foreign_seen: set[str] = set()
        self._accounting: bool | None = None
        self.start_within_s = start_within_s
        """A run Slurm has not started this long after its submission is taken back, and one
        whose `sbatch` has failed this long (`refusals.sbatch_refusal`)."""
        self.scheduler = ""
        """Slurm's SchedulerType (`check`): under sched/builtin no heterogeneous job is
        submitted (`refusals.het_refusal`; "": unknown, submitted)."""
        self.settle_s = 30.0
        """After an outage, how long nothing is decided while Slurm's view catches up (a
        restarted slurmctld lists a run that ended meanwhile as running until its slurmd says
        otherwise: about SlurmdTimeout)."""
        self._settle_until: float | None = None
        self._loss_held_since: float | None = None
        """When a node's loss began to wait for its runs' own ends (`_own_ends_first`)."""
        self._probe = Probe(lambda: self._run(["scontrol", "-o", "show", "partition", partition]))
        """Asks Slurm during an outage, off the service's thread (`outage`)."""
        self.cluster = Watch(lambda: self._run(["scontrol", "show", "config"]))  # which answers
        self._answered_at: float | None = None  # the last read Slurm answered
        self._away: tuple[float, float] | None = None
        """The last outage: (the last read answered before it, the first answered after it)."""
        self.max_time_s: float | None = None
        """The partition's MaxTime (None: unlimited): Slurm never starts a job asking for more,
        so the dispatcher neither places it nor makes room for it (`Observed.longest_s`)."""
        self._max_time_at: float | None = None
        self.partition_state = "UP"
        """The partition's `State` as last read (`_read_partition`): while it is not UP nothing
        is submitted and the runs not started go back to the queue (`paused`, atk59b N4)."""
        self._pinned: dict[str, tuple[str, ...]] = {}
        """Node -> the GRES type of each of its GPUs, for nodes whose GPUs are pinned."""
        self.kill_wait_s = 30.0
        """Slurm's KillWait (`check` reads it): how long after SIGTERM Slurm kills a job."""
        self.slurmd_timeout_s = 300.0  # Slurm's (`check`): a dead slurmd is flagged by then
        self.fence_s = 300.0
        """How long at most the runs of a node Slurm gives up stay in doubt (`ends`)."""
        self._answering: dict[str, float] = {}  # node -> since when its slurmd answers
        self._quarantine = Quarantine()  # GPUs of runs ended by their own record on NODE_FAIL
        self._seen = MarksSeen()  # NODE_FAIL runs' signal notes and heartbeats, as first read
        self._wrong_gpus = WrongGpus()  # jobs' runs ended `wrong-gpus` in a row
        self._restarts = Restarts(log_dir, lambda i, run: self._run(scancel_args(i, run)), lambda: self.may_act())  # fmt: skip  # noqa: E501
        """Runs Slurm launched again, ids it gave twice (slurmctld lost its state: atk43s)."""
        self.in_flight = InFlight()  # placed runs the last holder may have submitted (F1)
        self.abandoned: Set[Tag] = frozenset()  # `--abandon-runs`: never adopted (atk45ha L1)
        self.launch_confirm_s = 10.0
        """A run Slurm shows RUNNING is recorded started once its batch script marked its launch
        (`_launched`), or after this long running unmarked (a node that does not share the
        service's directory): Slurm fails a launch it cannot make within a second or two."""

    @property
    def probe_every_s(self) -> float:  # in an outage (slurmctld does not answer): how often
        return self._probe.every_s

    @probe_every_s.setter
    def probe_every_s(self, seconds: float) -> None:
        self._probe.every_s = seconds

    # --- talking to Slurm ---

    def _run(
        self, args: list[str], stdin: str | None = None, env: Mapping[str, str] | None = None
    ) -> str:
        try:
            proc = subprocess.run(
                args,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=self.env if env is None else env,
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
        """Refuse to run on a partition where Slurm would reorder or preempt on its own (one
        an admin paused is read as paused, `partition_state`: no refusal, atk60-slurm F1)."""
        text = self._run(["scontrol", "show", "config"])
        if why := self.cluster.learn(text):  # another cluster in this one's place (F5)
            raise OtherCluster(why, hint="start this server's cluster's slurmctld (docs/ha.md)")
        with contextlib.suppress(EngineError):  # a missing partition is reported below
            text += "\n" + self._run(["scontrol", "-o", "show", "partition", self.partition])
        self.max_time_s = partition_max_time(text, self.partition)
        self.partition_state = partition_state(text, self.partition)  # paused: no refusal (F1)
        if why := paused_why(self.partition, self.partition_state):
            log.warning("slurm: %s; serving, placing nothing there until then", why)
        untracked_ok = self.env.get(UNTRACKED_OK, "") == "1"
        problems = check_config(text, self.partition, untracked_ok)
        if problems:
            raise EngineError(
                f"Slurm partition {self.partition!r} cannot be run by gpu-ledger: "
                + "; ".join(problems),
                hint="see docs/slurm.md, 'Partition settings'",
            )
        if note := epilog_note(text, read_text):  # a file only the nodes have: no word
            log.warning("slurm: %s", note)
        self._accounting = "accounting_storage/none" not in text.replace(" ", "")
        self.scheduler = scheduler_type(text)
        self.kill_wait_s = kill_wait(text, self.kill_wait_s)
        self.slurmd_timeout_s = kill_wait(text, self.slurmd_timeout_s, "SlurmdTimeout")

    def nodes(self) -> list[SlurmNode]:
        """The partition's GPU nodes; remembers which have pinned GPUs (`words.pinned_types`)."""
        found = parse_nodes(self._run(["scontrol", "-d", "-o", "show", "node"]), self.partition)
        self._pinned = {n.name: n.pinned for n in found if n.pinned}
        self._down = frozenset(n.name for n in found if n.down)
        self._unheard = self._down | {n.name for n in found if n.unresponsive}
        self._gres_used = {n.name: n.gres_used for n in found if n.gres_used}
        self._slurmd_started = {n.name: n.slurmd_start for n in found if n.slurmd_start}
        return found

    def _hold_leaked(self) -> None:
        """Hold GPUs Slurm counts allocated that no job holds, in two reads in a row (`leaks`)."""
        ending = unsure(self._view.values(), self._pinned)  # GresUsed counts what -d does not
        if self._leaks.read(self._gres_used, self._held(ours=True), ending):
            log.warning("Slurm counts GPUs %s allocated but no job holds them (GresUsed): none "
                        "is placed there until Slurm frees it", dict(self._leaks.held))  # fmt: skip
        self._foreign = held_with(self._foreign, self._leaks.held)

    def _node_changes(self, nodes: Mapping[str, Node], now: float) -> _Changes:
        """The ledger's nodes follow Slurm's (`words.node_changes`; lost with a fence: `ends`),
        and the nodes whose slurmd Slurm cannot reach now; ([], every node) while unread."""
        try:
            found = self.nodes()
        except EngineError as err:
            log.warning("slurm nodes: %s; keeping the nodes as they are", err.line())
            return [], in_service(nodes)
        self._answering = answering(((n.name, n.unresponsive) for n in found), self._answering, now)
        self._quarantine.refresh(self._answering, self.kill_wait_s, now, self._beat)
        unseen = frozenset(n.name for n in found if n.unresponsive and not n.down)
        return node_changes(found, nodes, self.fence_s), unseen

    @property
    def view(self) -> Mapping[str, SlurmJob]:  # every Slurm job as last read (`refresh`)
        return self._view

    def refresh(self) -> bool:
        """Read every job from Slurm once; False (and nothing changes) when Slurm is away."""
        try:
            text = self._run(["scontrol", "-d", "-o", "show", "job"])
        except EngineError as err:
            log.warning("slurm: %s; keeping the last known state", err.line())
            return False
        self._view = {j.slurm_id: j for j in joined(parse_jobs(text, self._parsed))}
        return True

    def _held(self, ours: bool = False) -> dict[str, set[int]]:
        """GPUs busy in Slurm now, plus those our submitted-but-not-started runs will take; with
        `ours`, all our runs' and stops' (a recovered slurmctld may list a job without its GPUs)."""
        busy: list[Mapping[str, Iterable[int]]] = [held_gpus(j, self._pinned) for j in self._view.values()]  # fmt: skip  # noqa: E501
        busy += [{sl.node: sl.gpu_indices for sl in r.launch.slots} for r in self._runs.values() if r.slurm_id is not None and not r.started and r.launch is not None and not ours]  # fmt: skip  # noqa: E501
        busy += [holding(self._runs.values(), self._view)] if ours else []  # never pending (F4)
        busy += [stopping_gpus(self._stopping, self._view, self._pinned), self._quarantine.held]  # fmt: skip  # noqa: E501
        busy += list(self._restarts.held.values())  # a first launch Slurm launched again (F11)
        held: dict[str, set[int]] = {}
        for gpus in busy:
            for node, idx in gpus.items():
                held.setdefault(node, set()).update(idx)
        return held

    def _checkpoint_file(self, job_id: int, run: int, who: SbatchUser | None = None) -> Path:
        return tracked.checkpoint_file(self.log_dir, job_id, run, who)

    def _launched(self, r: Run, now: float) -> bool:
        """Whether a run Slurm shows RUNNING (not CONFIGURING) has really started: its batch
        script marked its launch (`<checkpoint dir>/launched`), or it has run `launch_confirm_s`
        unmarked. Its recorded start is `real_start` either way; only when it is recorded waits."""
        if r.running_seen is None:
            r.running_seen = now
        run_dir = self._checkpoint_file(r.job_id, r.run).parent
        if (seen := mark_time(run_dir, LAUNCHED, now)) is not None:
            r.launch_seen = seen if r.launch_seen is None else r.launch_seen  # kept (atk43s F2)
            self._restarts.marks_seen(r)
            return True  # the marks are the job user's: running this long, it runs (atk23d F6)
        return now - r.running_seen >= self._restarts.confirm_s(r, run_dir, self.launch_confirm_s)

    def _never_ran(self, r: Run, j: SlurmJob) -> str:  # why its command never ran, or ""
        run_dir, seen = self._checkpoint_file(r.job_id, r.run).parent, r.launch_seen is not None
        confirm_s = self._restarts.confirm_s(r, run_dir, self.launch_confirm_s, j)
        why = never_ran(j, r.launch, r.logs, run_dir, r.started, confirm_s, seen)
        return self._restarts.never_ran(r, j, run_dir, why, seen)  # slurmd refused it (F5)

    def _beat(self, slurm_id: str, now: float) -> float | None:  # its last (`MarksSeen.beat`)
        tag = j.tag(self.ledger_id) if (j := self._view.get(slurm_id)) is not None else None
        return None if tag is None else self._seen.beat(self._checkpoint_file(*tag).parent, slurm_id, now)  # fmt: skip  # noqa: E501

    def _submit(self, r: Run) -> None:
        assert r.launch is not None
        job = r.launch
        if isinstance(who := sbatch_user(job.user, self.run_as), str):
            raise Refused(who)
        if why := het_refusal(job, self._pinned, self.scheduler):  # sbatch would refuse it
            raise Refused(why)  # for good, every cycle (atk59 F1)
        if not (out := job.stdout):  # `<log_dir>/job-<id>.log`, the user's (`own_log`)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = str(own_log(self.log_dir, f"job-{job.job_id}.log", who.uid, who.gid))
        r.logs = tuple(dict.fromkeys(p for p in (out, job.stderr) if p))
        tracked.note_logs(self.log_dir, job.job_id, job.run, r.logs)  # for a restart's adopt
        mask = files_umask(job.umask, bool(job.stdout))  # slurmstepd opens /dev/null alone:
        claimed = claim_outputs(r.logs, who, self.timeout_s, mask, job.workdir)  # the script,
        if isinstance(claimed, str):  # the files claimed (`outputs`)
            raise Refused(claimed)
        args = ["sbatch", *sbatch_args(job, self.partition, os.devnull, who, self.ledger_id,
                                       self._pinned, claimed.error_file, self._grace_of(r),
                                       self.max_time_s)]  # fmt: skip
        checkpoint = self._checkpoint_file(job.job_id, job.run, who)
        umask = own_umask() if job.umask is None else job.umask  # the submitter's, as sbatch's
        script = run_script(job, who, checkpoint, umask, claimed.files(r.logs), mask,
                            claimed.workdir, ends_after_term_s(self._grace_of(r), self.kill_wait_s),
                            self._pinned, own_end_after_s(self.kill_wait_s),
                            self.cluster.expected)  # fmt: skip
        said = self._run(args, stdin=script, env=sbatch_env(self.env, mask))
        r.slurm_id = said.strip().split(";")[0]
        log.info("job %s run %s is Slurm job %s", job.job_id, job.run, r.slurm_id)
        if self._restarts.submitted(job.job_id, job.run, r.slurm_id, job):  # what it named is gone
            self._completing.pop(r.slurm_id, None)
            self._seen.forget(r.slurm_id)

    def _try_submit(self, now: float) -> None:
        """Submit the launches whose GPUs are free in Slurm, in launch order, so Slurm hands out
        exactly the GPUs the ledger chose (it takes the lowest free indices, as the ledger does)."""
        if not self.may_act():
            return  # a deposed leader launches nothing; the new leader launches what is placed
        held = self._held()
        unusable = self._down | self.lost_nodes()
        for r in list(self._runs.values()):
            if r.slurm_id is not None or r.launch is None or r.job_id in self._completed:
                continue
            if bad := unplaceable(r.launch, unusable):  # never onto a lost node (atk39-24 F3)
                log.info("job %s run %s waits: node %s is down", r.job_id, r.run, bad)
                continue
            adopted = tagged(self._view, self.ledger_id, r.job_id, r.run)  # a timed-out sbatch
            if adopted is not None:  # or one of the last holder's, landed late (atk45ha F1)
                r.slurm_id = adopted.slurm_id
                log.info("adopted Slurm job %s as job %s run %s", r.slurm_id, r.job_id, r.run)
                continue
            if self.in_flight.waits(r, now):  # the last holder's sbatch may still land (F1)
                continue
            if any(held.get(sl.node, set()) & set(sl.gpu_indices) for sl in r.launch.slots):
                continue
            earlier = earlier_alive(self._view, self.ledger_id, r.job_id, r.run, self._stopping)
            if earlier is not None:  # never two launches of a job: the old one stops first
                log.info("job %s run %s waits until Slurm job %s has ended", r.job_id, r.run,
                         earlier.slurm_id)  # fmt: skip
                continue
            if not self.cluster.confirm(now):  # never onto another cluster (atk44ha F1)
                return
            try:
                self._submit(r)  # and where it landed (atk44ha F1): None, on another cluster
                r.submitted_at, r.slurm_id = now, self.cluster.landed(r.slurm_id or "", (r.job_id, r.run), self.ledger_id, self._run, now)  # fmt: skip  # noqa: E501
            except Refused as why:  # never run as an account the rule refuses
                log.warning("job %s is not started: %s", r.job_id, why)
                del self._runs[r.job_id]
                self._exits.append(Exit(r.job_id, -1, now, "launch_failed", "", "", str(why)))
                continue
            except EngineError as err:
                self._refused(r, err, now)
                continue
            for sl in r.launch.slots:
                held.setdefault(sl.node, set()).update(sl.gpu_indices)

    def _refused(self, r: Run, err: EngineError, now: float) -> None:
        """An `sbatch` of `r` failed: retried at the next cycle, or, Slurm's refusal (or one that
        has repeated `start_within_s`), the run is taken back as one Slurm will not start
        (`refusals.sbatch_refusal`): its `taken-back` mark (a late landing of a timed-out
        sbatch ends before anything of the job's), its job `launch_failed` with Slurm's words.
        Before, it was retried at every cycle for good, its GPUs held (atk59 F1)."""
        if r.refused_since is None:
            r.refused_since = now
        why = sbatch_refusal(err.message, r.refused_since, now, self.start_within_s)
        if not why or r.slurm_id is not None:  # (a read after a landed sbatch: it runs)
            log.warning("job %s: sbatch failed, retrying next cycle: %s", r.job_id, err.line())
            return
        log.warning("job %s run %s: %s; taking it back", r.job_id, r.run, why)
        run_dir = self._checkpoint_file(r.job_id, r.run).parent  # made by `_submit`
        if self.may_act() and run_dir.is_dir() and not mark_taken_back(run_dir):
            log.warning("job %s run %s: cannot mark %s taken back", r.job_id, r.run, run_dir)
        del self._runs[r.job_id]
        self._exits.append(Exit(r.job_id, -1, now, "launch_failed", "", "", why))

    # --- the executor protocol ---

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        """Read every job once (starts, exits, runs to stop after their grace, foreign work),
        submit the launches whose GPUs are now free, then read the nodes: a node that went down
        with a run is seen down by then, so its loss is recorded before the run's exit."""
        changes: list[NodeChange] = []
        if self._probe.away and not self._probe.over(now):
            # an outage: a probe asks again every `probe_every_s` on a thread of its own, so a
            # controller that does not answer never holds the service's thread (reads, submits)
            return self._blind(nodes)
        view, answered = self._view, self.refresh()
        if answered and not self.cluster.same(now, self._probe.away):
            self._view = view  # another cluster answers: nothing of it is read (F5)
            self._probe.begin(now)
            return self._blind(nodes)
        if answered:
            if self._probe.away:  # back: its view may lag (slurmd re-registers)
                self._away = (self._answered_at or now, now)
                self._settle_until = now + self.settle_s
                log.warning("slurm answers again; deciding nothing for %.0f s while it settles",
                            self.settle_s)  # fmt: skip
            self._probe.end()
            self._completed.clear()  # recorded since: a job still placed runs (F3)
            self._read_runs(now)
            self._answered_at = now
            self._read_partition(now)
            paused = paused_why(self.partition, self.partition_state)
            if not paused:
                self._try_submit(now)
            changes, unseen = self._node_changes(nodes, now)
            changes, self._unplaced = changes + self._unplaced, []
            self._hold_leaked()
            changes += unplace_leaked(self, now)  # runs waiting on a leaked GPU (atk45s F4)
            if paused:  # an admin's pause: its runs not started wait in the queue (N4)
                changes += unplace_paused(self, paused, now)
                unseen |= in_service(nodes)
            if self._settle_until is not None and now < self._settle_until:
                unseen = in_service(nodes)  # what ended meanwhile is recorded; nothing is decided
            else:
                self._settle_until = None
        else:  # slurmctld does not answer: nothing is decided about what it runs (outage)
            self._probe.begin(now)
            return self._blind(nodes)
        starts, self._starts = self._starts, []
        checkpoints = tracked.touched(self._runs.values(), self._checkpoint_file)  # since last read
        exits, self._exits = self._exits, []
        stopped, self._stopped = self._stopped, []
        changes, exits, unseen = self._own_ends_first(changes, exits, unseen, now)
        return replace(  # the runs as last known (`_blind`), and what this read saw
            self._blind(nodes),
            reaping=self._reaping(now),
            stopped=tuple(stopped),
            nodes=tuple(changes),
            starts=tuple(starts),
            checkpoints=tuple(checkpoints),
            exits=tuple(exits),
            unobserved=unseen,
            # it answers (settling, at most): no outage to name, but a paused partition
            unobserved_why=paused_why(self.partition, self.partition_state) if unseen else "",
        )

    def _reaping(self, now: float) -> tuple[Reaping, ...]:
        """Started runs not stopped at their limit whose batch script has begun to end what
        their command left (its `reaping` mark, `script_tree.REAPING_MARK`): Slurm lists the
        job RUNNING meanwhile, and the ledger shows it `stopping` with that SIGKILL, as on the
        node agents (`ReportLeaderEnded`). Once per run; stopped runs' are the ledger's stop."""
        out = []
        for r in self._runs.values():
            if not r.started or r.limited or r.reaping_told or r.started_at is None:
                continue
            run_dir = self._checkpoint_file(r.job_id, r.run).parent
            said = reaping_said(run_dir, r.started_at, now, self._grace_of(r))
            if said is not None:
                r.reaping_told = True
                out.append(replace(said, job_id=r.job_id, run=r.run))
        return tuple(out)

    def _own_ends_first(
        self, changes: list[NodeChange], exits: list[Exit], unseen: frozenset[str], now: float
    ) -> tuple[list[NodeChange], list[Exit], frozenset[str]]:
        """A run that ended by itself on a node Slurm has just given up is recorded before the
        node's loss (`stops.own_ends_first`); the exits held back come with the next read."""
        completing = any(j.state == "COMPLETING" for r in self._runs.values()
                         if (j := self._view.get(r.slurm_id or "")) is not None)  # fmt: skip
        was = self._loss_held_since
        held = own_ends_first(changes, exits, completing, was, now, self.settle_s)
        changes, exits, later, lost, self._loss_held_since = held
        if lost and was is None:
            log.info("node %s is down in Slurm: its runs' own ends first", ", ".join(sorted(lost)))
        self._exits = later + self._exits
        return changes, exits, unseen | lost

    def _read_partition(self, now: float) -> None:
        """The partition's MaxTime and State, read again every `probe_every_s` (an admin may
        change them); kept as they were when slurmctld does not answer."""
        if self._max_time_at is not None and now < self._max_time_at:
            return
        self._max_time_at = now + self.probe_every_s
        try:
            text = self._run(["scontrol", "-o", "show", "partition", self.partition])
        except EngineError as err:
            log.warning("slurm partition: %s; keeping its MaxTime and State", err.line())
            return
        longest = partition_max_time(text, self.partition)
        if longest != self.max_time_s:  # a job asking for more waits for it (`queue`, `explain`)
            log.warning("slurm partition %s: MaxTime=%s (was %s)", self.partition,
                        _minutes(longest), _minutes(self.max_time_s))  # fmt: skip
        self.max_time_s = longest
        state = partition_state(text, self.partition)
        if state != self.partition_state:
            log.warning("slurm partition %s: State=%s (was %s)", self.partition, state,
                        self.partition_state)  # fmt: skip
        self.partition_state = state

    def _blind(self, nodes: Mapping[str, Node]) -> Observed:
        """What an outage observes: nothing new, every node unobserved, the runs as last known."""
        return Observed(
            foreign=self._foreign,
            stopping=stopping_gpus(self._stopping, self._view, self._pinned),
            running=frozenset(self._runs),
            unobserved=in_service(nodes),
            unobserved_why=self.cluster.away or "slurmctld does not answer",
            engine_note=scheduler_note(self.scheduler),
            longest_s=self.max_time_s,
        )

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        """SIGTERM the stopped runs (`term_args`; SIGKILL after the grace; one that never
        ran at once), then submit the launches, in order, as their GPUs are free in Slurm.
        Starts come from Slurm's word, in a later `observe`."""
        if not self.may_act():
            log.warning("not carrying out orders of epoch %d: the lease ran out", orders.epoch)
            return ()
        acts = bool(orders.stops or orders.launches)  # the cluster confirmed first (atk44ha F1)
        if self.cluster.away or (acts and not self.cluster.confirm(now) and self.cluster.away):
            return ()  # nothing stopped or launched on another cluster (asked again)
        for job_id in orders.stops:
            r = self._runs.get(job_id)
            if r is not None and r.slurm_id is not None:
                self._signal(r.slurm_id, now, self._grace_of(r), (r.job_id, r.run))
            self._runs.pop(job_id, None)
        for job in orders.launches:
            old = self._runs.get(job.job_id)
            if old is not None and old.slurm_id is not None and old.run != job.run:
                # requeued and placed again in one cycle: its old run stops as any stop does
                self._signal(old.slurm_id, now, self._grace_of(old), (old.job_id, old.run))
            self._runs[job.job_id] = Run(job.job_id, job.run, job)
        if orders.launches and not paused_why(self.partition, self.partition_state):
            self._try_submit(now)  # (paused: taken back to the queue at the next read)
        return ()

    def _grace_of(self, r: Run) -> float:
        """The run's job's own grace (`submit --grace`), else the service's (`grace_of`)."""
        job, seen = r.job_id, self._view.get(r.slurm_id or "")
        return grace_of(r.launch, seen, lambda: self.job_grace(job), self.grace_s)

    def _signal(self, slurm_id: str, now: float, grace_s: float | None = None,
                run: Tag | None = None, since: float | None = None,
                limit: bool = False) -> None:  # fmt: skip
        """SIGTERM to the job's steps, then its batch shell (`cluster.term_args`; a run that
        never ran: `scancel`); SIGKILL once
        `grace_s` has passed since the stop (`since`: the ledger's recorded stop or the limit,
        else now), at once when it has already (`kill_due`), but a stop at its time limit
        (`limit`) always gets its SIGTERM first (its SIGKILL later: `carry_stops`). The end of
        a stopped `run` is recorded."""
        if not self.may_act():
            return
        job = self._view.get(slurm_id)
        if other := job is not None and run is not None and job.tag(self.ledger_id) != run:
            log.warning("slurm job %s is not job %s run %s (its comment): not stopped", slurm_id, *run)  # fmt: skip  # noqa: E501
        grace = self.grace_s if grace_s is None else grace_s
        begun = now if since is None else min(since, now)
        if slurm_id not in self._stopping and run is not None:
            note_stop(self.log_dir, slurm_id, begun)  # a restart gives it only what is left
        seen = next((r.seen_running_at for r in self._runs.values() if r.slurm_id == slurm_id), None)  # fmt: skip  # noqa: E501
        stopping = self._stopping.setdefault(slurm_id, Stopping(begun, grace_s=grace, run=run,
                                                                seen_running_at=seen, limit=limit))  # fmt: skip  # noqa: E501
        if stopping.run is None and run is not None:  # its limit's stop, now the ledger's too:
            stopping.run = run  # its SIGKILL and end as the ledger's stop's (atk54-23 F2)
            note_stop(self.log_dir, slurm_id, stopping.since)
        if other or not self.cluster.confirm(now):
            return  # not signalled: missing, or not confirmed (after the grace: `_read_runs`)
        tag = (job.tag(self.ledger_id) if job is not None else None) or run  # its name (F1)
        try:
            if job is not None and job.state in WAITING:
                self._run(scancel_args(slurm_id, tag))  # never ran: nothing to save
                stopping.cancelled = True
            elif kill_due(stopping, now):  # its grace ran out meanwhile
                kill(self, slurm_id, stopping, now, tag)  # SIGKILL (atk47-s F3)
            else:  # every process gets it, never `srun` (`term_args`, atk58 F1)
                if tag:
                    mark_stopping(self._checkpoint_file(*tag).parent)
                for args in term_args(slurm_id, tag):
                    self._run(args)
                if stopping.termed_at is None:  # the job's note of it, later (`real_term`)
                    stopping.termed_at = stopping.term_asked_at = now
        except EngineError as err:
            stopping.term_refused |= any(w in err.line() for w in GONE_ALREADY)
            log.warning("slurm job %s: %s (retrying)", slurm_id, err.line())

    def _read_runs(self, now: float) -> None:
        take_up_copies(self, now)  # a late copy is no stray: never the run's stop (F1)
        resume_stops(self, now)
        note_unanswered(self._stopping, self._view, self._unheard)  # Slurm's end alone (F8)
        # 0. our runs Slurm has ended whose processes may still live (COMPLETING)
        mine = {r.slurm_id for r in self._runs.values() if r.slurm_id} | set(self._stopping)
        mine = {i for i in mine if (j := self._view.get(i)) is None or j.tag(self.ledger_id)}
        self._completing = completing(self._view, mine, self._completing, now)
        read_own_runs(self, now)  # 1. our runs: starts, exits, vanished (`run_loop`)
        carry_stops(self, now)  # 2. stops: the grace, then scancel (`stop_loop`)
        # 3. foreign jobs on any partition: their GPUs are busy, never touched (`resume_stops`)
        other = others(self._view.values(), mine, self.ledger_id, self.partition, self._pinned)
        for j, holds in other.holders:
            if j.slurm_id not in self._foreign_seen:
                self._foreign_seen.add(j.slurm_id)
                log.info("foreign Slurm job %s (%s) holds GPUs %s", j.slurm_id, j.state,
                         dict(holds))  # fmt: skip
        self._foreign = dict(other.foreign)

    def _how_failed(self, tag: Tag | None, launch: Launch | None, started_at: float | None,
                    j: SlurmJob | None, now: float, grace_s: float) -> Ending | None:  # fmt: skip
        """How a run Slurm ended NODE_FAIL ended, from its marks (`node_fail_end`; `grace_s`)."""
        return None if tag is None or j is None else node_fail_end(
            self._checkpoint_file(*tag).parent, launch, started_at, j, self._answering,
            self.kill_wait_s, now, self.slurmd_timeout_s, self._seen, grace_s)  # fmt: skip

    def _past_limit(self, r: Run, now: float) -> bool:
        return past_limit(r, self._limit_of(r), now)

    def _limit_of(self, r: Run) -> float | None:  # its launch's, or (adopted) its job's
        return r.launch.time_limit_s if r.launch is not None else self.job_limit(r.job_id)

    def _take_back(self, r: Run, why: str, now: float) -> None:
        """Cancel a run Slurm will not start; its job ends `launch_failed` with why. Its
        `taken-back` mark first: should a slurmctld restart lose the cancel, its script ends
        before anything of the job's, and the executor stops what Slurm lists of it (atk45s F5)."""
        assert r.slurm_id is not None
        log.warning("job %s run %s (Slurm job %s): %s; taking it back", r.job_id, r.run,
                    r.slurm_id, why)  # fmt: skip
        run_dir = self._checkpoint_file(r.job_id, r.run).parent
        if self.may_act() and not mark_taken_back(run_dir):  # a deposed leader marks nothing
            log.warning("job %s run %s: cannot mark %s taken back: only its stop stands should "
                        "Slurm start it after all", r.job_id, r.run, run_dir)  # fmt: skip
        self._signal(r.slurm_id, now)  # it never ran: scancel at once
        del self._runs[r.job_id]
        self._exits.append(Exit(r.job_id, -1, now, "launch_failed", r.slurm_id, "PENDING", why))

    def heard_from(self) -> Mapping[str, float]:
        return {}

    def next_event_at(self) -> float | None:
        return None

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        runs = {j: r for j, r in runs.items() if (j, r) not in self.abandoned}  # recorded lost
        if not self.refresh():
            raise EngineError("Slurm cannot be read, so the ledger cannot be reconciled with it",
                              hint="start slurmctld (scripts/slurm/slurm up), retry")  # fmt: skip
        for (job_id, run), j in adoptable(self._view.values(), runs, self.ledger_id,
                                          self.partition):  # fmt: skip
            logs = tracked.noted_logs(self.log_dir, job_id, run) or j.logs
            # a hold no read saw: its launch mark says when it started (atk45s F1)
            run_dir = self._checkpoint_file(job_id, run).parent
            launched = mark_time(run_dir, LAUNCHED, now)
            self._runs[job_id] = Run(job_id, run, None, j.slurm_id, logs=logs,
                                     launch_seen=launched, adopted=True,
                                     taken_back=marked(run_dir, TAKEN_BACK),  # (atk61-slurm F1)
                                     limited=tracked.ended_limited(self.log_dir, j, self.job_limit(job_id)))  # fmt: skip  # noqa: E501
            log.info("adopted Slurm job %s as job %s run %s", j.slurm_id, job_id, run)
            self._restarts.submitted(job_id, run, j.slurm_id)  # a reused id? (atk44s F6)
        for r in self._restarts.unlisted(runs, set(self._runs), self._checkpoint_file, now):
            self._runs[r.job_id] = r  # Slurm forgot it: its own end record says (atk43s F3)
            r.limited = tracked.noted_limited(self.log_dir, r.slurm_id)  # ended: its limit's? (F2)
        adopted = set(self._runs)
        self.in_flight.begin(runs, adopted, now, self.timeout_s)  # (atk45ha F1)
        tracked.forget_logs(self.log_dir, ((r.job_id, r.run) for r in self._runs.values()))
        tracked.forget_limited(self.log_dir, (r.slurm_id for r in self._runs.values()))
        self._node_changes({}, now)  # which nodes answer: a stop Slurm ended there (F8)
        self._read_runs(now)  # runs that ended while we were away: exits at the next `observe`
        return adopted

    def shutdown(self, now: float) -> list[Exit]:
        """Slurm runs on without us; the next start adopts the runs."""
        return []


def _minutes(max_time_s: float | None) -> str:
    """Pure: a partition's MaxTime as Slurm writes it in minutes (None: `UNLIMITED`)."""
    return "UNLIMITED" if max_time_s is None else f"{max_time_s / 60:g}"
