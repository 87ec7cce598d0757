"""`GET /metrics`: the Prometheus exposition of the server (prometheus_client).

One registry per application. Two kinds of figures:

- observed as they happen: the dispatcher cycle's latency (a histogram fed by the service loop's
  `on_cycle` hooks) and the API's latency by route, method and status (an ASGI middleware);
- read at scrape time from the read layer (`ledger.reads.layer`), in the read pool on the view
  of the live state the worker thread publishes (`ledger.server.copied`; a scrape asks the
  worker thread nothing): queue depth
  by wait code and by team, placements and preemptions over the whole log, per-team usage, owed,
  delivered and LevelFS, projection lag (events and seconds), relay lag, and the age of each
  node's last heartbeat (the node agents' executor's `last_seen` under `serve --executor
  agents`, and anything recorded through `note_heartbeat`).

Who may scrape: the same identities as the reads (a person's bearer token, or the Unix socket's
peer); see docs/server.md.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.enums import ScopeType
from litestar.handlers import HTTPRouteHandler
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

WEEK_S = 7 * 86400.0
TEAM_DEPTH = 2
"""Teams are the accounts two levels down (program/project), as in `report delivered`."""

ROLES = ("single", "leader", "standby")
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
API_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class TeamFigures(msgspec.Struct, frozen=True, kw_only=True):
    team: str
    usage_gpu_hours: float = 0.0
    owed_gpu_hours: float = 0.0
    delivered_gpu_hours: float = 0.0
    level_fs: float | None = None
    """None: infinite (no usage in the window)."""


class Figures(msgspec.Struct, frozen=True, kw_only=True):
    """What a scrape reports from the ledger, read at one moment."""

    now: float
    head: int
    cycles: int
    projection_position: int
    projection_lag_s: float
    relay_lag: int | None
    """Events not yet on the topic (None: no relay; a standby's: the leader's as it last
    reported it, None once that word is stale)."""
    queue_by_code: dict[str, int]
    queue_by_team: dict[str, int]
    placements: dict[str, int]
    preemptions: dict[str, int]
    teams: list[TeamFigures]
    heartbeat_ages: dict[str, float]
    """Node -> seconds since it was last heard from."""
    unobserved: tuple[str, ...] = ()
    """Nodes the engine cannot observe now (outage mode)."""
    engine_open: bool = True
    """False while the executor waits for its engine to answer (`LoopStats.engine_away`)."""
    relay_report_age_s: float | None = None
    """A standby's: how long ago the leader reported the relay lag it tells (None: not told)."""
    relay_checked_s_ago: float | None = None
    """How long ago this server's relay last found its topic its own (None: no relay here)."""
    role: str = "single"
    """This server's role: `single` (its own store), `leader` or `standby` (a shared store)."""
    epoch: int = 0
    """The leader's epoch as this server knows it (0: no lease)."""
    server_lags: dict[str, int] = {}
    """Server address -> events behind the head, for every server on a shared store."""
    kueue: KueueFigures | None = None
    """The same ledger by Kueue's names (a team is a ClusterQueue, its program the cohort)."""


class KueueFigures(msgspec.Struct, frozen=True, kw_only=True):
    """Per team (ClusterQueue), what Kueue's metrics of the same concept count."""

    pending: list[tuple[str, str, int]]
    """(team, status, jobs): "active" the dispatcher considers it, "inadmissible" held or
    blocked (a dependency, an array's limit)."""
    admitted: list[tuple[str, int]]
    """(team, placements in the whole log)."""
    active: list[tuple[str, int]]
    """(team, jobs holding GPUs now)."""
    evicted: list[tuple[str, str, int]]
    """(team, reason, preemptions its jobs suffered)."""
    preempted: list[tuple[str, str, int]]
    """(preempting team or "", reason, preemptions its waiting jobs caused)."""
    usage: list[tuple[str, str, int]]
    """(team, GPU type, GPUs held now)."""


