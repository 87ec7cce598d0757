"""Others' reads while a what-if runs (issue #29, atk52-29 F2): one person reads pages in a loop
while another asks the Budget review's what-if, against the same reads with no what-if under
way, with the server at each nice level given (`--nice 0,19`).

    python scripts/bench_whatif_reads.py --home HOME [--nice 0,19] [--idle 40] [--rounds 2]

HOME: a ledger with weeks of history (the dashboard tests' `dashkit.build(days=28, seed=3,
load=2)`: `python scripts/bench_whatif_reads.py --build --home HOME` makes one), served by
`gpuledger serve --executor record` at each nice level in turn (as root a level below the
bench's own may be given). Per level and round: `--idle` seconds of reads with nothing else,
then one what-if (`POST /ui/api/budget/whatif` as root, a program's child's shares changed)
with the reads beside it until it answers. The reader is a plain member, one read at a time,
each a page no answer is kept for (`/v1/jobs` before a moving job id, the queue and the
finished jobs at a moving offset). A read counts as "during" when the what-if's child process
ran at its start and its end, "idle" when no what-if was asked. Prints per level the reads'
median and p90 wall time in each phase and their ratio, the what-if's wall time and the
child's nice level and scheduling policy as it ran.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchkit import Serve, machine

from ledger.core import tokens
from ledger.store.application import Ledger
from ledger.store.clock import new_token_secret

POLICIES = {0: "SCHED_OTHER", 3: "SCHED_BATCH", 5: "SCHED_IDLE"}


def prepare(home: Path) -> dict[str, str]:
    """Tokens for root and one plain member (once per home), the member's name, the account
    to ask about and its new shares."""
    marker = home / "bench-whatif.json"
    if marker.exists():
        info: dict[str, str] = json.loads(marker.read_text())
        return info
    ledger = Ledger(home)
    try:
        state = ledger.state
        member = sorted(u for us in state.members.values() for u in us)[0]
        kids = sorted(a for a, acc in state.accounts.items()
                      if acc.parent is not None and "/" not in acc.parent and acc.open)  # fmt: skip
        account = kids[0]
        shares = state.accounts[account].shares + 3
        out = {"member": member, "account": account, "shares": str(shares)}
        for who in ("root", member):
            secret = new_token_secret()
            ledger.execute(tokens.issue("root", who, secret, name=f"bench-whatif-{who}"))
            out[who if who == "root" else "reader"] = secret
    finally:
        ledger.close()
    marker.write_text(json.dumps(out))
    return out


def whatif_child(server: int) -> int | None:
    """The pid of the server's what-if child, None when none runs."""
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == server and b"ledger.server.whatifs" in cmd:
            return int(proc.name)
    return None


def priority_of(pid: int) -> tuple[int, str] | None:
    """The nice level and the scheduling policy of `pid` (None once it is gone)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, pid), POLICIES.get(os.sched_getscheduler(pid), "?")
    except OSError:
        return None


def level(
    home: Path, info: dict[str, str], nice: int, idle_s: float, rounds: int
) -> dict[str, Any]:
    server = Serve(home, home / f"bench-whatif-serve-{nice}.log", "--executor", "record",
                   nice=nice, env={"GPULEDGER_WHATIF_TIMEOUT": "3600"})  # fmt: skip
    samples: dict[str, list[float]] = {"idle": [], "during": []}
    whatifs: list[float] = []
    seen: set[tuple[int, str]] = set()
    stop = threading.Event()
    asked = threading.Event()
    try:
        status, jobs = server.request("GET", "/v1/jobs?limit=1", token=info["reader"])
        assert status == 200, (status, jobs)
        top = int(jobs[0]["job_id"]) if jobs else 1000

        def reader() -> None:
            for i in itertools.count():
                if stop.is_set():
                    return
                path = (
                    f"/v1/jobs?limit=500&before_id={top - (i * 37) % max(1, top - 1)}",
                    f"/ui/api/queue?state=all&limit=100&offset={(i * 7) % 200}",
                    f"/ui/api/finished?limit=100&offset={(i * 11) % 2000}",
                )[i % 3]
                child = whatif_child(server.proc.pid)
                was = asked.is_set()
                status, _, ms = server.call("GET", path, token=info["reader"])
                assert status in (200, 429), (status, path)
                if status != 200:
                    time.sleep(0.2)
                    continue
                if child is not None and whatif_child(server.proc.pid) == child:
                    samples["during"].append(ms)
                    got = priority_of(child)
                    if got is not None:
                        seen.add(got)
                elif not was and not asked.is_set():
                    samples["idle"].append(ms)

        reading = threading.Thread(target=reader, daemon=True)
        reading.start()
        body = json.dumps({"account": info["account"], "shares": int(info["shares"])}).encode()
        for _ in range(rounds):
            time.sleep(idle_s)
            asked.set()
            status, raw, ms = server.call("POST", "/ui/api/budget/whatif", body, info["root"],
                                          timeout=3600)  # fmt: skip
            assert status == 200, (status, raw[:300])
            whatifs.append(ms / 1000)
            time.sleep(1.0)  # the child gone, the reads after it counted as idle again
            asked.clear()
        stop.set()
        reading.join(60)
    finally:
        server.stop()
    return {"samples": samples, "whatifs": whatifs, "child": sorted(seen)}


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10)[-1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--build", action="store_true", help="make HOME (dashkit, 28 days) first")
    ap.add_argument("--nice", default="0,19", help="the server's nice levels, in turn")
    ap.add_argument("--idle", type=float, default=40.0, help="seconds of reads alone per round")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.build:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.integration.dashkit import build

        build(args.home, days=28.0, seed=3, load=2)
    info = prepare(args.home)
    print(f"machine: {machine()}; home {args.home}; {info['account']} shares -> "
          f"{info['shares']}; reader {info['member']}", flush=True)  # fmt: skip
    for nice in (int(x) for x in args.nice.split(",")):
        load0 = os.getloadavg()[0]
        r = level(args.home, info, nice, args.idle, args.rounds)
        load1 = os.getloadavg()[0]
        idle, during = r["samples"]["idle"], r["samples"]["during"]
        mi, md = statistics.median(idle), statistics.median(during)
        print(
            f"server nice {nice:>2} (load {load0:.1f}-{load1:.1f}): reads alone median "
            f"{mi:.0f} ms, p90 {p90(idle):.0f} ms ({len(idle)}); beside a what-if median "
            f"{md:.0f} ms, p90 {p90(during):.0f} ms ({len(during)}): ratio {md / mi:.2f} "
            f"(p90 {p90(during) / p90(idle):.2f}); what-ifs "
            f"{', '.join(f'{s:.1f} s' for s in r['whatifs'])}; child {r['child']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
