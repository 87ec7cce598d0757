"""The projector on the real embedded log: read models, queries, resume, corrupt and unknown
events, and the guards around the DuckDB file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ledger.store.application import Ledger
from ledger.store.clock import SimClock
from ledger.store.embedded import EmbeddedSource, project, rebuild
from projections import fairshare as fs
from projections import queries
from projections.errors import (
    CorruptEvent,
    ProjectionBusy,
    ProjectionMismatch,
    ProjectionOutdated,
    SourceUnavailable,
)
from projections.projector import Projector
from projections.store import Store, projection_path
from projections.testing import compare as audit
from projections.testing.reference import fold
from projections.testing.synthetic import append_raw
from schemas import codec
from schemas import commands as c
from schemas.events import GpuSlot, NodeRegistered, Placement, Preemption

DISPATCHER, EXECUTOR = "@dispatcher", "@executor"


def place(led: Ledger, cycle: str, *placements: tuple[int, str, tuple[int, ...]]) -> None:
    led.execute(
        c.ApplyDecision(
            actor=DISPATCHER,
            decision=c.DecisionBody(
                cycle_id=cycle,
                based_on=led.position,
                policy_version="test-1",
                placements=tuple(
                    Placement(job_id=j, slots=(GpuSlot(node=n, gpu_indices=idx),))
                    for j, n, idx in placements
                ),
            ),
        )
    )


def start(led: Ledger, *jobs: int) -> None:
    led.execute_all([c.StartJob(actor=EXECUTOR, job_id=j) for j in jobs])


@pytest.fixture
def scenario(org_ledger: Ledger, clock: SimClock) -> Ledger:
    """Three jobs placed at t=1000 (alice 4 GPUs funded resumable on n1, bob 8 unfunded on n2,
    carol 2 funded on a1); at 4600 alice's job is preempted and requeued, carol's finishes and
    tulu's shares go 1 -> 2; at 8200 alice's job is placed again; at 11800 it finishes, bob's is
    cancelled, carol submits a job that stays pending and a1 is drained."""
    led = org_ledger
    led.execute_all(
        [
            c.SubmitJob(
                actor="alice", account="ai2/olmo", gpus=4, min_runtime_s=3600, resumable=True
            ),
            c.SubmitJob(actor="bob", account="ai2/olmo", gpus=8, min_runtime_s=0, gpu_type="h100"),
            c.SubmitJob(actor="carol", account="ai2/tulu", gpus=2, min_runtime_s=3600),
        ]
    )
    place(led, "c1", (1, "n1", (0, 1, 2, 3)), (2, "n2", tuple(range(8))), (3, "a1", (0, 1)))
    start(led, 1, 2, 3)
    clock.advance_to(4600.0)
    led.execute(
        c.ApplyDecision(
            actor=DISPATCHER,
            decision=c.DecisionBody(
                cycle_id="c2",
                based_on=led.position,
                policy_version="test-1",
                preemptions=(Preemption(job_id=1, reason="fairness", note="test"),),
            ),
        )
    )
    led.execute(c.FinishJob(actor=EXECUTOR, job_id=3, exit_code=0))
    led.execute(c.SetShares(actor="root", account="ai2/tulu", shares=2))
    clock.advance_to(8200.0)
    place(led, "c3", (1, "n1", (0, 1, 2, 3)))
    start(led, 1)
    clock.advance_to(11800.0)
    led.execute(c.FinishJob(actor=EXECUTOR, job_id=1, exit_code=0))
    led.execute(c.CancelJob(actor="bob", job_id=2))
    led.execute(c.SubmitJob(actor="carol", account="ai2/tulu", gpus=1, min_runtime_s=3600))
    led.execute(c.DrainNode(actor="root", node="a1", reason="maintenance"))
    return led


def all_events(led: Ledger) -> list:
    return led.read(0, 1_000_000)


def test_projection_equals_the_reference_fold(scenario: Ledger, home: Path) -> None:
    result = project(home)
    assert (result.applied, result.unknown, result.position) == (
        scenario.position,
        0,
        scenario.position,
    )
    with Store.open(home, read_only=True) as store:
        got = audit.dump(store, audit.REFERENCE_TABLES)
    want = audit.reference_dump(fold(all_events(scenario)))
    assert audit.differences(got, want) == []


def test_job_and_interval_rows(scenario: Ledger, home: Path) -> None:
    project(home)
    with Store.open(home, read_only=True) as store:
        jobs = {r["job_id"]: r for r in audit.dump(store, ("jobs",))["jobs"]}
        ivs = audit.dump(store, ("job_intervals",))["job_intervals"]
        nodes = store.con.execute(
            "SELECT node, state, gpus, free_gpus FROM nodes ORDER BY node"
        ).fetchall()
        decisions = store.con.execute(
            "SELECT cycle_id, placed_jobs, preempted_jobs FROM decisions ORDER BY position"
        ).fetchall()
        preempted = store.con.execute(
            "SELECT job_id, reason, leaf, placed_at, resumable FROM preemptions"
        ).fetchall()
    j1 = jobs[1]
    assert (j1["status"], j1["outcome"], j1["exit_code"]) == ("finished", "completed", 0)
    assert (j1["placements"], j1["preemptions"], j1["placed_at"], j1["finished_at"]) == (
        2,
        1,
        8200.0,
        11800.0,
    )
    assert (jobs[2]["status"], jobs[2]["outcome"], jobs[2]["funded"]) == (
        "finished",
        "cancelled",
        False,
    )
    assert (jobs[4]["status"], jobs[4]["leaf"]) == ("pending", "ai2/tulu/carol")
    assert [
        (i["job_id"], i["start_at"], i["end_at"], i["end_reason"], i["gpu_type"]) for i in ivs
    ] == [
        (1, 1000.0, 4600.0, "preempted", "h100"),
        (2, 1000.0, 11800.0, "cancelled", "h100"),
        (3, 1000.0, 4600.0, "completed", "a100"),
        (1, 8200.0, 11800.0, "completed", "h100"),
    ]
    assert ivs[0]["slots"] == [{"node": "n1", "gpu_indices": [0, 1, 2, 3]}]
    assert nodes == [("a1", "drained", 4, 4), ("n1", "active", 8, 8), ("n2", "active", 8, 8)]
    assert decisions == [("c1", [1, 2, 3], []), ("c2", [], [1]), ("c3", [1], [])]
    assert preempted == [(1, "fairness", "ai2/olmo/alice", 1000.0, True)]


def test_nodes_show_the_gpus_running_jobs_hold(org_ledger: Ledger, home: Path) -> None:
    org_ledger.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=3, min_runtime_s=60))
    place(org_ledger, "c1", (1, "n1", (2, 5, 7)))
    project(home)
    with Store.open(home, read_only=True) as store:
        row = store.con.execute(
            "SELECT held_gpus, free_gpus, held_indices FROM nodes WHERE node = 'n1'"
        ).fetchall()
    assert row == [(3, 5, [2, 5, 7])]


def test_jobs_and_nodes_for_a_snapshot(org_ledger: Ledger, home: Path) -> None:
    org_ledger.execute_all(
        [
            c.SubmitJob(actor="alice", account="ai2/olmo", gpus=3, min_runtime_s=60),
            c.SubmitJob(actor="bob", account="ai2/olmo", gpus=1, min_runtime_s=0),
        ]
    )
    place(org_ledger, "c1", (1, "n1", (2, 5, 7)))
    project(home)
    with Store.open(home, read_only=True) as store:
        active = queries.jobs(store)
        n1 = next(n for n in queries.nodes(store) if n["node"] == "n1")
    assert [(j["job_id"], j["status"], j["slots"]) for j in active] == [
        (1, "placed", [{"node": "n1", "gpu_indices": [2, 5, 7]}]),
        (2, "pending", []),
    ]
    assert (n1["free_gpus"], n1["free"]) == (5, [0, 1, 3, 4, 6])


def test_usage_by_account_and_by_user(scenario: Ledger, home: Path) -> None:
    project(home)
    with Store.open(home, read_only=True) as store:
        by_account = {u.name: u.gpu_seconds for u in queries.usage(store, 11800.0)}
        by_user = {u.name: u.gpu_seconds for u in queries.usage(store, 11800.0, by="user")}
        last_hour = {
            u.name: u.gpu_seconds
            for u in queries.usage(store, 4600.0, policy=fs.UsagePolicy(window_s=1800.0))
        }
        weighted = {
            u.name: u.gpu_seconds
            for u in queries.usage(store, 11800.0, policy=fs.UsagePolicy(weights={"h100": 2.0}))
        }
    # alice: 4 GPUs x (3600 + 3600) s; bob ran unfunded (free); carol: 2 x 3600
    assert by_account == {
        "ai2": 36000.0,
        "ai2/olmo": 28800.0,
        "ai2/olmo/alice": 28800.0,
        "ai2/tulu": 7200.0,
        "ai2/tulu/carol": 7200.0,
    }
    assert by_user == {"alice": 28800.0, "carol": 7200.0}
    assert last_hour["ai2/olmo/alice"] == 4 * 1800.0
    assert weighted["ai2/olmo/alice"] == 2 * 28800.0 and weighted["ai2/tulu/carol"] == 7200.0


def test_shares_table_ranks_like_fair_tree(scenario: Ledger, home: Path) -> None:
    project(home)
    with Store.open(home, read_only=True) as store:
        rows = {r.path: r for r in queries.shares_table(store, 11800.0)}
        tree = queries.fair_share(store, 11800.0)
        before_change = {r.path: r for r in queries.shares_table(store, 4599.0)}
    # olmo: shares 3/5, usage 0.8 -> 0.75; tulu: 2/5 over 0.2 -> 2.0: tulu's users first
    assert rows["ai2/olmo"].level_fs == pytest.approx(0.75)
    assert rows["ai2/tulu"].level_fs == pytest.approx(2.0)
    assert {p: (r.rank, r.factor) for p, r in rows.items() if r.rank} == {
        "ai2/tulu/carol": (1, 1.0),
        "ai2/olmo/bob": (2, pytest.approx(2 / 3)),
        "ai2/olmo/alice": (3, pytest.approx(1 / 3)),
    }
    assert tree.leaf_ranks() == {"ai2/tulu/carol": 0, "ai2/olmo/bob": 1, "ai2/olmo/alice": 2}
    assert before_change["ai2/tulu"].shares == 1 and rows["ai2/tulu"].shares == 2


def test_delivered_report_hour_by_hour_and_by_period(scenario: Ledger, home: Path) -> None:
    project(home)
    with Store.open(home, read_only=True) as store:
        hours = queries.team_hours(store, 3600.0, 14400.0)
        report = queries.delivered_report(store, 3600.0, 14400.0)
    olmo = [h for h in hours if h.team == "ai2/olmo"]
    assert [h.allocation for h in olmo] == pytest.approx([0.75, 0.6, 0.6])
    assert [h.owed_gpu_h for h in olmo] == pytest.approx([4.0, 4.0, 4000 / 3600])
    assert [h.delivered_gpu_h for h in olmo] == pytest.approx(
        [4000 / 3600, 4 * 2600 / 3600, 4000 / 3600]
    )
    assert olmo[2].capacity_gpu_h == pytest.approx((20 * 1000 + 16 * 2600) / 3600)
    teams = {t.team: t for t in report.teams}
    assert teams["ai2/olmo"].by_period == pytest.approx((46 / 9) / (82 / 9))
    assert teams["ai2/tulu"].owed_gpu_h == pytest.approx(2000 / 3600 + 2600 / 3600)
    assert teams["ai2/tulu"].hour_by_hour == pytest.approx((2000 / 3600) / (4600 / 3600))
    assert (report.teams_at_95, report.teams_owed, report.worst_team) == (0, 2, "ai2/tulu")
    assert report.by_period == pytest.approx((46 / 9 + 2000 / 3600) / (82 / 9 + 4600 / 3600))


def test_queries_match_the_reference(scenario: Ledger, home: Path) -> None:
    project(home)
    ref = fold(all_events(scenario))
    with Store.open(home, read_only=True) as store:
        for at in (1000.0, 2000.0, 4600.0, 9000.0, 11800.0, 20000.0):
            for policy in (fs.UsagePolicy(), fs.UsagePolicy(half_life_s=3600.0)):
                got = {u.name: u.gpu_seconds for u in queries.usage(store, at, policy=policy)}
                assert got == pytest.approx(ref.account_usage(at, policy))
        got_hours = queries.team_hours(store, 0.0, 20000.0)
        assert [(h.team, h.hour) for h in got_hours] == [
            (h.team, h.hour) for h in ref.team_hours(0.0, 20000.0)
        ]


def test_batch_size_does_not_change_the_result(
    scenario: Ledger, home: Path, tmp_path: Path
) -> None:
    dumps = []
    for size in (1, 7, 100_000):
        with EmbeddedSource(home) as src, Store(tmp_path / f"b{size}.duckdb") as store:
            Projector(store, src, batch_size=size).catch_up()
            dumps.append(audit.dump(store))
    assert audit.differences(dumps[0], dumps[1]) == []
    assert audit.differences(dumps[0], dumps[2]) == []


def test_resumes_from_the_tracked_position(scenario: Ledger, home: Path, tmp_path: Path) -> None:
    first = project(home, until=20, batch_size=6)
    assert first.position == 20
    with Store.open(home) as store:
        assert store.position() == 20
    second = project(home, batch_size=6)
    assert (second.applied, second.position) == (scenario.position - 20, scenario.position)
    assert project(home).applied == 0
    with EmbeddedSource(home) as src, Store(tmp_path / "clean.duckdb") as clean:
        Projector(clean, src).catch_up()
        want = audit.dump(clean)
    with Store.open(home) as store:
        assert audit.differences(audit.dump(store), want) == []


def test_a_projector_beside_folds_on_its_own_connection_one_catch_up_at_a_time(
    scenario: Ledger, home: Path, tmp_path: Path
) -> None:
    """`Projector.beside` (the server's reads' projector, on a thread of its own): it folds the
    same projection through a connection and a source of its own, the main projector sees its
    rows, and while the main one holds the shared lock (a cycle's catch-up and ranks query) the
    one beside folds nothing; the result is the projection folded by one projector."""
    import threading

    with EmbeddedSource(home) as src, Store.open(home) as store:
        main = Projector(store, src)
        main.catch_up(until=10)
        with EmbeddedSource(home) as src2:
            beside = main.beside(src2)
            assert beside.store.con is not store.con and beside.lock is main.lock
            done = threading.Event()

            def fold() -> None:
                beside.catch_up(until=30)
                done.set()

            with main.lock:  # a cycle between its catch-up and its ranks query
                folding = threading.Thread(target=fold)
                folding.start()
                assert not done.wait(0.3)
                assert store.position() == 10
            folding.join(10)
            assert done.is_set() and store.position() == 30
            main.catch_up()
            assert beside.store.position() == scenario.position
            beside.store.close()
        got = audit.dump(store)
    with EmbeddedSource(home) as src, Store(tmp_path / "clean.duckdb") as clean:
        Projector(clean, src).catch_up()
        assert audit.differences(got, audit.dump(clean)) == []


def test_progress_reports_each_batch(scenario: Ledger, home: Path) -> None:
    seen: list[tuple[int, int]] = []
    project(home, batch_size=10, progress=lambda pos, head: seen.append((pos, head)))
    head = scenario.position
    assert seen[-1] == (head, head)
    assert [p for p, _ in seen] == sorted({min(head, k) for k in range(10, head + 10, 10)})


def test_rebuild_replaces_the_projection(scenario: Ledger, home: Path) -> None:
    project(home, until=5)
    seen: list[int] = []
    result = rebuild(home, progress=lambda pos, head: seen.append(pos), batch_size=8)
    assert result.position == scenario.position and seen[-1] == scenario.position
    assert not projection_path(home).with_name("ledger.duckdb.rebuild").exists()
    with Store.open(home, read_only=True) as store:
        assert store.position() == scenario.position


# --- corrupt and unknown events ----------------------------------------------------------------
# The ledger application itself refuses to fold past such records, so they and the valid event
# after them are written straight into the store.

LATE_NODE = (
    "node.registered.v1",
    codec.encode(
        NodeRegistered(
            event_id="e-late",
            at=2000.0,
            actor="root",
            cluster="default",
            node="late",
            gpu_type="h100",
            gpus=8,
        )
    ),
)

CORRUPT = [
    ("bytes that are not JSON", "job.started.v1", b"{not json"),
    (
        "a known event with a field of the wrong type",
        "job.started.v1",
        b'{"type":"job.started.v1","event_id":"x","at":"soon","actor":"a","job_id":1}',
    ),
    (
        "a known event missing a field",
        "job.started.v1",
        b'{"type":"job.started.v1","event_id":"x","at":1.0,"actor":"a"}',
    ),
    (
        "a topic that disagrees with the bytes",
        "job.started.v1",
        b'{"type":"job.requeued.v1","event_id":"x","at":1.0,"actor":"a","job_id":1}',
    ),
    ("an unknown tag whose bytes are not a JSON object", "job.teleported.v9", b"[1, 2, 3]"),
]


@pytest.mark.parametrize(("tag", "data"), [c[1:] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_a_corrupt_event_stops_the_projector_at_its_position(
    org_ledger: Ledger, home: Path, tag: str, data: bytes
) -> None:
    good = org_ledger.position
    bad = append_raw(home, [(tag, data), LATE_NODE])
    for _ in range(2):  # a second run stops at the same place: nothing is skipped
        with pytest.raises(CorruptEvent) as info:
            project(home, batch_size=4)
        assert info.value.position == bad - 1 == good + 1
        assert f"log position {good + 1}" in info.value.line()
        assert info.value.code == "corrupt"
        with Store.open(home, read_only=True) as store:
            assert store.position() == good


def test_an_unknown_event_is_kept_counted_and_otherwise_ignored(
    org_ledger: Ledger, home: Path
) -> None:
    newer = {
        "type": "job.teleported.v9",
        "event_id": "e-x",
        "at": 1500.0,
        "actor": "@future",
        "job_id": 7,
        "node": "n1",
        "where": "mars",
    }
    pos = append_raw(home, [("job.teleported.v9", json.dumps(newer).encode()), LATE_NODE]) - 1
    result = project(home)
    assert (result.unknown, result.position) == (1, pos + 1)
    with Store.open(home, read_only=True) as store:
        row = store.con.execute(
            "SELECT known, tag, occurred_at, actor, job_id, node, raw->>'$.where' "
            "FROM events WHERE position = ?",
            [pos],
        ).fetchall()
        status = queries.status(store)
        nodes = [n for (n,) in store.con.execute("SELECT node FROM nodes ORDER BY node").fetchall()]
    assert row == [(False, "job.teleported.v9", 1500.0, "@future", 7, "n1", "mars")]
    assert (status.unknown_events, status.unknown_tags) == (1, {"job.teleported.v9": 1})
    assert "late" in nodes


# --- guards --------------------------------------------------------------------------------------


def test_no_event_log(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="no event log"):
        project(tmp_path / "nowhere")


def test_a_projection_ahead_of_its_log_is_refused(
    scenario: Ledger, home: Path, tmp_path: Path
) -> None:
    project(home)
    other = tmp_path / "other"
    small = Ledger(other, SimClock(1.0))
    small.execute(c.InitLedger(actor="root", admin="root"))
    small.close()
    with (
        EmbeddedSource(other) as src,
        Store.open(home) as store,
        pytest.raises(ProjectionMismatch, match="log ends at 1") as info,
    ):
        Projector(store, src).catch_up()
    assert "rebuild" in info.value.hint


def test_a_projection_of_another_schema_version_is_made_again_by_its_writer(
    scenario: Ledger, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After an upgrade the projection file is older code's: a reader is told, and the first
    writer (the service, an embedded read, a follower) makes it again from the log, logging
    one line, so nothing waits for a manual rebuild and nothing is lost."""
    project(home)
    with Store.open(home, read_only=True) as before:
        clean = audit.dump(before)
    with Store.open(home) as store:
        store.con.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")
    with pytest.raises(ProjectionOutdated, match="schema version 0") as info:
        Store.open(home, read_only=True)
    assert "rebuild" in info.value.hint
    with caplog.at_level("WARNING", logger="gpuledger.projection"):
        store = Store.open(home)
    assert "schema version 0" in caplog.text and "made again from the log" in caplog.text
    with store, EmbeddedSource(home) as src:
        assert store.position() == 0
        Projector(store, src).catch_up()
    with Store.open(home, read_only=True) as after:
        assert audit.dump(after) == clean


@pytest.mark.parametrize("action", ["open", "rebuild"])
def test_a_second_writer_process_is_refused(scenario: Ledger, home: Path, action: str) -> None:
    project(home)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time, duckdb
            con = duckdb.connect({str(projection_path(home))!r})
            print("ready", flush=True)
            sys.stdin.read()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(ProjectionBusy, match="another process"):
            if action == "open":
                Store.open(home)
            else:
                rebuild(home)
    finally:
        holder.communicate(timeout=30)
