"""How the Slurm executor stops a run the ledger no longer runs, as the node agents do:
SIGTERM to its steps and its batch shell (`cluster.term_args`), the job's own grace (`submit
--grace`; the service's when it has none), then SIGKILL (`cluster.kill_args`); and the run's
real end as Slurm kept it (EndTime), recorded for the audit (`job.run_ended.v2`). Pure."""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Set
from dataclasses import dataclass, field

from ledger.core.state import Node, State, StoppedRun
from ledger.cycle.executor import Exit, Launch, NodeChange
from ledger.engines.slurm.ends import (
    BEAT_EVERY_S,
    BEAT_STALE_S,
    OWN_END_SLACK_S,
    Ending,
    OwnEnd,
    own_finish,
    record_beat,
    sacct_end,
    surely_gone,
)
from ledger.engines.slurm.tracked import Run
from ledger.engines.slurm.words import (
    ENDED,
    HOLDING,
    SLURM_ENDS_FIRST,
    WAITING,
    SlurmJob,
    end_reason,
    ended_gpus,
    expand_hostlist,
    held_gpus,
    processes_end,
    real_end,
)
from ledger.reads.stopping import limit_sigkill_at
from schemas.bounds import job_grace as capped_grace
from schemas.events import EndReason, GpuSlot

Tag = tuple[int, int]
"""(job, run) of a run of this ledger."""


@dataclass
class Stopping:
    """A Slurm job being stopped: since when, its grace, and whether `scancel` was sent."""

    since: float
    cancelled: bool = False
    grace_s: float = 30.0
    """The job's own grace (`submit --grace`; the service's when it has none)."""
    run: Tag | None = None
    """(job, run) of a run the ledger stopped, whose end is recorded (`JobRunEnded`)."""
    killed: bool = False
    """It outlived its grace: SIGKILL (`cluster.kill_args`) was sent after the TERM."""
    kill_sent_at: float | None = None
    """When that SIGKILL was sent: a job Slurm still lists `RUNNING` `KILL_LANDS_S` later
    (its slurmd did not get it) gets Slurm's own `scancel` too (`scancelled`)."""
    scancelled: bool = False
    gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """The GPUs Slurm last showed it holding (node -> indices): held while it is in doubt."""
    in_doubt: bool = False
    """Slurm ended it and its processes may still live (`unseen_end`: NODE_FAIL, or its cancel
    on a node that did not answer)."""
    term_refused: bool = False
    """The stop's SIGTERM found it ended already (Slurm: an invalid or completed job)."""
    seen_running_at: float | None = None
    """The last read that saw it running (not while Slurm settled after an outage; before the
    stop, its run's): where an end in an outage really was (`words.real_end`, atk39-24 F6)."""
    unanswered: bool = False
    """A read of the nodes during the stop found one of its nodes not answering or DOWN
    (`note_unanswered`), or its run outlived Slurm's end (`outlived`): Slurm's end of it is
    then its decision alone (`unseen_end`). Kept on disk (`tracked.note_unheard`) for a
    restart of the service."""
    kept: bool = False
    """`unanswered` is kept on disk (`tracked.note_unheard`)."""
    limit: bool = False
    """A stop at its time limit (`since`: the limit): SIGTERM first whenever it is noticed, and
    SIGKILL by `reads.stopping.limit_sigkill_at` from the SIGTERM really sent (`termed_at`)."""
    termed_at: float | None = None
    """When its limit's SIGTERM (`scancel --signal=TERM`) really reached the job (None: not
    sent yet): the request's time (`term_asked_at`) until a read finds the job's own note of
    it (`real_term`)."""
    term_asked_at: float | None = None
    """The cycle time of that `scancel` request (its start: the read before it, the scancel
    itself run later, seconds later at load)."""
    term_seen: bool = False
    """`termed_at` is the job's note of that SIGTERM, found by a read at or after it."""


def kill_due(st: Stopping, now: float) -> bool:
    """Pure: whether a stop's SIGKILL is due at `now`: its grace from its stop has passed; for a
    stop at its time limit, only once its SIGTERM was sent, and no sooner than the grace (at
    most `LATE_TERM_GRACE_S`) after that SIGTERM (`limit_sigkill_at`: one rule with the reads
    and the node agents; s56: a limit noticed 38 s late was SIGKILLed with no SIGTERM)."""
    if not st.limit:
        return now - st.since >= st.grace_s
    return st.termed_at is not None and now >= limit_sigkill_at(st.since, st.grace_s, st.termed_at)


def real_term(asked: float, noted: float | None, read_at: float) -> tuple[float, bool]:
    """Pure: (when a stop's SIGTERM reached the job, whether that is settled) from the time of
    its `scancel` request (`asked`, a cycle's start: before the read and the `scancel` that
    followed, seconds before the signal at load), the job's own note of its last signal
    (`noted`: its `signalled` mark's ctime, which its batch script makes when the signal comes,
    and which its user cannot set back) and the read that found it (`read_at`). A note before
    the request is not this SIGTERM's (the request's time stands, unsettled); one after is its
    time, kept no later than the read (a note made during the read's cycle is settled at the
    next read, which is after it; a node's clock ahead). Before, the SIGTERM counted from the
    request and the SIGKILL of a limit noticed late came `LATE_TERM_GRACE_S` after the request,
    seconds less after the signal the job saw (s57's closing note)."""
    if noted is None or noted < asked:
        return asked, False
    return min(noted, read_at), noted <= read_at


