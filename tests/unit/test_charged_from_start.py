"""Usage is charged from the run's real start to its real end (`fairtree-3`: a stopped run to the
end its engine reports, through its grace; `fairtree-2`: to the release when that came first),
decisions recorded under `fairtree-1` replay with placement charges, and the audit reports
charges outside a run:
histories the real domain decides, the in-memory fold and the Python reference on the same
events (the projection's SQL on them: tests/integration/test_charged_sql.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.cycle.dispatcher import rank_inputs
from ledger.history.audit import check
from ledger.history.compare import recorded_usage, usage_of
from projections import fairshare as fs
from projections import queries
from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import Store
from projections.testing.compare import REFERENCE_TABLES, differences, dump, reference_dump
from projections.testing.reference import fold
from projections.usage import UsageFold
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas.policy import FairShare7Config

T0 = 1_000_000.0
H = 3_600.0
Slot = e.GpuSlot
PLACEMENT = fs.UsagePolicy(charge=fs.CHARGE_PLACEMENT)
RUN = fs.UsagePolicy(charge=fs.CHARGE_RUN)
REAL = fs.UsagePolicy()


def ids() -> Callable[[], str]:
    n = itertools.count(1)
    return lambda: f"e{next(n)}"


def history(cmds: list[tuple[float, c.AnyCommand]]) -> list[e.AnyEvent]:
    state, new_id, out = State(), ids(), []
    for at, cmd in cmds:
        for ev in decide(state, cmd, at, new_id):
            evolve(state, ev)
            out.append(ev)
    return out


def ranks(version: str) -> e.RankInputs:
    return e.RankInputs(
        position=1, digest="d", ranking_version=version, usage=e.UsageSettings(window_s=fs.WEEK_S)
    )


def decision(cycle: str, version: str, placed: tuple[int, ...] = ()) -> c.AnyCommand:
    return c.ApplyDecision(
        actor="@dispatcher",
        decision=c.DecisionBody(
            cycle_id=cycle, based_on=1, policy_version="fairshare-7",
            policy=FairShare7Config(), ranks=ranks(version),
            placements=tuple(
                e.Placement(job_id=j, slots=(Slot(node="n1", gpu_indices=(2 * i, 2 * i + 1)),))
                for i, j in enumerate(placed)
            ),
        ),
    )  # fmt: skip


ORG: list[tuple[float, c.AnyCommand]] = [
    (T0, c.InitLedger(actor="root", admin="root")),
    (T0, c.OpenAccount(actor="root", path="ai2", kind="program")),
    (T0, c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=1)),
    (T0, c.AddMember(actor="root", user="alice", project="ai2/olmo")),
    (T0, c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8)),
    (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60)),
    (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60)),
    (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60)),
]


def waiting_runs(version: str) -> list[e.AnyEvent]:
    """Three jobs placed at T0 under `version`: job 1 starts an hour after its placement (Slurm
    held it) and ends at T0 + 2 h, recorded a minute late; job 2 is preempted before it ever
    started; job 3 starts at once and still runs."""
    return history(
        [
            *ORG,
            (T0, decision("c1", version, placed=(1, 2, 3))),
            (T0 + 1, c.StartJob(actor="@executor", job_id=3)),
            (T0 + H + 30, c.StartJob(actor="@executor", job_id=1, started_at=T0 + H)),
            (T0 + 1_800, c.PreemptJob(actor="root", job_id=2, note="drain")),
            (T0 + 2 * H + 60,
             c.FinishJob(actor="@executor", job_id=1, exit_code=0, ended_at=T0 + 2 * H)),
        ]
    )  # fmt: skip


AT = T0 + 3 * H
WANT = {
    # job 1 from its start to its real end (1 h), job 3 from T0 + 1 (3 h - 1 s), 2 GPUs each
    "real": 2 * H + 2 * (3 * H - 1),
    "run": 2 * H + 2 * (3 * H - 1),
    # fairtree-1: job 1 from placement to its real end, job 2 placed to preempted, job 3 from T0
    "placement": 2 * 2 * H + 2 * 1_800 + 2 * 3 * H,
}


@pytest.mark.parametrize(
    "policy", [REAL, RUN, PLACEMENT], ids=["fairtree-3", "fairtree-2", "fairtree-1"]
)
def test_the_fold_the_reference_and_the_projection_charge_alike(policy: fs.UsagePolicy) -> None:
    events = waiting_runs(fs.ranking_version(policy))
    want = WANT[policy.charge]
    folded = UsageFold(policy)
    folded.apply_all(events)
    # fairtree-1's fold closed a finished run at its JobFinished, a minute after the real end
    # (the projection's SQL took the real end): kept, so that its decisions replay as recorded
    late = 2 * 60.0 if policy.charge == fs.CHARGE_PLACEMENT else 0.0
    assert folded.usage(AT) == {"ai2/olmo/alice": want + late}
    ref = fold(enumerate(events, 1))
    assert fs.user_usage(ref.usage_intervals(), AT, policy) == {"alice": want}


def test_a_run_the_engine_never_started_is_not_charged_and_one_held_is_charged_from_its_start() -> (
    None
):
    events = waiting_runs("fairtree-2")
    ref = fold(enumerate(events, 1))
    by_job = {i["job_id"]: i for i in ref.intervals}
    assert by_job[1]["run_start_at"] == T0 + H and by_job[2]["run_start_at"] is None
    assert fs.leaf_usage(ref.usage_intervals(), AT, RUN) == {"ai2/olmo/alice": WANT["run"]}


def test_decision_records_name_the_rule_and_replay_reads_it_back() -> None:
    class Source:
        usage_policy = RUN
        read_position = None
        computed_by = ""

    inputs = rank_inputs(Source(), 7, {}, {})  # type: ignore[arg-type]
    assert inputs is not None and inputs.ranking_version == "fairtree-2"
    Source.usage_policy = REAL
    inputs = rank_inputs(Source(), 7, {}, {})  # type: ignore[arg-type]
    assert inputs is not None and inputs.ranking_version == "fairtree-3"
    old = e.CycleDecided(
        event_id="d", at=T0, actor="@dispatcher", cycle_id="c", based_on=1,
        policy_version="fairshare-7", policy=FairShare7Config(), ranks=ranks("fairtree-1"),
    )  # fmt: skip
    assert recorded_usage(old, FairShare7Config()).charge == "placement"
    assert usage_of(e.UsageSettings(window_s=60.0), "fairtree-2").charge == "run"
    assert usage_of(e.UsageSettings(window_s=60.0), "fairtree-3").charge == "real"
    assert usage_of(e.UsageSettings(window_s=60.0)).charge == "placement"  # v1: said nothing


# --- the audit ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["fairtree-3", "fairtree-2"])
def test_charges_under_the_run_rules_are_inside_real_runs(version: str) -> None:
    assert [v.code for v in check(waiting_runs(version)).violations] == []


def test_placement_charges_of_fairtree_1_are_charges_outside_a_run() -> None:
    events = waiting_runs("fairtree-1")
    found = [(v.code, v.job_id) for v in check(events).violations]
    assert found == [("CHARGED_WITHOUT_RUN", 2), ("CHARGED_BEFORE_START", 1)]
    lines = [v.message for v in check(events).violations]
    assert lines[1] == (
        f"job 1's run 0 was charged from {T0:.3f} to {T0 + 2 * H:.3f} (charged from the "
        f"placement) but started at {T0 + H:.3f}: 7200.0 GPU-s before its run"
    )
    assert "never started: 3600.0 GPU-s outside any run" in lines[0]


def stopped_early(version: str) -> list[e.AnyEvent]:
    """Job 1 runs from T0 + 2 on Slurm; its node is lost and its run really ends at T0 + 50 (the
    lease, NODE_FAIL), the ledger requeues it at T0 + 100 and hears of the end at T0 + 500."""
    return history(
        [
            *ORG,
            (T0, decision("c1", version, placed=(1,))),
            (T0 + 5, c.StartJob(actor="@executor", job_id=1, engine="slurm", engine_job_id="9",
                                started_at=T0 + 2)),
            (T0 + 100, c.PreemptJob(actor="root", job_id=1, note="drain")),
            (T0 + 500, c.ConfirmRunEnded(actor="@executor", job_id=1, engine="slurm",
                                         engine_job_id="9", ended_at=T0 + 50)),
        ]
    )  # fmt: skip


@pytest.mark.parametrize("version", ["fairtree-3", "fairtree-2"])
def test_a_stopped_run_is_charged_to_its_real_end_when_that_came_first(version: str) -> None:
    events = stopped_early(version)
    ref = fold(enumerate(events, 1))
    (iv,) = ref.intervals
    assert (iv["run_end_at"], iv["end_at"]) == (T0 + 50, T0 + 100)
    assert fs.user_usage(ref.usage_intervals(), AT, RUN) == {"alice": 2 * 48.0}
    assert fs.user_usage(ref.usage_intervals(), AT, REAL) == {"alice": 2 * 48.0}
    assert fs.user_usage(ref.usage_intervals(), AT, PLACEMENT) == {"alice": 2 * 100.0}
    assert check(events).violations == ()


def test_a_charge_past_the_end_the_engine_reported_is_a_violation() -> None:
    # fairtree-1 charged the run to its release, 50 s after its engine said it ended (F9's shape)
    before, v = check(stopped_early("fairtree-1")).violations
    assert (before.code, v.code, v.job_id) == ("CHARGED_BEFORE_START", "CHARGED_AFTER_END", 1)
    assert v.message.endswith(f"ended at {T0 + 50:.3f}: 100.0 GPU-s after it")


def test_a_finish_dated_after_the_end_its_engine_reported_is_charged_to_the_engines() -> None:
    # the ledger's finish says T0 + 300, the engine's own report of the same end T0 + 200: the
    # run rule charges to the engine's (no violation); fairtree-1 charged to the finish
    events = history(
        [
            *ORG,
            (T0, decision("c1", "fairtree-2", placed=(1,))),
            (T0 + 5, c.StartJob(actor="@executor", job_id=1, engine="slurm", engine_job_id="9",
                                started_at=T0 + 2)),
            (T0 + 400, c.FinishJob(actor="@executor", job_id=1, exit_code=0, engine="slurm",
                                   engine_job_id="9", ended_at=T0 + 300)),
        ]
    )  # fmt: skip
    ended = next(i for i, ev in enumerate(events) if isinstance(ev, e.JobEngineEnded))
    events[ended] = msgspec.structs.replace(events[ended], ended_at=T0 + 200)
    assert check(events).violations == ()
    ref = fold(enumerate(events, 1))
    assert fs.user_usage(ref.usage_intervals(), AT, RUN) == {"alice": 2 * 198.0}
    decided = next(i for i, ev in enumerate(events) if isinstance(ev, e.CycleDecided))
    events[decided] = msgspec.structs.replace(
        events[decided],
        ranks=ranks("fairtree-1"),  # the decision record, ranked under fairtree-1
    )
    codes = [v.code for v in check(events).violations]
    assert codes == ["CHARGED_BEFORE_START", "CHARGED_AFTER_END"]


def lost_with_its_node() -> list[e.AnyEvent]:
    """A resumable job runs on Slurm from T0 + 2; Slurm says its run ended with its node at
    T0 + 40 (NODE_FAIL), recorded at T0 + 90: it is requeued (JobPreempted at T0 + 90) and its
    engine's end (JobEngineEnded) says T0 + 40."""
    return history(
        [
            *ORG,
            (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60,
                             resumable=True)),
            (T0, decision("c1", "fairtree-2", placed=(4,))),
            (T0 + 5, c.StartJob(actor="@executor", job_id=4, engine="slurm", engine_job_id="9",
                                started_at=T0 + 2)),
            (T0 + 90, c.FinishJob(actor="@executor", job_id=4, exit_code=-1, engine="slurm",
                                  engine_job_id="9", reason="node_failure", ended_at=T0 + 40)),
        ]
    )  # fmt: skip


