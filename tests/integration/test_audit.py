"""Audit against real stores: the hash chain finds an edited, a deleted and a reordered event at
their positions; `audit sql` is read-only; the reports and exports; `audit check` over a store
(with a seeded violation) and over a projection; the Kafka copy checked against the store."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from ledger.cli import cli
from ledger.cycle.dispatcher import Dispatcher, ProjectionRanks
from ledger.dispatch.policy import FairShare
from ledger.history.audit import check_charges
from ledger.history.copy_check import verify_copy
from ledger.history.tamper import store_records, verify_chain
from ledger.sim.kernel import KernelExecutor
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from projections.chain import link
from projections.projector import Projector
from projections.store import Store
from projections.testing.synthetic import append_raw
from schemas import codec
from schemas import commands as c
from schemas import events as e

T0 = 1_767_225_600.0


def build(home: Path) -> None:
    """An organisation, a few cycles with a fairness preemption, an admin preemption inside a
    contract (with a reason), a share change by a manager, a finish."""
    clock = SimClock(T0)
    ledger = Ledger(home, clock, seeded_ids(3))
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=1),
            c.OpenAccount(actor="root", path="ai2/tulu", kind="project", shares=1),
            c.GrantManager(actor="root", user="pm", account="ai2"),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.AddMember(actor="root", user="dan", project="ai2/tulu"),
            c.RegisterNode(actor="root", node="n0", gpu_type="h100", gpus=8),
        ]
    )
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        d = Dispatcher(
            ledger, ProjectionRanks(Projector(store, source)), FairShare(), KernelExecutor()
        )
        ledger.execute(
            c.SubmitJob(
                actor="alice",
                account="ai2/olmo",
                gpus=8,
                min_runtime_s=600,
                resumable=True,
                duration_s=9_000,
            )
        )
        d.cycle(T0)
        clock.advance_to(T0 + 1_000)
        ledger.execute(
            c.SubmitJob(
                actor="dan", account="ai2/tulu", gpus=8, min_runtime_s=3_600, duration_s=5_000
            )
        )
        d.cycle(T0 + 1_000)  # fairness: dan's team has no usage
        clock.advance_to(T0 + 2_000)
        ledger.execute(c.PreemptJob(actor="root", job_id=2, note="node n0 overheats"))
        ledger.execute(c.SetShares(actor="pm", account="ai2/tulu", shares=2, reason="grant"))
        d.cycle(T0 + 2_000)
        clock.advance_to(T0 + 20_000)
        d.cycle(T0 + 20_000)
    ledger.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("audit") / "home"
    build(home)
    return home


@pytest.fixture
def home(built: Path, tmp_path: Path) -> Iterator[Path]:
    """A private copy of the built ledger (tests tamper with it)."""
    copy = tmp_path / "home"
    shutil.copytree(built, copy, ignore=shutil.ignore_patterns("projections"))
    yield copy


def run(home: Path, *args: str) -> tuple[int, str]:
    out = CliRunner().invoke(cli, ["--home", str(home), *args])
    return out.exit_code, out.output


def sql(db: Path, statement: str, params: tuple[object, ...] = ()) -> None:
    con = sqlite3.connect(db / "events.sqlite")
    with con:
        con.execute(statement, params)
    con.close()


def state_at(home: Path, position: int) -> bytes:
    con = sqlite3.connect(home / "events.sqlite")
    try:
        row = con.execute("SELECT state FROM stored_events WHERE rowid = ?", (position,)).fetchone()
        return bytes(row[0])
    finally:
        con.close()


def link_at(home: Path, position: int) -> str:
    """The link to the stored row at `position` (every column of it)."""
    con = sqlite3.connect(home / "events.sqlite")
    try:
        tag, data, version = con.execute(
            "SELECT topic, state, originator_version FROM stored_events WHERE rowid = ?",
            (position,),
        ).fetchone()
        return link(position, tag, bytes(data), version)
    finally:
        con.close()


def head(home: Path) -> int:
    return max(r.position for r in store_records(home))


# --- tamper evidence ---------------------------------------------------------------------------


def test_an_intact_store_verifies_and_prints_its_head_link(home: Path) -> None:
    code, out = run(home, "audit", "verify")
    assert code == 0, out
    assert f"head link {link_at(home, head(home))}" in out


@pytest.mark.parametrize("position", [2, 9, 20])
def test_an_edited_event_is_reported_at_its_position(home: Path, position: int) -> None:
    data = state_at(home, position)
    forged = data.replace(b'"actor":"root"', b'"actor":"mallory"')
    forged = forged if forged != data else data.replace(b'"at":', b'"at": ')
    assert forged != data
    sql(home, "UPDATE stored_events SET state = ? WHERE rowid = ?", (forged, position))
    report = verify_chain(store_records(home))
    assert [(p.position, p.kind) for p in report.problems] == [(position, "edited")]
    code, out = run(home, "audit", "verify")
    assert code == 1
    assert f"first at position {position} (edited)" in out
    assert f"position {position + 1} recorded" in out


def test_a_row_rewritten_as_text_is_named_not_a_crash(home: Path) -> None:
    sql(home, "UPDATE stored_events SET state = CAST(state AS TEXT) WHERE rowid = 7")
    report = verify_chain(store_records(home))
    assert [(p.position, p.kind) for p in report.problems] == [(7, "corrupt")]
    code, out = run(home, "audit", "verify")
    assert code == 1
    assert "position 7: corrupt: stored as text, not as bytes" in out


def test_a_wrong_prev_hash_on_the_last_event_is_named_a_broken_link(home: Path) -> None:
    n = head(home)
    data = state_at(home, n)
    kept = link_at(home, n - 1)
    assert kept.encode() in data
    sql(
        home,
        "UPDATE stored_events SET state = ? WHERE rowid = ?",
        (data.replace(kept.encode(), b"v2:" + b"0" * 64), n),
    )
    code, out = run(home, "audit", "verify")
    assert code == 1
    assert f"first at position {n} (broken-link)" in out
    assert f"does not match the bytes of position {n - 1}" in out
    assert "edited" not in out


def test_a_deleted_event_is_reported_as_a_gap(home: Path) -> None:
    sql(home, "DELETE FROM stored_events WHERE rowid = 12")
    report = verify_chain(store_records(home))
    assert [(p.position, p.kind) for p in report.problems] == [(12, "deleted")]
    code, out = run(home, "audit", "verify")
    assert code == 1 and "first at position 12 (deleted)" in out


def test_a_deleted_event_with_the_rest_renumbered_is_still_found(home: Path) -> None:
    n = head(home)
    con = sqlite3.connect(home / "events.sqlite")
    with con:
        con.execute("DELETE FROM stored_events WHERE rowid = 12")
        for rowid in range(13, n + 1):  # close the gap in the rowids, keep the versions
            con.execute("UPDATE stored_events SET rowid = ? WHERE rowid = ?", (rowid - 1, rowid))
    con.close()
    report = verify_chain(store_records(home))
    assert report.problems and report.problems[0].position == 12
    assert report.problems[0].kind == "deleted"


def test_two_swapped_events_are_reported_as_reordered(home: Path) -> None:
    a, b = state_at(home, 15), state_at(home, 16)
    sql(home, "UPDATE stored_events SET state = ? WHERE rowid = 15", (b,))
    sql(home, "UPDATE stored_events SET state = ? WHERE rowid = 16", (a,))
    report = verify_chain(store_records(home))
    assert report.problems[0].position == 15
    assert {p.position for p in report.problems} <= {15, 16, 17}
    assert "reordered" in {p.kind for p in report.problems}  # (and each row's tag now differs
    # from its payload's type where the two events' types differ: `edited`)
    code, out = run(home, "audit", "verify")
    assert code == 1 and "first at position 15 (" in out and "reordered" in out


COLUMNS = {
    "topic (the tag)": ("topic", "'node.removed.v1'"),
    "state (one byte of the payload)": (
        "state",
        "CAST(replace(CAST(state AS TEXT), '\"at\":', '\"at\": ') AS BLOB)",
    ),
    "originator_version": ("originator_version", "originator_version + 1000"),
    "originator_id (the stream)": ("originator_id", "'00000000000000000000000000000000'"),
    "rowid (the position)": ("rowid", "rowid + 1000"),
}


@pytest.mark.parametrize("where", ["middle", "last"])
@pytest.mark.parametrize("what", list(COLUMNS))
def test_an_edit_of_any_stored_column_is_named_at_its_row(
    home: Path, what: str, where: str
) -> None:
    """The chain covers every byte of a stored row (v2 links), each row is checked on its own,
    and the last row is held by the projection's link: an edit of any one column of any row
    is named at that row by `audit verify`."""
    run(home, "projection", "rebuild")  # the projection keeps a link to the last event
    n = head(home)
    at = 9 if where == "middle" else n
    column, value = COLUMNS[what]
    sql(home, f"UPDATE stored_events SET {column} = {value} WHERE rowid = ?", (at,))
    code, out = run(home, "audit", "verify")
    assert code == 1, out
    named = at if column != "rowid" else min(at, n)
    assert f"first at position {named} " in out, out


# --- read-only SQL, reports, exports ------------------------------------------------------------


def test_audit_sql_answers_a_select(home: Path) -> None:
    code, out = run(
        home,
        "audit",
        "sql",
        "SELECT job_id, reason FROM preemptions ORDER BY position",
        "--format",
        "json",
    )
    assert code == 0, out
    assert json.loads(out) == [
        {"job_id": 1, "reason": "fairness"},
        {"job_id": 2, "reason": "admin"},
    ]


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO jobs SELECT * FROM jobs",
        "DELETE FROM events",
        "UPDATE jobs SET status = 'finished'",
        "DROP TABLE events",
        "CREATE TABLE x AS SELECT 1",
        "COPY events TO '/tmp/events.csv'",
        "SELECT 1; DELETE FROM events",
        "ATTACH '/tmp/other.duckdb' AS other",
        "PRAGMA enable_profiling",
    ],
    ids=[
        "insert",
        "delete",
        "update",
        "drop",
        "create",
        "copy",
        "two statements",
        "attach",
        "pragma",
    ],
)
def test_audit_sql_refuses_anything_but_one_select(home: Path, statement: str) -> None:
    code, out = run(home, "audit", "sql", statement)
    assert code == 1
    assert out.startswith("error: audit sql")
    assert "Traceback" not in out


def test_audit_sql_cannot_read_files(home: Path) -> None:
    code, out = run(home, "audit", "sql", "SELECT * FROM read_csv('/etc/hostname')")
    assert code == 1
    assert "the query failed" in out and "disabled" in out


def test_audit_sql_opens_the_projection_read_only(home: Path) -> None:
    run(home, "projection", "status")  # creates the projection file
    code, out = run(home, "audit", "sql", "SELECT nextval('no_such_sequence')")
    assert code == 1 and "Traceback" not in out


def test_exports_as_csv_json_and_parquet(home: Path, tmp_path: Path) -> None:
    query = "SELECT job_id, slots, funded FROM job_intervals ORDER BY start_position"
    for fmt in ("csv", "json", "parquet"):
        code, out = run(
            home, "audit", "sql", query, "--format", fmt, "--output", str(tmp_path / f"out.{fmt}")
        )
        assert code == 0, out
    rows = list(csv.DictReader(io.StringIO((tmp_path / "out.csv").read_text())))
    assert [r["job_id"] for r in rows] == ["1", "2", "1"]
    assert json.loads(rows[0]["slots"])[0]["node"] == "n0"
    data = json.loads((tmp_path / "out.json").read_text())
    assert data[0]["slots"][0]["gpu_indices"] == [0, 1, 2, 3, 4, 5, 6, 7]
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("job_id").to_pylist() == [1, 2, 1]
    code, out = run(home, "audit", "sql", query, "--format", "parquet")
    assert code == 1 and "parquet needs --output" in out


def test_audit_job_tells_the_whole_history_with_reasons(home: Path) -> None:
    code, out = run(home, "audit", "job", "1", "--format", "json")
    assert code == 0, out
    rows = json.loads(out)
    events = [r["event"] for r in rows]
    assert events[:3] == ["job.submitted", "job.placed", "job.started"]
    preempted = next(r for r in rows if r["event"] == "job.preempted")
    assert "fairness for job 2" in preempted["detail"]
    placed = next(r for r in rows if r["event"] == "job.placed")["detail"]
    assert re.search(r"; #1 of \d+ placed, \d+ considered$", placed), placed


def test_audit_preemptions_marks_the_admin_one_inside_its_contract(home: Path) -> None:
    code, out = run(home, "audit", "preemptions", "--format", "json")
    assert code == 0, out
    rows = json.loads(out)
    assert [(r["job_id"], r["reason"], r["inside_contract"]) for r in rows] == [
        (1, "fairness", False),
        (2, "admin", True),
    ]
    assert rows[1]["note"] == "node n0 overheats" and rows[1]["actor"] == "root"
    code, out = run(home, "audit", "preemptions", "--account", "ai2/tulu", "--format", "json")
    assert [r["job_id"] for r in json.loads(out)] == [2]


def test_audit_budget_changes_says_who_changed_what_and_why(home: Path) -> None:
    code, out = run(home, "audit", "budget-changes", "--since", str(T0 + 1), "--format", "json")
    assert code == 0, out
    (row,) = json.loads(out)
    assert (row["who"], row["account"], row["shares_before"], row["shares_after"]) == (
        "pm",
        "ai2/tulu",
        1,
        2,
    )
    assert row["reason"] == "grant"


GOLDEN_V1 = Path(__file__).parents[1] / "golden" / "events-v1.jsonl"


def test_the_audit_reads_stored_v1_decisions_as_their_latest_version(tmp_path: Path) -> None:
    """A log of v1 decision records (the golden corpus): the audit's job history and the
    budget changes come from the upcast tables, so a v1 cycle reads as a v2 one does (codes of
    the first waiting jobs, a placement's place in its cycle)."""
    home = tmp_path / "v1"
    home.mkdir()
    stored = GOLDEN_V1.read_bytes().splitlines()
    append_raw(home, [(codec.peek_tag(raw) or "", raw) for raw in stored])
    code, out = run(home, "audit", "job", "5", "--format", "json")
    assert code == 0, out
    rows = json.loads(out)
    assert [r["detail"] for r in rows if r["event"] == "cycle.waiting"] == [
        "waited in cycle-38: WAIT_RESOURCES"
    ]
    code, out = run(home, "audit", "job", "4", "--format", "json")
    placed = next(r for r in json.loads(out) if r["event"] == "job.placed")["detail"]
    assert placed.endswith("; #1 of 2 placed, 3 considered"), placed
    code, out = run(home, "audit", "budget-changes", "--format", "json")
    assert code == 0, out
    changes = json.loads(out)
    assert {r["change"] for r in changes} >= {"account opened", "account shares_set"}
    assert all(r["shares_after"] is not None for r in changes if r["change"].endswith("shares_set"))


# --- invariants over a store --------------------------------------------------------------------


def test_audit_check_passes_a_clean_history_and_lists_the_admin_preemption(home: Path) -> None:
    code, out = run(home, "audit", "check")
    assert code == 0, out
    assert "0 violations, 1 allowed exceptions" in out
    assert "allowed: position" in out and "ADMIN_PREEMPTED_IN_CONTRACT" in out


def test_audit_check_fails_on_a_forged_share_change(home: Path) -> None:
    forged = e.SharesSet(
        event_id="x",
        at=T0 + 30_000,
        actor="mallory",
        account="ai2/olmo",
        shares=100,
        prev_hash=link_at(home, head(home)),
    )
    append_raw(home, [(e.tag_of(e.SharesSet), codec.encode(forged))])
    code, out = run(home, "audit", "verify")
    assert code == 0, out  # the chain is intact: only the invariants can tell
    code, out = run(home, "audit", "check")
    assert code == 1
    lines = [line for line in out.splitlines() if "NOT_AUTHORISED" in line]
    assert lines == [
        f"position {head(home)}: NOT_AUTHORISED: 'mallory' may not set the shares of "
        "'ai2/olmo': it needs a manager of 'ai2' or an admin"
    ]


def test_audit_check_fails_on_a_decision_forged_by_a_person_an_hour_back(home: Path) -> None:
    """atk34-26 F2: a decision record "by alice", an hour before its neighbours, correctly
    chained, gave 0 violations. Only the dispatcher decides, and decision records go forward."""
    ledger = Ledger(home)
    try:
        last = [ev for _, ev in ledger.read(0, ledger.position) if isinstance(ev, e.CycleDecided)]
    finally:
        ledger.close()
    at = last[-1].at - 3_600
    forged = e.CycleDecided(
        event_id="x", at=at, actor="alice", cycle_id="cycle-x", based_on=head(home),
        policy_version="fairshare-1", prev_hash=link_at(home, head(home)),
    )  # fmt: skip
    append_raw(home, [(e.tag_of(e.CycleDecided), codec.encode(forged))])
    code, out = run(home, "audit", "verify")
    assert code == 0, out  # the chain is intact: only the invariants can tell
    code, out = run(home, "audit", "check")
    assert code == 1
    lines = [line for line in out.splitlines() if line.startswith(f"position {head(home)}:")]
    assert lines == [
        f"position {head(home)}: NOT_AUTHORISED: 'alice' may not apply dispatcher decisions: "
        "only the dispatcher may",
        f"position {head(home)}: DECIDED_BACKWARDS: cycle-x is decided at {at:.3f}, 3600 s "
        f"before the previous decision record ({last[-1].at:.3f})",
    ]


def test_audit_check_finds_a_charge_from_placement_before_the_run_started(home: Path) -> None:
    """A decision recorded under the placement rule (`fairtree-1`) in the real log: the job it
    placed waited 600 s for its engine, and those GPU-seconds were charged outside its run."""
    clock = SimClock(T0 + 30_000)
    ledger = Ledger(home, clock, seeded_ids(9))
    (job,) = ledger.execute(
        c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60)
    ).events
    assert isinstance(job, e.JobSubmitted)
    ranks = e.RankInputs(
        position=1, digest="d", ranking_version="fairtree-1", usage=e.UsageSettings(window_s=60.0)
    )
    slots = (e.GpuSlot(node="n0", gpu_indices=(6, 7)),)
    ledger.execute(
        c.ApplyDecision(
            actor="@dispatcher",
            decision=c.DecisionBody(
                cycle_id="old-rule", based_on=ledger.position, policy_version="fairshare-7",
                ranks=ranks, placements=(e.Placement(job_id=job.job_id, slots=slots),),
            ),
        )
    )  # fmt: skip
    clock.advance_to(T0 + 30_700)
    ledger.execute(c.StartJob(actor="@executor", job_id=job.job_id, started_at=T0 + 30_600))
    clock.advance_to(T0 + 31_000)
    ledger.execute(c.FinishJob(actor="@executor", job_id=job.job_id, exit_code=0))
    finished = ledger.position
    ledger.close()
    code, out = run(home, "audit", "check")
    assert code == 1, out
    [line] = [line for line in out.splitlines() if "CHARGED" in line]
    assert line == (
        f"position {finished}: CHARGED_BEFORE_START: job {job.job_id}'s run 0 was charged from "
        f"{T0 + 30_000:.3f} to {T0 + 31_000:.3f} (charged from the placement) but started at "
        f"{T0 + 30_600:.3f}: 1200.0 GPU-s before its run"
    )


