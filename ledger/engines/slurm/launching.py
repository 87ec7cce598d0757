"""Whether a Slurm run really launched, from the marks its batch script leaves in the run's
directory (`<log_dir>/checkpoints/<job>.<run>/`, the job's user's alone): `launched` once its
command is about to run, `cannot-enter` when its working directory could not be entered,
`cannot-start` when its command is not found in its PATH or is no executable file (the script
ends there, exit 127); `cannot-enter` and `cannot-open` may hold the script's own line of why
(`said`: a directory missing on the node, closed to the user). Slurm itself cannot say:
slurmstepd falls back to /tmp for a directory it cannot enter, and a script that ends 127 is
FAILED like any job's own failure. Where the compute node does not share the service's
directory, neither mark is seen: such a run is recorded as Slurm ends it (docs/slurm.md). The
job's user can write the marks, so they are believed only where a failing `cd` could have left
them: a run Slurm shows running, or ran, for `launch_confirm_s` (10 s) or more really ran, marks
or not, and is charged from Slurm's start (a forged mark hides at most those seconds, once: the
run ends `launch_failed`); a run that claims `wrong-gpus`, which requeues it, is charged for
all Slurm ran it, and its job placed no more after `WRONG_GPUS_RUNS` in a row. An edge
(it reads the marks)."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import stat
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ledger.cycle.executor import Exit, Launch, Reaping
from ledger.engines.slurm.command_check import (
    REFUSED_COMMAND,
    REFUSED_OPENINGS,
    checker_code,
    checker_sources,
)
from ledger.engines.slurm.ends import (
    BEAT_STALE_S,
    Ending,
    OwnEnd,
    beat_window,
    ended_unseen,
    ends_after_term_s,
    node_fail_ending,
    own_finish,
)
from ledger.engines.slurm.relaunch import RELAUNCHED
from ledger.engines.slurm.script import TAKEN_BACK_EXIT, batch_script
from ledger.engines.slurm.script_cluster import OTHER_CLUSTER_EXIT, OTHER_CLUSTER_WHY, cluster_lines
from ledger.engines.slurm.script_tree import REAPING_MARK, STEPS_LEFT
from ledger.engines.slurm.stops import Stopping, forgotten_end
from ledger.engines.slurm.words import (
    NEVER_STARTS,
    SLURM_ENDS_FIRST,
    SbatchUser,
    SlurmJob,
    processes_end,
    real_end,
)
from ledger.engines.supervise import JOB_NOFILE_VAR
from schemas.commands import RunEnd
from schemas.units import when

LAUNCHED = "launched"
CANNOT_ENTER = "cannot-enter"
CANNOT_START = "cannot-start"
CANNOT_OPEN = "cannot-open"
"""Left by the batch script when an output file is not the one the executor claimed (or not a
regular file of the user's with one link): the script ends there (`words.output_lines`)."""
WRONG_GPUS = "wrong-gpus"
"""Left by the batch script when Slurm started the run without the GPUs the ledger placed it
on (`script_gpus`): the script ends there (exit 127), its command never run; the run ends
`node_failure` (`never_ran_reason`), so a resumable job is placed again."""
WRONG_GPUS_WHY = "Slurm started it without the GPUs the ledger placed it on"
END_RECORD = "ended"
"""The run's end record (`<exit code> <epoch seconds> <signalled 0|1>`, then `<left> <killed
0|1>` when the command left processes in the step's cgroup), written by its batch script once
the job's command has exited and nothing it left lives (`script.batch_script`)."""
SIGNALLED = "signalled"
"""Touched by the batch script at each signal the job gets (its ctime: the last one)."""
ALIVE = "alive"
"""Touched by the batch script, its heartbeat, every `script.BEAT_EVERY_S` while the run's
command lives (its ctime: the last beat, which the job's user cannot set back as they can its
mtime; `ends.node_fail_ending`)."""
STOPPING = "stopping"
"""Made by the executor before its own stop's SIGTERM (`cluster.term_args`): a batch script
that finds it before its command starts ends without starting it (`script._stopped_first`)."""
TAKEN_BACK = "taken-back"
"""Made by the executor before it cancels a run Slurm would not start (`mark_taken_back`): its
batch script, should Slurm start it all the same, ends before anything of the job's
(`script.taken_back_lines`)."""
MARKS = (LAUNCHED, CANNOT_ENTER, CANNOT_START, END_RECORD, SIGNALLED, STOPPING, CANNOT_OPEN, ALIVE,
         WRONG_GPUS, RELAUNCHED, TAKEN_BACK, REFUSED_COMMAND, REAPING_MARK)  # fmt: skip


def run_script(
    job: Launch,
    who: SbatchUser,
    checkpoint: Path,
    umask: int,
    outputs: Sequence[tuple[str, int | None]],
    files_umask: int,
    real_workdir: str,
    after_term_s: int,
    pinned_nodes: Collection[str],
    own_end_s: int,
    cluster: Mapping[str, object] | None = None,
) -> str:
    """A run's batch script (`script.batch_script`), its marks beside its checkpoint file, the
    soft open-files limit the service started with (`supervise.JOB_NOFILE_VAR`, set by a
    `serve` that raised its own: atk40-25's open finding) given back to the job, and the check
    that it runs on `cluster` (the identity confirmed before its sbatch: `script_cluster`),
    asked of the `scontrol` the service runs."""
    at = {m: str(checkpoint.with_name(m)) for m in MARKS}
    files = os.environ.get(JOB_NOFILE_VAR, "")
    return batch_script(job, who, str(checkpoint), at[LAUNCHED], umask, at[CANNOT_ENTER],
                        at[CANNOT_START], at[END_RECORD], at[SIGNALLED], at[STOPPING], outputs,
                        files_umask, at[CANNOT_OPEN], real_workdir, at[ALIVE],
                        after_term_s=after_term_s, own_end_s=own_end_s,
                        wrong_gpus_file=at[WRONG_GPUS], pinned_nodes=pinned_nodes,
                        files_limit=int(files) if files.isdigit() else None,
                        relaunched_file=at[RELAUNCHED], taken_back_file=at[TAKEN_BACK],
                        cluster=cluster_lines(cluster, shutil.which("scontrol") or "scontrol"),
                        refused_file=at[REFUSED_COMMAND],
                        checker=checker_code(checker_sources()))  # fmt: skip


def mark_stopping(run_dir: Path) -> None:
    """Make the run's `STOPPING` mark (the service's, in the job user's directory: never
    through a link, never over what is there). Best effort: without it the command gets the
    stop's SIGTERM twice."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with contextlib.suppress(OSError):
        os.close(os.open(run_dir / STOPPING, flags, 0o644))


TAKEN_BACK_WHY = "taken back by the executor, its script ended before its command: never ran"


def mark_taken_back(run_dir: Path) -> bool:
    """Make the run's `TAKEN_BACK` mark (the service's: never through a link) and make it last
    (the directory synced) before the run's cancel, which a slurmctld restart may lose (atk45s
    F5); whether it is there. Without it, a run Slurm starts after all is still stopped by the
    executor (`stop_loop.resume_stops`), but its command may have begun."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
    with contextlib.suppress(OSError):
        os.close(os.open(run_dir / TAKEN_BACK, flags, 0o644))
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return marked(run_dir, TAKEN_BACK)