def test_a_run_that_ended_with_its_node_is_charged_to_its_engines_end() -> None:
    events = lost_with_its_node()
    assert [type(ev).__name__ for ev in events[-3:]] == [
        "JobPreempted", "JobRequeued", "JobEngineEnded"
    ]  # fmt: skip
    ref = fold(enumerate(events, 1))
    (iv,) = ref.intervals
    assert (iv["end_at"], iv["run_end_at"]) == (T0 + 90, T0 + 40)
    assert fs.user_usage(ref.usage_intervals(), AT, RUN) == {"alice": 2 * 38.0}
    assert check(events).violations == ()


# --- a stopped run that outlives its release (F1: SIGTERM, its grace, SIGKILL) -----------------

GRACE = 30.0


def stopped_late(version: str, how: c.AnyCommand) -> list[e.AnyEvent]:
    """Job 1 runs from T0 + 2; the ledger stops it at T0 + 100 (`how`: a cancel, a preemption,
    a requeue); its processes live through their grace and end at T0 + 100 + GRACE, which its
    engine reports a second later (`JobRunEnded`)."""
    return history(
        [
            *ORG,
            (T0, decision("c1", version, placed=(1,))),
            (T0 + 5, c.StartJob(actor="@executor", job_id=1, engine="slurm", engine_job_id="9",
                                started_at=T0 + 2)),
            (T0 + 100, how),
            (T0 + 101 + GRACE, c.ConfirmRunEnded(actor="@executor", job_id=1, engine="slurm",
                                                 engine_job_id="9", ended_at=T0 + 100 + GRACE,
                                                 killed=True)),
        ]
    )  # fmt: skip


