"""How a run Slurm ended `NODE_FAIL` really ended (docs/slurm.md, "Nodes").

Slurm ends every job on a node it gives up (DOWN) `NODE_FAIL`, whatever its processes do: a job
whose completion was still on its way to slurmctld is NODE_FAIL though it exited 0, and a job on a
node whose slurmd Slurm cannot reach keeps running under its slurmstepd and may finish long after
Slurm's EndTime. So the executor believes the run's own records over Slurm's word: its batch
script notes each signal the job gets (`signalled`: Slurm's kill reached it) and writes an end
record when the job's command exits (code, time, and whether a signal came first). Without an
end record the run is gone only `KillWait` after Slurm's kill surely reached it (its SIGKILL
leaves no record): the signal it noted, else its node's slurmd answering. While its slurmd does
not answer, the run is in doubt: its node is lost with a fence, and the ledger ends the run at
the fence if nothing comes. A run the ledger was stopping (its grace) is held the same way: its
GPUs stay `stopping` until it is known gone (atk37-23 F7). Slurm's kill is Slurm's word, not
the processes' end: a slurmd killed just after its TERM and restarted within seconds never sends
the SIGKILL (the node returns, nothing is flagged), so a run without an end record is gone only
once its heartbeat (the batch script's, while its command lives) has stopped, where it has one
(atk39-24 F5).

Pure: times and records in, a decision out; `now` is a parameter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ledger.engines.slurm.words import SLURM_ENDS_FIRST, exit_code, slurm_time
from schemas.events import EndReason

BEAT_EVERY_S = 2
"""How often the batch script rewrites a live run's `alive` mark (`script.batch_script`)."""

BEAT_STALE_S = 15.0
"""A run whose heartbeat (`BEAT_EVERY_S`) is older than this is no longer beating:
its processes are gone (Slurm's SIGKILL ends the heartbeat with them, as does a node that died).
Room for a loaded node's late beats."""

UNBEATEN_S = 6
"""How long the batch script, its own heartbeat, goes on when its `alive` mark cannot be
written: then it ends its command itself (SIGTERM, and its end `KillWait` + 1 s later:
`own_end_after_s`), so a run is never alive unseen (atk40-24 F1b: a job that made its mark
unwritable was judged by the older rules and seen alive beside the next job)."""


def ends_after_term_s(grace_s: float, kill_wait_s: float) -> int:
    """Pure: how long after the first SIGTERM it gets (Slurm's, the executor's, or a signal note
    it did not make) the batch script ends its run itself, whatever the command does: the
    job's grace, Slurm's `KillWait` and a second, in whole seconds (past every kill of the
    executor's and Slurm's own, so it never cuts one short)."""
    return math.ceil(grace_s + kill_wait_s + 1)


def own_end_after_s(kill_wait_s: float) -> int:
    """Pure: how long after its own SIGTERM for a mark it cannot write the batch script ends
    its run: `KillWait` and a second (not the job's grace: the window after the last beat,
    `beat_window`, is what the executor must wait for every run whose beats stop)."""
    return math.ceil(kill_wait_s + 1)


def beat_window(kill_wait_s: float) -> float:
    """Pure: how long after its last beat a run may still live: a dead script's heartbeat is
    `BEAT_STALE_S` old, and one whose mark cannot be written ends its command at most
    `UNBEATEN_S` and a beat late, and the run `own_end_after_s` after that. Only the beat's
    ctime counts (`launching.MarksSeen`), which the job's user cannot set back."""
    late = UNBEATEN_S + BEAT_EVERY_S + own_end_after_s(kill_wait_s)
    return max(BEAT_STALE_S, float(late))


def beat_bound(
    beat_at: float | None, term_at: float | None, after_term_s: float | None
) -> float | None:
    """Pure: the last beat believed of a run whose SIGTERM from Slurm is proven by its signal
    note (`term_at`): its batch script ends it `after_term_s` later (one beat late at most), so a
    beat after that is no beat of its script's but a process of the job's user keeping the mark
    fresh from outside Slurm (atk40-24 F3: it held a dead run's GPUs for good). None: no
    heartbeat; without a proven TERM (or a script from before the bound) every beat counts."""
    if beat_at is None or term_at is None or after_term_s is None:
        return beat_at
    return min(beat_at, term_at + after_term_s + BEAT_EVERY_S)


