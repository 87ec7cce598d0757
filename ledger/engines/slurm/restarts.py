"""The Slurm executor's watch over runs Slurm launched again or whose id it handed out twice,
after slurmctld lost its state (`relaunch`, `launch_notes`; docs/slurm.md, "A launch Slurm
restarts"). An edge: it reads the run's marks and keeps the executor's notes."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field, replace
from pathlib import Path

from ledger.cycle.executor import Exit, Launch, Start
from ledger.engines.slurm.ends import BEAT_EVERY_S, beat_window
from ledger.engines.slurm.launch_notes import Notes
from ledger.engines.slurm.launching import (
    ALIVE,
    END_RECORD,
    LAUNCHED,
    MARKS,
    STOPPING,
    MarksSeen,
    last_beat,
    mark_time,
    marked,
    own_end,
    run_nodes,
)
from ledger.engines.slurm.relaunch import (
    LAUNCHED_BEFORE_S,
    MOVED_S,
    RELAUNCH_EXIT,
    RELAUNCHED,
    first_launch_end,
    restarted,
)
from ledger.engines.slurm.stops import placed_gpus, run_gpus, vanished_end
from ledger.engines.slurm.tracked import Run, noted_logs
from ledger.engines.slurm.words import WAITING, SlurmJob
from schemas.errors import EngineError

log = logging.getLogger("gpuledger.slurm")
_NO_JOB = SlurmJob("", "", "", "")

NEVER_REACHED_WHY = (
    "Slurm showed it running but its batch script never started (no launch mark nor heartbeat "
    "on a node whose marks the service sees; slurmd may have refused the launch): its command "
    "never ran"
)
REUSED_WHY = (
    "Slurm gave it the id of an earlier run (slurmctld lost its state) and could not launch "
    "it: its command never ran"
)


@dataclass
class Restarts:
    log_dir: Path
    cancel: Callable[[str, tuple[int, int]], object]
    """`scancel` a Slurm job of a run (job, run), restricted to that job's name
    (`cluster.scancel_args`: a controller swapped within scancel's retries has another job
    under the id, which must not be cancelled; atk44ha F1); raises `EngineError` when Slurm
    refuses."""
    may_act: Callable[[], bool]
    """The leader's lease (a deposed leader cancels nothing)."""
    notes: Notes = field(init=False)
    why: dict[tuple[int, int], str] = field(default_factory=dict)
    """Runs Slurm launched again, and why the executor knows (`relaunch.restarted`)."""
    cancelled: set[str] = field(default_factory=set)
    held: dict[tuple[int, int], Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    """The GPUs of each such run's first launch, held until it is known gone."""
    sharing: set[str] = field(default_factory=set)
    """Nodes where a run's launch mark was seen: the service sees their run directories."""
    _durable_read: bool = False
    """`durable_sharing` has read the notes and marks on disk."""
    reused: set[str] = field(default_factory=set)
    """Our Slurm ids Slurm had given an earlier run of ours (`Notes.reused`)."""
    seen: MarksSeen = field(default_factory=MarksSeen)
    jobs: dict[tuple[int, int], SlurmJob] = field(default_factory=dict)
    """Each such run's Slurm job as last read (Slurm may stop listing it: `last`)."""

    def __post_init__(self) -> None:
        self.notes = Notes(self.log_dir)

    def submitted(self, job_id: int, run: int, slurm_id: str, launch: Launch | None = None) -> bool:
        """Note a submission's Slurm id (and the nodes of its `launch`); True when Slurm gave it
        an earlier run of ours."""
        earlier = self.notes.reused(slurm_id, job_id, run)
        nodes = run_nodes(launch, _NO_JOB) if launch is not None else ()
        self.notes.note(job_id, run, slurm_id, nodes=nodes)
        if earlier is None:
            self.reused.discard(slurm_id)
            return False
        log.warning("job %s run %s got Slurm job id %s, which Slurm gave job %s run %s before "
                    "(slurmctld lost its state): it is started only by its own launch mark",
                    job_id, run, slurm_id, *earlier)  # fmt: skip
        self.reused.add(slurm_id)
        return True

    def _shares(self, r: Run, j: SlurmJob | None) -> bool:
        """Whether every node of the run showed the service a launch mark before (it sees
        the run directories there: the batch script's marks are what tells a run that ran),
        in this service's reads or, from what lasts, in a run noted there (`durable_sharing`)."""
        nodes = run_nodes(r.launch, j) if j is not None else run_nodes(r.launch, _NO_JOB)
        if not nodes and r.slurm_id is not None:
            noted = self.notes.get(r.job_id, r.run)
            nodes = noted.nodes if noted is not None and noted.slurm_id == r.slurm_id else ()
        if nodes and not all(n in self.sharing for n in nodes):
            self.durable_sharing()
        return bool(nodes) and all(n in self.sharing for n in nodes)

    def durable_sharing(self) -> None:
        """Once per service: the nodes of runs noted at their submission (`Notes`, the
        service's own) whose batch script left its launch mark in its run directory: the
        service sees the marks there. A restarted service knows them as one that saw the
        marks in its reads (atk44s F4: after a restart a run Slurm forgot before launching it
        ended `lost`, no mark having been read since)."""
        if self._durable_read:
            return
        self._durable_read = True
        self.notes.load()
        for (job_id, run), noted in list(self.notes.by_run.items()):
            run_dir = self.log_dir / "checkpoints" / f"{job_id}.{run}"  # `tracked.checkpoint_file`
            if noted.nodes and not set(noted.nodes) <= self.sharing and marked(run_dir, LAUNCHED):  # fmt: skip  # noqa: E501
                self.sharing.update(noted.nodes)

    def marks_seen(self, r: Run) -> None:
        """The run's launch mark was seen: its nodes share the service's directory."""
        self.sharing.update(run_nodes(r.launch, _NO_JOB))

    def confirm_s(
        self, r: Run, run_dir: Path, confirm_s: float, j: SlurmJob | None = None
    ) -> float:
        """How long a run Slurm shows running must run unmarked to count as started: never
        for a reused id, nor where its nodes share the service's directory and its script
        has not beaten (a launch slurmd refused, "Duplicate jobid", shows RUNNING: atk43s F5;
        a script that cannot write its marks ends its command within `ends.UNBEATEN_S`)."""
        if r.slurm_id in self.reused:
            return math.inf
        return math.inf if self._shares(r, j) and not marked(run_dir, ALIVE) else confirm_s

    def never_ran(self, r: Run, j: SlurmJob, run_dir: Path, why: str, seen: bool) -> str:
        """Why a run whose script never marked anything never ran, where the service would
        have seen its marks (`confirm_s`): a reused id, or a node sharing its directory."""
        if why or seen or any(marked(run_dir, m) for m in (LAUNCHED, ALIVE, END_RECORD)):
            return why
        if r.slurm_id in self.reused:
            return REUSED_WHY
        return NEVER_REACHED_WHY if self._shares(r, j) and not r.started else why

    def never_launched(self, r: Run, run_dir: Path) -> bool:
        """Whether a run Slurm no longer lists (or whose id names another job now) never
        launched: not started, never seen running, no mark of its script's, on nodes whose
        marks the service sees (`_shares`, from the notes and marks on disk too: a restart of
        the service judges alike), not noted started. slurmctld lost its state before launching
        it (atk44s F4: a resumable job whose command never ran was recorded `failed`, exit -1,
        `lost`): Slurm no longer knows the job, so it cannot launch it; the executor submits it
        again."""
        if r.started or r.running_seen is not None or r.launch_seen:
            return False
        noted = self.notes.get(r.job_id, r.run)
        if noted is not None and noted.started is not None:
            return False  # recorded started, before a restart of the service
        if r.launch is None and (noted is None or noted.slurm_id != r.slurm_id):
            return False  # adopted, its nodes unknown
        return self._shares(r, None) and not any(marked(run_dir, m) for m in MARKS if m != STOPPING)  # fmt: skip  # noqa: E501

    def unseen_start(self, r: Run, run_dir: Path, now: float) -> Start | None:
        """The start of a run Slurm no longer lists that no read recorded started, where its
        script marked its launch and beat or wrote its end record (its command ran): at its
        launch mark (atk44s F5: a run slurmctld forgot, completed by its own record, had no
        start, its running time never charged). None otherwise."""
        if r.started or r.slurm_id is None:
            return None
        at = mark_time(run_dir, LAUNCHED, now)
        if at is None or not (marked(run_dir, ALIVE) or marked(run_dir, END_RECORD)):
            return None
        return Start(r.job_id, r.slurm_id, r.run, (), logs=r.logs, started_at=at)

    def last(self, job_id: int, run: int) -> SlurmJob | None:
        """The Slurm job of a run Slurm launched again as last read, ended if it was not (the
        executor cancelled it); None for any other run."""
        j = self.jobs.get((job_id, run))
        return j if j is None or j.ended else replace(j, state="CANCELLED")

    def first_start(self, r: Run) -> float | None:
        noted = self.notes.get(r.job_id, r.run)
        return None if noted is None else noted.started

    def check(self, r: Run, j: SlurmJob, now: float, kill_wait_s: float,
              pinned: Mapping[str, tuple[str, ...]], runs: dict[int, Run],
              out: tuple[list[Start], list[Exit]]) -> bool:  # fmt: skip
        """Whether Slurm launched the run `r` (of `runs`) again: then its first launch's start
        (where the ledger may not have it) and its end, once known, go to `out`, and the run
        leaves `runs`; until then it may still run, its GPUs held. False: the usual rules."""
        run_dir = self.log_dir / "checkpoints" / f"{r.job_id}.{r.run}"  # `tracked.checkpoint_file`
        got = self._first_launch(r, j, run_dir, now, kill_wait_s, pinned)
        if got is None:
            return False
        start, ended = got
        if ended is not None:
            del runs[r.job_id]
            out[0].extend([start] if start is not None else [])
            out[1].append(ended)
        return True

    def _first_launch(self, r: Run, j: SlurmJob, run_dir: Path, now: float, kill_wait_s: float,
                      pinned: Mapping[str, tuple[str, ...]]) -> tuple[Start | None, Exit | None] | None:  # fmt: skip  # noqa: E501
        assert r.slurm_id is not None
        tag, first = (r.job_id, r.run), self.first_start(r)
        if tag not in self.why:
            refused = j.ended and j.exit_code == RELAUNCH_EXIT  # its script's refusal: marks
            moved = j.start_time is not None and first is not None and abs(j.start_time - first) > MOVED_S  # fmt: skip  # noqa: E501
            # the mark's own ctime, not kept before `now`: a test's clock, or a node's behind
            at = mark_time(run_dir, LAUNCHED, math.inf) if first is None and j.started else None
            early = at is not None and j.start_time is not None and j.start_time > at + LAUNCHED_BEFORE_S  # fmt: skip  # noqa: E501
            if not (refused or moved or early or j.state in WAITING):
                return None
            # its first launch reached its script (its launch mark), not only Slurm's RUNNING:
            # a launch Slurm requeued before its script began is Slurm's to start again, the
            # script checking its GPUs (`script_gpus`)
            launched = r.launch_seen is not None or marked(run_dir, LAUNCHED)
            ran = launched and (r.started or first is not None or r.running_seen is not None)
            relaunched = mark_time(run_dir, RELAUNCHED, now) if refused else None
            marks = (relaunched, mark_time(run_dir, LAUNCHED, now)) if refused or early else (None, None)  # fmt: skip  # noqa: E501
            why = restarted(j, first if launched else None, *marks, ran)
            if not why:
                return None
            self.why[tag] = why
            self.jobs[tag] = j
            self.held[tag] = placed_gpus(r.launch, j, pinned)
            log.warning("job %s run %s (Slurm job %s): %s: cancelling Slurm's new launch; the "
                        "first one's end is recorded as it was", r.job_id, r.run, r.slurm_id, why)  # fmt: skip  # noqa: E501
        self.jobs[tag] = j
        if not j.ended and r.slurm_id not in self.cancelled and self.may_act():
            try:
                self.cancel(r.slurm_id, tag)
                self.cancelled.add(r.slurm_id)
            except EngineError as err:
                log.warning("slurm job %s: %s (retrying)", r.slurm_id, err.line())
        beat = self.seen.beat(run_dir, r.slurm_id, now)
        began = first if first is not None else r.started_at
        window = beat_window(kill_wait_s)
        ending = first_launch_end(own_end(run_dir), beat, began, now, window, r.seen_running_at,
                                  j.ended)  # fmt: skip
        if ending is None:
            return None, None
        why = self.why.get(tag, "Slurm lost the run's state")
        self.forget(tag, r.slurm_id)
        log.info("job %s run %s (Slurm job %s): its first launch ended %s at %s", r.job_id, r.run,
                 r.slurm_id, ending.reason, ending.at)  # fmt: skip
        # no start of its the executor saw, and no launch mark with a beat of its script's
        # (made before its command: it ran, atk44s F1): its command never ran
        ran = marked(run_dir, LAUNCHED) and beat is not None
        if first is None and not r.started and r.running_seen is None and ending.reason != "exited" and not ran:  # fmt: skip  # noqa: E501
            note = f"{why}; no start of it was seen: its command never ran"
            return None, Exit(r.job_id, -1, ending.at, "launch_failed", r.slurm_id, j.state, note)
        start = None  # recorded started only where its command was (Slurm's GPU-less relaunch)
        if not r.started and (first is not None or r.launch_seen or marked(run_dir, LAUNCHED)):
            at = first if first is not None else mark_time(run_dir, LAUNCHED, now)
            gpus = run_gpus(j, pinned)
            start = Start(r.job_id, r.slurm_id, r.run, gpus, logs=r.logs, started_at=at)
        reason = "time_limit" if r.limited else ending.reason
        return start, Exit(r.job_id, ending.exit_code, ending.at, reason, r.slurm_id, j.state,
                           ending.note, run=r.run)  # fmt: skip

    def unlisted(self, runs: Mapping[int, int], have: Set[int],
                 file_of: Callable[[int, int], Path], now: float) -> list[Run]:  # fmt: skip
        """The runs (job -> run) Slurm no longer lists that launched (their start noted, or
        their launch mark made): a slurmctld that lost its state forgot them, and they end by
        their own record (`vanished`), never `lost` at once (atk43s F3); one
        that never launched is launched again."""
        self.notes.forget_older(now)
        out = []
        for job_id, run in runs.items():
            noted = self.notes.get(job_id, run)
            if job_id in have or noted is None:
                continue
            if noted.started is None and not marked(file_of(job_id, run).parent, LAUNCHED):
                continue
            log.warning("job %s run %s: Slurm no longer lists its job %s (slurmctld lost it?): "
                        "its own end record will say how it ended", job_id, run, noted.slurm_id)  # fmt: skip  # noqa: E501
            out.append(Run(job_id, run, None, noted.slurm_id, started=noted.started is not None,
                           started_at=noted.started, logs=noted_logs(self.log_dir, job_id, run)))  # fmt: skip  # noqa: E501
        return out

    def forget(self, tag: tuple[int, int], slurm_id: str) -> None:
        self.why.pop(tag, None)
        self.held.pop(tag, None)
        self.jobs.pop(tag, None)
        self.seen.forget(slurm_id)


def vanished(r: Run, run_dir: Path, sacct: Callable[[list[str]], str] | None,
             now: float, kill_wait_s: float = 30.0) -> Exit | None:  # fmt: skip
    """The end of a run Slurm no longer lists (past MinJobAge, or a controller that lost its
    state: atk43s F3), from `sacct` where there is accounting, and its own end record
    (`stops.vanished_end`); None while it may still run. Without either, a run whose script
    beat is gone only once its heartbeat is `ends.beat_window` old, and ends a beat after its last:
    Slurm's kill, an engine failure (`node_failure`), not `lost` while it still ran."""
    assert r.slurm_id is not None
    rows = ""
    if sacct is not None:
        try:
            rows = sacct(["sacct", "-n", "-P", "-X", "-j", r.slurm_id, "-o",
                          "State,ExitCode,End,JobName"])  # fmt: skip
        except EngineError as err:
            log.warning("sacct: %s", err.line())
    # only this job's rows: the id may have named another cluster's job (atk44ha F1)
    name = [f"gpuledger-{r.job_id}"]
    rows = "".join(f"{p[0]}|{p[1]}|{p[2]}\n" for row in rows.splitlines()
                   if (p := row.split("|"))[3:] == name)  # fmt: skip
    beat, own = last_beat(run_dir, now), own_end(run_dir)
    if not rows and own is None and beat is not None:
        if now < beat + beat_window(kill_wait_s):
            return None  # its processes live on, whatever Slurm forgot
        note = "Slurm no longer lists it (slurmctld lost its state?): its processes were killed"
        return Exit(r.job_id, -1, min(now, beat + BEAT_EVERY_S), "node_failure", r.slurm_id,
                    "UNKNOWN", note, run=r.run)  # fmt: skip
    low = max((t for t in (r.started_at, beat) if t is not None), default=None)
    return vanished_end(r, r.slurm_id, rows, now, own, low)