@functools.lru_cache(maxsize=4096)
def team_of(account: str, depth: int = TEAM_DEPTH) -> str:
    """Pure: the team an account belongs to (its first `depth` path parts); kept per account
    (a scrape asks it three times per queued job: 10,000 pending, 30,000 splits)."""
    return "/".join(account.split("/")[:depth])


def families(f: Figures) -> list[Metric]:
    """Pure: the metric families of one reading."""
    out: list[Metric] = []

    def gauge(name: str, doc: str, labels: list[str], rows: list[tuple[list[str], float]]) -> None:
        g = GaugeMetricFamily(name, doc, labels=labels)
        for values, x in rows:
            g.add_metric(values, x)
        out.append(g)

    def counter(name: str, doc: str, label: str, counts: dict[str, int]) -> None:
        c = CounterMetricFamily(name, doc, labels=[label])
        for k, n in sorted(counts.items()):
            c.add_metric([k], n)
        out.append(c)

    gauge("gpuledger_log_head", "Position of the last event in the log.", [], [([], f.head)])
    gauge(
        "gpuledger_read_at_seconds",
        "The moment the ledger figures of this scrape are read at (whole seconds).",
        [],
        [([], f.now)],
    )
    out.append(CounterMetricFamily("gpuledger_cycles", "Dispatcher cycles run.", value=f.cycles))
    gauge(
        "gpuledger_queue_jobs",
        "Pending jobs by wait code (NEXT_CYCLE, HELD, WAIT_*).",
        ["code"],
        [([k], n) for k, n in sorted(f.queue_by_code.items())],
    )
    gauge(
        "gpuledger_queue_jobs_by_team",
        "Pending jobs by team.",
        ["team"],
        [([k], n) for k, n in sorted(f.queue_by_team.items())],
    )
    counter(
        "gpuledger_placements", "Placements in the whole log, funded or not.", "kind", f.placements
    )
    counter(
        "gpuledger_preemptions", "Preemptions in the whole log, by reason.", "reason", f.preemptions
    )
    teams = sorted(f.teams, key=lambda t: t.team)
    gauge(
        "gpuledger_team_usage_gpu_hours",
        "Funded GPU-hours in the fair-share window, per team.",
        ["team"],
        [([t.team], t.usage_gpu_hours) for t in teams],
    )
    gauge(
        "gpuledger_team_owed_gpu_hours",
        "GPU-hours owed over the last 7 days, per team.",
        ["team"],
        [([t.team], t.owed_gpu_hours) for t in teams],
    )
    gauge(
        "gpuledger_team_delivered_gpu_hours",
        "GPU-hours delivered over the last 7 days, per team.",
        ["team"],
        [([t.team], t.delivered_gpu_hours) for t in teams],
    )
    gauge(
        "gpuledger_team_level_fs",
        "LevelFS per team (+Inf: no usage in the window).",
        ["team"],
        [([t.team], float("inf") if t.level_fs is None else t.level_fs) for t in teams],
    )
    gauge(
        "gpuledger_projection_lag_events",
        "Events in the log not yet in the projection.",
        [],
        [([], max(0, f.head - f.projection_position))],
    )
    gauge(
        "gpuledger_projection_lag_seconds",
        "Age of the oldest event not yet in the projection (0: caught up).",
        [],
        [([], f.projection_lag_s)],
    )
    if f.relay_lag is not None:
        gauge(
            "gpuledger_relay_lag_events",
            "Events in the log not yet published to Kafka.",
            [],
            [([], f.relay_lag)],
        )
    if f.relay_report_age_s is not None:
        gauge(
            "gpuledger_relay_report_age_seconds",
            "A standby's: seconds since the leader reported the relay lag it tells.",
            [],
            [([], f.relay_report_age_s)],
        )
    if f.relay_checked_s_ago is not None:
        gauge(
            "gpuledger_relay_topic_checked_age_seconds",
            "Seconds since this server's relay last found its topic the one it published to.",
            [],
            [([], f.relay_checked_s_ago)],
        )
    gauge(
        "gpuledger_node_heartbeat_age_seconds",
        "Seconds since each node was last heard from.",
        ["node"],
        [([n], age) for n, age in sorted(f.heartbeat_ages.items())],
    )
    if f.kueue is not None:
        out += kueue_families(f.kueue)
    gauge(
        "gpuledger_unobserved_nodes",
        "Nodes the execution engine cannot observe now: nothing is placed on or preempted from "
        "them until it can (outage mode).",
        [],
        [([], len(f.unobserved))],
    )
    gauge(
        "gpuledger_engine_open",
        "1 when the executor is open; 0 while it waits for its engine to answer (a service "
        "started during a slurmctld outage places nothing until then).",
        [],
        [([], 1.0 if f.engine_open else 0.0)],
    )
    gauge(
        "gpuledger_server_role",
        "1 for this server's role (single: its own store; leader or standby: a shared store).",
        ["role"],
        [([r], 1.0 if r == f.role else 0.0) for r in ROLES],
    )
    gauge("gpuledger_leader_epoch", "The leader's lease epoch (0: no lease).", [], [([], f.epoch)])
    gauge(
        "gpuledger_server_lag_events",
        "Events each server on the shared store is behind the head, as last reported.",
        ["server"],
        [([a], lag) for a, lag in sorted(f.server_lags.items())],
    )
    return out