OWN_END_SLACK_S = 1.0
"""Slurm's EndTime is whole seconds (rounded down); an own end within this after it came
before Slurm's decision."""


def answering(
    unresponsive: Iterable[tuple[str, bool]], since: Mapping[str, float], now: float
) -> dict[str, float]:
    """Pure: node -> since when its slurmd answers, continuously, after a read of the nodes
    ((name, unresponsive) each; `since` as the last read left it)."""
    return {n: since.get(n, now) for n, away in unresponsive if not away}


def kill_wait(config: str, default: float, name: str = "KillWait") -> float:
    """Pure: Slurm's `KillWait` (or another setting in seconds: `name`) from `scontrol show
    config` output (`KillWait = 10 sec`); `default` when it does not say."""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == name:
            first = value.split()[:1]
            if first and first[0].isdigit():
                return float(first[0])
    return default


@dataclass(frozen=True)
class OwnEnd:
    """The run's own end record: its command's exit code, when it exited (the node's clock),
    and whether the job got a signal before (a stop, a limit, Slurm's kill)."""

    exit_code: int
    at: float
    signalled: bool = False
    written: float | None = None
    """When the record was written (its ctime, which the job's user can set only to now;
    None: unknown): the batch script's beats stop before it (`record_beat`)."""
    left: int = 0
    """How many processes the command left in the step's cgroup, which the script ended before
    its record (`script_tree`)."""
    killed: bool = False
    """Whether they had to be killed (SIGKILL after the job's grace), or the script's own end
    SIGKILLed the command (`script._beating`: the executor's SIGKILL never came, atk59b N3)."""
    steps: bool = False
    """A step of the job's (`srun`) still had processes on the node when the script wrote it
    (`script_tree.STEPS_LEFT`): Slurm's end of the job ended them, later (atk60-slurm F2)."""

    def tree_note(self) -> str:
        """Pure: what the record says of the processes the command left ("" for none)."""
        if not self.left:
            return ""
        how = "killed after the job's grace" if self.killed else "ended at SIGTERM"
        return f"its command left {self.left} processes in the job's cgroup, {how}"


def ended_killed(
    state: str, script_killed: bool, own: OwnEnd | None, stopped: bool, gang: bool
) -> bool | None:
    """Pure: whether the processes of a run Slurm reports ended outlived their grace and were
    killed (`Exit.killed`, `job.engine_ended.v2`), as its batch script and Slurm's state say:
    - its batch script killed by a signal (`SlurmJob.script_killed`: it wrote no end record)
      while Slurm ended the job (`state` in `SLURM_ENDS_FIRST`: its TIMEOUT, a `scancel`: the
      SIGKILL `KillWait` after the SIGTERM) or the ledger stopped it (`stopped`: the executor's
      SIGKILL after the grace): killed. Killed by the job's own process, nobody's grace ran out:
      not said (None);
    - else its own end record (`own`): killed when it says its script SIGKILLed what the
      command left after the grace, or its own end cut the command (`OwnEnd.killed`); not
      killed when it says none was, on its one node. A gang's ranks on its other nodes, or a
      step left alive on its node (`OwnEnd.steps`), are out of the record's sight: not said;
    - no record (a node that does not share the run's directory): not said.
    Before, such an end said nothing of it (atk60-slurm F3: `killed` null for a gang that
    Slurm's TIMEOUT SIGKILLed while the service was down)."""
    if script_killed:
        return True if state.split()[0] in SLURM_ENDS_FIRST or stopped else None
    if own is None:
        return None
    if own.killed:
        return True
    return None if gang or own.steps else False


@dataclass(frozen=True)
class Ending:
    """What to record for a run Slurm ended NODE_FAIL: its exit code, end, reason and why."""

    exit_code: int
    at: float
    reason: EndReason
    note: str
    own_record: bool = False
    """From the run's own end record: the job's user may write it while the run still lives,
    so its GPUs wait for Slurm's kill all the same (`surely_gone`: atk38-24 F1)."""
    beat_window_s: float = BEAT_STALE_S
    """How long after its last beat the run may live (`beat_window`): its GPUs wait that too."""
    written: float | None = None
    """When its own end record was written (`OwnEnd.written`): later beats are not its
    script's (`record_beat`)."""


