"""The server builds the largest reads (`jobs`, `log`: pages of up to 10,000 rows) in parts that
give way to the writes under way (docs/security.md, row T5): the parts, joined, are the page
the read layer gives in one piece, byte for byte, for every way of asking (after, limit, tail,
filters, another viewer's redactions), on a real store with a real projection; a part waits
while a write is under way, never longer than `GIVE_WAY_S`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from ledger.core.state import State
from ledger.reads import layer as reads
from ledger.reads.table import READS
from ledger.server import pooled
from ledger.store.application import Ledger
from ledger.store.embedded import EmbeddedSource
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c
from schemas import events as e
from schemas import views as v


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    home = tmp_path_factory.mktemp("paged") / "home"
    ledger = Ledger(home)
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=1),
            c.OpenAccount(actor="root", path="ai2/tulu", kind="project", shares=1),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.AddMember(actor="root", user="dan", project="ai2/tulu"),
            c.RegisterNode(actor="root", node="n0", gpu_type="h100", gpus=8),
        ]
    )
    for i in range(6):
        who, acct = ("alice", "ai2/olmo") if i % 2 else ("dan", "ai2/tulu")
        first = ledger.state.next_job_id
        job = c.SubmitJob(
            actor=who, account=acct, gpus=1, min_runtime_s=0, command=("sh", "-c", f"echo S{i}")
        )
        ledger.execute_all([job] * 100)
        ledger.execute_all([c.CancelJob(actor=who, job_id=j) for j in range(first, first + 60)])
    ledger.close()
    with Store(":memory:") as s, EmbeddedSource(home) as source:
        Projector(s, source).catch_up()
        yield s


def whole_and_parts(
    store: Any, name: str, args: Any, viewer: str, part: int
) -> tuple[bytes, bytes]:
    spec = READS[name]
    seen = State(admins={"root"})
    handles = pooled.PooledHandles(store.con, viewer, seen, lambda: 1e9)
    whole = msgspec.json.encode(spec.run(handles, args))
    old = pooled.PART
    pooled.PART = part
    try:
        parts = b"[" + b",".join(pooled.paged(name, spec, handles, args, lambda: False)[0]) + b"]"
    finally:
        pooled.PART = old
    return whole, parts


LOGS = [
    v.LogFilter(after=0, limit=10_000),
    v.LogFilter(after=17, limit=333),
    v.LogFilter(after=0, limit=1),
    v.LogFilter(after=0, tail=250),
    v.LogFilter(after=900, tail=10_000),
    v.LogFilter(after=10**6, limit=50),
]
JOBS = [
    v.JobFilter(limit=10_000),
    v.JobFilter(limit=333),
    v.JobFilter(limit=250, user="alice"),
    v.JobFilter(limit=10_000, status="finished"),
    v.JobFilter(limit=10_000, status="pending", account="ai2/tulu"),
    v.JobFilter(limit=100, job_ids=(3, 50, 120, 599)),
    v.JobFilter(limit=10_000, since=0.0),
]


@pytest.mark.parametrize("part", [7, 64, 500])
@pytest.mark.parametrize("viewer", ["root", "alice"])
def test_a_page_built_in_parts_is_the_page_built_whole(store: Any, part: int, viewer: str) -> None:
    for name, cases in (("log", LOGS), ("jobs", JOBS)):
        for args in cases:
            whole, parts = whole_and_parts(store, name, args, viewer, part)
            assert parts == whole, (name, args, viewer, part)
    # and the pages are not empty: the cases read something, redacted for alice
    whole, _ = whole_and_parts(store, "jobs", v.JobFilter(limit=10_000), "alice", 500)
    rows = msgspec.json.decode(whole)
    assert len(rows) == 600 and any(r["redacted"] for r in rows)
    assert not any(r["command"] for r in rows if r["user"] == "dan")
    assert any(r["command"] for r in rows if r["user"] == "alice")


def test_a_part_gives_way_to_writes_for_a_bounded_time(store: Any) -> None:
    calls = 0

    def busy() -> bool:
        nonlocal calls
        calls += 1
        return True  # a write always under way: each part still goes on after GIVE_WAY_S

    handles = pooled.PooledHandles(store.con, "root", State(admins={"root"}), lambda: 1e9)
    old = pooled.PART
    pooled.PART = 100
    try:
        began = time.monotonic()
        rows, _ = pooled.paged("log", READS["log"], handles, v.LogFilter(limit=900), busy)
        took = time.monotonic() - began
    finally:
        pooled.PART = old
    assert len(rows) == 900
    waits = 900 // 100 - 1  # before every part but the first
    assert calls >= waits
    assert waits * pooled.GIVE_WAY_S <= took < waits * pooled.GIVE_WAY_S + 30


def test_reads_hold_the_same_rules_in_parts_as_the_layer(store: Any) -> None:
    """A viewer's redactions are the layer's (`reads.log` with that viewer)."""
    f = v.LogFilter(after=0, limit=10_000)
    direct = reads.log(_Store(store.con), f, reads.Viewer("alice", State()))
    _, parts = whole_and_parts(store, "log", f, "alice", 64)
    assert parts == msgspec.json.encode(direct)


class _Store:
    def __init__(self, con: Any) -> None:
        self.con = con


def test_writes_under_way_are_counted_while_they_run() -> None:
    seen: list[int] = []
    writes = pooled.Writes()
    with writes.counting():
        seen.append(writes.under_way)
        assert writes.busy() and not writes.idle.is_set()
    seen.append(writes.under_way)
    assert seen == [1, 0] and not writes.busy() and writes.idle.is_set()


def test_a_part_waits_on_the_writes_event_and_goes_on_when_they_end(store: Any) -> None:
    writes = pooled.Writes()
    writes.under_way = 1
    writes.idle.clear()  # a write under way for the whole read: each part waits GIVE_WAY_S
    handles = pooled.PooledHandles(store.con, "root", State(admins={"root"}), lambda: 1e9)
    old = pooled.PART
    pooled.PART = 300
    try:
        began = time.monotonic()
        rows, _ = pooled.paged("log", READS["log"], handles, v.LogFilter(limit=900), writes)
        waited = time.monotonic() - began
        writes.under_way = 0
        writes.idle.set()  # no write: no wait
        began = time.monotonic()
        again, _ = pooled.paged("log", READS["log"], handles, v.LogFilter(limit=900), writes)
        quiet = time.monotonic() - began
    finally:
        pooled.PART = old
    assert rows == again and len(rows) == 900
    assert waited >= 2 * pooled.GIVE_WAY_S
    assert quiet < waited + 30  # bounded either way; the quiet read never waited on the event


def _guess_confirms(entry: v.LogEntry, command: tuple[str, ...], nxt: v.LogEntry) -> bool:
    """The outside tester's oracle (finding F4): the shown event rebuilt with a guessed command,
    linked as the chain links it, compared with the next event's `prev_hash`."""
    from projections import chain

    assert entry.event is not None and nxt.event is not None
    guess = msgspec.structs.replace(entry.event, command=command)  # type: ignore[call-arg]
    return chain.link(entry.position, entry.tag, msgspec.json.encode(guess)) == (
        nxt.event.prev_hash
    )


