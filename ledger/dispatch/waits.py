"""Why a pending job waits: `Unplaceable`, and the runs of a decision's order that wait for one
reason (`WaitRun`, read by job id through `Waits`). Values of `decide()` (`ledger.dispatch.engine`).

Pure: data, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

import msgspec

from ledger.dispatch.ordering import SortKey, jobs_of
from ledger.dispatch.snapshot import PendingJob

WaitCode = Literal["WAIT_RESOURCES", "WAIT_PRIORITY", "WAIT_CONTRACT"]


class Unplaceable(msgspec.Struct, frozen=True, kw_only=True):
    """Why a pending job was not placed this cycle. A value, never an exception; jobs that wait
    for the same reason share one value."""

    code: WaitCode
    reason: str
    until: float | None = None
    """For `WAIT_CONTRACT`: when the contracts in the way end."""

    def text(self) -> str:
        return f"{self.code}: {self.reason}"


class WaitRun(msgspec.Struct, frozen=True, array_like=True):
    """Consecutive jobs of a decision's order that waited for one reason: `order[start:stop]`
    all wait for `wait` (placed jobs are in no run)."""

    start: int
    stop: int
    wait: Unplaceable


class Waits(Mapping[int, Unplaceable]):
    """Job id -> why it waited, read from a decision's order and runs. The cycle writes one run
    per stretch of jobs waiting for the same reason, never a record per job; the mapping is
    built on the first look-up by job id (its size and the runs themselves need none)."""

    __slots__ = ("_by_job", "order", "runs")

    def __init__(
        self, order: Sequence[tuple[SortKey, PendingJob]], runs: Sequence[WaitRun]
    ) -> None:
        self.order = order
        self.runs = runs
        self._by_job: dict[int, Unplaceable] | None = None

    def _map(self) -> dict[int, Unplaceable]:
        found = self._by_job
        if found is None:
            jobs = jobs_of(self.order)  # (no sort key built for it)
            found = self._by_job = {
                j.job_id: r.wait for r in self.runs for j in jobs[r.start : r.stop]
            }
        return found

    def __getitem__(self, job_id: int) -> Unplaceable:
        return self._map()[job_id]

    def get(self, job_id: int, default: Unplaceable | None = None) -> Unplaceable | None:  # type: ignore[override]
        return self._map().get(job_id, default)

    def at(self) -> list[Unplaceable | None]:
        """Pure: why the job at each place of the order waited (None: placed), read from the
        runs alone (no mapping by job id built)."""
        out: list[Unplaceable | None] = [None] * len(self.order)
        for r in self.runs:
            out[r.start : r.stop] = [r.wait] * (r.stop - r.start)
        return out

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._map()

    def __iter__(self) -> Iterator[int]:
        return iter(self._map())

    def __len__(self) -> int:
        return sum(r.stop - r.start for r in self.runs)

    def __repr__(self) -> str:
        return f"Waits({self._map()!r})"
