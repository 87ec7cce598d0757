"""What a Slurm executor that has just taken over (a new leader, a restart) does about the
submissions its predecessor may still have in flight (docs/ha.md, Limits; atk45ha F1).

An `sbatch` of the last leader (cut from the store, or killed while its `sbatch` child lives
on) may land after this executor has adopted Slurm's list: before, the new leader submitted
the run again at once ("placed but never reached the engine"), then took the late copy for
"a run the ledger no longer runs" and stopped it through the run's `stopping` mark, which its
own copy found first: it exited 143 ("the command never ran", though the late copy's had run)
and the job was recorded `failed`. Now:

1. a placed run Slurm did not list at the takeover waits (`in_flight`, `held`) until an `sbatch`
   begun before it has surely returned or been killed (the executor's sbatch timeout plus
   `MARGIN_S`); a Slurm job of the run's comment that appears meanwhile is adopted (as after a
   restart), and only then is the run submitted; not after a clean handover (`handed_over`:
   the last leader's worker had finished its cycle before it released the lease);
2. a second Slurm job of a run the executor carries under another id (`duplicates`: the same
   comment, a submission that landed later still) is cancelled without the run's marks, and
   nothing is recorded of it; the copy kept is the one whose command may have started when the
   other has not (its own is still pending), else the executor's own.

Pure but for `InFlight.waits` and `cancel_duplicates` (the edge: the executor's state, the log,
`scancel`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ledger.engines.slurm.cluster import scancel_args
from ledger.engines.slurm.stops import Stopping
from ledger.engines.slurm.words import WAITING, SlurmJob, expand_hostlist
from schemas.errors import EngineError
from schemas.units import when

if TYPE_CHECKING:
    from ledger.engines.slurm.executor import SlurmExecutor
    from ledger.engines.slurm.tracked import Run

log = logging.getLogger("gpuledger.slurm")

MARGIN_S = 5.0
"""Beyond the sbatch timeout: the kill of a timed-out sbatch, and the reads after it."""

Tag = tuple[int, int]


def in_flight(
    runs: Mapping[int, int], adopted: Iterable[int], now: float, timeout_s: float
) -> dict[Tag, float]:
    """Pure: the runs (job, run) the ledger holds (`runs`: job -> run, placed or running) that
    Slurm did not list at a takeover (`adopted`: the jobs it did), each with until when an
    `sbatch` of it begun by the last holder before `now` may still land (`timeout_s`: the
    sbatch timeout, the same on every server, + `MARGIN_S`)."""
    have = set(adopted)
    until = now + timeout_s + MARGIN_S
    return {(job, run): until for job, run in runs.items() if job not in have}


def held(tag: Tag, waiting: Mapping[Tag, float], now: float) -> float | None:
    """Pure: until when the submission of run `tag` waits (None: it does not), by `waiting`
    (`in_flight`)."""
    until = waiting.get(tag)
    return until if until is not None and now < until else None


def duplicates(
    view: Iterable[SlurmJob],
    carried: Mapping[Tag, tuple[str, bool]],
    ledger_id: str,
    partition: str,
) -> list[tuple[SlurmJob, str]]:
    """Pure: the Slurm jobs of `view` that are a second copy of a run the executor carries
    under another Slurm id (`carried`: (job, run) -> (its Slurm id, recorded started)), each
    with the Slurm id to keep: theirs when its command may have started (not waiting) while the
    executor's own has not (listed waiting, its start not recorded), else the executor's. A
    copy that has ended is none (it holds nothing; its end is not the run's), nor one judged
    while the executor's own is not listed (forgotten, or not listed yet), nor a later
    component of a heterogeneous job (`components`: its own, with the same comment)."""
    listed = {j.slurm_id: j for j in view}
    out: list[tuple[SlurmJob, str]] = []
    for j in sorted(listed.values(), key=lambda j: j.slurm_id):
        tag = j.tag(ledger_id)
        if tag is None or j.partition != partition or j.ended or tag not in carried:
            continue
        if j.het_component:  # part of its first component's job, never a copy (atk59 F3)
            continue
        ours, started = carried[tag]
        if ours == j.slurm_id:
            continue
        mine = listed.get(ours)
        if mine is None:  # not listed (yet, or forgotten): no copy to judge against
            continue
        theirs_ran = j.state not in WAITING
        mine_waits = mine.state in WAITING and not started
        out.append((j, j.slurm_id if theirs_ran and mine_waits else ours))
    return out


def adoptable(
    view: Iterable[SlurmJob], runs: Mapping[int, int], ledger_id: str, partition: str
) -> list[tuple[Tag, SlurmJob]]:
    """Pure: the Slurm job to adopt for each run the ledger holds (`runs`: job -> run), in
    Slurm id order. Where two are listed for one run (a second copy a last holder cancelled, a
    submission in flight at a takeover: `duplicates`), the one that was given nodes (a copy
    cancelled while pending has none, and Slurm's StartTime is its cancel time), then one still
    alive, then the first. Before, the last listed was taken: a leader after a PostgreSQL
    restart adopted the cancelled copy and logged a slurmctld restart that never happened
    (atk46-ha F6)."""
    best: dict[Tag, SlurmJob] = {}
    for j in view:
        tag = j.tag(ledger_id)
        if tag is None or j.partition != partition or runs.get(tag[0]) != tag[1]:
            continue
        if j.het_component:  # its first component is the run (atk59 F3)
            continue
        if tag not in best or _adoption_key(j) < _adoption_key(best[tag]):
            best[tag] = j
    return sorted(best.items(), key=lambda tj: _id_order(tj[1]))


def _id_order(j: SlurmJob) -> tuple[int, str]:
    head = j.slurm_id.split("_")[0]
    return (int(head) if head.isdigit() else 0, j.slurm_id)


def _adoption_key(j: SlurmJob) -> tuple[bool, bool, tuple[int, str]]:
    return (not expand_hostlist(j.nodes), j.ended, _id_order(j))


class InFlight:
    """The runs whose submission waits for the last holder's (`in_flight`), from the last
    takeover (`adopt`) on, each said once in the log."""

    def __init__(self, handed_over: bool = False) -> None:
        self.until: dict[Tag, float] = {}
        self._said: set[Tag] = set()
        self.handed_over = handed_over
        """The lease was taken after a clean stop of the last holder (`Lease.handed_over`: its
        worker had finished, so no `sbatch` of its is in flight): nothing waits. Before, the
        wait followed a clean handover too, 25 s for nothing (docs/ha.md)."""

    def begin(self, runs: Mapping[int, int], adopted: Iterable[int], now: float,
              timeout_s: float) -> None:  # fmt: skip
        self.until, self._said = in_flight(runs, adopted, now, timeout_s), set()
        if self.handed_over and self.until:
            log.info("the last leader stopped cleanly: %d placed runs are submitted at once "
                     "(no sbatch of its can be in flight)", len(self.until))  # fmt: skip
            self.until = {}

    def open(self, now: float) -> bool:
        """Whether a run still waits for the last holder's sbatch at `now`: a stop then is no
        clean handover (`hands_over_cleanly`)."""
        return any(until > now for until in self.until.values())

    def waits(self, r: Run, now: float) -> bool:
        """Whether run `r` (placed, not submitted) waits for a submission of the last holder
        that may still land (`held`)."""
        tag = (r.job_id, r.run)
        until = held(tag, self.until, now)
        if until is None:
            self.until.pop(tag, None)
            return False
        if tag not in self._said:
            self._said.add(tag)
            log.warning("job %s run %s waits until %s before it is submitted: an sbatch of it "
                        "by the last leader may still land (adopted if it does; docs/ha.md)",
                        r.job_id, r.run, when(until))  # fmt: skip
        return True


def landed(view: Iterable[SlurmJob], waiting: Iterable[Tag], ledger_id: str,
           partition: str) -> dict[Tag, SlurmJob]:  # fmt: skip
    """Pure: the Slurm job listed for each run of `waiting` (carried, not submitted: a
    timed-out sbatch, or the last holder's, landed), the lowest id first."""
    want, out = set(waiting), {}
    for j in sorted(view, key=lambda j: j.slurm_id):
        tag = j.tag(ledger_id)
        if tag in want and j.partition == partition and tag not in out and not j.het_component:
            out[tag] = j
    return out


def take_up_copies(ex: SlurmExecutor, now: float) -> None:
    """Before any stray is stopped (`resume_stops`): a run the executor carries unsubmitted
    whose Slurm job is listed takes it (before, it was stopped first as a run the ledger no
    longer runs, through the run's own `stopping` mark); then every second copy of a run is
    cancelled (`cancel_duplicates`)."""
    waiting = [(r.job_id, r.run) for r in ex._runs.values() if r.slurm_id is None and r.launch]
    for tag, j in landed(ex._view.values(), waiting, ex.ledger_id, ex.partition).items():
        ex._runs[tag[0]].slurm_id = j.slurm_id
        ex._runs[tag[0]].submitted_at = now
        log.warning("adopted Slurm job %s as job %s run %s (a submission that landed late: "
                    "its own, timed out, or the last leader's)", j.slurm_id, *tag)  # fmt: skip
    cancel_duplicates(ex, now)


def cancel_duplicates(ex: SlurmExecutor, now: float) -> None:
    """Cancel every second copy of a run the executor carries (`duplicates`): plain `scancel`
    by its id and the run's name, never the run's `stopping` mark (the copy kept shares the
    run's directory on this host) and no end recorded (its GPUs held until Slurm ends it)."""
    if not ex.may_act():
        return
    carried = {(r.job_id, r.run): (r.slurm_id, r.started) for r in ex._runs.values() if r.slurm_id}
    for j, keep in duplicates(ex._view.values(), carried, ex.ledger_id, ex.partition):
        tag = j.tag(ex.ledger_id)
        assert tag is not None
        gone = j.slurm_id if keep != j.slurm_id else carried[tag][0]
        if gone in ex._stopping:
            continue
        if keep == j.slurm_id:  # theirs runs, ours waits: theirs is the run now
            r = ex._runs[tag[0]]
            r.slurm_id = keep
            ex._restarts.submitted(tag[0], tag[1], keep)
        log.warning("slurm job %s is a second copy of job %s run %s (a submission in flight at "
                    "a takeover): cancelled, nothing recorded of it; Slurm job %s is the run",
                    gone, *tag, keep)  # fmt: skip
        st = Stopping(now, grace_s=0.0)  # no run: its end is none of the ledger's
        ex._stopping[gone] = st
        if not ex.cluster.confirm(now):
            continue
        try:
            ex._run(scancel_args(gone, tag))
            st.cancelled = True
        except EngineError as err:
            log.warning("slurm job %s: %s (retrying)", gone, err.line())


def hands_over_cleanly(taken_cleanly: bool, waiting: InFlight | None, now: float) -> bool:
    """Pure: whether a server's stop may hand its lease over as clean (the next leader then
    submits placed runs at once). Not while a run of its still waits for its own last holder's
    sbatch (`InFlight.open`): that sbatch may land after the next take too; and not when this
    server took the lease otherwise than cleanly and never began its wait (no Slurm executor
    made: `waiting` None). Before, every stop was clean, so a leader stopped inside its 25 s
    wait let the next one submit a run the leader before it was still submitting, and the
    job's command started twice (atk46-ha F1)."""
    if waiting is None:
        return taken_cleanly
    return not waiting.open(now)
