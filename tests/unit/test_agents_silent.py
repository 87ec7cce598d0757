"""The node-lost rule of the agents' executor: a node whose agent never made contact since the
server started is silent from the first look, so work placed there is not held forever (an
outsider found requeued work stuck `placed` on such a node)."""

from __future__ import annotations

from ledger.core.state import Node
from ledger.engines.agents import AgentExecutor


def node(name: str, state: str = "active") -> Node:
    return Node(name=name, cluster="c", gpu_type="t", gpus=8, state=state)


def test_a_node_no_agent_ever_reached_is_lost_after_the_timeout() -> None:
    ex = AgentExecutor(ledger=None, node_lost_after_s=5.0)
    nodes = {"n1": node("n1"), "gone": node("gone", "lost"), "off": node("off", "drained")}
    assert ex.observe(100.0, nodes).nodes == ()
    assert ex.observe(104.0, nodes).nodes == ()  # within the timeout
    [change] = ex.observe(105.5, nodes).nodes
    assert (change.node, change.change) == ("n1", "lost")
    assert change.reason == "no word from its agent for 6s"
    lost = {**nodes, "n1": node("n1", "lost")}
    assert ex.observe(200.0, lost).nodes == ()  # once; it counts again when its agent returns


def test_contact_restarts_the_clock() -> None:
    ex = AgentExecutor(ledger=None, node_lost_after_s=5.0)
    nodes = {"n1": node("n1")}
    ex.observe(100.0, nodes)
    ex.touch("n1", 104.0)
    assert ex.observe(108.0, nodes).nodes == ()
    assert [c.node for c in ex.observe(109.5, nodes).nodes] == ["n1"]


def test_the_first_look_is_not_a_contact() -> None:
    """The heartbeat ages (`/metrics`) list only nodes an agent has reached: a node's first look
    starts its silence clock, not its heartbeat."""
    ex = AgentExecutor(ledger=None, node_lost_after_s=5.0)
    nodes = {"n1": node("n1")}
    ex.observe(100.0, nodes)
    assert ex.heard_from() == {}
    ex.touch("n1", 101.0)
    assert ex.heard_from() == {"n1": 101.0}


def test_a_poll_that_returns_after_its_wait_keeps_the_node_but_is_not_heard_from() -> None:
    """atk52-23 F6: a long poll the agent began returns when a kill order is published, though
    the agent was killed meanwhile: it keeps the node's loss clock as before (`last_seen`) but is
    no request heard from the agent (`heard_from`, the node view's, which `cancel` words from)."""
    ex = AgentExecutor(ledger=None, node_lost_after_s=5.0)
    nodes = {"n1": node("n1")}
    ex.observe(100.0, nodes)
    ex.touch("n1", 101.0)
    ex.touch("n1", 104.0, heard=False)
    assert ex.heard_from() == {"n1": 101.0}
    assert ex.observe(108.0, nodes).nodes == ()  # lost from 104 + 5, as before
    assert [c.node for c in ex.observe(109.5, nodes).nodes] == ["n1"]