def test_check_charges_finds_usage_charged_to_an_unfunded_job(home: Path) -> None:
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        Projector(store, source).catch_up()
        assert check_charges(store) == []
        store.con.execute("UPDATE jobs SET min_runtime_s = 0, funded = false WHERE job_id = 1")
        found = check_charges(store)
    assert [(v.code, v.job_id) for v in found] == [("UNFUNDED_CHARGED", 1)] * 2  # two placements


# --- the Kafka copy -----------------------------------------------------------------------------


@pytest.mark.kafka
def test_verify_checks_the_kafka_copy_byte_for_byte(
    home: Path, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
) -> None:
    from ledger.store.relay import Relay, open_store

    relay = Relay(
        open_store(home), kafka_bootstrap, topic=kafka_topic, transactional_id=transactional_id
    )
    try:
        relay.publish_pending()
    finally:
        relay.close()
    code, out = run(home, "audit", "verify", "--kafka", kafka_bootstrap, "--topic", kafka_topic)
    assert code == 0, out
    assert "byte-equal to the store, chain intact" in out
    data = state_at(home, 10)
    sql(
        home,
        "UPDATE stored_events SET state = ? WHERE rowid = 10",
        (data.replace(b'"actor":"root"', b'"actor":"eve"'),),
    )
    code, out = run(home, "audit", "verify", "--kafka", kafka_bootstrap, "--topic", kafka_topic)
    assert code == 1
    assert "position 10: mismatch: the copy's bytes (offset 9) differ from the store's" in out


