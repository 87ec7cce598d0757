"""Decoding a batch of log records into the projector's Arrow inputs (pure, no database)."""

from __future__ import annotations

import gc
from pathlib import Path

import pyarrow as pa
import pytest

from projections.batch import Group, _decode_grouped, build_batch, decode_records
from projections.errors import CorruptEvent
from projections.source import ListSource, LogRecord
from schemas import codec
from schemas import events as e
from schemas.events import GpuSlot, tag_of

KW = {"actor": "root", "at": 1000.0}


def rec(position: int, event: e.AnyEvent) -> LogRecord:
    return LogRecord(position, tag_of(type(event)), codec.encode(event))


def ev_id(n: int) -> dict[str, object]:
    return {"event_id": f"e{n}", **KW}


HISTORY = [
    e.AccountOpened(**ev_id(1), path="ai2", parent=None, kind="program"),
    e.SharesSet(**ev_id(2), account="ai2", shares=3, reason="opened"),
    e.NodeRegistered(**ev_id(3), cluster="c", node="n1", gpu_type="h100", gpus=8),
    e.JobSubmitted(**ev_id(4), job_id=1, account="ai2/p", user="ann", gpus=2, min_runtime_s=60),
    e.JobPlaced(
        **ev_id(5),
        job_id=1,
        slots=(GpuSlot(node="n1", gpu_indices=(0, 1)),),
        cycle_id="c1",
        based_on=4,
    ),
    e.JobStarted(**ev_id(6), job_id=1),
    e.JobFinished(**ev_id(7), job_id=1, outcome="completed", exit_code=0, reason="completed"),
    e.NodeDrainRequested(**ev_id(8), node="n1", reason="fix"),
]


def records() -> list[LogRecord]:
    return [rec(i + 1, ev) for i, ev in enumerate(HISTORY)]


def test_every_record_becomes_an_events_row_in_log_order() -> None:
    batch = build_batch(records())
    rows = batch.tables["b_events"].to_pylist()
    assert [(r["position"], r["tag"], r["known"]) for r in rows] == [
        (i + 1, tag_of(type(ev)), True) for i, ev in enumerate(HISTORY)
    ]
    assert rows[3]["raw"] == codec.encode(HISTORY[3]).decode()
    assert (batch.first, batch.last, batch.events, batch.unknown) == (1, 8, 8, 0)


def test_inputs_per_read_model() -> None:
    batch = build_batch(records())
    t = batch.tables
    assert t["b_accounts"].to_pylist() == [
        {
            "account": "ai2",
            "position": 1,
            "changed_at": 1000.0,
            "tag": "account.opened.v1",
            "parent": None,
            "kind": "program",
            "shares": None,
            "open": True,
            "reason": "",
        },
        {
            "account": "ai2",
            "position": 2,
            "changed_at": 1000.0,
            "tag": "account.shares_set.v1",
            "parent": None,
            "kind": None,
            "shares": 3,
            "open": None,
            "reason": "opened",
        },
    ]
    assert [(r["node"], r["state"], r["gpus"]) for r in t["b_nodes"].to_pylist()] == [
        ("n1", "active", 8),
        ("n1", "draining", None),
    ]
    submitted = t["b_submitted"].to_pylist()[0]
    assert (submitted["job_id"], submitted["user_name"], submitted["resumable"]) == (
        1,
        "ann",
        False,
    )
    assert t["b_placed"].to_pylist() == [
        {
            "job_id": 1,
            "position": 5,
            "event_at": 1000.0,
            "cycle_id": "c1",
            "slots": [{"node": "n1", "gpu_indices": [0, 1]}],
        }
    ]
    assert batch.counts["b_jobev"] == 3  # placed, started, finished
    assert batch.counts["b_cycles"] == 0 and batch.counts["b_preempted"] == 0


def test_an_unknown_tag_is_kept_and_counted() -> None:
    rs = [*records(), LogRecord(9, "job.teleported.v9", b'{"type":"job.teleported.v9","x":1}')]
    batch = build_batch(rs)
    last = batch.tables["b_events"].to_pylist()[-1]
    assert (last["position"], last["known"], last["tag"]) == (9, False, "job.teleported.v9")
    assert batch.unknown == 1


CORRUPT = [
    ("not JSON", "job.started.v1", b"\x00garbage"),
    (
        "wrong type",
        "job.started.v1",
        b'{"type":"job.started.v1","event_id":"x","at":1.0,"actor":"a","job_id":"one"}',
    ),
    (
        "missing field",
        "job.started.v1",
        b'{"type":"job.started.v1","event_id":"x","at":1.0,"actor":"a"}',
    ),
    (
        "bad literal",
        "job.finished.v1",
        b'{"type":"job.finished.v1","event_id":"x","at":1.0,"actor":"a","job_id":1,"outcome":"exploded"}',
    ),
    ("tag disagrees", "job.requeued.v1", codec.encode(e.JobStarted(**ev_id(9), job_id=1))),
    (
        "bytes that are not UTF-8 in a field the schema skips",
        "job.started.v1",
        b'{"type":"job.started.v1","event_id":"x","at":1.0,"actor":"a","job_id":1,"zz":"\xff"}',
    ),
    ("unknown tag, not an object", "x.v1", b'"just a string"'),
    ("unknown tag, not JSON", "x.v1", b"{"),
]