KILL_LANDS_S = 5.0
"""How long a SIGKILL of a run's batch step (`cluster.kill_args`: slurmctld passes it to its
slurmd, which kills within milliseconds here) may take before the executor falls back to a plain
`scancel`: a slurmd that does not answer never delivers it, and Slurm's cancel is then what ends
the job (`unseen_end` judges it)."""

GONE_ALREADY = ("Invalid job id", "already complet")
"""What `scancel` says of a job that has ended (Slurm 22.05: `Invalid job id specified`,
`Job/step already completing or completed`)."""


def ended_by_itself(own: OwnEnd | None, j: SlurmJob, term_refused: bool) -> bool:
    """Pure: whether a stopped run's command ended by itself, before the stop's signal reached
    it (atk38-24 F3: a job that completed just as the ledger preempted it was requeued and run
    again): its own end record says so (no signal came first); without one (a compute node
    that does not share the service's directory), Slurm ended it COMPLETED, exit 0, or FAILED
    (its exit is its outcome then too: atk53-23 F3), and the stop's SIGTERM found it ended
    already. A job that catches SIGTERM, saves and exits 0 also ends COMPLETED 0:0, signalled:
    it is requeued. The record is the job user's word: a forged one can only end that user's
    own job by an exit of its choosing rather than requeued."""
    if own is not None:
        return not own.signalled
    own_exit = (j.state == "COMPLETED" and j.exit_code == 0) or j.state == "FAILED"
    return term_refused and own_exit


def node_failed(st: Stopping, j: SlurmJob | None) -> bool:
    """Pure: whether Slurm ended a stopped run `NODE_FAIL` (its node given up): its end is
    Slurm's decision, not its processes' (`ends.node_fail_ending` says when they are gone;
    until then the stop goes on, its GPUs `stopping`: atk37-23 F7)."""
    return (
        st.run is not None and j is not None and j.ended and j.started
        and end_reason(j.state) == "node_failure"
    )  # fmt: skip


def note_unanswered(
    stopping: Mapping[str, Stopping], view: Mapping[str, SlurmJob], away: Set[str]
) -> None:
    """Pure (it marks the stops): each stop of a started run one of whose nodes the last read of
    the nodes showed not responding or DOWN (`away`) is `unanswered` while they do, and for good
    once Slurm has ended it so: Slurm takes a job whose slurmd it cannot reach for ended on its
    own word alone (`unseen_end`). A node that answers again before Slurm's end delivers the
    stop's kill itself: a stop flagged once, briefly, was judged by the NODE_FAIL rules for good
    (its end held in doubt, recorded late). The durable facts (`stop_loop.judge`: its marks
    outlived Slurm's end, its slurmd started again during the stop; `kept` on disk) hold too."""
    for slurm_id, st in stopping.items():
        j = view.get(slurm_id)
        if j is None or not j.started or st.kept or (st.unanswered and j.ended):
            continue
        st.unanswered = bool(away & {*st.gpus, *j.gpus, *expand_hostlist(j.nodes)})


def unseen_end(st: Stopping | None, j: SlurmJob | None) -> bool:
    """Pure: whether Slurm ended a run being stopped (`st`) without its processes' end: it ended
    it NODE_FAIL, or by its own cancel or limit (`SLURM_ENDS_FIRST`: the executor's `scancel`,
    Slurm's TIMEOUT) while one of its nodes did not answer (`Stopping.unanswered`). A job
    COMPLETING after a `scancel` ends when its slurmd says its processes are gone; on a node
    whose slurmd is dead Slurm ends it CANCELLED, not NODE_FAIL, when it gives the node up, and
    its processes live on under slurmstepd (atk43s F8: such a run was recorded ended then, and
    the next job ran on its GPUs beside it once the node returned). Its end is then decided as
    a NODE_FAIL run's (`ends.node_fail_ending`), its GPUs held until then."""
    if st is None or j is None or not (j.ended and j.started):
        return False
    return end_reason(j.state) == "node_failure" or (st.unanswered and j.state in SLURM_ENDS_FIRST)


