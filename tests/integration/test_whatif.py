"""The what-if through the CLI over a recorded history in which the organisation changed during
the period: an account opened in another program (with a member who then submits) and a share
change. The what-if of no change equals what happened, team by team and measure by measure; a
real share change differs only in what the shares decide (owed GPU-hours of the changed
account's program), everything else as recorded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from ledger.cli import cli
from ledger.cycle.dispatcher import Dispatcher, ProjectionRanks
from ledger.dispatch.policy import FairShare
from ledger.sim import whatif as wi
from ledger.sim.kernel import KernelExecutor
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c
from schemas.units import when

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
START, END = T0 + 500, T0 + 10_000
"""The what-if's period: from after the organisation was set up to after the last change."""


def job(user: str, account: str, gpus: int, duration_s: float) -> c.SubmitJob:
    return c.SubmitJob(
        actor=user, account=account, gpus=gpus, min_runtime_s=600, duration_s=duration_s
    )


def record(home: Path) -> None:
    """Two programs on 16 GPUs, demand never above them (nothing waits, so the what-if places
    as the record did); during the period `lab/speech` is opened with a member who submits,
    and `ai2/tulu`'s shares change. Every time is a multiple of the 500 s cycle."""
    clock = SimClock(T0)
    ledger = Ledger(home, clock, seeded_ids(3))
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    steps: list[tuple[float, list[c.AnyCommand]]] = [
        (
            0,
            [
                c.OpenAccount(actor="root", path="ai2", kind="program"),
                c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
                c.OpenAccount(actor="root", path="ai2/tulu", kind="project"),
                c.OpenAccount(actor="root", path="lab", kind="program"),
                c.OpenAccount(actor="root", path="lab/vision", kind="project"),
                c.AddMember(actor="root", user="alice", project="ai2/olmo"),
                c.AddMember(actor="root", user="dan", project="ai2/tulu"),
                c.AddMember(actor="root", user="erin", project="lab/vision"),
                c.RegisterNode(actor="root", node="n0", gpu_type="h100", gpus=8),
                c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
            ],
        ),
        (1_000, [job("alice", "ai2/olmo", 6, 6_000), job("dan", "ai2/tulu", 4, 4_000)]),
        (
            3_000,  # elsewhere in the tree: not under ai2, whose shares the change is about
            [
                c.OpenAccount(actor="root", path="lab/speech", kind="project", shares=2),
                c.AddMember(actor="root", user="frank", project="lab/speech", shares=3),
            ],
        ),
        (3_500, [job("frank", "lab/speech", 4, 3_000), job("erin", "lab/vision", 2, 5_000)]),
        (5_000, [c.SetShares(actor="root", account="ai2/tulu", shares=3, reason="quarter")]),
        (7_500, [job("alice", "ai2/olmo", 2, 2_000)]),
    ]
    try:
        with Store(":memory:") as store, EmbeddedSource(home) as source:
            dispatcher = Dispatcher(
                ledger, ProjectionRanks(Projector(store, source)), FairShare(), KernelExecutor()
            )
            for t in range(0, int(END - T0) + 1, 500):
                clock.advance_to(T0 + t)
                while steps and steps[0][0] <= t:
                    ledger.execute_all(steps.pop(0)[1])
                dispatcher.cycle(T0 + t)
    finally:
        ledger.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("recorded")
    record(home)
    yield home


def whatif(home: Path, *args: str) -> dict[str, Any]:
    out = CliRunner().invoke(
        cli,
        ["--home", str(home), "whatif", "--from", str(START), "--to", str(END), "--json", *args],
    )
    assert out.exit_code == 0, out.output
    report: dict[str, Any] = msgspec.json.decode(out.output.encode())
    return report


def test_a_what_if_of_no_change_is_what_happened(recorded: Path) -> None:
    report = whatif(recorded)
    teams = {t["team"]: t for t in report["teams"]}
    assert set(teams) == {"ai2/olmo", "ai2/tulu", "lab/speech", "lab/vision"}
    assert teams["lab/speech"]["actual"]["delivered_gpu_h"] == pytest.approx(4 * 3_000 / 3_600)
    assert teams["lab/speech"]["actual"]["owed_gpu_h"] > 0
    assert {t: d["whatif"] for t, d in teams.items()} == {t: d["actual"] for t, d in teams.items()}
    assert report["notes"] == []
    assert (report["submissions"], report["carried"]) == (5, 0)


def test_a_share_change_differs_only_where_the_shares_decide(
    recorded: Path, tmp_path: Path
) -> None:
    budgets = tmp_path / "budgets.toml"
    budgets.write_text('[accounts."ai2/olmo"]\nkind = "project"\nshares = 3\n')
    teams = {t["team"]: t for t in whatif(recorded, "--budgets", str(budgets))["teams"]}
    differ = {
        (team, measure)
        for team, d in teams.items()
        for measure, value in d["actual"].items()
        if d["whatif"][measure] != pytest.approx(value)
    }
    # olmo owed more (3 of 4 shares, then 3 of 6 after tulu's recorded change), tulu less;
    # nothing waited either way, so only the owed hours (and delivered/owed) move
    assert {team for team, _ in differ} == {"ai2/olmo", "ai2/tulu"}, differ
    assert {measure for _, measure in differ} <= {"owed_gpu_h", "by_period"}, differ
    olmo, tulu = teams["ai2/olmo"], teams["ai2/tulu"]
    assert olmo["whatif"]["owed_gpu_h"] > olmo["actual"]["owed_gpu_h"]
    assert tulu["whatif"]["owed_gpu_h"] < tulu["actual"]["owed_gpu_h"]


