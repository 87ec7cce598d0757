"""The golden corpus: stored bytes of every older event version that every later version of the
code must keep reading, and of the latest decision record (see tests/golden/README.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.history.replay import find_decisions, replay_decisions
from projections import chain
from projections.batch import decode_records
from projections.source import ListSource, LogRecord
from schemas import codec
from schemas import events as e
from schemas.policy import (
    AnyPolicyConfig,
    FairShare6Config,
    FairShare7Config,
    FairShare9Config,
    FairShare11Config,
    FairShare12Config,
)

GOLDEN = Path(__file__).parent.parent / "golden"
V1 = (GOLDEN / "events-v1.jsonl").read_bytes().splitlines()
LATEST = (GOLDEN / "events-v1.latest.jsonl").read_bytes().splitlines()
V3 = "fairshare-6.decided-v3.jsonl"
"""`fairshare-6.jsonl`'s simulation written again by the code that introduced
`cycle.decided.v3` (the decision record with typed settings only)."""
V4 = "fairshare-7.decided-v4.jsonl"
"""`fairshare-7.jsonl`'s simulation written again by the code that introduced
`cycle.decided.v4` (the waiting summary built from runs, its digest over them)."""


def as_stored(encoded: bytes, stored: bytes) -> bool:
    """An event encoded now reads as the stored bytes: every stored field with its stored value,
    in the same order, and nothing else but fields added since with their default values (new
    fields get defaults; a field's type never changes)."""
    now, then = msgspec.json.decode(encoded), msgspec.json.decode(stored)
    added = {k: v for k, v in now.items() if k not in then}
    kept = [k for k in now if k in then]
    return (
        kept == list(then)
        and all(now[k] == then[k] for k in then)
        and all(v in (None, "", 0, [], {}, False) for v in added.values())
    )


def records() -> list[LogRecord]:
    return [LogRecord(i, codec.peek_tag(raw) or "", raw) for i, raw in enumerate(V1, start=1)]


def test_the_corpus_is_the_stored_bytes_unchanged() -> None:
    """Each line links to the SHA-256 of the line before: the bytes are exactly as stored."""
    prev = ""
    for i, raw in enumerate(V1, start=1):
        assert codec.decode(raw).prev_hash == prev, f"line {i}"
        prev = hashlib.sha256(raw).hexdigest()


WRITTEN_WITH = 24
"""The v1 event types there were when the corpus was written: all of them are in it."""


def test_the_corpus_holds_every_v1_event_type_of_its_time() -> None:
    tags = {codec.peek_tag(raw) for raw in V1}
    assert len(tags) == WRITTEN_WITH and "cycle.decided.v1" in tags
    assert tags <= e.TAGS


@pytest.mark.parametrize("line", range(len(V1)), ids=lambda i: f"line {i + 1}")
def test_every_stored_event_decodes_to_its_latest_version_as_recorded(line: int) -> None:
    event = codec.decode(V1[line])
    assert type(event) in e.EVENT_TYPES
    assert as_stored(codec.encode(event), LATEST[line])


def test_v1_decisions_upcast_with_their_outcomes_by_reference() -> None:
    decided = [ev for ev in map(codec.decode, V1) if isinstance(ev, e.CycleDecided)]
    assert [d.cycle_id for d in decided] == ["cycle-26", "cycle-38", "cycle-59"]
    assert all(d.ranks is None and len(d.waiting.order_digest) == 64 for d in decided)
    assert decided[1].preempted and decided[1].placed == (4, 6)
    assert decided[1].waiting.counts and decided[1].waiting.considered == 3


def test_the_projection_reads_the_corpus_as_the_codec_does() -> None:
    groups, unknown = decode_records(records())
    assert unknown == []
    assert groups[e.CycleDecided].events == [
        ev for ev in map(codec.decode, V1) if isinstance(ev, e.CycleDecided)
    ]
    assert e.CycleDecidedV1 not in groups


def test_the_corpus_folds_and_its_v1_decisions_replay_identically() -> None:
    state = State()
    for raw in V1:
        evolve(state, codec.decode(raw))
    assert {j.job_id: j.status for j in state.jobs.values()} == {
        1: "running", 2: "running", 3: "finished", 4: "finished", 5: "finished", 6: "finished"
    }  # fmt: skip
    source = ListSource(records())
    decisions = [
        (r.position, ev)
        for r in source.records
        if isinstance(ev := codec.decode(r.data), e.CycleDecided)
    ]
    results = list(replay_decisions(source, decisions))
    assert [r.headline() for r in results if not r.identical] == []
    assert [r.placements for r in results] == [3, 2, 1]
    assert find_decisions  # the embedded path reads both versions: tests/integration/test_replay.py


def _recorded_decisions(
    version: str, as_version: str | None = None, file: str | None = None
) -> tuple[ListSource, list[tuple[int, e.CycleDecided]]]:
    """The golden log of `version`'s decisions (`file`, else `<version>.jsonl`), optionally
    read as another version's."""
    lines = (GOLDEN / (file or f"{version}.jsonl")).read_bytes().splitlines()
    source = ListSource(
        [LogRecord(i, codec.peek_tag(raw) or "", raw) for i, raw in enumerate(lines, 1)]
    )
    decisions: list[tuple[int, e.CycleDecided]] = []
    for r in source.records:
        ev = codec.decode(r.data)
        if isinstance(ev, e.CycleDecided):
            assert ev.policy_version == version and ev.policy is not None
            if as_version is not None:  # the same settings, read by another version's code
                config = msgspec.convert(
                    {**msgspec.structs.asdict(ev.policy), "version": as_version},
                    AnyPolicyConfig,
                )
                ev = msgspec.structs.replace(ev, policy_version=as_version, policy=config)
            decisions.append((r.position, ev))
    return source, decisions


def test_recorded_fairshare_2_decisions_replay_identically_under_later_versions() -> None:
    """A policy whose behaviour changes is a new version: fairshare-2's code still decides
    exactly as it recorded, while fairshare-3 (the same settings) decides each differently."""
    source, decisions = _recorded_decisions("fairshare-2")
    assert len(decisions) == 36
    results = list(replay_decisions(source, decisions))
    assert [r.headline() for r in results if not r.identical] == []
    source, as_v3 = _recorded_decisions("fairshare-2", "fairshare-3")
    assert not any(r.identical for r in replay_decisions(source, as_v3))


@pytest.mark.parametrize(
    ("version", "read_as", "file"),
    [
        ("fairshare-3", "fairshare-2", None),
        ("fairshare-6", "fairshare-4", None),
        ("fairshare-6", "fairshare-4", V3),
    ],
    ids=["fairshare-3", "fairshare-6", "fairshare-6 in v3 records"],
)
def test_recorded_decisions_replay_identically_and_differ_under_an_older_version(
    version: str, read_as: str, file: str | None
) -> None:
    """fairshare-3 and fairshare-6 (the default) still decide exactly as they recorded,
    preemptions included, in v2 records and in v3 ones; read as an older version with the same
    settings, every decision differs (fairshare-3 ranks teams by their share of the whole tree,
    fairshare-6 orders unfunded work that never ran first), so the test can fail."""
    lines = (GOLDEN / (file or f"{version}.jsonl")).read_bytes().splitlines()
    prev = ""
    for raw in lines:  # the stored bytes, unedited: each line links to the one before
        assert codec.decode(raw).prev_hash == prev
        prev = hashlib.sha256(raw).hexdigest()
    source, decisions = _recorded_decisions(version, file=file)
    assert len(decisions) == 36
    assert sum(len(d.preempted) for _, d in decisions) > 0
    results = list(replay_decisions(source, decisions))
    assert [r.headline() for r in results if not r.identical] == []
    source, as_older = _recorded_decisions(version, read_as, file)
    assert not any(r.identical for r in replay_decisions(source, as_older))


@pytest.mark.parametrize(("file", "version"), [(V3, "v3"), (V4, "v4")])
def test_decision_records_are_stored_as_every_reader_decodes_them(file: str, version: str) -> None:
    """Each record reads back as stored when it is the latest version (v4); a v3 one upcasts."""
    lines = (GOLDEN / file).read_bytes().splitlines()
    for position, raw in enumerate(lines, start=1):  # the stored bytes, unedited
        event = codec.decode(raw)
        if position > 1:  # each links to the one before (v1 links in the older file, v2 here)
            before = lines[position - 2]
            tag = codec.peek_tag(before) or ""
            assert chain.names(event.prev_hash, position - 1, tag, before)
        if codec.peek_tag(raw) == e.tag_of(type(event)):  # stored as the latest version (the
            assert as_stored(codec.encode(event), raw)  # submissions and ends there are v1)
    tags = {codec.peek_tag(raw) for raw in lines if "cycle.decided" in (codec.peek_tag(raw) or "")}
    assert tags == {f"cycle.decided.{version}"}


def test_v2_decision_records_upcast_to_exactly_what_the_code_now_writes() -> None:
    """The same simulation recorded with v2 records and with v3 ones: upcast, the v2 log is
    the v3 log event for event (only the hash chain differs, over other bytes)."""

    def unchained(file: str) -> list[e.AnyEvent]:
        lines = (GOLDEN / file).read_bytes().splitlines()
        return [msgspec.structs.replace(codec.decode(raw), prev_hash="") for raw in lines]

    v2, v3 = unchained("fairshare-6.jsonl"), unchained(V3)
    assert sum(isinstance(ev, e.CycleDecided) for ev in v3) == 36
    assert v2 == v3


def test_v3_decision_records_upcast_to_what_the_code_now_writes_but_the_digests_form() -> None:
    """The same simulation recorded with v3 records and with v4 ones: upcast, the v3 log is the
    v4 log event for event but for the waiting summary's digest (over jobs, which v3 wrote; over
    runs, which v4 writes) and the runs v3 did not count; the listed jobs and counts agree."""

    def decided(file: str) -> list[tuple[int, e.CycleDecided]]:
        lines = (GOLDEN / file).read_bytes().splitlines()
        out: list[tuple[int, e.CycleDecided]] = []
        for position, raw in enumerate(lines, start=1):
            ev = codec.decode(raw)
            if isinstance(ev, e.CycleDecided):
                w = msgspec.structs.replace(ev.waiting, order_digest="", runs=0, digest_of="runs")
                out.append((position, msgspec.structs.replace(ev, prev_hash="", waiting=w)))
        return out

    v3, v4 = decided("fairshare-7.jsonl"), decided(V4)
    assert len(v4) == 42
    assert v3 == v4
    stored = [codec.decode(raw) for raw in (GOLDEN / V4).read_bytes().splitlines()]
    decided = [ev for ev in stored if isinstance(ev, e.CycleDecided)]
    assert all(d.waiting.digest_of == "runs" for d in decided)
    assert all(d.waiting.runs > 0 for d in decided if d.waiting.waiting())


@pytest.mark.parametrize("file", [None, V4], ids=["v3 records", "v4 records"])
def test_recorded_fairshare_7_decisions_replay_identically_and_differ_as_fairshare_6(
    file: str | None,
) -> None:
    """fairshare-7 (the default) decides exactly as it recorded, in v3 records (digest over
    jobs) and in v4 ones (over runs); read as fairshare-6 with the settings the two share
    (fairshare-6 has no reservation, a debug reserve, no restart price), some decisions differ,
    so the test can fail."""
    source, decisions = _recorded_decisions("fairshare-7", file=file)
    assert len(decisions) == 42
    assert sum(len(d.preempted) for _, d in decisions) > 0
    results = list(replay_decisions(source, decisions))
    assert [r.headline() for r in results if not r.identical] == []
    shared = FairShare6Config.__struct_fields__
    as_six = [
        (
            position,
            msgspec.structs.replace(
                d,
                policy_version="fairshare-6",
                policy=FairShare6Config(
                    **{k: v for k, v in msgspec.structs.asdict(d.policy).items() if k in shared}
                ),
            ),
        )
        for position, d in decisions
        if d.policy is not None
    ]
    assert len(as_six) == len(decisions)
    assert not all(r.identical for r in replay_decisions(source, as_six))


def test_recorded_fairshare_9_decisions_replay_identically_and_differ_as_fairshare_10() -> None:
    """fairshare-9 (written by the code before fairshare-10) decides exactly as it recorded;
    read as fairshare-10 with the same settings (whose order moves as the cycle places jobs,
    and whose sort keys carry each job's turn), the decisions differ, so the test can fail."""
    source, decisions = _recorded_decisions("fairshare-9")
    assert len(decisions) == 42
    results = list(replay_decisions(source, decisions))
    assert [r.headline() for r in results if not r.identical] == []
    source, as_ten = _recorded_decisions("fairshare-9", "fairshare-10")
    assert not any(r.identical for r in replay_decisions(source, as_ten))


def test_recorded_fairshare_10_decisions_replay_identically_and_differ_as_fairshare_9() -> None:
    """Three teams with equal shares submit a 64-job array of 1-GPU jobs each onto an idle
    32-GPU cluster (`fairshare-10.arrays.jsonl`): fairshare-10 placed 11/11/10 in the first
    cycle and replays exactly (replay hands it the usage and shares behind the ranks, as the
    cycle did); read as fairshare-9, the first cycle gives one team every GPU."""
    source, decisions = _recorded_decisions("fairshare-10", file="fairshare-10.arrays.jsonl")
    assert len(decisions) > 1
    results = list(replay_decisions(source, decisions))
    assert [r.headline() for r in results if not r.identical] == []
    shared = FairShare9Config.__struct_fields__
    as_nine = [
        (
            position,
            msgspec.structs.replace(
                d,
                policy_version="fairshare-9",
                policy=FairShare9Config(
                    **{k: v for k, v in msgspec.structs.asdict(d.policy).items() if k in shared}
                ),
            ),
        )
        for position, d in decisions
        if d.policy is not None
    ]
    first = next(iter(replay_decisions(source, as_nine)))
    assert not first.identical


def test_recorded_fairshare_11_decisions_replay_identically_and_differ_as_fairshare_7() -> None:
    """fairshare-11 (the oldest large job's reservation binds every job inside its window)
    decides exactly as it recorded (`fairshare-11.jsonl`); read as fairshare-7 with the settings
    the two share (the reservation for the first large job in the order, binding only the jobs
    after it), some decisions differ, so the test can fail."""
    source, decisions = _recorded_decisions("fairshare-11")
    assert len(decisions) == 36
    assert sum(len(d.preempted) for _, d in decisions) > 0
    results = list(replay_decisions(source, decisions))
    assert [r.headline() for r in results if not r.identical] == []
    shared = FairShare7Config.__struct_fields__
    as_seven = [
        (
            position,
            msgspec.structs.replace(
                d,
                policy_version="fairshare-7",
                policy=FairShare7Config(
                    **{k: v for k, v in msgspec.structs.asdict(d.policy).items() if k in shared}
                ),
            ),
        )
        for position, d in decisions
        if d.policy is not None
    ]
    assert len(as_seven) == len(decisions)
    assert not all(r.identical for r in replay_decisions(source, as_seven))


def test_recorded_fairshare_12_decisions_replay_identically_and_differ_as_fairshare_11() -> None:
    """fairshare-12 (an owed team's large job reserved at once, its nodes counted free as
    resumable work of any team ends its contract, the job started by preempting what is past
    its contract there) decides exactly as it recorded (`fairshare-12.jsonl`); read as
    fairshare-11 with the settings the two share, some decisions differ, so the test can
    fail; and the recorded decisions include a reservation's start by preemption."""
    source, decisions = _recorded_decisions("fairshare-12")
    assert len(decisions) > 1
    events = [codec.decode(r.data) for r in source.records]
    notes = [ev.note for ev in events if isinstance(ev, e.JobPreempted)]
    assert any(n.startswith("reservation: nodes ") for n in notes)
    results = list(replay_decisions(source, decisions))
    assert [r.headline() for r in results if not r.identical] == []
    shared = FairShare11Config.__struct_fields__
    as_eleven = [
        (
            position,
            msgspec.structs.replace(
                d,
                policy_version="fairshare-11",
                policy=FairShare11Config(
                    **{k: v for k, v in msgspec.structs.asdict(d.policy).items() if k in shared}
                ),
            ),
        )
        for position, d in decisions
        if d.policy is not None
    ]
    assert len(as_eleven) == len(decisions)
    assert not all(r.identical for r in replay_decisions(source, as_eleven))


def test_recorded_fairshare_13_decisions_replay_identically_and_differ_as_fairshare_12() -> None:
    """fairshare-13 (fairshare-12's reservation drained only of unfunded work and the reserved
    job's own team's resumable work; debug jobs on the held nodes) decides exactly as it
    recorded (`fairshare-13.jsonl`); read as fairshare-12 with the settings the two share, some
    decisions differ, so the test can fail."""
    source, decisions = _recorded_decisions("fairshare-13")
    assert len(decisions) > 1
    results = list(replay_decisions(source, decisions))
    assert [r.headline() for r in results if not r.identical] == []
    shared = FairShare12Config.__struct_fields__
    as_twelve = [
        (
            position,
            msgspec.structs.replace(
                d,
                policy_version="fairshare-12",
                policy=FairShare12Config(
                    **{k: v for k, v in msgspec.structs.asdict(d.policy).items() if k in shared}
                ),
            ),
        )
        for position, d in decisions
        if d.policy is not None
    ]
    assert len(as_twelve) == len(decisions)
    assert not all(r.identical for r in replay_decisions(source, as_twelve))
