"""The reads the API serves: the read layer (`ledger.reads.layer`) behind one table for both faces.

The CLI runs the same entry locally (embedded mode) or asks the server for it (client mode) and
decodes the answer into the same view Structs, so `--json` is byte-identical either way. Each
entry: a path under /v1, a typed arguments Struct (its query parameters, validated by msgspec in
both modes), the function over the handles (ledger, caught-up projection, clock), and the view
type it returns (for the OpenAPI document and the client's decoding).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

import msgspec

from schemas import views as v
from schemas.bounds import FloatSeconds
from schemas.errors import InvalidCommand

if TYPE_CHECKING:  # the CLI in client mode imports this table: keep it light
    from ledger.cycle.dispatcher import LiveState
    from projections.fairshare import UsagePolicy
    from projections.store import Store

WEEK_S = 7 * 86400.0


class Handles(Protocol):
    """What a read may use."""

    @property
    def ledger(self) -> LiveState:
        """The live state: the service's ledger, or a CLI read's read-only view."""
        ...

    def store(self) -> Store:
        """The projection, caught up with the log."""
        ...

    def now(self) -> float: ...

    def foreign(self) -> Mapping[str, frozenset[int]]:
        """GPUs work outside the ledger holds, as the service last observed its engine."""
        ...

    def stopping(self) -> Mapping[str, frozenset[int]]:
        """GPUs of stopped runs still in their grace, as the service last observed its engine."""
        ...

    def heard_from(self) -> Mapping[str, float]:
        """When the service last heard from each node, as its engine knows it (none: no service)."""
        ...

    def longest_s(self) -> float | None:
        """The longest time limit the service's engine starts, as it last observed it (Slurm's
        partition MaxTime; None: no limit, or no service): the dispatcher places no job asking
        for more, and the queue and explain say so (`preview.too_long_waits`)."""
        ...

    @property
    def viewer(self) -> str:
        """Who reads: what the reads marked `personal` show depends on it."""
        ...


Seconds = Annotated[float, msgspec.Meta(gt=0, le=10 * 365 * 86400.0)]
PolicyName = Literal["fairshare", "fifo"] | None


class _Args(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class NoArgs(_Args, frozen=True, kw_only=True):
    pass


class SharesArgs(_Args, frozen=True, kw_only=True):
    at: v.Epoch | None = None
    """The moment (default now)."""
    window_s: Seconds = WEEK_S
    half_life_s: Seconds | None = None
    """Decay usage with this half-life instead of the window."""


class UsageArgs(SharesArgs, frozen=True, kw_only=True):
    by: Literal["account", "user"] = "account"


class DeliveredArgs(_Args, frozen=True, kw_only=True):
    start: v.Epoch
    end: v.Epoch
    team_depth: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2


class QueueArgs(_Args, frozen=True, kw_only=True):
    at: v.Epoch | None = None
    """The moment of the preview (default now): after the log's last event (a moment before it
    is refused: the live state of the past is not kept)."""
    policy: PolicyName = None
    """Preview with this policy's defaults instead of the recorded settings."""
    user: str | None = None
    account: str | None = None
    state: Literal["pending", "held", "running", "queued", "all"] = "queued"
    limit: v.Limit = 50


class ExplainArgs(_Args, frozen=True, kw_only=True):
    job_id: Annotated[int, msgspec.Meta(ge=1, le=2**62)]
    policy: PolicyName = None
    at: v.Epoch | None = None
    """The moment of the explanation (default now; after the log's last event)."""


class SquattersArgs(_Args, frozen=True, kw_only=True):
    threshold: Annotated[float, msgspec.Meta(ge=0, le=100)] | None = None
    """Utilisation % below which a job is idle (default: the recorded policy's setting)."""
    idle_s: FloatSeconds | None = None
    """How long it must have been idle (default: the recorded policy's `squat_after_s`)."""
    at: v.Epoch | None = None
    """The moment idleness is measured at (default now; after the log's last event)."""


class AuditArgs(_Args, frozen=True, kw_only=True):
    account: str | None = None
    since: v.Epoch | None = None