@pytest.mark.parametrize(("tag", "data"), [c[1:] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_a_corrupt_record_names_its_position(tag: str, data: bytes) -> None:
    rs = [*records(), LogRecord(9, tag, data), rec(10, e.JobRequeued(**ev_id(10), job_id=1))]
    with pytest.raises(CorruptEvent) as info:
        build_batch(rs)
    err = info.value
    assert (err.position, err.tag, err.code) == (9, tag, "corrupt")
    assert err.line().startswith("log position 9: ")
    assert gc.isenabled()


def test_list_source_reads_after_a_position() -> None:
    src = ListSource(records())
    assert [r.position for r in src.read(3, 2)] == [4, 5]
    assert src.read(8, 10) == [] and src.head() == 8
    assert ListSource([]).head() == 0


V1 = (Path(__file__).parent.parent / "golden" / "events-v1.jsonl").read_bytes().splitlines()


def grouped(rs: list[LogRecord]) -> tuple[dict[type, Group], list[int]] | None:
    tags = pa.array([r.tag for r in rs], pa.string())
    return _decode_grouped([r.position for r in rs], tags, [r.data for r in rs])


def same_groups(
    a: tuple[dict[type, Group], list[int]], b: tuple[dict[type, Group], list[int]]
) -> bool:
    def plain(g: dict[type, Group]) -> dict[type, tuple[list[int], list[object]]]:
        return {cls: (grp.positions, grp.events) for cls, grp in g.items()}

    return plain(a[0]) == plain(b[0]) and a[1] == b[1]


def test_decoding_by_tag_groups_as_record_by_record_does() -> None:
    odd = LogRecord(20, "job.teleported.v9", b'{"type":"job.teleported.v9","x":1}')
    # interleaved tags, an unknown one, a type kept for a table and one only validated
    rs = [*records(), *[rec(9 + i, e.JobRequeued(**ev_id(9 + i), job_id=i + 1)) for i in range(11)]]
    rs = [
        *rs,
        odd,
        rec(
            21,
            e.JobSubmitted(**ev_id(21), job_id=2, account="a/p", user="u", gpus=1, min_runtime_s=0),
        ),
    ]
    fast = grouped(rs)
    assert fast is not None and fast[1] == [20]
    assert same_groups(fast, decode_records(rs))
    assert fast[0][e.JobRequeued].events == [] and len(fast[0][e.JobRequeued].positions) == 11
    assert len(fast[0][e.JobStarted].events) == 1  # kept: `jobs.logs` is built from it
    # stored v1 decisions are upcast on the way in, as the codec does
    golden = [LogRecord(i, codec.peek_tag(raw) or "", raw) for i, raw in enumerate(V1, start=1)]
    fast = grouped(golden)
    assert fast is not None and same_groups(fast, decode_records(golden))


@pytest.mark.parametrize(("tag", "data"), [c[1:] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_decoding_by_tag_leaves_every_doubtful_batch_to_the_record_by_record_path(
    tag: str, data: bytes
) -> None:
    if "UTF-8" in tag or b"\xff" in data:  # msgspec skips that field: the UTF-8 check finds it
        return
    assert grouped([*records(), LogRecord(9, tag, data)]) is None


def test_two_versions_of_a_type_in_one_batch_stay_in_log_order() -> None:
    golden = [LogRecord(i, codec.peek_tag(raw) or "", raw) for i, raw in enumerate(V1, start=1)]
    v2 = e.CycleDecided(**ev_id(999), cycle_id="c-new", based_on=1, policy_version="p")
    # the v2 record sits between v1 records: the merged group must be sorted back
    rs = [*golden[:40], rec(41, v2), *[r._replace(position=r.position + 1) for r in golden[40:]]]
    fast = grouped(rs)  # merged by tag groups, as the record-by-record path merges them
    assert fast is not None and same_groups(fast, decode_records(rs))
    cycles = build_batch(rs).tables["b_cycles"].to_pylist()
    assert [c["cycle_id"] for c in cycles] == ["cycle-26", "cycle-38", "c-new", "cycle-59"]


def test_the_codec_says_which_type_each_stored_tag_upcasts_to() -> None:
    for raw in V1:
        tag = codec.peek_tag(raw)
        assert tag is not None
        assert type(codec.decode(raw)) is codec.LATEST[codec.TYPE_OF[tag]]
    assert codec.stored_tags(e.CycleDecided) == [
        "cycle.decided.v1",
        "cycle.decided.v2",
        "cycle.decided.v3",
        "cycle.decided.v4",
    ]


def test_a_start_is_the_engines_own_start_not_when_it_was_seen(tmp_path: Path) -> None:
    """N5 of the re-test of issue 23: `jobs` showed a run's start as the moment the executor
    saw it (1-1.6 s after Slurm's StartTime on Slurm), not the start the event carries; a short
    run's elapsed time was short by as much. The projection, its batch input and the reference
    fold all take JobStarted's `started_at` (its `at` when an engine gave none)."""
    from projections.projector import Projector
    from projections.store import Store
    from projections.testing.reference import fold

    history = [
        *HISTORY[:5],
        e.JobStarted(**(ev_id(6) | {"at": 1003.5}), job_id=1, started_at=1001.0),
        e.JobFinished(
            **(ev_id(7) | {"at": 1010.0}),
            job_id=1,
            outcome="completed",
            exit_code=0,
            reason="completed",
            ended_at=1007.0,
        ),
    ]
    rs = [rec(i + 1, ev) for i, ev in enumerate(history)]
    assert build_batch(rs).tables["b_started"].to_pylist()[0]["started_at"] == 1001.0
    with Store(tmp_path / "p.duckdb") as store:
        Projector(store, ListSource(rs)).catch_up()
        got = store.con.execute(
            "SELECT started_at, run_started_at, finished_at FROM jobs WHERE job_id = 1"
        ).fetchone()
    assert got == (1001.0, 1001.0, 1007.0)
    ref = fold(enumerate(history, 1)).jobs[1]
    assert (ref["started_at"], ref["run_started_at"]) == (1001.0, 1001.0)
