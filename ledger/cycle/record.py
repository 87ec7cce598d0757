"""Recording what an engine observed: the one path from an `Observed` to ledger commands.

The dispatcher cycle's step 0, the service loop's agent reports outside a cycle, recovery after a
restart and a stopping service all record here, in this order:

1. node changes, one command each (`MarkNodeLost`, `DrainNode`, `ReturnNode`): the one lost-node
   rule, whatever told the engine (Slurm's DOWN, an agent silent past its timeout). A node lost
   with its jobs is recorded before their exits, so a run that ended with its node is requeued
   (resumable) rather than failed;
2. starts, in one batch (a run that began and ended since the last look started first);
3. checkpoints and utilisation samples, in one batch (each on its own if the batch fails), then
   the runs whose command exited leaving processes to reap (`ReportLeaderEnded`);
4. exits, one command each.

Each step reads the ledger as the steps before it left it: what the ledger has moved past (a
cancel, a preemption, a lost node) is dropped, never an error. The functions that turn
observations into commands are pure; `record` is the edge that executes them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ledger.core.runs import settle_commands
from ledger.cycle.executor import Exit, NodeChange, Observed, Reaping, Sample, Start
from schemas import commands as c
from schemas.errors import InvalidTransition, LedgerError, UnknownEntity
from schemas.units import format_duration

if TYPE_CHECKING:
    from ledger.core.state import Job, State

log = logging.getLogger("gpuledger.dispatcher")

EXECUTOR = "@executor"
"""The actor of everything an engine reports."""

SERVICE = "@service"
"""The actor of the settings the service records (`service.configured`)."""


class Recorder(Protocol):
    """The ledger as recording needs it: its live state and its two ways to append."""

    @property
    def state(self) -> State: ...

    def execute(self, cmd: c.AnyCommand) -> Any: ...

    def execute_all(self, cmds: Sequence[c.AnyCommand]) -> Any: ...


@dataclass(frozen=True)
class Recorded:
    started: int = 0
    finished: int = 0


def node_command(change: NodeChange, actor: str = EXECUTOR) -> c.AnyCommand:
    """Pure: the ledger command of a node change (but `unplace`: `unplace_commands`)."""
    assert change.change != "unplace", "unplace_commands"
    if change.change == "lost":
        fence = round(change.fence_s)
        return c.MarkNodeLost(actor=actor, node=change.node, reason=change.reason, fence_s=fence)
    if change.change == "drain":
        return c.DrainNode(actor=actor, node=change.node, reason=change.reason)
    return c.ReturnNode(actor=actor, node=change.node)


def unplace_commands(change: NodeChange, state: State, actor: str = EXECUTOR) -> list[c.UnplaceJob]:
    """Pure: the jobs placed on `change.node` and not started, back to the queue (`UnplaceJob`:
    their run taken back with why, never run, no preemption; the job pending again, same id),
    as an `unplace` says: the engine cannot start them there (a node another cluster's
    partition does not list: they waited there for good after `--new-settings`, issue 28; a
    leaked GPU; a partition an admin paused). None when none is. With no node, the jobs it
    names wherever they are placed (a run adopted after a restart: its engine does not know
    where the ledger placed it), why alone."""
    on = state.node_jobs.get(change.node, ()) if change.node else change.jobs
    placed = sorted(
        j
        for j in on
        if j in state.jobs
        and state.jobs[j].status == "placed"
        and (not change.jobs or j in change.jobs)
    )
    why = (f"node {change.node} cannot run it: " if change.node else "") + change.reason
    return [c.UnplaceJob(actor=actor, job_id=j, run=state.jobs[j].run, reason=why[:1000])
            for j in placed]  # fmt: skip


def start_commands(
    starts: Sequence[Start], jobs: Mapping[int, Job], engine: str
) -> list[c.AnyCommand]:
    """Pure: `StartJob` for each start of a job the ledger has placed (with the engine's run id,
    run and GPUs when the engine is named)."""
    out: list[c.AnyCommand] = []
    for st in starts:
        job = jobs.get(st.job_id)
        if job is None or job.status != "placed":
            continue
        if engine:
            out.append(
                c.StartJob(
                    actor=EXECUTOR,
                    job_id=st.job_id,
                    engine=engine,
                    engine_job_id=st.engine_job_id,
                    run=st.run,
                    gpus=st.gpus,
                    logs=st.logs,
                    started_at=st.started_at,
                    parts=st.parts,
                )
            )
        else:
            out.append(
                c.StartJob(actor=EXECUTOR, job_id=st.job_id, logs=st.logs, started_at=st.started_at)
            )
    return out


def progress_commands(
    checkpoints: Sequence[int], samples: Sequence[Sample], jobs: Mapping[int, Job]
) -> list[c.AnyCommand]:
    """Pure: checkpoints of running resumable jobs, then samples of running jobs with one value
    per GPU of the job."""
    out: list[c.AnyCommand] = [
        c.ReportCheckpoint(actor=EXECUTOR, job_id=j)
        for j in checkpoints
        if j in jobs and jobs[j].status == "running" and jobs[j].spec.resumable
    ]
    out += [
        c.SampleUtilisation(actor=EXECUTOR, job_id=s.job_id, gpu_utilisation=s.gpu_utilisation)
        for s in samples
        if s.job_id in jobs
        and jobs[s.job_id].status == "running"
        and len(s.gpu_utilisation) == jobs[s.job_id].spec.gpus
    ]
    return out


def reaping_commands(reaping: Sequence[Reaping], jobs: Mapping[int, Job]) -> list[c.AnyCommand]:
    """Pure: the reaping of running jobs' current runs (`ReportLeaderEnded`, atk49-23 F4), not
    yet recorded (an engine restarted reports it again)."""
    return [
        c.ReportLeaderEnded(actor=EXECUTOR, job_id=rp.job_id, run=rp.run, left=rp.left,
                            leader_ended_at=rp.leader_ended_at, kill_at=rp.kill_at,
                            exit_code=rp.exit_code)
        for rp in reaping
        if (job := jobs.get(rp.job_id)) is not None and job.status == "running"
        and job.run == rp.run and job.reaping_kill_at is None
    ]  # fmt: skip


def exit_command(ex: Exit, jobs: Mapping[int, Job], engine: str) -> c.FinishJob | None:
    """Pure: `FinishJob` for the exit of a job the ledger still runs (with the engine's word when
    the engine is named); None when the ledger has moved past it."""
    job = jobs.get(ex.job_id)
    if job is None or job.status not in ("placed", "running"):
        return None
    if not engine:  # how it ended and when, without the engine's names
        return c.FinishJob(
            actor=EXECUTOR, job_id=ex.job_id, exit_code=ex.exit_code, reason=ex.reason,
            ended_at=ex.at, note=ex.note[:1000],
        )  # fmt: skip
    return c.FinishJob(
        actor=EXECUTOR,
        job_id=ex.job_id,
        exit_code=ex.exit_code,
        engine=engine,
        engine_job_id=ex.engine_job_id,
        reason=ex.reason,
        engine_state=ex.engine_state,
        ended_at=ex.at,
        note=ex.note[:1000],
        killed=ex.killed,
    )


def stopped_commands(stopped: Sequence[Exit], engine: str) -> list[c.AnyCommand]:
    """Pure: `ConfirmRunEnded` for each stopped run whose end the engine saw (engines that name
    their runs)."""
    if not engine:
        return []
    return [
        c.ConfirmRunEnded(
            actor=EXECUTOR,
            job_id=x.job_id,
            engine=engine,
            engine_job_id=x.engine_job_id,
            run=_run_of(x.engine_job_id) if x.run is None else x.run,
            ended_at=x.at,
            exit_code=x.exit_code,
            killed=x.engine_state == "KILLED",
            note=x.note[:1000],
            by_itself=x.by_itself,
            exit_decides=True,  # its exit, whatever its code (`runs.ended_meanwhile`)
            started_at=x.started_at,
        )
        for x in stopped
    ]


def overtaken_command(
    ex: Exit, state: State, engine: str, starts: Sequence[Start] = ()
) -> c.ConfirmRunEnded | None:
    """Pure: the end of a run the ledger stopped (requeued, preempted) after the engine saw it
    end but before it was told to stop it: an exit of a job the ledger has moved past, recorded
    as the stopped run's end (`stopped_commands`), ended by itself when it exited (no stop
    reached it: `ConfirmRunEnded.by_itself`, so its exit is the job's outcome: atk38-24 F3,
    atk53-23 F3). Also the exit by itself of a run requeued while `placed` (no start recorded,
    so no `State.stopped_runs` of it on Slurm), the job's last run and still waiting or placed
    again: its command did run and end (its start among `starts`, the same observation), so
    its exit is its job's outcome and it is charged (atk54-23 F1: the exit was dropped and the
    job ran its whole command again). None when it is no run the ledger awaits the end of."""
    if not engine:
        return None
    run = _run_of(ex.engine_job_id) if ex.run is None else ex.run
    itself = ex.reason == "exited"
    if (ex.job_id, run) not in state.stopped_runs and not (
        itself and _requeued_placed(state, ex.job_id, run)
    ):
        return None
    began = next((s.started_at for s in starts if (s.job_id, s.run) == (ex.job_id, run)), None)
    if ex.started_at is None and began is not None:
        ex = replace(ex, started_at=min(began, ex.at))
    (cmd,) = stopped_commands([replace(ex, run=run, by_itself=itself)], engine)
    return cmd if isinstance(cmd, c.ConfirmRunEnded) else None


def _requeued_placed(state: State, job_id: int, run: int) -> bool:
    """Pure: `run` is the last run of a job requeued since, which waits or is placed again (not
    running: no later run started), and whose end is not recorded."""
    job = state.jobs.get(job_id)
    return (
        job is not None
        and job.status in ("pending", "placed")
        and run == job.run - 1
        and (job_id, run) not in state.run_ends
    )


def _run_of(engine_job_id: str) -> int:
    """The ledger's run of an engine's run named `<job>.<launch>` (0 for other names)."""
    launch = engine_job_id.rpartition(".")[2]
    return int(launch) - 1 if launch.isdigit() and int(launch) > 0 else 0


def record(ledger: Recorder, seen: Observed, engine: str, now: float | None = None) -> Recorded:
    """Record an observation (module doc); how many starts and exits the ledger took. With
    `now`, runs in doubt whose fence has passed end there too (`runs.settle_commands`)."""
    for change in seen.nodes:
        if change.change == "unplace":  # none, nearly always: no command, no word
            for unplace in unplace_commands(change, ledger.state):
                try:
                    ledger.execute(unplace)
                    log.warning("job %s is back in the queue: %s", unplace.job_id, unplace.reason)
                except LedgerError as err:
                    log.info("job %s not taken back: %s", unplace.job_id, err.line())
        else:
            _record_node(ledger, change)
    starts = start_commands(seen.starts, ledger.state.jobs, engine)
    _record_starts(ledger, starts)
    _record_batch(ledger, progress_commands(seen.checkpoints, seen.samples, ledger.state.jobs))
    _record_batch(ledger, reaping_commands(seen.reaping, ledger.state.jobs))
    finished = 0
    for ex in seen.exits:
        cmd = exit_command(ex, ledger.state.jobs, engine)
        if cmd is None:  # the ledger moved past it: a run it stopped meanwhile, maybe
            x = overtaken_command(ex, ledger.state, engine, seen.starts)
            _record_batch(ledger, [x] if x else [])
            continue
        finished += _record_exit(ledger, cmd)
    _record_batch(ledger, stopped_commands(seen.stopped, engine))
    if now is not None:
        for settle in settle_commands(ledger.state, now, EXECUTOR):
            try:
                ledger.execute(settle)
                finished += 1
                log.warning("job %s: its node was lost and its fence passed: node_failure",
                            settle.job_id)  # fmt: skip
            except LedgerError as err:
                log.info("run of job %s not settled: %s", settle.job_id, err.line())
    return Recorded(started=len(starts), finished=finished)


def _record_exit(ledger: Recorder, cmd: c.FinishJob) -> int:
    """1 when the exit `cmd` is recorded. One the ledger refuses because it moved on (a cancel,
    a preemption: the job ended otherwise) is passed over in a word; one refused for anything
    else is said at ERROR and tried again without its note; one refused even so at ERROR again
    (a completed exit refused for its dependents' ends was dropped at INFO, and the job showed
    running for good, its GPUs held: atk46-25 F1)."""
    try:
        ledger.execute(cmd)
        return 1
    except (InvalidTransition, UnknownEntity) as err:  # the ledger moved on: keep going
        log.info("exit of job %s not recorded: %s", cmd.job_id, err.line())
        return 0
    except LedgerError as err:
        log.error("exit of job %s refused: %s", cmd.job_id, err.line())
    if not cmd.note:
        return 0
    try:
        ledger.execute(msgspec.structs.replace(cmd, note=""))
        log.error("exit of job %s recorded without its note", cmd.job_id)
        return 1
    except LedgerError as err:
        log.error("exit of job %s not recorded: %s", cmd.job_id, err.line())
        return 0


def _record_starts(ledger: Recorder, starts: list[c.AnyCommand]) -> None:
    """Every start, whatever else it carries: one the ledger refuses with its log paths is
    recorded without them, with an error in the log (a start refused for a 4,097-character
    `node:path` was dropped without a word, and its run went uncharged: atk46-23 F14). A start
    refused even so is a bug between engine and ledger: raised, once the others are recorded."""
    if not starts:
        return
    try:
        ledger.execute_all(starts)
        return
    except LedgerError:  # one start must not hide the others
        pass
    refused: list[LedgerError] = []
    for cmd in starts:
        job = getattr(cmd, "job_id", None)
        try:
            ledger.execute(cmd)
            continue
        except LedgerError as err:
            if not isinstance(cmd, c.StartJob) or not cmd.logs:
                refused.append(err)
                continue
            log.error("start of job %s refused with its log paths (%s): recorded without them",
                      job, err.line())  # fmt: skip
        try:
            ledger.execute(msgspec.structs.replace(cmd, logs=()))
        except LedgerError as err:
            refused.append(err)
    if refused:
        raise refused[0]


def _record_node(ledger: Recorder, change: NodeChange) -> None:
    try:
        ledger.execute(node_command(change))
    except LedgerError as err:
        log.warning("node %s not marked %s: %s", change.node, change.change, err.line())
        return
    why = f": {change.reason}" if change.reason else ""
    if change.change == "lost":
        log.warning("node %s is lost%s", change.node, why)
    else:
        log.info("node %s: %s%s", change.node, change.change, why)


def _record_batch(ledger: Recorder, batch: list[c.AnyCommand]) -> None:
    if not batch:
        return
    try:
        ledger.execute_all(batch)
    except LedgerError:  # one stale report must not hide the others
        for cmd in batch:
            try:
                ledger.execute(cmd)
            except LedgerError as err:
                log.info("report not recorded: %s", err.line())


def max_time_s(longest_s: float | None) -> int | None:
    """Pure: an engine's longest time limit as `ServiceConfigured.max_time_s` records it (whole
    seconds, at least 1; None: no limit)."""
    return None if longest_s is None else max(1, int(longest_s))


def record_longest(ledger: Recorder, longest_s: float | None, logger: logging.Logger) -> None:
    """Append `service.configured` with the engine's longest time limit (Slurm's partition
    MaxTime, as a cycle observed it) when it is not the one last recorded, the other settings
    as recorded. Every cycle does it before it decides, and decides with the one recorded
    (`Dispatcher._cycle`): a job submitted without a time limit takes its limit from it
    (`JobSubmitted.max_time_s`) and a job over it is not placed, so the same log gives every
    job the same limit and every replay the same decision (atk62b G3: a cycle decided with a
    MaxTime read again at a take-back, recorded only after it). Nothing while no settings
    are recorded (`record_settings` records it with them)."""
    now, longest = ledger.state.service, max_time_s(longest_s)
    if now is None or now.max_time_s == longest:
        return
    ledger.execute(
        c.ConfigureService(
            actor=SERVICE,
            policy=now.policy,
            interval_s=now.interval_s,
            executor=now.executor,
            grace_s=now.grace_s,
            max_time_s=longest,
        )
    )
    shown = "UNLIMITED" if longest is None else format_duration(longest)
    logger.info("recorded the engine's longest time limit (MaxTime): %s", shown)
