"""What a submission's dependency may cost (atk45-25 F3): 1,024 terms of 1,024 ids each were
allowed and every id was looked up in the state, repeats included, each an array's walk over
the kept ends: a plain user's 825 KB submit naming one 2,000-task array 204,800 times held the
server 50 s. Now repeats are dropped before any lookup, each id is looked up once, and the ids
named in all are bounded (`bounds.MAX_DEPENDENCY_IDS`). Counted, not timed."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ledger.core.runas import SubmitLimits
from ledger.core.state import DEPENDENCY_ID_BYTES, State, held_bytes
from schemas import commands as c
from schemas import events as e
from schemas.bounds import MAX_DEPENDENCY_IDS
from schemas.errors import InvalidCommand, NotAuthorised
from tests.unit.test_jobs_world import World


class CountingEnds(dict[int, Any]):
    """`State.ends` counting every read of it (a lookup of an id, or a walk of them all)."""

    reads = 0

    def get(self, *args: Any) -> Any:
        self.reads += 1
        return super().get(*args)

    def items(self) -> Any:
        self.reads += 1
        return super().items()

    def __getitem__(self, key: int) -> Any:
        self.reads += 1
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.reads += 1
        return super().__contains__(key)


@pytest.fixture
def w(org_state: State) -> World:
    return World(org_state)


def test_an_array_named_over_and_over_is_looked_up_once(w: World) -> None:
    tasks = w.submit(array=tuple(range(200)))  # jobs 1-200, array 1
    ends = CountingEnds(w.state.ends)
    w.state.ends = ends
    term = e.Dependency(kind="afterok", job_ids=(tasks[0].job_id,) * 1024)
    (job,) = w.submit(dependency=(term,) * 200)  # F3: 204,800 references to one array
    assert ends.reads <= 4, ends.reads  # was 409,600 (each reference: a lookup and a walk)
    assert job.dependency == (e.Dependency(kind="afterok", job_ids=(1,)),)


def test_ids_named_in_all_terms_are_bounded_before_any_is_looked_up(w: World) -> None:
    w.submit(array=tuple(range(1_100)))  # jobs 1-1,100
    first = e.Dependency(kind="afterany", job_ids=tuple(range(1, 601)))
    again = e.Dependency(kind="afterany", job_ids=tuple(range(500, MAX_DEPENDENCY_IDS + 2)))
    before = w.state.events
    with pytest.raises(InvalidCommand, match=r"names over 1,024 jobs .* at most 1,024"):
        w.submit(dependency=(first, again))  # 1,025 ids in all, 101 of them named twice
    assert w.state.events == before
    fits = e.Dependency(kind="afterany", job_ids=tuple(range(500, MAX_DEPENDENCY_IDS + 1)))
    (job,) = w.submit(dependency=(first, fits, first))
    assert job.dependency == (  # what a term names again is dropped (every term must hold)
        first,
        e.Dependency(kind="afterany", job_ids=tuple(range(601, MAX_DEPENDENCY_IDS + 1))),
    )
    assert w.blocked()[job.job_id] == "WAIT_DEPENDENCY"


def test_the_same_id_under_another_kind_is_its_own_term(w: World) -> None:
    (one,) = w.submit()
    (job,) = w.submit(
        dependency=(
            e.Dependency(kind="afterany", job_ids=(one.job_id, one.job_id)),
            e.Dependency(kind="afterok", job_ids=(one.job_id,)),
            e.Dependency(kind="singleton"),
            e.Dependency(kind="singleton"),
        )
    )
    assert job.dependency == (
        e.Dependency(kind="afterany", job_ids=(one.job_id,)),
        e.Dependency(kind="afterok", job_ids=(one.job_id,)),
        e.Dependency(kind="singleton"),
    )


def test_the_ids_a_dependency_names_count_in_what_a_users_jobs_hold(w: World) -> None:
    """atk45-25 F5: `max_job_bytes_per_user` counted a job as ~1 KiB whatever its dependency
    (160 terms of 1,024 ids each: ~19 MB of the server's memory per pending job)."""
    w.submit(array=tuple(range(1_100)))  # jobs 1-1,100
    ids = e.Dependency(kind="afterany", job_ids=tuple(range(1, 1_001)))
    held = w.state.held_of("alice")
    (job,) = w.submit(dependency=(ids,))
    assert w.state.held_of("alice") - held == held_bytes(job) >= 1_000 * DEPENDENCY_ID_BYTES
    limits = SubmitLimits(max_job_bytes_per_user=w.state.held_of("alice") + 40_000)
    cmd = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, dependency=(ids,))
    with pytest.raises(NotAuthorised, match="max_job_bytes_per_user"):
        limits.check(w.state, cmd)  # 1,000 ids: ~48 KB
    many = msgspec.structs.replace(cmd, dependency=(ids,) * 200)  # named again: counted once
    assert held_bytes(many) == held_bytes(cmd)
    limits = SubmitLimits(max_job_bytes_per_user=w.state.held_of("alice") + 60_000)
    limits.check(w.state, many)  # fits
    w.run(many)
    assert w.state.held_of("alice") - held == 2 * held_bytes(job)