GPU_RESOURCE = "nvidia.com/gpu"
INADMISSIBLE = frozenset({"HELD", "WAIT_DEPENDENCY", "WAIT_ARRAY_LIMIT", "PARTITION_TIME_LIMIT"})
"""The wait codes of jobs the dispatcher does not consider (Kueue's "inadmissible")."""


def _family(
    kind: Callable[..., Any],
    name: str,
    doc: str,
    labels: list[str],
    rows: Iterable[tuple[Any, ...]],
) -> Metric:
    """Pure: a family of `kind` whose samples are `rows` in order, each its label values then
    its value."""
    fam: Metric = kind(name, doc, labels=labels)
    for *keys, n in sorted(rows):
        fam.add_metric(keys, n)  # type: ignore[attr-defined]
    return fam


def kueue_families(k: KueueFigures) -> list[Metric]:
    """Pure: Kueue's metric names, types and labels for the concepts the ledger shares with it
    (docs/server.md, "Kueue names"): a team is a ClusterQueue, its program the cohort, a GPU
    type the flavor, a job a workload."""
    cq = ["cluster_queue"]
    out: list[Metric] = [
        _family(GaugeMetricFamily, "kueue_pending_workloads", "Pending workloads per "
                "ClusterQueue (team) and status.", [*cq, "status"], k.pending),
        _family(CounterMetricFamily, "kueue_admitted_workloads", "Workloads admitted "
                "(placements) per ClusterQueue over the whole log.", cq, k.admitted),
        _family(GaugeMetricFamily, "kueue_admitted_active_workloads", "Admitted workloads "
                "holding GPUs now per ClusterQueue.", cq, k.active),
        _family(CounterMetricFamily, "kueue_evicted_workloads", "Workloads evicted (preempted) "
                "per ClusterQueue and reason.", [*cq, "reason"], k.evicted),
        _family(CounterMetricFamily, "kueue_preempted_workloads", "Preemptions per preempting "
                "ClusterQueue and reason.", ["preempting_cluster_queue", "reason"], k.preempted),
    ]  # fmt: skip
    g = GaugeMetricFamily("kueue_cluster_queue_resource_usage", "GPUs in use per ClusterQueue "
                          "and flavor (GPU type).", labels=["cohort", *cq, "flavor",
                          "resource"])  # fmt: skip
    for team, flavor, n in sorted(k.usage):
        g.add_metric([team.split("/")[0], team, flavor, GPU_RESOURCE], n)
    out.append(g)
    return out


