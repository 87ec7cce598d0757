"""The node commands, decided: add, drain, return, lose and remove a node, and record its agent.

Pure: state and commands in, events out; `now` is a parameter (in the stamp).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ledger.core.runs import Stamp, drained_after
from ledger.core.state import FORGOTTEN_PREFIX, NODE_LOST, State
from schemas import commands as c
from schemas import events as e
from schemas.bounds import NAME_PATTERN
from schemas.errors import InvalidCommand, InvalidTransition

_NAME = re.compile(NAME_PATTERN)


def name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise InvalidCommand(
            f"invalid {what} {value!r}",
            hint="use letters, digits, '_', '.', '-' (at most 63 characters)",
            value=value,
        )
    return value


def _register_node(state: State, cmd: c.RegisterNode, s: Stamp) -> list[e.AnyEvent]:
    name(cmd.node, "node name")
    name(cmd.gpu_type, "GPU type")
    cluster = name(cmd.cluster or state.cluster, "cluster name")
    existing = state.nodes.get(cmd.node)
    if not (existing is None or existing.state == "removed"):
        raise InvalidTransition(f"node {cmd.node!r} is already registered")
    return [
        e.NodeRegistered(
            **s.kw(), cluster=cluster, node=cmd.node, gpu_type=cmd.gpu_type, gpus=cmd.gpus
        )
    ]


def _drain_node(state: State, cmd: c.DrainNode, s: Stamp) -> list[e.AnyEvent]:
    node = state.node(cmd.node)
    if node.state != "active":
        raise InvalidTransition(f"node {cmd.node!r} is already {node.state}")
    if not bool(cmd.reason.strip()):
        raise InvalidCommand("a drain needs a reason", hint="pass --reason")
    out: list[e.AnyEvent] = [e.NodeDrainRequested(**s.kw(), node=cmd.node, reason=cmd.reason)]
    if not state.node_jobs.get(cmd.node):
        out.append(e.NodeDrained(**s.kw(), node=cmd.node))
    return out


def _return_node(state: State, cmd: c.ReturnNode, s: Stamp) -> list[e.AnyEvent]:
    node = state.node(cmd.node)
    if node.state not in ("draining", "drained", "lost"):
        raise InvalidTransition(f"node {cmd.node!r} is {node.state}, not draining, drained or lost")
    return [e.NodeReturned(**s.kw(), node=cmd.node)]


def _record_node_agent(state: State, cmd: c.RecordNodeAgent, s: Stamp) -> list[e.AnyEvent]:
    same = state.node(cmd.node).agent == cmd.agent
    return [] if same else [e.NodeAgentChanged(**s.kw(), node=cmd.node, agent=cmd.agent)]


def _mark_node_lost(state: State, cmd: c.MarkNodeLost, s: Stamp) -> list[e.AnyEvent]:
    """The node is gone, and so are the runs on it: every job it holds ends in the same command
    (resumable ones requeued, same id; the others failed, with the engine's `node_failure`
    ending where an engine runs them). Other nodes of a gang are freed with it."""
    node = state.node(cmd.node)
    if node.state == "lost":
        raise InvalidTransition(f"node {cmd.node!r} is already lost", node=cmd.node)
    if not bool(cmd.reason.strip()):
        raise InvalidCommand("a lost node needs a reason", hint="pass --reason")
    out: list[e.AnyEvent] = [
        e.NodeLost(**s.kw(), node=cmd.node, reason=cmd.reason, fence_s=cmd.fence_s)
    ]
    if cmd.fence_s:  # its runs are in doubt until the fence passes (`NodeLost`)
        return out
    leaving = set(state.node_jobs.get(cmd.node, ()))
    others: list[str] = []
    note = f"node {cmd.node} lost: {cmd.reason}"[:1000]
    for job_id in sorted(leaving):
        job = state.jobs[job_id]
        others += [sl.node for sl in job.slots if sl.node != cmd.node]
        if job.spec.resumable:
            out += [
                e.JobPreempted(**s.kw(), job_id=job_id, reason="node_failure", note=note),
                e.JobRequeued(**s.kw(), job_id=job_id),
            ]
            continue
        out.append(
            e.JobFinished(**s.kw(), job_id=job_id, outcome="failed", reason="node_lost", note=note)
        )
        if job.engine:
            out.append(
                e.JobEngineEnded(
                    **s.kw(),
                    job_id=job_id,
                    engine=job.engine,
                    engine_job_id=job.engine_job_id,
                    reason="node_failure",
                )
            )
    return out + drained_after(state, others, leaving, s)


def _remove_node(state: State, cmd: c.RemoveNode, s: Stamp) -> list[e.AnyEvent]:
    node = state.node(cmd.node)
    busy = state.node_jobs.get(cmd.node)
    if busy:
        raise InvalidTransition(
            f"node {cmd.node!r} still runs {len(busy or ())} jobs",
            hint="drain it first: `gpuledger node drain`",
        )
    stopping = sorted((sr.job_id, sr.run) for sr in state.stopped_runs.values()
                      if any(sl.node == cmd.node for sl in sr.slots))  # fmt: skip
    if cmd.force:  # the machine is gone for good: its runs' ends will never come (atk51-23 F2)
        return [e.NodeRemoved(**s.kw(), node=cmd.node, reason=cmd.reason),
                *(_forgotten(state, job, run, cmd.node, s) for job, run in stopping)]  # fmt: skip
    lost = {(sr.job_id, sr.run) for sr in state.stopped_runs.values()
            if sr.placed and sr.why == NODE_LOST}  # fmt: skip
    lost.update(node.placed_lost)
    runs = [f"job {job} (run {run}{', placed when the node was lost' * ((job, run) in lost)})"
            for job, run in sorted({*stopping, *node.placed_lost})]  # fmt: skip
    if runs:  # as `scontrol delete` refuses a node with jobs (atk50b-23 F1, atk51-23 F1)
        raise InvalidTransition(
            f"node {cmd.node!r} still has runs stopping: {', '.join(runs[:10])}; their processes "
            "may hold its GPUs until its agent reports them gone",
            hint="wait for them (`gpuledger node list` shows them stopping; a run placed when "
            "the node was lost waits for its agent to be back and report it gone), or pass "
            "--force if the machine is gone for good "
            "(nothing then kills what may still run there)",
            node=cmd.node,
        )
    return [e.NodeRemoved(**s.kw(), node=cmd.node, reason=cmd.reason)]


FORGOTTEN = FORGOTTEN_PREFIX + " `node remove {node} --force`"


def _forgotten(state: State, job_id: int, run: int, node: str, s: Stamp) -> e.JobRunEnded:
    """A stopped run of a node removed with `--force` ends in the record at the removal: no
    agent will ever report it, and it no longer holds its GPUs, its job's dependents or its
    singleton (docs/agent.md: `--force` forgets its stopping runs)."""
    job = state.jobs.get(job_id)
    return e.JobRunEnded(
        **s.kw(),
        job_id=job_id,
        engine=(job.engine if job is not None and job.engine else "ledger"),
        engine_job_id=f"{job_id}.{run + 1}",
        run=run,
        note=FORGOTTEN.format(node=node),
    )


NODE_HANDLERS: dict[type, Callable[[State, c.AnyCommand, Stamp], list[e.AnyEvent]]] = {
    c.RegisterNode: _register_node,  # type: ignore[dict-item]
    c.DrainNode: _drain_node,  # type: ignore[dict-item]
    c.ReturnNode: _return_node,  # type: ignore[dict-item]
    c.RemoveNode: _remove_node,  # type: ignore[dict-item]
    c.MarkNodeLost: _mark_node_lost,  # type: ignore[dict-item]
    c.RecordNodeAgent: _record_node_agent,  # type: ignore[dict-item]
}
