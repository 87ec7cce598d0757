"""The node agents' executor's (`ledger.engines.agents`) judgements of agents and their nodes:
a registration's node must be in the ledger with the GPUs its agent found (`registered_node`);
one agent holds a node, another is refused while a run the holder launched may still be alive
(`refuse_while_held`, for `AgentExecutor.take`); a node whose agent is silent past the node-lost
timeout is lost (`silent_nodes`). No I/O but a log line; `now` is a parameter."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from schemas.errors import InvalidCommand, InvalidTransition

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ledger.core.state import Node
    from schemas import agent as a

log = logging.getLogger("gpuledger.agents")


def registered_node(node: Node | None, req: a.Register) -> Node:
    """The node `req` registers, when it is in the ledger (not removed) with the GPUs its agent
    found; a GPU type other than the ledger's is only said."""
    if node is None or node.state == "removed":
        raise InvalidTransition(
            f"node {req.node!r} is not registered in the ledger",
            hint=f"an admin adds it: gpuledger node add {req.node} --gpus {req.gpus}",
        )
    if node.gpus != req.gpus:
        raise InvalidCommand(
            f"node {req.node!r} has {node.gpus} GPUs in the ledger; its agent found "
            f"{req.gpus} ({req.gpu_source or 'given'})",
            hint="fix the agent's gpus setting, or remove and add the node again",
        )
    if node.gpu_type != req.gpu_type:
        log.warning(
            "node %s: the ledger says %s GPUs, its agent found %s",
            req.node, node.gpu_type, req.gpu_type,
        )  # fmt: skip
    return node


def refuse_while_held(node: str, last: float, until: float, runs: list[int], now: float) -> None:
    """Refuse another agent than `node`'s holder (last heard at `last`) until the holder's
    lease and its parts' grace may have run out (`until`: its last request + the node-lost
    timeout + the fence + the largest grace of the node's runs) and while the ledger still has
    `runs` on the node (they end only by the node-lost rules)."""
    if now < until or runs:
        jobs = ", ".join(map(str, runs))
        why = (f"its runs (job(s) {jobs}) may be alive until they end by the node-lost "
               "rules" if runs else "")  # fmt: skip
        raise InvalidTransition(
            f"node {node!r} is held by another agent (last heard "
            f"{max(0.0, now - last):.0f} s ago): "
            + (why or f"its lease may run {until - now:.0f} s more"),
            hint="stop this one, or start it on that agent's --state-dir; a node has one agent",
        )


def silent_nodes(
    heard: dict[str, float], first_look: dict[str, float], nodes: Mapping[str, Node],
    floor: float, lost_after_s: float, now: float,
) -> list[tuple[str, float]]:  # fmt: skip
    """(node, seconds silent) of `nodes` still counted up whose agent was last `heard` from
    more than `lost_after_s` ago, counted from no earlier than `floor`; a node no agent has
    reached is heard from at its first look (`first_look`, set here: a node that never had an
    agent must not hold work forever)."""
    for node, known in nodes.items():  # a node no agent has reached yet: silent from now on
        if known.state not in ("lost", "removed", "drained") and node not in heard:
            heard[node] = first_look.setdefault(node, now)
    out = []
    for node, seen in sorted(heard.items()):
        n = nodes.get(node)
        if n is None or n.state in ("lost", "removed"):
            continue
        seen = max(seen, floor)
        if now - seen > lost_after_s:
            out.append((node, now - seen))
    return out
