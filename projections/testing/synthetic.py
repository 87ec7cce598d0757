"""Synthetic event logs for tests and benchmarks (not for production ledgers).

`synthetic_events` simulates a busy cluster (an organisation tree, nodes, jobs submitted, placed by
a first-fit dispatcher, started, finished, preempted and requeued, share changes, drains) and yields
the events the ledger would record, in order. `append_to_store` writes them straight into the
eventsourcing SQLite table of a ledger home (`stored_events`, one stream, versions continuing the
stream), which is ~50x faster than appending through the ledger application: the way to make
logs of millions of events. It bypasses the ledger's checks, so only use it on scratch homes.

Deterministic: the same arguments give the same events, byte for byte.
"""

from __future__ import annotations

import hashlib
import heapq
import random  # noqa: TID251 (a seeded generator made here from the `seed` argument)
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, uuid5

import msgspec

from projections.chain import link
from schemas import codec
from schemas import events as e
from schemas.events import tag_of

STREAM_ID = uuid5(NAMESPACE_URL, "gpuledger:ledger")
"""The ledger's one stream (the same value as `ledger.store.application.STREAM_ID`)."""

T0 = 1_750_000_000.0


@dataclass(frozen=True)
class Shape:
    """The simulated organisation and load."""

    programs: int = 3
    projects_per_program: int = 5
    users_per_project: int = 4
    nodes: int = 128
    gpus_per_node: int = 8
    step_s: float = 60.0
    jobs_per_step: float = 2.0
    """Mean submissions per step (demand is about 1.1x the GPUs at the defaults)."""
    max_pending: int = 2_000
    """Past this many pending jobs the oldest is cancelled."""
    unfunded_fraction: float = 0.2
    preempt_probability: float = 0.1
    """Per step: the chance that one running job past its contract is preempted."""
    samples: bool = True
    """Emit utilisation samples and checkpoints (a realistic event mix)."""


@dataclass
class _Job:
    spec: e.JobSubmitted
    remaining_s: float = 0.0
    ends_at: float = 0.0
    slots: tuple[e.GpuSlot, ...] = ()
    placed_at: float = 0.0


def synthetic_events(
    n_events: int, *, seed: int = 1, shape: Shape | None = None
) -> Iterator[e.AnyEvent]:
    """Yield exactly `n_events` events of a simulated cluster, in log order."""
    sim = _Sim(seed, shape or Shape())
    for count, ev in enumerate(sim.run(), start=1):
        yield ev
        if count >= n_events:
            return


