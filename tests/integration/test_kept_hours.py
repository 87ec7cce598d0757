"""The teams' ended hours the projection keeps (`projections.kept`, issue 29), as maximal runs
of equal hours: the same rows however the log is batched and across a rebuild, their hours the
same as reading `team_hours` over the whole span, byte for byte, and a whole-period read from
them equal to the engine's sum over every span; on a real log (the synthetic mix written into
the store, some runs' real ends reaching back into kept hours), and on one with a long idle
stretch (years with jobs holding their GPUs: a few rows, not one a team and hour)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from ledger.reads import hours
from ledger.store.embedded import EmbeddedSource
from projections import kept, queries
from projections.projector import Projector, rebuild
from projections.store import Store
from projections.testing.compare import dump
from projections.testing.synthetic import Shape, append_to_store, synthetic_events
from schemas import events as e

KEPT = ("team_hours_kept", "team_hours_span")
IDLE_S = 3 * 365 * 86400.0
"""The idle stretch of `idle_home`'s log: three years, 26,280 hours."""


def moved(ev: e.AnyEvent, by: float) -> e.AnyEvent:
    """`ev` with its time and every other time it carries (`*_at`) `by` seconds later."""
    times = {
        f: getattr(ev, f) + by
        for f in ev.__struct_fields__
        if (f == "at" or f.endswith("_at")) and isinstance(getattr(ev, f), float)
    }
    return msgspec.structs.replace(ev, **times)


def idle_log(n: int, seed: int) -> list[e.AnyEvent]:
    """`backdated_log(n, seed)` with `IDLE_S` of silence after its middle event: the later
    events (and every time they carry) moved that much later, so the runs, jobs and nodes alive
    at the middle last through the silence."""
    events = backdated_log(n, seed)
    half = len(events) // 2
    return events[:half] + [moved(x, IDLE_S) for x in events[half:]]


def backdated_log(n: int, seed: int) -> list[e.AnyEvent]:
    """`n` events of the synthetic mix, every third finish of a run that started over two hours
    before it ending 90 minutes before it is recorded (`ended_at`: an exit recorded late), so
    a later batch reaches back into hours already kept."""
    shape = Shape(nodes=16, programs=2, projects_per_program=3, users_per_project=2)
    out: list[e.AnyEvent] = []
    started: dict[int, float] = {}
    finishes = 0
    for ev in synthetic_events(n, seed=seed, shape=shape):
        if isinstance(ev, e.JobStarted):
            started[ev.job_id] = ev.at
        elif isinstance(ev, e.JobFinished) and ev.job_id in started:
            began = started.pop(ev.job_id)
            finishes += 1
            if finishes % 3 == 0 and ev.at - began > 2 * 3600:
                ev = msgspec.structs.replace(ev, ended_at=ev.at - 5400.0)
        out.append(ev)
    return out


@pytest.fixture(scope="module")
def log_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("kept-log")
    events = backdated_log(2_500, seed=11)
    assert sum(isinstance(x, e.JobFinished) and x.ended_at is not None for x in events) >= 3
    append_to_store(home, iter(events))
    return home


@pytest.fixture(scope="module")
def idle_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("kept-idle")
    append_to_store(home, iter(idle_log(2_000, seed=5)))
    return home


