"""The Slurm executor's own runs, read by read (an edge: it reads the runs' marks and Slurm's
accounting, and runs `scancel`): each run's start once Slurm runs it and its script marked its
launch, its end (Slurm's word, or its own end record where Slurm did not decide it; a NODE_FAIL
run once known how it ended), a run Slurm forgot or will not start, a run past its time limit
(`read_own_runs`, step 1 of `SlurmExecutor._read_runs`). The judgement is pure, in
`ledger.engines.slurm.launching`, `ends` and `stops`; this is the loop that applies it to the
executor's state, as `stop_loop` is for the stops."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ledger.cycle.executor import Exit, Start
from ledger.engines.slurm import tracked
from ledger.engines.slurm.ends import beat_window, ended_killed, limit_kill_end
from ledger.engines.slurm.launching import (
    ended_by_record,
    marked,
    never_ran_reason,
    never_starts,
    own_end,
    reaping_said,
    run_end,
    script_killed,
    tree_said,
)
from ledger.engines.slurm.leaked_runs import doubted, placed_on, take_back
from ledger.engines.slurm.restarts import vanished
from ledger.engines.slurm.script_tree import STEPS_LEFT
from ledger.engines.slurm.stops import (
    ended_by_slurm,
    gpus_differ,
    outage_of,
    placed_gpus,
    run_gpus,
    unseen_end,
)
from ledger.engines.slurm.tracked import Run
from ledger.engines.slurm.words import (
    SLURM_ENDS_FIRST,
    WAITING,
    SlurmJob,
    end_reason,
    expand_hostlist,
    slurm_duration,
)
from schemas.units import when

if TYPE_CHECKING:
    from ledger.engines.slurm.executor import SlurmExecutor

log = logging.getLogger("gpuledger.slurm")

ENDED_UNSEEN = "Slurm listed it running after its end (slurmctld lost it?): its own end record"


def read_own_runs(ex: SlurmExecutor, now: float) -> None:
    """Step 1 of a read: starts, exits and vanished runs of the executor's own runs."""
    for job_id, r in list(ex._runs.items()):
        if r.slurm_id is None:
            continue
        j = ex._view.get(r.slurm_id)
        if j is not None and j.tag(ex.ledger_id) != (job_id, r.run):
            j = None  # its id names another job now: Slurm gave it again (atk43s F5)
        j = j or ex._restarts.last(job_id, r.run)
        if j is None:
            if r.missing_since is None:
                r.missing_since = now
            sacct = ex._run if ex._accounting else None  # past MinJobAge, or forgotten
            run_dir = ex._checkpoint_file(job_id, r.run).parent
            if now - r.missing_since >= ex.vanish_after_s and ex._restarts.never_launched(r, run_dir):  # fmt: skip  # noqa: E501
                log.warning("job %s run %s: Slurm forgot its job %s before launching it (no "
                            "mark of its script): submitting it again", job_id, r.run, r.slurm_id)  # fmt: skip  # noqa: E501
                r.slurm_id = r.submitted_at = r.missing_since = None  # (atk44s F4)
                continue
            if now - r.missing_since >= ex.vanish_after_s and (gone := vanished(r, run_dir, sacct, now, ex.kill_wait_s)):  # fmt: skip  # noqa: E501
                del ex._runs[job_id]
                start = ex._restarts.unseen_start(r, run_dir, now)  # it ran (atk44s F5)
                ex._starts += [start] if start is not None and gone.reason != "lost" else []
                ex._exits.append(gone)
            continue
        r.missing_since = None
        if ex._restarts.check(r, j, now, ex.kill_wait_s, ex._pinned, ex._runs,
                              (ex._starts, ex._exits)):  # fmt: skip
            continue  # Slurm launched it again: never the ledger's (atk43s F4, F6, F11)
        if doubted(ex, r, j, now):
            continue  # a take-back a restart cut short: finished as one (atk61-slurm F1)
        if j.state in WAITING and not r.started:
            r.submitted_at = now if r.submitted_at is None else r.submitted_at  # adopted
            if j.reason == CONFIG:  # MaxTime lowered just before? read it again at once
                ex._max_time_at = None
                ex._read_partition(now)
            if j.reason == MAX_TIME or config_over_max_time(j, ex.max_time_s):  # (F2)
                ex._max_time_at = None  # read again now: placed once MaxTime allows
                ex._unplaced.append(take_back(ex, r, placed_on(r), over_max_time(j.reason), now))
                continue
            waited = now - r.submitted_at
            settling = j.reason == CONFIG and waited < CONFIG_SETTLE_S  # (atk62b G5)
            why = "" if settling else never_starts(j.reason, waited, ex.start_within_s)
            if why:
                ex._take_back(r, why, now)
                continue
        never_ran = ex._never_ran(r, j) if j.ended and not r.limited else ""
        # a run Slurm ran without its GPUs is charged, whatever its marks say (atk43s F2)
        ran = not never_ran or never_ran_reason(never_ran) == "node_failure"
        held = j.state == "CONFIGURING"  # its command not started yet (atk43s F1)
        end = j.end_time if j.ended else None  # (a running job's is its limit's)
        r.configuring_seen = now if held else r.configuring_seen
        if j.started and not r.started and (j.holding or j.ended) and ran and not held:
            r.started_at = r.real_start(j.start_time, end)  # its limit counts from it
        if (
            j.started
            and not r.started
            and (j.ended or (j.holding and not held and ex._launched(r, now)))
            and ran
        ):  # RUNNING alone is not yet a start: Slurm may still fail the launch (N3)
            r.started, r.started_at = True, r.real_start(j.start_time, end)  # its mark
            gpus = run_gpus(j, ex._pinned)  # also once ended: Slurm's record
            # charged from its real start (the ledger keeps it inside the placement)
            ex._starts.append(Start(job_id, r.slurm_id, r.run, gpus, logs=r.logs,
                                    started_at=r.started_at))  # fmt: skip
            ex._restarts.notes.note(job_id, r.run, r.slurm_id, j.start_time)  # its first
            if differ := gpus_differ(r.launch, j):
                log.warning("job %s: %s", job_id, differ)
        if j.holding and not j.ended and (ex._settle_until is None or now >= ex._settle_until):
            r.seen_running_at = now
        if never_ran:  # its command never ran
            del ex._runs[job_id]
            at = now if j.end_time is None else min(now, j.end_time)
            reason, note = ex._wrong_gpus.ending(job_id, never_ran)  # bounded (F2)
            ex._exits.append(Exit(job_id, -1, at, reason, r.slurm_id, j.state, note))
        elif j.ended and (end_reason(j.state) == "node_failure" or r.node_failed
                          or unseen_end(ex._stopping.get(r.slurm_id), j)):  # fmt: skip
            node_failed(ex, r, j, now)  # how it really ended, once known (a limit's stop)
        elif j.ended:
            del ex._runs[job_id]
            ex._wrong_gpus.ran(job_id)
            code, at, note, killed = end_of(ex, r, j, now)
            reason = "time_limit" if r.limited else end_reason(j.state)
            ex._exits.append(Exit(job_id, code, at, reason, r.slurm_id, j.state, note, run=r.run,
                                  killed=killed))  # fmt: skip
        elif j.state == "RUNNING" and r.started and (own := ended_unseen(ex, r, now)):
            del ex._runs[job_id]  # its own record, its beat stale: Slurm's word is stale
            log.warning("job %s (Slurm job %s) ended at %s by its own end record, though "
                        "Slurm lists it running: stopping that", job_id, r.slurm_id, when(own[1]))  # fmt: skip  # noqa: E501
            ex._exits.append(Exit(job_id, own[0], own[1], "time_limit" if r.limited else "exited", r.slurm_id, "COMPLETED" if own[0] == 0 else "FAILED", "; ".join(filter(None, (ENDED_UNSEEN, own[2]))), run=r.run))  # fmt: skip  # noqa: E501
            ex._signal(r.slurm_id, now, 0.0)  # nothing of it runs: `scancel` (F3)
        elif j.holding and ex._past_limit(r, now) and not reaped_past_limit(ex, r, now):
            r.limited, r.stop_sent_at = True, now
            if ex.may_act():  # kept before its SIGTERM: a restart says `time_limit` (F2)
                tracked.note_limited(ex.log_dir, j.slurm_id)
            limit = ex._limit_of(r)
            log.info("job %s (Slurm job %s) reached its limit of %s s: stopping it",
                     job_id, r.slurm_id, limit)  # fmt: skip
            at = r.started_at + limit if r.started_at and limit is not None else now
            # its grace from the limit, its SIGTERM first however late (`limit_sigkill_at`)
            ex._signal(r.slurm_id, now, ex._grace_of(r), since=at, limit=True)


