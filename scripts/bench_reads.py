"""Reads beside the scheduler (issue #25, docs/security.md row T5): submit p99 and the dispatcher's
cycle interval while 4 users run heavy audit queries (self-joins of the log), against the same
figures idle, measured in the same run. Goal: within 2x idle.

    python scripts/bench_reads.py [--events 100000] [--dir DIR] [--seconds 15] [--rounds 2]
                                  [--load queries|pages|live] [--pages] [--warmup 10]

A `gpuledger serve --interval 0.5s` on a synthetic log of `--events` events (made once per
--dir); 8 clients (`--clients`) submit (and cancel) 1-GPU jobs through the API for
`--seconds`; a watcher reads `last_cycle_at` from /v1/health every 20 ms, and another person
reads 5 jobs every 100 ms (their latency: one person's big pages must not hold them back).
Loaded phases add four admins (auditors are admins: docs/security.md row T2), each running a
cartesian self-join of `events` in a loop (it runs until the read pool's time limit, 10 s).
Idle and loaded phases alternate `--rounds` times, after `--warmup` seconds of submits that are
not counted (the server's first seconds).
Prints the load average, the server's CPU seconds beside wall time, and the ratios.

    python scripts/bench_reads.py --load pages [...]

The loaded phases instead have one plain member loop the largest pages of `/v1/log` and
`/v1/jobs` (10,000 rows; `after`/`since` changing so no answer is reused), two requests at a
time: the reads that ran on the worker thread before (F2 of the attack on issue 25).

    python scripts/bench_reads.py --load live [...]

The loaded phases instead have one plain member loop, two requests at a time, every read that
needed the worker thread before (atk25c F3, issue 29 F11): the previews with `policy=` (queue,
priority, explain), `/metrics`, the dashboard's queue, nodes, teams (whole period), job,
decisions (1,000 rows) and preemptions; they now run in the read pool on a copy of the live
state, admitted like every read (`ledger/server/copied.py`).

    python scripts/bench_reads.py --load looks [--tabs 50] [...]

The loaded phases instead have `--tabs` dashboard tabs (spread over the four admins) each ask
`/v1/whoami` every 2 s, as a shown tab looks at the server (`lookAtServer` in
`ledger/server/web/base.js`). After the rounds, the looks' own cost: the server's CPU over
`--seconds` with nothing asked, then with the tabs' looks alone; printed as CPU per look and
share of a core.

With `--pages`, a third phase per round has four people viewing job pages instead (row T6):
each loads a job's page (`/ui/api/job/{id}`) and its decision replay
(`/ui/api/job/{id}/replay`, replayed in a child process at nice 10, each decision once) for
jobs of the log in turn, in a loop; its submit p99 and cycle interval are compared with idle.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_history import ensure_log, prepare
from benchkit import Serve, machine

from ledger.core import tokens
from ledger.store.application import Ledger
from ledger.store.clock import new_token_secret
from schemas import commands as c

AUDITORS = ("root", "aud1", "aud2", "aud3")
LIVE = [
    "/v1/queue?policy=fifo&limit=1000", "/v1/priority?policy=fifo&limit=1000",
    "/v1/explain?job_id=3&policy=fifo", "/metrics", "/ui/api/queue?limit=1000",
    "/ui/api/nodes", "/ui/api/teams?window=all", "/ui/api/job/3",
    "/ui/api/decisions?limit=1000", "/ui/api/preemptions?account=*&window=all",
]  # fmt: skip
"""The reads `--load live` loops (see the docstring)."""
LOOK_EVERY_S = 2.0
"""A shown dashboard tab's look at the server (`SERVER_LOOK_EVERY_MS` in base.js)."""
SELF_JOIN = (
    "SELECT count(*) FROM events a, events b WHERE a.position + b.position = 7 AND a.tag <> b.tag"
)


def setup(home: Path) -> dict[str, Any]:
    """Admins and their tokens, a member's token (once per home)."""
    marker = home / "reads.json"
    if marker.exists():
        info: dict[str, Any] = json.loads(marker.read_text())
        return info
    ledger = Ledger(home, live=True)
    try:
        member, project = sorted((u, p) for p, us in ledger.state.members.items() for u in us)[0]
        secrets = {}
        for who in (*AUDITORS, member):
            if who != "root" and who in AUDITORS and not ledger.state.is_admin(who):
                ledger.execute(c.GrantAdmin(actor="root", user=who))
            secrets[who] = new_token_secret()
            ledger.execute(tokens.issue("root", who, secrets[who], name="bench-reads"))
        ledger.snapshot_state()
    finally:
        ledger.close()
    info = {"tokens": secrets, "member": member, "project": project}
    marker.write_text(json.dumps(info))
    return info


