"""Replay and what-if against real ledgers: a multi-cycle history with preemptions (fairness,
squatting, maintenance, the debug lane), requeues, drains and utilisation is replayed from the
log alone, decision by decision, and every decision is identical; a lying policy config, an
unknown policy version and the what-if loop are checked end to end."""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import duckdb
import msgspec
import pytest
from click.testing import CliRunner

from ledger.cli import cli
from ledger.cycle.dispatcher import Dispatcher, ProjectionRanks
from ledger.cycle.loop import record_settings
from ledger.dispatch.policy import FairShare, Policy
from ledger.dispatch.snapshot import PendingJob
from ledger.history import checkpoints as ck
from ledger.history import replay
from ledger.history.audit import check_history
from ledger.history.compare import decided_at
from ledger.history.replay import (
    Replayer,
    Selection,
    find_decisions,
    replay_decisions,
    replay_home,
)
from ledger.sim.kernel import KernelExecutor
from ledger.sim.scenario import scenario
from ledger.sim.whatif import simulate
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from ledger.store.snapshots import state_key
from projections.projector import Projector
from projections.store import Store, projection_path
from schemas import commands as c
from schemas import events as e
from schemas.errors import UnknownEntity
from schemas.policy import FairShareConfig, from_settings, settings

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
EXEC = "@executor"


def org(ledger: Ledger) -> None:
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=1),
            c.OpenAccount(actor="root", path="ai2/tulu", kind="project", shares=1),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.AddMember(actor="root", user="bob", project="ai2/olmo"),
            c.AddMember(actor="root", user="dan", project="ai2/tulu"),
            c.RegisterNode(actor="root", node="n0", gpu_type="h100", gpus=8),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )


def job(user: str, account: str, gpus: int, **kw: object) -> c.SubmitJob:
    return c.SubmitJob(actor=user, account=account, gpus=gpus, **kw)  # type: ignore[arg-type]


def build_history(home: Path, policy: Policy | None = None, *, service: bool = False) -> Ledger:
    """A day on two 8-GPU nodes: fair-share preemption and requeue, a squatter, a drain, the
    debug lane, unfunded work, a cancel, a share change and executor exits. `service`: the log
    records the service's settings first, as `serve` does."""
    clock = SimClock(T0)
    ledger = Ledger(home, clock, seeded_ids(7))
    org(ledger)
    if service:
        record_settings(
            ledger, policy or FairShare(squat_after_s=3_600), 500.0, "local", logging.getLogger()
        )
    steps: list[tuple[float, list[c.AnyCommand]]] = [
        # alice fills the cluster with two resumable jobs
        (
            0,
            [
                job("alice", "ai2/olmo", 8, min_runtime_s=600, resumable=True, duration_s=30_000),
                job("alice", "ai2/olmo", 8, min_runtime_s=600, duration_s=40_000),
            ],
        ),
        # dan's team has no usage: it outranks olmo past the contracts (fairness + requeue)
        (1_000, [job("dan", "ai2/tulu", 8, min_runtime_s=900, duration_s=3_000)]),
        (1_200, [job("bob", "ai2/olmo", 4, min_runtime_s=0, duration_s=50_000)]),  # unfunded
        (5_000, [job("bob", "ai2/olmo", 4, min_runtime_s=1_800, duration_s=20_000)]),
        (9_000, [c.SetShares(actor="root", account="ai2/olmo", shares=3, reason="quarter")]),
        (9_500, [c.DrainNode(actor="root", node="n1", reason="firmware")]),
        (
            11_000,
            [job("dan", "ai2/tulu", 1, min_runtime_s=300, time_limit_s=600, duration_s=300)],
        ),  # the debug class
        (12_000, [c.ReturnNode(actor="root", node="n1")]),
        (
            12_500,
            [
                job("dan", "ai2/tulu", 8, min_runtime_s=3_600, duration_s=9_000),
                job("alice", "ai2/olmo", 2, min_runtime_s=600, duration_s=100_000),
            ],
        ),
        (13_000, [c.CancelJob(actor="alice", job_id=8)]),
        # a debug job of alice's takes a GPU from her own job, past its contract: the lane
        (
            16_500,
            [job("alice", "ai2/olmo", 1, min_runtime_s=300, time_limit_s=600, duration_s=300)],
        ),
        (20_000, [job("bob", "ai2/olmo", 8, min_runtime_s=600, resumable=True, duration_s=4_000)]),
    ]
    low = {2}  # job 2 idles on its GPUs (a squatter once past its contract for an hour)
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        dispatcher = Dispatcher(
            ledger,
            ProjectionRanks(Projector(store, source)),
            policy or FairShare(squat_after_s=3_600),
            KernelExecutor(),
        )
        t = 0.0
        while t <= 30_000:
            clock.advance_to(T0 + t)
            while steps and steps[0][0] <= t:
                ledger.execute_all(steps.pop(0)[1])
            samples: list[c.AnyCommand] = [
                c.SampleUtilisation(
                    actor=EXEC,
                    job_id=j.job_id,
                    gpu_utilisation=tuple(
                        3.0 if j.job_id in low else 80.0 for _ in range(j.spec.gpus)
                    ),
                )
                for j in ledger.state.jobs.values()
                if j.status == "running"
            ]
            if samples:
                ledger.execute_all(samples)
            dispatcher.cycle(T0 + t)
            t += 500.0
    return ledger


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`build_history` of the default policy, built once and never handed out: tests take a
    copy (`history`, or `copy_of` for one of their own)."""
    home = tmp_path_factory.mktemp("pristine") / "h"
    build_history(home).close()
    return home


@pytest.fixture(scope="module")
def pristine_served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`build_history(service=True)`, built once, never handed out (see `pristine`)."""
    home = tmp_path_factory.mktemp("pristine-served") / "h"
    build_history(home, service=True).close()
    return home


