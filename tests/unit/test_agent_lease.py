"""The node's lease file (`ledger.agent.lease`): renewed by the settings the server last gave,
which the file keeps, so an agent restarted while no server can register it (the store away)
renews its lease by the servers' keeps (atk36-28 F4)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ledger.agent.lease import LEASE_MARGIN_S, NO_FENCE_UNTIL, NodeLease, lease_until, too_short


def test_until_is_the_contact_plus_the_node_lost_timeout_plus_the_fence_less_the_margin() -> None:
    assert lease_until(1000.0, 3.0, 12.0) == 1000.0 + 3.0 + 12.0 - LEASE_MARGIN_S
    assert lease_until(1000.0, 60.0, 1.0) == 1060.0  # a fence under the margin adds nothing


def test_a_restarted_agent_renews_by_the_settings_its_lease_file_kept(tmp_path: Path) -> None:
    path = tmp_path / "lease"
    first = NodeLease(path)
    first.renew(1000.0)
    assert not path.exists()  # never registered: the server's fence is not known
    first.learn(3.0, 12.0)
    first.renew(1000.0)
    assert json.loads(path.read_bytes()) == {
        "until": 1012.0, "node_lost_after_s": 3.0, "node_fence_s": 12.0,
    }  # fmt: skip
    restarted = NodeLease(path)  # a new agent, before any registration
    assert (restarted.lost_after_s, restarted.fence_s, restarted.until) == (3.0, 12.0, 1012.0)
    restarted.renew(1000.2)
    assert json.loads(path.read_bytes())["until"] == 1012.0  # at most every RENEW_EVERY_S
    restarted.renew(1000.25)
    assert json.loads(path.read_bytes())["until"] == 1012.25
    restarted.renew(1020.0)  # a keep sent at 1020
    assert json.loads(path.read_bytes())["until"] == 1032.0


def test_a_file_of_an_older_agent_renews_nothing_until_registered(tmp_path: Path) -> None:
    path = tmp_path / "lease"
    path.write_text('{"until": 1012.0}')
    old = NodeLease(path)
    old.renew(1020.0)
    assert json.loads(path.read_bytes()) == {"until": 1012.0}
    assert NodeLease(tmp_path / "garbage").fence_s is None


def test_new_settings_are_written_at_once_and_no_fence_means_a_lease_that_never_runs_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lease"
    lease = NodeLease(path)
    lease.learn(60.0, 300.0)
    lease.renew(1000.0)
    lease.learn(3.0, 12.0)  # a server with a shorter fence: the shorter lease is written
    lease.renew(1000.0)
    assert json.loads(path.read_bytes())["until"] == 1012.0
    lease.learn(3.0, 0.0)
    lease.renew(1001.0)  # an older lease would stop the parts for nothing, a missing one too
    assert json.loads(path.read_bytes())["until"] == NO_FENCE_UNTIL
    lease.learn(3.0, 12.0)  # the fence is back: the lease is short again at once
    lease.renew(1002.0)
    assert json.loads(path.read_bytes())["until"] == 1014.0


@pytest.mark.parametrize(
    ("case", "lost", "fence", "delay", "heartbeat", "servers", "want"),
    [
        ("the defaults, two servers, 5 s lease", 60.0, 300.0, 11.7, 5.0, 2, None),
        ("the outage tests' 12 s lease, two servers", 3.0, 12.0, 7.7, 0.5, 2, None),
        # atk37-28 F3: every other server of the list may be silent, each probed once more
        ("the same with three servers", 3.0, 12.0, 7.7, 0.5, 3, 0.75 + 7.7 + 1.0 + 5.0),
        (
            "a dead address and three servers, 5 s lease, 16 s node lease (atk37-28 F3)",
            3.0,
            16.0,
            11.7,
            0.5,
            4,
            0.75 + 11.7 + 1.0 + 7.5,
        ),
        ("the same with a 21 s node lease", 3.0, 21.0, 11.7, 0.5, 4, None),
        ("a heartbeat of 5 s", 3.0, 12.0, 7.7, 5.0, 2, 5.25 + 7.7 + 1.0 + 2.5),
        ("five servers, a short keep delay", 3.0, 12.0, 2.0, 0.5, 5, 0.75 + 2.0 + 1.0 + 10.0),
        ("one server: nothing to switch to", 3.0, 9.0, 7.7, 0.5, 1, 0.75 + 7.7 + 1.0),
        ("no fence: no lease", 3.0, 0.0, 7.7, 0.5, 2, None),
        ("no server keeps (one server on its own store)", 3.0, 4.0, 0.0, 0.5, 2, None),
    ],
)
def test_the_sizing_rule_says_what_the_lease_needs_when_it_is_short(
    case: str,
    lost: float,
    fence: float,
    delay: float,
    heartbeat: float,
    servers: int,
    want: float | None,
) -> None:
    got = too_short(lost, fence, delay, heartbeat, servers, answer_s=2.5)
    assert got == (None if want is None else pytest.approx(want)), case


def test_a_state_directory_others_may_write_is_refused_and_a_garbage_lease_has_run_out(
    tmp_path: Path,
) -> None:
    """atk37-28 F4: an agent ran in a mode-777 directory of another account; that account's
    `{"until": 0}` killed the node's jobs, and `{"until": NaN}` turned the fence off."""
    from ledger.agent.lease import others_may_write
    from ledger.engines.lease_file import NodeLease

    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    assert others_may_write(own, os.geteuid()) == ""
    assert others_may_write(tmp_path / "absent", os.geteuid()) == ""
    own.chmod(0o777)
    assert "mode 0777" in others_may_write(own, os.geteuid())
    own.chmod(0o700)
    assert "owner uid" in others_may_write(own, os.geteuid() + 1)
    (own / "lease").write_text('{"until": 1}')
    (own / "lease").chmod(0o666)
    assert "lease may be written" in others_may_write(own, os.geteuid())
    for text in ('{"until": NaN}', '{"until": Infinity}', '{"until": -Infinity}'):
        (own / "lease").write_text(text)
        assert NodeLease(str(own / "lease")).passed(100.0), text
    (own / "lease").write_text('{"until": 200.5}')
    assert not NodeLease(str(own / "lease")).passed(100.0)


def test_an_older_answer_never_puts_back_the_settings_a_later_one_replaced(
    tmp_path: Path,
) -> None:
    """Across a failover that shortened the fence (`--new-settings`), the old leader's answer
    (to a request sent before the take, fence 40 s), handled by one thread after the new
    leader's (sent after it, fence 4 s) by another, put the old settings back, and the next
    renewal ran by them from the new leader's contact: a lease the new leader did not count
    (atk39-28 F1, the window that remained)."""
    path = tmp_path / "lease"
    lease = NodeLease(path)
    lease.learn(3.0, 4.0, 1010.0)  # the new leader's answer
    lease.renew(1010.0)
    lease.learn(3.0, 40.0, 1000.0)  # the old leader's, handled later
    lease.renew(1010.5)
    assert json.loads(path.read_bytes()) == {
        "until": 1014.5, "node_lost_after_s": 3.0, "node_fence_s": 4.0,
    }  # fmt: skip
    lease.learn(3.0, 12.0, 1011.0)  # a later answer's settings are taken
    lease.renew(1011.0)
    assert json.loads(path.read_bytes())["until"] == 1023.0