def kueue_figures(state: Any, queue: list[tuple[str, str]], counts: list[Any]) -> KueueFigures:
    """Pure: the Kueue-named figures from the live state, the queue's (account, code) pairs and
    `reads.team_counts`."""
    pending: dict[tuple[str, str], int] = {}
    for account, code in queue:
        key = (team_of(account), "inadmissible" if code in INADMISSIBLE else "active")
        pending[key] = pending.get(key, 0) + 1
    active: dict[str, int] = {}
    usage: dict[tuple[str, str], int] = {}
    types = {name: n.gpu_type for name, n in state.nodes.items()}
    for job in state.jobs.values():
        if job.status not in ("placed", "running"):
            continue
        team = team_of(job.spec.account)
        active[team] = active.get(team, 0) + 1
        for sl in job.slots:
            key = (team, types.get(sl.node, ""))
            usage[key] = usage.get(key, 0) + len(sl.gpu_indices)
    return KueueFigures(
        pending=[(t, s, n) for (t, s), n in pending.items()],
        admitted=[(t, n) for kind, t, _r, n in counts if kind == "placed"],
        active=list(active.items()),
        evicted=[(t, r, n) for kind, t, r, n in counts if kind == "evicted"],
        preempted=[(t, r, n) for kind, t, r, n in counts if kind == "preempted"],
        usage=[(t, f, n) for (t, f), n in usage.items()],
    )


class LedgerFigures(msgspec.Struct, frozen=True, kw_only=True):
    """The window figures of a scrape, read at one moment: what costs (fair share, usage, the
    7-day report), computed once and reused by the scrapes of the next `ReadCache.fresh_s`."""

    now: float
    teams: list[TeamFigures]


def ledger_figures(handles: Any) -> LedgerFigures:
    """Per-team usage, owed, delivered and LevelFS now (on the worker thread), from the read
    layer: kept and reused for `ReadCache.fresh_s`, however the log moved meanwhile (gauges of
    sums over a 7-day window; `gpuledger_read_at_seconds` names the moment they are of)."""
    from ledger.reads import layer as reads
    from projections.fairshare import UsagePolicy

    clock = handles.now()

    def compute() -> LedgerFigures:
        store = handles.store()
        now = float(math.floor(clock))  # whole seconds: the CLI's `--at` can name it
        usage = UsagePolicy(window_s=WEEK_S)  # as `gpuledger shares` and `usage` by default
        used = {r.name: r.usage_gpu_hours for r in reads.usage(store, now, "account", usage)}
        level = {r.account: r for r in reads.shares(store, now, usage)}
        owed = {t.team: t for t in reads.delivered(store, now - WEEK_S, now, TEAM_DEPTH).teams}
        names = {a for a in level if a.count("/") == TEAM_DEPTH - 1} | set(owed)
        teams = [
            TeamFigures(
                team=name,
                usage_gpu_hours=used.get(name, 0.0),
                owed_gpu_hours=owed[name].owed_gpu_hours if name in owed else 0.0,
                delivered_gpu_hours=owed[name].delivered_gpu_hours if name in owed else 0.0,
                level_fs=level[name].level_fs if name in level else None,
            )
            for name in sorted(names)
        ]
        return LedgerFigures(now=now, teams=teams)

    position = handles.ledger.position
    got: LedgerFigures = handles.cache.recent("metrics-ledger", position, clock, compute)
    return got