def marked(run_dir: Path, mark: str) -> bool:
    """Whether the batch script left `mark` in the run's directory (a link counts: it is
    never followed)."""
    return os.path.lexists(run_dir / mark)


def own_end(run_dir: Path) -> OwnEnd | None:
    """The run's own end record (`END_RECORD`), None when there is none (yet) or it does not read.
    The job's user can write it: it is asked only when Slurm ended the run NODE_FAIL, and its
    time is kept inside the run (`ends.node_fail_ending`)."""
    said = _users_file(run_dir / END_RECORD, 100)
    if said is None:
        return None
    data, written = said
    words = data.decode("ascii", errors="replace").split()
    try:
        code, at = (
            (int(words[0]), float(words[1].replace(",", ".")))
            if len(words) in (3, 5)
            else (0, math.nan)
        )
        left, killed = (int(words[3]), words[4] == "1") if len(words) == 5 else (0, False)
    except ValueError:
        return None
    if not math.isfinite(at):
        return None
    return OwnEnd(code, at, words[2] == "1", written, left, killed, marked(run_dir, STEPS_LEFT))


def _users_file(path: Path, size: int) -> tuple[bytes, float] | None:
    """The first `size` bytes of a file the job's user can write, and its ctime; None when it
    is not there, not a regular file or does not read. Never follows a link, never waits on a
    FIFO: the run's directory is the job user's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return (os.read(fd, size), st.st_ctime) if stat.S_ISREG(st.st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def reaping_said(run_dir: Path, started_at: float, now: float, grace_s: float) -> Reaping | None:
    """What the run's `REAPING_MARK` says (`script_tree`): its command ended leaving processes
    its batch script SIGTERMed, SIGKILL at `kill_at` at the latest; None when there is none
    (yet) or it does not read. The mark is the job user's: its times are kept inside the run
    (not before `started_at` nor after the read that found it: `now`, or the mark's ctime when
    it was made in this read's cycle, after its start, as its user cannot set back) and its
    SIGKILL within the job's grace (and a second) of that end; a code it did not say (-1) is
    None. Before, a mark made after the cycle began was cut to the cycle's start: the ledger's
    `leader_ended_at` 1.2 s before the command's real exit, which the same `explain` said in its
    note (atk55-23 F5)."""
    said = _users_file(run_dir / REAPING_MARK, 200)
    if said is None:
        return None
    try:
        code, ended_us, left, kill_us = (int(w) for w in said[0].split()[:4])
    except ValueError:
        return None
    ended = max(started_at, min(ended_us / 1e6, max(now, said[1])))
    kill_at = max(ended, min(kill_us / 1e6, ended + grace_s + 1))
    return Reaping(0, 0, ended, max(0, min(left, 2**31 - 1)), kill_at, code if code >= 0 else None)


def reaped_before(
    run_dir: Path, started_at: float, since: float, now: float, grace_s: float
) -> OwnEnd | None:
    """A stopped run's own end when it has no end record (`own_end`) but its `REAPING_MARK`:
    its command ended by itself, with the code the mark says, before the stop's signal
    (`since`) and before any signal its script noted (`signalled_at`), and the stop's SIGKILL
    came while its batch script still reaped what it left (so it never wrote its record). Its
    end is Slurm's (`at` is `now`: `own_finish` keeps it no later than that), its leftovers
    killed. Before, such a run was recorded `killed after its grace`, exit 137, not by itself,
    and a resumable job ran its whole command again (atk54-23 F1, job 28). The mark is the job
    user's word, as the record is: a forged one can only end that user's own job by an exit of
    its choosing rather than requeued. None when the mark does not say so."""
    said = reaping_said(run_dir, started_at, now, grace_s)
    if said is None or said.exit_code is None or said.leader_ended_at >= since:
        return None
    sig = signalled_at(run_dir)
    if sig is not None and sig <= said.leader_ended_at:
        return None  # a signal came first: its exit may be the stop's
    return OwnEnd(said.exit_code, now, signalled=False, left=said.left, killed=True)


def script_killed(
    run_dir: Path, state: str, code: int, started_at: float | None, now: float, grace_s: float,
    signalled: bool = False,
) -> str:  # fmt: skip
    """The note of a run whose batch script a signal killed (Slurm `FAILED`, `code` 128 +
    the signal) before it wrote its end record, with no stop of the ledger's (the caller's
    word): neither the ledger nor Slurm killed it, so a process of the job's own (or someone
    on its node) did; the job fails with that code, which `explain` says in these words, with
    what its `REAPING_MARK` says of its command's own end (atk53-23 F8: a leftover the script
    was ending killed it, and `explain` said only "failed, exit code 137"). `signalled`: Slurm
    says a signal killed the script itself (`SlurmJob.script_killed`): an end record there is
    not its script's, and is said not taken (atk55-23 F4). "" otherwise."""
    forged = signalled and own_end(run_dir) is not None
    if state != "FAILED" or code <= 128 or (own_end(run_dir) is not None and not forged):
        return ""
    note = (f"its batch script was killed by signal {code - 128} before it wrote its end "
            "record, though neither the ledger nor Slurm stopped it: a process of the job's "
            "own (or someone on its node) killed it")  # fmt: skip
    if forged:
        note += "; the end record there, its user's file, is not its script's and was not taken"
    said = None if started_at is None else reaping_said(run_dir, started_at, now, grace_s)
    if said is None:
        return note
    exited = "" if said.exit_code is None else f"exited {said.exit_code} and "
    return (f"its command {exited}ended at {when(said.leader_ended_at)} leaving {said.left} "
            f"process(es); {note}, while it was ending them")  # fmt: skip


