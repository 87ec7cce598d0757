"""The output contract: every read through `ledger.reads.layer`, as the CLI prints it (`--json`
decodes
as its `schemas.views` type, strict JSON) and as the functions return it, on a real store with a
real projection."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ledger.cycle.dispatcher import Dispatcher, ProjectionRanks
from ledger.dispatch.policy import FairShare
from ledger.history.audit import check
from ledger.reads import explain_job, hours
from ledger.reads import layer as reads
from ledger.reads import preview as previews
from ledger.sim.kernel import KernelExecutor
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from projections import queries
from projections.fairshare import UsagePolicy
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from schemas.errors import NotAuthorised
from schemas.units import plural

T0 = 1_767_225_600.0
GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"


def build(home: Path) -> None:
    """Two teams on two nodes: job 1 (dan, 2 GPUs) completes; job 2 (alice, unfunded) is
    preempted for job 3 (dan, 8 GPUs, 1 h contract, 2 h limit); jobs 4 (bob) and 5 (alice,
    priority 5) wait for job 3's contract."""
    clock = SimClock(T0)
    ledger = Ledger(home, clock, seeded_ids(7))
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
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=2),
        ]
    )
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        d = Dispatcher(
            ledger, ProjectionRanks(Projector(store, source)), FairShare(), KernelExecutor()
        )
        ledger.execute(
            c.SubmitJob(actor="dan", account="ai2/tulu", gpus=2, min_runtime_s=60, duration_s=50)
        )
        ledger.execute(
            c.SubmitJob(
                actor="alice", account="ai2/olmo", gpus=8, min_runtime_s=0, duration_s=100_000
            )
        )
        d.cycle(T0)
        clock.advance_to(T0 + 100)
        d.cycle(T0 + 100)
        ledger.execute(
            c.SubmitJob(
                actor="dan",
                account="ai2/tulu",
                gpus=8,
                min_runtime_s=3600,
                time_limit_s=7200,
                duration_s=5000,
            )
        )
        d.cycle(T0 + 100)
        clock.advance_to(T0 + 200)
        ledger.execute(c.SubmitJob(actor="bob", account="ai2/olmo", gpus=4, min_runtime_s=600))
        ledger.execute(
            # a priority above 0 is an admin's or a manager's to give (atk46-23 F15)
            c.SubmitJob(
                actor="root",
                user="alice",
                account="ai2/olmo",
                gpus=4,
                min_runtime_s=600,
                priority=5,
            )
        )
        d.cycle(T0 + 300)
    ledger.close()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    h = tmp_path_factory.mktemp("reads") / "home"
    build(h)
    return h


@pytest.fixture
def handles(home: Path) -> Any:
    ledger = Ledger(home)
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        Projector(store, source).catch_up()
        yield ledger, store
    ledger.close()


