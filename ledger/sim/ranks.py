"""Rank sources for the simulator: fair-share ranks at a moment, two ways.

- `ProjectionRanks`: the real read side (`ledger.cycle.dispatcher.ProjectionRanks`): catches the
  DuckDB
  projection up to the snapshot's position and asks `projections.queries.fair_share` (SQL usage
  + Fair Tree).
- `IncrementalRanks`: the same math (`projections.fairshare`) on usage folded in memory from new
  events only (`projections.usage.UsageFold`); its decision records say so
  (`RankInputs.computed_by`), and replay folds the same events to rank them again.

Both implement `ledger.cycle.dispatcher.RankSource`. docs/simulation.md gives the measured cost of
each and which one the simulator uses by default; tests check that both give the same ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ledger.cycle import dispatcher as service
from ledger.store.application import Ledger
from ledger.store.embedded import EmbeddedSource
from projections import fairshare as fs
from projections.projector import Projector
from projections.store import Store
from projections.usage import FOLD, UsageFold, open_accounts

Ranks = tuple[Mapping[str, int], Mapping[str, float]]


class NoRanks:
    """For policies that do not read ranks (fifo, legacy): nothing to compute."""

    usage_policy = None
    read_position = None
    computed_by = ""

    def ranks(self, now: float, position: int) -> Ranks:
        return {}, {}


class IncrementalRanks:
    """Fair-share ranks from usage folded incrementally out of the ledger's new events
    (`projections.usage.UsageFold`): the same math as the projection, from new events only."""

    computed_by = FOLD
    """Decision records say their ranks came from the fold, which replay runs again."""
    read_position = None
    """Ranks are read from the ledger itself, at the snapshot's position."""

    def __init__(self, ledger: Ledger, policy: fs.UsagePolicy | None = None) -> None:
        self.ledger = ledger
        self.fold = UsageFold(policy)
        self._seen = 0
        self._cache: tuple[float, int, Ranks] | None = None

    @property
    def policy(self) -> fs.UsagePolicy:
        return self.fold.policy

    @property
    def usage_policy(self) -> fs.UsagePolicy:
        return self.fold.policy

    def _observe(self) -> None:
        for pos, ev in self.ledger.follow(self._seen):
            self.fold.apply(ev)
            self._seen = pos

    def usage(self, now: float) -> dict[str, float]:
        """Usage per user leaf at `now` (the projection's `leaf` usage)."""
        self._observe()
        return self.fold.usage(now)

    def tree(self, now: float) -> fs.FairTree:
        usage = fs.rollup(self.usage(now))
        return fs.fair_tree(
            fs.AccountUsage(
                path=a.path,
                parent=a.parent,
                kind=a.kind,
                shares=a.shares,
                usage=usage.get(a.path, 0.0),
            )
            for a in self.ledger.state.accounts.values()
            if a.open
        )

    def ranks(self, now: float, position: int) -> Ranks:
        """Ranks at `now` over the ledger's events (the dispatcher has just caught it up to
        `position`, which is therefore every event there is): the numbers of `tree(now)`,
        computed on the cached tree shape without building the table's rows."""
        self._observe()
        if self._cache is not None and self._cache[:2] == (now, self._seen):
            return self._cache[2]
        out = self.fold.ranks(now, open_accounts(self.ledger.state.accounts.values()))
        self._cache = (now, self._seen, out)
        return out

    def usage_shares(self, now: float, position: int) -> service.Standing:
        """The usage and norm shares behind `ranks(now, position)` (`service.usage_shares`)."""
        self._observe()
        return self.fold.usage_shares(now, open_accounts(self.ledger.state.accounts.values()))


class ProjectionRanks:
    """`ledger.cycle.dispatcher.ProjectionRanks` over the projection of `home`, owning its files."""

    def __init__(self, home: Path, policy: fs.UsagePolicy | None = None) -> None:
        self.source = EmbeddedSource(home)
        self.store = Store.open(home)
        self.projector = Projector(self.store, self.source)
        self.inner = service.ProjectionRanks(self.projector, policy or fs.UsagePolicy())

    computed_by = ""
    """The projection's SQL."""

    @property
    def usage_policy(self) -> fs.UsagePolicy:
        return self.inner.usage

    @property
    def read_position(self) -> int | None:
        return self.inner.read_position

    def ranks(self, now: float, position: int) -> Ranks:
        return self.inner.ranks(now, position)

    def usage_shares(self, now: float, position: int) -> service.Standing:
        return self.inner.usage_shares(now, position)

    def close(self) -> None:
        self.store.close()
        self.source.close()