REAP_MARGIN_S = 10.0
"""How long past the SIGKILL its batch script set for what a command left (`REAPING_MARK`) a run
still listed is let be before its time limit stops it after all."""


MAX_TIME = "PartitionTimeLimit"
"""Slurm's pending reason for a job whose `--time` is over its partition's MaxTime."""


CONFIG = "PartitionConfig"
"""Slurm's pending reason for a job its partition's settings refuse; a MaxTime lowered under
its `--time` in the seconds before it was submitted gives it too (atk62-slurm F2)."""


CONFIG_SETTLE_S = 90.0
"""How long a run pending `PartitionConfig` within the MaxTime read again may wait before it
never starts: MaxTime lowered and raised back within a second or two left it `PartitionConfig`,
which Slurm's next scheduling pass (SchedulerInterval, 60 s by default) clears, and it ended
`launch_failed` for good (atk62b G5, 1 of 3 tries)."""


def config_over_max_time(j: SlurmJob, max_time_s: float | None) -> bool:
    """Pure: a run pending `PartitionConfig` whose `--time` (Slurm's TimeLimit) is over the
    partition's MaxTime as read again at once: MaxTime was lowered in the seconds before the
    service read it (the sbatch asked the MaxTime last read), so it goes back to the queue as
    for `PartitionTimeLimit` (atk62-slurm F2: it ended `launch_failed` for good). Any other
    `PartitionConfig` never starts, as before."""
    if j.reason != CONFIG or max_time_s is None or not j.time_limit:
        return False
    asked = slurm_duration(j.time_limit)  # None: UNLIMITED
    return asked is None or asked > max_time_s