def phase(
    serve: Serve,
    info: dict[str, Any],
    seconds: float,
    heavy: bool,
    load: str = "queries",
    pages: bool = False,
    clients: int = 8,
    tabs: int = 50,
    watching: bool = True,
) -> dict[str, Any]:
    stop = threading.Event()
    small: list[float] = []
    submits: list[float] = []
    cycles: list[float] = []
    queries: list[tuple[int, float]] = []
    lock = threading.Lock()
    member = info["tokens"][info["member"]]

    def client() -> None:
        body = {"actor": "", "account": info["project"], "gpus": 1}
        while not stop.is_set():
            t0 = time.perf_counter()
            status, answer = serve.request("POST", "/v1/commands/submit", body, member)
            took = time.perf_counter() - t0
            if status != 200:
                raise SystemExit(f"error: submit answered {status}: {answer}")
            with lock:
                submits.append(took)
            job = answer["events"][0]["job_id"]
            serve.request("POST", "/v1/commands/cancel", {"actor": "", "job_id": job}, member)

    def watch() -> None:
        last = None
        while not stop.is_set():
            _status, health = serve.request("GET", "/v1/health")
            if health["last_cycle_at"] != last:
                last = health["last_cycle_at"]
                cycles.append(last)
            time.sleep(0.02)

    def query(who: str) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            status, _ = serve.request(
                "POST", "/v1/audit/table", {"kind": "sql", "sql": SELF_JOIN}, info["tokens"][who]
            )
            with lock:
                queries.append((status, time.perf_counter() - t0))

    def big_pages(path: str) -> None:
        after = itertools.count()
        while not stop.is_set():
            t0 = time.perf_counter()
            status, _ = serve.request("GET", path.format(next(after) * 7), token=member)
            with lock:
                queries.append((status, time.perf_counter() - t0))

    def small_reads() -> None:  # another person's 5-row read every 100 ms (F3 of the attack)
        while not stop.is_set():
            t0 = time.perf_counter()
            status, _ = serve.request("GET", "/v1/jobs?limit=5", token=info["tokens"]["aud1"])
            if status == 200:
                with lock:
                    small.append(time.perf_counter() - t0)
            time.sleep(0.1)

    viewed: list[tuple[int, float]] = []
    jobs = itertools.count(1, 37)  # jobs spread over the log, a new one for each view

    def view(who: str) -> None:
        while not stop.is_set():
            with lock:
                job = next(jobs)
            for path in (f"/ui/api/job/{job}", f"/ui/api/job/{job}/replay"):
                t0 = time.perf_counter()
                status, _ = serve.request("GET", path, token=info["tokens"][who])
                with lock:
                    viewed.append((status, time.perf_counter() - t0))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    if watching:
        threads += [threading.Thread(target=watch), threading.Thread(target=small_reads)]

    def live(offset: int) -> None:
        paths = LIVE[offset:] + LIVE[:offset]
        for i in itertools.count():
            if stop.is_set():
                return
            t0 = time.perf_counter()
            status, _raw, _ = serve.call("GET", paths[i % len(paths)], None, member)
            with lock:
                queries.append((status, time.perf_counter() - t0))

    def tab(i: int) -> None:  # a shown dashboard tab's look every LOOK_EVERY_S
        token = info["tokens"][AUDITORS[i % len(AUDITORS)]]
        at = time.perf_counter() + LOOK_EVERY_S * i / tabs
        while not stop.wait(max(0.0, at - time.perf_counter())):
            t0 = time.perf_counter()
            status, _raw, _ = serve.call("GET", "/v1/whoami", None, token)
            with lock:
                queries.append((status, time.perf_counter() - t0))
            at += LOOK_EVERY_S

    if heavy and load == "looks":
        threads += [threading.Thread(target=tab, args=(i,)) for i in range(tabs)]
    elif heavy and load == "live":
        threads += [threading.Thread(target=live, args=(i * 5,)) for i in range(2)]
    elif heavy and load == "pages":
        paths = ("/v1/log?limit=10000&after={}", "/v1/jobs?limit=10000&since={}")
        threads += [threading.Thread(target=big_pages, args=(path,)) for path in paths]
    elif heavy:
        threads += [threading.Thread(target=query, args=(who,)) for who in AUDITORS]
    if pages:
        threads += [threading.Thread(target=view, args=(who,)) for who in AUDITORS]
    cpu0, t0 = serve.cpu(), time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    gaps = [b - a for a, b in itertools.pairwise(cycles)]
    return {
        "submits": submits,
        "gaps": gaps,
        "small": small,
        "queries": queries,
        "viewed": viewed,
        "wall": time.perf_counter() - t0,
        "cpu": serve.cpu() - cpu0,
        "load": os.getloadavg()[0],
    }


