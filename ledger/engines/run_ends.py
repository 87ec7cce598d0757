"""A supervised run's start and end, as its run directories and its processes tell them, for
the supervised executor (`ledger.engines.supervised`): a part's end its supervisor wrote
(`take_end`), or, its supervisor dead, the one its leader recorded once its process tree is empty
(`orphaned`: the processes left behind get SIGTERM, then SIGKILL after the grace); a run started
once every part has (`all_started`, `start_of`) and ended with its parts (`exit_of`); a run no
handle remembers (`launched_before`, `ended_run`). An edge: reads the run directories, signals
orphaned trees."""

from __future__ import annotations

import logging
import math
import signal
from pathlib import Path

from ledger.cycle.executor import Exit, Start
from ledger.engines.proc import alive
from ledger.engines.runs import (
    Handle,
    Part,
    PartEnd,
    kept_stop,
    part_log,
    read_identity,
    read_started,
    recorded_end,
    run_name,
)
from ledger.engines.supervise import read_reaping, read_record, record_says_started
from ledger.engines.tree import Containment, Tree
from schemas.commands import RunEnd
from schemas.events import RunPart

log = logging.getLogger("gpuledger.agent")


def tree_of(p: Part, containment: Containment) -> Tree:
    """The part's process tree: its groups, or the session of its leader."""
    ident = read_identity(Path(p.rundir) / "job")
    return Tree(p.cgroup, containment, ident[0] if ident else None)


def take_end(p: Part, end: PartEnd | None) -> bool:
    """Take the end its supervisor wrote (`end`) into `p`; False when it wrote none."""
    if end is None:
        return False
    p.exit_code, p.ended_at, p.note = end.code, end.ended_at, end.note()
    p.launch_failed, p.fenced = bool(end.launch_failed), end.fenced
    p.leader_ended_at = end.leader_ended_at
    return True


def orphaned(p: Part, now: float | None, grace_s: float, containment: Containment) -> bool:
    """The supervisor died without writing the part's end: the tree and the leader's own
    record tell it instead. While the leader lives it is watched; processes it left when it
    ended get SIGTERM, then SIGKILL after the grace, as the supervisor would have done; the
    part ends once the tree is empty, with the code the leader recorded (a killed
    supervisor never turns an exit 0 into a failure)."""
    rundir = Path(p.rundir)
    ident = read_identity(rundir / "job")
    if ident is not None and alive(*ident):
        return False
    tree = tree_of(p, containment)
    if not tree.empty():
        if now is None:  # adopting: the first look acts
            return False
        if p.left_since is None:
            p.left_since = now
            tree.signal(signal.SIGTERM)
            return True
        # the SIGKILL its supervisor set before it died (`RUNDIR/reaping`), never a new grace
        # from its death (atk52-23 F7: a supervisor killed -9 in that grace restarted it)
        said = read_reaping(rundir)
        if now >= min(p.left_since + grace_s, said.kill_at if said else math.inf):
            tree.kill()
        return False
    record = read_record(rundir)
    if record is None or record.code is None:
        p.exit_code, p.lost, p.ended_at = -1, True, now
        log.warning("part %s of %s has no process and no exit code: lost", p.rank, rundir.parent)
        return True
    p.exit_code, p.launch_failed, p.note = record.code, bool(record.failed), record.failed
    p.ended_at = record.ended_at if p.left_since is None else now
    p.leader_ended_at = record.ended_at
    if p.left_since is not None:
        p.note = "processes its leader left behind were stopped after its supervisor died"
    log.info("part %s of %s: its supervisor died; its leader recorded %s", p.rank,
             rundir.parent, record.code)  # fmt: skip
    return True


def all_started(h: Handle) -> bool:
    """Every part's command runs (or ended): the job is running. A part has started once
    its supervisor named the leader (`job`, how readers find the run) and, when the leader
    says when its command starts (`marks_start`, maybe before the name), it said so."""

    def started(p: Part) -> bool:
        named = (Path(p.rundir) / "job").exists()
        return named and (not p.marks_start or record_says_started(Path(p.rundir)))

    return all(
        p.exit_code is not None or (Path(p.rundir) / "exit").exists() or started(p) for p in h.parts
    )


