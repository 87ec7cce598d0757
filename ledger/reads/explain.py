"""Plain-words answers to "why is my job pending / placed there / preempted?".

Pure: takes the job's recorded history, the decisions that touched it and (for a pending job) a
live decision with its snapshot; returns sentences. No I/O, no clock: `now` is a parameter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ledger.core.state import FORGOTTEN_PREFIX
from ledger.reads.stopping import (
    STOPPING,
    holding_reason,
    is_stopping,
    kill_words,
    limit_kill_at,
    past_limit,
    reaping_kill,
    stopping_note,
)
from schemas import events as e
from schemas.units import key_text, limit_words, plural, span, times_in, when

if TYPE_CHECKING:  # annotations only: `explain`'s time words load without the dispatcher
    from ledger.core.state import Job, State, StoppedRun
    from ledger.dispatch.decision import Decision
    from ledger.dispatch.engine import Unplaceable
    from ledger.dispatch.policy import Policy
    from ledger.dispatch.snapshot import PendingJob, Snapshot

_RAW_TIME = re.compile(r"\bt=\d+(?:\.\d+)?(?:e\+?\d+)?")
"""A raw time in a dispatcher reason (`t=1.76723e+09`): six digits, so shown from `until`."""


def _fs(value: float | None) -> str:
    if value is None:
        return "unknown"
    return "inf (no recent usage)" if math.isinf(value) else f"{value:.3g}"


def contract_line(job: Job, now: float) -> str:
    spec = job.spec
    if not job.funded:
        return "It is unfunded (min runtime 0): free, never charged, preemptible at any time."
    ends = job.contract_ends_at()
    if ends is None:
        return f"Its contract: {span(spec.min_runtime_s)} without preemption once placed."
    if now < ends:
        return (
            f"Its contract protects it until {when(ends)} (another {span(ends - now)}); "
            "after that better-ranked work may preempt it."
        )
    return f"Its contract ended at {when(ends)}: better-ranked work may preempt it now."


def protected_note(
    policy: Policy | None,
    snapshot: Snapshot,
    job: PendingJob | None,
    wait: Unplaceable | None,
    now: float,
) -> str:
    """Pure, at read time: what a job told only "no node with N free GPUs" is waiting for when
    preempting running jobs would make room but they are protected (not resumable, the ratio of
    the teams' shares below `spare_ratio`: `FairShare2.protected`), as "; ..." to add to its
    reason; "" otherwise. The recorded reason is the dispatcher's, byte for byte (atk34-26 F4)."""
    from ledger.dispatch.fairshare2 import FairShare2

    if job is None or wait is None or wait.code != "WAIT_RESOURCES":
        return ""
    if not isinstance(policy, FairShare2) or not wait.reason.startswith("no node with"):
        return ""  # a cost refusal or a reservation says its own why
    shielded = policy.protected(job, snapshot, now)
    free = sum(len(n.free) for n in snapshot.nodes if n.state == "active")
    if not shielded or free + sum(r.gpus for r, _ in shielded) < job.gpus:
        return ""
    named = "; ".join(f"job {r.job_id} ({r.account}, {plural(r.gpus, 'GPU')}): {why}"
                      for r, why in shielded[:3])  # fmt: skip
    more = f" and {plural(len(shielded) - 3, 'more job')}" if len(shielded) > 3 else ""
    return (
        f"; preempting would make room, but the victims are protected: {named}{more} (policy "
        f"{policy.version}: a job that is not resumable is preempted for fairness only when the "
        f"ratio of the teams' fair shares is at least spare_ratio {policy.spare_ratio:g}; it "
        "waits until then, or until they end)"
    )


def explain_pending(
    job: Job,
    decision: Decision,
    snapshot: Snapshot,
    now: float,
    policy: Policy | None = None,
    state: State | None = None,
) -> list[str]:
    """Why a pending job waits, from a live decision on the current snapshot (by `policy`:
    what protects the victims a preemption would take, `protected_note`; with the live
    `state`: the stopping GPUs it waits for, `stopping_note`)."""
    spec = job.spec
    order = [j.job_id for _, j in decision.order]
    out = [_headline(job) + " is pending."]
    if spec.job_id not in order:
        return [*out, "The dispatcher did not consider it (no such pending job in the snapshot)."]
    i = order.index(spec.job_id)
    out.append(
        f"It is #{i + 1:,} of {len(order):,} in the queue "
        f"(sort key {key_text(decision.order[i][0])})."
    )
    out.append(_rank_line(spec.account, spec.user, snapshot))
    ahead = _pending_by_id(snapshot, order[:i])
    if ahead:
        by_team: dict[str, list[int]] = {}
        for p in ahead:
            by_team.setdefault(p.account, []).append(p.gpus)
        teams = ", ".join(
            f"{t}: {plural(len(g), 'job')}, {plural(sum(g), 'GPU')}"
            for t, g in sorted(by_team.items(), key=lambda kv: -sum(kv[1]))[:5]
        )
        out.append(
            f"Ahead of it: {plural(len(ahead), 'job')} needing "
            f"{plural(sum(p.gpus for p in ahead), 'GPU')} ({teams})."
        )
    wait = decision.waiting.get(spec.job_id)
    if wait is None:
        out.append("It would be placed in the next cycle.")
    else:
        until = f" (room from {when(wait.until)})" if wait.until is not None else ""
        reason = (
            _RAW_TIME.sub(when(wait.until), wait.reason) if wait.until is not None else wait.reason
        )
        pending = _pending_by_id(snapshot, [spec.job_id])
        mine = pending[0] if pending else None
        note = protected_note(policy, snapshot, mine, wait, now)
        if state is not None:
            note += stopping_note(state, snapshot, mine, wait)
        out.append(f"It waits: {wait.code}: {reason}{until}{note}.")
    if not job.funded:
        out.append("Unfunded work goes after all funded work and may be preempted at any time.")
    return out


def _headline(job: Job) -> str:
    s = job.spec
    kind = "funded" if job.funded else "unfunded"
    debug = ", debug class" if s.debug else ""
    return f"Job {s.job_id} ({s.account}, {s.user}, {plural(s.gpus, 'GPU')}, {kind}{debug})"


def _pending_by_id(snapshot: Snapshot, ids: Sequence[int]) -> list[PendingJob]:
    by_id = {p.job_id: p for p in snapshot.pending}
    return [by_id[i] for i in ids if i in by_id]


def _rank_line(account: str, user: str, snapshot: Snapshot) -> str:
    key = snapshot.rank_key(account, user)
    rank = snapshot.ranks.get(key)
    if rank is None:
        return f"{key} has no fair-share rank yet."
    depth = key.count("/")
    ahead = sum(1 for k, r in snapshot.ranks.items() if k.count("/") == depth and r < rank)
    line = (
        f"Its fair-share rank: {rank + 1} ({key}), with {ahead} accounts ranked ahead; "
        f"level fair share of {account}: {_fs(snapshot.level_fs.get(account))}"
    )
    siblings = _level_siblings(account, snapshot.level_fs)
    if siblings:
        leader = max(siblings.items(), key=lambda kv: (kv[1], kv[0]))
        if leader[0] != account and leader[1] != snapshot.level_fs.get(account):
            line += f"; the leading sibling {leader[0]} has {_fs(leader[1])}"
    return line + "."


def _level_siblings(account: str, level_fs: Mapping[str, float]) -> dict[str, float]:
    parent = account.rsplit("/", 1)[0] if "/" in account else ""
    out = {}
    for path, value in level_fs.items():
        p = path.rsplit("/", 1)[0] if "/" in path else ""
        if p == parent and path.count("/") == account.count("/"):
            out[path] = value
    return out


_FINISH_WORDS: dict[str, str] = {
    "completed": "completed: it exited 0",
    "failed": "failed: it exited non-zero, or its run ended some other way",
    "cancelled": "was cancelled",
    "time_limit": "was stopped at its time limit (SIGTERM, its grace, then SIGKILL)",
    "preempted": "was preempted, and as it is not resumable it ended there",
    "node_lost": "ended with its node, which was lost (not resumable, so not requeued)",
    "dependency_never_satisfied": (
        "will never run: a job it depends on ended so that its dependency can never hold "
        "(Slurm's DependencyNeverSatisfied)"
    ),
    "launch_failed": "could not be started",
}
"""Every `FinishReason` in words (tests check each one has words)."""
_DRAINED_WORDS = (
    "was stopped when its node was drained for maintenance (`gpuledger agent --drain`), and as "
    "it is not resumable it ended there"
)
"""A job `agent --drain` stopped: `preempted` as a drained node's jobs end, though no
preemption was decided or recorded."""


def finish_line(ev: e.JobFinished) -> str:
    """Pure: a job's end in one sentence: why, with its exit code and note."""
    from ledger.core.state import DRAINED_NOTE

    words = _FINISH_WORDS.get(ev.reason, f"ended {ev.reason}")
    note = f" ({times_in(ev.note)})" if ev.note else ""  # its raw `t=` times as times
    if ev.reason == "preempted" and ev.note == DRAINED_NOTE:  # no preemption: its node's drain
        words, note = _DRAINED_WORDS, ""
    if ev.reason == "cancelled":
        words += (
            " outside the ledger (in its engine)"
            if ev.actor.startswith("@")
            else (f" by {ev.actor}")
        )
    code = f", exit code {ev.exit_code}" if ev.exit_code is not None else ""
    later = _recorded(ev.ended_at, ev.at)
    return f"{when(_real(ev.ended_at, ev.at))} it {words}{code}{note}{later}."


def run_ended_line(
    ev: e.JobRunEnded,
    cut: bool = False,
    charged_to: float | None = None,
    started: bool = True,
    seen: bool = False,
) -> str:
    """Pure: a stopped run's real end in one sentence: its processes outlived the stop by up
    to their grace, holding (and charged for) its GPUs until then; a run stopped before the
    ledger saw it start, from its own start (`started_at`, atk44s F3). `cut`: a cancel cut its
    grace (a second cancel, or a cancel past its time limit): killed at once, not at its end.
    A run whose command ended by itself says its code (a cancel recorded before that exit
    was reported keeps the job `cancelled`). `charged_to`: its charge ended earlier, with its
    engine's end of it (a `node lost` that failed its job: `JobEngineEnded`, the end of the
    interval `usage` and `jobs` read, `projections/apply.sql` `intervals_run_ended`; atk50b-23
    F3: it said charged until then). `started`: False when no start of the run was recorded
    and its end says none: it never started, nothing of it was charged (atk55-23 F2: it said
    "held, and charged"). `seen`: its start was recorded before this end: its own start (the
    node agents' parts say one at every stop) is then no start the ledger missed (atk58 F7: it
    said "the ledger had stopped it before seeing it start" of runs recorded started)."""
    if not started and ev.started_at is None:
        note = f" ({ev.note})" if ev.note else ""
        return (
            f"{when(_real(ev.ended_at, ev.at))} its run {ev.run} ended{note}: it never "
            f"started, so it was not charged{_recorded(ev.ended_at, ev.at)}."
        )
    held = "held, and charged," if charged_to is None else "held"
    charge = "" if charged_to is None else f" (charged until {when(charged_to)}, the job's end)"
    if ev.note.startswith(FORGOTTEN_PREFIX):  # no engine's word: an admin's (atk51-23 F2)
        return (
            f"{when(ev.at)} its run {ev.run} was forgotten ({ev.note}): its GPUs were "
            f"{held} until then{charge}."
        )
    how = (
        ("killed (SIGKILL), its grace cut short" if cut else "killed at the end of its grace")
        if ev.killed
        else "its processes gone"
    )
    if ev.by_itself and ev.exit_code is not None:  # its own code (atk54-23 F4: it was lost)
        how = f"its command exited {ev.exit_code} by itself before the stop reached it; {how}"
    began = (
        f", charged from its own start at {when(ev.started_at)} (the ledger had stopped it "
        "before seeing it start)"
        if ev.started_at is not None and not seen
        else ""
    )
    return (
        f"{when(_real(ev.ended_at, ev.at))} its run {ev.run} really ended ({how}): its "
        f"GPUs were {held} until then{charge}{began}{_recorded(ev.ended_at, ev.at)}."
    )


def _kill_line(ev: e.JobKillOrdered, last_end: e.JobFinished | None) -> str:
    """Pure: a stopped run killed at once: by the cancel that ended its requeued job (in the
    same command: atk50b-23 F2), or by a second cancel."""
    with_end = last_end is not None and last_end.at == ev.at and last_end.actor == ev.actor
    if with_end and last_end is not None and last_end.reason == "cancelled":
        return (f"{when(ev.at)} its earlier run {ev.run}, still in its grace, is killed "
                "at once (SIGKILL) by that cancel.")  # fmt: skip
    if last_end is not None and not _a_cancel(last_end):  # its first cancel (atk51-23)
        return (f"{when(ev.at)} cancelled by {ev.actor} after it had ended "
                f"({last_end.reason}): its run {ev.run} in its grace is killed at once "
                "(SIGKILL).")  # fmt: skip
    return (f"{when(ev.at)} cancelled again by {ev.actor}: its run {ev.run} in its grace "
            "is killed at once (SIGKILL).")  # fmt: skip


def _a_cancel(end: e.JobFinished) -> bool:
    """Pure: the job's end was a cancel (one past its time limit, or after its command exited
    0, too: `cancels`)."""
    return end.reason == "cancelled" or (
        end.reason in ("time_limit", "completed") and not end.actor.startswith("@")
    )


def _real(engine_at: float | None, at: float) -> float:
    """Pure: when it really happened: the engine's time when it said one, else the record's."""
    return at if engine_at is None else engine_at


def _recorded(engine_at: float | None, at: float) -> str:
    """Pure: ", recorded at T" when the record came later than the engine says it happened (an
    end or a start seen after a restart, or after the run ended); "" otherwise."""
    if engine_at is None or when(engine_at) == when(at):
        return ""
    return f", recorded at {when(at)}"


def explain_history(
    job: Job,
    history: Sequence[e.AnyEvent],
    decisions: Mapping[str, e.CycleDecided],
    now: float,
    default_grace_s: float,
) -> list[str]:
    """What happened to a job and why, from its recorded events and the decisions behind them
    (`default_grace_s`: the service's grace, for a job stopping without one of its own)."""
    ended = next((ev for ev in reversed(history) if isinstance(ev, e.JobFinished)), None)
    if job.status == "finished" and ended is not None:
        status = f"finished ({ended.reason.replace('_', ' ')})"
    elif is_stopping(job, now):
        status = STOPPING  # as every read shows it (`ledger.reads.stopping`)
    else:
        status = str(job.outcome if job.status == "finished" else job.status)
    out = [_headline(job) + f" is {status}."]
    cut: set[int] = set()  # runs a cancel killed before the end of their grace
    runs = 0  # placements so far: run r is the (r + 1)-th
    engine_end: dict[int, float] = {}  # run -> its charge's end, where its engine ended it
    last_end: e.JobFinished | None = None
    began: set[int] = set()  # runs whose start was recorded
    times: list[float] = [-math.inf]  # each line's time (the headline's first)
    ends: set[int] = set()  # the lines of runs' real ends (`_in_time_order`)
    for ev in history:
        lines = len(out)
        match ev:
            case e.JobSubmitted():
                out.append(f"{when(ev.at)} submitted by {ev.actor} to {ev.account}{_world(ev)}"
                           f"{taken_words(ev)}.")  # fmt: skip
            case e.JobPlaced():
                runs += 1
                where = "; ".join(
                    f"{sl.node} GPUs {','.join(map(str, sl.gpu_indices))}" for sl in ev.slots
                )
                line = (
                    f"{when(ev.at)} placed on {where} by {ev.cycle_id} "
                    f"(based on position {ev.based_on})"
                )
                d = decisions.get(ev.cycle_id)
                if d is not None:
                    line += f", policy {d.policy_version}"
                    if job.job_id in d.placed:
                        place = d.placed.index(job.job_id) + 1
                        line += f", #{place} of {len(d.placed)} placed"
                    line += f" among {d.waiting.considered} considered"
                    if d.preempted:
                        line += f", in a cycle that preempted {', '.join(map(str, d.preempted))}"
                whole = len(ev.slots) > 1
                line += (
                    ": whole nodes for a multi-node job."
                    if whole
                    else ": best fit (the node with the fewest free GPUs that fit it)."
                )
                out.append(line)
            case e.JobStarted():
                began.add(runs - 1)
                logs = f" Output: {', '.join(ev.logs)}" if ev.logs else ""
                start = _real(ev.started_at, ev.at)
                out.append(f"{when(start)} started{_recorded(ev.started_at, ev.at)}.{logs}")
            case e.CheckpointReported():
                out.append(f"{when(ev.at)} reported a checkpoint.")
            case e.LeaderEnded():
                out.append(f"{when(ev.leader_ended_at)} its command exited, leaving "
                           f"{ev.left} process(es) of its run {ev.run}: SIGTERM sent, "
                           f"SIGKILL at {when(ev.kill_at)} at the latest.")  # fmt: skip
            case e.JobPreempted():
                # the note describes this job (e.g. "unfunded"): keep it next to the reason, so
                # it never reads as describing the job it made room for
                note = f" ({times_in(ev.note)})" if ev.note else ""
                who = f" to make room for job {ev.for_job}" if ev.for_job is not None else ""
                contract = _contract_at(job, history, ev)
                if _owners_requeue(job, ev):
                    why = ev.note.partition(": ")[2]
                    said = f" ({why})" if why else ""
                    out.append(f"{when(ev.at)} requeued by its owner {ev.actor}{said}; {contract}.")
                else:
                    out.append(f"{when(ev.at)} preempted for {ev.reason}{note}{who}; {contract}.")
            case e.JobRequeued():
                asked = any(
                    isinstance(p, e.JobPreempted)
                    and p.at == ev.at
                    and p.job_id == ev.job_id
                    and p.note.startswith("requeued by ")
                    for p in history
                )
                how = "on request" if asked else "automatically (resumable)"
                out.append(f"{when(ev.at)} requeued {how}, same job id.")
            case e.JobUnplaced():
                why = f": {ev.reason}" if ev.reason else ""
                out.append(f"{when(ev.at)} its run {ev.run} taken back by {ev.actor} before "
                           f"it started{why}; never ran, nothing charged, not a preemption: "
                           "back in the queue, same job id.")  # fmt: skip
            case e.JobHeld():
                why = f" ({ev.reason})" if ev.reason else ""
                out.append(f"{when(ev.at)} held by {ev.actor}{why}.")
            case e.JobReleased():
                out.append(f"{when(ev.at)} released by {ev.actor}.")
            case e.JobFinished():
                last_end = ev
                out.append(finish_line(ev))
                if ev.reason == "time_limit" and not ev.actor.startswith("@"):  # a cancel
                    cut.add(job.run)  # past its limit: killed at once (`cancels`)
            case e.JobEngineEnded() if runs and not e.fenced(ev):  # as `apply.sql` reads it
                engine_end.setdefault(runs - 1, _real(ev.ended_at, ev.at))
            case e.JobRunEnded():
                ends.add(len(out))
                # never started: its placement is in the history, no start after it
                unstarted = ev.run < runs and ev.run not in began and not ev.killed
                out.append(run_ended_line(ev, ev.run in cut, engine_end.get(ev.run),
                                          not unstarted, ev.run in began))  # fmt: skip
            case e.JobKillOrdered():
                cut.add(ev.run)
                out.append(_kill_line(ev, last_end))
        times += [_line_time(ev)] * (len(out) - lines)
    out = _in_time_order(out, times, ends)
    if job.status in ("placed", "running"):
        out.append(contract_line(job, now))
        out += taken_line(job, now) + limit_line(job, now, default_grace_s)
    return out


def taken_words(ev: e.JobSubmitted) -> str:
    """Pure: ", with no time limit of its own: ..." for a job whose limit was taken from the
    partition's MaxTime (`JobSubmitted.max_time_s`); "" otherwise. True of a MaxTime lowered
    since (atk62b G2: it said "before Slurm's TIMEOUT" of a run placed under a MaxTime that no
    longer held its grace): such a job waits (`jobs.over_max_time`)."""
    if ev.max_time_s is None or ev.time_limit_s is None:
        return ""
    limit, longest = limit_words(ev.time_limit_s), limit_words(ev.max_time_s)
    return (
        f", with no time limit of its own: its limit is {limit}, the partition's MaxTime "
        f"({longest}) less its grace and a minute (Slurm gives a job without --time its "
        "partition's limit; the ledger stops it there itself, and places it only while MaxTime "
        "holds that limit, its grace and a minute, so Slurm's TIMEOUT never comes first)"
    )


def taken_line(job: Job, now: float) -> list[str]:
    """Pure: when a running job whose limit was taken from the partition's MaxTime is stopped
    (its contract never runs past it: `decide` cuts it to the limit); [] otherwise."""
    s, start = job.spec, job.started_at
    if s.max_time_s is None or s.time_limit_s is None or start is None:
        return []
    if now >= start + s.time_limit_s:
        return []  # past it: `limit_line` says it is stopping
    limit, longest = limit_words(s.time_limit_s), limit_words(s.max_time_s)
    return [f"Its time limit ({limit}, from the partition's MaxTime of {longest}) stops it at "
            f"{when(start + s.time_limit_s)} (SIGTERM, then its grace): nothing protects it "
            "past that."]  # fmt: skip


def _line_time(ev: e.AnyEvent) -> float:
    """Pure: when what an event's line says happened (the engine's time where it says one)."""
    match ev:
        case e.JobRunEnded() | e.JobFinished():
            return _real(ev.ended_at, ev.at)
        case e.JobStarted():
            return _real(ev.started_at, ev.at)
        case e.LeaderEnded():
            return ev.leader_ended_at
    return float(getattr(ev, "at", -math.inf))


def _in_time_order(out: list[str], times: list[float], ends: set[int]) -> list[str]:
    """Pure: the lines with each run's real end (`ends`) moved back before the lines of later
    times (stable): an end reported after the stop it preceded (its command exited while `up`
    was down, the cancel recorded offline after) was told after the cancel (atk55-23 F3)."""
    order = list(range(len(out)))
    for i in sorted(ends):
        k = order.index(i)
        while k > 1 and times[order[k - 1]] > times[i]:
            order[k - 1], order[k] = order[k], order[k - 1]
            k -= 1
    return [out[i] for i in order]


def limit_line(job: Job, now: float, default_grace_s: float) -> list[str]:
    """Pure: a running job past its time limit is being stopped (SIGTERM at the limit, SIGKILL
    after its grace, at most `MAX_GRACE_S`): said, not shown as plain running (atk46-23 F7).
    Its SIGKILL is `stopping.limit_kill_at`, as `jobs` and `queue` show it."""
    limit, start = job.spec.time_limit_s, job.started_at
    reaped = reaping_kill(job, default_grace_s)
    if reaped is not None:  # its command exited leaving processes (atk49-23 F4)
        return [f"It is stopping: {holding_reason(job, reaped, now)}; its GPUs are held until "
                "its processes are gone."]  # fmt: skip
    if not past_limit(job.status, start, limit, now) or limit is None or start is None:
        return []
    kill = limit_kill_at(start, limit, job.spec.grace_s, job.service_grace(default_grace_s))
    assert kill is not None
    own = "" if job.spec.grace_s is not None else ", the service's default grace"
    return [f"It reached its time limit at {when(start + limit)}: it is stopping (SIGTERM "
            f"then, {kill_words(kill, now)}{own}); its GPUs are held until its "
            "processes are gone."]  # fmt: skip


def _world(ev: e.JobSubmitted) -> str:
    """A submission's array and dependency, in words ("" when it has neither)."""
    out = ""
    if ev.array_job_id is not None:
        limit = f", at most {ev.array_limit} at once" if ev.array_limit else ""
        out += f", task {ev.array_task_id} of array {ev.array_job_id}{limit}"
    for term in ev.dependency:
        ids = ":".join(map(str, term.job_ids))
        out += f", after {term.kind}" + (f":{ids}" if ids else "")
    return out


def _owners_requeue(job: Job, ev: e.JobPreempted) -> bool:
    """Pure: a `requeue` by the job's own user (`decide`'s note "requeued by <actor>"), not an
    admin's preemption (atk48-23 F7: it was explained as "an admin preemption")."""
    return (
        ev.reason == "admin"
        and ev.actor == job.spec.user
        and ev.note.startswith(f"requeued by {ev.actor}")
    )


def _contract_at(job: Job, history: Sequence[e.AnyEvent], preempted: e.JobPreempted) -> str:
    placed = [ev for ev in history if isinstance(ev, e.JobPlaced) and ev.at <= preempted.at]
    if not placed:
        return "it held no contract"
    if job.spec.min_runtime_s == 0:
        return "it was unfunded (no contract)"
    # from its real start once known, as the ledger counts it (`Job.contract_ends_at`; it was
    # counted from its placement here: atk53-23 F5)
    began = max((ev.started_at if ev.started_at is not None else ev.at for ev in history
                 if isinstance(ev, e.JobStarted) and placed[-1].at <= ev.at <= preempted.at),
                default=placed[-1].at)  # fmt: skip
    ends = max(placed[-1].at, began) + job.spec.min_runtime_s
    if preempted.at >= ends:
        return f"its contract had expired at {when(ends)}"
    from ledger.core.state import DRAINED_NOTE, is_system

    if is_system(preempted.actor) and preempted.note == DRAINED_NOTE:
        return f"inside its contract (until {when(ends)}): its node was drained for maintenance"
    if preempted.reason == "node_failure":  # no one chose it: its node failed under it
        return f"inside its contract (until {when(ends)}): requeued because its node failed"
    if _owners_requeue(job, preempted):  # (atk48-23 F7)
        return f"inside its contract (until {when(ends)}): its owner's own requeue"
    return f"inside its contract (until {when(ends)}): an admin preemption"


def stopping_line(sr: StoppedRun, kill_at: float, now: float) -> str:
    """Pure: a run the ledger stopped (a cancel, a preemption) whose processes live out their
    grace: when it was stopped and its SIGKILL at the latest (`kill_at`), as `queue` and `jobs`
    show it (atk49-23 F7: `explain` said only "is finished (cancelled)")."""
    why = sr.why or "stopped"
    return (f"{when(sr.at)} {why}: it is stopping (SIGTERM sent, {kill_words(kill_at, now)}); "
            "its GPUs are held until its processes are gone.")  # fmt: skip


def stopping_said(job: Job, state: State | None, now: float) -> str | None:
    """Pure: what `explain` says of a finished job whose stopped run `state` holds in its grace
    (`stopping.stopped_shown`): its SIGKILL at the latest (`stopping_line`); None otherwise."""
    from ledger.reads.stopping import stopped_kill_at, stopped_shown

    if state is None or job.status != "finished" or not state.stopped_runs:
        return None
    sr = stopped_shown(state).get(job.job_id)
    return None if sr is None else stopping_line(sr, stopped_kill_at(sr, state.grace_s), now)


def earlier_runs_said(job: Job, state: State | None, now: float) -> list[str]:
    """Pure: what `explain` says of a requeued job (pending, placed, running again) whose
    earlier run the ledger stopped still lives out its grace in `state`: where, and its
    SIGKILL at the latest; its next run is launched only once those processes are gone
    (atk50b-23 F5: it read only `pending`/`placed`, with no word of them)."""
    from ledger.reads.stopping import stopped_kill_at

    if state is None or job.status == "finished" or not state.stopped_runs:
        return []
    out = []
    for sr in state.stopped_runs.values():
        if sr.job_id != job.job_id:
            continue
        where = "; ".join(f"{sl.node} GPUs {','.join(map(str, sl.gpu_indices))}"
                          for sl in sr.slots)  # fmt: skip
        kill = kill_words(stopped_kill_at(sr, state.grace_s), now)
        out.append(f"Its earlier run {sr.run} ({sr.why or 'stopped'}) is still stopping on "
                   f"{where} (SIGTERM sent, {kill}): its next run is launched only once those "
                   "processes are gone.")  # fmt: skip
    return out
