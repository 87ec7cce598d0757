"""The stops of runs the ledger never recorded started, kept on disk (an edge: it reads and
writes `<log_dir>/stops/<Slurm id>.stray`). The ledger keeps a stopped run's stop
(`State.stopped_runs`) only for a run it recorded running: a run cancelled while `placed` whose
command did start (its `launched` mark: a launch held CONFIGURING, the service down) is stopped
as a stray, a stop that lived in the service's memory alone. A second kill of the service during
that stop lost it: the restart found the Slurm job ended, no stop of the ledger's for it, and
never recorded the run's end (atk46-s F1: 57.6 GPU-s uncharged, `started_at` null). So once such
a stop's run has a launch mark its note is written and fsynced (`note_started_stops`); a restart
that finds a note whose Slurm job has ended (or is gone) and whose run's end is not recorded
takes the stop up again (`take_up_strays`), its end as any stop's (`stop_loop.carry_stops`:
Slurm's end, the run's own end record, its marks once Slurm forgot it), its start the launch
mark (`with_starts`). The note goes once the ledger holds the run's end (`Strays.recorded`)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ledger.cycle.executor import Exit
from ledger.engines.proc import write_atomic
from ledger.engines.slurm.launching import LAUNCHED, mark_time
from ledger.engines.slurm.stops import Stopping, Tag
from ledger.engines.slurm.tracked import noted_stop, noted_unheard

if TYPE_CHECKING:
    from ledger.engines.slurm.executor import SlurmExecutor

log = logging.getLogger("gpuledger.slurm")

STRAY = ".stray"


@dataclass(frozen=True)
class StrayNote:
    """A stop of a run the ledger never recorded started, whose command did start."""

    slurm_id: str
    job_id: int
    run: int
    launched: float
    """Its `launched` mark's time: the run's own start."""

    @property
    def tag(self) -> Tag:
        return (self.job_id, self.run)


def _never(_: Tag) -> bool:
    return False


@dataclass
class Strays:
    """The stray notes in `<log_dir>/stops`, read once (`notes`), kept as they are written."""

    log_dir: Path
    recorded: Callable[[Tag], bool] = _never
    """Whether the ledger holds the run's end (`State.run_ends`; wired by `open_executor`)."""
    _notes: dict[str, StrayNote] | None = field(default=None, repr=False)
    taken: set[str] = field(default_factory=set)
    """The noted stops this process carries or carried (it wrote their note, or took them up:
    `take_up_strays`): each taken up once at most, so its end is reported once."""

    def notes(self) -> dict[str, StrayNote]:
        if self._notes is None:
            self._notes = {}
            with contextlib.suppress(OSError):
                for path in (self.log_dir / "stops").glob("*" + STRAY):
                    if (note := _read(path)) is not None:
                        self._notes[note.slurm_id] = note
        return self._notes

    def note(self, slurm_id: str, tag: Tag, launched: float) -> None:
        """Keep the stop on disk, fsynced (best effort, as `tracked.note_stop`)."""
        note = StrayNote(slurm_id, tag[0], tag[1], launched)
        self.notes()[slurm_id] = note
        self.taken.add(slurm_id)
        stops = self.log_dir / "stops"
        body = json.dumps({"slurm_id": slurm_id, "job": tag[0], "run": tag[1],
                           "launched": launched})  # fmt: skip
        with contextlib.suppress(OSError):
            stops.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(stops / (slurm_id + STRAY), body.encode(), sync=True, mode=0o600)

    def forget(self, slurm_id: str) -> None:
        self.notes().pop(slurm_id, None)
        with contextlib.suppress(OSError):
            (self.log_dir / "stops" / (slurm_id + STRAY)).unlink()


def _read(path: Path) -> StrayNote | None:
    try:
        got = json.loads(path.read_text())
        return StrayNote(str(got["slurm_id"]), int(got["job"]), int(got["run"]),
                         float(got["launched"]))  # fmt: skip
    except (OSError, ValueError, TypeError, KeyError):
        return None


def note_started_stops(ex: SlurmExecutor, now: float) -> None:
    """Note each stop the executor carries of a run the ledger does not hold stopped (not in
    `State.stopped_runs`: never recorded started) once its `launched` mark says its command
    started (a hold released during the stop makes it late)."""
    notes, stopped = ex.strays.notes(), None
    for slurm_id, st in ex._stopping.items():
        if st.run is None:
            continue
        if slurm_id in notes:  # (a restart's: `resume_stops` took up a stray still running)
            ex.strays.taken.add(slurm_id)
            continue
        stopped = ex.stopped_runs() if stopped is None else stopped
        if st.run in stopped:
            continue  # the ledger keeps this stop itself
        launched = mark_time(ex._checkpoint_file(*st.run).parent, LAUNCHED, now)
        if launched is not None:
            ex.strays.note(slurm_id, st.run, launched)


def take_up_strays(ex: SlurmExecutor, now: float) -> None:
    """The noted stops the executor does not carry (a restart): forgotten once the ledger holds
    the run's end; one whose Slurm job still runs is a stray `resume_stops` stops again (its
    note stays); one Slurm ended or forgot is carried again to its end (`carry_stops`)."""
    for note in list(ex.strays.notes().values()):
        if ex.strays.recorded(note.tag):
            ex.strays.forget(note.slurm_id)
            continue
        if note.slurm_id in ex._stopping or note.slurm_id in ex.strays.taken:
            continue
        j = ex._view.get(note.slurm_id)
        if j is not None and j.tag(ex.ledger_id) != note.tag:
            log.warning("slurm job %s is no longer job %s run %s (its comment): its stop's note "
                        "is dropped", note.slurm_id, *note.tag)  # fmt: skip
            ex.strays.forget(note.slurm_id)
            continue
        if j is not None and not j.ended:
            continue
        log.warning("job %s run %s (Slurm job %s) was stopped and its end is not recorded: "
                    "recording it", *note.tag, note.slurm_id)  # fmt: skip
        since = noted_stop(ex.log_dir, note.slurm_id)
        st = Stopping(now if since is None else since, cancelled=True, grace_s=ex.grace_s,
                      run=note.tag)  # fmt: skip
        st.unanswered = st.kept = noted_unheard(ex.log_dir, note.slurm_id)
        ex._stopping[note.slurm_id] = st
        ex.strays.taken.add(note.slurm_id)


def with_starts(ex: SlurmExecutor, ends: list[Exit]) -> list[Exit]:
    """The ends of noted stops with the run's start where the stop's rules found none (the mark
    gone, or Slurm forgot the job): the launch mark's time as noted, no later than the end."""
    notes = ex.strays.notes()
    out = []
    for x in ends:
        note = notes.get(x.engine_job_id)
        fill = note is not None and note.tag == (x.job_id, x.run) and x.started_at is None
        if fill and note is not None and "never ran" not in x.note:
            x = replace(x, started_at=min(note.launched, x.at))
        out.append(x)
    return out