def outlived(
    j: SlurmJob | None, beat: float | None, signalled: float | None, kill_wait_s: float
) -> bool:
    """Pure: whether a stopped run's own marks prove its processes outlived Slurm's end of it
    (its cancel or limit, `SLURM_ENDS_FIRST`): its script beat (`beat`, the `alive` mark's
    ctime) later than Slurm's SIGKILL, `kill_wait_s` after its EndTime, could have let it (two
    beats and the EndTime's rounding after: a loaded slurmd's RPCs), or noted a signal
    (`signalled`, its ctime) as long after that EndTime: a TERM only a slurmd that came back
    could send. Slurm then ended it on
    its word alone (a node whose slurmd did not answer: `unseen_end`), however its nodes
    answer now. These are durable facts: a service restarted after the node came back never saw
    its slurmd away (atk44s F2, F2b: it took Slurm's CANCELLED for the processes' end and
    launched the job's next run, or another user's job, onto the GPUs beside them)."""
    if j is None or not (j.ended and j.started) or j.state not in SLURM_ENDS_FIRST:
        return False
    if j.end_time is None:
        return False
    slack = OWN_END_SLACK_S + 2 * BEAT_EVERY_S  # the EndTime's rounding, Slurm's RPCs
    late_beat = beat is not None and beat > j.end_time + kill_wait_s + slack
    return late_beat or (signalled is not None and signalled > j.end_time + slack)


def slurmd_restarted(st: Stopping, j: SlurmJob | None, started: Mapping[str, float]) -> bool:
    """Pure: whether a slurmd of a stopped run's nodes started again after the stop began
    (`started`: node -> its `SlurmdStartTime`), and Slurm ended the run by its cancel or limit:
    the slurmd that had the kill to deliver was away during the stop, so that end is Slurm's
    word alone (`unseen_end`), however the node answers now. Slurm's own record: a service
    restarted only after the node came back, within KillWait of Slurm's end, has no read of the
    slurmd away and no mark late enough for `outlived` (atk44s F2)."""
    if j is None or not (j.ended and j.started) or j.state not in SLURM_ENDS_FIRST or st.since <= 0:
        return False
    nodes = {*st.gpus, *j.gpus, *expand_hostlist(j.nodes)}
    return any(started.get(n, 0.0) > st.since for n in nodes)


def outage_of(
    away: tuple[float, float] | None, settle_s: float, stopped_at: float | None
) -> tuple[tuple[float, float] | None, float]:
    """Pure: the outage whose rule (`words.real_end`) applies to the end of a run the executor
    stopped at its limit (`stopped_at`: when it sent the stop; None: not stopped): none when
    it sent it once slurmctld answered again (at or after the outage's end, `away[1]`), for the
    run lived until then, and the end of that stop is slurmctld's own word, made while it
    answered (atk43s F9: a run whose limit passed in an outage and which the executor stopped
    at its return was recorded ended at its last sighting before the outage, 31.7 s of its
    38 s uncharged)."""
    if away is not None and stopped_at is not None and stopped_at >= away[1]:
        return None, settle_s
    return away, settle_s