@pytest.mark.kafka
def test_verify_names_a_missing_position_first_and_counts_exact_copies(
    home: Path, kafka_bootstrap: str, kafka_topic: str
) -> None:
    """atk47-25 F7, F2: a topic holding the store's events 1..5, 30 exact copies of event 3,
    then 7 to the head (6 never there): `audit verify --kafka` compared offset i with position
    i + 1, so it printed 20 lines about the copies ("reordered", "position 3 comes after ...")
    and stopped there, cut without a word, never naming 6; the copies are what readers pass
    over, and 6 is where every reader stops."""
    from kafka import KafkaProducer

    from ledger.store.relay import ensure_topic, open_store, read_raw
    from projections.kafka_wire import record_headers

    events = read_raw(open_store(home), 0, 10_000)
    head = events[-1].position
    order = [*events[:5], *[events[2]] * 30, *events[6:]]
    ensure_topic(kafka_bootstrap, kafka_topic)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        for r in order:
            headers = record_headers(r.position, r.tag, r.data, None)
            producer.send(kafka_topic, value=r.data, key=r.key, headers=headers, partition=0)
        producer.flush(60)
    finally:
        producer.close()
    code, out = run(home, "audit", "verify", "--kafka", kafka_bootstrap, "--topic", kafka_topic)
    assert code == 1, out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"kafka topic {kafka_topic}"))
    assert lines[at] == (
        f"kafka topic {kafka_topic}: DIFFERS from the store; 30 exact copies of records before "
        "them, which readers pass over"
    ), out
    assert lines[at + 1] == (
        "  position 6: deleted: position 6 is missing: the copy holds later positions (7 at "
        "offset 35, 8 at offset 36, 9 at offset 37, 10 at offset 38, 11 at offset 39 and "
        f"{head - 11:,} more) but none follows position 5; every reader stops there (or sets "
        "every later record aside)"
    ), out
    assert len(lines) == at + 2, out  # nothing blamed on a genuine position