def copy_of(home: Path, to: Path) -> Path:
    """A copy of a closed data directory: the same log, key and files, as building it again
    would make them (the build is deterministic: a simulated clock and seeded ids)."""
    shutil.copytree(home, to)
    return to


@pytest.fixture(scope="module")
def history(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield copy_of(pristine, tmp_path_factory.mktemp("history") / "h")


def events_of(home: Path) -> list[e.AnyEvent]:
    ledger = Ledger(home)
    try:
        return [ev for _, ev in ledger.read(0, ledger.position)]
    finally:
        ledger.close()


def test_the_history_has_every_kind_of_decision(history: Path) -> None:
    events = events_of(history)
    reasons = Counter(ev.reason for ev in events if isinstance(ev, e.JobPreempted))
    assert set(reasons) >= {"fairness", "squatting", "maintenance", "debug"}, reasons
    assert any(isinstance(ev, e.JobRequeued) for ev in events)
    assert any(isinstance(ev, e.NodeDrained) for ev in events)
    assert sum(isinstance(ev, e.UtilisationSampled) for ev in events) > 50
    assert check_history(events) == []


def test_replaying_every_decision_gives_identical_decisions(history: Path) -> None:
    results = list(replay_home(history))
    assert len(results) >= 10
    assert [r.headline() for r in results if not r.identical] == []
    assert sum(r.preemptions for r in results) >= 4


def test_exact_catch_up_and_as_of_reading_give_the_same_ranks(history: Path) -> None:
    decisions = find_decisions(history)
    with (
        EmbeddedSource(history) as source,
        Replayer(source, exact=True) as exact,
        Replayer(source) as as_of,
    ):
        for _, d in decisions:
            a, _, da = exact.snapshot(d)
            b, _, db = as_of.snapshot(d)
            assert (a.ranks, a.level_fs) == (b.ranks, b.level_fs), d.cycle_id
            assert a == b and da == db
            assert d.ranks is not None and d.ranks.digest == da, d.cycle_id


def test_a_selection_picks_decisions_by_cycle_job_and_time(history: Path) -> None:
    everything = find_decisions(history)
    one = [d for _, d in everything if d.placed or d.preempted][3]
    assert [d for _, d in find_decisions(history, Selection(cycle=one.cycle_id))] == [one]
    placed = one.placed[0] if one.placed else one.preempted[0]
    for_job = find_decisions(history, Selection(job=placed))
    assert one in [d for _, d in for_job]
    late = find_decisions(history, Selection(start=T0 + 20_000))
    assert late and all((d.decided_at or 0) >= T0 + 20_000 for _, d in late)


class LyingFairShare(FairShare, frozen=True, kw_only=True):
    """Records fairshare-1 and its settings but never preempts: policy code that changed
    behaviour without a new version."""

    def may_preempt(self, job: PendingJob) -> bool:
        return False


def test_policy_code_that_changed_without_a_new_version_shows_as_differences(
    tmp_path: Path,
) -> None:
    build_history(tmp_path, LyingFairShare(squat_after_s=3_600)).close()
    results = list(replay_home(tmp_path))
    differing = [r for r in results if r.differences]
    assert differing
    first = differing[0]
    # the code of fairshare-1, rebuilt from the recorded settings, preempts where it did not
    texts = [d.text() for d in first.differences]
    assert any(
        t.startswith("preemption of job ") and "recorded no preemption, replayed fairness" in t
        for t in texts
    ), texts
    out = CliRunner().invoke(cli, ["--home", str(tmp_path), "replay", "--cycle", first.cycle_id])
    assert out.exit_code == 1
    assert f"{first.cycle_id} (position {first.position}" in out.output
    assert first.differences[0].text() in out.output


def test_a_records_skipped_cycles_and_ranks_position_are_checked(
    pristine_served: Path, tmp_path: Path
) -> None:
    """atk33-26: a record's `skipped_cycles` (0 -> 500) and `ranks.position` (275 -> 200)
    edited replayed identical. A service's log bounds the first by the time since the previous
    record (cycles at least 0.05 s apart) and every dispatcher reads ranks at its snapshot's
    position."""
    home = copy_of(pristine_served, tmp_path / "h")
    assert all(r.identical for r in replay_home(home))
    decisions = find_decisions(home)
    (_, d0), (position, d) = decisions[0], decisions[1]
    assert d.ranks is not None and d.skipped_cycles < 10
    gap = decided_at(d) - decided_at(d0)
    most = int(gap / 0.05) + 1
    claims = msgspec.structs.replace(d, skipped_cycles=most + 1)
    # one event earlier (a utilisation sample): the same ranks, so only the position tells
    moved = msgspec.structs.replace(
        d, ranks=msgspec.structs.replace(d.ranks, position=d.based_on - 1)
    )
    with EmbeddedSource(home) as source:
        (a, b) = list(replay_decisions(source, [(position, claims), (position, d)]))
    with EmbeddedSource(home) as source:
        (c_,) = list(replay_decisions(source, [(position, moved)]))
    assert [x.text() for x in a.differences] == [
        f"skipped_cycles: recorded {most + 1} empty cycles before it, replayed at most {most} "
        f"in the {gap:g} s since the previous record (cycles are at least 0.05 s apart)"
    ]
    assert b.identical
    assert [x.what for x in c_.differences] == ["ranks position"]


def test_a_record_claiming_other_settings_than_the_services_is_a_difference(
    pristine: Path, pristine_served: Path, tmp_path: Path
) -> None:
    """atk34-26 F2: a served record edited to claim another policy version, or a margin of 0.5,
    a spare ratio of 1 and no debug lane, replayed identical. The log's `service.configured` in
    force at the record is what the service ran with; without one (a log `serve` did not write)
    the record's own settings are replayed, as before."""
    home = copy_of(pristine_served, tmp_path / "h")
    plain = copy_of(pristine, tmp_path / "plain")
    for where, served in ((home, True), (plain, False)):
        position, d = find_decisions(where)[1]
        assert isinstance(d.policy, FairShareConfig) and d.policy.debug_lane
        tuned = msgspec.structs.replace(d.policy, margin=0.5, debug_lane=False)
        other = msgspec.structs.replace(d, policy=tuned)
        with EmbeddedSource(where) as source:
            (a, b) = list(replay_decisions(source, [(position, other), (position, d)]))
        assert b.identical
        settings_named = [x.text() for x in a.differences if x.what.startswith("policy")]
        assert settings_named == (
            [
                "policy setting debug_lane: recorded False, replayed True (the service's "
                "configured setting)",
                "policy setting margin: recorded 0.5, replayed 0.1 (the service's configured "
                "setting)",
            ]
            if served
            else []
        )


def test_an_unknown_policy_version_names_the_version_it_needs(tmp_path: Path) -> None:
    with pytest.raises(UnknownEntity) as err:
        from_settings("fairshare-0", settings(FairShareConfig()))
    assert "'fairshare-0'" in err.value.message and err.value.fields["version"] == "fairshare-0"
    build_history(tmp_path, FairShare(version="fairshare-0", squat_after_s=3_600)).close()
    results = list(replay_home(tmp_path))
    assert results and all(r.error is not None for r in results)
    assert "needs policy version 'fairshare-0'" in (results[0].error or "")
    out = CliRunner().invoke(cli, ["--home", str(tmp_path), "replay", "--all"])
    assert out.exit_code == 1
    assert "cannot replay: this decision needs policy version 'fairshare-0'" in out.output


def test_cli_replay_all_prints_a_summary_and_exits_zero(history: Path) -> None:
    out = CliRunner().invoke(cli, ["--home", str(history), "replay", "--all"])
    assert out.exit_code == 0, out.output
    n = len(find_decisions(history))
    assert f"{n} decisions replayed" in out.output
    assert f"{n} identical, 0 differ, 0 cannot be replayed" in out.output


def test_an_edited_decision_is_reported_with_its_exact_difference(
    pristine: Path, tmp_path: Path
) -> None:
    home = copy_of(pristine, tmp_path / "h")
    decisions = find_decisions(home)
    position, d = next((p, d) for p, d in decisions if len(d.placed) > 1)
    # the record lists its placements in another order than its JobPlaced events
    reordered = msgspec.structs.replace(d, placed=d.placed[::-1])
    # the record's order digest was changed
    digest = msgspec.structs.replace(
        d, waiting=msgspec.structs.replace(d.waiting, order_digest="0" * 64)
    )
    with EmbeddedSource(home) as source:
        (a,) = list(replay_decisions(source, [(position, reordered)]))
    with EmbeddedSource(home) as source:
        (b,) = list(replay_decisions(source, [(position, digest)]))
    assert [x.what for x in a.differences] == ["placement order"]
    assert a.differences[0].recorded == str(list(d.placed[::-1]))
    assert [x.text() for x in b.differences] == [
        f"order: recorded digest 000000000000, replayed digest {d.waiting.order_digest[:12]} "
        "(sort keys or reasons differ)"
    ]


# --- what-if ------------------------------------------------------------------------------------


def test_whatif_resimulates_the_period_through_a_real_ledger(history: Path, tmp_path: Path) -> None:
    events = events_of(history)
    scen = scenario(events, T0 + 500, T0 + 30_000)
    submitted = [s for s in scen.submissions if not s.carried]
    assert {s.original for s in submitted} == {
        ev.job_id for ev in events if isinstance(ev, e.JobSubmitted) and ev.at >= T0 + 500
    }
    assert any(s.carried for s in scen.submissions)  # alice's jobs were running at T0 + 500
    run = simulate(scen, tmp_path / "w", window_s=3 * 86_400.0)
    assert run.cycles > 5
    what = events_of(tmp_path / "w")
    assert check_history(what) == []
    subs = [ev for ev in what if isinstance(ev, e.JobSubmitted)]
    assert len(subs) == len(scen.submissions)
    decided = [ev for ev in what if isinstance(ev, e.CycleDecided)]
    assert decided and all(d.ranks and d.ranks.usage.window_s == 259_200.0 for d in decided)
    # the what-if ledger is a ledger like any other: its decisions replay identically
    assert [r.headline() for r in replay_home(tmp_path / "w") if not r.identical] == []


def test_cli_whatif_compares_teams_with_new_budgets(history: Path, tmp_path: Path) -> None:
    budgets = tmp_path / "budgets.toml"
    budgets.write_text('[accounts."ai2/tulu"]\nkind = "project"\nshares = 5\n')
    args = [
        "--home",
        str(history),
        "whatif",
        "--budgets",
        str(budgets),
        "--window",
        "2d",
        "--from",
        str(T0),
        "--to",
        str(T0 + 30_000),
        "--json",
    ]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    report = msgspec.json.decode(out.output.encode())
    teams = {t["team"]: t for t in report["teams"]}
    assert set(teams) == {"ai2/olmo", "ai2/tulu"}
    assert teams["ai2/tulu"]["whatif"]["owed_gpu_h"] != teams["ai2/tulu"]["actual"]["owed_gpu_h"]
    assert report["submissions"] == sum(isinstance(ev, e.JobSubmitted) for ev in events_of(history))


# --- checkpoints and the anchored projection -----------------------------------------------------


def project_home(home: Path) -> None:
    """The data directory's projection, caught up with the log (as a service leaves it)."""
    with Store.open(home) as store, EmbeddedSource(home) as source:
        Projector(store, source).catch_up()


def test_one_decision_replays_from_the_nearest_checkpoint_and_the_anchored_projection(
    pristine: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    home = copy_of(pristine, tmp_path / "h")
    project_home(home)
    monkeypatch.setattr(replay, "CHECKPOINT_EVERY", 20)
    # a walk over every decision stores checkpoints (and uses a projection of its own)
    assert [r.headline() for r in replay_home(home) if not r.identical] == []
    checkpoints = ck.Checkpoints(home / ck.CHECKPOINTS_DB, state_key(home))
    stored = checkpoints.positions()
    assert len(stored) >= 3
    decisions = find_decisions(home)
    position, last = decisions[-1]
    with EmbeddedSource(home) as source:
        with replay.Replayer(
            source, checkpoints=checkpoints, projection=projection_path(home)
        ) as rp:
            result = rp.replay(position, last)
            assert result.identical, result.headline()
            start = max(p for p in stored if p <= last.based_on)
            assert rp._checkpointed == start  # folded only the tail after the checkpoint
            assert rp.disk is not None and rp.disk.anchored == {last.based_on: True}
        # a checkpoint whose chain hash is not the log's is skipped with a warning
        data = checkpoints.con.execute(
            "SELECT data FROM checkpoints WHERE position = ?", (start,)
        ).fetchone()[0]
        cp = msgspec.msgpack.decode(data, type=ck.Checkpoint)
        checkpoints.put(msgspec.structs.replace(cp, chain_hash="0" * 64))
        monkeypatch.setattr(replay, "CHECKPOINT_EVERY", 10**9)  # store no new one
        with replay.Replayer(
            source, checkpoints=checkpoints, projection=projection_path(home)
        ) as rp:
            assert rp.replay(position, last).identical
            assert rp._checkpointed < start
    assert f"replay checkpoint at {start} skipped: the chain hash differs" in caplog.text
    # atk33-26 F2: a checkpoint written by someone without the service's key (a forged state
    # at a real position, its chain hash right) is never trusted: replay folds from before it
    checkpoints.put(cp)
    forged = msgspec.structs.replace(cp, state=msgspec.structs.replace(cp.state, jobs=[]), mac="")
    checkpoints.con.execute("UPDATE checkpoints SET data = ? WHERE position = ?",
                            (msgspec.msgpack.encode(forged), start))  # fmt: skip
    with (
        EmbeddedSource(home) as source,
        replay.Replayer(source, checkpoints=checkpoints, projection=projection_path(home)) as rp,
    ):
        assert rp.replay(position, last).identical
        assert rp._checkpointed < start
    assert f"replay checkpoint at {start} skipped: not signed with the service's" in caplog.text
    checkpoints.close()


def test_a_projection_that_does_not_hold_the_logs_bytes_is_not_read(
    pristine: Path, tmp_path: Path
) -> None:
    home = copy_of(pristine, tmp_path / "h")
    project_home(home)
    position, last = find_decisions(home)[-1]
    con = duckdb.connect(str(projection_path(home)))
    con.execute(
        'UPDATE events SET raw = \'{"type": "edited"}\' WHERE position = ?', [last.based_on]
    )
    con.close()
    with (
        EmbeddedSource(home) as source,
        replay.Replayer(source, projection=projection_path(home)) as rp,
    ):
        assert rp.replay(position, last).identical  # ranked from a projection of its own
        assert rp.disk is not None and rp.disk.anchored == {last.based_on: False}


def test_a_policy_that_reads_no_ranks_replays_identically(tmp_path: Path) -> None:
    """atk33-26 F0: every decision of `serve --policy fifo` failed replay ("ranks: recorded
    digest ..., replayed digest ..."): the dispatcher records the ranks it had, replay gives a
    policy that reads none no ranks. Ranks that are not an input of the decision are not
    compared."""
    from ledger.dispatch.policy import Fifo

    build_history(tmp_path, Fifo()).close()
    results = list(replay_home(tmp_path))
    assert results and all(r.error is None and not r.differences for r in results), [
        (r.position, [d.text() for d in r.differences]) for r in results if r.differences
    ]


def test_replay_of_a_job_finds_the_decisions_that_considered_it_past_the_first_64(
    tmp_path: Path,
) -> None:
    """atk33-26 F4: `replay --job J` found only decisions that placed or preempted J or listed
    it among their first 64 waiting jobs: job 80 of 80 waiting had none. Every decision of the
    job's span of the log considered it; the job page's list (`job_decisions`) is the same."""
    from projections.history import job_decisions

    clock = SimClock(T0)
    ledger = Ledger(tmp_path, clock, seeded_ids(7))
    org(ledger)
    ledger.execute_all([job("alice", "ai2/olmo", 8, min_runtime_s=600, duration_s=9_000)] * 80)
    with Store(":memory:") as store, EmbeddedSource(tmp_path) as source:
        dispatcher = Dispatcher(
            ledger, ProjectionRanks(Projector(store, source)), FairShare(), KernelExecutor()
        )
        for t in (0.0, 700.0, 1_400.0):
            clock.advance_to(T0 + t)
            ledger.execute(job("dan", "ai2/tulu", 1, min_runtime_s=60, duration_s=60))
            dispatcher.cycle(T0 + t)
    ledger.close()
    every = find_decisions(tmp_path)
    assert every and all(80 not in [w.job_id for w in d.waiting.first] for _, d in every)
    found = find_decisions(tmp_path, Selection(job=80))
    assert [p for p, _ in found] == [p for p, _ in every]
    project_home(tmp_path)
    with duckdb.connect(str(projection_path(tmp_path)), read_only=True) as con:
        assert [p for p, _ in job_decisions(con, 80, 100)] == [p for p, _ in every]


def test_fairshare_10_through_the_service_cycle_splits_the_first_cycle_and_replays(
    tmp_path: Path,
) -> None:
    """The service's dispatcher (ranks from the DuckDB projection: the usage and shares behind
    them from its Fair Tree) under fairshare-10: two teams of equal shares and no usage each
    submit 16 one-GPU jobs onto two idle 8-GPU nodes; the first cycle places 8 of each
    (fairshare-9 would place olmo's 16). Replay, ranking from its own projection, hands the
    policy the same usage and shares: every decision identical (the day's history too)."""
    from ledger.dispatch.fairshare10 import FairShare10

    home = tmp_path / "arrays"
    clock = SimClock(T0)
    ledger = Ledger(home, clock, seeded_ids(7))
    org(ledger)
    ledger.execute_all(
        [job("alice", "ai2/olmo", 1, min_runtime_s=3_600, duration_s=7_200)] * 16
        + [job("dan", "ai2/tulu", 1, min_runtime_s=3_600, duration_s=7_200)] * 16
    )
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        dispatcher = Dispatcher(
            ledger, ProjectionRanks(Projector(store, source)), FairShare10(), KernelExecutor()
        )
        decision = dispatcher.cycle(T0).decision
    account = {j.spec.job_id: j.spec.account for j in ledger.state.jobs.values()}
    ledger.close()
    placed = [account[p.job_id] for p in decision.placements]
    assert sorted(placed) == ["ai2/olmo"] * 8 + ["ai2/tulu"] * 8
    for where in (home, tmp_path / "day"):
        if where != home:
            build_history(where, FairShare10(squat_after_s=3_600)).close()
        results = list(replay_home(where))
        assert results and all(r.error is None and not r.differences for r in results), [
            (r.position, [d.text() for d in r.differences]) for r in results if r.differences
        ]
