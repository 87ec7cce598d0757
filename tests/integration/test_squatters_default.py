"""`gpuledger squatters` without --after or --threshold asks the service's own squatting rule:
the settings it recorded (`serve --squat-after`, the policy's threshold), as the Nodes page
does; not a fixed 1 h."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli import cli
from ledger.cycle.dispatcher import Dispatcher, ProjectionRanks
from ledger.cycle.record import SERVICE
from ledger.dispatch import registry
from ledger.sim.kernel import KernelExecutor
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c

ADMIN = "root"
USER = "alice"
IDLE_FROM = 1_000.0
"""When job 1's GPUs went idle (its only sample: 0 %)."""


def build(home: Path, squat_after_s: float | None, util_pct: float | None = None) -> None:
    clock = SimClock(0.0)
    ledger = Ledger(home, clock, seeded_ids(3))
    ledger.execute(c.InitLedger(actor=ADMIN, admin=ADMIN))
    knobs: dict[str, object] = {}
    if squat_after_s is not None:
        knobs["squat_after_s"] = squat_after_s
    if util_pct is not None:
        knobs["squat_util_pct"] = util_pct
    policy = registry.build("fairshare", knobs)
    ledger.execute_all(
        [
            c.OpenAccount(actor=ADMIN, path="lab", kind="program", shares=1),
            c.OpenAccount(actor=ADMIN, path="lab/a", kind="project", shares=1),
            c.AddMember(actor=ADMIN, user=USER, project="lab/a", shares=1),
            c.RegisterNode(actor=ADMIN, node="n1", gpu_type="h100", gpus=8),
        ]
    )
    if knobs:  # as `serve --squat-after` records it; else no service ever recorded a rule
        ledger.execute(
            c.ConfigureService(
                actor=SERVICE, policy=registry.config_of(policy), interval_s=1.0, executor="none"
            )
        )
    ledger.execute(c.SubmitJob(actor=USER, account="lab/a", gpus=8, min_runtime_s=0))
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        Dispatcher(
            ledger, ProjectionRanks(Projector(store, source)), policy, KernelExecutor()
        ).cycle(0.0)
    assert ledger.state.jobs[1].status in ("placed", "running")
    clock.advance_to(IDLE_FROM)
    ledger.execute(c.SampleUtilisation(actor="@executor", job_id=1, gpu_utilisation=(3.0,) * 8))


def squatting(home: Path, at: float, *args: str) -> list[int]:
    out = CliRunner().invoke(
        cli, ["--home", str(home), "squatters", "--json", "--at", str(at), *args]
    )
    assert out.exit_code == 0, out.output
    return [r["job_id"] for r in json.loads(out.output)]


@pytest.mark.parametrize("recorded", [600.0, 7_200.0])
def test_squatters_take_the_recorded_squat_after(tmp_path: Path, recorded: float) -> None:
    build(tmp_path, recorded)
    for at in (IDLE_FROM + 300, IDLE_FROM + 1_200, IDLE_FROM + 5_400, IDLE_FROM + 9_000):
        want = [1] if at - IDLE_FROM >= recorded else []
        assert squatting(tmp_path, at) == want, (at, recorded)
    # an explicit --after still wins over the recorded rule
    assert squatting(tmp_path, IDLE_FROM + 1_200, "--after", "2h") == []
    assert squatting(tmp_path, IDLE_FROM + 1_200, "--after", "10m") == [1]


def test_squatters_take_the_recorded_threshold(tmp_path: Path) -> None:
    build(tmp_path, 600.0, util_pct=2.0)  # the job's 3 % is not idle by this rule
    assert squatting(tmp_path, IDLE_FROM + 1_200) == []
    assert squatting(tmp_path, IDLE_FROM + 1_200, "--threshold", "5") == [1]


def test_squatters_without_recorded_settings_use_one_hour(tmp_path: Path) -> None:
    build(tmp_path, None)
    assert squatting(tmp_path, IDLE_FROM + 1_200) == []
    assert squatting(tmp_path, IDLE_FROM + 3_700) == [1]
