"""The order in which a cycle considers pending jobs.

Pure: functions of the job and the ranks. Every key is a tuple of primitives (it is recorded in
`CycleDecided.considered` as `sort_key`) and ends in the job id, so the order is total and the same
snapshot always gives the same order.

The fair-share ladder (`fairshare_key`), compared left to right:

1. funded before unfunded (`0` funded, `1` unfunded);
2. the team's fair-share rank: the rank of the job's project, which sorts with its best user leaf
   (see `snapshot.complete_ranks`), so teams come in fair-share order (a reader that gives only
   leaf ranks gets the leaf's rank here, and priority then orders one user's jobs only);
3. inside one team, declared priority, higher first (stored negated);
4. then the rank of the job's user leaf `<project>/<user>` (the project's rank if the leaf is not
   ranked), so a team's members share by fair share when priorities tie;
5. submit time, earlier first;
6. job id.

Priority only orders jobs inside one team: it sits below the team rank, so no priority lets a team
overtake a better-ranked one.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from operator import attrgetter, itemgetter
from typing import overload

from ledger.dispatch.snapshot import UNRANKED, PendingDelta, PendingJob
from schemas.codec import gc_paused

SortKey = tuple[int | float | str, ...]
KeyFn = Callable[[PendingJob], SortKey]


def fairshare_key(job: PendingJob, ranks: Mapping[str, int]) -> SortKey:
    """Pure: the fair-share sort key of `job` (see the module docstring for the ladder)."""
    project = ranks.get(job.account)
    leaf_rank = ranks.get(f"{job.account}/{job.user}", UNRANKED if project is None else project)
    team_rank = leaf_rank if project is None else project
    return (
        0 if job.min_runtime_s > 0 else 1,
        team_rank,
        -job.priority,
        leaf_rank,
        job.submitted_at,
        job.job_id,
    )


def fairshare_order(
    jobs: Iterable[PendingJob], ranks: Mapping[str, int]
) -> list[tuple[SortKey, PendingJob]]:
    """Pure: `ordered(jobs, fairshare_key)`, with the rank look-ups done once per user."""
    cache: dict[tuple[str, str], tuple[int, int]] = {}
    keyed: list[tuple[SortKey, PendingJob]] = []
    for j in jobs:
        who = (j.account, j.user)
        pair = cache.get(who)
        if pair is None:
            key = fairshare_key(j, ranks)
            pair = cache[who] = (int(key[1]), int(key[3]))
        team, leaf = pair
        keyed.append(
            (
                (
                    0 if j.min_runtime_s > 0 else 1,
                    team,
                    -j.priority,
                    leaf,
                    j.submitted_at,
                    j.job_id,
                ),
                j,
            )
        )
    keyed.sort(key=itemgetter(0))
    return keyed


def fifo_key(job: PendingJob) -> SortKey:
    """Pure: first come, first served: submit time, then job id."""
    return (job.submitted_at, job.job_id)


def ordered(jobs: Iterable[PendingJob], key: KeyFn) -> list[tuple[SortKey, PendingJob]]:
    """Pure: the jobs with their keys, in key order. Job ids are unique, so ties cannot happen."""
    keyed = [(key(j), j) for j in jobs]
    keyed.sort(key=itemgetter(0))
    return keyed


class Ordered(Sequence[tuple[SortKey, PendingJob]]):
    """Pure: pending jobs in order, in groups that share the head of their sort keys (every
    part before the submit time and the job id), each group in (submit time, job id) order.
    As a sequence it holds `(sort key, job)` pairs, `head + (submitted_at, job_id)`, built when
    first read: a cycle reads only `jobs` (a flat list), and the keys are built for the readers
    that need them (the decision record's digest, `queue`, `explain`)."""

    __slots__ = ("_groups", "_pairs", "jobs")

    def __init__(self, groups: Sequence[tuple[tuple[int, ...], Sequence[PendingJob]]]) -> None:
        self._groups = groups
        self.jobs: list[PendingJob] = []
        for _, members in groups:
            self.jobs += members
        self._pairs: list[tuple[SortKey, PendingJob]] | None = None

    @property
    def groups(self) -> Sequence[tuple[tuple[int, ...], Sequence[PendingJob]]]:
        """The groups it was made of: (head, jobs in order), heads in order."""
        return self._groups

    def pairs(self) -> list[tuple[SortKey, PendingJob]]:
        """Every `(sort key, job)` pair, in order (built once)."""
        found = self._pairs
        if found is None:
            with gc_paused():
                found = self._pairs = [
                    (head + (j.submitted_at, j.job_id), j)  # noqa: RUF005 (2x faster)
                    for head, members in self._groups
                    for j in members
                ]
        return found

    def key(self, i: int) -> SortKey:
        """The sort key of the `i`-th job (from 0), built alone: what `pairs()[i][0]` is."""
        found = self._pairs
        if found is not None:
            return found[i][0]
        if i < 0:
            i += len(self.jobs)
        for head, members in self._groups:
            if i < len(members):
                j = members[i]
                return head + (j.submitted_at, j.job_id)  # noqa: RUF005
            i -= len(members)
        raise IndexError(i)

    def lazily(self) -> Iterator[tuple[SortKey, PendingJob]]:
        """The pairs in order, each built as it is read (the built ones when `pairs()` ran): a
        reader that stops early (an estimate up to one job) builds no key past it."""
        if self._pairs is not None:
            yield from self._pairs
            return
        for head, members in self._groups:
            for j in members:
                yield head + (j.submitted_at, j.job_id), j  # noqa: RUF005

    @overload
    def __getitem__(self, i: int) -> tuple[SortKey, PendingJob]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[SortKey, PendingJob]]: ...
    def __getitem__(
        self, i: int | slice
    ) -> tuple[SortKey, PendingJob] | list[tuple[SortKey, PendingJob]]:
        return self.pairs()[i]

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[tuple[SortKey, PendingJob]]:
        return iter(self.pairs())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Ordered):
            return self.pairs() == other.pairs()
        if isinstance(other, Sequence):
            return self.pairs() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Ordered({self.pairs()!r})"


