"""A run Slurm launched again (docs/slurm.md, "A launch Slurm restarts"): slurmctld killed
within its state-save lag after an `sbatch` comes back with a state that lacks or rewinds the
job. It then recovers the job PENDING while its first launch runs on under slurmstepd, or has
ended meanwhile, and schedules it again: it SIGKILLs the first copy and runs the command a second
time, or cancels the job (slurmd: "already running, do not launch second copy"), or, having
forgotten the id, hands it to the next submission (atk43s F3-F6, F11).

Slurm's restart is never the ledger's. The batch script refuses a second launch of a run whose
directory already holds its launch mark or end record (`guard_lines`: it leaves `relaunched`
and exits `RELAUNCH_EXIT`, its command never run again); the executor sees the restart
(`restarted`), cancels Slurm's job at once and records how the first launch really ended
(`first_launch_end`): its own end record where it has one (a job that exited 0 is completed, at
its real end), else killed by Slurm, an engine failure (`node_failure`: a resumable job is
requeued), never the user's cancel, ended when its heartbeat stopped.

Pure: marks' times and Slurm's words in, decisions out; `now` is a parameter."""

from __future__ import annotations

import shlex

from ledger.engines.slurm.ends import BEAT_EVERY_S, OWN_END_SLACK_S, Ending, OwnEnd, record_beat
from ledger.engines.slurm.words import WAITING, SlurmJob

RELAUNCHED = "relaunched"
"""Left by the batch script when it finds its run launched before (`guard_lines`)."""
RELAUNCH_EXIT = 125
"""The batch script's exit code when it refuses a second launch: FAILED in Slurm, so an
executor that missed the restart takes the first launch's own end record's code
(`ends.SLURM_SAW_NO_EXIT`), never Slurm's `COMPLETED`."""
MOVED_S = 2.0
"""Slurm's StartTime (whole seconds) moved by more than this: Slurm started the job again."""
LAUNCHED_BEFORE_S = 5.0
"""Slurm's StartTime came this long after the run's `launched` mark (its ctime): the command
was launched in an earlier allocation, which Slurm forgot (`restarted`, 4.). Slurm's start is
its allocation, before the script runs and marks it; the margin is for the clocks of slurmctld
and of the file server that sets the mark's ctime."""


def guard_lines(launched_file: str, ended_file: str, relaunched_file: str) -> list[str]:
    """Pure: the batch script's first lines: a run whose launch mark or end record is already
    there (a link counts) was launched before, by Slurm's restart of it: it leaves
    `relaunched_file` and ends with `RELAUNCH_EXIT` before anything of the job's, so no command
    runs twice and no mark of the first launch is overwritten."""
    if not (launched_file and ended_file and relaunched_file):
        return []
    seen = " || ".join(
        f"[ -e {q} ] || [ -L {q} ]" for q in (shlex.quote(launched_file), shlex.quote(ended_file))
    )
    mark = f"{{ : > {shlex.quote(relaunched_file)}; }} 2>/dev/null"
    return [f"if {seen}; then {mark}; exit {RELAUNCH_EXIT}; fi"]


def restarted(
    j: SlurmJob,
    first_start: float | None,
    relaunched_at: float | None,
    launched_at: float | None,
    ran: bool = False,
) -> str:
    """Pure: why Slurm has started (or will start) the run `j` again ("" if it has not).

    1. Seen waiting (PENDING) after the executor saw it start (`first_start`: Slurm's StartTime
       when its start was recorded, kept across restarts of the service; or `ran`: a read saw
       it running): slurmctld recovered it from a state saved before its start.
    2. Its StartTime moved from `first_start`: Slurm started it again.
    3. Its batch script refused a second launch (`relaunched_at`, the mark's time) and Slurm's
       StartTime came after its first launch's mark (`launched_at`, its ctime, which the job's
       user cannot set back): the marks are the user's, so Slurm's word must agree.
    4. No refusal (slurmd would not launch a second copy: "already running", and Slurm
       cancelled the job), but Slurm's StartTime came `LAUNCHED_BEFORE_S` after its first
       launch's mark: that launch was in an allocation Slurm forgot (atk44s F7: slurmctld killed
       as the launch began, before any read saw it; a run that exited 0 in the outage was
       recorded started after its end and `cancelled`). A mark made ahead of the launch is
       refused by the script's guard (3.) all the same."""
    if (ran or first_start is not None) and j.state in WAITING:
        return "Slurm shows it pending again after it started (slurmctld lost its state)"
    moved = j.started and j.start_time is not None and first_start is not None
    if moved and abs(j.start_time - first_start) > MOVED_S:  # type: ignore[operator]
        return "Slurm started it again (its StartTime moved; slurmctld lost its state)"
    if launched_at is None or not j.started or j.start_time is None:
        return ""
    if relaunched_at is not None and j.start_time > launched_at + OWN_END_SLACK_S:
        return "Slurm launched it again after it had launched (slurmctld lost its state)"
    if j.start_time > launched_at + LAUNCHED_BEFORE_S:
        return "Slurm started it again after its command was launched (slurmctld lost its state)"
    return ""


def first_launch_end(
    own: OwnEnd | None,
    beat: float | None,
    started_at: float | None,
    now: float,
    window_s: float,
    last_seen: float | None,
    slurm_gone: bool,
) -> Ending | None:
    """Pure: how the first launch of a run Slurm restarted really ended; None while it may
    still run (its GPUs stay held).

    1. Its own end record, and no beat of its script's after it (`ends.record_beat`): as the
       record says (kept after its start and no earlier than a second before it was written):
       `exited` when the command ended by itself (exit 0: completed, however Slurm ends its
       re-run), `node_failure` when a signal came first (nobody in the ledger stopped it: Slurm
       killed it).
    2. No record and a heartbeat: gone once the beat is `window_s` old (`ends.beat_window`),
       ended a beat after its last (Slurm's SIGKILL leaves no record): `node_failure`.
    3. No heartbeat (a node that does not share the service's directory): gone once Slurm's
       job has ended and nothing of it holds GPUs (`slurm_gone`), ended when last seen running
       (`last_seen`, else its start, else now): `node_failure`."""
    why = "Slurm lost the run's state (slurmctld restarted) and launched it again"
    if own is not None:
        written = None if own.written is None else min(own.written, now)
        believed = record_beat(beat, written)
        if beat is None or believed is None or beat <= believed:
            low = started_at if started_at is not None else own.at
            if written is not None:
                low = max(low, written - OWN_END_SLACK_S)
            at = max(low, min(own.at, now))
            note = f"{why}; its first launch's own end record: exit {own.exit_code}"
            if own.signalled:
                return Ending(own.exit_code, at, "node_failure", note + " (killed by Slurm)")
            return Ending(own.exit_code, at, "exited", note)
    if beat is not None:
        if now < beat + window_s:
            return None
        at = min(now, beat + BEAT_EVERY_S)
        return Ending(-1, at, "node_failure", f"{why}; its first launch was killed by Slurm")
    if not slurm_gone:
        return None
    at = next((t for t in (last_seen, started_at) if t is not None), now)
    return Ending(-1, min(at, now), "node_failure", f"{why}; its first launch was killed")