def _at(h: Handles, at: float | None) -> float:
    """The moment a read is evaluated at: the one asked for (`--at`), else now."""
    return h.now() if at is None else at


def _not_future(h: Handles, at: float, what: str) -> None:
    """A moment after now (and after the log's last event: a simulated ledger's clock may run
    ahead of the wall's) is refused: a read shows the ledger as it was, and what is to come
    (runs reaching their limits, the placements that follow) is not simulated by it."""
    if at > h.now() + 1.0:
        from projections.history import last_at
        from schemas.units import when

        last = last_at(h.store().con)
        if last is not None and at <= last + 1.0:
            return

        raise InvalidCommand(
            f"{what} --at {when(at)}: that is in the future, and the ledger shows what was, not "
            "what will be (runs reaching their limits and the placements after them)",
            hint="`gpuledger queue` estimates when waiting jobs start; `gpuledger sim` simulates",
        )


def _live_at(h: Handles, at: float | None, what: str) -> float:
    """The moment of a read of the live state (the queue, explain, squatters): now, or a moment
    `--at` between the log's last event and now (the ledger then is the ledger now). A moment
    before the log's last event is refused: the live state of the past is not kept (the
    decisions taken then are: `audit job`, `replay`); so is one in the future (`_not_future`)."""
    if at is None:
        return h.now()
    _not_future(h, at, what)
    from projections.history import position_at

    position = position_at(h.store().con, at)
    if position is not None:
        from schemas.units import when

        raise InvalidCommand(
            f"{what} --at {when(at)}: the ledger has moved since (log position {position} was "
            "its last then), and the live state of a past moment is not kept",
            hint="`gpuledger jobs --at`, `audit job JOB` and `replay` read the past",
        )
    return at


def _usage(a: SharesArgs) -> UsagePolicy:
    from projections.fairshare import UsagePolicy

    return UsagePolicy(window_s=a.window_s, half_life_s=a.half_life_s)


def _queue_filter(a: QueueArgs) -> v.QueueFilter:
    return v.QueueFilter(user=a.user, account=a.account, state=a.state, limit=a.limit)


def _accounts(h: Handles, a: NoArgs) -> list[v.AccountNode]:
    from ledger.reads import layer as reads

    return reads.account_tree(h.ledger.state)


def _nodes(h: Handles, a: NoArgs) -> list[v.NodeRow]:
    from ledger.reads import layer as reads

    return reads.node_list(h.ledger.state, h.foreign(), h.stopping(), h.now(), h.heard_from())


def _jobs(h: Handles, a: v.JobFilter) -> list[v.JobRow]:
    """Jobs newest first; a job's command and logs only to its owner, the managers above its
    account and admins (the others get it with `redacted` true and both empty)."""
    from ledger.reads import layer as reads

    if a.at is not None:
        _not_future(h, a.at, "jobs")
    return reads.jobs(h.store(), a, _at(h, a.at), reads.Viewer(h.viewer, h.ledger.state))


def _log(h: Handles, a: v.LogFilter) -> list[v.LogEntry]:
    """Events in log order; a job's command, labels and logs only to its owner, the managers
    above its account and admins (the others get its events with `redacted` true and those
    fields empty)."""
    from ledger.reads import layer as reads

    return reads.log(h.store(), a, reads.Viewer(h.viewer, h.ledger.state))


def _shares(h: Handles, a: SharesArgs) -> list[v.ShareRow]:
    from ledger.reads import layer as reads

    if a.at is not None:
        _not_future(h, a.at, "shares")
    return reads.shares(h.store(), _at(h, a.at), _usage(a))


def _usage_rows(h: Handles, a: UsageArgs) -> list[v.UsageRow]:
    from ledger.reads import layer as reads

    if a.at is not None:
        _not_future(h, a.at, "usage")
    return reads.usage(h.store(), _at(h, a.at), a.by, _usage(a))


def _delivered(h: Handles, a: DeliveredArgs) -> v.DeliveredView:
    from ledger.reads import layer as reads

    _not_future(h, a.end, "report delivered")
    return reads.delivered(h.store(), a.start, a.end, a.team_depth)