class _Sim:
    def __init__(self, seed: int, shape: Shape) -> None:
        self.rng = random.Random(seed)
        self.shape = shape
        self.now = T0
        self.next_job = 1
        self.cycle = 0
        self.users: list[tuple[str, str]] = []
        self.accounts: list[str] = []
        self.free: dict[str, list[int]] = {}
        self.draining: set[str] = set()
        self.pending: list[_Job] = []
        self.running: dict[int, _Job] = {}
        self.ends: list[tuple[float, int, float]] = []
        self.by_free: list[dict[str, None]] = [{} for _ in range(shape.gpus_per_node + 1)]

    def kw(self, actor: str) -> dict[str, Any]:
        return {"event_id": f"{self.rng.getrandbits(128):032x}", "at": self.now, "actor": actor}

    def run(self) -> Iterator[e.AnyEvent]:
        yield from self.setup()
        while True:
            self.now += self.shape.step_s
            yield from self.submit()
            yield from self.finish()
            yield from self.preempt()
            yield from self.dispatch()
            yield from self.churn()

    def setup(self) -> Iterator[e.AnyEvent]:
        s = self.shape
        yield e.LedgerInitialised(**self.kw("root"), admin="root")
        for p in range(s.programs):
            prog = f"prog{p}"
            yield from self.open(prog, None, "program", 1 + p)
            for q in range(s.projects_per_program):
                proj = f"{prog}/proj{q}"
                yield from self.open(proj, prog, "project", 1 + self.rng.randrange(5))
                for u in range(s.users_per_project):
                    user = f"user{p}_{q}_{u}"
                    yield e.MemberAdded(**self.kw("root"), user=user, project=proj)
                    yield from self.open(f"{proj}/{user}", proj, "user", 1)
                    self.users.append((proj, user))
        for n in range(s.nodes):
            name = f"node{n:04d}"
            gpu_type = "h100" if n % 4 else "a100"
            yield e.NodeRegistered(
                **self.kw("root"),
                cluster="default",
                node=name,
                gpu_type=gpu_type,
                gpus=s.gpus_per_node,
            )
            self.free[name] = list(range(s.gpus_per_node))
            self.by_free[s.gpus_per_node][name] = None

    def open(
        self, path: str, parent: str | None, kind: e.AccountKind, shares: int
    ) -> Iterator[e.AnyEvent]:
        yield e.AccountOpened(**self.kw("root"), path=path, parent=parent, kind=kind)
        yield e.SharesSet(**self.kw("root"), account=path, shares=shares, reason="opened")
        self.accounts.append(path)

    def submit(self) -> Iterator[e.AnyEvent]:
        rng, s = self.rng, self.shape
        k = int(rng.expovariate(1.0 / s.jobs_per_step)) if s.jobs_per_step > 0 else 0
        for _ in range(k):
            proj, user = rng.choice(self.users)
            funded = rng.random() >= s.unfunded_fraction
            spec = e.JobSubmitted(
                **self.kw(user),
                job_id=self.next_job,
                account=proj,
                user=user,
                gpus=rng.choice((1, 1, 2, 4, 8)),
                min_runtime_s=rng.choice((3600, 4 * 3600, 8 * 3600)) if funded else 0,
                resumable=rng.random() < 0.5,
                duration_s=float(rng.randrange(600, 6 * 3600)),
            )
            self.next_job += 1
            self.pending.append(_Job(spec, remaining_s=spec.duration_s or 0.0))
            yield spec
        while len(self.pending) > s.max_pending:
            old = self.pending.pop(0)
            yield e.JobFinished(
                **self.kw(old.spec.user),
                job_id=old.spec.job_id,
                outcome="cancelled",
                reason="cancelled",
            )

    def dispatch(self) -> Iterator[e.AnyEvent]:
        placed: list[tuple[_Job, tuple[e.GpuSlot, ...]]] = []
        waiting: list[_Job] = []
        for job in self.pending[:64]:
            slots = self.first_fit(job.spec.gpus)
            if slots is None:
                waiting.append(job)
            else:
                placed.append((job, slots))
        self.pending[:64] = waiting
        if not placed:
            return
        self.cycle += 1
        cycle_id = f"c{self.cycle}"
        yield e.CycleDecided(
            **self.kw("@dispatcher"),
            cycle_id=cycle_id,
            based_on=0,
            policy_version="synthetic-1",
            decided_at=self.now,
            ranks=e.RankInputs(
                position=0,
                digest=_digest(self.cycle),
                ranking_version="fairtree-1",
                usage=e.UsageSettings(window_s=7 * 24 * 3600.0),
            ),
            placed=tuple(j.spec.job_id for j, _ in placed),
            waiting=e.Waiting(
                considered=len(placed) + len(self.pending),
                first=tuple(
                    e.WaitingJob(j.spec.job_id, "WAIT_RESOURCES") for j in self.pending[:64]
                ),
                counts=(e.WaitCount("WAIT_RESOURCES", len(self.pending)),),
                order_digest=_digest(-self.cycle),
                runs=1 if self.pending else 0,
            ),
        )
        for job, slots in placed:
            yield e.JobPlaced(
                **self.kw("@dispatcher"),
                job_id=job.spec.job_id,
                slots=slots,
                cycle_id=cycle_id,
                based_on=0,
            )
            job.slots, job.placed_at = slots, self.now
            job.ends_at = self.now + job.remaining_s
            self.running[job.spec.job_id] = job
            heapq.heappush(self.ends, (job.ends_at, job.spec.job_id, job.placed_at))
        for job, _ in placed:
            yield e.JobStarted(**self.kw("@executor"), job_id=job.spec.job_id)

    def first_fit(self, gpus: int) -> tuple[e.GpuSlot, ...] | None:
        """Best fit on one node: the fullest node that still has `gpus` free GPUs."""
        for k in range(gpus, self.shape.gpus_per_node + 1):
            bucket = self.by_free[k]
            if bucket:
                node = next(iter(bucket))
                free = self.free[node]
                self.set_free(node, free[gpus:])
                return (e.GpuSlot(node=node, gpu_indices=tuple(free[:gpus])),)
        return None

    def set_free(self, node: str, free: list[int]) -> None:
        """Move `node` to the bucket of its new free count (draining nodes sit in no bucket)."""
        self.by_free[len(self.free[node])].pop(node, None)
        self.free[node] = free
        if node not in self.draining:
            self.by_free[len(free)][node] = None

    def release(self, job: _Job) -> None:
        for sl in job.slots:
            self.set_free(sl.node, sorted(self.free[sl.node] + list(sl.gpu_indices)))
        del self.running[job.spec.job_id]

    def finish(self) -> Iterator[e.AnyEvent]:
        while self.ends and self.ends[0][0] <= self.now:
            _, job_id, placed_at = heapq.heappop(self.ends)
            job = self.running.get(job_id)
            if job is None or job.placed_at != placed_at:
                continue  # preempted since
            self.release(job)
            code = 0 if self.rng.random() < 0.9 else 1
            yield e.JobFinished(
                **self.kw("@executor"),
                job_id=job.spec.job_id,
                outcome="completed" if code == 0 else "failed",
                exit_code=code,
                reason="completed" if code == 0 else "failed",
            )

    def preempt(self) -> Iterator[e.AnyEvent]:
        if not self.running or self.rng.random() >= self.shape.preempt_probability:
            return
        job = self.rng.choice(list(self.running.values()))
        if self.now < job.placed_at + job.spec.min_runtime_s:
            return
        self.release(job)
        yield e.JobPreempted(
            **self.kw("@dispatcher"),
            job_id=job.spec.job_id,
            reason="fairness",
            cycle_id=f"c{self.cycle}",
        )
        if job.spec.resumable:
            yield e.JobRequeued(**self.kw("@dispatcher"), job_id=job.spec.job_id)
            job.remaining_s = max(0.0, job.ends_at - self.now)
            self.pending.insert(0, job)
        else:
            yield e.JobFinished(
                **self.kw("@dispatcher"),
                job_id=job.spec.job_id,
                outcome="preempted",
                reason="preempted",
            )

    def churn(self) -> Iterator[e.AnyEvent]:
        rng = self.rng
        if self.shape.samples and self.running:
            for job in rng.sample(list(self.running.values()), min(3, len(self.running))):
                util = tuple(float(rng.randrange(0, 100)) for _ in range(job.spec.gpus))
                yield e.UtilisationSampled(
                    **self.kw("@executor"), job_id=job.spec.job_id, gpu_utilisation=util
                )
                if job.spec.resumable:
                    yield e.CheckpointReported(**self.kw("@executor"), job_id=job.spec.job_id)
        if rng.random() < 0.01:
            acct = rng.choice(self.accounts)
            yield e.SharesSet(
                **self.kw("root"), account=acct, shares=rng.randrange(0, 10), reason="rebalance"
            )
        if rng.random() < 0.002:
            node = rng.choice(list(self.free))
            if node in self.draining:
                self.draining.discard(node)
                self.set_free(node, self.free[node])
                yield e.NodeReturned(**self.kw("root"), node=node)
            else:
                self.by_free[len(self.free[node])].pop(node, None)
                self.draining.add(node)
                yield e.NodeDrainRequested(**self.kw("root"), node=node, reason="maintenance")


