"""The node agents' API: `/v1/agent/*`, for node tokens only, each for its own node.

- `POST /v1/agent/register`: the node's GPUs as its agent found them (idempotent; a lost node
  returns).
- `GET /v1/agent/poll?node=N&since=V&wait=S`: every part the ledger runs on N; with the version
  the agent has, the answer waits (up to `wait`, at most 30 s) until the list changes, so a
  placement reaches its agent without polling delay.
- `POST /v1/agent/report`: parts started and exited (exit codes), utilisation samples and
  checkpoints; recorded at once, on the worker thread.
- `POST /v1/agent/heartbeat`: the agent is alive.
- `POST /v1/agent/confirm`: the agent's last check just before it starts launches: each is
  still its job's current placement on the node, or refused (it never starts).

Every call counts as contact for the node-lost timeout (`ledger.engines.agents`), and names
its agent (`X-Gpuledger-Agent`): one without the header is refused (400), so every request is
judged by the one-agent-per-node rule (`AgentExecutor.holds`, `take`). An agent whose host
rebooted says so (`X-Gpuledger-Rebooted`): believed, the node's runs end at once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
from litestar import Request, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.params import JSONBody, QueryParameter

from ledger.core.state import NODE_ACTOR
from ledger.engines.agents import AgentExecutor
from ledger.server.identity import Identity
from ledger.server.worker import Worker
from projections import queries
from schemas import agent as a
from schemas.errors import InvalidCommand, InvalidTransition, NotAuthorised, Unavailable

log = logging.getLogger("gpuledger.server")

MAX_WAIT_S = 30.0
SLICE_S = 1.0
"""A long-poll checks this often whether the server is stopping (so a stop never waits on it)."""


def agent_routes(
    worker: Worker, who: Callable[[Request[Any, Any, Any]], Identity], clock: Callable[[], float]
) -> list[HTTPRouteHandler]:
    """The routes, for `create_app`."""

    async def executor_for(
        request: Request[Any, Any, Any], node: str, first: Callable[[], a.Report] | None = None
    ) -> tuple[AgentExecutor, bool]:
        """The executor, once the caller is judged the node's agent; True when `first` (the
        report the request carries: checked by calling it) was taken with the judgement: the
        ends its run directories recorded first, even when the agent is refused
        (`AgentExecutor.recorded_ends`, atk43n F4), then the rest (`AgentExecutor.take`)."""
        caller = who(request)
        if caller.actor != f"{NODE_ACTOR}{node}":
            raise NotAuthorised(
                f"{caller.actor!r} may not act for node {node!r}: only that node's token may",
                actor=caller.actor,
            )
        executor = worker.service.executor
        if not isinstance(executor, AgentExecutor):
            raise InvalidTransition(
                "this server runs no node agents", hint="start it with `serve --executor agents`"
            )
        named = request.headers.get(a.AGENT_HEADER) or ""
        if not named:  # unnamed, it could not be refused for the holder (atk39-23 F8)
            raise InvalidCommand(
                f"a node agent's request must name its agent ({a.AGENT_HEADER})",
                hint="run a `gpuledger agent` of this version on the node",
            )
        agent = _digest(named)
        if not executor.holds(node, agent, clock()):  # another agent: judged with the ledger
            rebooted = _reboot_claim(request.headers.get(a.REBOOTED_HEADER) or "")

            def take() -> None:
                report = None if first is None else first()
                if report is not None:  # its recorded ends first, whatever the judgement
                    ended, report = executor.recorded_ends(report, clock())
                    if ended:
                        worker.service.take_reports(clock())
                if executor.take(node, agent, clock(), rebooted, report):  # ends: recorded
                    worker.service.take_reports(clock())

            await worker.call(take, write=True)
            return executor, first is not None
        return executor, False

    @post("/v1/agent/register", status_code=200, tags=["agent"], security=[{"bearer": []}])
    async def register(request: Request[Any, Any, Any], data: JSONBody[a.Register]) -> a.Registered:
        """A node agent says what its node has (idempotent; a lost node returns)."""
        ex, _ = await executor_for(request, data.node)
        peer = request.client.host if request.client is not None else ""

        def apply() -> a.Registered:
            now = clock()
            returning = ex.register(data, peer, now)
            if returning:  # the node's return is an observation: recorded as a cycle records
                worker.service.take_reports(now)
            return ex.registered(data.node, returning)

        result: a.Registered = await worker.call(apply, write=True)
        return result

    @get("/v1/agent/poll", tags=["agent"], security=[{"bearer": []}])
    async def poll(
        request: Request[Any, Any, Any],
        node: Annotated[str, QueryParameter(name="node")],
        since: Annotated[str, QueryParameter(name="since")] = "",
        wait: Annotated[float, QueryParameter(name="wait", ge=0, le=MAX_WAIT_S)] = 0.0,
    ) -> a.Assignment:
        """Every part the ledger runs on `node`; waits up to `wait` s while it equals `since`."""
        ex, _ = await executor_for(request, node)
        ex.touch(node, clock())
        deadline = time.monotonic() + max(0.0, min(wait, MAX_WAIT_S))
        version, parts = ex.board.current(node)
        while version == since and worker.accepting and worker.acting():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            version, parts = await ex.board.wait(node, since, min(left, SLICE_S))
        if not worker.acting():  # the lease ran out while the poll waited: nothing stale goes out
            raise Unavailable("this server no longer leads", hint="the agent finds the leader")
        ex.touch(node, clock(), heard=False)  # the agent may have died meanwhile
        return a.Assignment(
            node=node,
            version=version,
            parts=parts,
            server_time=clock(),
            epoch=worker.epoch(),
            kill=ex.board.kills(node),
        )

    @post("/v1/agent/report", status_code=200, tags=["agent"], security=[{"bearer": []}])
    async def report(request: Request[Any, Any, Any], data: JSONBody[a.Report]) -> a.Ack:
        """Parts started and exited, utilisation samples and checkpoints: recorded at once. A
        report about a job never placed on the node is refused whole (403), recorded nowhere,
        and logged with the node's identity (docs/security.md, row T12)."""
        via = who(request).via

        def ever(job_id: int, node: str) -> bool:
            svc = worker.service
            if svc.projector is None or svc.store is None:
                return True  # closing: nothing to tell by, and nothing is recorded any more
            svc.projector.catch_up()
            return queries.ever_placed_on(svc.store, job_id, node)

        def checked() -> a.Report:
            ex = worker.service.executor
            assert isinstance(ex, AgentExecutor)  # `executor_for` said so
            refused = ex.foreign(data, ever)
            if refused:
                jobs = ", ".join(map(str, refused))
                log.warning(
                    "refused a report of node %s (%s) about job(s) %s, never placed on it",
                    data.node, via, jobs,
                )  # fmt: skip
                raise NotAuthorised(
                    f"node {data.node!r} may report only about runs placed on it: "
                    f"job(s) {jobs} never were",
                    actor=f"{NODE_ACTOR}{data.node}",
                )
            return data

        ex, taken = await executor_for(request, data.node, checked)

        def apply() -> None:
            now = clock()
            if ex.receive(checked(), now):
                worker.service.take_reports(now)

        if not taken:
            await worker.call(apply, write=True)
        return _ack(worker, ex, data.node, clock())

    @post("/v1/agent/heartbeat", status_code=200, tags=["agent"], security=[{"bearer": []}])
    async def heartbeat(request: Request[Any, Any, Any], data: JSONBody[a.Heartbeat]) -> a.Ack:
        """The node's agent is alive."""
        ex, _ = await executor_for(request, data.node)
        ex.touch(data.node, clock())
        return _ack(worker, ex, data.node, clock())

    @post("/v1/agent/confirm", status_code=200, tags=["agent"], security=[{"bearer": []}])
    async def confirm(request: Request[Any, Any, Any], data: JSONBody[a.Confirm]) -> a.Confirmed:
        """The agent's last check before it starts launches (Slurm's prolog's place): only the
        ones still their job's current placement on the node may start (docs/agent.md). Only
        the leading server answers (a standby's state may be behind)."""
        ex, _ = await executor_for(request, data.node)
        ex.touch(data.node, clock())
        if not worker.acting():
            raise Unavailable("this server does not lead", hint="the agent asks the leader")

        def judge() -> a.Confirmed:
            got = ex.confirm(data, clock())
            return msgspec.structs.replace(got, epoch=worker.epoch())

        result: a.Confirmed = await worker.call(judge, write=True)
        return result

    return [register, poll, report, heartbeat, confirm]


def _digest(agent: str) -> str:
    """What the server keeps of an agent's id (`NodeAgentChanged.agent`): a digest, so neither
    the log nor `gpuledger log` ever shows the id itself."""
    return hashlib.sha256(agent[:64].encode()).hexdigest()[:16]


def _reboot_claim(said: str) -> tuple[str, float] | None:
    """`REBOOTED_HEADER`'s `<name before> <seconds since boot>` as (its digest, seconds), None
    when absent or not in that form (then the agent is judged as any other)."""
    before, _, up = said.strip().partition(" ")
    try:
        seconds = float(up)
    except ValueError:
        return None
    if not before or len(before) > 64 or not math.isfinite(seconds) or seconds < 0:
        return None
    return _digest(before), seconds


def _ack(worker: Worker, ex: AgentExecutor, node: str, now: float) -> a.Ack:
    """The answer to a report or a heartbeat: the node's state and this server's settings."""
    return a.Ack(
        server_time=now,
        node_state=_state(worker, node),
        node_lost_after_s=ex.node_lost_after_s,
        node_fence_s=ex.node_fence_s,
    )


def _state(worker: Worker, node: str) -> str:
    n = worker.service.ledger.state.nodes.get(node)
    return "" if n is None else str(n.state)