class Tallies:
    """The whole log's placement and preemption counts (per team and reason, funded or not,
    per reason), kept between scrapes (on the worker thread): a scrape reads only the
    placements and preemptions recorded since the position the last one read up to, not every
    row again. A projection made again (another store, or one behind) is read whole."""

    def __init__(self) -> None:
        self.store: Any = None
        self.position = 0
        self.teams: dict[tuple[str, str, str], int] = {}
        self.placements: dict[str, int] = {}
        self.preemptions: dict[str, int] = {}

    def _reset(self, store: Any) -> None:
        self.store, self.position = store, 0
        self.teams, self.placements, self.preemptions = {}, {}, {}

    def read(
        self, store: Any, key: Any = None
    ) -> tuple[list[tuple[str, str, str, int]], dict[str, int], dict[str, int]]:
        """`reads.team_counts`, `placement_counts` and `preemption_counts` of `store` (caught
        up) as they stand: the team rows in their order, the others by name. `key`: what
        names the projection when `store` is a new object each time (a read pool's cursor)."""
        from ledger.reads import layer as reads

        at = store.position()
        ident = store if key is None else key
        if ident is not self.store or at < self.position:
            self._reset(ident)
        if at != self.position:
            after = self.position
            for kind, team, reason, n in reads.team_counts(store, TEAM_DEPTH, after):
                key = (kind, team, reason)
                self.teams[key] = self.teams.get(key, 0) + n
            for into, rows in (
                (self.placements, reads.placement_counts(store, after)),
                (self.preemptions, reads.preemption_counts(store, after)),
            ):
                for r in rows:
                    into[r.name] = into.get(r.name, 0) + r.count
            self.position = at
        teams = [(*key, n) for key, n in sorted(self.teams.items())]
        return teams, dict(sorted(self.placements.items())), dict(sorted(self.preemptions.items()))


def service_figures(service: Any, ha: Any, view: Any) -> dict[str, Any]:
    """On the event loop, never the worker thread (as health reads them): what a scrape reads
    of the service beside the view of the live state (`copied.Copy`) it reads (the relay's lag,
    the cycles, the engine, the nodes heard from, the roles), at the view's moment; the
    projection's lag is the read's (`read_figures`)."""
    head = view.ledger.position
    clock = view.moment
    relay = service.relay_position()  # None too while not known to be the topic's (atk58 F4)
    told = _leaders_relay_lag(ha, head) if service.relay_state()[0] is None else None
    return {
        "cycles": service.stats.cycles,
        "relay_lag": None if relay is None else max(0, head - relay),
        # a stale word drops the age too: a kept scrape replaced only these keys, and its age
        # stayed frozen beside no lag (atk55-25 F5)
        "relay_report_age_s": None,
        **(told or {}),
        "relay_checked_s_ago": service.relay_checked_s_ago(),
        "heartbeat_ages": {
            node: max(0.0, clock - at) for node, at in service.executor.heard_from().items()
        },
        "unobserved": _unobserved(service),
        "engine_open": service.stats.engine_away is None,
        **_roles(ha, head),
    }


def _leaders_relay_lag(ha: Any, head: int) -> dict[str, Any] | None:
    """A standby's relay figures: the leader's relay's lag against this server's log, as the
    leader last reported its position, and the report's age; None while the word is stale (a
    dead or paused leader's: `ha.relay_word_s`, as health tells it) or there is none. A standby's
    /metrics had no relay lag at all (stop 54: open)."""
    got = None if ha is None else ha.leader_relay()
    if got is None or got[1] > ha.relay_word_s:
        return None
    word, ago = got
    if word.position is None:  # the leader's relay knows no position on its topic (atk58 F4)
        return None
    return {"relay_lag": max(0, head - word.position), "relay_report_age_s": round(ago, 3)}


def projection_lag_s(view: Any, projected: int) -> float:
    """How long ago the oldest event the projection (at `projected`, as the read sees it)
    lacks of the view's was appended: 0 once it holds the view's position; else since the
    first event the service's own projection lacked when the view was published (the
    oldest the read may lack)."""
    if projected >= view.ledger.position or view.unprojected is None:
        return 0.0
    return max(0.0, float(view.moment) - float(view.unprojected[1]))


