"""Request and response shapes of the HTTP API that are not commands or events.

Commands (`schemas.commands`) are the request bodies of `/v1/commands/*` as they are; events
(`schemas.events`) come back in `CommandResult`. Errors are RFC 9457 problem details carrying the
`LedgerError` code, so a client raises the same error class the server raised.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.bounds import AccountPath, Epoch, Name
from schemas.commands import AnyCommand
from schemas.events import AnyEvent, TokenScope


class CommandResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one accepted command appended, and the log position after it."""

    position: int
    events: list[AnyEvent]


MAX_BATCH = 2_000
"""The most commands one batch holds (a budget file lists at most as many names,
`ledger.core.budget.MAX_NAMES`): a batch is decided whole on the worker thread, and a
40,000-command one held the cycle and everyone's submits ~21 s (atk44-25 F7)."""


class Batch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Commands applied atomically: all are appended, or none (budgets as code); at most
    `MAX_BATCH` (2,000) of them."""

    commands: Annotated[list[AnyCommand], msgspec.Meta(max_length=MAX_BATCH)]


class Problem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An error (application/problem+json): `code` is the LedgerError code, `detail` the one
    line the CLI prints."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    code: str
    message: str = ""
    hint: str = ""
    param: str = ""
    """The query parameter whose value was refused, when one was (the dashboard drops it and
    says so beside its filter); "" otherwise."""


SILENT_S = 5.0
"""A server that has not reported for this long is silent (each reports every second)."""


class ServerState(msgspec.Struct, frozen=True, kw_only=True):
    """One of several servers on a PostgreSQL store, as it last reported (docs/ha.md)."""

    address: str
    role: str
    """"leader" (the lease's holder now), "standby", "refused" (a standby that takes no lease:
    its settings are not the ones the store records), or "ex-leader" (it said it led when it
    last reported, and holds the lease no more: dead, paused, cut off or deposed)."""
    position: int
    """The log position it has folded."""
    lag: int
    """Events behind the store's head."""
    seen_s_ago: float


RELAY_STATE_DOC = (
    'The relay\'s state (None without Kafka): "connecting", "publishing", "stalled" (a send or'
    ' commit has not come back), "unavailable" (the broker does not answer), "stopped" (an '
    'error retrying cannot fix), "exited" (the service ended); on a standby, the leader\'s as '
    'it last reported it, "stale" when that report is too old and "unreported" when the '
    "leader (of an earlier version) reports nothing of its relay (position and lag unknown)."
)
"""`Health.relay_state`'s words, in the OpenAPI document too."""
RELAY_ERROR_DOC = (
    "Why the relay is not publishing, when it is not (one line); while it publishes the "
    "store's log again from position 1 (its topic was deleted, made again or cut), that and "
    'its progress: "publishing the store\'s log again from position 1 (why): position P of H";'
    " on a standby, whose relay it is and how old the word is."
)
"""`Health.relay_error`'s words, in the OpenAPI document too."""