def test_verify_copy_finds_gaps_reorders_and_extra_records() -> None:
    from ledger.history.copy_check import CopyRecord
    from ledger.history.tamper import ChainRecord

    chain, prev = [], ""
    for i in range(1, 6):
        ev = e.NodeRegistered(
            event_id=str(i),
            at=T0,
            actor="root",
            cluster="c",
            node=f"n{i}",
            gpu_type="h100",
            gpus=8,
            prev_hash=prev,
        )
        data = codec.encode(ev)
        chain.append(ChainRecord(i, data))
        prev = hashlib.sha256(data).hexdigest()
    copy = [CopyRecord(i - 1, r.position, r.data) for i, r in enumerate(chain)]
    assert verify_copy(chain, copy).ok
    assert verify_copy(chain, copy[:3]).behind == 2
    swapped = [copy[0], copy[2], copy[1], copy[3]]
    kinds = {p.kind for p in verify_copy(chain, swapped).problems}
    assert "deleted" in kinds or "reordered" in kinds
    extra = [*copy, CopyRecord(5, 6, b"{}")]
    assert [p.kind for p in verify_copy(chain, extra).problems] == ["extra"]


# --- old logs: each link verifies under the rule it was written in ------------------------------

GOLDEN_LOG = Path(__file__).parents[1] / "golden" / "events-v1.jsonl"