def node_fail_ending(
    own: OwnEnd | None,
    signalled_at: float | None,
    marks_seen: bool,
    slurm_end: float | None,
    slurm_code: int,
    started_at: float | None,
    answering_since: float | None,
    kill_wait_s: float,
    now: float,
    confirm_s: float = 0.0,
    beat_at: float | None = None,
    beat_stale_s: float = BEAT_STALE_S,
    after_term_s: float | None = None,
    state: str = "NODE_FAIL",
) -> Ending | None:
    """Pure: how a run Slurm ended NODE_FAIL (at `slurm_end`) ended, or None while it may still
    run (wait; its node's fence bounds the wait). The same for a stopped run Slurm ended by its
    cancel on a node whose slurmd did not answer (`state`, what Slurm said: `stops.unseen_end`).

    1. Its own end record: signalled and ended after Slurm's EndTime (and `OWN_END_SLACK_S`),
       or its last signal noted at or after that EndTime (the script passes Slurm's SIGTERM on
       to the command, which may end within the same second), Slurm's kill ended it:
       `node_failure`, whatever its code (a resumable job that checkpoints and exits 0 at
       SIGTERM is requeued); otherwise it ended by itself, as its
       exit code says (0: completed, however Slurm ended it). Its end is the record's time,
       kept inside its run (not before `started_at`, not after `now`).
    2. No record, but a signal noted after Slurm's EndTime (`signalled_at`, never later than
       the first read that saw it: the job's user sets its mark's time, atk38-24 F6): gone
       `kill_wait_s` after it or after its nodes' slurmd answered again, whichever is later
       (Slurm's SIGKILL follows and leaves no record; it is slurmd's, and a slurmd that died
       after the TERM never sends it: atk38-24 F5), decided as in 3. (the note proves the
       TERM landed, not the KILL).
    3. No record and no such signal: the kill reaches it once its nodes' slurmd answers
       (`answering_since`, since when all do; None while one does not: wait, the node's fence
       bounds the wait while it is lost): gone `kill_wait_s` after Slurm's EndTime or that
       answer, whichever is later. Slurm's EndTime is whole seconds rounded down, so it counts
       from `OWN_END_SLACK_S` after it. A slurmd seen answering may have died unnoticed
       (Slurm flags it only at its next ping: 12 s after an admin's DOWN here; a service
       started meanwhile never saw it away), its job running on unsignalled: it is believed
       only once it still answers `confirm_s` (SlurmdTimeout: Slurm flags a dead slurmd by
       then) after the EndTime; the end recorded is still the one above.
       Where the marks are seen (`marks_seen`) an honest run notes Slurm's kill at once (2.);
       without the note its marks could not be written (the job made them unwritable, or its
       disk is full: atk37-23 F6), which must not leave it `running` for good once its node
       is back.
    4. In 2. and 3., a run with a heartbeat (`beat_at`: its last beat, no later than the read
       that first saw it) is gone only once it is `beat_stale_s` old: Slurm's kill may never
       come (a slurmd killed after its TERM and restarted within seconds: the node returns
       and its NODE_FAIL jobs' processes run on, atk39-24 F5); one that beat after Slurm's
       kill ends when its next beat was due (it died after its last). A run without one
       (the service does not see its directory, a run from before the heartbeat) is decided
       by 2. and 3. alone. `beat_stale_s` is `beat_window`: a script whose mark cannot be
       written ends its run itself that long after its last beat at most (atk40-24 F1b).
    5. A script that got Slurm's TERM (its note, as in 2.) ends its run `after_term_s` later
       (`ends_after_term_s`; None: a script from before that bound): a beat after that is a
       process of the job's user keeping the mark fresh from outside (`beat_bound`, atk40-24
       F3), and the run is gone then, however fresh its mark.
    Gone without a record: `node_failure`, ended the last moment its processes could live."""
    slurm = slurm_end if slurm_end is not None else now
    if own is not None:
        low = started_at if started_at is not None else own.at
        if own.written is not None:  # a record written later says no earlier end (`own_finish`)
            low = max(low, min(own.written, now) - OWN_END_SLACK_S)
        at = max(low, min(own.at, now))
        tree = f"; {own.tree_note()}" * bool(own.left)
        said = f"its own end record: exit {own.exit_code}; Slurm said {state}{tree}"
        written = None if own.written is None else min(own.written, now)  # as first read
        killed_then = signalled_at is not None and signalled_at >= slurm  # Slurm's TERM, passed
        # on to the command, may end it within the EndTime's second (a checkpoint and exit 0)
        if own.signalled and (own.at > slurm + OWN_END_SLACK_S or killed_then):
            return Ending(own.exit_code, at, "node_failure", said + " (it was killed)", True,
                          beat_stale_s, written)  # fmt: skip
        return Ending(own.exit_code, at, "exited", said, True, beat_stale_s, written)
    note = f"{state}: killed, no end record within KillWait"
    term_at = signalled_at if signalled_at is not None and signalled_at >= slurm - OWN_END_SLACK_S else None  # fmt: skip  # noqa: E501
    beat = beat_bound(beat_at, term_at, after_term_s)
    ends_by = None if term_at is None or after_term_s is None else term_at + after_term_s + BEAT_EVERY_S  # fmt: skip  # noqa: E501
    if beat is not None and now < beat + beat_stale_s and (ends_by is None or now < ends_by):
        return None  # its processes live, whatever Slurm's kill did (atk39-24 F5)
    if answering_since is None or now < slurm + confirm_s:
        kill_at: float | None = None  # its slurmd not (yet) known alive since Slurm's kill
    elif term_at is not None:
        # the note proves slurmd's TERM landed, not its SIGKILL KillWait later: a slurmd that
        # died in between never sent it (atk38-24 F5), a returning one kills from its return
        kill_at = max(slurm, term_at, answering_since)
    else:
        kill_at = max(slurm + OWN_END_SLACK_S, answering_since)
        if marks_seen:
            note = f"{state}: no end record nor signal noted (its marks unwritable?); " + (
                "gone KillWait after its node's slurmd answered"
            )
    if kill_at is None or now < kill_at + kill_wait_s:
        return None
    if beat is not None and beat > kill_at + kill_wait_s:  # it outlived Slurm's kill
        note += f"; its heartbeat stopped {beat - kill_at:.0f} s after Slurm's kill"
        if beat_at is not None and beat < beat_at:
            note += " (later beats, past its script's own end, were not its script's)"
        at = min(now, beat + BEAT_EVERY_S, ends_by if ends_by is not None else now)
        return Ending(slurm_code, at, "node_failure", note)
    return Ending(slurm_code, kill_at + kill_wait_s, "node_failure", note)