_CREATE = (
    "CREATE TABLE IF NOT EXISTS stored_events (originator_id TEXT, originator_version INTEGER, "
    "topic TEXT, state BLOB, PRIMARY KEY (originator_id, originator_version))"
)


def append_to_store(home: Path | str, events: Iterator[e.AnyEvent], *, chunk: int = 100_000) -> int:
    """Append events to `<home>/events.sqlite` as the ledger stores them; return the new head.

    Same table, same stream id, versions continuing the stream, topic = tag, state = canonical
    JSON, `prev_hash` chaining each event to the one before, so the ledger application, the
    projector, readers of a Kafka copy and the audit read the result like any other log.
    """
    path = Path(home) / "events.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        stream, version = _stream_end(con)
        last = con.execute(
            "SELECT rowid, topic, state, originator_version FROM stored_events "
            "ORDER BY rowid DESC LIMIT 1"
        ).fetchone()
        prev = link(last[0], last[1], bytes(last[2]), last[3]) if last else ""
        rows: list[tuple[str, int, str, bytes]] = []
        for ev in events:
            version += 1
            tag = tag_of(type(ev))
            data = codec.encode(msgspec.structs.replace(ev, prev_hash=prev))  # chained, as stored
            prev = link(version, tag, data, version)
            rows.append((stream, version, tag, data))
            if len(rows) >= chunk:
                _insert(con, rows)
                rows = []
        if rows:
            _insert(con, rows)
        return _head(con)
    finally:
        con.close()