def stopped_end(
    st: Stopping,
    j: SlurmJob,
    now: float,
    completing_seen: float | None = None,
    failed: Ending | None = None,
    by_itself: bool = False,
    outage: tuple[tuple[float, float] | None, float] = (None, 0.0),
    record: tuple[OwnEnd | None, float | None] = (None, None),
    never_ran: bool = False,
    launched: float | None = None,
    kill_wait_s: float | None = None,
) -> Exit:
    """Pure: a stopped run's real end as Slurm kept it (its EndTime, exit code and state), or,
    when its processes outlived the EndTime of a scancel (seen COMPLETING after it:
    `completing_seen`), the read that found them gone (`processes_end`), as for every gang
    (a job of several nodes) the executor killed: its ranks on other nodes die by Slurm's end
    of the job after that EndTime, seen COMPLETING or not. A run Slurm ended
    NODE_FAIL (`node_failed`) ended as `failed` says (`ends.node_fail_ending`: its own end
    record, else KillWait after Slurm's kill reached it, then killed), never at Slurm's
    EndTime, which its processes outlive by up to KillWait. `by_itself`: its command ended
    before the stop's signal reached it (`ended_by_itself`). A stopped run that ended in an
    outage of slurmctld (`outage`: the executor's last one and its settle time) by itself, or
    after a stop begun before the controller answered again, and was not killed by the
    executor's `scancel`, ended when it was last seen running, as any run does (`real_end`;
    atk39-24 F6: such a run was recorded ended at the late EndTime the returning controller
    gave it). One that ended by itself ended as its own end record says (`record`: it, and its
    script's last beat; `ends.own_finish`), not at Slurm's late word nor at its last sighting
    (atk42-24 F3). A run the executor killed after its grace that wrote its own end record
    ended as that record says (its code; its time kept after its start and last beat): Slurm's
    end is the kill's, late when a slurmctld that lost its state listed the ended run running
    (atk45s F2: recorded 15-23 s late, exit 0, killed). `never_ran`: its script ended it before
    its command started, the stop having come first (`launching.stop_marks`, atk43s F10): its
    note says so. `launched`: its
    script's launch mark, its own start (`Exit.started_at`; no earlier than Slurm's StartTime,
    no later than its end), which the ledger keeps for a run it stopped before recording its
    start, its command having run (atk44s F3).
    A run whose script left a step of the job's alive (`OwnEnd.steps`) ends as a gang does.
    A gang no read of this service saw alive since it took the stop up (`seen_running_at`: a
    restart found it ended) ended by Slurm's end of the job, `kill_wait_s` (KillWait) after its
    batch step's whole-second EndTime and a kill's landing (`KILL_LANDS_S`) at most, or at the
    read if sooner: not at the restart's read (atk59 F4: 62.4 s late after a 60 s outage of the
    service)."""
    assert st.run is not None
    # after its SIGKILL Slurm says FAILED 0:9; its steps (`srun`) die KillWait later meanwhile;
    # a gang's on its other nodes die by Slurm's end of the job after its batch step's, out of
    # the executor's sight, and a loaded read may see none of it COMPLETING: its end is the
    # read that found it ended (s56: a rank alive 5.4 s past the batch step's EndTime), killed
    # or ended in its grace (its batch script out first: Slurm's EndTime is the script's)
    own = record[0]
    # a single node's run whose command left a step (`srun`) alive as its script ended: its
    # processes die by Slurm's end of the job too, as a gang's (atk60-slurm F2: 10 s early)
    gang = len(expand_hostlist(j.nodes)) > 1 or (own is not None and own.steps)
    # its batch script's own end SIGKILLed it after the grace (`script._beating`), the
    # executor's SIGKILL never sent (the service down: atk59b N3): killed all the same
    cut = failed is None and not (by_itself or never_ran) and own is not None and own.signalled
    cut = cut and own is not None and own.killed  # (forged: only its user's own run's word)
    killed = st.killed or cut
    seen = now if gang else completing_seen
    end = processes_end(j.end_time, "CANCELLED" if killed or gang else j.state, now, seen)
    unwatched = gang and st.seen_running_at is None  # since the stop was taken up (atk59 F4)
    if unwatched and end is not None and j.end_time is not None and kill_wait_s is not None:
        end = min(end, end_of_job(j.end_time, kill_wait_s))
    at = high = now if end is None else min(now, end)
    away, settle_s = outage
    in_outage = (
        failed is None and not killed and away is not None and (by_itself or st.since <= away[1])
    )
    if in_outage:
        at = real_end(at, now, st.seen_running_at, away, settle_s)
    note = f"Slurm: {j.state}" + (", killed after its grace" if killed else "")
    note += " (by its batch script's own end: the executor's SIGKILL never came)" * cut
    state = "KILLED" if killed else j.state
    code = j.exit_code
    low = max((t for t in (j.start_time, record[1]) if t is not None), default=None)
    if by_itself and failed is None:
        code, at, _ = own_finish(own, j.state, code, at, low, high)
    elif cut:  # its record's code and end; a gang's ranks elsewhere die by Slurm's end of the
        # job after its batch script's record (KillWait): no earlier than that (`end_of_job`)
        code, t, _ = own_finish(own, "", code, at, low, high)
        at = at if gang else t
    elif (st.killed or in_outage) and failed is None and not never_ran and own is not None:
        # its own record: its command ended then, with that code; Slurm's end is the kill's,
        # late when a rewound slurmctld listed it running after that end (atk45s F2); a stop
        # begun before an outage of slurmctld whose kill could not be sent ended when its
        # record says, not at its last sighting before the outage (atk48-23 F2: 27 s early)
        code, at, _ = own_finish(own, "", code, at, low, high)
        after = "after its grace" if st.killed else "after an outage of slurmctld"
        note, state = f"Slurm: {j.state} {after}; its own end record", j.state
    if failed is not None:
        at, code, note = min(now, failed.at), failed.exit_code, f"{note}; {failed.note}"
        state = "KILLED" if killed or failed.reason == "node_failure" else j.state
    if by_itself and failed is None:
        note += ", ended by itself before the stop reached it"
    if never_ran:
        note += "; stopped before its command started: the command never ran"
    began = None if never_ran or launched is None else max(launched, j.start_time or launched)
    return Exit(st.run[0], code, at, "exited", j.slurm_id, state, note, run=st.run[1],
                by_itself=by_itself and failed is None,
                started_at=None if began is None else min(began, at))  # fmt: skip


def end_of_job(end_time: float, kill_wait_s: float) -> float:
    """Pure: by when Slurm's end of a job has killed the processes of every step on every node,
    from its batch step's EndTime (whole seconds): KillWait after its SIGTERM, and a kill's
    landing (`KILL_LANDS_S`)."""
    return end_time + 1.0 + kill_wait_s + KILL_LANDS_S


def ended_by_slurm(at: float, j: SlurmJob, now: float, kill_wait_s: float, steps: bool) -> float:
    """Pure: the end of a run Slurm itself ended (its TIMEOUT, a plain `scancel`: `at`, from its
    EndTime and its script's beat, `ends.limit_kill_end`) unseen COMPLETING, whose processes
    include a step's the batch script does not hold (a gang's ranks, or `steps`: a step left
    alive on its one node, `OwnEnd.steps`): they die by Slurm's end of the job (`end_of_job`),
    so no earlier than that, nor after `now` (atk60-slurm F3: a gang's TIMEOUT while the
    service was down was recorded 1.7 s before its last rank died, at its batch node's beat)."""
    if j.end_time is None or not (steps or len(expand_hostlist(j.nodes)) > 1):
        return at
    return max(at, min(now, end_of_job(j.end_time, kill_wait_s)))


