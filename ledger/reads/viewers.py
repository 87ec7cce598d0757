"""Who sees what of a job: the one rule (`may_see_private`) the pages, `jobs` and `log` (both
faces) ask, who may query the whole projection, and what a job's row or events look like to
someone who may not see them (`redact`, `redact_event`). Re-exported by `ledger.reads.layer`."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import msgspec

from schemas import events as e
from schemas import views as v
from schemas.errors import NotAuthorised

if TYPE_CHECKING:
    from ledger.core.state import State


def may_see_private(state: State, actor: str, user: str, account: str) -> bool:
    """Pure: whether `actor` may see the command, labels and logs of `user`'s job in
    `account`: its owner, a manager of the account or one above it, an admin. The one rule:
    the pages, `jobs` and `log` (both faces) all ask it."""
    return actor == user or state.is_admin(actor) or state.manages(actor, account)


def may_query_all(state: State, actor: str) -> bool:
    """Pure: whether `actor` may run a SELECT of their own over the whole projection (`audit
    sql`, `POST /v1/audit/table` kind `sql`): admins only. The projection holds every job's
    command, labels and logs and every event's stored bytes (`events.raw`), which
    `may_see_private` shows a user, a manager only of their own jobs and subtree; no view can
    be trusted to hold that rule against SQL a caller writes. Auditors are made admins
    (docs/security.md, row T2)."""
    return state.is_admin(actor)


def require_query_all(state: State, actor: str) -> None:
    """Raise NotAuthorised unless `may_query_all`."""
    if not may_query_all(state, actor):
        raise NotAuthorised(
            f"{actor!r} may not run audit sql: it reads every job's command, logs and event "
            "payloads, which only admins may",
            hint="`jobs`, `log`, `audit job`, `audit preemptions` and `audit budget-changes` "
            "show everyone's jobs without what is private to them; an auditor is made an admin",
            actor=actor,
        )


class Viewer(NamedTuple):
    """Who reads, and the live state that says whom they manage."""

    actor: str
    state: State

    def sees(self, user: str, account: str) -> bool:
        return may_see_private(self.state, self.actor, user, account)

    def detached(self) -> Viewer:
        """The same viewer over a copy of what `may_see_private` reads (the admins, the
        actor's managed accounts) and of the stopped runs in their grace with the service's
        settings, and the running jobs whose command exited leaving processes (what `jobs`
        shows stopping: `stopping.stopping_kills`): safe to use on another thread while the
        live state moves."""
        from ledger.core.state import State

        s = self.state
        managed = {self.actor: set(s.managers.get(self.actor, ()))}
        reaping = {
            j: job
            for j in s.active
            if (job := s.jobs.get(j)) is not None and job.reaping_kill_at is not None
        }
        copied = State(admins=set(s.admins), managers=managed, service=s.service,
                       stopped_runs=dict(s.stopped_runs), jobs=reaping,
                       active=set(reaping))  # fmt: skip
        return Viewer(self.actor, copied)


def redact(row: v.JobRow) -> v.JobRow:
    """Pure: the job without what only its owner, managers and admins see: its command, where
    it runs and writes (directory, logs), and why its launch failed (which names its paths)."""
    note = "" if row.finish_reason == "launch_failed" else row.finish_note
    return msgspec.structs.replace(
        row, command=[], logs=[], workdir="", finish_note=note, redacted=True
    )


def redact_event(ev: e.AnyEvent) -> e.AnyEvent:
    """Pure: the event without a job's command, labels, environment, directory, output files,
    logs or launch failure's words (others are returned as they are)."""
    if isinstance(ev, e.JobSubmitted):
        return msgspec.structs.replace(
            ev, command=(), labels={}, env={}, workdir="", stdout="", stderr=""
        )
    if isinstance(ev, e.JobStarted):
        return msgspec.structs.replace(ev, logs=())
    if isinstance(ev, e.JobFinished) and ev.reason == "launch_failed":
        return msgspec.structs.replace(ev, note="")
    return ev