def tree_said(run_dir: Path) -> str:
    """What the run's own end record says of the processes its command left in its step's
    cgroup (`OwnEnd.tree_note`), "" when nothing or no record: the note of its end."""
    own = own_end(run_dir)
    return "" if own is None else own.tree_note()


def signalled_at(run_dir: Path) -> float | None:
    """When the job last got a signal (`SIGNALLED`'s ctime: never before the note was made,
    whatever time the job's user gives it), None when it has had none."""
    try:
        return os.lstat(run_dir / SIGNALLED).st_ctime
    except OSError:
        return None


def last_beat(run_dir: Path, now: float) -> float | None:
    """The run's last heartbeat (`ALIVE`'s ctime, never after `now`), None without one."""
    try:
        return min(now, os.lstat(run_dir / ALIVE).st_ctime)
    except OSError:
        return None


def stop_marks(run_dir: Path, now: float) -> tuple[OwnEnd | None, float | None, bool]:
    """What a stopped run's marks say of its end: its own end record (`own_end`), its last beat
    (`last_beat`), and whether its script ended it before its command started because the stop
    came first (`script._stopped_first`: its record, signalled, exit 143, and neither its launch
    mark nor a beat; atk43s F10) or the run was taken back (its `TAKEN_BACK` mark, no record, no
    launch mark, no beat: `script.taken_back_lines`; it was recorded Slurm's FAILED 124). The
    marks are the job user's: a forged one changes only the note of that user's own run."""
    own = own_end(run_dir)
    unmarked = not marked(run_dir, LAUNCHED) and not marked(run_dir, ALIVE)
    first = unmarked and (
        (own is not None and own.signalled and own.exit_code == 143)
        or (own is None and marked(run_dir, TAKEN_BACK))  # its script ended it at once (F5)
    )  # fmt: skip
    return own, last_beat(run_dir, now), first