def hours_of(runs: list[dict[str, object]]) -> list[dict[str, object]]:
    """The kept runs as one row per team and hour (each hour with its run's figures)."""
    return [
        {"team": r["team"], "hour": float(k * 3600), "owed_gpu_h": r["owed_gpu_h"],
         "delivered_gpu_h": r["delivered_gpu_h"]}
        for r in runs
        for k in range(int(r["from_at"]) // 3600, int(r["until_at"]) // 3600)  # type: ignore[call-overload]
    ]  # fmt: skip


def whole_reading(store: Store, start: float, end: float) -> list[dict[str, object]]:
    """`team_hours` read once over [start, end): its hours with something owed or delivered."""
    return [
        {"team": h.team, "hour": h.hour, "owed_gpu_h": h.owed_gpu_h,
         "delivered_gpu_h": h.delivered_gpu_h}
        for h in queries.team_hours(store, start, end)
        if h.owed_gpu_h or h.delivered_gpu_h
    ]  # fmt: skip


def assert_maximal(runs: list[dict[str, object]]) -> None:
    """Runs of a team neither overlap nor touch with the same figures (or one run would do)."""
    for a, b in itertools.pairwise(runs):
        if a["team"] != b["team"]:
            continue
        assert a["until_at"] <= b["from_at"], (a, b)  # type: ignore[operator]
        same = (a["owed_gpu_h"], a["delivered_gpu_h"]) == (b["owed_gpu_h"], b["delivered_gpu_h"])
        assert not (same and a["until_at"] == b["from_at"]), (a, b)


def projected(log_home: Path, into: Path, batch_size: int) -> Path:
    """A projection of `log_home`'s log made in batches of `batch_size`, in `into`."""
    into.mkdir()
    (into / "events.sqlite").symlink_to(log_home / "events.sqlite")
    with Store.open(into) as store:
        source = EmbeddedSource(into)
        try:
            Projector(store, source, batch_size=batch_size).catch_up()
        finally:
            source.close()
    return into


def test_kept_hours_are_the_same_however_the_log_is_batched_and_equal_a_whole_reading(
    log_home: Path, tmp_path: Path
) -> None:
    """Batches of 29 events (a live service appends a few at a time: hours kept one by one, runs
    ending late reading kept hours again) keep the very rows one batch keeps, and both equal
    `team_hours` read once over the whole span (its hours with something owed or delivered)."""
    small = projected(log_home, tmp_path / "small", 29)
    whole = projected(log_home, tmp_path / "whole", 1_000_000)
    with Store.open(small, read_only=True) as a, Store.open(whole, read_only=True) as b:
        got = dump(a, KEPT)
        assert got == dump(b, KEPT)  # byte for byte: every float compared exactly
        (span,) = got["team_hours_span"]
        (first, last) = b.con.execute(
            "SELECT min(occurred_at), max(occurred_at) FROM events"
        ).fetchone()
        assert span["from_at"] == math.floor(first / 3600) * 3600
        assert span["until_at"] == math.floor(last / 3600) * 3600 > span["from_at"] + 3 * 3600
        want = whole_reading(b, span["from_at"], span["until_at"])
        assert hours_of(got["team_hours_kept"]) == sorted(
            want, key=lambda r: (r["team"], r["hour"])
        )
        assert_maximal(got["team_hours_kept"])
        assert len({r["team"] for r in want}) >= 4


def test_a_long_idle_stretch_is_a_few_kept_runs_with_every_hour_as_a_whole_reading(
    idle_home: Path, tmp_path: Path
) -> None:
    """Three years without an event, jobs holding their GPUs and waiting through them: a few
    runs a team (not 26,280 rows), the same however the log is batched and after `projection
    rebuild` (one pass in its own batches, into a new file swapped in), each of their hours the
    figures `team_hours` gives it read whole, byte for byte; a whole-period read from them
    equals the engine's sum over every span."""
    small = projected(idle_home, tmp_path / "small", 37)
    with Store.open(small, read_only=True) as a:
        got = dump(a, KEPT)
    source = EmbeddedSource(small)
    try:
        rebuild(small, source, batch_size=500)
    finally:
        source.close()
    whole = projected(idle_home, tmp_path / "whole", 1_000_000)
    with Store.open(small, read_only=True) as a, Store.open(whole, read_only=True) as b:
        assert dump(a, KEPT) == got  # rebuilt
        assert got == dump(b, KEPT)
        (span,) = got["team_hours_span"]
        runs = got["team_hours_kept"]
        assert_maximal(runs)
        through = {r["team"] for r in runs if r["until_at"] - r["from_at"] > IDLE_S - 86400}
        assert len(through) >= 2, runs  # owed or delivered all along the silence
        assert span["until_at"] - span["from_at"] > IDLE_S
        assert len(runs) < 3_000  # one a team and hour: over 26,280 a team
        want = whole_reading(b, span["from_at"], span["until_at"])
        assert hours_of(runs) == sorted(want, key=lambda r: (r["team"], r["hour"]))
        first, last = b.con.execute(
            "SELECT min(occurred_at), max(occurred_at) FROM events"
        ).fetchone()
        for start, end, bucket in [
            (first - 86400.0, last + 10 * 86400.0 + 7.0, 7 * 86400.0),
            (first + IDLE_S / 3, last - 5000.0, 30 * 86400.0),
            (first + 3 * 3600.0, last + 3600.0, 3600.0 * 24),
        ]:
            want_s = list(msgspec.to_builtins(hours.bucketed_series(b, start, end, 2, bucket)))
            got_s = list(
                msgspec.to_builtins(hours.bucketed_series(a, start, end, 2, bucket, kept=True))
            )
            assert got_s == approx_tree(want_s), (start, end, bucket)


def test_a_whole_period_read_from_the_kept_hours_equals_the_engines_sum(
    log_home: Path, tmp_path: Path
) -> None:
    """`bucketed_series(kept=True)` (the teams page's whole period) gives the figures of the
    engine's sum over every span, for windows starting before the log, inside it, and ending
    in it or months after its last event (the quiet hours read once and counted)."""
    home = projected(log_home, tmp_path / "p", 997)
    with Store.open(home, read_only=True) as store:
        first, last = store.con.execute(
            "SELECT min(occurred_at), max(occurred_at) FROM events"
        ).fetchone()
        windows = [
            (first - 3 * 86400 - 17.0, last + 90 * 86400 + 1234.0, 48 * 3600.0),
            (math.floor(first / 3600) * 3600, last + 30 * 3600 + 5.0, 3600.0),
            (first + 4000.0, last - 2000.0, 2 * 3600.0),
            (first - 100.0, last + 2 * 3600.0, 3 * 3600.0),
        ]
        for start, end, bucket in windows:
            want = list(msgspec.to_builtins(hours.bucketed_series(store, start, end, 2, bucket)))
            got = list(
                msgspec.to_builtins(hours.bucketed_series(store, start, end, 2, bucket, kept=True))
            )
            assert got == approx_tree(want), (start, end, bucket)
            assert any(p["delivered_gpu_hours"] > 0 for t in got[1]["teams"] for p in t["points"])
        assert kept.buckets(store, first, last + 86400, 3600.0)  # every team, every bucket


def test_one_bucket_of_the_period_gives_the_delivered_reports_teams(
    log_home: Path, tmp_path: Path
) -> None:
    """The Budget review's figures (`budget_pages.budget`: the period summed per team by the engine,
    one bucket, the chosen account's teams alone) are `report delivered`'s at every team depth,
    a person's too (it read every person of the tree and built each one's every hour in
    Python: ~0.55 s of CPU for a project's review, atk48-29 F8)."""
    from ledger.reads import layer as reads

    home = projected(log_home, tmp_path / "p", 997)
    with Store.open(home, read_only=True) as store:
        (last,) = store.con.execute("SELECT max(occurred_at) FROM events").fetchone()
        end = float(math.floor(last))
        start = end - 28 * 86400.0
        for depth in (1, 2, 3):
            want = msgspec.to_builtins(reads.delivered(store, start, end, depth))
            got, _ = hours.bucketed_series(store, start, end, depth, 28 * 86400.0)
            assert msgspec.to_builtins(got) == approx_tree(want), depth
            assert any(t["delivered_gpu_hours"] > 0 for t in want["teams"]), depth
            if depth == 1:
                continue
            # the teams under one account alone (the review of a program, of a project): the
            # same figures, the other teams not read
            for under in sorted({t["team"].rsplit("/", 1)[0] for t in want["teams"]}):
                mine, _ = hours.bucketed_series(store, start, end, depth, 28 * 86400.0, under=under)
                teams = msgspec.to_builtins(mine)["teams"]
                subset = [t for t in want["teams"] if t["team"].startswith(under + "/")]
                assert teams == approx_tree(subset) and teams, (depth, under)


def peak_rows(store: Store, profile: Path, run: Callable[[], object]) -> int:
    """The most rows any operator of the engine made in the last query `run` asked (DuckDB's
    own profile of it)."""
    store.con.execute("PRAGMA enable_profiling='json'")
    store.con.execute(f"PRAGMA profiling_output='{profile}'")
    try:
        run()
    finally:
        store.con.execute("PRAGMA disable_profiling")

    def rows(op: dict[str, object]) -> int:
        made = op.get("operator_cardinality", op.get("intermediate_rows", 0))
        kids = op.get("children", [])
        assert isinstance(made, int) and isinstance(kids, list)
        return max([made, *(rows(k) for k in kids)])

    ops = json.loads(profile.read_text())
    tops = ops.get("children", []) + ops.get("operator", [])  # (either shape of the profile)
    return max(rows(op) for op in tops)


def test_a_projects_review_reads_the_changes_of_its_own_accounts_alone(
    log_home: Path, tmp_path: Path
) -> None:
    """The review of one project (its people: team depth 3, `under` the project) read every
    account's changes down to the people, each change's time crossed with every account: on the
    bench's 1M-event home 70,000 rows for a project of 4 people, 0.46 s of the read's 0.69 s of
    CPU, the Budget review of a project 611 ms cold (s60-dash). Now the accounts its people's
    allocations are made of alone (the programs, the project's siblings, its people): other
    projects' people joining move neither its figures nor the rows it reads."""
    home = projected(log_home, tmp_path / "p", 997)
    with Store.open(home) as store:
        (last,) = store.con.execute("SELECT max(occurred_at) FROM events").fetchone()
        end = float(math.floor(last))
        start = end - 28 * 86400.0
        projects = [
            r[0]
            for r in store.con.execute(
                "SELECT DISTINCT parent FROM account_history WHERE kind = 'user' ORDER BY 1"
            ).fetchall()
        ]
        mine, other = projects[0], projects[-1]
        assert mine.split("/")[0] != other.split("/")[0]  # another program's project

        def review() -> list[tuple[str, float, float, float, float]]:
            return queries.team_buckets(store, start, end, 28 * 86400.0, team_depth=3, under=mine)

        figures = review()
        peak = peak_rows(store, tmp_path / "before.json", review)
        whole = queries.team_buckets(store, start, end, 28 * 86400.0, team_depth=3)
        (position,) = store.con.execute("SELECT max(position) FROM account_history").fetchone()
        for i in range(200):  # people joining another project, each at a time of its own
            at = start + 3600.0 * (i + 0.5)
            store.con.execute(
                "INSERT INTO account_history VALUES (?, ?, ?, 'opened', ?, 'user', 1, true, '')",
                [f"{other}/joined{i}", position + 1 + i, at, other],
            )
        assert len(queries.team_buckets(store, start, end, 28 * 86400.0, team_depth=3)) > len(
            whole
        )  # the whole tree's read has them
        assert review() == figures
        after = peak_rows(store, tmp_path / "after.json", review)
        assert figures and after <= peak, (peak, after)  # before: 1,346 rows, then 44,660


def approx_tree(x: object) -> object:
    """`x` with its floats compared to 1e-9 (the sums run in another order)."""
    if isinstance(x, dict):
        return {k: approx_tree(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [approx_tree(v) for v in x]
    return pytest.approx(x, rel=1e-9, abs=1e-9) if isinstance(x, float) else x