@pytest.mark.parametrize("part", [7, 500])
def test_the_link_after_a_withheld_event_does_not_confirm_a_guess_of_it(
    store: Any, part: int
) -> None:
    """For root the oracle confirms dan's true command (so it is a real oracle); for alice, who
    may not see dan's jobs, no entry after one of dan's withheld events shows its link, in every
    page and at every part's edge, so the true command is never confirmed (docs/security.md,
    row T1)."""
    args = v.LogFilter(after=0, limit=10_000)
    seen = State(admins={"root"})

    def page(viewer: str) -> list[v.LogEntry]:
        handles = pooled.PooledHandles(store.con, viewer, seen, lambda: 1e9)
        old = pooled.PART
        pooled.PART = part
        try:
            raw = b"[" + b",".join(
                pooled.paged("log", READS["log"], handles, args, lambda: False)[0]
            )
        finally:
            pooled.PART = old
        return msgspec.json.decode(raw + b"]", type=list[v.LogEntry])

    full, seen_by_alice = page("root"), page("alice")
    truth = {x.position: x for x in full}
    confirmed = withheld = 0
    for x, nxt in itertools.pairwise(seen_by_alice):
        if not (x.redacted and isinstance(x.event, e.JobSubmitted)):
            continue
        withheld += 1
        command = truth[x.position].event.command  # type: ignore[union-attr]
        assert command and not x.event.command
        assert _guess_confirms(truth[x.position], command, truth[nxt.position])  # a real oracle
        assert nxt.event is not None and nxt.event.prev_hash == ""
        confirmed += _guess_confirms(x, command, nxt)
    assert withheld >= 300 and confirmed == 0, (withheld, confirmed)
    for x in seen_by_alice:  # a page that begins right after a withheld event hides its link too
        if x.redacted and isinstance(x.event, e.JobSubmitted):
            first = reads.log(store, v.LogFilter(after=x.position, limit=1),
                              reads.Viewer("alice", seen))  # fmt: skip
            assert first and first[0].event is not None and first[0].event.prev_hash == ""
            break
    shown = [x for x in seen_by_alice if x.event is not None and x.event.prev_hash]
    assert len(shown) > len(seen_by_alice) // 3  # the others' links stay shown
