"""Benchmark: one decision replayed behind a long history (goal <= 1 s at 5M events).

On a copy of a history made by `scripts/bench_history.py` (its store and caught-up projection):
a live ledger appends one real fair-share decision (50 one-GPU jobs); a walk over the log stores
replay checkpoints (`ledger.history.checkpoints.CHECKPOINT_EVERY`); then that decision is
replayed three times as `gpuledger replay --cycle` does it: from the nearest checkpoint that
verifies, ranked from the data directory's projection read as of its position. Prints the tail
folded and the times.

    python scripts/bench_one_decision.py /tmp/gpuledger-history/1000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from ledger.cycle.dispatcher import Dispatcher, ProjectionRanks
from ledger.dispatch import registry
from ledger.history import checkpoints as ck
from ledger.history import replay
from ledger.sim.kernel import KernelExecutor
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from ledger.store.snapshots import state_key
from projections.projector import Projector
from projections.store import PROJECTIONS_DIR, Store
from schemas import commands as c

GOAL_S = 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "history",
        type=Path,
        help="a history's data directory made by scripts/bench_history.py --dir DIR "
        "(DIR/<events>, e.g. DIR/1000000); it is copied, never changed",
    )
    src = ap.parse_args().history
    if not (src / "events.sqlite").is_file() or not (src / PROJECTIONS_DIR).is_dir():
        ap.error(f"{src} holds no history of scripts/bench_history.py (events.sqlite, projections)")
    tmp = Path(tempfile.mkdtemp(prefix="one-decision-"))
    try:
        for f in src.glob("events.sqlite*"):
            shutil.copy(f, tmp / f.name)
        shutil.copytree(src / PROJECTIONS_DIR, tmp / PROJECTIONS_DIR)
        clock = SimClock(1_000_000.0)
        ledger = Ledger(tmp, clock, seeded_ids(5), live=True)
        ((_, last),) = ledger.read(ledger.position - 1, 1)
        clock.advance_to(last.at + 60)
        submit = c.SubmitJob(actor="user0_0_0", account="prog0/proj0", gpus=1, min_runtime_s=600)
        ledger.execute_all([submit] * 50)
        policy = registry.build()
        with Store.open(tmp) as store:
            ranks = ProjectionRanks(Projector(store, EmbeddedSource(tmp)))
            Dispatcher(ledger, ranks, policy, KernelExecutor()).cycle(clock.now())
        ledger.close()
        # the decision just made (the synthetic history's own records name another version)
        decisions = [d for d in replay.find_decisions(tmp) if d[1].policy_version == policy.version]
        position, rec = decisions[-1]
        checkpoints = ck.Checkpoints(tmp / ck.CHECKPOINTS_DB, state_key(tmp))
        t0 = time.perf_counter()
        with EmbeddedSource(tmp) as source, replay.Replayer(source, checkpoints=checkpoints) as rp:
            rp.advance(rec.based_on - 1)
        print(f"walk storing checkpoints: {time.perf_counter() - t0:.1f} s")
        near = max(p for p in checkpoints.positions() if p <= rec.based_on)
        times, cpus, results = [], [], []
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            results += list(replay.replay_found(tmp, [(position, rec)]))
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        best = min(times)
        print(
            f"one decision behind {rec.based_on:,} events (checkpoint {near:,}, tail "
            f"{rec.based_on - near:,} events): best {best:.2f} s, times "
            f"{', '.join(f'{t:.2f}' for t in times)}; identical {all(r.identical for r in results)}"
            f"; goal <= {GOAL_S:g} s: ratio {best / GOAL_S:.2f}"
        )
        print(
            f"  CPU time (all threads): best {min(cpus):.2f} s; goal <= {GOAL_S:g} s: "
            f"ratio {min(cpus) / GOAL_S:.2f} (load {os.getloadavg()[0]:.1f})"
        )
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