def over_max_time(reason: str = MAX_TIME) -> str:
    """Pure: why a run pending in Slurm under a MaxTime lowered below its `--time` goes back to
    the queue (atk61-slurm F2: it ended `launch_failed` for good): it waits there as any job over
    MaxTime (`PARTITION_TIME_LIMIT`), placed once MaxTime allows."""
    return (f"Slurm will not start it under the partition's MaxTime ({reason}): it waits in "
            "the queue until MaxTime allows it")  # fmt: skip


def reaped_past_limit(ex: SlurmExecutor, r: Run, now: float) -> bool:
    """Its command ended before its time limit and its batch script reaps what it left (the
    `reaping` mark): the limit stops nothing more (their SIGKILL, at the command's end plus the
    grace, comes before the limit's), so the run ends with its command's exit, `completed` for
    0, as on the node agents (`run_ends.commands_ended`). Before, it was stopped and recorded
    `time_limit` (atk53-23 F4). The mark is the job user's word: past its SIGKILL (and a
    margin) a run Slurm still lists is stopped at its limit as any other."""
    limit = ex._limit_of(r)
    if r.started_at is None or limit is None:
        return False
    run_dir = ex._checkpoint_file(r.job_id, r.run).parent
    said = reaping_said(run_dir, r.started_at, now, ex._grace_of(r))
    return (
        said is not None
        and said.leader_ended_at <= r.started_at + limit
        and now < said.kill_at + REAP_MARGIN_S
    )