STOPS = {
    "cancelled": c.CancelJob(actor="alice", job_id=1),
    "preempted": c.PreemptJob(actor="root", job_id=1, note="drain"),
    "requeued": c.RequeueJob(actor="alice", job_id=1),
}


@pytest.mark.parametrize("how", sorted(STOPS))
def test_fairtree_3_charges_a_stopped_run_through_its_grace_to_its_real_end(how: str) -> None:
    """The fold, the reference and the audit agree: fairtree-3 charges to the run's real end
    (98 s + the grace, 2 GPUs), fairtree-2 (decisions recorded under it replay so) to the
    release; until the end is reported, both charge to the release."""
    events = stopped_late("fairtree-3", STOPS[how])
    assert isinstance(events[-1], e.JobRunEnded)
    want = {"fairtree-3": 2 * (98.0 + GRACE), "fairtree-2": 2 * 98.0}
    for policy in (REAL, RUN):
        ref = fold(enumerate(events, 1))
        got = fs.user_usage(ref.usage_intervals(), AT, policy)
        assert got == {"alice": want[fs.ranking_version(policy)]}, policy
        folded = UsageFold(policy)
        folded.apply_all(events)
        assert folded.usage(AT) == {"ai2/olmo/alice": want[fs.ranking_version(policy)]}
        before = UsageFold(policy)
        before.apply_all(events[:-1])  # the end not heard yet: to the release
        assert before.usage(AT) == {"ai2/olmo/alice": 2 * 98.0}
    assert check(events).violations == ()


