"""Benchmark: the dashboard's Queue page read cold through the server at the scale tests' home
(issue 29: every page <= 300 ms cold at 10,000 pending), with the ratio to the 300 ms limit.

    python scripts/bench_queue_cold.py --dir DIR [--repeat 5]

DIR/ledger is made once and kept (never commit it): `dashkit.build(days=2, seed=3, load=2)`
plus 10,000 pending submissions a second apart ending a minute before, three of them held, as
`tests/integration/test_dashboard_scale.py` builds its `deep` home. It is served by `gpuledger
serve --interval 5s --squat-after 1s` (the test's server) and the Queue page's read, as its
script asks it first (`/ui/api/queue?state=queued&sort=order&descending=false&offset=0&limit=100`,
root's token), is timed three ways:

- first: right after the server's start and its first cycle, nothing read before (no queue
  preview, no kept answer, the projection caught up by the read);
- cold: right after the log moved (the last pending job held and released through the API, as
  a busy ledger appends every cycle): nothing kept for that position, the preview made again;
- warm: again at the same position (the answer kept for it).

Each is the wall time of the request on 127.0.0.1 and the server's CPU meanwhile (a cycle of the
server's may fall inside a read: the maximum shows it); medians and maxima over --repeat. Then,
from the server's counters (`/metrics` scraped before each move and after each cold read), each
cold read's projection catch-up and its wait for a thread of the read pool's live lane.
`--nice N`: the server's nice level (absolute; a level below the bench's own needs root): under
`nice -n 19` on a loaded machine a read's wall time is mostly its wait for a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchkit import Serve, machine

GOAL_MS = 300.0
COUNTERS = (
    "gpuledger_read_catch_up_seconds_total",
    'gpuledger_read_lane_wait_seconds_total{lane="live"}',
)
"""The server's own split of a cold read's time: the projection's catch-up for it, its wait for
a thread of the read pool's live lane."""
PENDING = 10_000
QUEUE = "/ui/api/queue?state=queued&sort=order&descending=false&offset=0&limit=100"


def build_home(home: Path) -> str:
    """The scale tests' `deep` home (once; kept with its root token in `bench.json`)."""
    marker = home.parent / "bench.json"
    if marker.exists():
        token: str = json.loads(marker.read_text())["token"]
        return token
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.integration.dashkit import with_pending
    from tests.integration.serverkit import cli, make_token

    _, _, first = with_pending(home, days=2.0, pending=PENDING, at=time.time() - 60)
    for job in (first, first + 1, first + 7):
        cli(home, "hold", str(job), GPULEDGER_USER="root")
    token = make_token(home, "--user", "root")
    marker.write_text(json.dumps({"token": token}))
    return token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--nice", type=int, default=None, help="the server's nice level (default: the bench's)"
    )
    args = ap.parse_args()
    home = args.dir / "ledger"
    token = build_home(home)
    load0 = os.getloadavg()[0]
    server = Serve(
        home, args.dir / "serve.log", "--interval", "5s", "--squat-after", "1s", nice=args.nice
    )
    try:
        deadline = time.monotonic() + 600
        while json.loads(server.call("GET", "/v1/health")[1])["cycles"] < 1:
            if time.monotonic() > deadline:
                raise SystemExit("error: no cycle in 600 s")
            time.sleep(0.2)

        def read() -> tuple[float, float, int]:
            c0 = server.cpu()
            status, body, ms = server.call("GET", QUEUE, token=token)
            assert status == 200, (status, body[:300])
            return ms, (server.cpu() - c0) * 1000, json.loads(body)["total"]

        first = read()
        status, body, _ = server.call("GET", "/ui/api/queue?state=pending&limit=1", token=token)
        pending = json.loads(body)["total"]  # the last pending job (not a held one): moved
        status, body, _ = server.call(
            "GET", f"/ui/api/queue?state=pending&limit=1&offset={pending - 1}", token=token
        )
        last = json.loads(body)["rows"][-1]["row"]["job_id"]

        def counted() -> list[float]:  # (a scrape before the move: it makes no preview of it)
            text = server.call("GET", "/metrics", token=token)[1].decode()
            got = dict(
                line.rsplit(" ", 1) for line in text.splitlines() if line.startswith(COUNTERS)
            )
            return [float(got.get(name, 0.0)) for name in COUNTERS]

        cold, warm, split = [], [], []
        for _ in range(args.repeat):
            before = counted()
            for tag in ("hold", "release"):
                body = json.dumps({"actor": "root", "job_id": last}).encode()
                status, out, _ = server.call("POST", f"/v1/commands/{tag}", body, token)
                assert status == 200, (tag, status, out[:300])
            cold.append(read())
            split.append([(b - a) * 1000 for a, b in zip(before, counted(), strict=True)])
            warm.append(read())
    finally:
        server.stop()
    load1 = os.getloadavg()[0]
    nice = os.getpriority(os.PRIO_PROCESS, 0) if args.nice is None else args.nice
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"machine: {machine()}; {when}; load {load0:.1f} -> {load1:.1f}; "
          f"{first[2]:,} queued; server at nice {nice}")  # fmt: skip
    print(f"{'read':<6} {'wall ms':>9} {'max':>7} {'server CPU ms':>14} {'wall / 300 ms':>14}")
    print(f"{'first':<6} {first[0]:>9.0f} {'':>7} {first[1]:>14.0f} {first[0] / GOAL_MS:>14.2f}")
    for name, got in (("cold", cold), ("warm", warm)):
        wall = statistics.median(g[0] for g in got)
        print(
            f"{name:<6} {wall:>9.0f} {max(g[0] for g in got):>7.0f} "
            f"{statistics.median(g[1] for g in got):>14.0f} {wall / GOAL_MS:>14.2f}"
        )
    catch_up, lane = (sorted(round(x[i]) for x in split) for i in range(2))
    print(
        f"cold reads' projection catch-up ms: {catch_up}; wait for a live lane's thread ms: {lane}"
    )


if __name__ == "__main__":
    main()
