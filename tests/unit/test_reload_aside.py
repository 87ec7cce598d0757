"""A ledger read back from its store after a failed write (`stale`) keeps showing the state it
had folded until the whole log is read again: other threads (the server's reads and token
checks, the node leases it keeps for its agents) never see an empty state while the reload
waits on a store that went away (atk33-28 F1/F2)."""

from __future__ import annotations

import pytest

from ledger.store.application import Ledger
from schemas import commands as c


def test_a_reload_that_waits_on_an_away_store_leaves_the_folded_state_in_place(
    org_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = org_ledger
    led.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=60))
    before, position = led.state.copy(), led.position
    seen = []
    real = Ledger.catch_up

    def away(self: Ledger, until: int | None = None) -> int:
        seen.append((len(led.state.jobs), set(led.state.nodes), led.position))
        raise OSError("the store does not answer")

    led.stale = True  # as after a write the store failed midway
    monkeypatch.setattr(Ledger, "catch_up", away)
    with pytest.raises(OSError):
        led.refresh()
    # while the reload waited, and after it failed: the folded state, still stale
    assert seen == [(1, {"n1", "n2", "a1"}, position)]
    assert led.state == before and led.position == position and led.stale
    monkeypatch.setattr(Ledger, "catch_up", real)
    assert led.refresh() == position  # the store answers again: read back whole
    assert led.state == before and not led.stale