def read_figures(handles: Any, tallies: Tallies | None, taken: dict[str, Any]) -> Figures:
    """The ledger's figures now, all from the read layer, read in the read pool on the view of
    the live state (`handles.copy`: `ledger.server.copied`); `tallies`: the server's
    whole-log counts kept between scrapes (None: counted afresh). `taken`: `service_figures`
    (the server's `Leadership` on a shared store adds its role, the epoch and every server's
    lag)."""
    from ledger.reads import preview as previews

    ledger = handles.ledger
    store = handles.store()
    head = ledger.position
    projected = store.position()
    window = ledger_figures(handles)
    # the dispatcher's preview shared with the pages, kept per log position
    snapshot, decision = handles.live_preview().live
    by_code: dict[str, int] = {}
    by_team: dict[str, int] = {}
    queue = previews.queue_codes(ledger.state, snapshot, decision, handles.longest_s())
    for account, code in queue:
        by_code[code] = by_code.get(code, 0) + 1
        by_team[team_of(account)] = by_team.get(team_of(account), 0) + 1
    # whole-log counts: those of the last scrape plus the placements and preemptions since
    # (exact: what a group-by over every interval and preemption gives at this position)
    counts, placements, preemptions = (tallies or Tallies()).read(store, "projection")
    return Figures(
        now=window.now,
        head=head,
        projection_position=projected,
        projection_lag_s=projection_lag_s(handles.copy, projected),
        queue_by_code=by_code,
        queue_by_team=by_team,
        placements=placements,
        preemptions=preemptions,
        teams=window.teams,
        kueue=kueue_figures(ledger.state, queue, counts),
        **taken,
    )


def _roles(ha: Any, head: int) -> dict[str, Any]:
    """The role figures of `ha` (None: a server alone on its store)."""
    if ha is None:
        return {}
    return {
        "role": ha.role,
        "epoch": ha.epoch,
        "server_lags": {s.address: s.lag for s in ha.servers(head)},
    }


def _unobserved(service: Any) -> tuple[str, ...]:
    """The nodes the service's engine could not observe at its last cycle."""
    dispatcher = getattr(service, "dispatcher", None)
    return tuple(sorted(getattr(dispatcher, "unobserved", ())))


class _Reading(Collector):
    """Yields the families of the reading the scrape handler just took."""

    def __init__(self) -> None:
        self.figures: Figures | None = None

    def collect(self) -> Iterator[Metric]:
        if self.figures is not None:
            yield from families(self.figures)


