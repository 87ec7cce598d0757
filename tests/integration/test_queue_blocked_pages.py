"""A queue page with many jobs a dependency holds: the same rows as `queue`, and a page showing
none of them builds none of them (atk50-29 F9: 2,000 array tasks `afterok` a pending job built
every blocked row and estimated the whole queue on every page, 130 -> 240 ms a page at 10k
pending, for everyone)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from ledger.dispatch.policy import FairShare
from ledger.reads import preview as previews
from ledger.store.application import Ledger
from ledger.store.embedded import EmbeddedSource
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c
from schemas import views as v
from tests.integration.serverkit import cli, set_up_ledger

PENDING = 300
BLOCKED = 200


@pytest.fixture(scope="module")
def handles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Ledger, Store]]:
    tmp = tmp_path_factory.mktemp("blocked")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    ledger = Ledger(home)
    submit = c.SubmitJob(actor="bob", account="ai2/olmo", gpus=1, min_runtime_s=60,
                         time_limit_s=3600)  # fmt: skip
    ledger.execute_all([submit] * PENDING)  # jobs 2..301
    ledger.close()
    cli(home, "submit", "-A", "ai2/tulu", "-G", "1", "-t", "30", "-a", f"0-{BLOCKED - 1}",
        "-d", f"afterok:{PENDING + 1}", "--", "true", GPULEDGER_USER="carol")  # fmt: skip
    ledger = Ledger(home)
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        Projector(store, source).catch_up()
        yield ledger, store
    ledger.close()


def test_every_page_is_the_queues_and_a_page_without_blocked_jobs_builds_none(
    handles: tuple[Ledger, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, store = handles
    policy, now = FairShare(), time.time()
    live = previews.live(ledger, store, policy, now)
    f = v.QueueFilter(state="queued", limit=100)
    whole = previews.queue(ledger, store, policy, now, v.QueueFilter(limit=100_000), live)
    assert len(whole) == 1 + PENDING + BLOCKED
    assert sum(r.code == "WAIT_DEPENDENCY" for r in whole) == BLOCKED
    held = previews.held_back(ledger.state, live[0], policy)
    for given in (None, held):
        for offset in range(0, len(whole), 100):  # the blocked rows (estimates too) as `queue`'s
            page = previews.queue_page(ledger, store, policy, now, f, offset=offset,
                                       preview=live, held=given)  # fmt: skip
            assert page.total == len(whole) and page.rows == whole[offset : offset + 100]
    assert any(r.estimated_start_at is not None for r in whole if r.code == "WAIT_DEPENDENCY")
    # the first page shows none of them: estimated through its own last row alone, and with
    # the server's `held` (once per position) nothing of them found again
    throughs: list[Any] = []
    found: list[int] = []
    starts, blocked = previews.estimated_starts, previews.blocked_keys

    def estimating(*args: Any, **kw: Any) -> Any:
        throughs.append(args[4] if len(args) > 4 else kw.get("through"))
        return starts(*args, **kw)

    def keyed(*args: Any) -> Any:
        found.append(len(args[3]))
        return blocked(*args)

    monkeypatch.setattr(previews, "estimated_starts", estimating)
    monkeypatch.setattr(previews, "blocked_keys", keyed)
    first = previews.queue_page(ledger, store, policy, now, f, preview=live, held=held)
    assert first.rows == whole[:100] and all(r.code != "WAIT_DEPENDENCY" for r in first.rows)
    assert throughs == [whole[99].job_id] and found == [], (throughs, found)