def cost_of_looks(serve: Serve, info: dict[str, Any], seconds: float, tabs: int) -> str:
    """The server's CPU over `seconds` with nothing asked, then with `tabs` tabs' looks alone:
    its CPU per look and share of a core (one line)."""
    cpu0 = serve.cpu()
    time.sleep(seconds)
    quiet = serve.cpu() - cpu0
    r = phase(serve, info, seconds, True, "looks", clients=0, tabs=tabs, watching=False)
    looks = sum(s == 200 for s, _ in r["queries"])
    per = (r["cpu"] - quiet * r["wall"] / seconds) / max(looks, 1)
    return (
        f"looks alone: {tabs} tabs, {looks} looks answered in {r['wall']:.1f} s, server CPU "
        f"{r['cpu']:.2f} s against {quiet:.2f} s in {seconds:.0f} s with nothing asked: "
        f"{per * 1e3:.2f} ms CPU a look, {per * looks / r['wall']:.3f} of a core; look p50 "
        f"{p([t for s, t in r['queries'] if s == 200], 50) * 1e3:.1f} ms; load {r['load']:.1f}"
    )


def p(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, help="keep the log here (made once, reused)")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--load", choices=("queries", "pages", "live", "looks"), default="queries")
    ap.add_argument("--tabs", type=int, default=50, help="--load looks: tabs looking")
    ap.add_argument("--pages", action="store_true", help="a phase of job page views too")
    ap.add_argument("--clients", type=int, default=8, help="clients submitting at once")
    ap.add_argument(
        "--warmup", type=float, default=10.0, help="seconds of submits first, not counted"
    )
    a = ap.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench-reads-") as tmp:
        home = a.dir or Path(tmp) / "home"
        home.mkdir(parents=True, exist_ok=True)
        prepare(home, ensure_log(home, a.events))
        info = setup(home)
        serve = Serve(home, Path(tmp) / "serve.log", "--interval", "0.5s")
        try:
            out: dict[str, list[dict[str, Any]]] = {"idle": [], "loaded": [], "pages": []}
            kinds = ("idle", "loaded", "pages") if a.pages else ("idle", "loaded")
            if a.warmup > 0:  # the server's first seconds (its projection, its caches) apart
                phase(serve, info, a.warmup, heavy=False, clients=a.clients)
            for _ in range(a.rounds):
                for kind in kinds:
                    heavy = kind == "loaded"
                    r = phase(serve, info, a.seconds, heavy, a.load, kind == "pages", a.clients,
                              a.tabs)  # fmt: skip
                    out[kind].append(r)
                    q, v = r["queries"], r["viewed"]
                    print(
                        f"{kind:6}: {len(r['submits'])} submits, "
                        f"p99 {p(r['submits'], 99) * 1e3:.0f} ms; cycle gap p50 "
                        f"{p(r['gaps'], 50) * 1e3:.0f} / p95 {p(r['gaps'], 95) * 1e3:.0f} / max "
                        f"{max(r['gaps'], default=0) * 1e3:.0f} ms; server CPU {r['cpu']:.1f} s in "
                        f"{r['wall']:.1f} s wall; load {r['load']:.1f}; another person's "
                        f"5-row reads p50 {p(r['small'], 50) * 1e3:.0f} / max "
                        f"{max(r['small'], default=0) * 1e3:.0f} ms"
                        + (
                            f"; {len(q)} {a.load} ({sum(s == 200 for s, _ in q)} answered, "
                            f"{sum(s == 400 for s, _ in q)} stopped at the time limit, "
                            f"{sum(s == 429 for s, _ in q)} 429; answered in p50 "
                            f"{p([t for s, t in q if s == 200], 50) * 1e3:.0f} / max "
                            f"{max((t for s, t in q if s == 200), default=0) * 1e3:.0f} ms)"
                            if heavy
                            else ""
                        )
                        + (
                            f"; {len(v)} job page loads (page and replay; "
                            f"{sum(st != 200 for st, _ in v)} not 200), p50 "
                            f"{p([t for _, t in v], 50) * 1e3:.0f} ms, max "
                            f"{max((t for _, t in v), default=0) * 1e3:.0f} ms"
                            if kind == "pages"
                            else ""
                        ),
                        flush=True,
                    )
            if a.load == "looks":
                print(cost_of_looks(serve, info, a.seconds, a.tabs), flush=True)
        finally:
            serve.stop()
    pooled = {
        kind: {k: [x for r in rs for x in r[k]] for k in ("submits", "gaps", "small")}
        for kind, rs in out.items()
    }
    idle = pooled["idle"]
    for kind in kinds[1:]:
        got = pooled[kind]
        sub = p(got["submits"], 99) / p(idle["submits"], 99)
        gap = p(got["gaps"], 50) / p(idle["gaps"], 50)
        gap95 = p(got["gaps"], 95) / p(idle["gaps"], 95)
        small = p(got["small"], 99) / p(idle["small"], 99)
        print(
            f"submit p99 {kind}/idle {sub:.2f}x; cycle interval p50 {kind}/idle {gap:.2f}x, p95 "
            f"{gap95:.2f}x (goal: within 2x); another person's 5-row read p99 {small:.2f}x"
        )


if __name__ == "__main__":
    main()
