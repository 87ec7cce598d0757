"""A job's limit, its grace and a minute fit in the partition's MaxTime, or it does not run
(docs/slurm.md, "A job over the partition's MaxTime"; atk62b G1, G2).

G1: `-t 1 --grace 120s` on MaxTime=2 was accepted (sbatch `--time=2`): the executor's SIGTERM
at 60 s, its SIGKILL due at 180 s, but Slurm's TIMEOUT came at 142 s and the run lived 152 s on
a 120 s MaxTime. Now an explicit limit Slurm would start whose grace does not fit is refused at
submit in one line, nothing recorded, as a job without `-t` is (`jobs.grace_refused`).
G2: MaxTime lowered after a submit (a limit taken from 3m, then MaxTime=1) and the job was
placed anyway (`--time=1`), Slurm's TIMEOUT again first. Now a cycle places no job whose limit,
grace and a minute are over the MaxTime recorded (`jobs.over_max_time`): it waits
`PARTITION_TIME_LIMIT`, its reason says what it needs, and its replay decides the same.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ledger.core.jobs import grace_refused, over_max_time, taken_limit
from ledger.core.state import State
from ledger.cycle.dispatcher import Dispatcher
from ledger.cycle.inputs import snapshot_from_state
from ledger.dispatch import decide
from ledger.dispatch.policy import Fifo
from ledger.history.replay import replay_decisions
from ledger.reads.explain import taken_words
from ledger.reads.preview import TOO_LONG, too_long_waits
from ledger.store.application import Ledger
from ledger.store.clock import SimClock
from ledger.store.embedded import EmbeddedSource
from schemas import codec
from schemas import events as e
from schemas.errors import InvalidCommand
from schemas.policy import FifoConfig
from tests.unit.test_replay_slurm_exact import Slurm, _on_slurm, _replayed
from tests.unit.test_service_grace import Recording
from tests.unit.test_slurm_no_limit import _max_time
from tests.unit.test_stopping_held import NoRanks, submit, tick, where


@pytest.fixture
def w(org_state: State) -> Recording:
    return Recording(org_state)


def test_the_rule_limit_grace_and_a_minute_within_max_time() -> None:
    assert not over_max_time(60, 60.0, 180) and over_max_time(60, 61.0, 180)
    assert over_max_time(90, 30.0, 120) and not over_max_time(30, 30.0, 120)
    assert over_max_time(181, 0.0, 180)  # over MaxTime itself
    assert over_max_time(None, 0.0, 60) and not over_max_time(None, 0.0, None)
    assert not over_max_time(10**6, 600.0, None)  # no MaxTime: no rule
    for max_time, grace in ((120, 5.0), (180, 90.0), (172_800, 30.0)):  # a taken limit fits
        assert not over_max_time(taken_limit(max_time, grace), grace, max_time)


def test_an_explicit_limit_whose_grace_does_not_fit_is_refused_and_records_nothing(
    w: Recording,
) -> None:
    _max_time(w, 120, grace_s=30)  # MaxTime=2, the service's grace 30 s
    before = len(w.log)
    with pytest.raises(InvalidCommand) as refused:
        w.submit(time_limit_s=60, grace_s=120)  # atk62b G1's a.py
    assert refused.value.line() == (
        "its time limit (1m), its grace (2m) and a minute do not fit in the partition's MaxTime "
        "(2m): Slurm's TIMEOUT would come before the ledger's SIGKILL (ask --grace of at most "
        "0s)"
    )
    with pytest.raises(InvalidCommand) as refused:
        w.submit(time_limit_s=60)  # the service's grace: 150 s > 120 s
    assert "(ask --grace of at most 0s, or a -t of at most 30s)" in refused.value.line()
    with pytest.raises(InvalidCommand) as refused:
        w.submit(time_limit_s=119, grace_s=120)  # neither alone can be cut to fit
    assert refused.value.hint == "ask a -t and a --grace of at most 1m together"
    assert len(w.log) == before
    (fits,) = w.submit(time_limit_s=30)  # 30 + 30 + 60 = 120: fits
    (own,) = w.submit(time_limit_s=60, grace_s=0)
    assert (fits.time_limit_s, own.time_limit_s) == (30, 60)
    (over,) = w.submit(time_limit_s=300)  # over MaxTime: waits for it, as in Slurm
    assert too_long_waits(w.state, 120.0)[over.job_id].code == TOO_LONG
    _max_time(w, None, grace_s=30)  # no MaxTime recorded: unchanged
    (free,) = w.submit(time_limit_s=60, grace_s=120)
    assert free.time_limit_s == 60


def test_grace_refused_is_pure_and_names_what_fits() -> None:
    assert grace_refused(60, 30.0, 180) is None and grace_refused(600, 30.0, 180) is None
    refused = grace_refused(120, 30.0, 180)
    assert refused is not None and refused.hint == "ask --grace of at most 0s, or a -t of at most 90s"  # fmt: skip  # noqa: E501
    refused = grace_refused(60, 0.0, 60)  # MaxTime=1: -t 1 got --time=1, no grace (b.py)
    assert refused is not None and refused.hint is not None and "longer MaxTime" in refused.hint


def test_max_time_lowered_after_submit_holds_the_job_and_says_what_it_needs(
    w: Recording,
) -> None:
    """atk62b G2 (b.py's R3): a limit taken from MaxTime=3 under a 30 s grace (90 s), then
    MaxTime=2: 90 s is two minutes in Slurm, but 90 + 30 + 60 > 120."""
    _max_time(w, 180, grace_s=30)
    (job,) = w.submit()
    assert job.time_limit_s == 90
    _max_time(w, 120, grace_s=30)
    snap = snapshot_from_state(w.state, {}, w.now, longest_s=120.0, hold_grace=True)
    assert job.job_id not in {p.job_id for p in snap.pending}
    blocked = too_long_waits(w.state, 120.0)[job.job_id]
    assert blocked.code == TOO_LONG
    assert blocked.reason == (
        "its time limit (90s, taken from its MaxTime of 3m), its grace (30s, the service's) "
        "and a minute need 3m; the partition's MaxTime is 2m: Slurm's TIMEOUT would come "
        "before the ledger's SIGKILL, so it is not placed until an admin raises MaxTime (or "
        "it is submitted again: it takes today's MaxTime)"
    ), blocked.reason
    assert "before Slurm's TIMEOUT)" not in taken_words(job)  # atk62b G2: it ran past it
    _max_time(w, 180, grace_s=30)  # raised back: it fits again
    assert job.job_id not in too_long_waits(w.state, 180.0)


def test_a_cycle_holds_a_job_max_time_no_longer_fits_and_its_replay_does_too(
    org_ledger: Ledger, clock: SimClock, home: Path
) -> None:
    _on_slurm(org_ledger, 180)  # the service's grace 5 s
    engine = Slurm(180.0)
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    held = submit(org_ledger, 1, time_limit_s=60, grace_s=60)  # 180: then over 120
    engine.longest_s = 120.0  # MaxTime lowered to 2m after the submit
    fits = submit(org_ledger, 1, time_limit_s=55)  # 55 + 5 + 60 = 120
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, held) == () and where(org_ledger, fits) != ()
    assert _replayed(home) == []
    engine.longest_s = 180.0  # raised back: placed
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, held) != ()
    assert _replayed(home) == []


def test_a_record_made_before_the_grace_rule_replays_by_the_old_one(
    org_ledger: Ledger, clock: SimClock, home: Path
) -> None:
    """The rule is recorded (`CycleDecided.grace_held`): a decision recorded before s63 (over
    MaxTime in whole minutes only) replays byte for byte, and one recorded now by the new;
    read by the other rule, each differs."""
    _on_slurm(org_ledger, 180)  # the service's grace 5 s
    old = submit(org_ledger, 1, time_limit_s=60, grace_s=60)  # 180 s: fits
    _on_slurm(org_ledger, 120)  # lowered: 1m fits the old rule only
    tick(clock)
    now = clock.now()
    snap = snapshot_from_state(org_ledger.state, {}, now, longest_s=120.0, hold_stopping=True,
                               hold_lost=True, hold_placed=True)  # fmt: skip
    cmd = decide(snap, Fifo(), now).to_command(
        "@dispatcher",
        "c-old",
        decided_at=now,
        policy=FifoConfig(),
        stopping_held=True,
        lost_held=True,
        placed_held=True,
    )  # fmt: skip  (as a cycle before s63 decided)
    org_ledger.execute(cmd)
    assert where(org_ledger, old) != ()
    _on_slurm(org_ledger, 180)
    new = submit(org_ledger, 1, time_limit_s=60, grace_s=60)
    fits = submit(org_ledger, 1, time_limit_s=30)
    _on_slurm(org_ledger, 120)
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), Slurm(120.0))  # type: ignore[arg-type]
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, new) == () and where(org_ledger, fits) != ()
    assert _replayed(home) == []
    with EmbeddedSource(home) as source:
        decisions = [(r.position, ev) for r in source.read(0, 10_000)
                     if isinstance(ev := codec.decode(r.data), e.CycleDecided)]  # fmt: skip
        assert [ev.grace_held for _, ev in decisions] == [False, True]
        flipped = [(p, msgspec.structs.replace(ev, grace_held=not ev.grace_held))
                   for p, ev in decisions]  # fmt: skip
        assert not any(r.identical for r in replay_decisions(source, flipped))


def test_the_words_of_a_grace_that_does_not_fit_say_what_to_ask_in_one_unit(w: Recording) -> None:
    """atk63 L1: the need was said in seconds beside a MaxTime in minutes ("need 270s; MaxTime is
    3m"), and a hint naming only `-t` lacked its "ask". L2: a job waiting because the service's
    grace grew (`up --grace 120s` after its submit) was told only to wait for an admin."""
    refused = grace_refused(120, 60.0, 170)  # no --grace fits beside -t 2: only a shorter -t
    assert refused is not None and refused.hint == "ask a -t of at most 50s", refused
    assert grace_refused(60, 100.0, 200).hint == "ask --grace of at most 80s, or a -t of at most 40s"  # type: ignore[union-attr]  # fmt: skip  # noqa: E501
    _max_time(w, 180, grace_s=30)
    (job,) = w.submit(time_limit_s=90)  # fits: 90 + 30 + 60 = 180
    _max_time(w, 180, grace_s=120)  # the service's grace grew: 90 + 120 + 60 = 270 s
    reason = too_long_waits(w.state, 180.0)[job.job_id].reason
    assert "its grace (2m, the service's) and a minute need 4m30s; the partition's MaxTime is 3m" in reason, reason  # fmt: skip  # noqa: E501
    assert reason.endswith("(or it is submitted again with a --grace of at most 30s)"), reason
