"""What a job is beyond its contract, as sbatch takes it: its world (working directory,
environment, output files, name), job arrays and dependencies.

Pure: no I/O, no clock. `decide` builds a submission's events here (`submissions`) and, after
every command, ends the jobs whose dependency a job's end has made impossible
(`dependents_ended`, Slurm's DependencyNeverSatisfied); the dispatcher's input leaves out the
pending jobs that may not run yet (`blocked`: a dependency not met, an earlier singleton, an
array at its running limit), and the queue says why. The text forms the CLI reads
(`--array=0-15%4`, `--dependency=afterok:5:6,singleton`) are parsed here too.

Dependencies are judged by one rule: a job that a dependency names and that has not ended keeps
the dependent waiting; a job that ended so that the dependency can never hold ends the dependent
at once, in the same append; so a pending job whose named jobs have all ended may run. A job id
that names a job array (its first task's id) stands for every task of the array. Ends are kept
for dependencies `ENDS_KEPT_S` after they happen (`State.ends`): a submission may name a job that
ended within that time; one that ended before is refused, as Slurm refuses a purged job.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ledger.core.state import ENDS_KEPT_S, Job, State
from schemas import commands as c
from schemas import events as e
from schemas.bounds import (
    ENV_NAME_PATTERN,
    MAX_ARRAY_INDEX,
    MAX_ARRAY_TASKS,
    MAX_DEPENDENCY_IDS,
    MAX_ENV_BYTES,
    MAX_FOREIGN_DEPENDENTS,
    MAX_JOB_ID,
    MAX_NAME,
    MAX_PATH,
    ArrayIndex,
    check,
)
from schemas.errors import InvalidCommand, InvalidTransition
from schemas.units import format_duration

DEFAULT_OUTPUT = "gpuledger-%j.out"
"""A job's output file when it names none (like sbatch's `slurm-%j.out`), in its directory."""
OUTPUT_ESCAPES = {"%": "%", "j": "job id", "J": "job id", "u": "user", "x": "job name"}
OUTPUT_ESCAPES |= {"a": "array task id", "A": "array job id", "N": "first node"}
_ESCAPE = re.compile(r"%(.)")
_ENV_NAME = re.compile(ENV_NAME_PATTERN)

Envelope = Callable[[], Mapping[str, Any]]
"""The common fields of the next event (`decide`'s stamp): id, time, actor."""


# --- a submission ---------------------------------------------------------------------------


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


TAKEN_MARGIN_S = 60
"""What a limit taken from Slurm's MaxTime leaves before MaxTime besides the job's grace: Slurm
checks time limits about every 30 s, so its TIMEOUT (with only KillWait) never comes first, as
the `--time` backstop leaves a minute past a limit and its grace (`backstop_minutes`)."""


MIN_TAKEN_S = 30
"""The shortest limit a job submitted without one takes from MaxTime (`taken_limit`)."""


def taken_limit(max_time_s: int, grace_s: float) -> int:
    """Pure: the time limit of a job submitted without one on an engine whose longest is
    `max_time_s` (Slurm's partition MaxTime: as Slurm gives a job without `--time` its
    partition's limit, rather than never running it): MaxTime less the job's grace and a minute
    (`TAKEN_MARGIN_S`), so the ledger stops it at its limit itself (SIGTERM, its grace, then
    SIGKILL) and Slurm's `--time` stays a backstop: limit + grace + a minute <= MaxTime, always.
    Refused (nothing recorded) when that leaves less than `MIN_TAKEN_S` (a MaxTime of a minute,
    or two under a long grace; atk62-slurm F1: a 30 s floor there let Slurm's TIMEOUT come
    first, and the run outlived MaxTime): the job asks a shorter `--grace` or its own `-t`."""
    limit = int(max_time_s - grace_s - TAKEN_MARGIN_S)
    if limit >= MIN_TAKEN_S:
        return limit
    fits = int(max_time_s - MIN_TAKEN_S - TAKEN_MARGIN_S)
    longest, grace = format_duration(max_time_s), format_duration(grace_s)
    raise InvalidCommand(
        f"no time limit given, and the partition's MaxTime ({longest}) cannot hold a limit of "
        f"{MIN_TAKEN_S}s, its grace ({grace}) and a minute before Slurm's TIMEOUT",
        hint=(f"ask --grace of at most {format_duration(fits)}, or " if fits >= 0 else "")
        + "give it a time limit with -t (within MaxTime)",
        max_time_s=max_time_s,
    )


def needs_s(time_limit_s: float, grace_s: float) -> float:
    """Pure: the longest time a run of this limit and grace may take before Slurm's TIMEOUT must
    not come: its limit, its grace (SIGTERM to SIGKILL) and a minute (`TAKEN_MARGIN_S`: Slurm
    checks time limits about every 30 s)."""
    return time_limit_s + grace_s + TAKEN_MARGIN_S


def over_max_time(time_limit_s: float | None, grace_s: float, max_time_s: float | None) -> bool:
    """Pure: a job of this limit and grace is not placed under this MaxTime (None: no limit;
    it waits `PARTITION_TIME_LIMIT`): Slurm would never start it (its limit over MaxTime, in
    Slurm's whole minutes), or would start it and its TIMEOUT would come before the ledger's
    SIGKILL (limit + grace + a minute over MaxTime: atk62b G2, a MaxTime lowered after the
    submit; the run outlived MaxTime), or it has no limit at all (Slurm would stop it at MaxTime,
    a limit nobody asked for: atk61-slurm F3). Decided from the log (`State.max_time_s`), in a
    cycle and its replay alike. The same rule as at submit (`taken_limit`, `grace_refused`)."""
    if max_time_s is None:
        return False
    return time_limit_s is None or needs_s(time_limit_s, grace_s) > max_time_s


def grace_refused(time_limit_s: int, grace_s: float, max_time_s: int) -> InvalidCommand | None:
    """Pure: why a job asking its own time limit is refused at submit (nothing recorded; None:
    it is not) under the recorded MaxTime: Slurm would start it (its limit within MaxTime, in
    whole minutes) but its TIMEOUT would come before the ledger's SIGKILL (limit + grace + a
    minute over MaxTime: atk62b G1, `-t 1 --grace 120s` on MaxTime=2 ran 152 s). The hint
    names the longest grace and the longest limit that fit. A limit over MaxTime itself is not
    refused: it waits until an admin raises MaxTime, as Slurm's `PartitionTimeLimit` does."""
    if (
        math.ceil(time_limit_s / 60) * 60 > max_time_s
        or needs_s(time_limit_s, grace_s) <= max_time_s
    ):
        return None
    grace_fits = int(max_time_s - time_limit_s - TAKEN_MARGIN_S)
    limit_fits = int(max_time_s - grace_s - TAKEN_MARGIN_S)
    hints = [f"--grace of at most {format_duration(grace_fits)}"] if grace_fits >= 0 else []
    hints += [f"a -t of at most {format_duration(limit_fits)}"] if limit_fits >= 1 else []
    limit, grace = format_duration(time_limit_s), format_duration(grace_s)
    return InvalidCommand(
        f"its time limit ({limit}), its grace ({grace}) and a minute do not fit in the "
        f"partition's MaxTime ({format_duration(max_time_s)}): Slurm's TIMEOUT would come "
        "before the ledger's SIGKILL",
        hint="ask " + ", or ".join(hints) if hints else together(max_time_s),  # atk63 L1
        max_time_s=max_time_s,
        time_limit_s=time_limit_s,
    )


def together(max_time_s: int) -> str:
    """Pure: the hint of a limit and a grace neither of which alone can be cut to fit."""
    room = int(max_time_s - TAKEN_MARGIN_S)
    if room < 1:
        return "MaxTime holds no limit, grace and a minute: ask an admin for a longer MaxTime"
    return f"ask a -t and a --grace of at most {format_duration(room)} together"


def unlimited_refused(max_time_s: int) -> InvalidCommand:
    """Pure: why a job that asked for no time limit (`-t 0`, `UNLIMITED`, `INFINITE`) is refused
    on an engine whose longest is `max_time_s`: Slurm would never start it (sbatch leaves it
    pending `PartitionTimeLimit`), so it is refused at submit, nothing recorded (atk62-slurm F5:
    it was taken as "no time limit given" and stopped at MaxTime's limit)."""
    return InvalidCommand(
        f"no time limit asked (-t UNLIMITED, INFINITE or 0), but the partition's MaxTime is "
        f"{format_duration(max_time_s)}: Slurm would never start it",
        hint="omit -t to take its limit from MaxTime, or ask one within MaxTime",
        max_time_s=max_time_s,
    )


def default_job_name(command: Sequence[str]) -> str:
    """Pure: a job's name when it is given none: its program's file name, as sbatch names a job
    after its script. The first word that is not a shell assignment (`NAME=value`): a command
    `HF_TOKEN=hf_... python train.py` was named after its first word, the token, which every
    user sees in `jobs` and the log, though the command is shown only to its owner (atk47-29
    F8). A command of assignments alone is named after none of them."""
    word = next((w for w in command if not _ASSIGNMENT.match(w)), "")
    return os.path.basename(word)[:255]


def submissions(
    state: State, cmd: c.SubmitJob, contract: Mapping[str, Any], kw: Envelope
) -> list[e.AnyEvent]:
    """Pure: the JobSubmitted events of `cmd` (one per task of an array, consecutive ids) with
    the contract `decide` settled (`contract`: account, user, gpus, min runtime, ...), once the
    job's world and its dependency are checked."""
    world = _world(cmd)
    dependency = _dependency(state, cmd.dependency)
    tasks: tuple[int | None, ...] = tuple(sorted(set(cmd.array))) or (None,)
    if cmd.array_limit is not None and not cmd.array:
        raise InvalidCommand("an array limit (`%N`) needs an array", hint="use --array=0-15%4")
    _room_to_wait(state, dependency, contract["user"], len(tasks))
    first = state.next_job_id
    return [
        e.JobSubmitted(
            **kw(),
            **contract,
            **world,
            job_id=first + i,
            array_job_id=None if task is None else first,
            array_task_id=task,
            array_limit=cmd.array_limit,
            dependency=dependency,
        )
        for i, task in enumerate(tasks)
    ]


def _world(cmd: c.SubmitJob) -> dict[str, Any]:
    """The checked working directory, environment, output patterns and name of `cmd`."""
    if cmd.workdir and not cmd.workdir.startswith("/"):
        raise InvalidCommand(
            f"the working directory {cmd.workdir!r} is not absolute",
            hint="pass an absolute path to -D/--chdir",
        )
    if cmd.umask is not None and cmd.umask & 0o700:
        raise InvalidCommand(
            f"umask {cmd.umask:04o} takes from the job's user its own rights to the files the "
            "job makes (its output file first)",
            hint="submit under a umask that leaves the owner's bits alone (0022, 0027, 0077)",
        )
    for what, text in (("working directory", cmd.workdir), ("job name", cmd.job_name)):
        if "\x00" in text or "\n" in text:
            raise InvalidCommand(f"the {what} holds a NUL or a newline")
    job_name = cmd.job_name or default_job_name(cmd.command)
    for flag, pattern in (("-o/--output", cmd.stdout), ("-e/--error", cmd.stderr)):
        check_pattern(pattern, flag, job_name)
        if pattern and not pattern.startswith("/") and not cmd.workdir:
            raise InvalidCommand(
                f"{flag} {pattern!r} is relative and the job has no working directory",
                hint="give an absolute path, or a working directory with -D/--chdir",
            )
    size = 0
    for name, value in cmd.env.items():
        if not _ENV_NAME.fullmatch(name):
            raise InvalidCommand(
                f"invalid environment variable name {name[:64]!r}",
                hint="names are letters, digits and '_', not starting with a digit",
            )
        if "\x00" in value:
            raise InvalidCommand(f"environment variable {name} holds a NUL byte")
        size += len(name) + len(value) + 2
    if size > MAX_ENV_BYTES:
        raise InvalidCommand(
            f"the job's environment is {size} bytes; at most {MAX_ENV_BYTES} are kept",
            hint="send fewer variables: --export=NONE or --export=VAR,...",
        )
    stdout = cmd.stdout or (DEFAULT_OUTPUT if cmd.workdir else "")
    return {
        "workdir": cmd.workdir,
        "env": dict(sorted(cmd.env.items())),
        "stdout": stdout,
        "stderr": cmd.stderr,
        "job_name": job_name,
        "umask": cmd.umask,
        "ulimits": None if cmd.ulimits is None else dict(sorted(cmd.ulimits.items())),
    }


_WIDEST = {"%": 1, "j": len(str(MAX_JOB_ID)), "J": len(str(MAX_JOB_ID)), "u": MAX_NAME}
_WIDEST |= {"A": len(str(MAX_JOB_ID)), "a": len(str(MAX_ARRAY_INDEX)), "N": MAX_NAME}


def longest_output(pattern: str, job_name: str) -> int:
    """Pure: the most characters `pattern` can make once `expand_output` writes it out for a job
    named `job_name` (every other escape at its widest: `schemas.bounds`)."""
    escapes = _ESCAPE.findall(pattern)
    widths = sum(len(job_name) if k == "x" else _WIDEST.get(k, 2) for k in escapes)
    return len(pattern) - 2 * len(escapes) + widths


def check_pattern(pattern: str, flag: str, job_name: str = "") -> None:
    """Pure: an output file pattern uses only the escapes `expand_output` knows, and written out
    it stays a `Path` (MAX_PATH): what every reader of the launch takes (`bounds.MAX_LOG_PATH`;
    thirty `%x` of a 200-character name made a 6,000-character file name that wedged the
    job's node: atk46-23 F13)."""
    if "\x00" in pattern or "\n" in pattern:
        raise InvalidCommand(f"{flag} holds a NUL or a newline")
    for m in _ESCAPE.finditer(pattern.replace("%%", "")):
        if m.group(1) not in OUTPUT_ESCAPES:
            known = ", ".join(f"%{k} ({v})" for k, v in OUTPUT_ESCAPES.items() if k != "%")
            raise InvalidCommand(
                f"{flag} {pattern!r}: %{m.group(1)} is not a pattern this ledger writes",
                hint=f"use {known}, %% for a percent sign",
            )
    if pattern.endswith("%") and not pattern.endswith("%%"):
        raise InvalidCommand(f"{flag} {pattern!r} ends with a lone %", hint="write %% for a %")
    if (longest := longest_output(pattern, job_name)) > MAX_PATH:
        raise InvalidCommand(
            f"{flag} {pattern[:60]!r}... can name a file of {longest:,} characters once written "
            f"out; at most {MAX_PATH:,}",
            hint="use a shorter output pattern (fewer %x, %N or %u, or a shorter job name)",
        )


def expand_output(
    pattern: str,
    *,
    job_id: int,
    user: str,
    job_name: str,
    array_job_id: int | None,
    array_task_id: int | None,
    node: str,
) -> str:
    """Pure: an output pattern with its escapes written out (`%j` job id, `%u` user, `%x` job
    name, `%A` array job id, `%a` array task id, `%N` the first node, `%%` a percent sign); a job
    that is no array writes its own id for `%A` and 0 for `%a`."""
    values = {
        "%": "%",
        "j": str(job_id),
        "J": str(job_id),
        "u": user,
        "x": job_name,
        "A": str(job_id if array_job_id is None else array_job_id),
        "a": str(0 if array_task_id is None else array_task_id),
        "N": node,
    }
    return _ESCAPE.sub(lambda m: values.get(m.group(1), m.group(0)), pattern)


# --- dependencies ---------------------------------------------------------------------------


def _dependency(state: State, terms: Iterable[e.Dependency]) -> tuple[e.Dependency, ...]:
    """The dependency as recorded, once every job it names is known and may still satisfy it
    (a job that ended so that it never can is refused here, with nothing appended).

    An id named again under the same kind adds nothing (every term must hold): it is dropped,
    and a term left with none. What is left names at most `MAX_DEPENDENCY_IDS` ids, counted
    before any is looked up, and each is looked up once, an array's ends found in one pass over
    the kept ends (every id was looked up, repeats included, each an array's walk: a plain
    user's 825 KB submit naming one array 204,800 times held the server 50 s, atk45-25 F3)."""
    out: list[e.Dependency] = []
    named: dict[str, set[int]] = {}
    for term in terms:
        if term.kind == "singleton":
            if term.job_ids:
                raise InvalidCommand("singleton names no jobs", hint="use --dependency=singleton")
            if not any(t.kind == "singleton" for t in out):
                out.append(term)
            continue
        if not term.job_ids:
            raise InvalidCommand(f"{term.kind} names no job", hint=f"use {term.kind}:JOB[:JOB]")
        seen = named.setdefault(term.kind, set())
        fresh = tuple(j for j in dict.fromkeys(term.job_ids) if j not in seen)
        seen.update(fresh)
        if sum(map(len, named.values())) > MAX_DEPENDENCY_IDS:
            raise InvalidCommand(
                f"the dependency names over {MAX_DEPENDENCY_IDS:,} jobs (each counted once per "
                f"kind); at most {MAX_DEPENDENCY_IDS:,} are taken",
                hint="name an array by its id (it stands for every task), or fewer jobs",
            )
        if fresh:
            out.append(e.Dependency(kind=term.kind, job_ids=fresh))
    ends = _ends_named(state, {j for ids in named.values() for j in ids})
    for term in out:
        for job_id in term.job_ids:
            _dependable(state, term.kind, job_id, ends.get(job_id, []))
    return tuple(out)


def _room_to_wait(state: State, dependency: Iterable[e.Dependency], user: str, count: int) -> None:
    """None when `count` more jobs of `user` may wait on every job `dependency` names, else one
    `InvalidTransition`: a job of another user may have at most `MAX_FOREIGN_DEPENDENTS`
    unfinished jobs waiting on it once they are added (its end ends those its end makes
    impossible in the same write). One look at each named job: the index keeps the counts."""
    waiting = state.dependents()
    for job_id in sorted({j for term in dependency for j in term.job_ids}):
        parent = state.jobs.get(job_id)
        if parent is None or parent.spec.user == user:
            continue
        now = len(waiting.get(job_id, ()))
        if now + count > MAX_FOREIGN_DEPENDENTS:
            raise InvalidTransition(
                f"job {job_id} is another user's and {now:,} unfinished jobs wait on it: "
                f"{count:,} more would pass the {MAX_FOREIGN_DEPENDENTS:,} another user's jobs "
                "may bring it to",
                hint="depend on your own jobs, or wait for some of those to end",
                job_id=job_id,
            )


def _ends_named(state: State, ids: set[int]) -> dict[int, list[str]]:
    """`ends_of` each of `ids` (how the job, or every task of the array it names, ended), in
    one pass over the kept ends for them all."""
    if not ids:
        return {}
    out = {j: [state.ends[j][0]] for j in ids if j in state.ends}
    for jid, (why, _, arr) in state.ends.items():
        if arr is not None and arr != jid and arr in ids:
            out.setdefault(arr, []).append(why)
    return out


def _dependable(state: State, kind: e.DependencyKind, job_id: int, ends: list[str]) -> None:
    """None when `kind:job_id` names a job that may still satisfy it, `ends` how it (or every
    task of the array it names) ended; else one `InvalidCommand`."""
    if not 0 < job_id < state.next_job_id:
        raise InvalidCommand(f"{kind}:{job_id}: there is no job {job_id}", job_id=job_id)
    live = job_id in state.active or bool(state.array_tasks(job_id))
    if never_met(kind, ends, live):
        ended_as = next((why for why in ends if not satisfies(kind, why)), ends[0])
        what = f"job {job_id} ended {ended_as}"
        if len(ends) > 1:  # an array: every task has ended
            what = f"the tasks of array {job_id} ended {', '.join(sorted(set(ends)))}"
        raise InvalidCommand(f"{kind}:{job_id} can never be satisfied: {what}", job_id=job_id)
    if not live and not ends:
        raise InvalidCommand(
            f"{kind}:{job_id}: job {job_id} ended over {ENDS_KEPT_S / 3600:g} h ago, and its end "
            "is no longer kept for dependencies",
            hint="depend on jobs that have not ended, or ended recently",
            job_id=job_id,
        )


def satisfies(kind: e.DependencyKind, ended_as: str) -> bool:
    """Pure: whether a job that ended for `ended_as` (a `FinishReason`) meets `kind`."""
    if kind == "afterok":
        return ended_as == "completed"
    if kind == "afternotok":
        return ended_as != "completed"
    return True


def never_met(kind: e.DependencyKind, ends: Sequence[str], live: bool) -> bool:
    """Pure: whether a dependency `kind` on a job, or on every task of an array (Slurm: a
    dependency on an array's id waits for every task), can no longer hold, from how its members
    ended (`ends`) and whether one has not ended yet (`live`): `afterok` once one did not
    complete; `afternotok` once all ended and every one completed; `afterany` never."""
    completed = sum(why == "completed" for why in ends)
    return never_met_counted(kind, len(ends), completed, live)


def never_met_counted(kind: e.DependencyKind, ended: int, completed: int, live: bool) -> bool:
    """Pure: `never_met` from how many members ended and how many of those completed."""
    if kind == "afterok":
        return ended > completed
    if kind == "afternotok":
        return not live and ended > 0 and completed == ended
    return False


def ends_of(state: State, job_id: int) -> list[str]:
    """How the job `job_id`, or every task of the array it names, ended (kept ends only)."""
    got = state.ends.get(job_id)
    out = [got[0]] if got is not None else []
    return out + [why for jid, (why, _, arr) in state.ends.items() if arr == job_id != jid]


def active_ids(state: State, job_id: int) -> list[int]:
    """The unfinished jobs `job_id` stands for: itself, and the tasks of the array it names."""
    out = [job_id] if job_id in state.active else []
    return out + sorted(j for j in state.array_tasks(job_id) if j != job_id)


def dependents_ended(state: State, events: list[e.AnyEvent], kw: Envelope) -> list[e.AnyEvent]:
    """Pure: the ends of the pending jobs whose dependency the jobs `events` end have made
    impossible (and of theirs in turn), in job order: what `decide` appends after every
    command. The kept ends are walked once, whatever the number of dependents (`_Ends`)."""
    ending = deque(ev for ev in events if isinstance(ev, e.JobFinished))
    if not ending or not state.dependents():
        return []
    done = _Ends(state, {ev.job_id: ev.reason for ev in ending})
    out: list[e.AnyEvent] = []
    while ending:
        ev = ending.popleft()
        job = state.jobs.get(ev.job_id)
        keys = {ev.job_id} | ({job.spec.array_job_id} if job and job.spec.array_job_id else set())
        for child_id in sorted({d for k in keys for d in state.dependents().get(k, ())}):
            child = state.jobs.get(child_id)
            if child is None or child_id in done.reasons or not child.active:
                continue
            hit = next(
                (
                    (t, named)
                    for t in child.spec.dependency
                    for named in sorted(keys & set(t.job_ids))
                    if done.never_now(t.kind, named)
                ),
                None,
            )
            if hit is None:
                continue
            term, named = hit
            what = f"job {named}" if named == ev.job_id else f"task {ev.job_id} of array {named}"
            if term.kind == "afternotok" and named != ev.job_id:
                what = f"every task of array {named} completed (the last, {ev.job_id})"
                note = f"{what}: {term.kind}:{named} can never be satisfied"
            else:
                note = f"{what} ended {ev.reason}: {term.kind}:{named} can never be satisfied"
            end = e.JobFinished(
                **kw(),
                job_id=child_id,
                outcome="cancelled",
                reason="dependency_never_satisfied",
                note=note,
            )
            done.add(child_id, end.reason)
            out.append(end)
            ending.append(end)
    return out


@dataclass
class _Named:
    """How the members of a job or array a dependency names stand: `members` ({it} and its
    unfinished tasks), `active` (those unfinished), and counts over the kept ends and the ends
    being appended."""

    members: set[int]
    active: set[int]
    ended: int
    completed: int
    live: int


class _Ends:
    """The ends a dependency is judged on while `dependents_ended` runs: the state's kept ends
    (walked once, at the first need, into an index by array) and the ends being appended
    (`reasons`: job id -> how it ends; `state` is before them), counted per job or array named.
    A job's end with 10,000 pending dependents walked 20,000 kept ends once for each: 49 s."""

    def __init__(self, state: State, reasons: dict[int, str]) -> None:
        self.state = state
        self.reasons = reasons
        self._tasks_ended: dict[int, list[str]] | None = None
        self._named: dict[int, _Named] = {}

    def _kept(self, named: int) -> list[str]:
        """`ends_of(state, named)` from one walk of the kept ends for every `named`."""
        if self._tasks_ended is None:
            index: dict[int, list[str]] = {}
            for jid, (why, _at, array) in self.state.ends.items():
                if array is not None and array != jid:
                    index.setdefault(array, []).append(why)
            self._tasks_ended = index
        got = self.state.ends.get(named)
        return ([got[0]] if got is not None else []) + self._tasks_ended.get(named, [])

    def _of(self, named: int) -> _Named:
        hit = self._named.get(named)
        if hit is None:
            members = {named} | self.state.array_tasks(named)
            active = set(active_ids(self.state, named))
            reasons = self.reasons
            if len(members) <= len(reasons):
                appended = [reasons[j] for j in members if j in reasons]
            else:
                appended = [why for j, why in reasons.items() if j in members]
            ends = self._kept(named) + appended
            completed = sum(why == "completed" for why in ends)
            live = sum(j not in reasons for j in active)
            hit = self._named[named] = _Named(members, active, len(ends), completed, live)
        return hit

    def never_now(self, kind: e.DependencyKind, named: int) -> bool:
        """Whether `kind:named` can no longer hold once the ends so far are appended."""
        n = self._of(named)
        return never_met_counted(kind, n.ended, n.completed, n.live > 0)

    def add(self, job_id: int, why: str) -> None:
        """The job `job_id` ends too (it had not, in `reasons`), for `why`."""
        self.reasons[job_id] = why
        job = self.state.jobs.get(job_id)
        array = job.spec.array_job_id if job is not None else None
        for named in (job_id,) if array is None or array == job_id else (job_id, array):
            n = self._named.get(named)
            if n is None or job_id not in n.members:
                continue
            n.ended += 1
            n.completed += why == "completed"
            n.live -= job_id in n.active


# --- who may run now ------------------------------------------------------------------------

BlockCode = Literal["WAIT_DEPENDENCY", "WAIT_ARRAY_LIMIT", "PARTITION_TIME_LIMIT"]
"""`PARTITION_TIME_LIMIT` (Slurm's `PartitionTimeLimit`): a time limit over the longest its
engine starts (`ledger.reads.preview.too_long_waits`); the reads' alone, `blocked` gives the
other two."""


@dataclass(frozen=True)
class Blocked:
    """Why a pending job may not be placed yet, whatever the GPUs: a code and its words."""

    code: BlockCode
    reason: str


def blocked_now(state: State) -> dict[int, Blocked]:
    """Pure: `blocked` as a cycle decides now, with every rule of the stopping runs it holds
    (what the reads show)."""
    return blocked(state, hold_stopping=True, hold_lost=True, hold_placed=True)


def blocked(
    state: State,
    live: list[Job] | None = None,
    hold_stopping: bool = False,
    hold_lost: bool = False,
    hold_placed: bool = False,
) -> dict[int, Blocked]:
    """Pure: the pending (not held) jobs that may not be placed yet, by job id: a dependency
    not met (`WAIT_DEPENDENCY`, Slurm's `Dependency`), an earlier job of the same user and name
    for a singleton, or an array with as many tasks holding GPUs as its limit allows
    (`WAIT_ARRAY_LIMIT`, Slurm's `JobArrayTaskLimit`); the rest of an array's pending tasks in
    task order until the limit is reached may run. `live`: the state's unfinished jobs in id
    order, when the caller has them. `hold_stopping` (every cycle that holds stopping GPUs,
    `CycleDecided.stopping_held`): a job whose record ended while the run the ledger stopped
    lives out its grace has not ended for its dependents, and a task so stopping holds its
    array's limit, as Slurm waits for a job's end (atk48-23 F5: a `%1` array's next task and an
    `afterany` job ran beside a cancelled job's processes), and keeps its name for a
    `singleton` (as squeue's `CG` job does). `hold_lost` (`CycleDecided.lost_held`): so does a
    job an admin's `node lost` ended while its processes may live (`NODE_LOST`, s50);
    `hold_placed` (`CycleDecided.placed_held`): and a job stopped while `placed` whose launch
    may run unheard (`StoppedRun.placed`, s52)."""
    out: dict[int, Blocked] = {}
    if live is None:
        jobs = state.jobs
        live = [jobs[i] for i in sorted(state.active)]
    asking = [j for j in live if j.spec.dependency or j.spec.array_limit is not None]
    if not asking:  # the common case: one look at each live job
        return out
    holding: dict[int, int] = {}
    names: dict[tuple[str, str], int] = {}
    for job in live:
        spec = job.spec
        if spec.array_job_id is not None and job.status in ("placed", "running"):
            holding[spec.array_job_id] = holding.get(spec.array_job_id, 0) + 1
        names.setdefault((spec.user, spec.job_name), spec.job_id)
    held = hold_stopping and state.stopped_runs
    stopping = state.stopping_arrays(hold_lost, hold_placed) if held else {}
    stopping_names: dict[tuple[str, str], int] = {}
    for array in stopping.values():
        if array is not None:
            holding[array] = holding.get(array, 0) + 1
    for j in stopping:  # a stopping job keeps its name for a singleton, as its processes live
        name = _stopping_name(state, j)
        if name is not None:
            stopping_names[name] = min(j, stopping_names.get(name, j))
    for job in asking:
        if job.status != "pending" or job.held:
            continue
        why = _waits_for(state, job, names, stopping, stopping_names)
        if why is not None:
            out[job.job_id] = Blocked("WAIT_DEPENDENCY", why)
            continue
        spec = job.spec
        if spec.array_job_id is not None and spec.array_limit is not None:
            running = holding.get(spec.array_job_id, 0)
            if running >= spec.array_limit:
                out[job.job_id] = Blocked(
                    "WAIT_ARRAY_LIMIT",
                    f"{running} tasks of array {spec.array_job_id} hold GPUs or go next, its "
                    f"limit (%{spec.array_limit})",
                )
            else:
                holding[spec.array_job_id] = running + 1  # this task may go: count it
    return out


def _stopping_name(state: State, job_id: int) -> tuple[str, str] | None:
    """Pure: the (user, name) a stopping job holds for a `singleton`: its stopped run's, else
    its record's (a run kept in a snapshot before runs kept their name); None: unknown."""
    for sr in state.stopped_of(job_id):
        if sr.job_name is not None:
            return (sr.user, sr.job_name)
    job = state.jobs.get(job_id)
    return None if job is None else (job.spec.user, job.spec.job_name)


def _waits_for(
    state: State,
    job: Job,
    names: Mapping[tuple[str, str], int],
    stopping: Mapping[int, int | None] | None = None,
    stopping_names: Mapping[tuple[str, str], int] | None = None,
) -> str | None:
    """Pure: what `job`'s dependency still waits for, in words; None when it is met.
    `stopping`: jobs whose stopped run is in its grace (`State.stopping_arrays`): not ended;
    `stopping_names`: the (user, name) such jobs hold for a singleton (the least job id)."""
    for term in job.spec.dependency:
        if term.kind == "singleton":
            key = (job.spec.user, job.spec.job_name)
            first = names.get(key)
            if first is not None and first != job.job_id:
                return f"singleton: job {first} of {job.spec.user} named {job.spec.job_name!r}"
            holder = (stopping_names or {}).get(key)
            if holder is not None and holder != job.job_id:
                return (
                    f"singleton: job {holder} of {job.spec.user} named {job.spec.job_name!r} "
                    "is stopping (its processes in their grace)"
                )
            continue
        # the first 11 only: the words show 10 (a cycle asks this of every pending dependent)
        live = (j for i in term.job_ids for j in active_ids(state, i))
        waiting = list(itertools.islice(live, 11))
        if waiting:
            shown = ", ".join(map(str, waiting[:10])) + (" ..." if len(waiting) > 10 else "")
            return f"{term.kind}: job {shown} has not ended"
        if stopping:
            ids = set(term.job_ids)
            held = sorted(j for j, a in stopping.items() if j in ids or a in ids)
            if held:
                shown = ", ".join(map(str, held[:10])) + (" ..." if len(held) > 10 else "")
                return f"{term.kind}: job {shown} is stopping (its processes in their grace)"
    return None


# --- the text forms the CLI reads -----------------------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_array(text: str) -> tuple[tuple[int, ...], int | None]:
    """Pure: Slurm's `--array` (`0-15`, `1,3,5`, `0-15:2`, `0-15%4`) as (task indices, limit)."""
    spec, _, limit_text = text.strip().partition("%")
    tasks: set[int] = set()
    for part in spec.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise InvalidCommand(
                f"invalid --array {text!r}", hint="use e.g. 0-15, 1,3,5, 0-15:2 or 0-15%4"
            )
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        step = int(m[3]) if m[3] is not None else 1
        if hi < lo or step < 1:
            raise InvalidCommand(f"invalid --array {text!r}: {part.strip()} is an empty range")
        if (hi - lo) // step + 1 + len(tasks) > MAX_ARRAY_TASKS:
            raise InvalidCommand(f"--array {text!r} has over {MAX_ARRAY_TASKS} tasks")
        tasks.update(range(lo, hi + 1, step))
    for task in tasks:
        check(task, ArrayIndex, "--array task")
    limit: int | None = None
    if limit_text:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise InvalidCommand(f"invalid --array limit {'%' + limit_text!r}", hint="use %4")
        limit = int(limit_text)
    return tuple(sorted(tasks)), limit


_KINDS = ("afterok", "afterany", "afternotok", "singleton")


def parse_dependency(text: str) -> tuple[e.Dependency, ...]:
    """Pure: Slurm's `--dependency` (`afterok:5:6`, `afterany:7,afternotok:8`, `singleton`) as
    its terms; every term must hold (Slurm's `?`, any of them, is refused by name)."""
    if "?" in text:
        raise InvalidCommand(
            f"--dependency {text!r}: '?' (any of the terms) is not supported",
            hint="separate terms with ',': all of them must hold",
        )
    out: list[e.Dependency] = []
    for part in text.strip().split(","):
        kind, *ids = part.strip().split(":")
        if kind not in _KINDS:
            raise InvalidCommand(
                f"--dependency {text!r}: {kind!r} is not a dependency this ledger knows",
                hint="use afterok, afterany, afternotok (with :JOB[:JOB]) or singleton",
            )
        if any(not x.isdigit() or int(x) < 1 for x in ids):
            bad = next(x for x in ids if not x.isdigit() or int(x) < 1)
            hint = "a job array is named by its first task's job id" if "_" in bad else ""
            raise InvalidCommand(f"--dependency {text!r}: {bad!r} is no job id", hint=hint)
        out.append(e.Dependency(kind=kind, job_ids=tuple(int(x) for x in ids)))  # type: ignore[arg-type]
    return tuple(out)