def _preview(h: Handles, a: QueueArgs | ExplainArgs, policy: Any) -> tuple[float, Any]:
    """The moment of a preview read and the preview itself when the handles keep one: a read
    "now" under the recorded policy is the server's shared preview (`ServiceHandles`), as of
    the moment it was computed; otherwise the read decides its own, with the GPUs foreign work
    holds as the service last observed its engine counted busy, as the dispatcher counts them
    (None: there are none, and the read decides only if it needs to)."""
    shared = getattr(h, "live_preview", None)
    if a.at is None and a.policy is None and shared is not None:
        got = shared()
        return got.now, got.live
    now = _live_at(h, a.at, "explain" if isinstance(a, ExplainArgs) else "the queue")
    foreign = h.foreign()
    if not foreign:
        return now, None
    from ledger.reads import preview as previews

    return now, previews.live(h.ledger, h.store(), policy, now, foreign, h.longest_s())


def _queue(h: Handles, a: QueueArgs) -> list[v.QueueRow]:
    from ledger.dispatch import registry
    from ledger.reads import preview as previews

    # the policy named, else the one the service recorded running with, else the default
    policy = registry.build(a.policy or h.ledger.state.policy)
    now, preview = _preview(h, a, policy)
    f = _queue_filter(a)
    return previews.queue(h.ledger, h.store(), policy, now, f, preview, h.longest_s())


def _queue_total(h: Handles, a: QueueArgs) -> int:
    """How many jobs `queue` lists with these filters: all of them, whatever the limit."""
    from ledger.dispatch import registry
    from ledger.reads import preview as previews

    policy = registry.build(a.policy or h.ledger.state.policy)
    now, preview = _preview(h, a, policy)
    f = msgspec.structs.replace(_queue_filter(a), limit=1)
    return previews.queue_page(
        h.ledger, h.store(), policy, now, f, preview=preview, longest_s=h.longest_s()
    ).total


def _priority(h: Handles, a: QueueArgs) -> list[v.PriorityRow]:
    from ledger.dispatch import registry
    from ledger.reads import preview as previews

    policy = registry.build(a.policy or h.ledger.state.policy)
    now, preview = _preview(h, a, policy)
    return previews.priority(h.ledger, h.store(), policy, now, _queue_filter(a), preview)


def _explain(h: Handles, a: ExplainArgs) -> v.ExplainView:
    from ledger.dispatch import registry
    from ledger.reads import explain_job

    policy = registry.build(a.policy or h.ledger.state.policy)
    now, preview = _preview(h, a, policy)
    from ledger.reads import layer as reads

    viewer = reads.Viewer(h.viewer, h.ledger.state)
    return explain_job.explain(
        h.ledger, h.store(), a.job_id, policy, now, preview, viewer, h.longest_s()
    )


def _squatters(h: Handles, a: SquattersArgs) -> list[v.SquatterRow]:
    from ledger.core.utilisation import squat_after, squat_threshold
    from ledger.dispatch import registry
    from ledger.reads import layer as reads

    policy = registry.build(h.ledger.state.policy)
    threshold = squat_threshold(policy) if a.threshold is None else a.threshold
    idle_s = squat_after(policy) if a.idle_s is None else a.idle_s
    return reads.squatters(h.ledger, h.store(), _live_at(h, a.at, "squatters"), threshold, idle_s)


def _projection_status(h: Handles, a: NoArgs) -> v.ProjectionStatusView:
    from ledger.reads import layer as reads

    return reads.projection_status(h.store())


def _audit_preemptions(h: Handles, a: AuditArgs) -> list[v.PreemptionRow]:
    from ledger.reads import layer as reads

    return reads.audit_preemptions(h.store().con, a.account, a.since)


class PreemptionReportArgs(_Args, frozen=True, kw_only=True):
    account: str | None = None
    """This account and everything below it (none: every preemption)."""
    side: Literal["of", "by", "both"] = "both"
    """`of`: the preemptions its jobs suffered; `by`: those its waiting jobs caused."""
    start: v.Epoch | None = None
    end: v.Epoch | None = None


def _preemption_report(h: Handles, a: PreemptionReportArgs) -> v.PreemptionReportView:
    """The preemptions an account's subtree suffered and caused, over a window: why, the
    victim rule, for whom and the GPU-hours lost."""
    from ledger.reads import layer as reads

    return reads.preemption_report(h.store().con, a.account, a.side, a.start, a.end)