def finish_by_record(
    run_dir: Path, state: str, code: int, at: float, started_at: float | None, high: float,
    now: float,
) -> tuple[int, float, bool]:  # fmt: skip
    """(exit code, end, whether from its own record) of a run Slurm reports ended by itself or
    no longer lists, from its own end record where there is one (`ends.own_finish`): kept
    after its start and its script's last beat, and not after `high` (Slurm's end, or now)."""
    lows = [t for t in (started_at, last_beat(run_dir, now)) if t is not None]
    low = min(now, max(lows)) if lows else None
    return own_finish(own_end(run_dir), state, code, at, low, high)


def ended_by_record(
    run_dir: Path, started_at: float | None, now: float, window_s: float
) -> tuple[int, float, str] | None:
    """(exit code, end, what it says of the processes its command left: `OwnEnd.tree_note`) of
    a run Slurm lists running whose marks say it ended (`ends.ended_unseen`: its own end record,
    its heartbeat `window_s` stale), as its record says (`finish_by_record`); None otherwise.
    Read only once the record is there (one failed open a read before)."""
    own = own_end(run_dir)
    if own is None or not ended_unseen(own, last_beat(run_dir, now), now, window_s):
        return None
    code, at, _ = finish_by_record(run_dir, "", own.exit_code, now, started_at, now, now)
    return code, at, own.tree_note()


def run_end(
    run_dir: Path,
    j: SlurmJob,
    started_at: float | None,
    now: float,
    completing_seen: float | None,
    seen_running_at: float | None,
    outage: tuple[tuple[float, float] | None, float],
) -> tuple[int, float, bool]:
    """(exit code, end, whether from its own record) of a run Slurm reports ended: Slurm's
    word (`words.processes_end`; `words.real_end` for an end in an outage, `outage`: the last
    one and the settle time after it), or, where Slurm did not decide its end (not
    `SLURM_ENDS_FIRST`), its own end record's (`finish_by_record`): Slurm's EndTime is when
    slurmctld heard of the end, which a dead slurmd or slurmctld makes late (CI: a run that
    ended while its slurmd was dead was charged 10.9 s past its end). A run whose batch script
    a signal killed (`SlurmJob.script_killed`) ended as Slurm says: its end record is a file the
    job's user writes, and the script, killed, wrote none (atk55-23 F4: a job that wrote
    `0 <time> 0` there and killed its own script was recorded `completed`, exit 0)."""
    end = processes_end(j.end_time, j.state, now, completing_seen)
    at = real_end(end, now, seen_running_at, *outage)
    if j.state in SLURM_ENDS_FIRST or j.script_killed:
        return j.exit_code, at, False
    high = now if end is None else min(now, end)
    start = started_at if started_at is not None else j.start_time
    return finish_by_record(run_dir, j.state, j.exit_code, at, start, high, now)


