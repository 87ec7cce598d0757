"""Red team, a signed-in user slowing the scheduler with reads (threat model rows T5-T6,
docs/security.md): cartesian self-joins of the log, four at a time, while 8 clients submit,
hold no cycle and leave the submits flowing (counted; the latency ratios are benchmark figures,
`scripts/bench_reads.py`); a query stops at its time limit and its row limit with one line; a caller
past its share of queries gets 429 with Retry-After; a plain user cannot run one at all."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ledger.server.pooled import REFUSED_HOLD_S
from ledger.store.application import Ledger
from schemas import commands as c
from tests.integration.jobwatch import cpu_seconds
from tests.integration.serverkit import Server, make_token, set_up_ledger, start_server

TIMEOUT_S = 4.0
MAX_ROWS = 100_000
HISTORY = 1_500
"""Submissions (each cancelled) in the log before the server starts: 3,000 events, so a join
of the log with itself three times is 2.7e10 rows (it runs until its time limit)."""
SELF_JOIN = (
    "SELECT count(*) FROM events a, events b, events c "
    "WHERE a.position + b.position + c.position = 7"
)
INTERVAL_S = 0.2
AUDITORS = ("root", "aud1", "aud2", "aud3")
"""Four admins (auditors are admins): four users running heavy queries, one each."""


@dataclass
class World:
    home: Path
    server: Server
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("reads")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    ledger = Ledger(home)
    try:
        ledger.execute_all([c.GrantAdmin(actor="root", user=who) for who in AUDITORS[1:]])
        for _ in range(HISTORY // 100):
            first = ledger.state.next_job_id
            ledger.execute_all(
                [c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=0)] * 100
            )
            ledger.execute_all(
                [c.CancelJob(actor="alice", job_id=j) for j in range(first, first + 100)]
            )
    finally:
        ledger.close()
    tokens = {who: make_token(home, "--user", who) for who in ("alice", "bob", *AUDITORS)}
    tokens["root2"] = make_token(home, "--user", "root")
    server = start_server(
        home, "--interval", f"{INTERVAL_S}s",
        env={"GPULEDGER_READ_TIMEOUT": str(TIMEOUT_S), "GPULEDGER_READ_MAX_ROWS": str(MAX_ROWS)},
    )  # fmt: skip
    try:
        yield World(home, server, tokens)
    finally:
        assert server.stop() == 0


def sql(w: World, who: str, query: str) -> tuple[int, object]:
    return w.server.request(
        "POST", "/v1/audit/table", {"kind": "sql", "sql": query}, token=w.tokens[who]
    )


def test_a_query_stops_at_its_time_limit_and_its_row_limit_with_one_line(world: World) -> None:
    """The limit counts the read's own work, its thread's CPU time (readpool.ReadTime): on a
    loaded machine the read gets a share of a core, so its wall time is longer (stop 61's CI at
    load ~20: 37.7 s for a 4 s limit). What the server spent meanwhile, all its threads, is the
    read's work and a little of its cycle's: at least the limit, and not much past it."""
    pid = world.server.proc.pid
    began, cpu0 = time.monotonic(), cpu_seconds(pid)
    status, body = sql(world, "root", SELF_JOIN)
    took, spent = time.monotonic() - began, cpu_seconds(pid) - cpu0
    assert status == 400, body
    assert isinstance(body, dict)
    assert body["message"] == (
        f"the query ran past its time limit of {TIMEOUT_S:g} s and was stopped"
    )
    assert TIMEOUT_S <= took < 120, took
    # the cycle every 0.2 s and the request cost the idle server ~2% of a core
    assert TIMEOUT_S * 0.95 <= spent < TIMEOUT_S + 1 + 0.1 * took, (spent, took)
    # narrow rows: past the row limit well within the time limit, even at load
    status, body = sql(world, "root", "SELECT a.position FROM events a, events b")
    assert status == 400 and isinstance(body, dict), body
    assert body["message"] == f"the query's result is larger than {MAX_ROWS:,} rows: it was stopped"
    status, body = sql(world, "root", "SELECT count(*) AS n FROM events")
    assert status == 200, body


def test_a_caller_past_its_share_of_queries_gets_429_with_retry_after(world: World) -> None:
    """Two queries of one caller at a time: a third is answered 429 at once (both tokens are
    root's: the limit is the person's, not the token's)."""
    answers: list[int] = []
    running = [
        threading.Thread(target=lambda t=t: answers.append(sql(world, t, SELF_JOIN)[0]))
        for t in ("root", "root2")
    ]
    for t in running:
        t.start()
    time.sleep(1.0)  # both admitted (a slow machine: the third may find one not yet running)
    t0 = time.monotonic()
    conn_status, body = sql(world, "root", "SELECT 1 AS one")
    held_s = time.monotonic() - t0
    for t in running:
        t.join()
    assert answers == [400, 400]
    assert conn_status == 429, body
    assert isinstance(body, dict) and body["code"] == "busy"
    assert body["message"] == "'root' has 2 queries running already"
    # held like a GET's refusal: a client looping refused POSTs made ~2,000 a second (F4)
    assert held_s >= REFUSED_HOLD_S, held_s


def test_a_plain_user_cannot_run_the_self_join(world: World) -> None:
    status, body = sql(world, "bob", SELF_JOIN)
    assert status == 403, body


@dataclass
class Phase:
    submits: list[float]
    gaps: list[float]

    @property
    def submit_p99(self) -> float:
        return statistics.quantiles(self.submits, n=100, method="inclusive")[98]

    @property
    def gap_p95(self) -> float:
        return statistics.quantiles(self.gaps, n=20, method="inclusive")[18]


def submit_and_cancel(
    server: Server,
    token: str,
    stop: threading.Event,
    submits: list[float],
    failures: list[object],
    lock: threading.Lock,
) -> None:
    """One client: submits a 1-GPU job of ai2/olmo and cancels it until `stop`, adding each
    submit's latency to `submits` (a refused submit ends it, its answer in `failures`)."""
    body = {"actor": "", "account": "ai2/olmo", "gpus": 1}
    while not stop.is_set():
        began = time.monotonic()
        status, answer = server.request("POST", "/v1/commands/submit", body, token)
        took = time.monotonic() - began
        if status != 200:
            failures.append(answer)
            return
        with lock:
            submits.append(took)
        job = answer["events"][0]["job_id"]
        server.request("POST", "/v1/commands/cancel", {"actor": "", "job_id": job}, token)


def measure(w: World, seconds: float, heavy: bool, reads: bool = False) -> Phase:
    """8 clients submit (and cancel) for `seconds` while the cycle's times are read from
    /v1/health; with `heavy`, four users run a self-join each throughout; with `reads`, a plain
    user loops the largest pages of /v1/log and /v1/jobs (F2 of the attack on issue 25)."""
    stop = threading.Event()
    submits: list[float] = []
    cycles: list[float] = []
    failures: list[object] = []
    lock = threading.Lock()

    def client() -> None:
        submit_and_cancel(w.server, w.tokens["alice"], stop, submits, failures, lock)

    def watch() -> None:
        last = None
        while not stop.is_set():
            status, health = w.server.request("GET", "/v1/health")
            assert status == 200
            at = health["last_cycle_at"]
            if at is not None and at != last:
                cycles.append(at)
                last = at
            time.sleep(0.02)

    def query(who: str) -> None:
        while not stop.is_set():
            status, answer = sql(w, who, SELF_JOIN)
            if status != 400:  # stopped at its time limit
                failures.append(answer)
                return

    def read(path: str) -> None:
        after = itertools.count()
        while not stop.is_set():  # `after` changes: no answer is ever reused
            status, answer = w.server.request(
                "GET", path.format(next(after) % 50), token=w.tokens["bob"]
            )
            # past his bytes' allowance (4 MiB/s after 32 MiB: pages of up to 10,000 rows, so an
            # idle server sends them faster than that: the alone run of stop 61's CI) he is
            # refused, held `REFUSED_HOLD_S`, and asks again at once, as a hostile loop would
            if status == 429 and isinstance(answer, dict) and answer.get("code") == "busy":
                continue
            if status != 200:
                failures.append(answer)
                return

    threads = [threading.Thread(target=client) for _ in range(8)]
    threads.append(threading.Thread(target=watch))
    if reads:
        pages = ("/v1/log?limit=10000&after={}", "/v1/jobs?limit=10000&since={}")
        threads += [threading.Thread(target=read, args=(p,)) for p in pages]
    if heavy:
        threads += [threading.Thread(target=query, args=(who,)) for who in AUDITORS]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    assert not failures, failures[:3]
    gaps = [b - a for a, b in itertools.pairwise(cycles)]
    assert len(submits) > 20 and len(gaps) > 5, (len(submits), len(gaps))
    return Phase(submits, gaps)


@pytest.mark.alone
def test_heavy_queries_do_not_delay_submits_or_the_cycle(world: World) -> None:
    """Idle and loaded phases alternate (idle, loaded, idle, loaded). A query that held the
    worker would show as a cycle gap of its whole time limit (4 s) and the submits made would
    fall to a few: no gap reaches the limit and the loaded phases make at least a third of the
    idle ones' submits. The p99 and gap ratios are printed; as speed figures they are measured
    by `scripts/bench_reads.py` (docs/benchmarks.md), not asserted here, where a shared
    machine's noise alone moves a p99 past 2x."""
    idle = Phase([], [])
    loaded = Phase([], [])
    for _round in range(2):
        for phase, heavy in ((idle, False), (loaded, True)):
            got = measure(world, 6.0, heavy)
            phase.submits.extend(got.submits)
            phase.gaps.extend(got.gaps)
    print(
        f"\nsubmit p99 idle {idle.submit_p99 * 1e3:.0f} ms, "
        f"loaded {loaded.submit_p99 * 1e3:.0f} ms;"
        f" cycle gap p95 idle {idle.gap_p95 * 1e3:.0f} ms, loaded {loaded.gap_p95 * 1e3:.0f} ms,"
        f" max loaded {max(loaded.gaps) * 1e3:.0f} ms"
    )
    assert max(loaded.gaps) < TIMEOUT_S  # no cycle waited for a query
    assert len(loaded.submits) >= len(idle.submits) / 3, (len(loaded.submits), len(idle.submits))


def test_the_job_pages_replay_finds_its_decisions_in_the_projection_as_a_walk_would(
    world: World,
) -> None:
    """Row T6: the job page's decisions to replay come from the projection (those it lists: that
    placed or preempted the job), among the ones a walk of the job's span picks; each replays
    identical."""
    from ledger.history import replay as rp

    body = {"actor": "", "account": "ai2/olmo", "gpus": 1, "min_runtime_s": 0}
    status, answer = world.server.request(
        "POST", "/v1/commands/submit", body, world.tokens["alice"]
    )
    assert status == 200, answer
    job = answer["events"][0]["job_id"]
    deadline = time.monotonic() + 60
    while True:  # placed by a cycle, then waited on by a few more
        status, page = world.server.request("GET", f"/ui/api/job/{job}", token=world.tokens["bob"])
        assert status == 200, page
        if page["decisions"]:
            break
        assert time.monotonic() < deadline, page
        time.sleep(0.2)
    status, replays = world.server.request(
        "GET", f"/ui/api/job/{job}/replay", token=world.tokens["bob"]
    )
    assert status == 200, replays
    walked = rp.find_decisions(world.home, rp.Selection(job=job))
    shown = [r["position"] for r in replays]
    assert shown and set(shown) <= {p for p, _d in walked}
    assert shown == [d["position"] for d in page["decisions"]][::-1][-len(shown) :]
    assert all(r["identical"] for r in replays), replays
    again = world.server.request("GET", f"/ui/api/job/{job}/replay", token=world.tokens["bob"])
    assert again == (200, replays)  # kept: a recorded decision's replay never changes


@pytest.mark.alone
def test_reads_of_the_log_and_the_jobs_do_not_delay_submits_or_the_cycle(world: World) -> None:
    """F2: a plain user looping the largest pages of /v1/log and /v1/jobs (each of the whole
    log here) while 8 clients submit. On the worker thread each page held every submit and
    cycle behind it: the submits made fell to a fortieth and cycles waited a page's whole
    time. Now the loaded phases make at least a third of the idle ones' submits and no cycle
    gap reaches the read time limit; the p99 ratios are printed and measured as speed by
    `scripts/bench_reads.py --load pages`."""
    idle = Phase([], [])
    loaded = Phase([], [])
    for _round in range(2):
        for phase, reads in ((idle, False), (loaded, True)):
            got = measure(world, 6.0, False, reads)
            phase.submits.extend(got.submits)
            phase.gaps.extend(got.gaps)
    print(
        f"\nsubmit p99 idle {idle.submit_p99 * 1e3:.0f} ms, "
        f"loaded {loaded.submit_p99 * 1e3:.0f} ms;"
        f" cycle gap p95 idle {idle.gap_p95 * 1e3:.0f} ms, loaded {loaded.gap_p95 * 1e3:.0f} ms"
    )
    assert max(loaded.gaps) < TIMEOUT_S
    # the reads take at most half of the interpreter: the submits made, at least a third of the
    # idle phase's (with the reads on the worker thread, a fortieth: docs/benchmarks.md)
    assert len(loaded.submits) >= len(idle.submits) / 3


def test_a_read_past_its_bounds_gets_one_line_at_once(world: World) -> None:
    """F1: the delivered report over fifty years (one row per team and hour) and pages
    past 10,000 rows are refused with one line, before any work; the report's longest window
    still answers."""
    bob = world.tokens["bob"]
    began = time.monotonic()
    status, body = world.server.request(
        "GET",
        "/v1/report/delivered?start=0&end=1728000000",
        token=bob,  # a past end
    )
    assert status == 400 and isinstance(body, dict), body
    assert body["message"] == "the report covers at most 3,660 days, asked for 20,000"
    assert time.monotonic() - began < 10
    for path, line in (
        ("/v1/log?limit=100000", "log answers at most 10,000 rows a page"),
        ("/v1/log?tail=10001", "log answers at most 10,000 rows a page"),
        ("/v1/jobs?limit=20000", "jobs answers at most 10,000 rows a page"),
    ):
        status, body = world.server.request("GET", path, token=bob)
        assert status == 400 and isinstance(body, dict), (path, body)
        assert body["message"].startswith(line), body
    now = time.time()
    status, body = world.server.request(
        "GET", f"/v1/report/delivered?start={now - 3650 * 86400:.0f}&end={now:.0f}", token=bob
    )
    assert status == 200, body


def test_reads_of_the_projection_are_admitted_by_the_read_pool(world: World) -> None:
    """The reads run in the audit tables' pool, under its per-caller admission: three pages
    of one caller at once, the third is refused 429 with Retry-After rather than queued on
    the worker (bob's pages; root's audit queries are counted apart)."""
    answers: list[tuple[int, object]] = []
    lock = threading.Lock()

    def page(i: int) -> None:
        got = world.server.request(
            "GET", f"/v1/log?limit=10000&after={i}", token=world.tokens["bob"]
        )
        with lock:
            answers.append(got)

    for _attempt in range(5):  # a page may end before the third arrives on a fast machine
        answers.clear()
        threads = [threading.Thread(target=page, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if any(status == 429 for status, _ in answers):
            break
    busy = [body for status, body in answers if status == 429]
    assert busy, [s for s, _ in answers]
    assert isinstance(busy[0], dict) and busy[0]["message"] == "'bob' has 2 queries running already"
    assert all(status in (200, 429) for status, _ in answers), answers


def test_the_job_page_is_read_in_the_read_pool_and_tells_what_explain_tells(world: World) -> None:
    """Row T6: a job's page (its row, its history told, its decisions) is computed in the read
    pool, under its admission: eight of bob's pages of different jobs at once, some are refused
    429 rather than queued on the worker; and the page's explanation is `explain`'s (which the
    worker answers) for the same job."""
    answers: list[tuple[int, object]] = []
    lock = threading.Lock()
    jobs = itertools.count(2)

    def page(job: int) -> None:
        got = world.server.request("GET", f"/ui/api/job/{job}", token=world.tokens["bob"])
        with lock:
            answers.append(got)

    for _attempt in range(5):  # a page may end before the third arrives on a fast machine
        answers.clear()
        threads = [threading.Thread(target=page, args=(next(jobs),)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if any(status == 429 for status, _ in answers):
            break
    assert all(status in (200, 429) for status, _ in answers), answers
    busy = [body for status, body in answers if status == 429]
    assert busy, [s for s, _ in answers]
    assert isinstance(busy[0], dict) and busy[0]["message"] == "'bob' has 2 queries running already"
    for job in (2, 7, HISTORY // 2):
        status, shown = world.server.request("GET", f"/ui/api/job/{job}", token=world.tokens["bob"])
        assert status == 200 and isinstance(shown, dict), shown
        status, told = world.server.request(
            "GET", f"/v1/explain?job_id={job}", token=world.tokens["bob"]
        )
        assert status == 200 and isinstance(told, dict), told
        assert shown["explain"]["history"] == told["history"], job
        assert shown["explain"]["lines"] == told["lines"], job
        assert shown["explain"]["status"] == told["status"] == "finished", job
        assert shown["job"]["job_id"] == job and shown["private"] is False
    status, missing = world.server.request("GET", "/ui/api/job/999999", token=world.tokens["bob"])
    assert status == 404, missing