def ended_unseen(ex: SlurmExecutor, r: Run, now: float) -> tuple[int, float, str] | None:
    """A run Slurm lists running that its own end record and stale beat say ended (atk45s
    F3: `launching.ended_by_record`), where Slurm reaches its nodes: (its code, its end)."""
    if r.launch is not None and ex._unheard & {sl.node for sl in r.launch.slots}:
        return None
    run_dir = ex._checkpoint_file(r.job_id, r.run).parent
    return ended_by_record(run_dir, r.started_at, now, beat_window(ex.kill_wait_s))


def end_of(
    ex: SlurmExecutor, r: Run, j: SlurmJob, now: float
) -> tuple[int, float, str, bool | None]:
    """How (exit code) and when a run ended (`run_end`: Slurm's word, or, where Slurm did not
    decide it, its own end record's: a completion slurmctld heard late is not charged); note;
    whether its processes were killed after their grace (`ends.ended_killed`)."""
    assert r.slurm_id is not None
    seen = ex._completing.get(r.slurm_id)
    if r.slurm_id not in ex._stopping:
        ex._completing.pop(r.slurm_id, None)
    run_dir = ex._checkpoint_file(r.job_id, r.run).parent
    outage = outage_of(ex._away, ex.settle_s, r.stop_sent_at)  # stopped after it? (F9)
    code, at, own = run_end(run_dir, j, r.started_at, now, seen, r.seen_running_at, outage)
    if seen is None and j.state in SLURM_ENDS_FIRST:  # its KillWait (F2; F5: TIMEOUT)
        at = limit_kill_end(at, j.end_time, ex._seen.beat(run_dir, r.slurm_id, now), ex.kill_wait_s)  # fmt: skip  # noqa: E501
        # a gang's ranks (a step's processes) die by Slurm's end of the job (atk60-slurm F3)
        at = ended_by_slurm(at, j, now, ex.kill_wait_s, marked(run_dir, STEPS_LEFT))
    if j.end_time is not None and at < min(now, j.end_time) - 1:
        log.info("job %s (Slurm job %s) ended at %s (%s; Slurm says %s, when it heard)",
                 r.job_id, r.slurm_id, when(at), "its own end record" if own else
                 "last seen running, slurmctld away", when(j.end_time))  # fmt: skip
    ledgers = r.limited or r.stop_sent_at is not None or r.slurm_id in ex._stopping
    grace, signal = ex._grace_of(r), j.script_killed
    killed = "" if own or ledgers else script_killed(run_dir, j.state, code, r.started_at, now,
                                                       grace, signal)  # fmt: skip
    tree = "" if j.script_killed else tree_said(run_dir)  # not its script's record (F4)
    gang = len(expand_hostlist(j.nodes)) > 1
    cut = ended_killed(j.state, j.script_killed, own_end(run_dir), ledgers, gang)
    return code, at, "; ".join(filter(None, (killed, tree))), cut


def node_failed(ex: SlurmExecutor, r: Run, j: SlurmJob, now: float) -> None:
    """A run Slurm ended NODE_FAIL (or, stopped at its limit, by its cancel on a node that
    did not answer: `unseen_end`): recorded as it really ended, once known; kept until
    then (running, for the ledger in doubt on its lost node; `ends`)."""
    ending = ex._how_failed((r.job_id, r.run), r.launch, r.started_at, j, now, ex._grace_of(r))  # fmt: skip  # noqa: E501
    if ending is None:
        if not r.node_failed:
            r.node_failed = True
            log.warning("job %s is %s in Slurm: waiting to know how it ends", r.job_id, j.state)
        return
    del ex._runs[r.job_id]
    ex._completing.pop(j.slurm_id, None)
    ex._seen.forget(j.slurm_id)
    ex._quarantine.hold(ending, j, placed_gpus(r.launch, j, ex._pinned))
    log.info("job %s (Slurm job %s, %s) ended %s at %s: %s", r.job_id, j.slurm_id, j.state,
             ending.reason, when(ending.at), ending.note)  # fmt: skip
    ex._exits.append(Exit(r.job_id, ending.exit_code, ending.at, "time_limit" if r.limited
                          else ending.reason, j.slurm_id, j.state, ending.note))  # fmt: skip