def test_fairtree_3_charges_a_run_that_ended_with_its_node_to_its_engines_end() -> None:
    events = lost_with_its_node()
    for policy in (REAL, RUN):
        folded = UsageFold(policy)
        folded.apply_all(events)
        ref = fold(enumerate(events, 1))
        assert fs.user_usage(ref.usage_intervals(), AT, policy) == {"alice": 2 * 38.0}
    folded = UsageFold(REAL)
    folded.apply_all(events)
    assert folded.usage(AT) == {"ai2/olmo/alice": 2 * 38.0}


# --- a run stopped while placed whose command ran (atk44s F3) ----------------------------------


def stopped_while_placed(version: str, own_start: float | None = T0 + 40) -> list[e.AnyEvent]:
    """Job 1 is placed at T0 on Slurm, which holds it CONFIGURING; alice requeues it at T0 + 30,
    before any read saw it start; the hold ends and its command runs from T0 + 40 (its launch
    mark) to T0 + 100, which its engine reports a second later with its own start
    (`own_start`; None: as every report before `job.run_ended.v2`)."""
    return history(
        [
            *ORG,
            (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60,
                             resumable=True)),
            (T0, decision("c1", version, placed=(4,))),
            (T0 + 30, c.RequeueJob(actor="alice", job_id=4)),
            (T0 + 101, c.ConfirmRunEnded(actor="@executor", job_id=4, engine="slurm",
                                         engine_job_id="9", ended_at=T0 + 100,
                                         started_at=own_start)),
        ]
    )  # fmt: skip