def _stream_end(con: sqlite3.Connection) -> tuple[str, int]:
    """The ledger's stream id and its last version (0: none yet), the table made if missing."""
    con.execute(_CREATE)
    stream = STREAM_ID.hex
    row = con.execute(
        "SELECT max(originator_version) FROM stored_events WHERE originator_id = ?", (stream,)
    ).fetchone()
    return stream, int(row[0] or 0)


def _insert(con: sqlite3.Connection, rows: list[tuple[str, int, str, bytes]]) -> None:
    con.execute("BEGIN")
    con.executemany("INSERT INTO stored_events VALUES (?, ?, ?, ?)", rows)
    con.execute("COMMIT")


def _head(con: sqlite3.Connection) -> int:
    head = con.execute("SELECT max(rowid) FROM stored_events").fetchone()
    return int(head[0] or 0)


def append_raw(home: Path | str, records: list[tuple[str, bytes]]) -> int:
    """Append raw (tag, bytes) records, valid or not: tests of corrupt and unknown events."""
    path = Path(home) / "events.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    try:
        stream, version = _stream_end(con)
        _insert(con, [(stream, version + i + 1, t, d) for i, (t, d) in enumerate(records)])
        return _head(con)
    finally:
        con.close()


def pending_submissions(
    n: int, members: list[tuple[str, str]], *, first_job_id: int, at: float, seed: int = 1
) -> Iterator[e.AnyEvent]:
    """`n` job submissions by `members` ((project, user) pairs), one a second before `at`
    (a deep queue: appended with `append_to_store` on a scratch home in seconds, where `n`
    submits through the API take minutes). Deterministic."""
    rng = random.Random(seed)
    for i in range(n):
        project, user = members[i % len(members)]
        unfunded = rng.random() < 0.2
        yield e.JobSubmitted(
            event_id=f"{rng.getrandbits(128):032x}",
            at=at - n + i,
            actor=user,
            job_id=first_job_id + i,
            account=project,
            user=user,
            gpus=rng.choice((1, 2, 4, 8)),
            min_runtime_s=0 if unfunded else rng.choice((3600, 4 * 3600)),
            resumable=rng.random() < 0.5,
            command=("python", "train.py", f"--run={i}"),
        )


def _digest(n: int) -> str:
    """A stand-in SHA-256 hex digest (the synthetic log has no real ranks or order)."""
    return hashlib.sha256(str(n).encode()).hexdigest()