def forgotten_end(
    st: Stopping, slurm_id: str, own: OwnEnd | None, beat: float | None, now: float,
    window_s: float,
) -> Exit | None:  # fmt: skip
    """Pure: the end of a stopped run Slurm no longer knows (`scancel`: "Invalid job id"; a
    state loss made slurmctld forget it, or it was purged), from its marks alone: its own end
    record; else, once its last beat is `window_s` (`ends.beat_window`) old, a beat after it
    (killed: Slurm's kill or the node's loss, not its own end); None while the beat is fresh
    (its processes may live: its GPUs stay held). Before, such a stop was dropped with no end
    reported: the run's end was never recorded and its job waited for good (a drain's
    preemption after a state loss, found by test_slurm_ctldloss)."""
    assert st.run is not None
    if own is not None:
        note = "Slurm no longer lists it: its own end record"
        return Exit(st.run[0], own.exit_code, min(now, own.at), "exited", slurm_id,
                    "CANCELLED", note, run=st.run[1])  # fmt: skip
    if beat is not None and now - beat < window_s:
        return None
    at = min(now, (beat + BEAT_EVERY_S) if beat is not None else st.since)
    note = "Slurm no longer lists it and it wrote no end record: killed"
    return Exit(st.run[0], 137, at, "exited", slurm_id, "KILLED", note, run=st.run[1])


def resumed(j: SlurmJob, tag: Tag, since: float | None, grace_s: float,
            gpus: Mapping[str, tuple[int, ...]] | None = None) -> Stopping | None:  # fmt: skip
    """Pure: a stop of `j` (run `tag`) taken up after a restart, as it would have gone on: one
    Slurm has ended is carried to its recorded end (`since`: its noted stop, else the ledger's);
    one whose SIGTERM was sent (`since`, noted) gets the rest of its grace and no second SIGTERM
    (atk39-24 F2); None for one never signalled (or never started), which is stopped as any stop
    from now (its whole grace). `gpus`: the run's, as the ledger placed it (held while in doubt)."""
    if not j.ended and (since is None or j.state in WAITING):
        return None
    return Stopping(0.0 if since is None else since, cancelled=j.ended, grace_s=grace_s, run=tag,
                    gpus=dict(gpus or {}))  # fmt: skip


def killing_from(sr: StoppedRun | None, grace_s: float) -> float | None:
    """Pure: when the grace (`grace_s`) of a stop the ledger recorded (`sr`) counts from, for
    one a restart of the service finds never signalled (killed -9 between the cancel and its
    SIGTERM): its stop, so that its SIGKILL comes when every read said it would
    (`reads.stopping.stopped_kill_at`; at the second cancel for one ordered killed), at once
    when that has passed (atk47-23 F3, F9: it got a whole new grace from the restart while the
    reads showed a SIGKILL time long past). None for a stop the ledger holds none of (a stray):
    its whole grace from now."""
    if sr is None:
        return None
    if sr.kill:
        return (sr.at if sr.killed_at is None else sr.killed_at) - grace_s
    return sr.at


def still_ended(reported: Set[str], view: Mapping[str, SlurmJob]) -> set[str]:
    """Pure: of the stops whose end the executor reported (`SlurmExecutor._reported`, which
    `resumed_stops` skips), those Slurm still lists ended. One it no longer lists is forgotten;
    one it lists again not ended was brought back by a slurmctld restart that lost its end or
    its cancel, and is stopped again as any run the ledger no longer runs (atk45s F5: two runs
    the executor took back were run to completion by Slurm, unseen)."""
    return {i for i in reported if (j := view.get(i)) is not None and j.ended}