def test_a_notes_time_is_a_time_not_a_raw_epoch(recorded: Path, tmp_path: Path) -> None:
    """atk48-29 F11: the what-if's notes said `t=1.79646e+09: the recorded shares ...` (an
    epoch with six digits, 1,000 s off), on the CLI and the Budget review page."""
    budgets = tmp_path / "budgets.toml"
    budgets.write_text('[accounts."ai2/tulu"]\nkind = "project"\nshares = 2\n')
    (note,) = whatif(recorded, "--budgets", str(budgets))["notes"]
    assert note.startswith(f"{when(T0 + 5_000)}: the recorded shares 3 of ai2/tulu"), note


def test_a_what_if_decided_every_step_waits_for_its_moments_and_says_so(recorded: Path) -> None:
    """atk48-29 F2: `--step` (what the Budget review page runs, a minute) decides only at the
    moments START + k * step, not at every submission and exit, so a deep queue costs a decision
    a step, not one an event. Here the submissions at T0 + 1,000 (START + 500) wait for the
    moment START + 1,000; those on a moment are placed at once; the work is the same."""
    plain = whatif(recorded)
    stepped = whatif(recorded, "--step", "1000s")
    assert stepped["step_s"] == 1000 and plain["step_s"] is None
    assert stepped["notes"] == [
        "the what-if decided every 1000 s of the period, not at every submission or exit: a job "
        "waited at least until the next such moment (up to 1000 s more than a decision at once "
        "would have made it wait), and GPUs freed in between stayed free until then"
    ]
    assert stepped["cycles"] <= 4 * (END - START) / 1000 and stepped["cycles"] <= plain["cycles"]
    waits = {t["team"]: t["whatif"]["mean_wait_s"] for t in stepped["teams"]}
    assert waits == {"ai2/olmo": 250.0, "ai2/tulu": 500.0, "lab/speech": 0.0, "lab/vision": 0.0}
    assert {t["team"]: t["whatif"]["delivered_gpu_h"] for t in stepped["teams"]} == pytest.approx(
        {t["team"]: t["actual"]["delivered_gpu_h"] for t in plain["teams"]}
    )
    refused = CliRunner().invoke(cli, ["--home", str(recorded), "whatif", "--from", str(START),
                                       "--to", str(END), "--step", "0"])  # fmt: skip
    assert refused.exit_code != 0 and "--step" in refused.output, refused.output


def test_a_what_if_is_compared_with_the_same_simulation_of_no_change(
    recorded: Path, tmp_path: Path
) -> None:
    """atk49-29 F1: the what-if was compared with what happened, so the simulation's own gap
    from history (here: deciding every 1,000 s makes ai2's jobs wait, which they did not) was
    shown as the change's effect. Now the same simulation with no change is run too (same
    step) and is what the what-if is compared with: a change of nothing shows no difference,
    what happened stays beside it, and the output says what is compared."""
    budgets = tmp_path / "budgets.toml"  # lab/vision's shares as they are: no change
    budgets.write_text('[accounts."lab/vision"]\nkind = "project"\nshares = 1\n')
    report = whatif(recorded, "--budgets", str(budgets), "--step", "1000s")
    assert report["compared"].startswith("the what-if against the same simulation with no change")
    teams = {t["team"]: t for t in report["teams"]}
    assert {t: d["baseline"] for t, d in teams.items()} == {
        t: d["whatif"] for t, d in teams.items()
    }
    olmo = teams["ai2/olmo"]
    assert (olmo["actual"]["mean_wait_s"], olmo["whatif"]["mean_wait_s"]) == (0.0, 250.0)
    out = CliRunner().invoke(cli, ["--home", str(recorded), "whatif", "--from", str(START),
                                   "--to", str(END), "--budgets", str(budgets), "--step",
                                   "1000s"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "compared: the what-if against the same simulation with no change" in out.output
    table = out.output.split("no change -> what-if")[1].split("note:")[0]
    assert "delivered: happened" in table and "->" not in table, out.output
    plain = whatif(recorded)  # no change asked: the simulation against what happened, said
    assert plain["compared"].startswith("the simulation of the period with no change against")
    assert all(t["baseline"] is None for t in plain["teams"])


def test_a_step_not_shorter_than_the_period_is_refused_in_one_line(recorded: Path) -> None:
    """atk49-29 F5: `--step 30d` over a 28-day period answered 0 cycles and every job never
    placed; a step of at least the period is refused, in one line naming the period."""
    for step in ("9500s", "30d"):  # the period is 9,500 s
        out = CliRunner().invoke(cli, ["--home", str(recorded), "whatif", "--from", str(START),
                                       "--to", str(END), "--step", step])  # fmt: skip
        assert out.exit_code != 0, out.output
        assert f"--step {step} is not shorter than the period (2h38m)" in out.output, out.output
    assert wi.step_note(2_419_200.0).startswith("the what-if decided every 2419200 s of the")
    half = CliRunner().invoke(cli, ["--home", str(recorded), "whatif", "--from", str(START),
                                    "--to", str(END), "--step", "0.5s"])  # fmt: skip
    assert half.exit_code != 0 and "contract" not in half.output, half.output
