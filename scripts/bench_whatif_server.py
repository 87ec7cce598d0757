"""Benchmark: the Budget review's what-if through the server at 9,000 pending, as the page asks it
(issue 29: within the server's 300 s limit; atk54-29 F2), with the ratio to the limit.

    python scripts/bench_whatif_server.py --dir DIR [--nice 0] [--budgets FILE]

DIR/ledger is made once and kept (never commit it): `dashkit.build(days=28, seed=3, load=2)`
(4 weeks of a simulated busy cluster ending half a day ago, then live work) plus 9,000 pending
submissions a second apart ending a minute before (`pending_submissions`, as the scale tests
append theirs): the home atk53-29 called `hbig` (~25k events). `boss` is made manager of the
budgets file's account's program and given a token. The home is served by `gpuledger serve
--executor record` with `GPULEDGER_WHATIF_TIMEOUT=1500` (so a slow answer is timed, not cut at
300 s), at `--nice N` (absolute; the bench's own level by default), and one `POST
/ui/api/budget/whatif` of the budgets file's one account and shares (default
`scripts/bench_whatif_t01.toml`: prog1/team01, shares 9) is timed to its answer, as its manager.
Every 2 s meanwhile: the machine's load and the what-if child's nice level, scheduling policy
and CPU from /proc. Prints the wall time and its ratio to the 300 s limit, the child's CPU and
its ratio, the child's level and the load's range.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import tomllib
from pathlib import Path

from bench_whatif_reads import priority_of, whatif_child
from benchkit import Serve, machine

LIMIT_S = 300.0
PENDING = 9_000
MANAGER = "boss"


def build_home(home: Path, account: str) -> str:
    """The `hbig` home (once; kept with the manager's token in `bench.json` beside it)."""
    marker = home.parent / "bench.json"
    if marker.exists():
        token: str = json.loads(marker.read_text())["token"]
        return token
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.integration.dashkit import with_pending
    from tests.integration.serverkit import cli, make_token

    with_pending(home, days=28.0, pending=PENDING, at=time.time() - 60)
    cli(home, "manager", "grant", MANAGER, account.split("/")[0], GPULEDGER_USER="root")
    token = make_token(home, "--user", MANAGER)
    marker.write_text(json.dumps({"token": token}))
    return token


def cpu_of(pid: int) -> float | None:
    """CPU seconds (user + system) of `pid` so far (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument(
        "--nice", type=int, default=None, help="the server's nice level (default: the bench's)"
    )
    ap.add_argument(
        "--budgets", type=Path, default=Path(__file__).resolve().parent / "bench_whatif_t01.toml",
        help="the what-if's budgets file: one account and its shares",
    )  # fmt: skip
    args = ap.parse_args()
    accounts = tomllib.loads(args.budgets.read_text())["accounts"]
    if len(accounts) != 1:
        raise SystemExit(f"error: {args.budgets} names {len(accounts)} accounts; the page asks one")
    ((account, spec),) = accounts.items()
    home = args.dir / "ledger"
    token = build_home(home, account)
    server = Serve(home, args.dir / "serve.log", "--executor", "record", nice=args.nice,
                   env={"GPULEDGER_WHATIF_TIMEOUT": "1500"})  # fmt: skip
    loads = [os.getloadavg()[0]]
    child: dict[str, object] = {}
    done = threading.Event()

    def watch() -> None:  # the child's level and CPU, the load, every 2 s
        while not done.wait(2.0):
            loads.append(os.getloadavg()[0])
            pid = whatif_child(server.proc.pid)
            if pid is None:
                continue
            child["pid"], child["priority"] = pid, priority_of(pid) or child.get("priority")
            child["cpu"] = cpu_of(pid) or child.get("cpu")

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        asked = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        body = json.dumps({"account": account, "shares": spec["shares"]}).encode()
        watcher.start()
        status, out, ms = server.call("POST", "/ui/api/budget/whatif", body, token, timeout=1800)
    finally:
        done.set()
        watcher.join()
        server.stop()
    loads.append(os.getloadavg()[0])
    wall = ms / 1000
    cpu = child.get("cpu")
    nice = os.getpriority(os.PRIO_PROCESS, 0) if args.nice is None else args.nice
    print(f"machine: {machine()}; asked {asked}; server at nice {nice}; "
          f"{account} shares -> {spec['shares']}")  # fmt: skip
    detail = "" if status == 200 else f": {out[:300]!r}"
    print(f"status {status}{detail}")
    print(f"wall {wall:.1f} s ({wall / LIMIT_S:.2f}x the {LIMIT_S:.0f} s limit); child CPU "
          + (f"{cpu:.1f} s ({cpu / LIMIT_S:.2f}x)" if isinstance(cpu, float) else "not seen")
          + f"; child (nice, policy) {child.get('priority')}; "
          f"load {min(loads):.1f}-{max(loads):.1f}")  # fmt: skip
    if status == 200:
        rep = json.loads(out)["report"]
        print(f"report: {rep['submissions']:,} submissions, {rep['cycles']:,} cycles, "
              f"step {rep['step_s']} s, policy {rep['policy_version']}")  # fmt: skip


if __name__ == "__main__":
    main()