def _audit_budget_changes(h: Handles, a: AuditArgs) -> list[v.BudgetChangeRow]:
    from ledger.reads import layer as reads

    if a.account is not None:
        raise InvalidCommand("budget changes take no account filter")
    return reads.audit_budget_changes(h.store().con, a.since)


@dataclass(frozen=True)
class ReadSpec:
    path: str
    args: type[msgspec.Struct]
    fn: Callable[[Any, Any], Any]
    returns: Any
    doc: str
    personal: bool = False
    """The answer depends on who reads (`Handles.viewer`), not only on the log."""
    pooled: bool = False
    """Reads the projection alone (and who may see what): the server runs it in its read pool,
    on a cursor of its own, under the pool's time limit, never on the worker thread."""

    def parse(self, query: dict[str, Any]) -> Any:
        """Arguments from query parameters (strings) or CLI values, validated by their type."""
        try:
            return msgspec.convert(query, self.args, strict=False)
        except msgspec.ValidationError as err:
            raise InvalidCommand(f"invalid query: {err}") from err

    def run(self, handles: Handles, args: Any) -> Any:
        return self.fn(handles, args)

    def signature(self) -> list[inspect.Parameter]:
        """The query parameters as keyword parameters (for the OpenAPI document). Names the
        framework reserves (`state`, ...) get a trailing "_" and the query name as alias."""
        from litestar.params import QueryParameter  # only the server needs it

        out = []
        for f in msgspec.structs.fields(self.args):
            kind = f.type if not f.required else f.type | None
            out.append(
                inspect.Parameter(
                    f.name + "_" if f.name in RESERVED else f.name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=None if f.required else f.default,
                    annotation=Annotated[kind, QueryParameter(name=f.name)],
                )
            )
        return out


RESERVED = frozenset({"state", "request", "data", "query", "headers", "cookies", "scope", "socket"})


def _spec(
    path: str,
    args: type[msgspec.Struct],
    fn: Callable[..., Any],
    returns: Any,
    *,
    personal: bool = False,
    pooled: bool = True,
) -> ReadSpec:
    return ReadSpec(path, args, fn, returns, (fn.__doc__ or "").strip(), personal, pooled)


READS: dict[str, ReadSpec] = {
    "accounts": _spec("accounts", NoArgs, _accounts, list[v.AccountNode], pooled=False),
    "nodes": _spec("nodes", NoArgs, _nodes, list[v.NodeRow], pooled=False),
    "jobs": _spec("jobs", v.JobFilter, _jobs, list[v.JobRow], personal=True),
    "log": _spec("log", v.LogFilter, _log, list[v.LogEntry], personal=True),
    "shares": _spec("shares", SharesArgs, _shares, list[v.ShareRow]),
    "usage": _spec("usage", UsageArgs, _usage_rows, list[v.UsageRow]),
    "delivered": _spec("report/delivered", DeliveredArgs, _delivered, v.DeliveredView),
    "queue": _spec("queue", QueueArgs, _queue, list[v.QueueRow], pooled=False),
    "queue_total": _spec("queue/total", QueueArgs, _queue_total, int, pooled=False),
    "priority": _spec("priority", QueueArgs, _priority, list[v.PriorityRow], pooled=False),
    "explain": _spec("explain", ExplainArgs, _explain, v.ExplainView, personal=True, pooled=False),
    "squatters": _spec("squatters", SquattersArgs, _squatters, list[v.SquatterRow], pooled=False),
    "projection": _spec("projection", NoArgs, _projection_status, v.ProjectionStatusView),
    "audit_preemptions": _spec(
        "audit/preemptions", AuditArgs, _audit_preemptions, list[v.PreemptionRow]
    ),
    "preemptions": _spec(
        "report/preemptions", PreemptionReportArgs, _preemption_report, v.PreemptionReportView
    ),
    "audit_budget_changes": _spec(
        "audit/budget-changes", AuditArgs, _audit_budget_changes, list[v.BudgetChangeRow]
    ),
}
