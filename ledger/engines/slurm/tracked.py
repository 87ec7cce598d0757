"""What the Slurm executor keeps of each run it carries out (one per job: its current run), and
when it began to stop a run, on disk (`note_stop`), so a restart of the service gives that run
only what is left of its grace, and its logs (`note_logs`), so an adopted run keeps them."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ledger.cycle.executor import Launch
from ledger.engines.proc import write_atomic
from ledger.engines.slurm.words import SbatchUser, SlurmJob


def _keep(log_dir: Path, name: str, data: bytes, *, sync: bool) -> None:
    """`<log_dir>/stops/<name>` written (the service's alone: 0600 in a 0700 directory); best
    effort, as every note of a stop here."""
    stops = log_dir / "stops"
    with contextlib.suppress(OSError):
        stops.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(stops / name, data, sync=sync, mode=0o600)


def note_stop(log_dir: Path, slurm_id: str, since: float) -> None:
    """Keep when the stop of Slurm job `slurm_id` began (`<log_dir>/stops/<id>`, the service's
    alone): a restart reads it back (`noted_stop`). Best effort: without it, a restart gives
    the run its whole grace again."""
    _keep(log_dir, slurm_id, repr(since).encode(), sync=False)


def noted_stop(log_dir: Path, slurm_id: str) -> float | None:
    """When the stop of `slurm_id` began, as `note_stop` kept it (None: not noted)."""
    try:
        return float((log_dir / "stops" / slurm_id).read_text())
    except (OSError, ValueError):
        return None


def forget_stop(log_dir: Path, slurm_id: str) -> None:
    """The stop of `slurm_id` is over (its run has ended)."""
    for name in (slurm_id, slurm_id + UNHEARD, slurm_id + LIMITED, slurm_id + KILLED):
        with contextlib.suppress(OSError):
            (log_dir / "stops" / name).unlink()


UNHEARD = ".unheard"


def note_unheard(log_dir: Path, slurm_id: str) -> None:
    """Keep that a read during the stop of `slurm_id` found one of its nodes' slurmd not
    answering, or its run outlived Slurm's end (`Stopping.unanswered`: Slurm's end of it is its
    word alone), in `<log_dir>/stops/<id>.unheard`: a restart of the service judges the stop as
    this one did (`noted_unheard`; atk44s F2: a restart after the node's return took Slurm's
    CANCELLED for the processes' end and launched beside them). Best effort, as `note_stop`."""
    _keep(log_dir, slurm_id + UNHEARD, b"", sync=True)


def noted_unheard(log_dir: Path, slurm_id: str) -> bool:
    """Whether `note_unheard` kept the stop of `slurm_id` in doubt."""
    return (log_dir / "stops" / (slurm_id + UNHEARD)).is_file()


KILLED = ".killed"


def note_killed(log_dir: Path, slurm_id: str, at: float) -> None:
    """Keep when the executor sent the SIGKILL of a stopped run's grace (`Stopping.killed`), in
    `<log_dir>/stops/<id>.killed` (the service's alone): a restart that finds the run ended
    records it killed, not as Slurm's FAILED of that kill (atk59 F4: `killed: false`, "Slurm:
    FAILED", after a kill -9 of the service between the SIGKILL and the end). Best effort."""
    _keep(log_dir, slurm_id + KILLED, repr(at).encode(), sync=True)


def noted_killed(log_dir: Path, slurm_id: str) -> float | None:
    """When `note_killed` kept the SIGKILL of `slurm_id` sent (None: not kept)."""
    try:
        return float((log_dir / "stops" / (slurm_id + KILLED)).read_text())
    except (OSError, ValueError):
        return None


LIMITED = ".limited"


def note_limited(log_dir: Path, slurm_id: str) -> None:
    """Keep that the executor stops Slurm job `slurm_id` at its time limit (`Run.limited`), in
    `<log_dir>/stops/<id>.limited` (the service's alone: the job's user cannot forge it), made
    to last before the stop's SIGTERM: a restart that finds the run ended records it
    `time_limit` (`noted_limited`; atk46-s F2: a service killed -9 after the limit's scancel
    came back and recorded it `cancelled` outside the ledger). Best effort, as `note_stop`."""
    _keep(log_dir, slurm_id + LIMITED, b"", sync=True)


def noted_limited(log_dir: Path, slurm_id: str | None) -> bool:
    """Whether `note_limited` kept that the executor stopped `slurm_id` at its limit."""
    return slurm_id is not None and (log_dir / "stops" / (slurm_id + LIMITED)).is_file()


def ended_limited(log_dir: Path, j: SlurmJob, limit: float | None) -> bool:
    """Whether an adopted run Slurm lists ended was stopped at its limit by the executor before
    a restart (`noted_limited`), and ended past that limit (`limit`: its job's; Slurm's times
    are whole seconds): a note of an earlier job whose Slurm id came back (a controller that
    lost its state) never makes another run's end a limit's. One Slurm still runs is stopped
    at its limit again (`past_limit`)."""
    if not j.ended or not noted_limited(log_dir, j.slurm_id):
        return False
    start, end = j.start_time, j.end_time
    return limit is None or start is None or end is None or end + 1 >= start + limit


def forget_limited(log_dir: Path, keep: Iterable[str | None]) -> None:
    """Forget the limit notes (`note_limited`) of every Slurm job but `keep`'s: after a
    restart's adoption, the runs that ended are recorded."""
    kept = {f"{i}{LIMITED}" for i in keep if i is not None}
    with contextlib.suppress(OSError):
        for note in (log_dir / "stops").iterdir():
            if note.name.endswith(LIMITED) and note.name not in kept:
                note.unlink(missing_ok=True)


def note_logs(log_dir: Path, job_id: int, run: int, logs: tuple[str, ...]) -> None:
    """Keep a submitted run's output (and error) file (`<log_dir>/runs/<job>.<run>`, the
    service's alone: the job's user may not name what the service shows, or reads, as its
    logs): a restart that adopts the run reads them back (`noted_logs`; Slurm's record has
    /dev/null, atk42-24 F4). Best effort."""
    runs = log_dir / "runs"
    with contextlib.suppress(OSError):
        runs.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(runs / f"{job_id}.{run}", json.dumps(logs).encode(), sync=False, mode=0o600)


def noted_logs(log_dir: Path, job_id: int, run: int) -> tuple[str, ...]:
    """A run's logs as `note_logs` kept them (() when not noted)."""
    try:
        got = json.loads((log_dir / "runs" / f"{job_id}.{run}").read_text())
    except (OSError, ValueError):
        return ()
    return tuple(p for p in got if isinstance(p, str)) if isinstance(got, list) else ()


def forget_logs(log_dir: Path, keep: Iterable[tuple[int, int]]) -> None:
    """Forget the noted logs of every run but `keep`'s (job, run): after a restart's adoption,
    the runs that ended are gone for good."""
    kept = {f"{job}.{run}" for job, run in keep}
    with contextlib.suppress(OSError):
        for note in (log_dir / "runs").iterdir():
            if note.name not in kept:
                note.unlink(missing_ok=True)


@dataclass
class Run:
    job_id: int
    run: int
    launch: Launch | None
    slurm_id: str | None = None
    """None while the launch waits for its GPUs to be free in Slurm (a victim still stopping)."""
    started: bool = False
    missing_since: float | None = None
    """When a read of Slurm first lacked this run (None while Slurm lists it)."""
    submitted_at: float | None = None
    """When it was handed to Slurm (its start is awaited from then on)."""
    started_at: float | None = None
    """Slurm's StartTime of the run (its exact limit counts from it)."""
    limited: bool = False
    """The executor stopped it at its limit (it keeps every limit: Slurm's is a backstop)."""
    stop_sent_at: float | None = None
    """When the executor stopped it at its limit (`stops.outage_of`)."""
    logs: tuple[str, ...] = ()
    """Its output (and error) file."""
    checkpoint_mtime: float = 0.0
    """When the job last touched its checkpoint file (`GPULEDGER_CHECKPOINT_FILE`)."""
    running_seen: float | None = None
    """When a read first showed Slurm running it (its start waits for its script: `_launched`)."""
    launch_seen: float | None = None
    """When a read first saw its `launched` mark, the mark's time (`launching.mark_time`; the
    job's user may remove it: `launching.never_ran`)."""
    configuring_seen: float | None = None
    """The last read that showed Slurm holding it CONFIGURING (`real_start`)."""
    node_failed: bool = False
    """Slurm ended it NODE_FAIL and the executor waits to know how it really ended (`ends`)."""
    seen_running_at: float | None = None
    """The last read that showed it running while Slurm's view was current (not in an outage's
    settle period): its end cannot be earlier."""
    adopted: bool = False
    """Adopted after a restart of the service before it was recorded started: a hold in
    CONFIGURING may have gone unseen, so its `launched` mark says when it started (`real_start`)."""
    refused_since: float | None = None
    """When its `sbatch` first failed (`SlurmExecutor._refused`): retried until the take-back
    time."""
    taken_back: bool = False
    """Adopted with its `taken-back` mark: the last service began to take it back and may not
    have recorded it (`leaked_runs.doubted`): finished as a take-back, never `launch_failed`."""
    reaping_told: bool = False
    """Its `reaping` mark was reported (`SlurmExecutor._reaping`): once per run here (after a
    restart again, which the ledger's `reaping_commands` drops when it holds it)."""

    def real_start(self, slurm_start: float | None, end: float | None = None) -> float | None:
        """When its command started, from Slurm's StartTime and what the reads saw, no later
        than Slurm's `end` of it where no read saw it RUNNING (`real_start`)."""
        running = self.running_seen if self.running_seen is not None else end
        return real_start(slurm_start, self.configuring_seen, self.launch_seen, running,
                          self.adopted)  # fmt: skip


def real_start(
    slurm_start: float | None, configuring: float | None, launched: float | None,
    running: float | None, adopted: bool = False,
) -> float | None:  # fmt: skip
    """Pure: when a run's command started. Slurm's StartTime, but for a launch Slurm held
    CONFIGURING (a slow PrologSlurmctld: Slurm 22.05 keeps StartTime at the allocation) never
    before the last read that showed it so (`configuring`), and from its `launched` mark's time
    (`launched`, as first read: `launching.mark_time`) where a read saw it, no later than the
    first read that showed it RUNNING (`running`: the mark is the job user's to make late).
    atk43s F1: a launch held 20 s was charged those 20 s, its limit running during the hold.
    A run `adopted` after a restart of the service may have been held while it was down, no
    read to see it: its `launched` mark says, never before Slurm's StartTime (atk45s F1: a
    `-t 30s` job held through a kill -9 of the service got SIGTERM 9 s after its command began).
    """
    if slurm_start is None or (configuring is None and not adopted):  # (None: unreadable)
        return slurm_start
    start = slurm_start if configuring is None else max(slurm_start, configuring)
    if launched is not None:
        start = max(start, launched if running is None else min(launched, running))
    return start


def checkpoint_file(log_dir: Path, job_id: int, run: int, who: SbatchUser | None = None) -> Path:
    """The file a run touches to say it checkpointed (`GPULEDGER_CHECKPOINT_FILE`):
    `<log_dir>/checkpoints/<job>.<run>/checkpoint`, its directory the job user's (`who`), made
    when `who` is given; the run's marks live beside it (`launching`)."""
    run_dir = log_dir / "checkpoints" / f"{job_id}.{run}"
    if who is not None:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        run_dir.parent.chmod(0o755)
        run_dir.mkdir(mode=0o700, exist_ok=True)
        if who.uid is not None:
            os.chown(run_dir, who.uid, who.gid if who.gid is not None else -1)
    return run_dir / "checkpoint"


def touched(runs: Iterable[Run], file_of: Callable[[int, int], Path]) -> list[int]:
    """The started runs' jobs whose checkpoint file (`file_of`) was touched since the last
    call (each run keeps the time it last saw: `Run.checkpoint_mtime`)."""
    out = []
    for r in runs:
        if not r.started:
            continue
        try:
            mtime = os.lstat(file_of(r.job_id, r.run)).st_mtime
        except OSError:
            continue
        if mtime > r.checkpoint_mtime:
            r.checkpoint_mtime = mtime
            out.append(r.job_id)
    return out


def past_limit(r: Run, limit: float | None, now: float) -> bool:
    """Whether a run has reached its limit (`limit`, None for none) and is not being stopped
    yet. The executor keeps every limit itself, to the second and with the job's grace (Slurm's
    own TIMEOUT would give it KillWait, from a periodic check up to ~30 s late: atk33 F7);
    Slurm's `--time` is a backstop past both (`backstop_minutes`)."""
    if r.limited or r.started_at is None:
        return False
    return limit is not None and now >= r.started_at + limit