def test_a_log_written_under_v1_links_takes_v2_appends_and_verifies(tmp_path: Path) -> None:
    """The golden corpus (stored bytes of an older ledger, v1 links) with a v1 snapshot: the
    ledger starts from that snapshot, appends under v2 links, and the whole log verifies; an edit
    of the tag of an old row is still named at its row."""
    from ledger.store import snapshots

    home = tmp_path / "home"
    lines = GOLDEN_LOG.read_bytes().splitlines()
    Ledger(home).close()  # the store's tables
    append_raw(home, [(codec.peek_tag(raw) or "", raw) for raw in lines])
    old = Ledger(home, SimClock(T0 + 10**6), live=True)
    assert old.position == len(lines)
    old.snapshot_state()  # a snapshot taken now links under v2: make one that links under v1
    sql(home, "DELETE FROM stored_snapshots")
    v1 = snapshots.encode(
        old.state, old.position, old.version, hashlib.sha256(lines[-1]).hexdigest()
    )
    sql(
        home,
        "INSERT INTO stored_snapshots VALUES (?, ?, ?, ?)",
        (snapshots.STREAM_ID.hex, old.position, snapshots.SNAPSHOT_TOPIC, v1),
    )
    old.close()
    sql(home, "DELETE FROM stored_snapshots WHERE originator_version > ?", (len(lines),))
    ledger = Ledger(home, SimClock(T0 + 10**6), live=True)
    assert ledger.restored_from == len(lines)  # the v1 snapshot verified
    ledger.execute(c.RegisterNode(actor="root", node="new", gpu_type="h100", gpus=8))
    ledger.execute(c.RegisterNode(actor="root", node="newer", gpu_type="h100", gpus=8))
    ledger.close()
    assert state_at(home, len(lines) + 1).count(b'"prev_hash":"v2:') == 1
    code, out = run(home, "audit", "verify")
    assert code == 0, out
    sql(home, "UPDATE stored_events SET topic = 'node.removed.v1' WHERE rowid = 5")
    code, out = run(home, "audit", "verify")
    assert code == 1 and "first at position 5 (edited)" in out, out