def resumed_stops(
    view: Mapping[str, SlurmJob],
    stopped: Mapping[Tag, StoppedRun],
    skip: Container[str],
    ledger_id: str,
    partition: str,
    noted: Callable[[str], float | None],
    job_grace: Callable[[int], float | None],
    service_s: float,
) -> list[tuple[SlurmJob, Stopping | None, float]]:
    """Pure but for `noted` (the stop's note): the runs of this ledger on its partition that
    Slurm lists and the executor does not carry (`skip`: its stops, runs and ends reported) that
    it must stop or see end: those the ledger stopped whose end is not recorded (`stopped`:
    `State.stopped_runs`), and any other it still runs (a stray: cancelled while the service was
    down), each with its stop taken up (`resumed`; None: never signalled) and its grace. A stop
    lives in the service's memory; a restart rebuilds it from the ledger and Slurm, so a run that
    completed while the service was down is recorded ended and its job never run again
    (atk39-24 F1)."""
    out: list[tuple[SlurmJob, Stopping | None, float]] = []
    for j in sorted(view.values(), key=lambda j: j.slurm_id):
        tag = j.tag(ledger_id)
        if tag is None or j.partition != partition or j.slurm_id in skip or j.het_component:
            continue  # (a later component is its first's: stopped with it, atk59 F3)
        sr = stopped.get(tag)
        if sr is None and j.ended:
            continue
        if j.grace_s is None and sr is not None:  # the ledger's rule (`StoppedRun.grace`)
            grace = sr.grace(service_s)
        else:
            grace = bounded_grace(job_grace(tag[0]) if j.grace_s is None else j.grace_s, service_s)
        since = noted(j.slurm_id)
        gpus: dict[str, tuple[int, ...]] = {}
        for sl in sr.slots if sr is not None else ():
            gpus[sl.node] = (*gpus.get(sl.node, ()), *sl.gpu_indices)
        at = since if since is not None or not j.ended or sr is None else sr.at
        out.append((j, resumed(j, tag, at, grace, gpus), grace))
    return out


def unplaceable(launch: Launch, unusable: Set[str]) -> str:
    """Pure: the node of `launch` it may not be submitted onto now ("" if none): one the ledger
    counts lost or Slurm shows DOWN (atk39-24 F3: a restart submitted a placement onto a lost
    node, beside runs in doubt there; Slurm starts it as soon as the node returns)."""
    return next((sl.node for sl in launch.slots if sl.node in unusable), "")


def in_service(nodes: Mapping[str, Node]) -> frozenset[str]:
    """Pure: the ledger's nodes in service (all of them are the partition's)."""
    return frozenset(n for n, x in nodes.items() if x.state != "removed")


def lost_in(state: State) -> frozenset[str]:
    """Pure: the nodes the ledger counts lost (`NodeLost`, not returned yet)."""
    return frozenset(n for n, x in state.nodes.items() if x.state == "lost")


def tagged(view: Mapping[str, SlurmJob], ledger_id: str, job_id: int, run: int) -> SlurmJob | None:
    """Pure: the Slurm job of run `run` of `job_id` (its tag), None when Slurm lists none."""
    return next((j for j in view.values()
                 if j.tag(ledger_id) == (job_id, run) and not j.het_component), None)  # fmt: skip


def earlier_alive(
    view: Mapping[str, SlurmJob],
    ledger_id: str,
    job_id: int,
    run: int,
    stopping: Mapping[str, Stopping],
) -> SlurmJob | None:
    """Pure: a Slurm job of an earlier run of `job_id` that may be alive (the launch fence): not
    ended, or ended by Slurm while its processes may live on (`Stopping.in_doubt`: `unseen_end`)."""
    for j in view.values():
        tag = j.tag(ledger_id)
        if tag is None or tag[0] != job_id or tag[1] >= run:
            continue
        if not j.ended or ((st := stopping.get(j.slurm_id)) is not None and st.in_doubt):
            return j
    return None


def grace_in(state: State, job_id: int, service_s: float) -> float | None:
    """Pure: the grace a stop of a job's run gets, by the one rule of the agents and of every
    read (`Job.grace`: its own, else the service's when its run was placed, else `service_s`,
    the executor's current one; at most `MAX_GRACE_S`: atk49-23 F1); None: the ledger holds
    no such job."""
    job = state.jobs.get(job_id)
    return None if job is None else job.grace(service_s)


def completing(
    view: Mapping[str, SlurmJob], mine: set[str], seen: Mapping[str, float], now: float
) -> dict[str, float]:
    """Pure: `seen` (our Slurm job -> the last read showing it COMPLETING) for the jobs still
    `mine`, with those COMPLETING now at `now` (`processes_end` reads it)."""
    out = {k: v for k, v in seen.items() if k in mine}
    out.update({k: now for k in mine if (j := view.get(k)) is not None and j.state == "COMPLETING"})
    return out


def stopping_gpus(
    stopping: Mapping[str, Stopping],
    view: Mapping[str, SlurmJob],
    pinned: Mapping[str, tuple[str, ...]],
) -> dict[str, frozenset[int]]:
    """Pure: the GPUs (node -> indices) of the runs the ledger stopped that Slurm has not ended
    yet: running through their grace, or COMPLETING (SIGTERM ignored until KillWait). Slurm
    starts nothing on them meanwhile, so `node list` shows them held (`Observed.stopping`).
    Also those of a stop Slurm ended without its processes' end (`unseen_end`: NODE_FAIL, or
    its cancel on a node that did not answer), from the stop on, while it is here: Slurm would
    start the next job there, so the executor holds them itself (`_held`)."""
    out: dict[str, set[int]] = {}
    for slurm_id, st in stopping.items():
        j = view.get(slurm_id)
        if st.run is None or j is None or (j.ended and not st.in_doubt and not unseen_end(st, j)):
            continue  # (one Slurm ended NODE_FAIL is held from the stop on: atk38-24 F7)
        held = (st.gpus or ended_gpus(j, pinned)) if j.ended else held_gpus(j, pinned)
        for node, idx in held.items():
            out.setdefault(node, set()).update(idx)
    return {n: frozenset(i) for n, i in out.items()}