_BY_SUBMIT = attrgetter("submitted_at", "job_id")
"""A pending job's place inside its group: (submit time, job id), unique."""
_JOB_ID = attrgetter("job_id")
_SUBMITTED = attrgetter("submitted_at")

_FEW = 8
"""Changes to one class at most this many: put in and taken out one by one (bisect), else the
class is made again from its kept jobs."""


@dataclass(frozen=True, slots=True)
class KeptClasses:
    """What one `classes_kept` hands the next: the pending views it classed (by `id()` of the
    view: the views are the snapshot's, kept by identity while their job's record is unchanged,
    and held here, so an `id` cannot be reused while it is kept) with their class, and every
    class's views in (submit time, job id) order. Never changed after it is made: a call that
    changes a class makes a new list (the last cycle's `Ordered` may still read the old one)."""

    members: dict[int, tuple[PendingJob, Hashable]] | None
    """None when it was made from a snapshot's `delta` (the next call then needs one too, or
    classes every view again)."""
    classes: dict[Hashable, list[PendingJob]]
    heads: tuple[object, dict[Hashable, tuple[int, ...]]] | None = None
    """What the policy read to work out each class's key head, and the heads: a policy adds
    them (`classes_kept` makes none) and reads them back next time while what it read is the
    same."""
    token: object | None = None
    """The `PendingDelta.token` of the snapshot whose views these are (None: not known)."""


def classes_kept(
    pending: Sequence[PendingJob],
    class_of: Callable[[PendingJob], Hashable],
    kept: KeptClasses | None,
    delta: PendingDelta | None = None,
) -> KeptClasses:
    """Pure: the `pending` views in the classes `class_of` gives (a class's sort-key head is the
    same for every job of it), each class in (submit time, job id) order, worked out from what
    the last call handed on (`kept`; None: nothing): only the views that came or went since are
    classed and put in or taken out. Equal to classing every view afresh (a view is the same
    object while its job's record is, `ledger.cycle.inputs.snapshot_kept`; a changed job is a
    new view, so it goes out and comes in). With the snapshot's `delta` from the views `kept`
    holds (the same token), only the views it names are classed: no view is compared."""
    token = delta.token if delta is not None else None
    if (
        kept is not None
        and delta is not None
        and kept.token is not None
        and delta.base is kept.token
    ):
        if not delta.gone and not delta.came:
            return replace(kept, token=token)
        applied = _applied(kept, delta, class_of)
        if applied is not None:
            return applied
    now = dict(zip(map(id, pending), pending, strict=True))
    if kept is not None and kept.members is not None:
        old = kept.members
        gone = old.keys() - now.keys()
        came = now.keys() - old.keys()
        if not gone and not came:
            return replace(kept, token=token)
        if len(gone) + len(came) < len(now):
            return replace(_changed(kept, now, gone, came, class_of), token=token)
    members: dict[int, tuple[PendingJob, Hashable]] = {}
    classes: dict[Hashable, list[PendingJob]] = {}
    for key, j in now.items():
        c = class_of(j)
        members[key] = (j, c)
        group = classes.get(c)
        if group is None:
            classes[c] = [j]
        else:
            group.append(j)
    for group in classes.values():
        if len(group) > 1:  # by (submit time, job id): two stable sorts, keys read in C
            group.sort(key=_JOB_ID)
            group.sort(key=_SUBMITTED)
    return KeptClasses(members, classes, token=token)


