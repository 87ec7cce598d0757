"""The settings every server of a PostgreSQL store runs alike, as the lease row records them, and
why a server given others may not stand by or lead (`ledger.store.lease`: the row itself, the
take, the renewal and the fence). Pure but for `Settings.differs`' callers: nothing here reads
the store; `lease.agree` and `Lease.leader` read the row and compare it here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.core.runas import admission_meaning
from schemas.errors import InvalidCommand


@dataclass(frozen=True)
class Settings:
    """What every server of a store runs alike, recorded in the lease row by each take and kept
    there while nobody leads: a standby takes the leader's work over as it is, so a takeover by
    a server started otherwise changed them under running jobs (a shorter fence ran a job twice;
    `--executor none` left the agents' jobs to die: atk37-28 F1, atk33-28 F5, atk38-28 F1)."""

    lease_s: float
    node: tuple[float, float] | None = None
    """(node-lost timeout, fence) in seconds (None: no word, e.g. a tool's lease)."""
    work: str | None = None
    """The executor and the policy, as JSON (`{"executor", "policy", "words"}`; None: no
    word)."""
    admission: str | None = None
    """What the leader admits and how it runs what it admits (who a job runs as, the uid
    range, root's jobs, the OS accounts and privileged groups, the secret names, the per-user
    caps, the preemption grace, the Slurm partition, the cycle interval), as canonical JSON
    (sorted keys, one object of config key -> value; None: no word, e.g. a row recorded by a
    server from before it was compared: the next take records it). A standby started with
    others admitted what the leader refused after a failover (atk39-28 F2)."""

    def differs(self, recorded: Settings) -> bool:
        """Whether these settings are not the `recorded` ones (a part either has no word on
        is not compared)."""
        if recorded.lease_s and abs(recorded.lease_s - self.lease_s) > 1e-6:
            return True
        theirs, mine = recorded.node or (0.0, 0.0), self.node or (0.0, 0.0)
        if (
            recorded.node
            and self.node
            and any(abs(a - b) > 1e-6 for a, b in zip(theirs, mine, strict=False))
        ):
            return True
        if self.work is not None and recorded.work is not None and self.work != recorded.work:
            return True
        return bool(admission_differences(recorded.admission, self.admission))


def admission_differences(recorded: str | None, mine: str | None) -> list[str]:
    """Pure: the admission and security settings (`Settings.admission`) that differ, in words
    (`key: recorded here`), sorted by key; none when either has no word. A key `recorded`
    lacks is none (recorded by an earlier version, which had no such key, e.g. the service
    account or the Slurm cluster's state: the next take records it, as `_AGREES` does)."""
    import json

    if recorded is None or mine is None or recorded == mine:
        return []
    theirs, ours = json.loads(recorded), json.loads(mine)
    return [  # a key the record lacks is not compared: an earlier version recorded none
        f"{key} {_shown(theirs.get(key))} (recorded) against {_shown(ours.get(key))} here"
        for key in sorted(theirs)
        if theirs.get(key) != ours.get(key)
    ]


MEANT_OTHERWISE: frozenset[str] = frozenset()
"""Admission keys whose value an earlier version recorded with another meaning than this
version gives it, one `admission_meaning` cannot bring to this version's: not compared with an
earlier version's text (`earlier_admission`). None so far: every change was of how a value
is written (`max_array_size` 0, the built-in privileged groups, an account mapped to its own
name), which `admission_meaning` undoes, or a key added (the service account, which Slurm
cluster)."""


def earlier_admission(recorded: str, mine: str | None) -> tuple[str, list[str]]:
    """Pure: the admission settings an earlier version recorded (`recorded`: a take of that
    version, e.g. during an upgrade or after the documented rollback, `admission_epoch`) as
    this version compares them: by what they mean (`admission_meaning`: that version wrote some
    as given), and by the keys that mean here what they meant there. Returns that text and
    the keys not compared, sorted: the ones this server's settings (`mine`) have and the
    earlier version did not record (it had no such key), and `MEANT_OTHERWISE`. Before, an
    earlier version's text was not compared at all: across an upgrade a standby with `min_uid`
    1 and another service account took over from the earlier leader's 1000 (atk43ha F1)."""
    import json

    theirs = admission_meaning(json.loads(recorded))
    ours = json.loads(mine) if mine is not None else {}
    kept = {k: v for k, v in theirs.items() if k not in MEANT_OTHERWISE}
    skipped = sorted((set(ours) - set(theirs)) | (set(theirs) & MEANT_OTHERWISE))
    return json.dumps(kept, sort_keys=True, separators=(",", ":")), skipped


def _shown(value: Any) -> str:
    import json

    return "unset" if value is None else json.dumps(value, sort_keys=True)


def refusal(mine: Settings, recorded: Settings | None, who: str, live: bool) -> str | None:
    """Pure: why a server with settings `mine` may not stand by or take the lease of a store
    that records `recorded` (the last taker `who`, leading now when `live`), in one line with
    what to do (None: they agree)."""
    if recorded is None or not mine.differs(recorded):
        return None
    err = _disagreement(mine, recorded, who, live)
    return f"{err.message} ({err.hint})"


def _disagreement(mine: Settings, recorded: Settings, who: str, live: bool) -> InvalidCommand:
    change = (
        "to change them, stop every server, then start one with --new-settings (docs/ha.md)"
        if not live
        else "they change once nobody leads: stop every server, then start one with "
        "--new-settings (docs/ha.md)"
    )
    held = (
        f"the leader {who} holds the lease now" if live else f"recorded by the last leader, {who}"
    )
    if recorded.lease_s and abs(recorded.lease_s - mine.lease_s) > 1e-6:
        return InvalidCommand(
            f"the servers on this store use a lease of {recorded.lease_s:g}s ({held}); this "
            f"server was given {mine.lease_s:g}s",
            hint=f"start it with --lease {recorded.lease_s:g}s: every server on a store uses "
            f"the same lease; {change}",
        )
    if mine.node is not None and recorded.node is not None and mine.node != recorded.node:
        flags = "--node-lost-after {:g}s --node-fence {:g}s"
        return InvalidCommand(
            f"the servers on this store run {flags.format(*recorded.node)} ({held}); this "
            f"server was given {flags.format(*mine.node)}",
            hint=f"start it with {flags.format(*recorded.node)}: every server on a store "
            f"counts nodes lost and fences them alike (agents renew their lease by them); {change}",
        )
    if mine.work is None or recorded.work is None or mine.work == recorded.work:
        return _admission_disagreement(mine, recorded, held, change)
    theirs, ours = _work_words(recorded.work), _work_words(mine.work)
    if theirs == ours:  # the same executor and policy version: name the policy's settings
        theirs, ours = _work_words(recorded.work, True), _work_words(mine.work, True)
    ran = f"--executor {theirs[0]} with policy {theirs[1]}"
    said = (
        f"the leader {who} runs {ran}"
        if live
        else f"the last leader, {who}, ran {ran} (the store records it)"
    )
    return InvalidCommand(
        f"{said}; this server was started with --executor {ours[0]} and policy {ours[1]}",
        hint=f"start every server on a store with the same executor and policy settings; {change}",
    )


def _admission_disagreement(
    mine: Settings, recorded: Settings, held: str, change: str
) -> InvalidCommand:
    named = "; ".join(admission_differences(recorded.admission, mine.admission))
    return InvalidCommand(
        f"the servers on this store admit and run jobs by other settings ({held}): {named}",
        hint="give every server on a store the same admission and security settings (its "
        f"config file's keys, or the flags); {change}",
    )


def _work_words(work: str | None, whole: bool = False) -> tuple[str, str]:
    """(executor, policy) in words, from `Settings.work` (`whole`: the policy's settings too)."""
    import json

    got = json.loads(work or "{}")
    words = str(got.get("words", "?"))
    if whole:
        words += " " + json.dumps(got.get("policy"), sort_keys=True)
    return str(got.get("executor", "?")), words


def _read_row(row: dict[str, Any], mine: Settings) -> tuple[Settings | None, bool, str]:
    """The settings the lease row `row` (its columns, as an earlier version may have left
    them) records as this server compares them, whether a leader holds it now, and who."""
    if "admission_epoch" in row:
        current = row["admission_epoch"] is not None and row["admission_epoch"] == row["epoch"]
    else:  # the column's first making records the text as this version's when stamped
        current = int(row.get("stamp") or 0) > 0
    admission, _ = compared_admission(row.get("admission"), current, mine.admission)
    recorded = _recorded(row.get("lease_s"), row.get("node_lost_s"), row.get("node_fence_s"),
                         row.get("work"), admission)  # fmt: skip
    return recorded, bool(row.get("live")), str(row.get("address") or "?")


def compared_admission(
    recorded: str | None, current: bool, mine: str | None
) -> tuple[str | None, list[str]]:
    """Pure: the admission settings the row records (`recorded`; `current`: by a take of this
    version, `admission_epoch`) as this server (`mine`) compares them, and the keys it does not
    compare (`earlier_admission`; of a row of this version, the keys it lacks, which
    `admission_differences` leaves out)."""
    if recorded is None or mine is None:
        return recorded, []
    if not current:
        return earlier_admission(recorded, mine)
    import json

    return recorded, sorted(set(json.loads(mine)) - set(json.loads(recorded)))


def _recorded(
    lease_s: Any, lost: Any, fence: Any, work: Any, admission: Any = None
) -> Settings | None:
    if not lease_s:
        return None  # a new store: nobody recorded any
    node = None if lost is None or fence is None else (float(lost), float(fence))
    return Settings(float(lease_s), node, work, admission)
