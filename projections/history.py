"""What happened, read from the projection: the read-side queries over its tables.

Every query the read layer (`ledger.reads.layer`), the audit (`ledger.history`) and what-if ask
of the projection's history lives here, over the projector's tables. Two rules keep readers on
the latest version of every event (`schemas.codec` upcasts; the golden corpus holds the rest):

- fields come from the read models (`jobs`, `job_intervals`, `preemptions`, `decisions`,
  `account_history`, ...), whose rows the projector wrote from upcast events, or from the
  common columns of `events` (`occurred_at`, `actor`, `job_id`, `account`, `user_name`);
- an event's own fields are read by decoding its stored bytes with the codec (`events_of`,
  `job_events`, ...), never by SQL over `raw`. Events are selected by type, through every tag
  the codec says is stored for it (`codec.stored_tags`), never by naming a version.

Each function takes a DuckDB connection to a projection (read-only is enough) and explicit
times: nothing here reads the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from schemas import events as e
from schemas import views as v

if TYPE_CHECKING:  # `jobs` from the CLI loads neither DuckDB's Python API, Arrow nor the codec
    import _duckdb

    Con = _duckdb.DuckDBPyConnection


PART = 256


def fetch_in_parts(cur: Any) -> list[Any]:
    """Every row of `cur`, `PART` at a time: DuckDB makes a fetch's Python objects holding the
    interpreter lock, so one fetch of 10,000 rows would hold it for their whole making (a
    server's reads run beside its worker and event loop, which then wait); parts let them in."""
    out: list[Any] = []
    while True:
        part = cur.fetchmany(PART)
        if not part:
            return out
        out += part


def decode(raw: str | bytes) -> e.AnyEvent:
    """An event of the `events` table (its `raw` column), as the latest version of its type."""
    from schemas import codec

    return codec.decode(raw.encode() if isinstance(raw, str) else raw)


def tags(*types: type[e.Event]) -> list[str]:
    """Every tag stored for these types (latest versions): the parameter that selects them."""
    from schemas import codec

    return codec.stored_tags(*types)


# --- events by type ---------------------------------------------------------------------------

_EVENTS_OF = """
SELECT position, raw FROM events
WHERE list_contains($tags, tag)
  AND ($first IS NULL OR position >= $first) AND ($last IS NULL OR position <= $last)
  AND ($ids IS NULL OR job_id IN (SELECT unnest($ids)))
ORDER BY position
"""


def events_of(
    con: Con,
    types: Sequence[type[e.Event]],
    *,
    job_ids: Sequence[int] | None = None,
    first: int | None = None,
    last: int | None = None,
) -> list[tuple[int, e.AnyEvent]]:
    """(position, event) of the events of `types` (latest versions) in log order; only those of
    `job_ids` and with positions in [first, last] when given."""
    rows = con.execute(
        _EVENTS_OF,
        {
            "tags": tags(*types),
            "first": first,
            "last": last,
            "ids": None if job_ids is None else list(job_ids),
        },
    ).fetchall()
    return [(position, decode(raw)) for position, raw in rows]


def graces(con: Con, job_ids: Sequence[int]) -> dict[int, int | None]:
    """Each of these jobs' own grace as submitted (`submit --grace`; None: the service's): when
    a stopping job is killed (`ledger.reads.stopping`)."""
    found = events_of(con, [e.JobSubmitted], job_ids=job_ids) if job_ids else []
    return {ev.job_id: ev.grace_s for _, ev in found if isinstance(ev, e.JobSubmitted)}


def placement_graces(con: Con, job_ids: Sequence[int]) -> dict[int, float]:
    """Each of these jobs' service grace for its latest run: the last `service.configured`
    before its latest placement (`service_grace`), as the live state keeps it
    (`Job.service_grace_s`, atk49-23 F1); a job never placed is not in the result."""
    placed = events_of(con, [e.JobPlaced], job_ids=job_ids) if job_ids else []
    last = {ev.job_id: pos for pos, ev in placed if isinstance(ev, e.JobPlaced)}
    return {j: service_grace(con, before=pos) for j, pos in last.items()}


def service_grace(con: Con, at: float | None = None, *, before: int | None = None) -> float:
    """The grace the service gives a job stopped without one of its own (`serve`/`up
    --grace`), as its last `service.configured` recorded by `at` (None: the latest) and before
    position `before` (None: any) says;
    `DEFAULT_GRACE_S` when none recorded it (a service before `service.configured.v2`, or
    none ever ran): the live state's `State.grace_s`, for the reads that read the projection
    (`jobs`, `explain`'s history)."""
    from schemas.bounds import DEFAULT_GRACE_S

    row = con.execute(
        "SELECT raw FROM events WHERE list_contains($tags, tag)"
        " AND ($at IS NULL OR occurred_at <= $at) AND ($before IS NULL OR position < $before)"
        " ORDER BY position DESC LIMIT 1",
        {"tags": tags(e.ServiceConfigured), "at": at, "before": before},
    ).fetchone()
    ev = None if row is None else decode(row[0])
    grace = ev.grace_s if isinstance(ev, e.ServiceConfigured) else None
    return DEFAULT_GRACE_S if grace is None else float(grace)


class JobEvent(NamedTuple):
    """One event of a job, as the log holds it: its place and common columns, decoded."""

    position: int
    occurred_at: float
    tag: str
    """The tag it was stored with."""
    actor: str
    event: e.AnyEvent


def job_events(con: Con, job_id: int) -> list[JobEvent]:
    """Every event (of a type this code knows) about `job_id`, in log order."""
    rows = con.execute(
        "SELECT position, occurred_at, tag, actor, raw FROM events "
        "WHERE job_id = $job AND known ORDER BY position",
        {"job": job_id},
    ).fetchall()
    return [JobEvent(p, at, tag, actor, decode(raw)) for p, at, tag, actor, raw in rows]


def decisions_of_cycles(con: Con, cycle_ids: Iterable[str]) -> dict[str, e.CycleDecided]:
    """The recorded decisions of these cycles, by cycle id."""
    rows = con.execute(
        "SELECT raw FROM events WHERE position IN "
        "(SELECT position FROM decisions WHERE cycle_id IN (SELECT unnest($ids)))",
        {"ids": sorted(cycle_ids)},
    ).fetchall()
    out = {}
    for (raw,) in rows:
        ev = decode(raw)
        if isinstance(ev, e.CycleDecided):
            out[ev.cycle_id] = ev
    return out


def last_samples(con: Con, job_ids: Sequence[int]) -> dict[int, e.UtilisationSampled]:
    """The last utilisation sample of each of `job_ids` that has one."""
    rows = con.execute(
        "SELECT job_id, arg_max(raw, position) FROM events "
        "WHERE list_contains($tags, tag) AND job_id IN (SELECT unnest($ids)) GROUP BY job_id",
        {"tags": tags(e.UtilisationSampled), "ids": list(job_ids)},
    ).fetchall()
    out = {}
    for job_id, raw in rows:
        ev = decode(raw)
        if isinstance(ev, e.UtilisationSampled):
            out[int(job_id)] = ev
    return out


# --- jobs -------------------------------------------------------------------------------------

_JOB_STATUS = {
    "active": "j.status <> 'finished'",  # pending and held jobs are active too
    "pending": "j.status = 'pending' AND NOT j.held",
    "held": "j.status = 'pending' AND j.held",
}
"""The `status` filters that are not one stored status (held is a state of a pending job)."""

_REASON_WORD = (
    "CASE WHEN j.finish_reason = 'failed' AND j.engine_reason = 'time_limit' THEN "
    "'time_limit' WHEN j.finish_reason = 'failed' AND j.engine_reason = 'node_failure' "
    "THEN 'node_lost' ELSE j.finish_reason END"
)
"""A job's `finish_reason` as the rows read it (a v1 end's engine word: see `_JOBS`)."""

_JOB_FILTERS = (
    ("user", "j.user_name = $user"),
    # a job's place in the tree is its account and, below it, its user's node (as the
    # preemption report reads it: `-A prog/proj/alice`)
    (
        "account",
        "(j.account = $account OR starts_with(j.account, $account || '/')"
        " OR j.account || '/' || j.user_name = $account)",
    ),
    ("since", "(j.finished_at IS NULL OR j.finished_at >= $since)"),
    ("until", "j.submitted_at <= $until"),
    ("job_id", "j.job_id = $job_id"),
    # sacct -j: these jobs, and every task of the arrays whose ids they are
    (
        "job_ids",
        "(j.job_id IN (SELECT unnest($job_ids)) OR j.array_job_id IN (SELECT unnest($job_ids)))",
    ),
    ("before", "j.submitted_position <= $before"),
    ("below", "j.job_id < $below"),
    # the word `finish_reason` says (a v1 end's engine word read as the rows read it)
    ("reason", f"({_REASON_WORD}) = $reason"),
)

_JOBS = """WITH page AS (  -- the page first: newest first, over the given filters' columns only
    SELECT j.job_id FROM jobs j{where}
    ORDER BY j.job_id DESC LIMIT $limit OFFSET $offset
), top AS (  -- then only the page's rows
    SELECT j.* FROM jobs j
    WHERE j.job_id >= (SELECT min(job_id) FROM page) AND j.job_id IN (SELECT job_id FROM page)
), iv AS (  -- its last placement: the GPUs it holds, or held in its last run, and that run's
            -- real end when the ledger stopped it (its processes outlive the stop by a grace)
    SELECT job_id, arg_max(slots, start_position) AS slots,
           -- the GPUs of its last run that started: where a finished job ran (its placement
           -- after a requeue may never have launched: atk53-23 F7)
           arg_max(slots, start_position) FILTER (WHERE run_start_at IS NOT NULL) AS ran_slots,
           arg_max(start_at, start_position) AS start_at,
           arg_max(run_end_at, start_position) AS run_end_at,
           arg_max(run_start_at, start_position) AS run_start_at
    FROM job_intervals
    WHERE job_id IN (SELECT job_id FROM top)
    GROUP BY job_id
)
SELECT j.job_id, j.account, j.user_name, j.gpus, j.gpu_type, j.cluster,
       CASE WHEN j.status = 'pending' AND j.held THEN 'held' ELSE j.status END AS state,
       j.outcome, j.exit_code, j.funded, j.min_runtime_s, j.resumable, j.priority, j.debug,
       j.time_limit_s, j.submitted_at,
       -- a finished job keeps its last placement's time (a preemption that ended it cleared it)
       CASE WHEN j.status = 'finished' THEN coalesce(j.placed_at, iv.start_at)
            ELSE j.placed_at END AS placed_at,
       -- a run stopped while placed whose command ran: its own start, as charged (atk44s F3)
       CASE WHEN j.status = 'running' THEN j.run_started_at
            WHEN j.status = 'finished' THEN coalesce(j.run_started_at, iv.run_start_at)
       END AS started_at,
       -- a finished job ended when its last run really ended, when that came after the stop,
       -- or before its lost node's fence ended it (its node's report wins: atk46-23 F5), or
       -- before the stop when its command's own exit code is known (it exited by itself, the
       -- stop recorded after, e.g. offline: atk55-23 F3; a run the stop ended shows no code)
       CASE WHEN j.status = 'finished' AND (iv.run_end_at > j.finished_at
                 OR j.engine_reason = 'node_failure' AND iv.run_end_at IS NOT NULL
                 OR j.exit_code IS NOT NULL AND iv.run_end_at < j.finished_at)
            THEN iv.run_end_at ELSE j.finished_at END AS finished_at,
       j.placements, j.preemptions,
       CASE WHEN j.status = 'pending' THEN []
            WHEN j.status = 'finished' THEN coalesce(iv.ran_slots, iv.slots, [])
            ELSE coalesce(iv.slots, []) END AS slots,
       j.command, j.logs,
       -- a v1 end said only `failed`; the engine's word then says a time limit or a lost node
       CASE WHEN j.finish_reason = 'failed' AND j.engine_reason = 'time_limit' THEN 'time_limit'
            WHEN j.finish_reason = 'failed' AND j.engine_reason = 'node_failure' THEN 'node_lost'
            ELSE j.finish_reason END AS finish_reason,
       coalesce(j.finish_note, '') AS finish_note, j.engine_job_id, j.job_name, j.workdir,
       j.array_job_id, j.array_task_id
FROM top j LEFT JOIN iv USING (job_id)
ORDER BY j.job_id DESC
"""


def jobs_page(
    con: Con,
    f: v.JobFilter,
    *,
    job_id: int | None = None,
    before: int | None = None,
    below: int | None = None,
    reason: str | None = None,
    offset: int = 0,
) -> list[tuple[Any, ...]]:
    """The jobs `f` selects (only `job_id` when given; only those submitted at or before log
    position `before` when given), newest first, at most `f.limit`, each as the tuple (job_id,
    account, user_name, gpus, gpu_type, cluster, state, outcome, exit_code, funded,
    min_runtime_s, resumable, priority, debug, time_limit_s, submitted_at, placed_at,
    started_at, finished_at, placements, preemptions, slots, command, logs, finish_reason,
    finish_note, engine_job_id, job_name, workdir, array_job_id, array_task_id), with ids
    below `below` when given (the next page), past the first `offset` of them, ended for
    `reason` when given (a `finish_reason` word): `state` is
    `held` for a held pending job; `started_at` the start of its running or last run (None when
    no process started; for a run the ledger stopped while placed whose command ran, its own
    start as its engine reported it, from which it was charged); `finished_at` its end, or its
    last run's real end when the ledger stopped it and its processes outlived the stop (their
    grace); `slots` the GPUs it holds or its last run held (a finished job: its last run that
    started, not a placement after it that never launched); `logs` are those of its last
    start; `finish_reason` the ledger's word on why it ended. `since`/`until` select the jobs
    alive at some moment of [since, until].

    The page is cut first, on the jobs table alone: a filter not given is left out of the
    statement, so the engine reads no column for it and the page without filters is a top-N
    over one column, whatever the history; only then do the page's rows get their GPUs."""
    given = {
        "user": f.user,
        "account": f.account.rstrip("/") if f.account else None,
        "since": f.since,
        "until": f.until,
        "job_id": job_id,
        "job_ids": list(f.job_ids) if f.job_ids is not None else None,
        "before": before,
        "below": below,
        "reason": reason,
    }
    where, params = _job_where(f, given)
    sql = _JOBS.format(where=f"\n    WHERE {' AND '.join(where)}" if where else "")
    return fetch_in_parts(con.execute(sql, {**params, "limit": f.limit, "offset": offset}))


def _job_where(f: v.JobFilter, given: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The conditions and parameters of the filters given (`_JOB_FILTERS`) and `f.status`."""
    where = [sql for name, sql in _JOB_FILTERS if given.get(name) is not None]
    params: dict[str, Any] = {k: x for k, x in given.items() if x is not None}
    if f.reasons is not None:  # the finish_reason word as the rows read it, one of these
        where.append(f"({_REASON_WORD}) IN (SELECT unnest($reasons))")
        params["reasons"] = list(f.reasons)
    if f.status in _JOB_STATUS:
        where.append(_JOB_STATUS[f.status])
    elif f.status is not None:
        where.append("j.status = $status")
        params["status"] = f.status
    return where, params


def jobs_count(con: Con, f: v.JobFilter, reason: str | None = None) -> int:
    """How many jobs `f` (its user, account, status, `since`/`until`) and `reason` select:
    the true total of the pages `jobs_page` cuts."""
    given = {
        "user": f.user,
        "account": f.account.rstrip("/") if f.account else None,
        "since": f.since,
        "until": f.until,
        "reason": reason,
    }
    where, params = _job_where(f, given)
    sql = "SELECT count(*) FROM jobs j" + (f" WHERE {' AND '.join(where)}" if where else "")
    (n,) = con.execute(sql, params).fetchone() or (0,)
    return int(n)


def last_at(con: Con) -> float | None:
    """When the log's last event happened (None: no event yet)."""
    (at,) = con.execute("SELECT max(occurred_at) FROM events").fetchone() or (None,)
    return None if at is None else float(at)


def position_at(con: Con, at: float) -> int | None:
    """The log position the ledger stood at, at time `at`: the end of the longest prefix of the
    log whose events all happened at or before `at`; None when no event happened after `at`
    (the ledger then is the ledger now)."""
    row = con.execute("SELECT min(position) FROM events WHERE occurred_at > $at", {"at": at})
    (first_after,) = row.fetchone() or (None,)
    return None if first_after is None else int(first_after) - 1


def changed_after(con: Con, job_ids: Sequence[int], position: int) -> list[int]:
    """Those of `job_ids` whose row an event after `position` changed: one of its own, or the
    report of a stopped run's real end (`JobRunEnded`, which moves the row's end, read from
    its interval)."""
    got = con.execute(
        "SELECT job_id FROM jobs WHERE job_id IN (SELECT unnest($ids)) AND last_position > $p "
        "UNION SELECT job_id FROM job_intervals WHERE job_id IN (SELECT unnest($ids)) "
        "AND run_end_position > $p",
        {"ids": list(job_ids), "p": position},
    ).fetchall()
    return sorted(int(job_id) for (job_id,) in got)


def job_records(con: Con, job_ids: Sequence[int], until: int) -> list[tuple[int, str, bytes]]:
    """The stored records (position, tag, bytes) of these jobs' events up to `until`, in log
    order: what a projection of them alone as of `until` is built from."""
    got = con.execute(
        "SELECT position, tag, raw FROM events WHERE job_id IN (SELECT unnest($ids)) "
        "AND position <= $until AND known ORDER BY position",
        {"ids": list(job_ids), "until": until},
    ).fetchall()
    return [
        (int(p), str(t), raw.encode() if isinstance(raw, str) else bytes(raw)) for p, t, raw in got
    ]


def owners(con: Con, job_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
    """(user, account) of each of `job_ids` the projection knows."""
    got = con.execute(
        "SELECT job_id, user_name, account FROM jobs WHERE job_id IN (SELECT unnest($ids))",
        {"ids": list(job_ids)},
    ).fetchall()
    return {job_id: (user, account) for job_id, user, account in got}


# --- the log ----------------------------------------------------------------------------------


class LogRow(NamedTuple):
    position: int
    tag: str
    occurred_at: float | None
    actor: str | None
    event: e.AnyEvent | None
    """None for a tag this code does not know."""


def log_page(con: Con, after: int, limit: int, *, tail: int | None = None) -> list[LogRow]:
    """Events after position `after` in log order: the first `limit` of them, or with `tail` the
    last `tail` of them."""
    if tail is not None:
        sql = (
            "SELECT * FROM (SELECT position, tag, known, occurred_at, actor, raw FROM events "
            "WHERE position > $after ORDER BY position DESC LIMIT $n) ORDER BY position"
        )
        n = tail
    else:
        sql = (
            "SELECT position, tag, known, occurred_at, actor, raw FROM events "
            "WHERE position > $after ORDER BY position LIMIT $n"
        )
        n = limit
    rows = fetch_in_parts(con.execute(sql, {"after": after, "n": n}))
    return [
        LogRow(pos, tag, at, actor, decode(raw) if known else None)
        for pos, tag, known, at, actor, raw in rows
    ]


# --- decisions and counts ---------------------------------------------------------------------


def decisions(
    con: Con,
    since: float | None = None,
    until: float | None = None,
    limit: int = 500,
    *,
    job_id: int | None = None,
    position: int | None = None,
    before: int | None = None,
) -> list[tuple[Any, ...]]:
    """Recorded dispatcher cycles, newest first (at most `limit`): (position, cycle_id,
    decided_at, based_on, policy_version, placed_jobs, preempted_jobs, considered,
    fragmentation_gpus), in [since, until], that placed or preempted `job_id`, or the one at
    `position`; `before`: only those before this position (the next page, newest first)."""
    return con.execute(
        "SELECT position, cycle_id, decided_at, based_on, policy_version, placed_jobs, "
        "preempted_jobs, considered, fragmentation_gpus FROM decisions "
        f"WHERE {_DECIDED_IN} "
        "AND ($job IS NULL OR list_contains(placed_jobs, $job) "
        "OR list_contains(preempted_jobs, $job)) "
        "AND ($pos IS NULL OR position = $pos) AND ($before IS NULL OR position < $before) "
        "ORDER BY position DESC LIMIT $limit",
        {"since": since, "until": until, "limit": limit, "job": job_id, "pos": position,
         "before": before},
    ).fetchall()  # fmt: skip


_DECIDED_IN = (
    "($since IS NULL OR decided_at >= $since) AND ($until IS NULL OR decided_at <= $until)"
)


def decision_count(con: Con, since: float | None = None, until: float | None = None) -> int:
    """How many recorded dispatcher cycles `decisions` pages through in [since, until]."""
    row = con.execute(
        f"SELECT count(*) FROM decisions WHERE {_DECIDED_IN}", {"since": since, "until": until}
    ).fetchone()
    return int(row[0]) if row else 0


def job_decisions(con: Con, job_id: int, limit: int) -> list[tuple[int, e.CycleDecided]]:
    """The last `limit` recorded decisions of `job_id`'s span of the log (its submission to its
    last event, or on to the head while it is not finished: every decision then considered the
    job, waiting, placed or running, whether or not the record lists it among its first waiting
    jobs), in log order, decoded: read newest first, `limit` found at a time; never a walk of
    the whole log. (The job page's replay: the decisions `ledger.history.replay.Selection(job=...)`
    picks; the job page replays `listed_decisions`.)"""
    span = con.execute(
        "SELECT submitted_position, CASE WHEN status = 'finished' THEN last_position END "
        "FROM jobs WHERE job_id = $job",
        {"job": job_id},
    ).fetchone()
    if span is None:
        return []
    first, last = int(span[0]), span[1]
    found: list[tuple[int, e.CycleDecided]] = []
    before = None
    while len(found) < limit:
        rows = con.execute(
            "SELECT position, raw FROM events WHERE list_contains($tags, tag) "
            "AND position >= $first AND ($last IS NULL OR position <= $last) "
            "AND ($before IS NULL OR position < $before) ORDER BY position DESC LIMIT 256",
            {"tags": tags(e.CycleDecided), "first": first, "last": last, "before": before},
        ).fetchall()
        for position, raw in rows:
            d = decode(raw)
            if isinstance(d, e.CycleDecided) and int(position) > first:
                found.append((int(position), d))
                if len(found) == limit:
                    break
        if len(rows) < 256:
            break
        before = rows[-1][0]
    return found[::-1]


def listed_decisions(con: Con, job_id: int, limit: int) -> list[tuple[int, e.CycleDecided]]:
    """The last `limit` recorded decisions that placed or preempted `job_id` (the ones the job
    page lists, `decisions(job_id=...)`), in log order, decoded. The job page replays these
    only: replaying every cycle of a pending job's span (`job_decisions`) replayed 8 cycles
    over the whole queue on each view after a new cycle, none of which the page shows
    (atk50-29 F4)."""
    positions = [int(r[0]) for r in decisions(con, None, None, limit, job_id=job_id)]
    found: list[tuple[int, e.CycleDecided]] = []
    for position in sorted(positions):
        for at, d in events_of(con, [e.CycleDecided], first=position, last=position):
            if isinstance(d, e.CycleDecided):
                found.append((at, d))
    return found


def placed_by(con: Con, job_id: int) -> dict[str, tuple[int, int, int]]:
    """Cycle id -> (the job's place among the cycle's placements, 1-based; placements; jobs
    considered) for every cycle that placed `job_id`."""
    rows = con.execute(
        "SELECT cycle_id, list_position(placed_jobs, $job), len(placed_jobs), considered "
        "FROM decisions WHERE list_contains(placed_jobs, $job)",
        {"job": job_id},
    ).fetchall()
    return {cycle: (k, n, considered) for cycle, k, n, considered in rows}


def waits(con: Con, job_id: int, first: int, last: int) -> list[tuple[int, float, str, str | None]]:
    """The recorded cycles in positions [first, last], each as (position, decided_at, cycle_id,
    the code it gave `job_id` when it lists the job among its first waiting jobs, else None)."""
    out = []
    for position, ev in events_of(con, [e.CycleDecided], first=first, last=last):
        if not isinstance(ev, e.CycleDecided):
            continue
        code = next((w.code for w in ev.waiting.first if w.job_id == job_id), None)
        out.append((position, ev.at, ev.cycle_id, code))
    return out


def preemption_counts(con: Con, after: int = 0) -> list[tuple[str, int]]:
    """Preemptions over the whole log (`after`: those recorded after this position), per
    reason."""
    return con.execute(
        "SELECT reason, count(*) FROM preemptions WHERE position > $after "
        "GROUP BY reason ORDER BY reason",
        {"after": after},
    ).fetchall()


def placement_counts(con: Con, after: int = 0) -> list[tuple[str, int]]:
    """Placements over the whole log (`after`: those after this position), funded or not."""
    return con.execute(
        "SELECT CASE WHEN funded THEN 'funded' ELSE 'unfunded' END AS kind, count(*) "
        "FROM job_intervals WHERE start_position > $after GROUP BY kind ORDER BY kind",
        {"after": after},
    ).fetchall()


def team_counts(con: Con, depth: int, after: int = 0) -> list[tuple[str, str, str, int]]:
    """Over the whole log (`after`: the placements and preemptions after this position), per
    team (an account's first `depth` parts): ("placed", team, "", n) placements; ("evicted",
    team, reason, n) preemptions its jobs suffered; ("preempted", preempting team or "",
    reason, n) preemptions for its waiting jobs ("" when no job caused it: maintenance,
    admin)."""
    team = "array_to_string(list_slice(string_split({}, '/'), 1, $depth), '/')"
    sql = f"""
        SELECT 'placed', {team.format("j.account")}, '', count(*)
        FROM job_intervals i JOIN jobs j USING (job_id) WHERE i.start_position > $after
        GROUP BY 2
        UNION ALL
        SELECT 'evicted', {team.format("p.account")}, p.reason, count(*)
        FROM preemptions p WHERE p.account IS NOT NULL AND p.position > $after GROUP BY 2, 3
        UNION ALL
        SELECT 'preempted', coalesce({team.format("f.account")}, ''), p.reason, count(*)
        FROM preemptions p LEFT JOIN jobs f ON f.job_id = p.for_job WHERE p.position > $after
        GROUP BY 2, 3
        ORDER BY 1, 2, 3
    """
    rows = con.execute(sql, {"depth": depth, "after": after}).fetchall()
    return [(k, t, r, int(n)) for k, t, r, n in rows]


# --- audit tables -----------------------------------------------------------------------------


class Query(NamedTuple):
    """A statement and its parameters: the audit runs it into an Arrow table
    (`ledger.history.tables.run_query`), the read layer into rows (`dicts`)."""

    sql: str
    params: dict[str, Any]


def dicts(con: Con, query: Query) -> list[dict[str, Any]]:
    """The rows of `query` as dicts by column name."""
    cur = con.execute(query.sql, query.params)
    names = [d[0] for d in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


PREEMPTIONS_SQL = """
SELECT p.position, p.preempted_at, p.job_id, p.account, p.user_name, p.gpus, p.reason,
       p.for_job, p.note, p.actor, p.cycle_id, p.funded, p.resumable, p.placed_at,
       p.preempted_at - p.placed_at AS held_s, j.min_runtime_s,
       coalesce(p.preempted_at < p.placed_at + j.min_runtime_s, false)
       -- an engine's take-back of a placement it never started ran none of its contract
       -- (`ledger.history.audit`, atk46-s F3)
       AND NOT (starts_with(p.actor, '@') AND starts_with(coalesce(p.note, ''), 'requeued by ')
                AND i.start_position IS NOT NULL AND i.run_start_position IS NULL)
           AS inside_contract
FROM preemptions p LEFT JOIN jobs j USING (job_id)
LEFT JOIN job_intervals i ON i.job_id = p.job_id AND i.end_position = p.position
WHERE ($account IS NULL OR p.account = $account OR starts_with(p.account, $account || '/')
       OR p.leaf = $account)
  AND ($since IS NULL OR p.preempted_at >= $since)
ORDER BY p.position
"""


def preemptions(account: str | None, since: float | None) -> Query:
    """Every preemption (of jobs in `account` or below it, at or after `since`): whose job, why,
    for which job, by whom, and whether it was inside the job's contract."""
    return Query(PREEMPTIONS_SQL, {"account": account, "since": since})


PREEMPTION_REPORT_SQL = """
WITH p AS (
    SELECT p.position, p.preempted_at, p.job_id, p.account, p.user_name, p.gpus, p.reason,
           coalesce(p.note, '') AS rule, p.for_job, f.account AS for_account,
           f.user_name AS for_user, p.actor, p.cycle_id, p.resumable, p.placed_at,
           p.preempted_at - p.placed_at AS held_s,
           (SELECT max(c.occurred_at) FROM events c
            WHERE list_contains($checkpointed, c.tag) AND c.job_id = p.job_id
              AND c.occurred_at >= p.placed_at AND c.position < p.position) AS checkpoint_at,
           -- a job's place in the tree is its account and, below it, its user's node
           ($account IS NULL OR starts_with(
               p.account || '/' || coalesce(p.user_name, '') || '/', $account || '/')) AS suffered,
           p.for_job IS NOT NULL AND ($account IS NULL OR starts_with(
               f.account || '/' || coalesce(f.user_name, '') || '/', $account || '/')) AS caused
    FROM preemptions p LEFT JOIN jobs f ON f.job_id = p.for_job
    WHERE ($since IS NULL OR p.preempted_at >= $since)
      AND ($until IS NULL OR p.preempted_at < $until)
)
SELECT position, preempted_at, job_id, account, user_name, gpus, reason, rule, for_job,
       for_account, for_user, actor, cycle_id, resumable, placed_at, held_s,
       CASE WHEN $account IS NULL THEN 'all' WHEN suffered AND caused THEN 'both'
            WHEN suffered THEN 'suffered' ELSE 'caused' END AS side,
       -- the work lost: since the placement, or a resumable job's last checkpoint in it
       coalesce(gpus, 0) * greatest(0, preempted_at - CASE WHEN resumable
           THEN coalesce(checkpoint_at, placed_at) ELSE placed_at END) / 3600.0
           AS lost_gpu_hours
FROM p
WHERE ($side <> 'of' AND caused) OR ($side <> 'by' AND suffered)
ORDER BY position
"""


def known_account(con: Con, account: str | None) -> None:
    """UnknownEntity when a filter's `account` is no node the log ever opened (closed ones
    count: their history stays; so does a person's node): the one answer of the queue, jobs,
    finished and preemption reads, not an empty page."""
    from schemas.errors import UnknownEntity
    from schemas.units import shorten

    if account is None:
        return
    if not con.execute(
        "SELECT 1 FROM account_history WHERE account = $a LIMIT 1", {"a": account.rstrip("/")}
    ).fetchone():
        raise UnknownEntity(
            f"no account {shorten(account)}", hint="see `gpuledger account tree`", param="account"
        )


def preemption_report(
    account: str | None, side: str, since: float | None, until: float | None
) -> Query:
    """The preemptions in [since, until) that `account`'s subtree suffered (its jobs were the
    victims, `side` "of") or caused (its waiting jobs were what they were preempted for, "by"),
    or both ("both"); with no account, every one. A job belongs to its account and to its
    user's node below it (`-A prog/proj/alice`); a preemption inside the subtree (victim and
    beneficiary both in it) was suffered and caused (its row's side "both"). Each with why
    (reason and the victim rule the policy noted), for which job and team, and the GPU-hours of
    work lost (since the placement, or since a resumable job's last checkpoint in that run)."""
    from schemas import events as e

    return Query(
        PREEMPTION_REPORT_SQL,
        {
            "account": account.rstrip("/") if account else None,
            "side": side,
            "since": since,
            "until": until,
            "checkpointed": tags(e.CheckpointReported),
        },
    )


BUDGET_CHANGES_SQL = """
WITH changes AS (
    SELECT e.position, e.occurred_at AS changed_at, e.actor AS who,
           split_part(e.tag, '.', 1) || ' ' || split_part(e.tag, '.', 2) AS change,
           e.account, e.user_name, h.shares::BIGINT AS shares, h.kind,
           coalesce(h.reason, '') AS reason
    FROM events e LEFT JOIN account_history h USING (position)
    WHERE list_contains($tags, e.tag)
)
SELECT position, changed_at, who, change, account, user_name, kind,
       CASE WHEN shares IS NOT NULL THEN lag(shares) OVER (
           PARTITION BY account, shares IS NOT NULL ORDER BY position) END
           AS shares_before,
       shares AS shares_after, reason
FROM changes
QUALIFY $since IS NULL OR changed_at >= $since
ORDER BY position
"""
"""Budget changes: the events of the budget tree's types with their common columns, the share,
kind and reason from `account_history` (the account events' read model); `change` is the tag
without its version."""

BUDGET_TYPES: tuple[type[e.Event], ...] = (
    e.AccountOpened,
    e.AccountClosed,
    e.SharesSet,
    e.MemberAdded,
    e.MemberRemoved,
    e.ManagerGranted,
    e.ManagerRevoked,
    e.AdminGranted,
    e.AdminRevoked,
)


def budget_changes(since: float | None) -> Query:
    """Who changed what in the budget tree (at or after `since`), and why: accounts opened and
    closed, shares (before and after), members, managers and admins."""
    return Query(BUDGET_CHANGES_SQL, {"tags": tags(*BUDGET_TYPES), "since": since})


def unfunded_charges(con: Con) -> list[tuple[int, int, float, str]]:
    """(job_id, start_position, start_at, leaf) of every interval charged (flagged funded) that
    belongs to an unfunded job (min runtime 0): none may exist."""
    return con.execute(
        "SELECT i.job_id, i.start_position, i.start_at, i.leaf FROM job_intervals i "
        "JOIN jobs j USING (job_id) WHERE i.funded AND j.min_runtime_s <= 0 "
        "ORDER BY i.start_position"
    ).fetchall()


# --- what-if ----------------------------------------------------------------------------------


def first_placements(
    con: Con, start: float, end: float, exclude: Sequence[int] = ()
) -> list[tuple[int, str, float, float | None]]:
    """(job_id, account, submitted_at, first placed at or None) of the jobs submitted in
    [start, end), but `exclude`."""
    return con.execute(
        "SELECT j.job_id, j.account, j.submitted_at, min(i.start_at) AS first_placed "
        "FROM jobs j LEFT JOIN job_intervals i USING (job_id) "
        "WHERE j.submitted_at >= $start AND j.submitted_at < $end "
        "AND NOT list_contains($exclude::BIGINT[], j.job_id) GROUP BY ALL",
        {"start": start, "end": end, "exclude": list(exclude)},
    ).fetchall()


def preemptions_by_account(con: Con, start: float, end: float) -> list[tuple[str | None, int]]:
    """Preemptions in [start, end), per account of the preempted job."""
    return con.execute(
        "SELECT account, count(*) FROM preemptions "
        "WHERE preempted_at >= $start AND preempted_at < $end GROUP BY account",
        {"start": start, "end": end},
    ).fetchall()
