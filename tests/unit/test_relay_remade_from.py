"""Stop 58's closing note: a relay that found positions 1..m of the log on its topic made again
(a relay of this ledger committed them there before it stopped or lost its lease: atk58 F2)
went on from m+1, yet its health said "published again from position 1". Pure."""

from __future__ import annotations

import pytest

from ledger.store.relay_health import RelayHealth

WHY = "topic T was deleted and made again since the relay last committed to it"


@pytest.mark.parametrize(
    ("case", "remade_from", "again_to", "want", "not_want"),
    [
        ("from the start", 1, 0, "published again from position 1", "were on it already"),
        ("after 1..5,000 on it already", 5_001, 0,
         "published again from position 5,001 (positions 1..5,000 were on it already)",
         "from position 1"),
        ("under way, after 1..5,000", 5_001, 15_000,
         "publishing the store's log again from position 5,001 (positions 1..5,000 were on it "
         "already)", "from position 1"),
    ],
)  # fmt: skip
def test_health_says_where_the_log_was_published_again_from(
    case: str, remade_from: int, again_to: int, want: str, not_want: str
) -> None:
    h = RelayHealth(state="publishing", bootstrap="b:1", topic="T", position=7_000,
                    store_head=15_000, remade=WHY, remade_from=remade_from,
                    again_to=again_to)  # fmt: skip
    line = h.line(now=h.updated, head=15_000)
    assert want in line and not_want not in line, (case, line)
