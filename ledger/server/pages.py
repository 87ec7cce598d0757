"""The dashboard: read-only pages under /ui and the JSON they call under /ui/api.

The pages are static files of this package (`ledger/server/web/`: HTML, hand-written JS and
CSS; no build step, nothing from a CDN). A page holds no data: its script asks /ui/api/* with the
bearer token the login page kept in the browser's storage, so the same identity rules as the
API hold, enforced here, not in the page:

- every signed-in person (not node or job tokens) sees the queue, the teams, nodes, decisions
  and a job's timeline;
- a job's command, labels and logs only its owner, the managers of an account above it and
  admins (`reads.may_see_private`, the one rule `jobs` and `log` follow too).

Every figure comes from the read layer (`ledger.reads.layer`), as the CLI's.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple, get_args

import msgspec
from litestar import HttpMethod, Request, Response, get, route
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Redirect

from ledger.core.jobs import BlockCode
from ledger.dispatch.waits import WaitCode
from ledger.server import connections, copied, encoding, pooled
from ledger.server.fairlane import FairSlot
from projections import history
from schemas import views as v
from schemas.errors import InvalidCommand, Unavailable
from schemas.events import FinishReason

if TYPE_CHECKING:
    from ledger.server.readpool import ReadPool
    from ledger.server.worker import Worker

log = logging.getLogger("gpuledger.server")
PAGES = (
    "login",
    "teams",
    "queue",
    "finished",
    "job",
    "nodes",
    "decisions",
    "preemptions",
    "budget",
)
ASSETS = {
    **{
        f"{name}.js": "application/javascript"
        for name in ("times", "base", "charts", "jobs", "views", "budget", "app")
    },
    "app.css": "text/css",
}
"""The files `/ui/static/` serves (the page's shell is served by its route), their types."""
WEEK_S = 7 * 86400.0
REPLAY_LAST = 8
EVERY_ACCOUNT = "*"
"""The preemptions page's "every team" (no account name has a `*`; `all` is a name one may open)."""
PAGE_MAX = 1000
"""The most rows one page of a dashboard table answers (the queue, the decisions, the
preemptions): past it, one 400 line from the query gate (`ledger.server.query`); a client
wanting more pages (`offset`, or `before` for the decisions)."""
Offset = Annotated[int, QueryParameter(ge=0, le=10**9)]
Size = Annotated[int, QueryParameter(ge=1, le=PAGE_MAX)]
Position = Annotated[int, msgspec.Meta(ge=1, le=2**62)]
"""The job page replays at most this many of the decisions it lists (the newest)."""


class TeamsView(msgspec.Struct, frozen=True, kw_only=True):
    window: Literal["7d", "all"]
    at: float
    """The moment read (whole seconds): the shares as of it, delivered up to it."""
    shares: list[v.ShareRow]
    delivered: v.DeliveredView
    series: v.DeliveredSeriesView


class QueueEntry(msgspec.Struct, frozen=True, kw_only=True):
    row: v.QueueRow
    parts: list[v.KeyPart]
    name: str = ""
    """The job's name (`submit -J`; public, as in squeue): no page showed it (atk61-29a F7)."""


def job_name(state: Any, job_id: int) -> str:
    """Pure: a queue row's job's name in the live state ("" when its job is gone from it: a
    stopped run, `State.stopped_of`, keeps its own)."""
    job = state.jobs.get(job_id)
    if job is not None:
        return str(job.spec.job_name)
    return next((str(r.job_name) for r in state.stopped_of(job_id) if r.job_name), "")


class QueuePageView(msgspec.Struct, frozen=True, kw_only=True):
    total: int
    """Every job passing the filters, not only this page's (what `queue --json` lists)."""
    offset: int
    limit: int
    codes: dict[str, int]
    """The jobs passing the user, account and state filters, by code (the reason filter's
    choices)."""
    at: float
    """The moment the preview was made at."""
    rows: list[QueueEntry]


class FinishedPageView(msgspec.Struct, frozen=True, kw_only=True):
    total: int
    """Every finished job passing the filters, not only this page's."""
    offset: int
    limit: int
    rows: list[v.JobRow]
    """Newest first; another person's job without its command, directory and logs
    (`redacted`: the rule of `jobs`)."""


class PreemptionsView(msgspec.Struct, frozen=True, kw_only=True):
    managed: list[str]
    """The accounts the caller manages (the page's default: the first one's subtree)."""
    report: v.PreemptionReportView
    """What `report preemptions -A ACCOUNT --since START --at END` gives, its counts and sums
    over every row, its `rows` this page's (`offset`, at most `limit`)."""
    total: int = 0
    """The rows of the whole report, not only this page's."""
    offset: int = 0
    limit: int = 0


class DecisionsPageView(msgspec.Struct, frozen=True, kw_only=True):
    total: int
    """The recorded cycles in the window (`since`, `until`), not only this page's."""
    limit: int
    before: int | None
    """The page holds the cycles before this position (None: the newest)."""
    rows: list[v.DecisionRow]
    """Newest first: the next page is `before` the last one's position."""


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    job: v.JobRow
    private: bool
    """True: the command and logs are shown; false: the caller may not see them."""
    labels: dict[str, str]
    explain: v.ExplainView
    decisions: list[v.DecisionRow]


class NodesView(msgspec.Struct, frozen=True, kw_only=True):
    nodes: list[v.NodeRow]
    gpus: list[v.GpuRow]
    squatters: list[v.SquatterRow]
    squat_util_pct: float = 10.0
    """The service's squatting rule (its recorded policy's settings): GPUs below this..."""
    squat_after_s: float = 3600.0
    """...for this long, past the contract."""


def squat_settings(policy: Any) -> tuple[float, float]:
    """The utilisation threshold (%) and idle time (s) of `policy`'s squatting rule (the
    defaults for a policy without one)."""
    from ledger.core.utilisation import squat_after, squat_threshold

    return squat_threshold(policy), squat_after(policy)


class DecisionView(msgspec.Struct, frozen=True, kw_only=True):
    row: v.DecisionRow
    record: Any
    """The `CycleDecided` event: its inputs by reference and its outcome."""


class LivePreview(NamedTuple):
    """The dispatcher's preview at one log position and moment, shared by the queue and job
    pages and /metrics (computed once per position, reused for `ReadCache.fresh_s`)."""

    policy_version: str
    live: Any
    """`previews.live(...)`: the snapshot and the decision."""
    now: float
    """The moment it was computed at."""
    held: Any = None
    """`previews.held_back(...)` of the same state and snapshot: the jobs a dependency or an
    array's limit holds and their keys, found once per position for every queue page (they
    were found, and every one's row and estimate built, on every page: atk50-29 F9)."""
    starts: Any = None
    """`KeptStarts` of the same preview: the whole queue's estimated starts, once."""
    carried: Any = None
    """The policy config it was made under and what it hands the next preview at a later
    position (`previews.live_carried`): the snapshot and the fair-share order are made from
    it, only the jobs that changed since looked at again."""


class KeptStarts:
    """The whole queue's estimated starts at one preview, computed once for every queue page
    that needs them (`previews.queue_page`'s `kept`), as work shared by every reader
    (`fairlane.shared_work`: charged to nobody). Each page showing a held-back job computed
    them again: 0.1-0.3 s of CPU at 1M events (atk51-29 F5)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._got: Any = None

    def __call__(self, compute: Callable[[], Any]) -> Any:
        from ledger.server.fairlane import shared_work

        with shared_work(), self._lock:
            if self._got is None:
                self._got = compute()
            return self._got


class Kit(NamedTuple):
    """What the page routes share (`routes` makes it; `budget_pages.routes` takes it)."""

    worker: Worker
    handles: Any
    person: Callable[[Any], Any]
    """The caller of a request (`identity`), refused when there is none."""
    pool: ReadPool
    kept: Callable[..., Awaitable[Response[bytes]]]
    """An answer kept per log position, computed in the read pool (`routes`' `kept`)."""
    caught_up: Callable[[], Awaitable[None]]
    """The projection caught up to the log's position now, beside the worker."""
    stopping: Callable[[], bool]
    """Whether the server is stopping."""


def live_preview(handles: Any) -> LivePreview:
    """The shared preview "now" (of the published view: `copied.CopiedHandles`)."""
    preview: LivePreview = handles.live_preview()
    return preview


def bucket_for(span_s: float, points: int = 48) -> float:
    """Pure: a bucket of whole hours giving about `points` buckets over `span_s`."""
    return max(1, math.ceil(span_s / points / 3600)) * 3600.0


def json_response(value: Any) -> Response[bytes]:
    """`value` as a JSON answer."""
    return Response(msgspec.json.encode(value), media_type="application/json")


QUEUE_CODES = ("NEXT_CYCLE", *get_args(WaitCode), *get_args(BlockCode), "HELD", "PLACED",
               "RUNNING", "STOPPING")  # fmt: skip
"""The codes a queue row carries (`v.QueueRow.code`): what `reason=` may name."""


def routes(worker: Worker, handles: Any, person: Callable[[Any], Any], pool: ReadPool) -> list[Any]:
    """The page routes, the static files and the JSON endpoints of the dashboard (the job's
    decisions to replay are found in `pool`, off the worker thread)."""
    from ledger.dispatch import registry
    from ledger.reads import explain_job, hours
    from ledger.reads import layer as reads
    from ledger.reads import preview as previews
    from ledger.server import budget_pages, children

    def stopping() -> bool:
        return not worker.accepting

    web_dir = resources.files("ledger.server") / "web"
    shell = (web_dir / "page.html").read_text(encoding="utf-8")

    @route("/", http_method=[HttpMethod.GET, HttpMethod.HEAD], include_in_schema=False)
    async def root() -> Redirect:
        # HEAD too: a probe that asks HEAD / sees the same redirect as a browser
        return Redirect(path="/ui/teams")

    @get("/ui/{page:str}", include_in_schema=False)
    async def page(page: FromPath[str]) -> Response[str]:
        if page not in PAGES:
            return Response("no such page\n", status_code=404, media_type="text/plain")
        return Response(shell.replace("{{page}}", page), media_type="text/html")

    assets = {name: (web_dir / name).read_bytes() for name in ASSETS}
    tags = {
        name: '"' + hashlib.sha256(data).hexdigest()[:32] + '"' for name, data in assets.items()
    }

    @get("/ui/static/{name:str}", include_in_schema=False)
    async def static(request: Request[Any, Any, Any], name: FromPath[str]) -> Response[bytes]:
        """The pages' assets, and nothing else of the package: a directory router served its
        `__init__.py` and `__pycache__`, and answered `/ui/static/%00` 500 (atk49-29 F8). Each
        has a strong ETag of its bytes (the gzip'd answer's is suffixed `-gzip` on the way out,
        `ledger.server.encoding`: atk49-29 F9) and is revalidated (`no-cache`): an
        `If-None-Match` naming either is answered 304 without the body."""
        if name not in assets:
            return Response(b"no such file\n", status_code=404, media_type="text/plain")
        tag = tags[name]
        asked = request.headers.get("if-none-match", "")
        given = {t.strip().removeprefix("W/") for t in asked.split(",")}
        headers = {"etag": tag, "cache-control": "no-cache"}
        if "*" in given or tag in given or encoding.gzip_tag(tag) in given:
            if encoding.gzip_tag(tag) in given:
                headers["etag"] = encoding.gzip_tag(tag)
            return Response(b"", status_code=304, headers=headers)
        return Response(assets[name], media_type=ASSETS[name], headers=headers)

    def caught_up() -> Awaitable[None]:
        """The projection caught up to the log's position now, beside the worker (T5)."""
        return copied.caught_up(worker, pool, int(worker.service.ledger.position))

    async def kept(
        caller: Any,
        name: str,
        key: Any,
        fn: Callable[[Any], Any],
        *,
        live: bool = True,
    ) -> Response[bytes]:
        """`fn(handles)`'s answer encoded, kept per log position like the /v1 reads
        (`ReadCache`; `name` is the read whose freshness rule it follows), admitted as one of
        `caller`'s reads, computed in the read pool on the view of the live state the worker
        published (`ledger.server.copied`: the worker asked nothing; T5); `live=False`: on the
        projection alone, the worker asked nothing (`copied.projected_read`)."""
        cache = handles.cache
        with pool.admitted(caller.actor, read=True):  # a kept answer is a read too
            got = cache.get(name, key, handles.ledger.position, handles.now())
        if got is not None:
            return Response(got, media_type="application/json")

        def run(h: Any) -> tuple[int, float, bytes, bool, Any]:
            data = msgspec.json.encode(fn(h))
            basis = h.basis() if isinstance(h, copied.CopiedHandles) else None  # the preview's
            return h.ledger.position, h.now(), data, h.current(), basis

        what = f"the {name} page"
        if live:
            handles.asked["live-preview"] = time.monotonic()  # computed ahead when idle
            got_live = copied.read(worker, pool, caller.actor, what, run, cache=cache)
        else:
            got_live = copied.projected_read(
                worker, pool, caller.actor, what, run, moment=handles.now()
            )
        position, now, data, current, basis = await got_live
        if current:  # an answer read from the shared preview lives as long as it (`ReadCache`)
            cache.put(name, key, position, now, data, basis=basis)
        return Response(data, media_type="application/json")

    @get("/ui/api/teams", include_in_schema=False)
    async def teams(
        request: Request[Any, Any, Any], window: FromQuery[Literal["7d", "all"]] = "7d"
    ) -> Response[bytes]:
        caller = person(request)

        def read(h: Any) -> TeamsView:  # in the read pool, on the projection alone
            from projections.fairshare import UsagePolicy

            store = h.store()
            at = float(math.floor(h.now()))  # whole seconds: `--at` of the CLI says it
            start = at - WEEK_S
            if window == "all":  # from the log's first hour (the hours the projection keeps)
                first = store.con.execute(
                    "SELECT from_at FROM team_hours_span WHERE depth = 2"
                ).fetchall()
                start = min(first[0][0], start) if first else start
            bucket = bucket_for(at - start)
            # the whole period: the ended hours the projection keeps summed, and the hours
            # since the latest event (`projections.kept`), whatever the history's length
            # buckets on whole hours from `start`'s hour (atk50-29 F6: from `start` itself, the
            # first held 4 hours and the clipped one, the last 3 and the current part); the
            # chart scales each by the part of the window it covers (charts.js `teamChart`)
            delivered, series = hours.bucketed_series(
                store, start, at, 2, bucket, kept=window == "all", origin=start // 3600 * 3600
            )
            return TeamsView(
                window=window,
                at=at,
                shares=reads.shares(store, at, UsagePolicy(window_s=WEEK_S)),
                delivered=delivered,
                series=series,
            )

        return await kept(caller, "shares", ("ui.teams", window), read, live=False)

    @get("/ui/api/queue", include_in_schema=False)
    async def queue(
        request: Request[Any, Any, Any],
        user: FromQuery[str | None] = None,
        account: FromQuery[str | None] = None,
        job_state: Annotated[
            Literal["pending", "held", "running", "queued", "all"], QueryParameter(name="state")
        ] = "queued",
        reason: FromQuery[str | None] = None,
        sort: FromQuery[str] = "order",
        descending: FromQuery[bool] = False,
        offset: Offset = 0,
        limit: Size = 100,
    ) -> Response[bytes]:
        """One page of the queue (server-side paging, sorting and filtering) and its true
        total: the rows `queue` gives, in the same order when sorted by `order`."""
        caller = person(request)
        filt = v.QueueFilter(user=user or None, account=account or None, state=job_state,
                             limit=limit)  # fmt: skip
        code = reason or None

        def read(h: Any) -> QueuePageView:
            # refused before the position's shared preview is waited for (atk52-29 F5: a
            # misspelt sort took 4-12 s for its 400, an unknown code gave an empty page)
            if sort not in previews.QUEUE_SORTS:
                raise InvalidCommand(f"no such column to sort by: {sort!r}", param="sort",
                                     hint=", ".join(previews.QUEUE_SORTS))  # fmt: skip
            if code is not None and code not in QUEUE_CODES:
                raise InvalidCommand(f"no such wait code: {code!r}", hint=", ".join(QUEUE_CODES),
                                     param="reason")  # fmt: skip
            previews.known_account(h.ledger.state, filt.account)
            got = live_preview(h)
            policy = registry.build(h.ledger.state.policy)
            page = previews.queue_page(
                h.ledger, h.store(), policy, got.now, filt, code=code, sort=sort,
                descending=descending, offset=offset, preview=got.live, held=got.held,
                kept=got.starts, longest_s=h.longest_s(),
            )  # fmt: skip
            return QueuePageView(
                total=page.total,
                offset=offset,
                limit=limit,
                codes=page.codes,
                at=got.now,
                rows=[
                    QueueEntry(
                        row=r,
                        parts=previews.key_parts(got.policy_version, r.sort_key),
                        name=job_name(h.ledger.state, r.job_id),
                    )
                    for r in page.rows
                ],
            )

        key = ("ui.queue", filt, code, sort, descending, offset)
        return await kept(caller, "queue", key, read)

    @get("/ui/api/finished", include_in_schema=False)
    async def finished(
        request: Request[Any, Any, Any],
        user: FromQuery[str | None] = None,
        account: FromQuery[str | None] = None,
        reason: FromQuery[FinishReason | None] = None,
        offset: Offset = 0,
        limit: Size = 100,
    ) -> Response[bytes]:
        """One page of the finished jobs (newest first, like `sacct`: `user`, `account` and
        below, `reason` the finish reason) and their true total, read from the projection in
        the read pool (admitted, time-limited: T5); what only the owner, the managers above
        and admins see is left out of the others' jobs, as `jobs` does."""
        caller = person(request)
        f = v.JobFilter(user=user or None, account=account or None, limit=limit)

        def read(h: copied.CopiedHandles) -> bytes:  # in the read pool
            viewer = reads.Viewer(caller.actor, h.ledger.state)
            total, rows = reads.finished_jobs(h.store(), f, viewer, reason=reason, offset=offset)
            kept, cut = pooled.bounded_rows([msgspec.json.encode(r) for r in rows])
            rows = rows[: len(kept)]  # at most MAX_PAGE_BYTES: `limit` then says how many
            page = FinishedPageView(total=total, offset=offset, limit=len(rows) if cut else limit,
                                    rows=rows)  # fmt: skip
            return msgspec.json.encode(page)

        data = await copied.read(worker, pool, caller.actor, "the finished jobs page", read)
        return Response(data, media_type="application/json")

    @get("/ui/api/job/{job_id:int}", include_in_schema=False)
    async def job(request: Request[Any, Any, Any], job_id: FromPath[int]) -> Response[bytes]:
        """The job's page: what the live state says of it (its wait, its place in the queue:
        the shared preview) taken on the worker thread; its row, its history told and its
        decisions read from the projection in the read pool (a cursor of its own, the time
        limit, the per-person admission), kept per position like the /v1 reads."""
        caller = person(request)
        key = ("ui.job", job_id, caller.actor)
        with pool.admitted(caller.actor, read=True):  # a kept answer is a read too
            got = handles.cache.get("explain", key, handles.ledger.position, handles.now())
        if got is not None:
            return Response(got, media_type="application/json")

        def read(h: copied.CopiedHandles) -> tuple[int, float, bytes, bool, Any]:  # in the pool
            ledger, store = h.ledger, h.store()
            known = ledger.state.jobs.get(job_id)
            # only a pending job's explanation looks at the queue: the shared preview then
            preview = None
            if known is not None and known.status == "pending" and not known.held:
                preview = live_preview(h)
            now = h.now() if preview is None else preview.now
            current = None
            if known is not None:
                policy = registry.build(ledger.state.policy)
                current = explain_job.explain_now(
                    ledger, store, known, policy, now, None if preview is None else preview.live,
                    h.longest_s(),
                )  # fmt: skip
            viewer = reads.Viewer(caller.actor, ledger.state)
            row = reads.job(store, job_id, now, viewer)
            private = not row.redacted
            labels = dict(known.spec.labels) if known is not None and private else {}
            explain = explain_job.explain_told(store, job_id, known, current, now, viewer)
            view = JobView(job=row, private=private, labels=labels, explain=explain,
                           decisions=reads.decisions(store, limit=200, job_id=job_id))  # fmt: skip
            return ledger.position, now, msgspec.json.encode(view), h.current(), h.basis()

        handles.asked["live-preview"] = time.monotonic()  # computed ahead when idle
        position, now, data, current, basis = await copied.read(
            worker, pool, caller.actor, "the job page", read, cache=handles.cache
        )
        if current:
            handles.cache.put("explain", key, position, now, data, basis=basis)
        return Response(data, media_type="application/json")

    replaying = FairSlot("a replay", per_person=16, max_waiting=64)
    """One replay at a time, the people waiting in turn (one person's looped replays queued in
    front of another's: atk44-25 F3)."""
    replays: dict[int, Any] = {}
    """Decision position -> its replay: a recorded decision's replay never changes."""

    @get("/ui/api/job/{job_id:int}/replay", include_in_schema=False)
    async def job_replay(request: Request[Any, Any, Any], job_id: FromPath[int]) -> Response[bytes]:
        """The job's latest recorded decisions the page lists (those that placed or preempted
        it) replayed from the log alone: a pending job's, none (atk50-29 F4). They are found
        in the projection (`history.listed_decisions`, in the read pool), not by walking the
        log; each is replayed once (kept by position), in a child process at a lower priority
        (`ledger.server.replays`: the walk never holds the server's interpreter lock), one
        replay at a time."""
        caller = person(request)
        home = handles.ledger.home
        # one of its person's reads until its decisions are found, not while its replay waits
        # its turn of the slot (bounded on its own) or runs (atk51-29 F2)
        with connections.apart(), pool.admitted(caller.actor, read=True):
            await caught_up()  # the projection caught up, beside the worker
            found = await pool.compute(
                lambda con, _limits: history.listed_decisions(con, job_id, REPLAY_LAST)
            )
        pool.charge_answer(caller.actor)

        async def replayed() -> None:
            todo = [(p, d) for p, d in found if p not in replays]
            if todo:
                from ledger.server import replays as child

                done = await child.replay(home, todo)
                for (p, _d), r in zip(todo, done, strict=True):
                    replays[p] = r
                while len(replays) > 4 * 1024:  # the oldest kept first
                    del replays[next(iter(replays))]

        if found:  # the wait for its turn attended too: a client gone while it waits frees it
            await children.attended_turn(
                request.receive, stopping, replaying, caller.actor, replayed, "replay"
            )
        return json_response(
            [
                {"position": p, "identical": replays[p].identical, "replay": replays[p]}
                for p, _d in found
                if p in replays
            ]
        )

    @get("/ui/api/nodes", include_in_schema=False)
    async def nodes(request: Request[Any, Any, Any]) -> Response[bytes]:
        caller = person(request)

        def read(h: Any) -> NodesView:
            ledger = h.ledger
            store = h.store()
            threshold, idle_s = squat_settings(registry.build(ledger.state.policy))
            return NodesView(
                nodes=reads.node_list(ledger.state, h.foreign(), h.stopping(), h.now()),
                gpus=reads.gpu_map(ledger, store),
                squatters=reads.squatters(ledger, store, h.now(), threshold, idle_s),
                squat_util_pct=threshold,
                squat_after_s=idle_s,
            )

        return await kept(caller, "squatters", ("ui.nodes",), read)

    @get("/ui/api/decisions", include_in_schema=False)
    async def decisions(
        request: Request[Any, Any, Any],
        since: Annotated[v.Epoch | None, QueryParameter()] = None,
        until: Annotated[v.Epoch | None, QueryParameter()] = None,
        limit: Size = 500,
        before: Annotated[Position | None, QueryParameter()] = None,
    ) -> Response[bytes]:
        """One page of the recorded cycles, newest first (at most `PAGE_MAX`, 500 by default;
        `before`: the page after the one ending at that position) and their true total, read
        from the projection in the read pool (admitted, time-limited: T5)."""
        caller = person(request)

        def read(h: copied.CopiedHandles) -> bytes:  # in the read pool
            rows = reads.decisions(h.store(), since, until, limit, before=before)
            total = history.decision_count(h.cursor, since, until)
            return msgspec.json.encode(
                DecisionsPageView(total=total, limit=limit, before=before, rows=rows)
            )

        data = await copied.read(worker, pool, caller.actor, "the decisions page", read)
        return Response(data, media_type="application/json")

    @get("/ui/api/decision/{position:int}", include_in_schema=False)
    async def decision(request: Request[Any, Any, Any], position: FromPath[int]) -> Response[bytes]:
        """One recorded decision, its row and its record both from the projection (its copy
        of the log), read in the read pool on the published view (who is an admin): the
        worker is asked nothing (T5)."""
        caller = person(request)

        def read(h: copied.CopiedHandles) -> bytes:
            store = h.store()
            if store.position() < position <= h.ledger.position:  # the store is away (T5)
                raise Unavailable("the projection has not reached this decision yet")
            record = reads.decision_at(store, position)  # UnknownEntity if none
            if not h.ledger.state.is_admin(caller.actor):  # the link hashes the previous
                record = msgspec.structs.replace(record, prev_hash="")  # event whole (T1)
            row = reads.decisions(store, limit=1, position=position)[0]  # one transaction
            return msgspec.json.encode(DecisionView(row=row, record=record))

        data = await copied.read(worker, pool, caller.actor, "the decision page", read)
        return Response(data, media_type="application/json")

    @get("/ui/api/preemptions", include_in_schema=False)
    async def preemptions(
        request: Request[Any, Any, Any],
        account: FromQuery[str | None] = None,
        side: FromQuery[Literal["of", "by", "both"]] = "both",
        window: FromQuery[Literal["7d", "30d", "90d", "all"]] = "30d",
        offset: Offset = 0,
        limit: Size = PAGE_MAX,
    ) -> Response[bytes]:
        """The preemptions an account's subtree suffered and caused over a window (no account:
        the first the caller manages, else all; `account=*`, which no account name can be, or
        empty: all; an account named `all` is that account, atk36-29 F1): the report's counts and
        sums over all of it, one page of its rows (at most `PAGE_MAX`) and their true
        total, read from the projection in the read pool (admitted, time-limited: T5)."""
        caller = person(request)

        def read(h: copied.CopiedHandles) -> bytes:  # in the read pool
            managed = sorted(h.ledger.state.managers.get(caller.actor, ()))
            chosen = (managed[0] if managed else None) if account is None else account
            if chosen in ("", EVERY_ACCOUNT):
                chosen = None
            end = float(math.floor(h.now()))  # whole seconds: `--at` of the CLI says it
            days = {"7d": 7, "30d": 30, "90d": 90}
            start = None if window == "all" else end - days[window] * 86400.0
            report = reads.preemption_report(h.cursor, chosen, side, start, end)
            shown = msgspec.structs.replace(report, rows=report.rows[offset : offset + limit])
            view = PreemptionsView(managed=managed, report=shown, total=len(report.rows),
                                   offset=offset, limit=limit)  # fmt: skip
            return msgspec.json.encode(view)

        data = await copied.read(worker, pool, caller.actor, "the preemptions page", read)
        return Response(data, media_type="application/json")

    kit = Kit(worker, handles, person, pool, kept, caught_up, stopping)

    handlers: list[HTTPRouteHandler] = [root, page, teams, queue, finished, job, job_replay, nodes]
    return [*handlers, decisions, decision, preemptions, *budget_pages.routes(kit), static]