def test_the_domain_keeps_a_stopped_runs_own_start_only_where_no_start_was_recorded() -> None:
    (ended,) = [ev for ev in stopped_while_placed("fairtree-3") if isinstance(ev, e.JobRunEnded)]
    assert (ended.run, ended.started_at, ended.ended_at) == (0, T0 + 40, T0 + 100)
    later = stopped_while_placed("fairtree-3", own_start=T0 + 500)  # never after its end
    assert [ev.started_at for ev in later if isinstance(ev, e.JobRunEnded)] == [T0 + 100]
    # a run stopped while it ran has its JobStarted: an engine's start beside it is not kept
    events = history(
        [
            *ORG,
            (T0, decision("c1", "fairtree-3", placed=(1,))),
            (T0 + 5, c.StartJob(actor="@executor", job_id=1, engine="slurm", engine_job_id="9",
                                started_at=T0 + 2)),
            (T0 + 100, STOPS["requeued"]),
            (T0 + 131, c.ConfirmRunEnded(actor="@executor", job_id=1, engine="slurm",
                                         engine_job_id="9", ended_at=T0 + 130,
                                         started_at=T0 + 3)),
        ]
    )  # fmt: skip
    assert [ev.started_at for ev in events if isinstance(ev, e.JobRunEnded)] == [None]


@pytest.mark.parametrize("policy", [REAL, RUN, PLACEMENT], ids=lambda p: p.charge)
def test_a_run_stopped_while_placed_is_charged_from_its_own_start(policy: fs.UsagePolicy) -> None:
    """atk44s F3: its command ran 60 s on 2 GPUs and was charged nothing (no JobStarted). Now
    fairtree-3 charges it from its own start to its real end, in the fold, the reference and
    the audit alike; fairtree-2 to its release, which came before its start: nothing;
    fairtree-1 from the placement to the release, as before."""
    events = stopped_while_placed(fs.ranking_version(policy))
    want = {"real": 2 * 60.0, "run": 0.0, "placement": 2 * 30.0}[policy.charge]
    folded = UsageFold(policy)
    folded.apply_all(events)
    assert folded.usage(AT) == ({"ai2/olmo/alice": want} if want else {})
    ref = fold(enumerate(events, 1))
    (iv,) = ref.intervals
    assert (iv["run_start_at"], iv["run_end_at"], iv["end_at"]) == (T0 + 40, T0 + 100, T0 + 30)
    assert fs.user_usage(ref.usage_intervals(), AT, policy) == ({"alice": want} if want else {})
    if policy.charge != fs.CHARGE_PLACEMENT:
        assert check(events).violations == ()