def sacct_end(rows: str, now: float) -> tuple[str, int, float]:
    """Pure: (state, exit code, end) of a job from `sacct -n -P -X -o State,ExitCode,End`
    ("", -1, `now` when it says nothing); its end is Slurm's End when it has one, never after
    `now`."""
    first = rows.strip().splitlines()[0].split("|") if rows.strip() else []
    if len(first) != 3 or not first[0].split():
        return "", -1, now
    return first[0].split()[0], exit_code(first[1]), min(now, slurm_time(first[2]) or now)


def surely_gone(
    slurm_end: float | None, answering_since: float | None, kill_wait_s: float, now: float
) -> bool:
    """Pure: whether a run Slurm ended NODE_FAIL (at `slurm_end`) is gone whatever its own end
    record says: its nodes' slurmd answers (since `answering_since`; None while one does not)
    and KillWait has passed since Slurm's kill could reach it (its EndTime, whole seconds, or
    that answer, whichever is later), as in `node_fail_ending`'s case 3. A record is the job
    user's word: a job that wrote one while it ran had its GPUs given to the next job while
    Slurm's SIGKILL was still KillWait away (atk38-24 F1)."""
    if answering_since is None:
        return False
    slurm = slurm_end if slurm_end is not None else now
    return now >= max(slurm + OWN_END_SLACK_S, answering_since) + kill_wait_s