@dataclass
class MarksSeen:
    """What the executor's reads saw of its NODE_FAIL runs' marks, by Slurm id: the first read
    that saw its signal note (`notes`); its heartbeat's ctime and the first read that saw that
    ctime (`beats`). A mark's time is the job user's to set: it counts no later than the read
    that first saw it (`node_fail_end`)."""

    notes: dict[str, float] = field(default_factory=dict)
    beats: dict[str, tuple[float, float]] = field(default_factory=dict)

    def forget(self, slurm_id: str) -> None:
        self.notes.pop(slurm_id, None)
        self.beats.pop(slurm_id, None)

    def beat(self, run_dir: Path, slurm_id: str, now: float) -> float | None:
        """The run's last heartbeat (`ALIVE`'s ctime, no later than the first read that saw
        that ctime: a node's clock ahead), None when it has none (a run from before the
        heartbeat, a directory the service does not share, or a job that removed the mark:
        its script then ends it, `ends.beat_window`). The ctime, not the mtime: the job's user
        sets the mtime to any time (`touch -d`), the ctime only to now."""
        try:
            ctime = os.lstat(run_dir / ALIVE).st_ctime
        except OSError:
            return None
        seen = self.beats.get(slurm_id)
        if seen is None or seen[0] != ctime:
            seen = self.beats[slurm_id] = (ctime, now)
        return min(ctime, seen[1])