def cli(home: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: val for k, val in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(GPULEDGER_HOME=str(home), GPULEDGER_USER="root")
    proc = subprocess.run([GPULEDGER, *args], env=env, capture_output=True, text=True, timeout=60)
    if ok:
        assert proc.returncode == 0, f"{args}: {proc.stderr}"
    return proc


def strict(text: str) -> Any:
    """json.loads that refuses NaN and Infinity (what jq and browsers refuse)."""

    def refuse(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


AT = str(T0 + 300)
READS: list[tuple[tuple[str, ...], Any]] = [
    (("account", "tree"), list[v.AccountNode]),
    (("node", "list"), list[v.NodeRow]),
    (("jobs",), list[v.JobRow]),
    (("log", "--limit", "1000"), list[v.LogEntry]),
    (("shares", "--at", AT), list[v.ShareRow]),
    (("usage", "--at", AT), list[v.UsageRow]),
    (("usage", "--by", "user", "--at", AT), list[v.UsageRow]),
    (("report", "delivered", "--at", AT, "--window", "1d"), v.DeliveredView),
    (("queue",), list[v.QueueRow]),
    (("priority",), list[v.PriorityRow]),
    (("explain", "4"), v.ExplainView),
    (("explain", "2"), v.ExplainView),
    (("squatters",), list[v.SquatterRow]),
    (("projection", "status"), v.ProjectionStatusView),
    (("audit", "job", "2"), list[v.AuditJobRow]),
    (("audit", "preemptions"), list[v.PreemptionRow]),
    (("audit", "budget-changes"), list[v.BudgetChangeRow]),
    (("audit", "check"), v.CheckView),
]


@pytest.mark.parametrize(("args", "view"), READS, ids=[" ".join(a[:2]) for a, _ in READS])
def test_every_json_read_is_strict_json_of_its_view(
    home: Path, args: tuple[str, ...], view: Any
) -> None:
    out = cli(home, *args, "--json").stdout
    strict(out)
    decoded = msgspec.json.decode(out, type=view)
    assert decoded or (decoded == [] and args[0] in ("squatters", "queue", "priority"))


def test_shares_are_named_and_computed_like_sshare_l(handles: Any) -> None:
    _, store = handles
    rows = {r.account: r for r in reads.shares(store, T0 + 300, UsagePolicy())}
    total = rows["ai2"].raw_usage_gpu_s
    tulu, olmo, dan = rows["ai2/tulu"], rows["ai2/olmo"], rows["ai2/tulu/dan"]
    # job 1 ran 50 s (its exit, seen at the T0+100 cycle, is charged to its real end), then job
    # 3 (job 2 is unfunded)
    assert total == pytest.approx(2 * 50 + 8 * 200)
    # NormUsage: of the whole tree; EffectvUsage: of the parent
    assert dan.norm_usage == pytest.approx(dan.raw_usage_gpu_s / total)
    assert tulu.effectv_usage == pytest.approx(tulu.raw_usage_gpu_s / rows["ai2"].raw_usage_gpu_s)
    assert (olmo.level_fs, olmo.level_fs_infinite) == (None, True)
    assert tulu.level_fs == pytest.approx(0.5) and not tulu.level_fs_infinite
    assert rows["ai2/olmo/bob"].fair_share == 1.0


def test_shares_table_uses_slurm_column_names(home: Path) -> None:
    out = cli(home, "shares", "--at", AT).stdout
    header = out.splitlines()[0].split()
    assert header[:3] == ["Account", "RawShares", "NormShares"]
    assert header[-5:] == ["NormUsage", "EffectvUsage", "LevelFS", "Rank", "FairShare"]


def test_explain_is_structured_with_blocking_jobs_position_and_estimated_start(
    handles: Any,
) -> None:
    ledger, store = handles
    view = explain_job.explain(ledger, store, 4, FairShare(), T0 + 300)
    assert (view.status, view.code, view.position, view.queue_length) == (
        "pending",
        "WAIT_CONTRACT",
        2,
        2,
    )
    assert view.blocking_jobs == [3]
    # job 3's contract ends, then its grace (the default 30 s: atk33-23 F6)
    assert view.estimated_start_at == T0 + 100 + 3600 + 30
    assert "e+09" not in (view.reason or "") and "2026-01-01 01:01:40Z" in (view.reason or "")
    assert "Ahead of it: 1 job needing 4 GPUs (ai2/olmo: 1 job, 4 GPUs)." in view.lines


def test_explain_of_a_preempted_job_names_the_job_it_made_room_for(handles: Any) -> None:
    ledger, store = handles
    view = explain_job.explain(ledger, store, 2, FairShare(), T0 + 300)
    text = "\n".join(view.lines)
    # the note "unfunded" is job 2's, never the job it made room for
    assert "job 3 (unfunded)" not in text
    assert "preempted for fairness (unfunded) to make room for job 3" in text
    assert [h.tag for h in view.history][-2:] == ["job.preempted.v1", "job.finished.v2"]
    assert (view.status, view.outcome, view.code) == ("finished", "preempted", None)


@pytest.mark.parametrize("job_id", [1, 2, 3, 4])
def test_explain_from_a_live_ledger_equals_the_full_fold(handles: Any, job_id: int) -> None:
    """Finished jobs have left a live state: explain rebuilds them from their own events."""
    ledger, store = handles
    live = Ledger(ledger.home, live=True)
    try:
        assert 1 not in live.state.jobs and 2 not in live.state.jobs  # both finished
        want = explain_job.explain(ledger, store, job_id, FairShare(), T0 + 300)
        assert explain_job.explain(live, store, job_id, FairShare(), T0 + 300) == want
    finally:
        live.close()


def test_job_from_history_is_the_folded_job(handles: Any) -> None:
    """With the submissions of the jobs it was preempted for: job 2's takeback names job 3's
    account (`Job.takebacks`)."""
    ledger, store = handles
    for job_id in (1, 2, 3):
        history = explain_job._history(store, job_id)
        assert (
            explain_job.job_from_history(job_id, history, explain_job._preemptors(store, history))
            == (ledger.state.jobs[job_id])
        )
    assert ledger.state.jobs[2].takebacks
    assert explain_job.job_from_history(99, []) is None


def test_queue_filters_like_squeue_and_estimates_starts(handles: Any) -> None:
    ledger, store = handles
    rows = previews.queue(ledger, store, FairShare(), T0 + 300, v.QueueFilter())
    assert [(r.order, r.job_id) for r in rows] == [(1, 5), (2, 4)]
    assert {r.estimated_start_at for r in rows} == {T0 + 3700 + 30}  # and job 3's grace
    assert [
        r.job_id
        for r in previews.queue(ledger, store, FairShare(), T0 + 300, v.QueueFilter(user="bob"))
    ] == [4]
    assert (
        previews.queue(ledger, store, FairShare(), T0 + 300, v.QueueFilter(account="ai2/tulu"))
        == []
    )
    assert previews.queue(ledger, store, FairShare(), T0 + 300, v.QueueFilter(state="held")) == []


@pytest.mark.parametrize("user", [None, "alice", "bob"])
def test_a_short_page_of_the_queue_is_the_head_of_the_whole_queue(
    handles: Any, user: str | None
) -> None:
    """Only the rows shown are built: each page of `limit` rows is the head of the full list,
    estimated starts and reasons included, and `priority` likewise."""
    ledger, store = handles
    preview = previews.live(ledger, store, FairShare(), T0 + 300)
    whole = previews.queue(
        ledger, store, FairShare(), T0 + 300, v.QueueFilter(user=user, limit=1000), preview
    )
    full_keys = previews.priority(
        ledger, store, FairShare(), T0 + 300, v.QueueFilter(user=user, limit=1000), preview
    )
    assert whole and len(whole) == len(full_keys)
    for limit in range(1, len(whole) + 1):
        f = v.QueueFilter(user=user, limit=limit)
        assert previews.queue(ledger, store, FairShare(), T0 + 300, f, preview) == whole[:limit]
        assert (
            previews.priority(ledger, store, FairShare(), T0 + 300, f, preview)
            == (full_keys[:limit])
        )
    snapshot, decision = preview
    starts = previews.estimated_starts(ledger.state, snapshot, decision, T0 + 300)
    for job_id in [cons.job_id for cons in decision.considered()]:
        head = previews.estimated_starts(ledger.state, snapshot, decision, T0 + 300, job_id)
        assert list(head) == list(starts)[: list(starts).index(job_id) + 1]
        assert head == {k: starts[k] for k in head}


def test_the_series_summed_by_the_engine_equals_the_hour_by_hour_one(handles: Any) -> None:
    """The teams page's whole period before its hours are kept (`bucketed_series`: summed in
    DuckDB, a row per team and bucket) gives the figures of the hour-by-hour series, over a
    window of many empty hours after the history (the first read that took 18-20 s)."""
    _, store = handles
    start = T0 - 3 * 3600
    for end, bucket in ((T0 + 5 * 3600 + 1234, 3600.0), (T0 + 90 * 86400.0 + 17, 48 * 3600.0)):
        want = msgspec.to_builtins(hours.delivered_series(store, start, end, 2, bucket))
        got = list(msgspec.to_builtins(hours.bucketed_series(store, start, end, 2, bucket)))
        assert got == approx_tree(want), (end, bucket)
        assert any(t["delivered_gpu_hours"] > 0 for t in got[0]["teams"])
    rows = queries.team_buckets(store, start, T0 + 90 * 86400.0, 48 * 3600.0)
    assert len(rows) <= len({r[0] for r in rows}) * (90 * 24 // 48 + 2)


def approx_tree(x: Any) -> Any:
    """`x` with its floats compared to 1e-9 (the engine sums in another order)."""
    if isinstance(x, dict):
        return {k: approx_tree(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [approx_tree(v) for v in x]
    return pytest.approx(x, rel=1e-9, abs=1e-9) if isinstance(x, float) else x


def busy(hours: list[Any]) -> list[Any]:
    """The hours that say something (a team's hours before it existed are all zero)."""
    return sorted((h for h in hours if h.capacity_gpu_h or h.demand_gpu_h), key=str)


def test_queue_prints_times_not_scientific_notation(home: Path) -> None:
    out = cli(home, "queue", "-u", "bob").stdout
    assert "e+09" not in out and "e+9" not in out
    assert "2026-01-01 00:03:20Z" in out  # the submit time in the sort key
    assert [line.split()[1] for line in out.splitlines()[1:]] == ["4"]
    assert cli(home, "queue", "-A", "ai2/tulu", "--json").stdout.strip() == "[]"
    said = cli(home, "explain", "4").stdout  # the same key in explain (atk29c F10: raw epoch)
    assert "(sort key (" in said and "2026-01-01 00:03:20Z" in said, said


def test_priority_names_every_part_of_the_sort_key(handles: Any) -> None:
    ledger, store = handles
    rows = previews.priority(ledger, store, FairShare(), T0 + 300, v.QueueFilter())
    parts = {p.name: p.value for p in rows[0].parts}
    assert rows[0].job_id == 5
    assert parts == {
        "funded_class": 0,
        "team_rank": 0,
        "priority_neg": -5,
        "user_rank": 0,
        "submitted_at": T0 + 200,
        "job_id": 5,
    }


def test_jobs_come_from_the_projection_with_start_end_elapsed_and_exit_code(
    handles: Any, home: Path
) -> None:
    _, store = handles
    rows = {r.job_id: r for r in reads.jobs(store, v.JobFilter(), T0 + 300, None)}
    one = rows[1]
    assert (one.outcome, one.exit_code, one.started_at) == ("completed", 0, T0)
    assert one.finished_at is not None and one.elapsed_s == one.finished_at - T0
    assert rows[3].status == "running" and rows[3].elapsed_s == 200.0
    assert rows[3].nodes == ["n0"]
    since = reads.jobs(store, v.JobFilter(since=T0 + 150), T0 + 300, None)
    assert [r.job_id for r in since] == [5, 4, 3]
    until = reads.jobs(store, v.JobFilter(until=T0 + 50), T0 + 300, None)
    assert [r.job_id for r in until] == [2, 1]
    table = cli(home, "jobs", "-S", "2026-01-01T00:00:00", "-E", "2026-01-01T00:00:10").stdout
    assert table.splitlines()[0].split()[-6:] == ["start", "end", "elapsed", "exit", "nodes", "log"]
    assert [line.split()[0] for line in table.splitlines()[1:]] == ["2", "1"]


def test_usage_json_is_in_gpu_hours_like_its_table(home: Path) -> None:
    rows = {r["name"]: r for r in strict(cli(home, "usage", "--at", AT, "--json").stdout)}
    assert rows["ai2/tulu"]["usage_gpu_hours"] == pytest.approx(1700 / 3600)
    assert "0.5" in cli(home, "usage", "--at", AT).stdout  # one decimal


def test_audit_reads_take_json_like_every_read(home: Path) -> None:
    by_flag = strict(cli(home, "audit", "preemptions", "--json").stdout)
    by_format = strict(cli(home, "audit", "preemptions", "--format", "json").stdout)
    assert by_flag == by_format
    assert [(r["job_id"], r["for_job"], r["reason"]) for r in by_flag] == [(2, 3, "fairness")]


def test_log_tail_gives_the_last_events(home: Path, handles: Any) -> None:
    _, store = handles
    head = store.status().position
    out = strict(cli(home, "log", "--tail", "3", "--json").stdout)
    assert [r["position"] for r in out] == [head - 2, head - 1, head]
    lines = cli(home, "log", "-n", "2").stdout.splitlines()
    assert [int(line.split()[0]) for line in lines] == [head - 1, head]


def test_log_follow_prints_new_events_as_they_are_appended(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cli(home, "init", "--admin", "root")
    env = {k: val for k, val in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(GPULEDGER_HOME=str(home), GPULEDGER_USER="root")
    with subprocess.Popen(
        [GPULEDGER, "log", "--follow", "--json", "--interval", "0.1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            first = json.loads(proc.stdout.readline())
            assert first["tag"] == "ledger.initialised.v1"
            time.sleep(0.3)
            cli(home, "admin", "grant", "carol")
            second = json.loads(proc.stdout.readline())
            assert (second["position"], second["tag"]) == (2, "admin.granted.v1")
            assert second["event"]["user"] == "carol"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_plural_says_one_gpu() -> None:
    assert [plural(n, "GPU") for n in (0, 1, 2)] == ["0 GPUs", "1 GPU", "2 GPUs"]


# --- hold, release, requeue (like scontrol) --------------------------------------------------


@pytest.fixture
def own(home: Path, tmp_path: Path) -> Path:
    """A private copy of the built ledger (these tests append)."""
    copy = tmp_path / "home"
    shutil.copytree(home, copy, ignore=shutil.ignore_patterns("projections"))
    return copy


def test_a_held_job_is_skipped_until_released(own: Path) -> None:
    cli(own, "--as", "bob", "hold", "4", "--reason", "waiting for data")
    ledger = Ledger(own)
    try:
        with Store(":memory:") as store, EmbeddedSource(own) as source:
            Projector(store, source).catch_up()
            rows = previews.queue(ledger, store, FairShare(), T0 + 300, v.QueueFilter())
            _, decision = previews.live(ledger, store, FairShare(), T0 + 4000)
            held = reads.jobs(store, v.JobFilter(status="held"), T0 + 300, None)
    finally:
        ledger.close()
    assert [(r.order, r.job_id, r.state, r.code) for r in rows] == [
        (1, 5, "pending", "WAIT_CONTRACT"),
        (None, 4, "held", "HELD"),
    ]
    assert 4 not in {c.job_id for c in decision.considered()}
    assert [j.job_id for j in held] == [4] and held[0].status == "held"
    assert "held by bob (waiting for data)" in cli(own, "explain", "4").stdout
    out = cli(own, "--as", "dan", "release", "4", ok=False)
    assert out.returncode == 1 and "'dan' may not release job 4" in out.stderr
    cli(own, "--as", "bob", "release", "4")
    assert [r["job_id"] for r in json.loads(cli(own, "queue", "--json").stdout)] == [5, 4]


def test_requeue_puts_a_running_job_back_same_id_without_an_audit_violation(own: Path) -> None:
    out = cli(own, "--as", "dan", "requeue", "3", "--reason", "bad node")
    assert "requeued job 3" in out.stdout
    jobs = {j["job_id"]: j for j in json.loads(cli(own, "jobs", "--json").stdout)}
    assert (jobs[3]["status"], jobs[3]["nodes"], jobs[3]["started_at"]) == ("pending", [], None)
    nodes = {
        n["node"]: n["free_gpus"] for n in json.loads(cli(own, "node", "list", "--json").stdout)
    }
    assert nodes["n0"] == 8
    check = json.loads(cli(own, "audit", "check", "--json").stdout)
    assert check["violations"] == []
    assert check["noted"] == []  # its contract ended long ago
    assert "requeued on request, same job id" in cli(own, "explain", "3").stdout
    again = cli(own, "--as", "dan", "requeue", "3", ok=False)
    assert again.returncode == 1 and "[transition]" in again.stderr
    finished = cli(own, "hold", "1", ok=False).stderr
    assert "job 1 is finished" in finished and finished.strip().endswith("[transition]")


def test_a_requeue_inside_the_contract_by_its_owner_is_an_allowed_exception(
    tmp_path: Path,
) -> None:
    clock = SimClock(T0)
    ledger = Ledger(tmp_path / "h", clock, seeded_ids(1))
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n0", gpu_type="h100", gpus=8),
        ]
    )
    ledger.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=3600))
    slot = e.GpuSlot(node="n0", gpu_indices=(0,))
    ledger.execute(
        c.ApplyDecision(
            actor="@dispatcher",
            decision=c.DecisionBody(
                cycle_id="cycle-1",
                based_on=ledger.head(),
                policy_version="fairshare-1",
                placements=(e.Placement(job_id=1, slots=(slot,)),),
            ),
        )
    )
    clock.advance_to(T0 + 60)
    with pytest.raises(NotAuthorised):
        ledger.execute(c.RequeueJob(actor="bob", job_id=1))
    ledger.execute(c.RequeueJob(actor="alice", job_id=1, reason="wrong data"))
    assert ledger.state.jobs[1].status == "pending" and not ledger.state.holders
    history = [ev for _, ev in ledger.read(0, 1000)]
    ledger.close()
    report = check(history)
    assert report.violations == ()
    assert [(n.code, n.job_id) for n in report.noted] == [("REQUEUED_IN_CONTRACT", 1)]
    assert "requeued by alice: wrong data" in report.noted[0].message


def test_a_lost_node_shows_in_every_read_and_the_audit_holds(own: Path) -> None:
    """Job 3 (8 GPUs on n0, not resumable) fails when n0 is lost;
    the node list, the jobs, explain and the projection's node history say so; n0 returns."""
    out = cli(own, "node", "lost", "n0", "--reason", "power supply")
    assert "n0 is lost: 0 jobs requeued, 1 failed" in out.stdout
    nodes = {n["node"]: n for n in json.loads(cli(own, "node", "list", "--json").stdout)}
    assert (nodes["n0"]["state"], nodes["n0"]["lost_reason"], nodes["n0"]["jobs"]) == (
        "lost",
        "power supply",
        [],
    )
    assert "lost (power supply)" in cli(own, "node", "list").stdout
    jobs = {j["job_id"]: j for j in json.loads(cli(own, "jobs", "--json").stdout)}
    assert (jobs[3]["status"], jobs[3]["outcome"], jobs[3]["exit_code"]) == (
        "finished",
        "failed",
        None,
    )
    assert (jobs[3]["finish_reason"], jobs[3]["nodes"]) == ("node_lost", ["n0"])
    said = cli(own, "explain", "3").stdout
    assert "is finished (node lost)" in said
    lost = "ended with its node, which was lost (not resumable, so not requeued)"
    assert f"{lost} (node n0 lost: power supply)" in said
    again = cli(own, "node", "lost", "n0", "--reason", "x", ok=False)
    assert again.returncode == 1 and "node 'n0' is already lost" in again.stderr
    refused = cli(own, "--as", "dan", "node", "lost", "n1", "--reason", "x", ok=False)
    assert refused.returncode == 1 and "'dan' may not mark nodes lost" in refused.stderr
    cli(own, "node", "return", "n0")
    check = json.loads(cli(own, "audit", "check", "--json").stdout)
    assert check["violations"] == []
    with Store(":memory:") as store, EmbeddedSource(own) as source:
        Projector(store, source).catch_up()
        states = store.con.execute(
            "SELECT state, reason FROM node_history WHERE node = 'n0' ORDER BY position"
        ).fetchall()
    assert states[-2:] == [("lost", "power supply"), ("active", "")]


def test_log_names_each_event_by_the_version_it_is_read_as(tmp_path: Path) -> None:
    """Readers see the latest version only: a decision stored as `cycle.decided.v2` is shown as
    the v4 it upcasts to, its tag and its type agreeing; `audit sql` keeps the stored tag."""
    from projections.testing.synthetic import append_raw

    golden = Path(__file__).resolve().parents[1] / "golden" / "fairshare-6.jsonl"
    records = [
        (json.loads(line)["type"], line.encode())
        for line in golden.read_text().splitlines()
        if line
    ]
    home = tmp_path / "home"
    Ledger(home).close()  # the store's tables
    append_raw(home, records)
    out = strict(cli(home, "log", "--json", "--limit", str(len(records))).stdout)
    assert len(out) == len(records)
    assert all(r["tag"] == r["event"]["type"] for r in out)
    stored_v2 = [i for i, (tag, _) in enumerate(records) if tag == "cycle.decided.v2"]
    assert stored_v2 and all(out[i]["tag"] == "cycle.decided.v4" for i in stored_v2)
    stored = cli(home, "audit", "sql", "SELECT DISTINCT tag FROM events WHERE tag LIKE 'cycle%'")
    assert "cycle.decided.v2" in stored.stdout


def test_running_jobs_are_paged_sorted_and_counted_over_all_of_them(tmp_path: Path) -> None:
    """`state=running` pages, sorts and counts every job holding GPUs (not the first `limit`
    of them); `all` is every state shown: the queued ones and the running ones."""
    home = tmp_path / "home"
    clock = SimClock(T0)
    ledger = Ledger(home, clock, seeded_ids(3))
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/tulu", kind="project", shares=1),
            c.AddMember(actor="root", user="dan", project="ai2/tulu"),
            c.RegisterNode(actor="root", node="n0", gpu_type="h100", gpus=8),
        ]
    )
    for _ in range(5):
        ledger.execute(
            c.SubmitJob(
                actor="dan", account="ai2/tulu", gpus=1, min_runtime_s=600, duration_s=10**5
            )
        )
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        d = Dispatcher(
            ledger, ProjectionRanks(Projector(store, source)), FairShare(), KernelExecutor()
        )
        d.cycle(T0)
        ledger.execute(c.SubmitJob(actor="dan", account="ai2/tulu", gpus=8, min_runtime_s=600))
        Projector(store, source).catch_up()
        running = sorted(j.job_id for j in ledger.state.jobs.values() if j.status == "running")
        assert len(running) == 5, ledger.state.jobs

        def page(state: Any, **kw: Any) -> previews.QueuePage:
            f = v.QueueFilter(state=state, limit=kw.pop("limit", 2))
            return previews.queue_page(ledger, store, FairShare(), T0 + 10, f, **kw)

        first = page("running")
        assert first.total == 5 and [r.job_id for r in first.rows] == running[:2]
        assert [r.job_id for r in page("running", offset=4).rows] == running[4:]
        top = page("running", sort="job", descending=True)
        assert [r.job_id for r in top.rows] == running[::-1][:2]
        every = page("all", limit=100)
        assert every.total == 6 and every.codes == {"RUNNING": 5, **page("queued").codes}
        assert page("queued").total == 1
        f = v.QueueFilter(state="all", limit=100)
        assert [r.job_id for r in previews.queue(ledger, store, FairShare(), T0 + 10, f)] == [
            r.job_id for r in every.rows
        ]
    ledger.close()
    rows = strict(cli(home, "queue", "-t", "all", "--json").stdout)
    assert sorted(r["job_id"] for r in rows) == sorted([*running, max(running) + 1])


def test_a_series_starts_at_its_window_and_loses_no_hour(handles: Any) -> None:
    """A window starting inside an hour: that hour's part joins the first bucket (no point
    before the window, no partial first bucket), and every hour is counted once."""
    _, store = handles
    start, end = T0 + 1800.0, T0 + 7 * 3600.0
    view, series = hours.delivered_series(store, start, end, 2, 2 * 3600.0)
    points = [p for t in series.teams for p in t.points]
    assert points and min(p.at for p in points) == start, points
    assert sum(p.delivered_gpu_hours for p in points) == pytest.approx(
        sum(t.delivered_gpu_hours for t in view.teams)
    )


class _Placing(KernelExecutor):
    """An engine that takes placements and starts nothing yet (a Slurm launch still
    CONFIGURING): its jobs stay `placed`."""

    def carry_out(self, orders: Any, now: float) -> tuple[Any, ...]:
        return ()


def test_queue_rows_carry_every_jobs_limit_and_a_start_only_when_one_happened(
    tmp_path: Path,
) -> None:
    """atk46-23 F9: `queue --json` gave `time_limit_s: null` for pending jobs with a limit;
    F11: `queue -t running/all` tables printed a `started` time for a placed job (its
    placement) and for pending ones (their estimate). Every row has its limit; `started` is
    `-` until a process started, the estimate is its own column."""
    home = tmp_path / "home"
    ledger = Ledger(home, SimClock(T0), seeded_ids(5))
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all([
        c.OpenAccount(actor="root", path="ai2", kind="program"),
        c.OpenAccount(actor="root", path="ai2/tulu", kind="project", shares=1),
        c.AddMember(actor="root", user="dan", project="ai2/tulu"),
        c.RegisterNode(actor="root", node="n0", gpu_type="h100", gpus=8),
    ])  # fmt: skip
    for gpus, limit in ((8, 120), (4, 1800)):
        ledger.execute(c.SubmitJob(actor="dan", account="ai2/tulu", gpus=gpus, time_limit_s=limit))
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        d = Dispatcher(ledger, ProjectionRanks(Projector(store, source)), FairShare(), _Placing())
        d.cycle(T0)
        Projector(store, source).catch_up()
        assert ledger.state.jobs[1].status == "placed"
    ledger.close()
    rows = {r["job_id"]: r for r in strict(cli(home, "queue", "-t", "all", "--json").stdout)}
    assert {i: (r["state"], r["time_limit_s"]) for i, r in rows.items()} == {
        1: ("placed", 120),
        2: ("pending", 1800),
    }
    assert rows[1]["started_at"] is None
    table = cli(home, "queue", "-t", "all").stdout
    assert "est. start" in table, table
    line = {
        ln.split()[0]: ln.split() for ln in table.splitlines() if ln.split()[:1] in (["1"], ["2"])
    }
    assert line["1"][5:7] == ["-", "-"], table  # placed: not started, no estimate
    assert line["2"][5] == "-" and line["2"][6] != "-", table  # pending: its estimate alone