class Health(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/health` and `gpuledger status`."""

    status: str
    """"up", or "stopping" once a signal arrived (writes are refused)."""
    version: str
    started_at: float
    head: int
    """Position of the newest event in the store: the event count."""
    cycles: int
    last_cycle_at: float | None
    last_cycle_s: float | None
    projection_position: int
    projection_lag: int
    relay_position: int | None
    """Position the relay last published to Kafka (None without Kafka)."""
    relay_lag: int | None
    last_error: str | None = None
    relay_state: Annotated[str | None, msgspec.Meta(description=RELAY_STATE_DOC)] = None
    """The relay's state (None without Kafka): "connecting", "publishing", "stalled" (a send or
    commit has not come back), "unavailable" (the broker does not answer), "stopped" (an error
    retrying cannot fix), "exited" (the service ended); on a standby, the leader's as it last
    reported it, "stale" when that report is too old and "unreported" when the leader (of an
    earlier version) reports nothing of its relay (position and lag unknown)."""
    relay_error: Annotated[str | None, msgspec.Meta(description=RELAY_ERROR_DOC)] = None
    """Why the relay is not publishing, when it is not (one line); while it publishes the
    store's log again from position 1 (its topic was deleted, made again or cut), that and its
    progress: "publishing the store's log again from position 1 (why): position P of H"; on a
    standby, whose relay it is and how old the word is."""
    relay_checked_s_ago: float | None = None
    """How long ago (s) this server's relay last found its topic the one it published to (its
    check every second, a connect, a commit): more than 3 checks + 1 s on a live relay, its
    position is no longer sure to be the topic's (docs/kafka.md). None: no relay here (a
    standby tells no age of the leader's), or not known yet."""
    executor: str = ""
    """What runs the jobs: agents, local, slurm, record (placements only recorded), none."""
    placing: bool = True
    """False when nothing would run a placement (no executor): jobs wait, nothing is placed."""
    jobs_run_as: str = ""
    """Who jobs run as, in words."""
    engine_note: str = ""
    """What the engine's settings mean for jobs, in words ("" for nothing): Slurm under
    sched/builtin refuses a gang whose nodes get different GPUs (docs/slurm.md)."""
    role: str = "single"
    """"single" (the only server of its store), "leader" or "standby" (docs/ha.md)."""
    leader: str = ""
    """The leader's address ("" for a single server, or while no server leads)."""
    epoch: int = 0
    """The leadership epoch this server last held or saw (0: a single server)."""
    lease_s: float | None = None
    """The leader's lease (None: a single server, or no lease seen)."""
    lease_expires_in_s: float | None = None
    """Seconds until the leader's lease expires, as of this answer (the database's clock);
    negative: it ran out that long ago and no server has taken it yet (the leader is down,
    paused or cut off from the store). None: a single server, or no lease seen."""
    lease_renewed_s_ago: float | None = None
    """Seconds since the leader last renewed its lease (it renews every third of the lease:
    more than that is a leader that stopped renewing)."""
    store: str = "sqlite"
    """"sqlite" or "postgresql"."""
    store_error: str | None = None
    """Why the store does not answer, when it does not (writes are refused meanwhile); on a
    server of several, also a lease statement that failed less than one lease ago, or has had
    no answer for a third of the lease (a link that drops packets: docs/ha.md)."""
    lease_read_s_ago: float | None = None
    """Seconds since this server last read the lease row: the lease fields are as of then
    (None: a single server, or never read)."""
    stale_s: float | None = None
    """How old the log this standby answers reads from is, when older than one lease (its
    reads of the store fail): its read answers say so too (`X-Gpuledger-Stale`). None: fresh,
    a leader, or a single server."""
    address_error: str | None = None
    """Another server reports at this server's address (two servers advertising one URL):
    this server takes no lease while it does (docs/ha.md). None: it is alone there."""
    settings_error: str | None = None
    """Why this server takes no lease: its settings (lease, node-lost timeout, fence, executor,
    policy) are not the ones its store records (docs/ha.md); None: they are, or one server."""
    no_taker: str | None = None
    """Why no running server would take the lease once the leader's runs out (every standby
    is refused by its settings, or none runs), in words; None: a standby would, or one
    server. The operator must act then: start a server with the recorded settings."""
    older_servers: str | None = None
    """Servers of an earlier version whose takes or keeps of the lease the database refused in
    the last hour (they neither record nor check every setting this version does), each with
    how many, e.g. "http://s2:8470 (12)"; None: none (docs/ha.md, "Upgrading")."""
    servers: list[ServerState] = []
    """Every server on the store that reported in the last minute, with its lag."""
    unobserved: tuple[str, ...] = ()
    """Nodes the execution engine cannot observe now (slurmctld does not answer, a slurmd does
    not respond): nothing is placed on them or preempted from them until it can (outage)."""
    unobserved_since: float | None = None
    """Since when the engine has not observed every node (None: it observes them all)."""
    unobserved_why: str = ""
    """Why it observes none, when it says: "slurmctld does not answer", or another Slurm
    cluster answers in its place ("" otherwise)."""
    engine_away: str | None = None
    """Why the executor is not open, when it is not (the service started while slurmctld did
    not answer, or Slurm refuses the partition): nothing is placed until it opens."""
    engine_away_since: float | None = None


class WhoAmI(msgspec.Struct, frozen=True, kw_only=True):
    actor: str
    via: str
    admin: bool


class TokenRow(msgspec.Struct, frozen=True, kw_only=True):
    """A token as `token list` shows it: never its secret or hash."""

    token_id: str
    user: str
    name: str
    issued_at: float
    expires_at: float | None
    scope: TokenScope
    scope_node: str | None
    scope_job: int | None
    revoked: bool


BUDGET_FILE_MAX = 1 << 20
"""The largest budget file the server takes (bytes of TOML)."""
AUDIT_SQL_MAX = 64 << 10


class BudgetPlanRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`budget apply` through the server: the file's TOML (named as the CLI names it, so errors
    read the same), planned against the ledger as the caller (or `actor`, for admins)."""

    name: Annotated[str, msgspec.Meta(max_length=4096)] = "budget file"
    toml: Annotated[str, msgspec.Meta(max_length=BUDGET_FILE_MAX)]
    prune: bool = False
    check: bool = False
    """Also check every change as it would be applied (the dry run); nothing is appended."""
    actor: Name = ""


class BudgetChange(msgspec.Struct, frozen=True, kw_only=True):
    symbol: str
    """+ add, ~ change, - remove"""
    text: str
    command: AnyCommand


class BudgetPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The changes that make the ledger match a budget file (apply them with /v1/batch)."""

    changes: list[BudgetChange]


class AuditQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An audit table through the server: one read-only SELECT (`sql`), a job's history
    (`job`), the preemptions or the budget changes."""

    kind: Literal["sql", "job", "preemptions", "budget-changes"]
    sql: Annotated[str, msgspec.Meta(max_length=AUDIT_SQL_MAX)] = ""
    job_id: Annotated[int, msgspec.Meta(ge=1, le=2**62)] | None = None
    account: AccountPath | None = None
    since: Epoch | None = None


class AuditTable(msgspec.Struct, frozen=True, kw_only=True):
    """The result as an Arrow IPC stream (the exact table, so CSV, Parquet and the table print
    the same bytes as in embedded mode)."""

    rows: int
    arrow: bytes


class AuditStep(msgspec.Struct, frozen=True, kw_only=True):
    """How far one whole-log audit under way is: events done of its stage's total (the store's
    head for the chain and `check`; the newest snapshot's position when its snapshots are
    checked against the fold, the projection's when its rows are against a fresh build);
    `stage` "waiting" while another's audit of its kind runs (done and total 0)."""

    done: int
    total: int
    stage: str = ""


class AuditFrame(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One line of a whole-log audit's answer streamed as NDJSON (`GET /v1/audit/verify` or
    `/v1/audit/check` with `Accept: application/x-ndjson`): a `step` at least every second while
    it runs, then one line with its `result` (the plain answer's JSON) or its `error`."""

    step: AuditStep | None = None
    result: msgspec.Raw = msgspec.Raw(b"null")
    """The plain answer's JSON as it came (null: not the last line)."""
    error: Problem | None = None


class AuditProgress(msgspec.Struct, frozen=True, kw_only=True):
    """The whole-log audits under way in the caller's lane (admins', or everyone else's): null
    when none runs (`GET /v1/audit/progress`, what `audit verify` and `audit check` show)."""

    verify: AuditStep | None = None
    check: AuditStep | None = None