def _applied(
    kept: KeptClasses, delta: PendingDelta, class_of: Callable[[PendingJob], Hashable]
) -> KeptClasses | None:
    """`classes_kept` from `kept` with the `delta`'s views taken out and put in; None when a
    view it takes out is not where its class says (then every view is classed again)."""
    classes = dict(kept.classes)
    out: dict[Hashable, list[PendingJob]] = {}
    into: dict[Hashable, list[PendingJob]] = {}
    for j in delta.gone:
        out.setdefault(class_of(j), []).append(j)
    for j in delta.came:
        into.setdefault(class_of(j), []).append(j)
    for c in out.keys() | into.keys():
        taken, put = out.get(c, ()), into.get(c, ())
        group = list(classes.get(c, ()))
        for j in taken:
            at = bisect_left(group, _BY_SUBMIT(j), key=_BY_SUBMIT)
            if at == len(group) or group[at] is not j:
                return None
            del group[at]
        if len(put) <= _FEW:
            for j in put:
                insort(group, j, key=_BY_SUBMIT)
        else:
            group += put
            group.sort(key=_BY_SUBMIT)
        if group:
            classes[c] = group
        else:
            classes.pop(c, None)
    return KeptClasses(None, classes, kept.heads, delta.token)


def _changed(
    kept: KeptClasses,
    now: dict[int, PendingJob],
    gone: Set[int],
    came: Set[int],
    class_of: Callable[[PendingJob], Hashable],
) -> KeptClasses:
    """`classes_kept` from `kept` with the views `gone` taken out and those that `came` in."""
    old = kept.members
    assert old is not None
    members = dict(old)
    classes = dict(kept.classes)
    out: dict[Hashable, list[PendingJob]] = {}
    into: dict[Hashable, list[PendingJob]] = {}
    for key in gone:
        j, c = members.pop(key)
        out.setdefault(c, []).append(j)
    for key in came:
        j = now[key]
        c = class_of(j)
        members[key] = (j, c)
        into.setdefault(c, []).append(j)
    for c in out.keys() | into.keys():
        taken, put = out.get(c, ()), into.get(c, ())
        group = list(classes.get(c, ()))
        if len(taken) + len(put) <= _FEW:
            for j in taken:
                del group[bisect_left(group, _BY_SUBMIT(j), key=_BY_SUBMIT)]
            for j in put:
                insort(group, j, key=_BY_SUBMIT)
        else:
            drop = {id(j) for j in taken}
            group = [j for j in group if id(j) not in drop]
            group += put
            group.sort(key=_BY_SUBMIT)
        if group:
            classes[c] = group
        else:
            classes.pop(c, None)
    return KeptClasses(members, classes)


def enc_hook(obj: object) -> object:
    """msgspec's `enc_hook` for a value holding an `Ordered` (a `Decision`): its pairs."""
    if isinstance(obj, Ordered):
        return obj.pairs()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def jobs_of(order: Sequence[tuple[SortKey, PendingJob]]) -> Sequence[PendingJob]:
    """The jobs of a decision's order, in order, without their sort keys (`Ordered` has them
    at hand; any other order is read)."""
    if isinstance(order, Ordered):
        return order.jobs
    return [j for _, j in order]


def key_at(order: Sequence[tuple[SortKey, PendingJob]], i: int) -> SortKey:
    """The sort key of the `i`-th job of a decision's order (`Ordered.key`: built alone)."""
    return order.key(i) if isinstance(order, Ordered) else order[i][0]


def lazily(order: Sequence[tuple[SortKey, PendingJob]]) -> Iterator[tuple[SortKey, PendingJob]]:
    """The (key, job) pairs of a decision's order, each built as it is read (`Ordered.lazily`)."""
    return order.lazily() if isinstance(order, Ordered) else iter(order)
