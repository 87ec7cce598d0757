"""`cycle.decided.v4`: the waiting summary built from the decision's runs (`Waiting`,
`schemas.digest.summarise_runs`), the upcaster from v3, and replay reading both forms."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.dispatch.decision import Decision
from ledger.dispatch.engine import Unplaceable, WaitRun
from ledger.dispatch.snapshot import PendingJob
from ledger.history.compare import Outcome, compare, replayed_summary
from schemas import codec
from schemas import events as e
from schemas.digest import canonical_runs, runs_digest, summarise, summarise_runs, summary_of

JOB = PendingJob(job_id=0, account="a", user="u", gpus=1, min_runtime_s=0, submitted_at=0)
REASONS = (
    ("WAIT_RESOURCES", "needs 8 h100 GPUs on one node, 4 free"),
    ("WAIT_RESOURCES", "needs 2 nodes of 8 GPUs, 1 free"),
    ("WAIT_PRIORITY", "jobs ahead of it in the order took the GPUs free at the start of the cycle"),
    ("WAIT_CONTRACT", "room at t=100 when the contracts of jobs 3 end"),
)


def decision(waits: list[int | None], *, split: bool = False) -> Decision:
    """A decision over len(waits) jobs (ids 100, 101, ...): `waits[i]` is the index of the
    reason job i waits for (None: placed). Runs as the dispatcher cuts them (one per stretch),
    or one per job (`split`): both read as the same facts."""
    order = tuple(((i % 3, -i, f"k{i}"), msgspec.structs.replace(JOB, job_id=100 + i))
                  for i in range(len(waits)))  # fmt: skip
    runs: list[WaitRun] = []
    for i, w in enumerate(waits):
        if w is None:
            continue
        code, text = REASONS[w]
        wait = Unplaceable(code=code, reason=text)  # type: ignore[arg-type]
        last = runs[-1] if runs else None
        if not split and last is not None and last.stop == i and last.wait == wait:
            runs[-1] = WaitRun(last.start, i + 1, wait)
        else:
            runs.append(WaitRun(i, i + 1, wait))
    return Decision(based_on=9, policy_version="fairshare-7", order=order, runs=tuple(runs))


WAITS = st.lists(st.one_of(st.none(), st.integers(0, len(REASONS) - 1)), max_size=150)


@settings(max_examples=150, deadline=None)
@given(WAITS)
def test_the_runs_summary_says_what_the_per_job_summary_says(waits: list[int | None]) -> None:
    """The first waiting jobs, the counts per code and the number considered are those of v3's
    per-job summary; only the digest's form differs."""
    d = decision(waits)
    runs, jobs = d.summary(), summarise(d.considered())
    assert (runs.considered, runs.first, runs.counts) == (jobs.considered, jobs.first, jobs.counts)
    assert runs.digest_of == "runs" and runs.runs == len(d.runs)
    assert runs.waiting() == sum(w is not None for w in waits)


@settings(max_examples=150, deadline=None)
@given(WAITS)
def test_runs_cut_finer_give_the_same_summary(waits: list[int | None]) -> None:
    """Runs are merged to one per stretch of one code and reason text before they are counted
    and digested: however the cycle cut them, the same facts give the same bytes."""
    assert decision(waits, split=True).summary() == decision(waits).summary()


def test_adjacent_runs_of_one_reason_merge_and_empty_runs_go() -> None:
    r = "WAIT_RESOURCES", "x"
    got = canonical_runs([(0, 2, *r), (2, 2, "WAIT_PRIORITY", "y"), (2, 3, *r), (4, 5, *r)])
    assert got == [(0, 3, *r), (4, 5, *r)]


BASE = [0, 0, None, 2, 2, 2, 1, None, 0]
OTHER_TEXT = [0, 1, None, 2, 2, 2, 1, None, 0]
"""`BASE` with job 101 waiting for another WAIT_RESOURCES text."""


