"""The Slurm executor's stops, read by read (an edge: it reads the runs' marks and runs
`scancel`): the runs the ledger no longer runs, carried from the stop's SIGTERM through the
job's grace to `scancel` and their recorded end (`carry_stops`), and the stops a restart of
the service takes up again from the ledger and Slurm (`resume_stops`). The judgement is pure, in
`ledger.engines.slurm.stops` and `ledger.engines.slurm.ends`; this is the loop that applies it to
the executor's state (`SlurmExecutor._read_runs`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ledger.engines.slurm.cluster import kill_args, scancel_args
from ledger.engines.slurm.launching import (
    LAUNCHED,
    forgotten_stop,
    last_beat,
    mark_time,
    reaped_before,
    signalled_at,
    stop_marks,
)
from ledger.engines.slurm.stops import (
    GONE_ALREADY,
    KILL_LANDS_S,
    Stopping,
    ended_by_itself,
    kill_due,
    killing_from,
    outlived,
    real_term,
    resumed_stops,
    slurmd_restarted,
    still_ended,
    stopped_end,
    unseen_end,
)
from ledger.engines.slurm.strays import note_started_stops, take_up_strays, with_starts
from ledger.engines.slurm.tracked import (
    forget_stop,
    note_killed,
    note_unheard,
    noted_killed,
    noted_stop,
    noted_unheard,
)
from ledger.engines.slurm.words import SlurmJob, held_gpus
from schemas.errors import EngineError

if TYPE_CHECKING:
    from ledger.engines.slurm.executor import SlurmExecutor

log = logging.getLogger("gpuledger.slurm")


def resume_stops(ex: SlurmExecutor, now: float) -> None:
    """The runs of ours to stop that the executor does not carry (a restart: stops live in
    its memory alone), taken up as an uninterrupted stop would go on (`resumed_stops`): one
    never signalled gets its SIGTERM now and its SIGKILL when the ledger's stop and its grace
    say (`killing_from`, at once when that has passed: atk47-23 F9; a stray, its whole grace);
    one that was gets what is left of its grace from its noted SIGTERM, and no second one
    (atk39-24 F1, F2)."""
    ex._reported = still_ended(ex._reported, ex._view)  # listed alive again: stopped (F5)
    take_up_strays(ex, now)  # a stray's stop a second kill cut short (atk46-s F1)
    skip = {r.slurm_id for r in ex._runs.values() if r.slurm_id} | set(ex._stopping)
    for j, st, grace in resumed_stops(
        ex._view, ex.stopped_runs(), skip | ex._reported, ex.ledger_id,
        ex.partition, lambda i: noted_stop(ex.log_dir, i), ex.job_grace, ex.grace_s,
    ):  # fmt: skip
        log.warning("slurm job %s is a run the ledger no longer runs: stopping it", j.slurm_id)
        if st is None:  # never signalled: SIGTERM now, SIGKILL when the reads say (F9)
            tag = j.tag(ex.ledger_id)
            since = killing_from(ex.stopped_runs().get(tag), grace) if tag else None
            ex._signal(j.slurm_id, now, grace, tag, since)
        else:
            st.unanswered = st.kept = noted_unheard(ex.log_dir, j.slurm_id)  # as judged (F2)
            if (killed_at := noted_killed(ex.log_dir, j.slurm_id)) is not None:  # (atk59 F4)
                st.cancelled = st.killed = True
                st.kill_sent_at, st.scancelled = (
                    (None, True) if st.unanswered else (killed_at, False)
                )
            ex._stopping[j.slurm_id] = st


def carry_stops(ex: SlurmExecutor, now: float) -> None:
    """One read's step for every stop the executor carries: the GPUs it holds, whether Slurm's
    end of it is its processes' (`unseen_end`: else held in doubt until known gone), its
    recorded end once Slurm has ended it (`stopped_end`) or forgotten it (`forgotten`), and
    `scancel` once its grace has passed, at once for a run the ledger ordered killed (a second
    cancel: `StoppedRun.kill`, atk46-23 F7)."""
    note_started_stops(ex, now)  # a stop of a run never recorded started: on disk (F1)
    reported = len(ex._stopped)
    # cancelled again (F7), or its grace from the recorded stop has passed: a restart between
    # the stop and its SIGKILL gives no new grace (atk47-23 F3, F9)
    ordered = {tag for tag, sr in ex.stopped_runs().items() if sr.kill_due(now, ex.grace_s)}
    for slurm_id, st in list(ex._stopping.items()):  # 2. stops: the grace, then scancel
        if st.run in ordered:  # no grace left: SIGKILL now (a cancel past its limit too)
            st.grace_s, st.limit = 0.0, False
        j = ex._view.get(slurm_id)
        theirs = j is not None and st.run is not None and j.tag(ex.ledger_id) != st.run
        j = None if theirs else j  # its id names another job (atk43s F5, atk44ha F1)
        st.gpus = (held_gpus(j, ex._pinned) if j is not None else {}) or st.gpus
        if j is not None and j.holding and not j.ended and now >= (ex._settle_until or 0):
            st.seen_running_at = now  # (`real_end`: a stopped run's end in an outage, F6)
        judge(ex, slurm_id, st, j, now)  # from durable facts too: a restart (atk44s F2)
        term_noted(ex, st, j, now)  # its limit's SIGTERM as the job saw it: the SIGKILL from it
        doubt = st.run is not None and unseen_end(st, j)  # NODE_FAIL, or its cancel unseen
        failed = ex._how_failed(st.run, None, None, j, now, st.grace_s) if doubt else None
        if doubt and failed is None:  # its processes may live: held (F7, atk43s F8)
            if not st.in_doubt and j is not None:
                log.warning("stopped Slurm job %s is %s, its processes' end unseen: held "
                            "until gone", slurm_id, j.state)  # fmt: skip
            st.in_doubt = True
        elif j is None and not theirs and not forgotten(ex, slurm_id, st, now):
            continue  # Slurm forgot it and its beat is fresh: its processes may live
        elif j is None or j.ended:
            ex._quarantine.hold(failed, j, st.gpus)
            del ex._stopping[slurm_id]
            if theirs:  # not its end: taken up again where it is listed (`resume_stops`)
                continue
            ex._reported.add(slurm_id)
            ex._seen.forget(slurm_id)
            forget_stop(ex.log_dir, slurm_id)
            seen = ex._completing.pop(slurm_id, None)
            if j is not None and st.run is not None and j.started:  # its processes' end
                run_dir = ex._checkpoint_file(*st.run).parent
                own, beat, first = stop_marks(run_dir, now)  # (`first`: never ran, F10)
                if own is None and failed is None:  # killed reaping its leftovers (atk54-23 F1)
                    own = reaped_before(run_dir, j.start_time or 0.0, st.since, now, st.grace_s)
                itself = failed is None and ended_by_itself(own, j, st.term_refused)
                # its launch mark: its own start, for a run stopped before any read saw it
                # start (the ledger keeps it only for such a run: atk44s F3)
                launched = None if first else mark_time(run_dir, LAUNCHED, now)
                ex._stopped.append(stopped_end(st, j, now, seen, failed, itself, (ex._away, ex.settle_s), (own, beat), first, launched, ex.kill_wait_s))  # fmt: skip  # noqa: E501
                if itself:  # its exit may end its job (F3; atk53-23 F3: any code)
                    ex._completed.add(st.run[0])
        elif st.limit and st.termed_at is None and not st.cancelled and ex.cluster.confirm(now):
            ex._signal(slurm_id, now, st.grace_s)  # its limit's SIGTERM, refused: again
        elif not st.cancelled and kill_due(st, now) and ex.cluster.confirm(now):
            kill(ex, slurm_id, st, now, None if j is None else j.tag(ex.ledger_id))  # (F3)
        elif unkilled(st, j, now) and ex.cluster.confirm(now):
            try:  # the SIGKILL did not land (its slurmd away): Slurm's own cancel
                ex._run(scancel_args(slurm_id, j.tag(ex.ledger_id) if j else st.run))
                st.scancelled = True
            except EngineError as err:
                st.scancelled = any(w in err.line() for w in GONE_ALREADY)
                log.warning("slurm job %s: %s", slurm_id, err.line())
    ex._stopped[reported:] = with_starts(ex, ex._stopped[reported:])  # their noted starts


def kill(
    ex: SlurmExecutor, slurm_id: str, st: Stopping, now: float, tag: tuple[int, int] | None = None
) -> None:
    """SIGKILL a stopped run whose grace has passed (or that the ledger ordered killed): its
    batch step's processes die at once (`cluster.kill_args`), where Slurm's own `scancel` gave
    them SIGTERM again and SIGKILL only `KillWait` later (atk47-s F3, atk47-23 F6: the reads'
    `kill_at` was `KillWait` early). One whose node does not answer (`Stopping.unanswered`)
    gets Slurm's own `scancel`, as before: no signal reaches it, and Slurm's end of it is then
    judged by `unseen_end`. Retried at the next read when Slurm refuses it."""
    args = (scancel_args if st.unanswered else kill_args)(slurm_id, tag or st.run)  # its name
    try:
        ex._run(args)
        note_killed(ex.log_dir, slurm_id, now)
        st.cancelled = st.killed = True
        st.kill_sent_at, st.scancelled = (None, True) if st.unanswered else (now, False)
    except EngineError as err:
        log.warning("slurm job %s: %s (retrying)", slurm_id, err.line())


def unkilled(st: Stopping, j: SlurmJob | None, now: float) -> bool:
    """Pure: whether a run's SIGKILL (`kill`) was sent `KILL_LANDS_S` ago and Slurm still lists
    it running, not even `COMPLETING`: its slurmd never got it."""
    return (
        st.kill_sent_at is not None and not st.scancelled and j is not None
        and j.state == "RUNNING" and now - st.kill_sent_at >= KILL_LANDS_S
    )  # fmt: skip


def term_noted(ex: SlurmExecutor, st: Stopping, j: SlurmJob | None, now: float) -> None:
    """A stop at its limit whose SIGTERM was asked: its time, once a read finds the job's own
    note of it (`real_term`), before `kill_due` counts its SIGKILL from it."""
    if not st.limit or st.term_asked_at is None or st.term_seen:
        return
    tag = st.run or (j.tag(ex.ledger_id) if j is not None else None)
    if tag is not None:
        noted = signalled_at(ex._checkpoint_file(*tag).parent)
        st.termed_at, st.term_seen = real_term(st.term_asked_at, noted, now)


def judge(ex: SlurmExecutor, slurm_id: str, st: Stopping, j: SlurmJob | None, now: float) -> None:
    """Whether Slurm's end of a stop is its word alone (`Stopping.unanswered`), from what lasts:
    a read that saw one of its nodes unheard (`note_unanswered`, kept on disk for a restart:
    `note_unheard`), its run's marks (`outlived`: a beat or a signal later than Slurm's kill
    of it could be), or its node's slurmd started again during the stop (`slurmd_restarted`),
    which a restart finds as the reads left them (atk44s F2, F2b)."""
    if st.run is not None and j is not None and j.ended and not st.unanswered:
        run_dir = ex._checkpoint_file(*st.run).parent
        if outlived(j, last_beat(run_dir, now), signalled_at(run_dir), ex.kill_wait_s):
            st.unanswered = True
            log.warning("stopped Slurm job %s (%s) outlived Slurm's end of it: its marks say "
                        "its processes lived on", slurm_id, j.state)  # fmt: skip
        elif slurmd_restarted(st, j, ex._slurmd_started):
            st.unanswered = True
            log.warning("stopped Slurm job %s (%s): its node's slurmd started again during the "
                        "stop: Slurm's end of it is its word alone", slurm_id, j.state)  # fmt: skip
    if st.unanswered and not st.kept and st.run is not None and j is not None and j.ended:
        note_unheard(ex.log_dir, slurm_id)  # decided: Slurm ended it so (its node's state now)
        st.kept = True


def forgotten(ex: SlurmExecutor, slurm_id: str, st: Stopping, now: float) -> bool:
    """A stop of a run Slurm no longer lists: its end from its marks, reported, else False."""
    run_dir = ex._checkpoint_file(*st.run).parent if st.run else None
    end = forgotten_stop(st, slurm_id, run_dir, now, ex.kill_wait_s) if run_dir else None
    ex._stopped += [end] if end is not None else []
    return end is not None or run_dir is None
