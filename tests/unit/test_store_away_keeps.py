"""Node leases kept while the store is away (docs/ha.md, attack F1, F3): every server keeps them,
from its keep delay after its last report until `KEEP_WITHOUT_STORE_S`; a leader counts no node
lost while a server may keep its lease, nor while it does not know; a write refused because the
store is away says so in one line, whatever the other servers of the list say."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import pytest

from ledger.core.state import Node
from ledger.engines.agents import AgentExecutor
from ledger.server.ha import KEEP_WITHOUT_STORE_S, Leadership, keep_timing, may_keep
from ledger.store.lease import Holder
from ledger.wire.client import Client
from schemas.errors import Unavailable
from tests.unit.test_follow_leader import Fake, fakes, refused_url  # noqa: F401 (the fixture)


@pytest.mark.parametrize(
    ("case", "lease_s", "want_stale_s", "want_delay_s"),
    [
        ("the tests' 2 s lease", 2.0, 3.33, 7.67),
        ("the default 5 s lease", 5.0, 5.33, 11.67),
        ("the longest lease", 60.0, 42.0, 85.0),
    ],
)
def test_the_keep_timing_of_a_lease(
    case: str, lease_s: float, want_stale_s: float, want_delay_s: float
) -> None:
    t = keep_timing(lease_s)
    assert (round(t.stale_s, 2), round(t.delay_s, 2)) == (want_stale_s, want_delay_s), case


@pytest.mark.parametrize("lease_s", [1.0, 1.5, 2.0, 5.0, 17.0, 60.0])
def test_a_keep_no_bound_included_comes_after_the_bound_goes_stale(lease_s: float) -> None:
    """A server fresh in a bound read at C reported at most `stale_s` + one statement before C,
    and keeps from `delay_s` after its report: after C + `fresh_s` (+ 1 s of clock drift)."""
    t = keep_timing(lease_s)
    statement = max(0.2, lease_s / 3)
    assert t.delay_s - t.stale_s - statement >= t.fresh_s + 1.0 - 1e-9
    assert t.fresh_s > 1.0 + lease_s / 3  # a bound is read at every report
    assert t.delay_s < 300 - 3  # far within the default node lease (60 s + 5 min - 3 s)


@pytest.mark.parametrize(
    ("case", "since_report_s", "want"),
    [
        ("just cut off: a leader may not see it silent yet", 1.0, False),
        ("just before the delay", 11.6, False),
        ("at the delay", 11.67, True),
        ("a long outage", 600.0, True),
        ("past the keep window: a leader counts its nodes again", KEEP_WITHOUT_STORE_S, False),
    ],
)
def test_when_a_server_whose_store_is_away_keeps(
    case: str, since_report_s: float, want: bool
) -> None:
    assert may_keep(since_report_s, keep_timing(5.0)) is want, case


@dataclass
class FakeLease:
    epoch: int = 3
    lease_s: float = 2.0
    address: str = "http://me"
    acting: bool = False
    node: tuple[float, float] | None = None

    def may_act(self) -> bool:
        return self.acting


def leadership(**kw: Any) -> Leadership:
    return Leadership(FakeLease(**kw))  # type: ignore[arg-type]


def test_a_standby_keeps_from_a_delay_after_its_last_report_while_the_store_is_away() -> None:
    ha = leadership()
    delay = ha.timing.delay_s
    assert ha.keeps() == 0  # the store answers
    ha.unreachable = "connection refused"
    assert ha.keeps() == 0  # it never reported: it keeps nothing
    ha.reported_at = time.monotonic() - 1.0
    assert ha.keeps() == 0  # a leader may not see it silent yet
    ha.reported_at = time.monotonic() - delay - 0.1
    assert ha.keeps() == 1  # a standby that never read a lease says epoch 1
    ha._reporting = True
    assert ha.keeps() == 0  # a report under way: the keep might miss it
    ha._reporting = False
    ha.reported_at = time.monotonic() - KEEP_WITHOUT_STORE_S - 1
    assert ha.keeps() == 0
    ha.unreachable = None
    ha.reported_at = time.monotonic() - delay - 0.1
    assert ha.keeps() == 0


def test_an_acting_leader_keeps_at_once_with_its_epoch() -> None:
    ha = leadership(acting=True)
    ha.leading, ha.unreachable = True, "connection refused"
    ha.reported_at = time.monotonic()
    assert ha.keeps() == 3


def test_the_bound_a_leader_counts_by_is_unknown_once_it_is_not_fresh() -> None:
    ha = leadership()
    assert ha.keeping() is None  # never read: no node may be counted lost
    ha._bound, ha._bound_read_at = None, time.monotonic()
    assert ha.keeping() == -math.inf  # no server ever kept or went silent
    ha._bound, ha._bound_read_at = 30.0, time.monotonic() - 1.0
    assert 28.9 < (ha.keeping() or 0) <= 29.0
    ha._bound = -5.0  # the last keep was 5 s before the read
    assert -6.1 < (ha.keeping() or 0) <= -6.0
    ha._bound_read_at = time.monotonic() - ha.timing.fresh_s - 0.1
    assert ha.keeping() is None


def test_no_node_is_counted_lost_before_a_lease_of_older_longer_settings_has_run_out() -> None:
    # atk38-28 F3: the store's `held_until` is 30 s from the read (an agent may hold a node
    # lease of the old 3 + 60 s until then); this leader counts lost after 3 s and releases
    # after its fence of 4 s, so it counts none lost before 30 - 3 - 4 = 23 s from the read
    ha = leadership(node=(3.0, 4.0))
    ha._bound, ha._bound_read_at = None, time.monotonic()
    ha.leader = Holder(5, "h", "http://h", 2.0, 2.0, held_in_s=30.0)
    ha._leader_read_at = time.monotonic() - 1.0
    assert 21.9 < (ha.keeping() or 0) <= 22.0
    ha.leader = Holder(5, "h", "http://h", 2.0, 2.0, held_in_s=5.0)  # past: nothing held now
    assert -3.1 < (ha.keeping() or 0) <= -3.0
    ha._bound_read_at = time.monotonic() - ha.timing.fresh_s - 0.1
    assert ha.keeping() is None  # the bound not known: none counted lost, whatever is held


def node(name: str, state: str = "active") -> Node:
    return Node(name=name, cluster="c", gpu_type="t", gpus=8, state=state)


def test_no_node_is_counted_lost_while_a_server_may_keep_its_lease_or_nobody_knows() -> None:
    keeping: list[float | None] = [None]
    ex = AgentExecutor(ledger=None, node_lost_after_s=5.0, keeping=lambda: keeping[0])
    nodes = {"n1": node("n1")}
    ex.touch("n1", 100.0)
    assert ex.observe(200.0, nodes).nodes == ()  # not known: none counted
    keeping[0] = 20.0  # read at 201: a server may keep its lease until 221
    assert ex.observe(201.0, nodes).nodes == ()
    keeping[0] = 0.0  # read at 221: the last keep was now
    assert ex.observe(221.0, nodes).nodes == ()
    keeping[0] = -5.0  # read at 226: the last keep was at 221
    assert ex.observe(226.0, nodes).nodes == ()  # its lease runs from then: 5 s
    keeping[0] = -5.5
    [change] = ex.observe(226.5, nodes).nodes
    assert (change.node, change.change) == ("n1", "lost")


def test_without_keeps_the_node_lost_rule_is_as_before() -> None:
    ex = AgentExecutor(ledger=None, node_lost_after_s=5.0, keeping=lambda: -math.inf)
    nodes = {"n1": node("n1")}
    assert ex.observe(100.0, nodes).nodes == ()
    ex.touch("n1", 100.0)
    assert ex.observe(104.0, nodes).nodes == ()
    [change] = ex.observe(105.5, nodes).nodes
    assert change.node == "n1"


def away(*_: Any) -> tuple[int, dict[str, str], bytes]:
    message = "the store does not answer (connection refused): no write is taken until it does"
    problem = {"title": "unavailable", "status": 503, "detail": message, "code": "unavailable"}
    body = json.dumps(problem | {"message": message}).encode()
    return 503, {"X-Gpuledger-Store": "away"}, body


def test_a_write_no_server_can_take_for_the_store_is_said_in_one_line_at_once(
    fakes: tuple[Fake, Fake],  # noqa: F811
) -> None:
    x, y = fakes
    x.answer = y.answer = away
    began = time.monotonic()
    with pytest.raises(Unavailable, match="store does not answer") as got:
        Client(f"{x.url},{y.url}", "tok").post("commands/submit", {})
    assert time.monotonic() - began < 2.0  # not the list's 30 s of retries
    assert "\n" not in got.value.line()
    with pytest.raises(Unavailable, match="store does not answer"):  # not "cannot reach"
        Client(f"{x.url},{refused_url()}", "tok").post("commands/submit", {})
    with pytest.raises(Unavailable, match="store does not answer"):
        Client(f"{refused_url()},{x.url}", "tok").post("commands/submit", {})