class Metrics:
    """The registry of one application: histograms fed as things happen, and the reading."""

    def __init__(self, status_of: Callable[[BaseException], int]) -> None:
        # no `_created` series: the counters here are totals of the whole log
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=False)
        self.cycle = Histogram(
            "gpuledger_cycle_seconds",
            "Dispatcher cycle latency.",
            buckets=CYCLE_BUCKETS,
            registry=self.registry,
        )
        self.api = Histogram(
            "gpuledger_api_request_seconds",
            "API latency by route, method and status.",
            ["route", "method", "status"],
            buckets=API_BUCKETS,
            registry=self.registry,
        )
        self._api_children: dict[tuple[str, str, int], Any] = {}
        self.reading = _Reading()
        self.tallies = Tallies()
        self.registry.register(self.reading)
        self.status_of = status_of
        self.scraped_at: float | None = None
        """When the last scrape came: only while something scrapes are the window figures
        computed ahead."""

    def warm(self, handles: Any, worker: Any, pool: Any) -> None:
        """Have the window figures computed ahead of the next scrape, in the read pool on the
        published view (the worker calls it when idle and only hands it on: `copied.ahead`),
        while something scrapes (one in the last 10 minutes)."""
        from ledger.server import copied

        if self.scraped_at is None or time.monotonic() - self.scraped_at > 600:
            return
        view = worker.view
        if view is None or handles.cache.holds("metrics-ledger", view.ledger.position):
            return
        copied.ahead(worker, pool, handles.cache, ledger_figures)

    def observe_cycle(self, seconds: float) -> None:
        self.cycle.observe(seconds)

    def render(self, figures: Figures) -> bytes:
        self.reading.figures = figures
        try:
            return generate_latest(self.registry)
        finally:
            self.reading.figures = None

    content_type = CONTENT_TYPE_PLAIN_0_0_4
    """The classic text format's type, which every Prometheus and agent reads (docs/server.md)."""

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """ASGI middleware timing every routed HTTP request (route template, not the path)."""

        async def timed(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return
            status = [500]

            async def sending(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status[0] = int(message["status"])
                await send(message)

            t0 = time.perf_counter()
            try:
                await app(scope, receive, sending)
            except BaseException as err:
                status[0] = self.status_of(err)
                raise
            finally:
                route = str(scope.get("path_template") or "unmatched")
                # a HEAD served as its GET is counted as HEAD (`encoding.HEAD`; atk49-29 F7)
                method = "HEAD" if scope.get("gpuledger.head") else str(scope.get("method", ""))
                self.observe_api(route, method, status[0], time.perf_counter() - t0)

        return timed

    def observe_api(self, route: str, method: str, status: int, seconds: float) -> None:
        """One request's latency, by route template, method and status."""
        key = (route, method, status)
        child = self._api_children.get(key)
        if child is None:  # the labelled child, looked up once (a few us a request)
            child = self._api_children[key] = self.api.labels(route, method, str(status))
        child.observe(seconds)


class PoolCounts(Collector):
    """The read pool's counts: reads refused 429, the calls a read still makes on the worker
    thread (`ReadPool.worker_call`: none once a view is published) and their time, the
    projector thread's time catching the projection up for reads, and every call the worker
    thread ran (`Worker.calls`: batches, agents' reports, reads) and its time."""

    def __init__(self, pool: Any, worker: Any = None) -> None:
        self.pool = pool
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        p = self.pool
        yield CounterMetricFamily(
            "gpuledger_reads_refused", "Reads and queries refused 429 (a caller past its share).",
            value=p.refused,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "gpuledger_reads_under_way",
            "Reads and queries admitted whose answers are not yet sent, everyone's.",
            value=p.under_way,
        )
        yield CounterMetricFamily(
            "gpuledger_worker_reads", "Reads run on the worker thread.", value=p.worker_reads
        )
        yield CounterMetricFamily(
            "gpuledger_worker_read_seconds", "Time the worker thread spent on reads.",
            value=p.worker_read_s,
        )  # fmt: skip
        yield CounterMetricFamily(
            "gpuledger_read_catch_up_seconds",
            "Time the read pool's projector thread (never the worker) spent catching the "
            "projection up for reads (each followed by a rest 3x its time).",
            value=p.catch_up_s,
        )
        lanes = p.lanes() if hasattr(p, "lanes") else {}
        ran = CounterMetricFamily(
            "gpuledger_read_lane_reads", "Reads run in each lane of the read pool.",
            labels=["lane"],
        )  # fmt: skip
        waited = CounterMetricFamily(
            "gpuledger_read_lane_wait_seconds",
            "Time those reads waited for their turn: a thread of the lane, their reader's rest.",
            labels=["lane"],
        )
        for name, lane in sorted(lanes.items()):
            ran.add_metric([name], lane.reads)
            waited.add_metric([name], lane.waited_s)
        yield ran
        yield waited
        w = self.worker
        yield CounterMetricFamily(
            "gpuledger_worker_calls",
            "Calls run on the worker thread (batches, agents' reports, reads' calls).",
            value=getattr(w, "calls", 0),
        )
        yield CounterMetricFamily(
            "gpuledger_worker_call_seconds", "Time the worker thread spent on those calls.",
            value=getattr(w, "call_s", 0.0),
        )  # fmt: skip


class ConnectionCounts(Collector):
    """The connections' limits at work (`ledger.server.connections`, docs/security.md row T23):
    open now, refused (the server's cap, a caller's cap) and dropped (a stalled send, a request
    that never came)."""

    def __init__(self, connections: Any) -> None:
        self.connections = connections

    def collect(self) -> Iterator[Metric]:
        c = self.connections
        yield GaugeMetricFamily(
            "gpuledger_connections_open", "Client connections open now.", value=c.open
        )
        refused = CounterMetricFamily(
            "gpuledger_connections_refused",
            "Connections and requests refused: the server's cap (503), the caller's, a source's"
            " connections or requests without a token (429), a request's head before it is"
            " parsed (headers: 431; length: 411, 400).",
            labels=["reason"],
        )
        refused.add_metric(["server_full"], c.counts.refused_full)
        refused.add_metric(["per_person"], c.counts.refused_person)
        refused.add_metric(["per_address"], c.counts.refused_address)
        refused.add_metric(["anonymous_rate"], c.counts.refused_anonymous)
        refused.add_metric(["account_rate"], c.counts.refused_account)
        for reason, n in c.counts.refused_head.items():  # before the parser: 431, 411, 400
            refused.add_metric([reason], n)
        yield refused
        by = CounterMetricFamily(
            "gpuledger_connections_anonymous_refused",
            "Requests without a valid token refused (429), by the bucket that refused them.",
            labels=["bucket"],
        )
        buckets = ("address", "prefix", "everyone")
        for bucket, n in zip(buckets, c.counts.refused_anonymous_by, strict=True):
            by.add_metric([bucket], n)
        yield by
        yield CounterMetricFamily(
            "gpuledger_connections_anonymous_delayed",
            "Requests without a valid token that waited their turn (the source's rate).",
            value=c.counts.delayed_anonymous,
        )
        yield CounterMetricFamily(
            "gpuledger_connections_account_delayed",
            "Requests with a valid token that waited their account's turn.",
            value=c.counts.delayed_account,
        )
        dropped = CounterMetricFamily(
            "gpuledger_connections_dropped",
            "Connections aborted: a send that stalled, a request whose headers or body never came.",
            labels=["reason"],
        )
        dropped.add_metric(["send_stalled"], c.counts.dropped_stalled)
        dropped.add_metric(["no_request"], c.counts.dropped_no_request)
        dropped.add_metric(["no_body"], c.counts.dropped_no_body)
        yield dropped


def route(
    metrics: Metrics, worker: Any, handles: Any, person: Callable[[Any], Any], pool: Any
) -> HTTPRouteHandler:
    """`GET /metrics` for the callers the reads accept, admitted as one of the caller's reads
    (a scrape every few seconds is far below a person's 1,200 a minute): the service's own
    figures read on the event loop, the rest from the view of the live state the worker
    published, in the read pool (`ledger.server.copied`). The costly figures are kept between
    scrapes (`ReadCache`, `Tallies`): a scrape is the shared preview, a window figure
    computed at most every 2 s, and the placements and preemptions since the last scrape; and
    what a scrape reads of the ledger is kept per log position like the pages' answers (a
    scrape "now" at a position read less than `ReadCache.fresh_s` ago is that answer, with the
    service's own figures of the moment): such a scrape computes nothing and takes no turn in
    the read pool, so it never waits out its reader's rest there (issue 29: a warm scrape of
    the page benchmark waited 0.3-1.3 s for 0.03 s of work)."""
    from ledger.server import copied

    def read(h: Any) -> tuple[Figures, bool, Any]:  # in the read pool
        return read_figures(h, metrics.tallies, h.copy.extra), h.current(), h.basis()

    @get("/metrics", include_in_schema=False)
    async def scrape(request: Request[Any, Any, Any]) -> Response[bytes]:
        caller = person(request)
        metrics.scraped_at = time.monotonic()
        with pool.admitted(caller.actor, read=True):  # a kept answer is a read too
            view = await copied.view(worker, pool)
            kept = handles.cache.get("metrics", None, view.ledger.position, view.moment)
        if kept is not None:  # the ledger's figures at this position: the service's now
            taken = service_figures(worker.service, worker.ha, view)
            figures = msgspec.structs.replace(msgspec.msgpack.decode(kept, type=Figures), **taken)
        else:
            figures, current, basis = await copied.read(
                worker, pool, caller.actor, "the metrics scrape", read, cache=handles.cache,
                extra=lambda view: service_figures(worker.service, worker.ha, view),
            )  # fmt: skip
            if current:  # kept per position like the pages (`ReadCache`)
                data = msgspec.msgpack.encode(figures)
                handles.cache.put("metrics", None, figures.head, view.moment, data, basis=basis)
        # Litestar adds the charset of a text/* type itself: the exposition format's type bare
        bare = metrics.content_type.replace("; charset=utf-8", "")
        return Response(metrics.render(figures), media_type=bare)

    return scrape