def test_a_run_stopped_while_placed_without_its_own_start_is_charged_as_before() -> None:
    """A report without the start (v1, or an engine that does not know it): uncharged under the
    run rules, as every log written before `job.run_ended.v2` replays."""
    events = stopped_while_placed("fairtree-3", own_start=None)
    for policy in (REAL, RUN):
        folded = UsageFold(policy)
        folded.apply_all(events)
        assert folded.usage(AT) == {}
        ref = fold(enumerate(events, 1))
        assert fs.user_usage(ref.usage_intervals(), AT, policy) == {}


def test_an_own_start_reported_over_a_day_after_the_placement_is_not_charged() -> None:
    """`fs.OWN_START_KEPT_S` bounds what the fold keeps; the projection and the audit agree."""
    events = stopped_while_placed("fairtree-3")
    late = fs.OWN_START_KEPT_S + 1
    events[-1] = msgspec.structs.replace(events[-1], at=T0 + late)
    folded = UsageFold(REAL)
    folded.apply_all(events)
    assert folded.usage(T0 + late) == {}
    ref = fold(enumerate(events, 1))
    assert ref.intervals[0]["run_start_at"] is None


def _projected(tmp_path: Path, events: list[e.AnyEvent], batch: int | None = None,
               v1: bool = False) -> dict[str, list[Any]]:  # fmt: skip
    """The projection's read models (DuckDB, the projector's SQL) of `events`; `v1`: every
    `JobRunEnded` stored as the code before `job.run_ended.v2` wrote it."""
    records = []
    for pos, ev in enumerate(events, 1):
        if v1 and isinstance(ev, e.JobRunEnded):
            fields = msgspec.structs.asdict(ev)
            assert fields.pop("started_at") is None
            assert fields.pop("exit_decides") is False  # v2's since s54
            ev = e.JobRunEndedV1(**fields)  # type: ignore[assignment]
        records.append(LogRecord(pos, e.tag_of(type(ev)), codec.encode(ev)))  # type: ignore[arg-type]
    with Store(tmp_path / f"p{len(list(tmp_path.iterdir()))}.duckdb") as store:
        Projector(store, ListSource(records), **({} if batch is None else {"batch_size": batch})).catch_up()  # fmt: skip  # noqa: E501
        got = dump(store, REFERENCE_TABLES)
        usage = {
            p.charge: {r.name: r.gpu_seconds for r in queries.usage(store, AT, by="user", policy=p)}
            for p in (REAL, RUN, PLACEMENT)
        }
    return {"dump": [got], "usage": [usage]}


@pytest.mark.parametrize("batch", [None, 1])
def test_the_projections_sql_charges_a_run_stopped_while_placed_from_its_own_start(
    tmp_path: Path, batch: int | None
) -> None:
    """The SQL (`apply.sql` `intervals_run_ended`) as the reference: run_start_at from the
    report, charged 2 x 60 s under fairtree-3 (it was 0), whatever the batch boundaries."""
    events = stopped_while_placed("fairtree-3")
    got = _projected(tmp_path, events, batch)
    assert differences(got["dump"][0], reference_dump(fold(enumerate(events, 1)))) == []
    want = {"real": {"alice": 2 * 60.0}, "run": {}, "placement": {"alice": 2 * 30.0}}
    assert got["usage"][0] == want


def test_old_run_ended_records_project_as_before(tmp_path: Path) -> None:
    """Determinism: a log whose stopped runs' ends are stored as `job.run_ended.v1` (the bytes
    the code before v2 wrote) projects row for row as the same log read as v2 without a start,
    and charges those runs as before (a stopped run's grace; a run never started: nothing)."""
    for events in (stopped_while_placed("fairtree-3", own_start=None),
                   stopped_late("fairtree-3", STOPS["requeued"])):  # fmt: skip
        old = _projected(tmp_path, events, v1=True)
        new = _projected(tmp_path, events)
        assert differences(old["dump"][0], new["dump"][0]) == []
        assert old["usage"] == new["usage"]
    assert old["usage"][0]["real"] == {"alice": 2 * (98.0 + GRACE)}