def said(run_dir: Path, mark: str, opening: str | tuple[str, ...]) -> str:
    """The reason the batch script wrote into `mark` (`script_files.usable_lines`: one line,
    naming the node), "" when it wrote none or it does not begin with `opening` (the mark is
    the job user's to write: it may only say why its own launch failed, never pass for another
    reason, `never_ran_reason`). Never follows a link, never waits on a FIFO."""
    try:
        fd = os.open(run_dir / mark, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        text = os.read(fd, 600).decode("utf-8", errors="replace") if stat.S_ISREG(
            os.fstat(fd).st_mode) else ""  # fmt: skip
    except OSError:
        text = ""
    finally:
        os.close(fd)
    line = "".join(ch for ch in text.split("\n", 1)[0] if ch.isprintable())[:500]
    return line if line.startswith(opening) else ""


def cannot_enter(launch: Launch | None) -> str:
    """Why a run whose script left `cannot-enter` never ran, in the words of the node agents."""
    where = launch.workdir if launch is not None and launch.workdir else ""
    return f"cannot enter the working directory {where}".rstrip()


def cannot_start(launch: Launch | None) -> str:
    """Why a run whose script left `cannot-start` never ran, in the words of the node agents'
    supervisor."""
    cmd = launch.command[0] if launch is not None and launch.command else ""
    why = "no such executable file" if "/" in cmd else "not found in PATH"
    return f"cannot start {cmd}: {why}"


def cannot_open(logs: tuple[str, ...]) -> str:
    """Why a run whose script left `cannot-open` never ran."""
    files = " or ".join(logs) or "its output file"
    return (
        f"cannot open the output file {files} as the job's user, or it was not the file claimed "
        "for it at launch (another account may have replaced it) or no regular file of the "
        "user's with one link"
    )


def launch_failure(launch: Launch | None, logs: tuple[str, ...]) -> str:
    """Why Slurm could not launch a run (JobLaunchFailure), in the job's words: slurmd says
    no more, so the likely cause is named from what the job asked for."""
    if launch is not None and launch.workdir and not os.path.isdir(launch.workdir):
        return f"cannot enter the working directory {launch.workdir} (Slurm: JobLaunchFailure)"
    files = " or ".join(logs) or "its output file"
    return (
        f"Slurm could not launch it (JobLaunchFailure): cannot open the output file {files} "
        "or enter the working directory as its user"
    )


def never_ran(
    j: SlurmJob,
    launch: Launch | None,
    logs: tuple[str, ...],
    run_dir: Path,
    started: bool,
    confirm_s: float,
    launch_seen: bool = False,
) -> str:
    """Why an ended run's command never ran ("" if it did, or may have): Slurm could not
    launch it (JobLaunchFailure), or its script could not enter its working directory or
    start its command (the marks, left before the launch mark, of a run not recorded
    `started` that ran less than `confirm_s`), or Slurm started it without its GPUs (its
    `wrong-gpus` mark, of a run whose `launched` mark no read saw: `launch_seen`; the job's
    user may remove the mark, not what the executor saw, atk43s F2), or its script found
    another cluster than the one it was submitted for (`script_cluster`: its exit code), or
    found the run taken back (`TAKEN_BACK`, exit `TAKEN_BACK_EXIT`): Slurm ran it after the
    executor's cancel, a slurmctld restart having lost it, and it was recorded FAILED 124."""
    if j.launch_failed:
        return launch_failure(launch, logs)
    ran = (j.end_time or 0.0) - (j.start_time or 0.0)  # a failing `cd` or check ends at once
    launch_marked = launch_seen or marked(run_dir, LAUNCHED)
    if j.exit_code == 127 and marked(run_dir, WRONG_GPUS) and not launch_marked:
        # a launch Slurm restarted: its first start may have been taken for a run (`_launched`),
        # and Slurm's StartTime may stay that first one
        return f"{WRONG_GPUS_WHY} (Slurm 22.05 restarts a launch it requeued with none): never ran"
    if started or ran >= confirm_s or launch_marked:
        return ""
    if j.exit_code == OTHER_CLUSTER_EXIT:  # its script's check (`script_cluster`): a run
        return f"{OTHER_CLUSTER_WHY}: never ran"  # pending across a move of its controller
    if j.exit_code == TAKEN_BACK_EXIT and marked(run_dir, TAKEN_BACK):
        return TAKEN_BACK_WHY
    if marked(run_dir, CANNOT_OPEN):
        return said(run_dir, CANNOT_OPEN, "cannot open the output file ") or cannot_open(logs)
    if marked(run_dir, REFUSED_COMMAND):  # the path rule (`command_check`)
        return said(run_dir, REFUSED_COMMAND, REFUSED_OPENINGS) or (
            "the path rule refused the command's names on its node (the batch script said no more)"
        )
    if marked(run_dir, CANNOT_START):
        return cannot_start(launch)
    if not marked(run_dir, CANNOT_ENTER):
        return ""
    entering = said(run_dir, CANNOT_ENTER, "cannot enter the working directory ")
    return entering or cannot_enter(launch)


def mark_time(run_dir: Path, mark: str, now: float) -> float | None:
    """When the batch script made `mark` (its ctime, never after `now`: the job's user can
    set it later, never earlier), None without it."""
    try:
        return min(now, os.lstat(run_dir / mark).st_ctime)
    except OSError:
        return None


def never_ran_reason(why: str) -> RunEnd:
    """Pure: how a run whose command never ran (`never_ran`'s why) ends: `node_failure` when
    Slurm started it without its GPUs (the node's doing: a resumable job is placed again),
    else `launch_failed`."""
    return "node_failure" if why.startswith(WRONG_GPUS_WHY) else "launch_failed"


WRONG_GPUS_RUNS = 3
"""A job whose runs end `wrong-gpus` this many times in a row is placed no more (Slurm's own
requeue limits do the same): the mark is its user's to write, and each such end requeued it
without bound (atk43s F2: a job that removed its `launched` mark and left `wrong-gpus` ran 7 s
of every 8 on 2 GPUs, requeued forever)."""


@dataclass
class WrongGpus:
    """How many runs of each job in a row ended `wrong-gpus` (`never_ran_ending`)."""

    in_a_row: dict[int, int] = field(default_factory=dict)

    def ending(self, job_id: int, why: str) -> tuple[RunEnd, str]:
        """How a run of `job_id` whose command never ran (`never_ran`'s why) ends, and its note:
        `never_ran_reason`, but `launch_failed` for the `WRONG_GPUS_RUNS`th `wrong-gpus` end in
        a row, its note saying so."""
        if never_ran_reason(why) != "node_failure":
            self.in_a_row.pop(job_id, None)
            return never_ran_reason(why), why
        n = self.in_a_row[job_id] = self.in_a_row.get(job_id, 0) + 1
        if n < WRONG_GPUS_RUNS:
            return "node_failure", why
        del self.in_a_row[job_id]
        return "launch_failed", f"{why}; {n} runs in a row: not placed again"

    def ran(self, job_id: int) -> None:
        """A run of `job_id` ended otherwise: the count starts again."""
        self.in_a_row.pop(job_id, None)


def run_nodes(launch: Launch | None, j: SlurmJob) -> tuple[str, ...]:
    """Pure: the nodes a run ran on (its launch's, else Slurm's NodeList of one or more plain
    names; () when it cannot say: then no node is known to answer)."""
    if launch is not None:
        return tuple(dict.fromkeys(sl.node for sl in launch.slots))
    if j.gpus:
        return tuple(j.gpus)
    names = tuple(n for n in j.nodes.split(",") if n)
    return () if any("[" in n for n in names) else names


def node_fail_end(
    run_dir: Path,
    launch: Launch | None,
    started_at: float | None,
    j: SlurmJob,
    answering: Mapping[str, float],
    kill_wait_s: float,
    now: float,
    confirm_s: float = 0.0,
    seen: MarksSeen | None = None,
    grace_s: float | None = None,
) -> Ending | None:
    """How a run Slurm ended NODE_FAIL really ended, from its marks (`ends.node_fail_ending`;
    `answering`: node -> since when its slurmd answers); None while it may still run. Its
    signal note's time counts no later than the first read that saw the note (`seen`, kept by
    the caller: a node's clock ahead; atk38-24 F6); its heartbeat's likewise (`MarksSeen.beat`).
    With the job's grace (`grace_s`), its batch script's own bounds apply (`ends.beat_window`,
    `ends.ends_after_term_s`)."""
    nodes = run_nodes(launch, j)
    since = [answering.get(n) for n in nodes]
    answered = max(s for s in since if s is not None) if nodes and None not in since else None
    started = started_at if started_at is not None else j.start_time
    noted = signalled_at(run_dir)
    if noted is not None and seen is not None:
        noted = min(noted, seen.notes.setdefault(j.slurm_id, now))
    beat = seen.beat(run_dir, j.slurm_id, now) if seen is not None else None
    window = BEAT_STALE_S if grace_s is None else beat_window(kill_wait_s)
    try:  # its script takes a regular file it did not make for a TERM (`script._beating`),
        # not the directory a job made to keep its notes unwritable (atk37-23 F6)
        note_file = noted is not None and stat.S_ISREG(os.lstat(run_dir / SIGNALLED).st_mode)
    except OSError:
        note_file = False
    after = None if grace_s is None or not note_file else ends_after_term_s(grace_s, kill_wait_s)
    return node_fail_ending(own_end(run_dir), noted, marked(run_dir, LAUNCHED),
                            j.end_time, j.exit_code, started, answered, kill_wait_s,
                            now, confirm_s, beat, window, after, j.state)  # fmt: skip


def never_starts(reason: str, waited_s: float, within_s: float) -> str:
    """Pure: why Slurm will not start a submitted run: its pending reason says it never will
    (`NEVER_STARTS`), or it has waited `within_s`; "" while it may still start."""
    if reason in NEVER_STARTS:
        return f"Slurm will not start it: {reason}"
    if waited_s >= within_s:
        return (
            f"Slurm did not start it within {within_s:.0f} s (Slurm's reason: {reason or 'none'})"
        )
    return ""


def forgotten_stop(
    st: Stopping, slurm_id: str, run_dir: Path, now: float, kill_wait_s: float
) -> Exit | None:
    """A stopped run Slurm no longer lists: its end from its marks (`stops.forgotten_end`)."""
    own, beat, _ = stop_marks(run_dir, now)
    return forgotten_end(st, slurm_id, own, beat, now, beat_window(kill_wait_s))