def start_of(h: Handle) -> Start:
    """The start of a run every part of which has started: when, the logs, each part's leader
    and its process tree."""
    began = [read_started(Path(p.rundir) / "job") for p in h.parts]
    parts = []
    for p in h.parts:
        ident = read_identity(Path(p.rundir) / "job")
        tree = p.cgroup or (f"session {ident[0]}" if ident else "")
        parts.append(
            RunPart(node=p.node, gpu_indices=p.gpu_indices, pid=ident[0] if ident else 0,
                    tree=tree)
        )  # fmt: skip
    known = [b for b in began if b is not None]
    return Start(
        h.job_id,
        engine_job_id=run_name(h.job_id, h.launch),
        run=h.launch - 1,
        logs=tuple(p.log for p in h.parts),
        started_at=max(known) if known else None,
        parts=tuple(parts),
    )


def exit_of(h: Handle, now: float) -> Exit:
    """The run's end: the failed part's code (or the first non-zero), when the last part's
    tree was empty, and why."""
    codes = [p.exit_code for p in sorted(h.parts, key=lambda p: p.rank)]
    code = h.failed_code
    if code is None:
        code = next((c for c in codes if c), 0)
    reason: RunEnd = "exited"
    if any(p.launch_failed for p in h.parts):
        reason = "launch_failed"
    elif any(p.fenced for p in h.parts):
        reason = "node_failure"
    elif h.stop_reason == "time_limit":
        reason = "time_limit"
    elif h.stop_reason == "drain":  # its agent drained the node: requeued when resumable
        reason = "drained"
    elif any(p.lost for p in h.parts):
        reason = "lost"
    ended = [p.ended_at for p in h.parts if p.ended_at is not None]
    note = "; ".join(dict.fromkeys(p.note for p in h.parts if p.note))
    return Exit(
        h.job_id, int(code or 0), max(ended) if ended else now, reason,
        run_name(h.job_id, h.launch), note=note,
    )  # fmt: skip


def ended_first(h: Handle) -> bool:
    """A run the ledger stopped whose every part's command (its leader) had ended before the
    stop reached it (`Handle.stop_at`): only processes the command left were still being
    reaped, so the run ended by itself (`Exit.by_itself`; its exit is its job's outcome:
    `ledger.core.runs.ended_meanwhile`). Before, such a run was told as stopped, and a
    preempted resumable job whose command had exited 0 ran again (atk52-23 F2)."""
    return h.stop_at is not None and all(
        p.leader_ended_at is not None and p.leader_ended_at <= h.stop_at
        and not (p.fenced or p.launch_failed or p.lost)
        for p in h.parts
    )  # fmt: skip


def commands_ended(h: Handle) -> bool:
    """Every part's command (its leader) has ended: the part has ended, or its supervisor
    reaps what the command left (`RUNDIR/reaping`), or, its supervisor dead, does it for it
    (`Part.left_since`). Such a run is past its command: a time limit no longer stops it (its
    leftovers get their SIGKILL at the command's end plus the grace, before the limit's), so a
    command that exited 0 before its limit ends `completed`, not `time_limit` (atk52-23 F2)."""
    return all(
        p.exit_code is not None or p.left_since is not None
        or read_reaping(Path(p.rundir)) is not None
        for p in h.parts
    )  # fmt: skip


def launched_before(state_dir: Path, job_id: int, launch: int) -> bool:
    """A supervisor of this launch was started here once (its identity file exists): a run
    with no handle is then one whose handles were lost, never one to launch again."""
    runs = state_dir / "runs" / run_name(job_id, launch)
    return any((d / "supervisor").exists() or (d / "job").exists() for d in runs.glob("*"))


def ended_run(
    state_dir: Path, job_id: int, run: int, now: float
) -> tuple[Start | None, Exit] | None:
    """The start and end of a run no handle remembers whose supervisors all wrote its end
    (the service stopped between reading it and recording it), as `observe` reports them;
    None while any part has not. No start for a launch that failed."""
    end = recorded_end(state_dir / "runs" / run_name(job_id, run + 1))
    if end is None:
        return None
    name = run_name(job_id, run + 1)
    runs = state_dir / "runs" / name
    dirs = sorted(
        (d for d in runs.glob("*") if d.is_dir()),
        key=lambda d: int(d.name) if d.name.isdigit() else -1,
    )
    began = [read_started(d / "job") for d in dirs]
    known = [b for b in began if b is not None]
    start = None
    if not end.launch_failed:  # where its output went, as its launch said (its specs)
        logs = tuple(part_log(d) for d in dirs)
        start = Start(job_id, name, run, logs=logs, started_at=max(known) if known else None)
    reason: RunEnd = "launch_failed" if end.launch_failed else "exited"
    if not end.launch_failed:
        reason = kept_stop([d for d in sorted(runs.glob("*")) if d.is_dir()]) or reason
    at = end.ended_at if end.ended_at is not None else now
    return start, Exit(job_id, end.code, at, reason, name, note=end.note())
