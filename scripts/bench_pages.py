"""Benchmark: each dashboard page's server time (the JSON endpoints its script calls when it
loads, timed over HTTP on 127.0.0.1 against a real `gpuledger serve`), at 10k pending jobs on top
of histories of growing size (goal: each page <= 300 ms at 10k pending and 1M events).

For each log size N (the synthetic mix of `projections.testing.synthetic` on 1,024 x 8 GPUs, made
once and cached in --dir by `bench_history`'s builder; never commit it), it appends --pending
submissions of 8 GPUs spread over every project's members (more than the free GPUs hold, so
about that many stay pending after the server's first cycle), starts `gpuledger serve`, waits for
its first cycle and times every page --repeat times, two ways:

- cold: the first load after the log moved (the bench holds and releases the last pending job
  through the API just before it, as a busy ledger appends every cycle): what a viewer gets while
  the ledger is busy, the figure the goal is about;
- warm: the same page loaded again at the same log position (answers kept per position).

A page's time is the sum of its endpoints' times in one load; medians and maxima over --repeat.

At the end it prints how many reads ran on the server's worker thread (the thread that runs the
dispatcher cycle: each delays it) and their time there, and how long the reads waited for their
turn in each lane of the read pool (a thread, or their reader's rest: `ledger.server.fairlane`),
from `/metrics`.

The job page's replay of the job's decisions (`/ui/api/job/{id}/replay`, loaded after the page,
off the worker thread) is timed once per size and shown apart: it walks the log in memory.

`--executor record` serves with an executor that places (the default, `none`, places nothing,
so no page estimates a start); `--blocked` adds held-back work to the home once (2,000 tasks
`afterok` a pending job, 1,000 `%2`, 300 `singleton`): the queue pages that show or sort them
estimate the whole queue's starts (atk51-29 F5).

    python scripts/bench_pages.py                                 # 10k, 100k, 1M events
    python scripts/bench_pages.py --sizes 10000 --pending 10000 --dir /tmp/gpuledger-pages
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_history import ensure_log, prepare
from benchkit import Serve, machine

from ledger.core import tokens
from ledger.store.application import Ledger
from ledger.store.clock import new_token_secret
from schemas import commands as c

GOAL_MS = 300.0


def add_pending(home: Path, pending: int) -> dict[str, object]:
    """Submit `pending` 8-GPU jobs round-robin over the members (once per home); a token."""
    marker = home / "pages.json"
    if marker.exists():
        info: dict[str, object] = json.loads(marker.read_text())
        if info.get("pending") == pending:
            return info
        raise SystemExit(f"error: {home} holds another --pending; use a fresh --dir")
    ledger = Ledger(home, live=True)
    try:
        members = sorted((u, p) for p, us in ledger.state.members.items() for u in us)
        secret = new_token_secret()
        token_cmd = tokens.issue("root", "root", secret, name="bench-pages")
        ledger.execute(token_cmd)
        t0 = time.perf_counter()
        for start in range(0, pending, 1_000):
            ledger.execute_all(
                [
                    c.SubmitJob(
                        actor=members[i % len(members)][0],
                        account=members[i % len(members)][1],
                        gpus=8,
                        min_runtime_s=3_600,
                        command=("python", "train.py", f"--run={i}"),
                    )
                    for i in range(start, min(pending, start + 1_000))
                ]
            )
        submit_s = time.perf_counter() - t0
        ledger.snapshot_state()
    finally:
        ledger.close()
    info = {"pending": pending, "token": secret, "submit_s": submit_s}
    marker.write_text(json.dumps(info))
    return info


def add_blocked(home: Path) -> None:
    """Held-back work beside the pending (`--blocked`, once per home; atk51-29 F5's mix): an
    8-GPU job pending, a 2,000-task array `afterok` on it, a 1,000-task array `%2` and a
    300-task `singleton` array."""
    from schemas.events import Dependency

    marker = home / "pages-blocked.json"
    if marker.exists():
        return
    ledger = Ledger(home, live=True)
    try:
        members = sorted((u, p) for p, us in ledger.state.members.items() for u in us)
        (u1, p1), (u2, p2) = members[0], members[len(members) // 2]
        ledger.execute(c.SubmitJob(actor=u1, account=p1, gpus=8, job_name="anchor",
                                   min_runtime_s=3_600, command=("sleep", "100")))  # fmt: skip
        anchor = max(ledger.state.jobs)
        after = (Dependency(kind="afterok", job_ids=(anchor,)),)
        single = (Dependency(kind="singleton"),)
        ledger.execute_all([
            c.SubmitJob(actor=u1, account=p1, gpus=1, array=tuple(range(2_000)), job_name="dep",
                        dependency=after, command=("true",)),
            c.SubmitJob(actor=u2, account=p2, gpus=1, array=tuple(range(1_000)), array_limit=2,
                        job_name="lim", command=("true",)),
            c.SubmitJob(actor=u2, account=p2, gpus=1, array=tuple(range(300)), job_name="one",
                        dependency=single, command=("true",)),
        ])  # fmt: skip
        ledger.snapshot_state()
    finally:
        ledger.close()
    marker.write_text(json.dumps({"anchor": anchor}))


def pages(job: int, position: int, last: int, program: str, project: str) -> dict[str, list[str]]:
    """Each page's endpoints as its script asks them (`last`: the queue's last page's offset;
    the budget review of the programs, of `program` and of `project`'s people)."""
    return {
        "teams (7 days)": ["/v1/whoami", "/ui/api/teams?window=7d"],
        "teams (whole period)": ["/v1/whoami", "/ui/api/teams?window=all"],
        "queue": ["/v1/whoami", "/ui/api/queue?state=queued"],
        "queue (last page)": ["/v1/whoami", f"/ui/api/queue?state=queued&offset={last}"],
        "queue (by user, descending)": ["/v1/whoami", "/ui/api/queue?sort=user&descending=true"],
        "queue (one reason)": ["/v1/whoami", "/ui/api/queue?reason=WAIT_RESOURCES"],
        "queue (held back)": ["/v1/whoami", "/ui/api/queue?reason=WAIT_DEPENDENCY"],
        "preemptions (30 days)": ["/v1/whoami", "/ui/api/preemptions?account=*"],
        "preemptions (whole period)": ["/v1/whoami", "/ui/api/preemptions?account=*&window=all"],
        "finished": ["/v1/whoami", "/ui/api/finished"],
        "finished (page 501)": ["/v1/whoami", "/ui/api/finished?offset=50000"],
        "job": ["/v1/whoami", f"/ui/api/job/{job}"],
        "nodes": ["/v1/whoami", "/ui/api/nodes"],
        "decisions": ["/v1/whoami", "/ui/api/decisions?limit=500", f"/ui/api/decision/{position}"],
        "budget (the programs)": ["/v1/whoami", "/ui/api/budget"],
        "budget (a program)": ["/v1/whoami", f"/ui/api/budget?account={program}"],
        "budget (a project)": ["/v1/whoami", f"/ui/api/budget?account={project}"],
        "/metrics (a scrape)": ["/metrics"],
    }


def measure(
    home: Path, pending: int, repeat: int, executor: str = "none", held_back: bool = False
) -> dict[str, Any]:
    info = add_pending(home, pending)
    if held_back:
        add_blocked(home)
    token = str(info["token"])
    server = Serve(home, home.parent / f"serve-{home.name}.log", "--executor", executor)
    try:
        deadline = time.monotonic() + 600
        while json.loads(server.call("GET", "/v1/health")[1])["cycles"] < 1:
            if time.monotonic() > deadline:
                raise SystemExit("error: no cycle in 600 s")
            time.sleep(0.5)
        # the whole period's first read after a start (its ended hours: the projection's)
        c0 = server.cpu()
        status, body, first_all_ms = server.call("GET", "/ui/api/teams?window=all", token=token)
        first_all_cpu = (server.cpu() - c0) * 1000
        assert status == 200, body[:300]
        status, body, _ = server.call("GET", "/ui/api/queue?state=queued&limit=1", token=token)
        assert status == 200, body
        total = json.loads(body)["total"]  # the queue is paged: its last job, on the last page
        status, body, _ = server.call(
            "GET", f"/ui/api/queue?state=queued&limit=1&offset={total - 1}", token=token
        )
        job = json.loads(body)["rows"][-1]["row"]["job_id"]
        last = (total - 1) // 100 * 100
        status, body, _ = server.call("GET", "/ui/api/decisions?limit=1", token=token)
        position = json.loads(body)["rows"][0]["position"]
        status, body, _ = server.call("GET", "/ui/api/budget", token=token)
        program = json.loads(body)["children"][0]["account"]
        status, body, _ = server.call("GET", f"/ui/api/budget?account={program}", token=token)
        project = json.loads(body)["children"][0]["account"]
        health = json.loads(server.call("GET", "/v1/health")[1])
        held = str(job).encode()

        def bump() -> None:
            """Move the log: hold and release the last pending job."""
            for tag in ("hold", "release"):
                body = b'{"actor": "root", "job_id": ' + held + b"}"
                status, out, _ = server.call("POST", f"/v1/commands/{tag}", body, token)
                assert status == 200, (tag, status, out[:300])

        def load(endpoints: list[str]) -> tuple[float, float]:
            """Wall and server CPU milliseconds of one page load."""
            total, c0 = 0.0, server.cpu()
            for path in endpoints:
                status, body, ms = server.call("GET", path, token=token)
                assert status == 200, (path, status, body[:300])
                total += ms
            return total, (server.cpu() - c0) * 1000

        times: dict[str, dict[str, tuple[float, float, float]]] = {}
        for name, endpoints in pages(job, position, last, program, project).items():
            cold, warm = [], []
            for _ in range(repeat):
                bump()
                cold.append(load(endpoints))
                warm.append(load(endpoints))
            times[name] = {
                kind: (
                    statistics.median(x[0] for x in got),
                    max(x[0] for x in got),
                    statistics.median(x[1] for x in got),
                )
                for kind, got in (("cold", cold), ("warm", warm))
            }
        status, body, replay_ms = server.call("GET", f"/ui/api/job/{job}/replay", token=token)
        replay = {"status": status, "ms": replay_ms, "decisions": len(json.loads(body or b"[]"))}
        scrape = server.call("GET", "/metrics", token=token)[1]
        on_worker, lane_waits = worker_reads(scrape), lanes_waited(scrape)
    finally:
        server.stop()
    return {
        "events": health["head"],
        "pending": total,
        "pages": times,
        "replay": replay,
        "load": os.getloadavg()[0],
        "first_all": (first_all_ms, first_all_cpu),
        "on_worker": on_worker,
        "lane_waits": lane_waits,
    }


def worker_reads(scrape: bytes) -> tuple[float, float]:
    """The server's reads on its worker thread so far and their seconds there (the thread that
    runs the dispatcher: a read there delays the cycle), from a /metrics scrape."""
    got = {"gpuledger_worker_reads_total": 0.0, "gpuledger_worker_read_seconds_total": 0.0}
    for line in scrape.decode().splitlines():
        name, _, value = line.partition(" ")
        if name in got:
            got[name] = float(value)
    return got["gpuledger_worker_reads_total"], got["gpuledger_worker_read_seconds_total"]


def lanes_waited(scrape: bytes) -> dict[str, float]:
    """Each read lane's reads' seconds waiting for their turn so far (a thread, their reader's
    rest: `ledger.server.fairlane`), from a /metrics scrape."""
    got = {}
    for line in scrape.decode().splitlines():
        if line.startswith("gpuledger_read_lane_wait_seconds_total{"):
            labels, _, value = line.partition("} ")
            got[labels.split('lane="')[1].rstrip('"')] = float(value)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--dir", type=Path, default=None, help="cache of the logs (default: a temp dir)"
    )
    ap.add_argument(
        "--executor", default="none", choices=("none", "record"),
        help="serve's executor: with `record` the cycles place jobs and the queue pages "
        "estimate starts (none: no start is estimated)",
    )  # fmt: skip
    ap.add_argument(
        "--blocked", action="store_true",
        help="add held-back work once per home: 2,000 `afterok` tasks, 1,000 `%%2`, 300 "
        "`singleton`",
    )  # fmt: skip
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="gpuledger-pages-"))
    print(f"machine: {machine()}; logs in {root}; executor {args.executor}"
          f"{', held-back work added' if args.blocked else ''}", flush=True)  # fmt: skip
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        home = root / str(n)
        t0 = time.perf_counter()
        prepare(home, ensure_log(home, n))
        print(f"{n:,} events: log ready in {time.perf_counter() - t0:.1f} s", flush=True)
        r = measure(home, args.pending, args.repeat, args.executor, args.blocked)
        results.append(r)
        print(f"  {r['events']:,} events, {r['pending']:,} pending, load {r['load']:.1f}")
        for name, how in r["pages"].items():
            for kind, (med, worst, cpu) in how.items():
                print(
                    f"  page {name:<22} {kind}: median {med:8.1f} ms (ratio to {GOAL_MS:.0f} ms:"
                    f" {med / GOAL_MS:.2f}), max {worst:8.1f} ms, server CPU {cpu:6.1f} ms"
                )
        ms, cpu = r["first_all"]
        print(
            f"  teams (whole period), first read after a start: {ms:.1f} ms (ratio "
            f"{ms / GOAL_MS:.2f}), server CPU {cpu:.1f} ms"
        )
        rep = r["replay"]
        print(f"  job replay (apart): {rep['ms']:.0f} ms for {rep['decisions']} decisions")
        n, secs = r["on_worker"]
        print(f"  reads on the worker thread (the dispatcher's), all loads: {n:.0f}, {secs:.3f} s")
        waits = ", ".join(f"{k} {v:.2f} s" for k, v in sorted(r["lane_waits"].items()))
        print(
            f"  reads' waits for their turn in the lanes (their reader's rest), all loads: {waits}"
        )
    names = list(results[0]["pages"])
    for kind in ("cold", "warm"):
        print(f"\n{kind:<26}" + "".join(f"{r['events']:>14,}" for r in results))
        for name in names:
            row = "".join(f"{r['pages'][name][kind][0]:>11.0f} ms" for r in results)
            print(f"{name:<26}{row}")
        worst = max(r["pages"][n][kind][0] for r in results for n in names)
        print(f"worst page ({kind}): {worst:.0f} ms; goal <= {GOAL_MS:.0f} ms: ratio"
              f" {worst / GOAL_MS:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
