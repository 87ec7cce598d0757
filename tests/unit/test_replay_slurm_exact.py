"""`replay --all --exact` on the logs a service on Slurm writes (atk62b G3): the same log gives
the same decisions, byte for byte.

- A cycle on Slurm counts a run's contract and time limit from Slurm's start (whole seconds),
  not from its placement: the replay counted them from the placement, so the decision's
  `wake_at` differed (recorded 1796637635.0, replayed 1796637634.64). It counts as its cycle
  did now, from the service's recorded executor (`replay.on_slurm`).
- A cycle held a job over the MaxTime its engine had just read (again, at a take-back), and
  recorded that MaxTime only after it; the replay read no MaxTime at all and placed the job.
  Now a cycle records the MaxTime it observed before it decides, and decides with the one
  recorded (`dispatcher.decided_longest`), as the replay does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ledger.core.state import Node
from ledger.cycle.dispatcher import Dispatcher
from ledger.cycle.executor import Observed, Orders, Start
from ledger.dispatch.policy import Fifo
from ledger.history.replay import replay_decisions
from ledger.store.application import Ledger
from ledger.store.clock import SimClock
from ledger.store.embedded import EmbeddedSource
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas.policy import FifoConfig
from tests.unit.test_stopping_held import Engine, NoRanks, submit, tick, where


class Slurm(Engine):
    """Slurm as a cycle sees it: its runs start at Slurm's next whole second, its partition has
    a MaxTime (`longest_s`) an admin may change."""

    engine = "slurm"

    def __init__(self, longest_s: float | None) -> None:
        super().__init__()
        self.longest_s = longest_s
        self.starting: list[Start] = []

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        seen = super().observe(now, nodes)
        starts, self.starting = tuple(self.starting), []
        return Observed(starts=starts, stopped=seen.stopped, longest_s=self.longest_s)

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        """Slurm starts them at its next whole second, seen by the next cycle."""
        self.starting += [Start(s.job_id, s.engine_job_id, s.run, started_at=float(int(now) + 1))
                          for s in super().carry_out(orders, now)]  # fmt: skip
        return ()


def _on_slurm(ledger: Ledger, max_time_s: int | None) -> None:
    cmd = c.ConfigureService(actor="@service", policy=FifoConfig(), interval_s=1.0,
                             executor="slurm", grace_s=5, max_time_s=max_time_s)  # fmt: skip
    ledger.execute(cmd)


def _replayed(home: Path) -> list[str]:
    """The headlines and differences of every recorded decision that does not replay identically."""
    with EmbeddedSource(home) as source:
        decisions = [(r.position, ev) for r in source.read(0, 10_000)
                     if isinstance(ev := codec.decode(r.data), e.CycleDecided)]  # fmt: skip
        assert decisions
        return [r.headline() for r in replay_decisions(source, decisions) if not r.identical]


def test_a_wake_at_counted_from_slurms_start_replays_identically(
    org_ledger: Ledger, clock: SimClock, home: Path
) -> None:
    _on_slurm(org_ledger, None)
    clock.advance_to(clock.now() + 0.4)  # a placement between Slurm's whole seconds
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), Slurm(None), idle_record_s=0.0)  # type: ignore[arg-type]
    a = submit(org_ledger, 8, min_runtime_s=600)
    submit(org_ledger, 8, min_runtime_s=600)
    placed_at = clock.now()
    d.cycle(placed_at)
    waits = submit(org_ledger, 8)
    tick(clock)
    d.cycle(clock.now())
    assert org_ledger.state.jobs[a].started_at == float(int(placed_at) + 1)
    (on,) = {sl.node for sl in org_ledger.state.jobs[a].slots}
    org_ledger.execute(c.DrainNode(actor="root", node=on, reason="maintenance"))
    tick(clock)
    result = d.cycle(clock.now())  # wakes when a's contract, from Slurm's start, ends
    assert where(org_ledger, waits) == () and result.appended
    assert result.decision.wake_at == float(int(placed_at) + 1) + 600
    assert _replayed(home) == []


def test_a_cycle_decides_with_the_max_time_it_recorded_first_and_replays_identically(
    org_ledger: Ledger, clock: SimClock, home: Path
) -> None:
    _on_slurm(org_ledger, 180)
    engine = Slurm(180.0)
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    over = submit(org_ledger, 1, time_limit_s=181)  # over MaxTime 3m: never placed
    fits = submit(org_ledger, 1, time_limit_s=60)
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, over) == () and where(org_ledger, fits) != ()
    engine.longest_s = 120.0  # MaxTime lowered to 2m, read by this cycle
    lowered = submit(org_ledger, 1, time_limit_s=90)  # 90 s, its grace (5 s) and a minute
    small = submit(org_ledger, 1, time_limit_s=30)
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, lowered) == () and where(org_ledger, small) != ()
    events = [ev for _, ev in org_ledger.read(0, 10_000)]
    kinds = [type(ev).__name__ for ev in events if isinstance(ev, e.ServiceConfigured | e.CycleDecided)]  # fmt: skip  # noqa: E501
    assert kinds == ["ServiceConfigured", "CycleDecided", "ServiceConfigured", "CycleDecided"]
    assert org_ledger.state.max_time_s == 120  # recorded before the cycle that decided with it
    assert _replayed(home) == []