SLURM_SAW_NO_EXIT = frozenset({"FAILED", "NODE_FAIL", "BOOT_FAIL"})
"""Slurm states a run may end in without its command's exit reaching Slurm (a batch job a
restarted slurmctld finds missing from its node is FAILED; its node's loss NODE_FAIL): its own
end record's exit code is how it ended (atk42-24 F2). COMPLETED agrees with it by
construction (the batch script exits with its command's code)."""


def own_finish(
    own: OwnEnd | None,
    state: str,
    code: int,
    at: float,
    low: float | None,
    high: float,
) -> tuple[int, float, bool]:
    """Pure: (exit code, end, whether from its own record) of a run Slurm reports ended by
    itself (COMPLETED, FAILED: not a cancel, a limit or a node's loss, `words.SLURM_ENDS_FIRST`)
    or no longer lists (`state` ""), recorded so far as ending `at` with `code`. Its own end
    record, where it exists, says when its command really ended, in every outage shape: Slurm's
    EndTime is when slurmctld heard of the end, which a dead slurmd (slurmstepd's completion
    retried through it) or a dead slurmctld (retried until it returns) makes late; and an end
    in an outage is no longer taken for its last sighting before it (`words.real_end`) when
    its record says later (atk42-24 F3). The record is the job user's word: its time is kept
    between `low` (its start, its script's last beat, which comes before the record) and
    `high` (Slurm's end, or now), and no earlier than a second before it was written (its
    ctime, which its script makes within a moment of the time it writes and the job's user
    cannot set back): a forged one moves its charge by a beat or a second at most. Its exit
    code counts where Slurm did not see the command's exit (`SLURM_SAW_NO_EXIT`, or no longer
    listed)."""
    if own is None:
        return code, at, False
    t = own.at if low is None else max(low, own.at)
    t = min(high, t if own.written is None else max(t, own.written - OWN_END_SLACK_S))
    word = state.split()[0].rstrip("+") if state.split() else ""
    if not word or word in SLURM_SAW_NO_EXIT:
        code = own.exit_code
    return code, t, True


def record_beat(beat_at: float | None, written: float | None) -> float | None:
    """Pure: the last beat believed (`beat_at`: its last beat as seen; None: none) of a run
    whose own end record was written at `written` (its ctime; None: none, or unknown). Its
    batch script beats only while its command lives and writes the record after, and ends
    its command at once when a record it did not write appears
    (`script._beating`, within a beat): a beat more than `BEAT_EVERY_S` after the record was
    written is a process of the job's user touching the mark from outside Slurm, which must not
    keep an ended run's GPUs held (atk42-24 F1)."""
    if beat_at is None or written is None:
        return beat_at
    return min(beat_at, written + BEAT_EVERY_S)


def ended_unseen(own: OwnEnd | None, beat: float | None, now: float, window_s: float) -> bool:
    """Pure: whether a run Slurm lists running has ended by its own durable facts: its own end
    record, and its last beat believed (`record_beat`: none counts more than a beat after the
    record was written) `window_s` (`beat_window`) old. Its script writes the record once its
    command has ended and beats no more after it, so nothing of it runs, whatever a rewound
    slurmctld lists (atk45s F3: a run that exited 0 just before a slurmctld kill -9 was listed
    RUNNING with no process alive, its GPUs held by the ledger for minutes). Without a record or
    a beat (a node that does not share the service's directory): False."""
    if own is None or beat is None:
        return False
    believed = record_beat(beat, own.written)
    return believed is not None and now - believed >= window_s


def limit_kill_end(
    at: float, end_time: float | None, beat: float | None, kill_wait_s: float
) -> float:
    """Pure: the end of a run the executor stopped at its limit that Slurm ended by the stop's
    `scancel` (`SLURM_ENDS_FIRST`) unseen COMPLETING (a service killed in the stop and back
    once Slurm had ended it: atk46-s F2): its processes got SIGKILL up to KillWait after
    Slurm's EndTime, and its script's heartbeat (`beat`, the `alive` mark's ctime, while its
    command lived) says how long they did. The later of `at` (Slurm's word) and that beat,
    never past EndTime + KillWait; `at` without a beat after the EndTime."""
    if end_time is None or beat is None or beat <= at:
        return at
    return max(at, min(beat, end_time + kill_wait_s))