def grace_of(
    launch: Launch | None,
    seen: SlurmJob | None,
    job_grace: Callable[[], float | None],
    service_s: float,
) -> float:
    """Pure: a stopped run's grace: its launch's (`submit --grace`); for a run adopted after a
    restart, its Slurm comment's (atk34-23 F2: the live state holds no finished job, so a run
    cancelled across a restart got the service's), else the ledger's word; else the service's.
    A job's own grace is at most `MAX_GRACE_S` (`bounded_grace`), however it was recorded."""
    if launch is not None:
        grace = launch.grace_s
    else:
        grace = None if seen is None else seen.grace_s
        grace = job_grace() if grace is None else grace
    return bounded_grace(grace, service_s)


def bounded_grace(own: float | None, service_s: float) -> float:
    """Pure: the grace a stopped run gets: its job's own (`submit --grace`, its Slurm comment,
    the ledger's word) at most `MAX_GRACE_S`, as on the agents (`schemas.bounds.job_grace`):
    a job recorded with an hour before the cap (its comment `grace=3600`) no longer outlives its
    limit or a cancel by an hour, nor does Slurm's `--time` backstop wait for it (atk46-23 F7);
    none of its own: the service's, under the same cap (`serve --grace` above it is refused)."""
    return capped_grace(own, service_s)


def no_grace(_: int) -> float | None:
    """No job's own grace (nor time limit) is known (an executor built without its ledger)."""
    return None


def limit_in(state: State, job_id: int) -> float | None:
    """Pure: a job's time limit in seconds (`submit -t`) as the ledger holds it; None: none."""
    job = state.jobs.get(job_id)
    return None if job is None else job.spec.time_limit_s


def run_gpus(j: SlurmJob, pinned: Mapping[str, tuple[str, ...]]) -> tuple[GpuSlot, ...]:
    """Pure: the GPUs a started run got, as Slurm says: `-d`'s IDX while it holds them; once
    it has ended (first seen then, or adopted after a restart) its JOB_GRES on pinned nodes;
    else none, and the ledger records the placement's (Slurm was asked for exactly those:
    `decide`'s StartJob)."""
    got = {n: i for n, i in j.gpus.items() if i} or ended_gpus(j, pinned)
    return tuple(GpuSlot(node=n, gpu_indices=i) for n, i in sorted(got.items()))


def placed_gpus(
    launch: Launch | None, j: SlurmJob, pinned: Mapping[str, tuple[str, ...]]
) -> dict[str, tuple[int, ...]]:
    """Pure: a run's GPUs by node: its launch's, else (adopted) what Slurm's record says."""
    if launch is not None:
        return {sl.node: tuple(sl.gpu_indices) for sl in launch.slots}
    return ended_gpus(j, pinned)


def gpus_differ(launch: Launch | None, j: SlurmJob) -> str:
    """Pure: how the GPUs Slurm gave a running job differ from the ledger's ("" if not)."""
    if launch is None:
        return ""
    want = {sl.node: tuple(sl.gpu_indices) for sl in launch.slots}
    got = {n: tuple(i) for n, i in j.gpus.items() if i}
    if j.holding and got and got != want:
        return f"Slurm gave GPUs {got}, the ledger chose {want}"
    return ""