@pytest.mark.parametrize(
    ("case", "other"),
    [
        ("another sort key", lambda d: msgspec.structs.replace(
            d, order=((("x",), d.order[0][1]), *d.order[1:]))),
        ("another job in the order", lambda d: msgspec.structs.replace(
            d, order=(*d.order[:-1], (d.order[-1][0], msgspec.structs.replace(JOB, job_id=1))))),
        ("another reason text of the same code", lambda _: decision(OTHER_TEXT)),
        ("a run one job longer", lambda _: decision([0, 0, None, 2, 2, 2, 2, None, 0])),
        ("an infinite part of a sort key for none", lambda d: msgspec.structs.replace(
            d, order=(((float("inf"),), d.order[0][1]), ((None,), d.order[1][1]), *d.order[2:]))),
    ],
)  # fmt: skip
def test_the_runs_digest_covers_ids_sort_keys_and_reasons(case: str, other: object) -> None:
    d = decision(BASE)
    if case.startswith("an infinite"):  # JSON writes both as null; the digest's bytes do not
        d = msgspec.structs.replace(
            d, order=(((None,), d.order[0][1]), ((float("inf"),), d.order[1][1]), *d.order[2:])
        )
    changed = other(d)  # type: ignore[operator]
    assert changed.summary().order_digest != d.summary().order_digest, case


def test_the_digest_is_of_the_order_and_the_merged_runs() -> None:
    d = decision(BASE)
    ids, keys = [j.job_id for _, j in d.order], [k for k, _ in d.order]
    runs = [(r.start, r.stop, r.wait.code, r.wait.text()) for r in d.runs]
    assert d.summary().order_digest == runs_digest(ids, keys, canonical_runs(runs))
    assert d.summary() == summarise_runs(ids, keys, runs)


def _recorded(version: type[e.Event], waiting: e.WaitSummary) -> e.Event:
    return version(
        event_id="d1", at=5.0, actor="@dispatcher", cycle_id="cycle-1", based_on=4,
        policy_version="fairshare-7", waiting=waiting, decided_at=5.0,
    )  # type: ignore[call-arg]  # fmt: skip


def test_a_v3_record_reads_as_v4_with_its_per_job_digest() -> None:
    d = decision(BASE)
    v3 = summarise(d.considered())
    stored = codec.encode(_recorded(e.CycleDecidedV3, v3))
    assert codec.peek_tag(stored) == "cycle.decided.v3"
    got = codec.decode(stored)
    assert isinstance(got, e.CycleDecided)
    assert got.waiting == e.Waiting(**msgspec.structs.asdict(v3), runs=0, digest_of="jobs")
    assert got.waiting == summary_of(d.considered())
    assert codec.decode_stored(stored) == _recorded(e.CycleDecidedV3, v3)


def test_a_v4_record_round_trips_as_written() -> None:
    waiting = decision(BASE).summary()
    event = _recorded(e.CycleDecided, waiting)
    stored = codec.encode(event)
    assert codec.peek_tag(stored) == "cycle.decided.v4"
    assert codec.decode(stored) == event
    assert msgspec.json.decode(stored)["waiting"]["digest_of"] == "runs"
    assert codec.encode(codec.decode(stored)) == stored


@pytest.mark.parametrize("form", ["jobs", "runs"])
def test_replay_recomputes_the_digest_in_the_records_form(form: str) -> None:
    """A v3 record (upcast: digest over jobs) and a v4 one (over runs) of one decision both
    compare identical with its replay; a reason text that differs shows in either form."""
    d = decision(BASE)
    v3 = codec.decode(codec.encode(_recorded(e.CycleDecidedV3, summarise(d.considered()))))
    v4 = _recorded(e.CycleDecided, d.summary())
    recorded = v3 if form == "jobs" else v4
    assert isinstance(recorded, e.CycleDecided) and recorded.waiting.digest_of == form
    assert replayed_summary(recorded.waiting, d) == recorded.waiting
    outcome = Outcome(placements=(), preemptions=())
    assert compare(recorded, outcome, d) == []
    other = decision(OTHER_TEXT)
    assert [x.what for x in compare(recorded, outcome, other)] == (
        ["order"] if form == "jobs" else ["runs"]
    )


def test_a_v4_record_names_a_different_number_of_runs() -> None:
    d = decision(BASE)
    recorded = _recorded(e.CycleDecided, d.summary())
    assert isinstance(recorded, e.CycleDecided)
    longer = decision([0, 0, None, 2, 2, 2, 2, None, 0])  # one job moves to the run before
    texts = [x.text() for x in compare(recorded, Outcome(placements=(), preemptions=()), longer)]
    assert texts == [
        "waiting: recorded 3 WAIT_PRIORITY, 4 WAIT_RESOURCES, "
        "replayed 4 WAIT_PRIORITY, 3 WAIT_RESOURCES",
        "reason of job 106: recorded WAIT_RESOURCES, replayed WAIT_PRIORITY",
        "runs: recorded 4 runs of waiting jobs, replayed 3 runs of waiting jobs",
    ]
