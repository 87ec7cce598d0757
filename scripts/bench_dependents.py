"""Benchmark: a job's end with many pending dependents (`ledger.core.jobs.dependents_ended`).

Builds a state through the pure domain (decide + evolve): `--kept` ends kept for dependencies
(jobs that ended within `ENDS_KEPT_S`, written into the state's kept ends), one pending job X
and `--dependents` pending jobs that each depend `afterok` on X; then times `decide` of X's
cancel, which ends every dependent (`dependency_never_satisfied`). Prints the time per size and
how many reads of the kept ends the decision made.

    python scripts/bench_dependents.py --kept 20000 --dependents 1000 5000 10000
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from schemas import commands as c
from schemas import events as e

T0 = 1_000_000.0


class CountingEnds(dict[int, Any]):
    """Kept ends counting the entries read (a walk reads them all)."""

    read = 0

    def get(self, *args: Any) -> Any:
        self.read += 1
        return super().get(*args)

    def items(self) -> Any:
        self.read += len(self)
        return super().items()


def state_with(kept: int, dependents: int) -> tuple[State, int]:
    ids = (lambda n: lambda: f"b{next(n)}")(itertools.count(1))
    state = State()

    def run(cmd: c.AnyCommand) -> list[e.AnyEvent]:
        events = decide(state, cmd, T0, ids)
        for ev in events:
            evolve(state, ev)
        return events

    run(c.InitLedger(actor="root", admin="root"))
    run(c.OpenAccount(actor="root", path="p", kind="program"))
    run(c.OpenAccount(actor="root", path="p/q", kind="project", shares=1))
    run(c.AddMember(actor="root", user="alice", project="p/q"))
    run(c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8))
    (x,) = run(c.SubmitJob(actor="alice", account="p/q", gpus=1))
    assert isinstance(x, e.JobSubmitted)
    for i in range(kept):  # ends of jobs that never lived in this state: only their ends count
        state.ends[10_000_000 + i] = ("completed" if i % 3 else "failed", T0, None)
    term = e.Dependency(kind="afterok", job_ids=(x.job_id,))
    for _ in range(dependents):
        run(c.SubmitJob(actor="alice", account="p/q", gpus=1, dependency=(term,)))
    return state, x.job_id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kept", type=int, default=20_000, help="ends kept for dependencies")
    ap.add_argument("--dependents", type=int, nargs="+", default=[1_000, 5_000, 10_000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"kept ends {args.kept:,}")
    for n in args.dependents:
        state, x = state_with(args.kept, n)
        ends = CountingEnds(state.ends)
        state.ends = ends
        best = float("inf")
        for _ in range(args.repeat):
            ends.read = 0
            t0 = time.perf_counter()
            events = decide(state, c.CancelJob(actor="alice", job_id=x), T0, lambda: "id")
            best = min(best, time.perf_counter() - t0)
        ended = sum(isinstance(ev, e.JobFinished) for ev in events) - 1
        assert ended == n, (ended, n)
        print(
            f"dependents {n:>7,}: decide {best * 1000:9.1f} ms (best of {args.repeat}), "
            f"kept ends read {ends.read:,}"
        )


if __name__ == "__main__":
    main()