@dataclass
class Quarantine:
    """GPUs of runs Slurm ended NODE_FAIL whose end came from their own record (`Ending.
    own_record`): held, though the run is recorded ended, until `ends.surely_gone` says Slurm's
    kill has landed and its heartbeat, if it has one, has stopped (`refresh`). Slurm id ->
    (node -> indices, Slurm's EndTime)."""

    runs: dict[str, tuple[Mapping[str, tuple[int, ...]], float | None]] = field(
        default_factory=dict
    )

    def hold(self, ending: Ending | None, j: SlurmJob | None,
             gpus: Mapping[str, tuple[int, ...]]) -> None:  # fmt: skip
        """Hold a NODE_FAIL run's GPUs when its `ending` came from its own record."""
        if ending is not None and ending.own_record and j is not None and gpus:
            self.runs[j.slurm_id] = (gpus, j.end_time)
            self.windows[j.slurm_id] = ending.beat_window_s
            self.written[j.slurm_id] = ending.written
            for node, idx in gpus.items():  # held at once, not from the next `refresh` on
                self.held[node] = tuple(sorted({*self.held.get(node, ()), *idx}))

    held: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The GPUs still held (node -> indices), as of the last `refresh`."""
    windows: dict[str, float] = field(default_factory=dict)
    """Slurm id -> how long after its last beat the run may live (`ends.beat_window`)."""
    written: dict[str, float | None] = field(default_factory=dict)
    """Slurm id -> when its own end record was written: no later beat counts
    (`ends.record_beat`: a touch of its mark from outside Slurm held an ended run's GPUs,
    atk42-24 F1)."""

    def refresh(
        self,
        answering: Mapping[str, float],
        kill_wait_s: float,
        now: float,
        beat: Callable[[str, float], float | None] = lambda _, __: None,
    ) -> None:
        """Forget the runs surely gone (`answering`: node -> since when its slurmd answers) whose
        heartbeat, if they have one (`beat`: Slurm id, now -> its last beat), is its window old
        (`ends.beat_window`; `BEAT_STALE_S` at least): a record written while the run lives, on
        a node whose kill never comes, must not free its GPUs (atk39-24 F5); `held` is what the
        others hold."""
        out: dict[str, tuple[int, ...]] = {}
        for slurm_id, (gpus, end) in list(self.runs.items()):
            since = [answering.get(n) for n in gpus]
            first = None if None in since else max(s for s in since if s is not None)
            last = record_beat(beat(slurm_id, now), self.written.get(slurm_id))
            last = last if surely_gone(end, first, kill_wait_s, now) else now
            if last is None or now >= last + self.windows.get(slurm_id, BEAT_STALE_S):
                del self.runs[slurm_id]
                self.windows.pop(slurm_id, None)
                self.written.pop(slurm_id, None)
                continue
            for node, idx in gpus.items():
                out[node] = tuple(sorted({*out.get(node, ()), *idx}))
        self.held = out


def signalled_past_limit(r: Run, own: OwnEnd | None) -> bool:
    """Pure: its own end record says a signal ended it at or past its time limit, counted from
    Slurm's start: Slurm's backstop (TIMEOUT, then KillWait's SIGKILL) while the service that
    keeps the exact limit was down, a run Slurm no longer lists (CI, stop 55 and 56:
    `test_slurms_own_timeout_while_the_service_is_down_ends_when_the_job_died` read `failed`)."""
    limit = r.launch.time_limit_s if r.launch is not None else None
    return (own is not None and own.signalled and limit is not None
            and r.started_at is not None and own.at >= r.started_at + limit)  # fmt: skip


def vanished_end(
    r: Run, slurm_id: str, sacct: str, now: float, own: OwnEnd | None = None,
    low: float | None = None,
) -> Exit | None:  # fmt: skip
    """Pure: the end of a run Slurm no longer lists (past MinJobAge, or the controller lost its
    state), from `sacct`'s rows ("" without accounting: `lost`, now); None while sacct says it
    waits or runs. Its own end record (`own`), where Slurm did not decide its end, says how and
    when it ended (`ends.own_finish`, kept after `low`): a run that exited 0 while slurmctld
    was away and that the returning controller no longer lists completed (atk42-24 F2)."""
    state, code, at = sacct_end(sacct, now) if sacct else ("", -1, now)
    if state in WAITING or state in HOLDING:
        return None
    reason: EndReason = end_reason(state) if state in ENDED else "lost"
    # unsignalled on a node Slurm gave up: it ended by itself, as `ends.node_fail_ending` rules
    itself = state == "NODE_FAIL" and own is not None and not own.signalled
    if state not in SLURM_ENDS_FIRST or itself:
        code, at, mine = own_finish(own, state if state in ENDED else "", code, at, low, at)
        reason = "exited" if mine and reason in ("lost", "node_failure") else reason
    if r.limited and (state in ENDED or (own is not None and own.signalled)):
        reason = "time_limit"  # stopped at its limit: so too by its own record of the signal
    elif reason != "time_limit" and signalled_past_limit(r, own):
        reason = "time_limit"  # Slurm's backstop while no service stopped it (the service down)
    return Exit(r.job_id, code, at, reason, slurm_id, state or "UNKNOWN")


def own_ends_first(
    changes: list[NodeChange], exits: list[Exit], completing: bool, held_since: float | None,
    now: float, settle_s: float,
) -> tuple[list[NodeChange], list[Exit], list[Exit], frozenset[str], float | None]:  # fmt: skip
    """Pure: (node changes, exits) to record now, the exits held back for the next read, the
    nodes unobserved meanwhile, and since when a loss waits. A run that ended by itself on a
    node Slurm has just given up (a slurmd away leaves it COMPLETING, its exit known, until
    Slurm marks the node DOWN) is recorded as it ended, before the node's loss, which would
    requeue or fail it: a completed job is never run again. While one of our runs is
    COMPLETING (`completing`) or has just ended, the loss and the runs that ended with the
    node (NODE_FAIL) wait for the next read, the node unobserved meanwhile; at most `settle_s`
    from `held_since`."""
    lost = frozenset(ch.node for ch in changes if ch.change == "lost")
    own = [x for x in exits if x.reason != "node_failure"]
    if not lost or not (own or completing):
        return changes, exits, [], frozenset(), None
    since = now if held_since is None else held_since
    if now - since > settle_s:
        return changes, exits, [], frozenset(), since
    later = [x for x in exits if x.reason == "node_failure"]
    return [ch for ch in changes if ch.change != "lost"], own, later, lost, since
