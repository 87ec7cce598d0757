"""The executor of `serve --executor agents`: node agents run the placements. An edge.

It implements the executor protocol (`ledger.cycle.executor`) for the dispatcher, on the server's
worker thread, and keeps what each node's agent should run as a published list (`Board`) the
agent API serves to long-polls from the HTTP threads:

- `carry_out` removes the parts of the stopped jobs (the agents then stop them: SIGTERM, grace,
  SIGKILL) and adds one part per node of each placement (its slots, command, limits, the rank-0
  node's address for the rendezvous, and a job token minted now, scoped to the job), records the
  tokens, then wakes the polls of those nodes.
- An agent's report (`receive`) says which parts started, ended (exit code, reason), their GPU
  utilisation and checkpoints. The job is started when every part has; it ends when a part fails
  (the ledger ends it, and its other parts are stopped) or when every part has exited 0.
  Utilisation of a gang job is recorded once every part has sent a sample. `observe` hands all
  of it to the ledger (the server records it at once, between cycles).
- Contact (register, poll, report, heartbeat) is timed per node: a node whose agent has been
  silent past `node_lost_after_s` is observed `lost` (a node change, as Slurm's DOWN is), once;
  the ledger keeps a silent node's GPUs held until then: nothing is placed on them twice. A lost
  node whose agent registers again is observed returning.

After a server restart, `adopt` rebuilds every node's list from the ledger (the agents kept
running their jobs), and counts each node with work as heard from at that moment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from ledger.core import tokens
from ledger.cycle.executor import (
    Exit,
    Launch,
    NodeChange,
    Observed,
    Orders,
    Reaping,
    Sample,
    Start,
    launch_of,
    output_files,
)
from ledger.engines.agent_nodes import refuse_while_held, registered_node, silent_nodes
from ledger.engines.agent_runs import (
    AgentRun,
    StoppedStarts,
    end_unheard,
    launch_refusal,
    part_for,
    reported_jobs,
    run_ended,
    run_reaping,
    run_started,
)
from ledger.engines.board import Board, kills_by_node
from ledger.engines.fence import ANY_RUN, Fence, reboot_honoured
from ledger.store.clock import new_token_secret
from schemas import agent as a
from schemas import commands as c
from schemas.bounds import job_grace
from schemas.errors import LedgerError

if TYPE_CHECKING:
    from ledger.core.state import Job, Node

AGENT_DRAIN = "agent: drained by `gpuledger agent --drain`"
"""The drain reason of a node its agent drained; the node returns when an agent registers."""
SILENT = "no word from its agent for"
"""How a node lost to silence is explained: only such a loss is undone by its agent's return."""
REBOOTED = "its host rebooted"
"""The note of a run ended by its node's reboot (`AgentExecutor.take`)."""

log = logging.getLogger("gpuledger.agents")

ENGINE = "agent"
SYSTEM = "@executor"


class AgentExecutor:
    """Placements to node agents over the API (see the module doc)."""

    engine = ENGINE
    relaunch_placed = True
    """Agents keep their runs across our restarts: a placed job is still on its node's list."""

    def __init__(
        self,
        ledger: Any,
        *,
        node_lost_after_s: float,
        node_fence_s: float = 300.0,
        grace_s: float = 30.0,
        keeping: Callable[[], float | None] = lambda: -math.inf,
        keep_delay_s: float = 0.0,
    ) -> None:
        self.ledger = ledger
        self.keep_delay_s = keep_delay_s
        """When servers on the store keep node leases without it (`Registered.keep_delay_s`)."""
        self.keeping = keeping
        """Until when, in seconds from now (negative: in the past), a server (this one or
        another on the store) may keep a node's lease while the store is away from it; None:
        not known now
        (`ledger.server.ha.Leadership.keeping`). No node is counted lost before then plus
        `node_lost_after_s`, nor at all while it is not known: a kept node is never fenced."""
        self.counts_lost_from: float | None = None
        """No node is counted lost before this time (the first look) plus `node_lost_after_s`."""
        self.node_lost_after_s = node_lost_after_s
        self.node_fence_s = node_fence_s
        """How long after a node is lost its runs stay in doubt (`NodeLost.fence_s`): its
        parts stop themselves by then (their lease), so its jobs may run elsewhere after it."""
        self.grace_s = grace_s
        """The agents' default SIGTERM-to-SIGKILL grace (a job's own overrides it)."""
        self.board = Board()
        self.fence = Fence(self.board.epoch, node_fence_s)
        self._held: dict[int, tuple[Launch, str]] = {}
        """Launches waiting until no earlier run of their job may be alive (`Fence`)."""
        self._stopped: list[Exit] = []
        """Ends of stopped runs the agents reported, for the record (`JobRunEnded`)."""
        self._partly_running: set[tuple[int, int]] = set()
        """Gang runs (job, run) stopped while a part's command still ran (neither ended nor
        reaping, `AgentRun.reaping`): a part's exit told by itself is not the run's, which
        did not complete (atk52-23 F2: a part whose command had ended is told so)."""
        self._ending: dict[tuple[int, str], tuple[Exit, set[str]]] = {}
        """(job, run name) -> the end of a stopped gang run a part of which another node may
        still run (`Fence.blocking`), and the nodes whose parts reported their end: recorded
        once no other node may (`_end_stopped`, atk53-23 F2)."""
        self._began = StoppedStarts()
        """When the parts of runs stopped before their start was recorded started."""
        self._completed: set[int] = set()
        """Jobs a stopped run of which ended by itself (`Exit.by_itself`): their held next
        launch is not released in the `observe` that hands that end over: the ledger records
        it first, and may end the job by that exit, which then runs no more (atk38-24 F3,
        atk53-23 F3: whatever its code)."""
        self._ran_on: dict[int, set[str]] = {}
        """Job -> the nodes its runs were put on (since this server started, or found in the
        log by `foreign`): what each node's reports may be about (docs/security.md, row T12)."""
        self.addresses: dict[str, str] = {}
        self.last_seen: dict[str, float] = {}
        self.heard: dict[str, float] = {}
        """Node -> when its agent's last request came (`heard_from`, the node view's): unlike
        `last_seen`, not moved when a long poll the agent began returns after its wait, which a
        dead agent's does too (atk52-23 F6: a kill order woke a killed agent's poll)."""
        self.holders: dict[str, tuple[str, float]] = {}
        """node -> (the agent that holds it, its last request): `holds`, `take`. The holder is
        also recorded (`Node.agent`): a restarted server counts its last request from `adopt`."""
        self.world: Callable[[int], Launch] | None = None
        """The dispatcher's launch of a job (`ledger.cycle.executor.HandsOutAgain`)."""
        self._started_at: float | None = None
        """When `adopt` ran (this server's start): the recorded holders' last request, at
        the latest."""
        """Node -> when its agent last reached us (written by HTTP threads and the worker)."""
        self._first_look: dict[str, float] = {}
        """Node -> when the worker first saw it up with no agent heard from since this server
        started: the silence of a node that never had an agent counts from there."""
        self._runs: dict[int, AgentRun] = {}
        self._parts: dict[str, dict[int, a.Part]] = {}
        self._starts: list[Start] = []
        self._exits: list[Exit] = []
        self._checkpoints: list[int] = []
        self._reaping: list[Reaping] = []
        self._samples: list[Sample] = []
        self._returns: list[str] = []
        """Lost nodes whose agent registered again, not yet observed."""
        self._drains: list[str] = []
        """Nodes whose agent is draining them (`agent --drain`), not yet observed."""
        self._tokens: list[c.AnyCommand] = []
        self._unpublished: set[str] = set()

    # --- the executor protocol (worker thread) --------------------------------------------------

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        """What the agents reported since the last call, the nodes gone silent past the
        node-lost timeout (each once: it counts again when its agent returns) and the lost
        nodes whose agent registered again."""
        changes = [NodeChange(n, "return") for n in self._returns]
        changes += [NodeChange(n, "drain", AGENT_DRAIN) for n in self._drains]
        self._drains = []
        for node in self._returns:
            self.fence.returned(node)
        for node, quiet_s in self._silent(now, nodes):
            why = f"{SILENT} {quiet_s:.0f}s"
            # in doubt past the fence and our grace (a job's own grace is added to it)
            doubt = self.node_fence_s + self.grace_s
            changes.append(NodeChange(node, "lost", why, fence_s=doubt))
            self.last_seen.pop(node, None)  # it counts again once its agent returns
            self._first_look.pop(node, None)
            self.fence.lost(node, now)
        for x, _ in list(self._ending.values()):  # their blocking nodes may have let them go
            self._end_stopped(x, None, now)
        self._release(now)
        out = Observed(
            nodes=tuple(changes),
            starts=tuple(self._starts),
            checkpoints=tuple(self._checkpoints),
            samples=tuple(self._samples),
            exits=tuple(self._exits),
            running=frozenset(self._runs) | frozenset(self._held),
            stopped=tuple(self._stopped),
            stopping=self.fence.holding(now),
            reaping=tuple(self._reaping),
        )
        self._returns, self._starts, self._exits, self._reaping = [], [], [], []
        self._checkpoints, self._samples, self._stopped = [], [], []
        self._completed = set()
        return out

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        """Take the stopped jobs' parts off their nodes' lists, add the launches', record their
        job tokens, then publish (a part never reaches its node before its token is valid).
        Starts come from the agents' reports."""
        for job_id in orders.stops:
            self._stop(job_id, now)
        self._order_kills(set(orders.kills), now)
        for job in orders.launches:
            old = self._runs.get(job.job_id)
            if old is not None and old.run == job.run:
                continue
            if old is not None:  # requeued (a lost node) and placed again in one cycle
                self._stop(job.job_id, now)
            self._launch(job, now)
        self.flush()
        return ()

    def _launch(self, job: Launch, now: float) -> None:
        """Hand the launch to its nodes, or hold it while an earlier run of its job may be
        alive somewhere (`Fence`)."""
        blocking = self.fence.blocking(job.job_id, now)
        if blocking:
            if job.job_id not in self._held:
                log.info("job %s run %s waits until its earlier run is gone from %s",
                         job.job_id, job.run, ", ".join(blocking))  # fmt: skip
            self._held[job.job_id] = (job, "")
            return
        self._held.pop(job.job_id, None)
        self._add(job, self._mint(job.job_id, job.user), publish=False)

    def _release(self, now: float) -> None:
        """Hand over the held launches no earlier run blocks any more."""
        freed = [j for j, (job, _) in self._held.items()
                 if not self.fence.blocking(j, now) and j not in self._completed
                 and not self._end_unheard(j, job.run, now)]  # fmt: skip
        for job_id in sorted(freed):
            job, _ = self._held.pop(job_id)
            log.info("job %s run %s: its earlier run is gone; launching it", job_id, job.run)
            self._add(job, self._mint(job_id, job.user), publish=False)
        if freed:
            self.flush()

    def _end_unheard(self, job_id: int, run: int, now: float) -> bool:
        """An earlier stopped run of the job has no end yet (`agent_runs.end_unheard`)."""
        if any(x.job_id == job_id for x in self._stopped) or any(
            k[0] == job_id for k in self._ending
        ):
            return False
        state = self.ledger.state
        return end_unheard(state.stopped_runs.values(), state.nodes, job_id, run, now,
                           self.grace_s, self.node_lost_after_s)  # fmt: skip

    def confirm(self, req: a.Confirm, now: float) -> a.Confirmed:
        """The agent's last check before it starts `req`'s launches (worker thread): each is
        still its job's current placement on the node, or refused (`launch_refusal`)."""
        ok: list[a.PartRun] = []
        refused: list[a.Refusal] = []
        for ch in req.launches:
            why = launch_refusal(ch, req.node, self._runs.get(ch.job_id),
                                 self._parts.get(req.node, {}).get(ch.job_id),
                                 self.ledger.state.jobs.get(ch.job_id),
                                 self.fence.blocking(ch.job_id, now),
                                 ch.job_id in self._completed)  # fmt: skip
            if why:
                log.info("node %s: job %s run %s must not start: %s", req.node, ch.job_id,
                         ch.run, why)  # fmt: skip
                refused.append(a.Refusal(job_id=ch.job_id, run=ch.run, why=why))
            else:
                ok.append(a.PartRun(job_id=ch.job_id, run=ch.run))
        return a.Confirmed(node=req.node, ok=tuple(ok), refused=tuple(refused))

    def flush(self) -> None:
        """Record the job tokens of the launches so far in one transaction, then hand their
        parts to the agents (a part never reaches its node before its token is valid)."""
        if self._tokens:
            cmds, self._tokens = self._tokens, []
            self.ledger.execute_all(cmds)
        for node in sorted(self._unpublished):
            self._publish(node)
        self._unpublished.clear()

    def heard_from(self) -> Mapping[str, float]:
        return dict(self.heard)

    def next_event_at(self) -> float | None:
        return None

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        """After a restart: every running job is on its nodes' lists again (the agents kept
        them running), with its whole world (`world`: the dispatcher's launch, from the
        submission in the log) and a fresh job token, so a node that must launch it again (its
        agent lost it) launches what the first launch was, never a part stripped of its
        directory, environment, output files, umask and token (atk38-23 F4, F8). Placed ones
        are left to the dispatcher to launch again (`carry_out`); one that had earlier runs
        waits until every node has reported once (any of them may still have an earlier run).
        The recorded holder of each node (`Node.agent`) holds it as if heard from now."""
        state = self.ledger.state
        jobs = state.jobs
        nodes = [n for n, x in state.nodes.items() if x.state != "removed"]
        self._started_at = now
        for n in nodes:
            if state.nodes[n].agent:
                self.holders.setdefault(n, (state.nodes[n].agent, now))
        adopted: set[int] = set()
        for job_id in sorted(runs):
            job = jobs[job_id]
            spec = job.spec
            for sl in job.slots:
                self.last_seen.setdefault(sl.node, now)
            if job.status == "placed":
                if job.run:  # an earlier run may live anywhere
                    grace = self.grace_s if spec.grace_s is None else spec.grace_s
                    self.fence.adopted(job_id, nodes, {}, grace)
                continue
            launch = self._world(job_id, job)
            self._add(launch, self._mint(job_id, launch.user), started=True, publish=False)
            adopted.add(job_id)
        self._still_stopping(nodes, now)
        for n in nodes:  # a lost node's blockers go once its fence has passed
            if state.nodes[n].state == "lost":
                self.fence.lost(n, now)
        self.flush()
        return adopted

    def _world(self, job_id: int, job: Job) -> Launch:
        """A running job's launch as the dispatcher makes it (`world`); as its ledger user when
        the dispatcher's rule no longer admits its owner (it runs already)."""
        if self.world is not None:
            with contextlib.suppress(LedgerError):
                return self.world(job_id)
        return launch_of(job_id, job, job.spec.user)

    def _still_stopping(self, nodes: Iterable[str], now: float) -> None:
        """After a restart: the runs the ledger stopped whose end is not recorded yet (the log
        says which: `State.stopped_runs`) may still live in their grace, holding their GPUs, as
        before the restart: their nodes block them (`node list` shows them `stopping`, a new
        run of the job waits) until each node reports it no longer has them (atk36-23 F1)."""
        known = set(nodes)
        for r in self.ledger.state.stopped_runs.values():
            gpus: dict[str, tuple[int, ...]] = {}
            for sl in r.slots:
                if sl.node in known:
                    gpus[sl.node] = (*gpus.get(sl.node, ()), *sl.gpu_indices)
            self.fence.stopped(r.job_id, r.run, gpus, {}, r.grace(self.grace_s), now, gpus)

    def shutdown(self, now: float) -> list[Exit]:
        """The server stops: the agents keep running their jobs."""
        return []

    # --- agents (worker thread, through the API) -------------------------------------------------

    def register(self, req: a.Register, peer: str, now: float) -> bool:
        """Idempotent: the node must exist with the GPUs the agent found; True when it is lost
        (its return is observed: the caller records it, then answers with `registered`)."""
        node = registered_node(self.ledger.state.nodes.get(req.node), req)
        self.addresses[req.node] = req.address or peer
        self.touch(req.node, now)
        if req.version:
            self._heard_running(req.node, req.version, req.running, now)
        self._publish(req.node, bump=False)
        if node.state in ("draining", "drained") and node.drain_reason == AGENT_DRAIN:
            log.info("node %s is back: the agent that drained it registered", req.node)
            if req.node not in self._returns:
                self._returns.append(req.node)
            return True
        if node.state != "lost":
            return False
        if not node.lost_reason.startswith(SILENT):
            # an admin's (or an engine's) loss is not undone by the node's own agent: the
            # admin returns it (`gpuledger node return`); until then it takes no work
            log.info("node %s stays lost (%s) until an admin returns it", req.node,
                     node.lost_reason)  # fmt: skip
            return False
        log.info("node %s is back: its agent registered", req.node)
        if req.node not in self._returns:
            self._returns.append(req.node)
        return True

    def registered(self, node: str, returning: bool) -> a.Registered:
        """The answer to a registration, once what it observed is recorded."""
        state = str(self.ledger.state.nodes[node].state)
        return a.Registered(
            node=node,
            state=state,
            returned=returning and state != "lost",
            node_lost_after_s=self.node_lost_after_s,
            node_fence_s=self.node_fence_s,
            keep_delay_s=self.keep_delay_s,
        )

    def touch(self, node: str, now: float, *, heard: bool = True) -> None:
        """The node's agent is alive at `now` (`heard`: a request of its came now)."""
        self.last_seen[node] = now
        if heard:
            self.heard[node] = now

    def holds(self, node: str, agent: str, now: float) -> bool:
        """Every request of a node's agent names it (`schemas.agent.AGENT_HEADER`, a digest of
        the random id it keeps in its state directory). True when `agent` is the node's holder
        (its request counts); otherwise `take` judges it, on the worker thread. Called on the
        HTTP threads (a request naming no agent is refused before: atk39-23 F8)."""
        held = self.holders.get(node)
        if held is not None and held[0] == agent:
            self.holders[node] = (agent, now)
            return True
        return False

    def take(
        self, node: str, agent: str, now: float, rebooted: tuple[str, float] | None = None,
        first: a.Report | None = None,
    ) -> bool:  # fmt: skip
        """Another agent than the holder asks for `node` (worker thread). One agent holds a
        node: a second agent (another state directory, or another machine with the same
        `--node` and state directory path) knows none of the first's runs and would launch
        them all again (atk37-23 F4, atk38-23 F4, F9). It is refused (409, one line) while a
        run the holder launched may still be alive:

        - until the holder's last request + the node-lost timeout + the fence + the largest
          grace of the node's runs (the holder's lease ends at most that long after its last
          request, and its parts get their grace after SIGTERM: atk38-23 F5); and
        - while the ledger still has runs on the node (placed, running, in doubt on a lost
          node, or stopping): they end only by the node-lost rules (the node lost, its fence
          passed: `node_failure`, resumable jobs requeued), and only then may another agent
          run anything there.

        An agent that says its host rebooted (`rebooted`: the digest of what it was on the boot
        before, its seconds since this boot) and is believed (`fence.reboot_honoured`: it was the
        holder, silent since before this boot) takes the node at once: the runs the holder had
        started there are gone with the boot and end now (`_rebooted`), not after the node-lost
        timeout and the fence; `first`, the report its request carries (taken here, whatever
        the judgement, once the agent holds the node), comes first: the ends its run directories
        recorded before the reboot are the runs' own (atk43 F4). Returns whether anything is to
        record (the caller records it).

        The holder is recorded (`NodeAgentChanged`) whenever it changes, so a restarted server
        (or a new leader) knows it, and counts its last request from its own start."""
        state = self.ledger.state
        known = state.nodes.get(node)
        if known is None:
            return False  # registration says what is wrong with it
        held = self.holders.get(node)
        if held is None and known.agent:
            held = (known.agent, self._started_at if self._started_at is not None else now)
        ended = False
        margin = self.node_lost_after_s / 2
        if (
            held is not None
            and rebooted is not None
            and reboot_honoured(rebooted[0], held[0], now - held[1], rebooted[1], margin)
        ):
            ended = first is not None and self.receive(first, now)
            ended |= self._rebooted(node, max(held[1], now - rebooted[1]), now)
            first = None
        elif held is not None and held[0] not in ("", agent):
            stopping = self.fence.stopping_on(node, now)
            grace = max([self._grace_on(node), *stopping.values()])
            until = held[1] + self.node_lost_after_s + self.node_fence_s + grace
            runs = sorted({*state.node_jobs.get(node, ()), *stopping})
            refuse_while_held(node, held[1], until, runs, now)
            log.info("node %s: another agent takes it (the holder's runs are gone)", node)
        self.holders[node] = (agent, now)
        if known.agent != agent:
            self.ledger.execute(c.RecordNodeAgent(actor=SYSTEM, node=node, agent=agent))
        return (first is not None and self.receive(first, now)) or ended

    def _rebooted(self, node: str, gone_at: float, now: float) -> bool:
        """`node`'s host rebooted (`take`): every run started there whose end its agent did not
        report ends, `node_failure` at `gone_at` (the holder's last word, or this boot if later:
        gone by then), as the fence would end it. Its job runs again only once the agent reports,
        as of the list without it, that it has none of it (`Fence.stopped`: its own word, at its
        next report), never while the agent still reports it alive (atk43 F2). A run placed and
        not yet started stays on the node's list for its new agent. True when a run ended."""
        log.warning("node %s: its agent says its host rebooted (believed): its runs end now", node)
        ended: list[AgentRun] = []
        for r in list(self._runs.values()):
            if node not in r.nodes or node in r.exits or not r.start_reported:
                continue
            r.exits[node] = a.PartExited(job_id=r.job_id, run=r.run, exit_code=-1,
                                         reason="node_failure", ended_at=gone_at,
                                         note=f"node {node}: {REBOOTED}")  # fmt: skip
            self._parts.get(node, {}).pop(r.job_id, None)
            ended.append(r)
        self._publish(node)
        version = {node: self.board.number(node)}
        for r in ended:
            gpus = tuple(i for sl in r.slots if sl.node == node for i in sl.gpu_indices)
            self.fence.stopped(r.job_id, r.run, [node], version, r.grace_s, now, {node: gpus})
            self._maybe_exited(r, now)
        self._release(now)
        return bool(ended)

    def _grace_on(self, node: str) -> float:
        """The largest SIGTERM-to-SIGKILL grace of the runs the ledger has on `node` (ours for
        a job without its own)."""
        state = self.ledger.state
        graces = [self.grace_s]
        for job_id in state.node_jobs.get(node, ()):
            job = state.jobs.get(job_id)
            if job is not None:
                graces.append(job.grace(self.grace_s))  # its own, else its placement's
        return max(graces)

    def receive(self, rep: a.Report, now: float) -> bool:
        """Take in an agent's report; True when it holds anything for the ledger."""
        self.touch(rep.node, now)
        node = self.ledger.state.nodes.get(rep.node)
        draining = rep.draining and node is not None and node.state == "active"
        if draining and rep.node not in self._drains:
            log.info("node %s: its agent is draining it", rep.node)
            self._drains.append(rep.node)
        self._ends(rep.node, rep.started, rep.exited, now)
        for u in rep.samples:
            r = self._run_of(u.job_id, u.run, rep.node)
            if r is not None and r.start_reported and not r.exit_reported:
                sample = r.sampled(rep.node, u.gpu_utilisation)
                if sample is not None:
                    self._samples.append(sample)
        for cp in rep.checkpoints:
            r = self._run_of(cp.job_id, cp.run, rep.node)
            if r is not None and r.job_id not in self._checkpoints:
                self._checkpoints.append(r.job_id)
        for rp in rep.reaping:
            r = self._run_of(rp.job_id, rp.run, rep.node)
            if r is not None:
                r.reaping[rep.node] = rp
                if (said := run_reaping(r)) is not None:
                    self._reaping.append(said)
        for st in rep.stopped:
            name = f"{st.job_id}.{st.run + 1}"
            state = "KILLED" if st.killed else "STOPPED"
            at = now if st.ended_at is None else st.ended_at
            self._end_stopped(Exit(st.job_id, st.exit_code or 0, at, "exited", name, state,
                                   run=st.run), rep.node, now)  # fmt: skip
        if rep.running is not None:
            self._heard_running(rep.node, rep.version, rep.running, now)
        return bool(
            rep.started or rep.exited or rep.samples or rep.checkpoints or rep.stopped
            or rep.reaping or draining
        )  # fmt: skip

    def recorded_ends(self, rep: a.Report, now: float) -> tuple[bool, a.Report]:
        """The ends a node's run directories recorded (a supervisor's `exit` file: every end
        but `lost`, which is a guess) of the runs the ledger has there, from an agent that does
        not hold the node: taken before it is judged (`take`), so neither a refusal nor a
        reboot or loss that ends the node's runs later loses them. Its agent knew the job had
        completed and was refused while the reboot was not believed (a server restarted around
        it, a host back within the margin): the run ended `node_failure` and the job ran again
        (atk43n F4). Nothing else of the report counts yet (no contact: a refused agent keeps
        no node alive). Returns whether any was taken, and the report without them."""
        taken = tuple(
            x for x in rep.exited if x.reason != "lost" and self._run_of(x.job_id, x.run, rep.node)
        )
        if not taken:
            return False, rep
        runs = {(x.job_id, x.run) for x in taken}
        started = tuple(s for s in rep.started if (s.job_id, s.run) in runs)
        log.info("node %s: ends recorded there before its agent holds it: job(s) %s", rep.node,
                 ", ".join(str(x.job_id) for x in taken))  # fmt: skip
        self._ends(rep.node, started, taken, now)
        rest = msgspec.structs.replace(
            rep,
            started=tuple(s for s in rep.started if (s.job_id, s.run) not in runs),
            exited=tuple(x for x in rep.exited if x not in taken),
        )
        return True, rest

    def _ends(
        self, node: str, started: Iterable[a.PartStarted], exited: Iterable[a.PartExited],
        now: float,
    ) -> None:  # fmt: skip
        """Parts started and exited on `node`, as its agent reported them."""
        for s in started:
            r = self._run_of(s.job_id, s.run, node)
            if r is not None:
                r.started[node] = s
                self._maybe_started(r)
            else:  # a run the ledger stopped: its end says when it started
                self._began.keep(s.job_id, s.run, s.started_at)
        for x in exited:
            r = self._run_of(x.job_id, x.run, node)
            if r is None and not any(s.job_id == x.job_id for s in self._stopped):
                # a run the ledger no longer has (its node's fence stopped it, or it ended on
                # its own before the stop reached it): its real end, for the record
                state = "FENCED" if x.reason == "node_failure" else "EXITED"
                at = now if x.ended_at is None else x.ended_at
                name = f"{x.job_id}.{x.run + 1}"
                # its agent had no stop for it, and every other part's command had ended
                itself = x.reason == "exited" and (x.job_id, x.run) not in self._partly_running
                self._partly_running.discard((x.job_id, x.run))  # its first end is the run's
                self._end_stopped(Exit(x.job_id, x.exit_code, at, x.reason, name, state,
                                       by_itself=itself, run=x.run), node, now)  # fmt: skip
            if r is not None:
                if x.reason != "launch_failed":
                    r.started.setdefault(node, a.PartStarted(job_id=x.job_id, run=x.run))
                r.exits[node] = x
                self._maybe_exited(r, now)

    def _end_stopped(self, x: Exit, node: str | None, now: float) -> None:
        """A stopped run's part on `node` is gone: the run's end (its first part's, at its last
        part's end) is recorded once no other node may still run a part of it (`Fence`), so
        its GPUs are never freed while a part's processes live on. Before, the first part's
        end was the run's: a gang part that had exited 0 leaving processes was still in its
        grace on one node when the next gang was placed there (atk53-23 F2)."""
        key = (x.job_id, x.engine_job_id)
        first, gone = self._ending.pop(key, (None, set()))
        if first is not None:
            x = dataclasses.replace(first, at=max(first.at, x.at))
        if node is not None:
            gone.add(node)
        if set(self.fence.blocking(x.job_id, now)) - gone:
            self._ending[key] = (x, gone)
            return
        self._stopped.append(self._began.take(x))
        if x.by_itself:  # its exit may end the job (`runs.ended_meanwhile`): the ledger
            self._completed.add(x.job_id)  # says first (no next launch meanwhile)

    def _heard_running(
        self, node: str, version: str, running: tuple[a.PartRun, ...], now: float
    ) -> None:
        """What an agent has on its node: the stopped runs it no longer has let their jobs run
        again (`Fence.reported`)."""
        current = {j: r.run for j, r in self._runs.items()}
        current |= {j: job.run for j, (job, _) in self._held.items()}
        self.fence.reported(node, version, ((p.job_id, p.run) for p in running), current)
        self._never_launched(node, {(p.job_id, p.run) for p in running}, now)
        self._release(now)

    def _never_launched(self, node: str, running: set[tuple[int, int]], now: float) -> None:
        """The runs the ledger stopped while placed (`StoppedRun.placed`) that `node`'s agent
        does not have, nothing of ours may still hand it (not on a list, no `Fence` blocker of
        the run on any of its nodes: each reported it gone, or was never handed it) and no end
        of which is said yet: they end now, for the record. A launch the agent did run it
        reports itself (its stop's end, with its exit); one it never had would otherwise keep
        its GPUs `stopping` for a day (s52, atk51-23 F3)."""
        said = {x.job_id for x in self._stopped}
        for sr in list(self.ledger.state.stopped_runs.values()):
            key = (sr.job_id, sr.run)
            nodes = {sl.node for sl in sr.slots}
            if not sr.placed or node not in nodes or key in running or sr.job_id in said:
                continue
            mine = self._runs.get(sr.job_id)
            held = self._held.get(sr.job_id)
            if (mine is not None and mine.run == sr.run) or (held and held[0].run == sr.run):
                continue  # still ours to hand out or to stop (`carry_out`)
            blockers = self.fence.blockers.get(sr.job_id, {})
            if any(n in blockers and blockers[n].run in (sr.run, ANY_RUN) for n in nodes):
                continue
            note = f"it never started: {node}'s agent reports no such run"
            name = f"{sr.job_id}.{sr.run + 1}"
            self._stopped.append(Exit(sr.job_id, 0, now, "exited", name, "STOPPED", note,
                                      run=sr.run))  # fmt: skip
            said.add(sr.job_id)

    def _silent(self, now: float, nodes: Mapping[str, Node]) -> list[tuple[str, float]]:
        """(node, seconds silent) of nodes the ledger still counts as up whose agent has not
        reached us within `node_lost_after_s`, counted from its last contact or, for a node no
        agent has reached since this server started, from the first look (a node that never
        had an agent must not hold work forever)."""
        if self.counts_lost_from is None:
            self.counts_lost_from = now
        keep = self.keeping()
        if keep is None:
            return []  # a server may keep a lease we do not know of: count none lost yet
        floor = max(self.counts_lost_from, now + keep)
        heard = dict(self.last_seen)  # HTTP threads write it: one copy for this look
        return silent_nodes(heard, self._first_look, nodes, floor, self.node_lost_after_s, now)

    # --- internals -------------------------------------------------------------------------------

    def _mint(self, job_id: int, user: str) -> str:
        """A token scoped to the job (it may report the job's checkpoints, nothing else),
        recorded at the next `flush`."""
        secret = new_token_secret()
        self._tokens.append(
            tokens.issue(SYSTEM, user, secret, name=f"job {job_id}", scope="job", scope_job=job_id)
        )
        return secret

    def _stop(self, job_id: int, now: float) -> None:
        """Take the run off its nodes' lists; the job may run again once each of them says the
        run is gone (or is lost past its fence)."""
        self._held.pop(job_id, None)
        r = self._runs.pop(job_id, None)
        if r is None:
            return
        for p in r.started.values():
            self._began.keep(job_id, r.run, p.started_at)
        for node in r.nodes:
            self._parts.get(node, {}).pop(job_id, None)
            self._publish(node)
        nodes = set(r.nodes)
        if len(nodes) > 1 and any(n not in r.reaping and n not in r.exits for n in nodes):
            self._partly_running.add((job_id, r.run))
        # a part that reported its own end is gone already
        alive = [n for n in dict.fromkeys(r.nodes) if n not in r.exits]
        versions = {n: self.board.number(n) for n in alive}
        gpus: dict[str, tuple[int, ...]] = {}
        for sl in r.slots:
            gpus[sl.node] = (*gpus.get(sl.node, ()), *sl.gpu_indices)
        self.fence.stopped(job_id, r.run, alive, versions, r.grace_s, now, gpus)

    def _add(self, job: Launch, token: str, *, started: bool = False, publish: bool = True) -> None:
        nodes = tuple(sl.node for sl in job.slots)
        self._placed_on(job.job_id, nodes)
        held = self.ledger.state.jobs.get(job.job_id)
        # the service's grace when the run was placed, as every read counts it (atk49-23 F1: a
        # restart with another --grace republished it with the new one)
        service = self.grace_s if held is None else held.service_grace(self.grace_s)
        grace = job_grace(job.grace_s, service)
        r = AgentRun(job.job_id, job.run, nodes, job.slots, start_reported=started, grace_s=grace)
        self._runs[job.job_id] = r
        part = part_for(job, grace, self.addresses.get(nodes[0], ""), token)
        for node in dict.fromkeys(nodes):
            self._parts.setdefault(node, {})[job.job_id] = part
            if publish:
                self._publish(node)
            else:
                self._unpublished.add(node)

    def _order_kills(self, jobs: set[int], now: float) -> None:
        """The stopped runs of `jobs` to SIGKILL now (a second cancel, or their grace from the
        recorded stop has passed: `StoppedRun.kill_due`), on their nodes' lists
        (`Assignment.kill`): each node's agent kills them at once."""
        kills = kills_by_node(self.ledger.state.stopped_runs, jobs, now, self.grace_s)
        self._unpublished |= self.board.order_all_kills(kills)

    def _publish(self, node: str, *, bump: bool = True) -> None:
        parts = tuple(p for _, p in sorted(self._parts.get(node, {}).items()))
        if bump or self.board.current(node)[1] != parts:
            self.board.publish(node, parts)

    RAN_ON_KEPT = 200_000
    """Jobs whose nodes `_ran_on` keeps (the oldest go first; the log still answers)."""

    def _placed_on(self, job_id: int, nodes: Iterable[str]) -> None:
        self._ran_on.setdefault(job_id, set()).update(nodes)
        while len(self._ran_on) > self.RAN_ON_KEPT:
            del self._ran_on[next(iter(self._ran_on))]

    def foreign(self, rep: a.Report, ever: Callable[[int, str], bool]) -> list[int]:
        """The jobs `rep` tells about (started, exited, sampled, checkpointed, stopped) of which
        no run was ever placed on its node: a node's token reports only about its own runs
        (docs/security.md, row T12). What this server placed, adopted or fences is known here;
        anything else is asked of the log's placements (`ever(job, node)`: a genuine agent's
        late word about a run placed before a restart is never foreign)."""
        out = []
        for job_id in sorted(reported_jobs(rep)):
            if rep.node in self._ran_on.get(job_id, ()) or rep.node in self.fence.blockers.get(
                job_id, {}
            ):
                continue
            job = self.ledger.state.jobs.get(job_id)
            if job is not None and any(sl.node == rep.node for sl in job.slots):
                continue
            if ever(job_id, rep.node):
                self._placed_on(job_id, (rep.node,))
                continue
            out.append(job_id)
        return out

    def _run_of(self, job_id: int, run: int, node: str) -> AgentRun | None:
        """The run a report is about, if it is the current one and has a part on `node`."""
        r = self._runs.get(job_id)
        if r is None or r.run != run or node not in r.nodes:
            return None
        return r

    def _maybe_started(self, r: AgentRun) -> None:
        start = run_started(r, lambda: self._named_output(r))
        if start is not None:
            self._starts.append(start)

    def _named_output(self, r: AgentRun) -> str:
        """The output file the job's submission names (its pattern written out, as its launch
        had it), "" when it names none (the agent's default, which only the agent knows)."""
        job = self.ledger.state.jobs.get(r.job_id)
        return "" if job is None else output_files(job.spec, r.slots)[0]

    def _maybe_exited(self, r: AgentRun, now: float) -> None:
        got = run_ended(r, now, lambda: self._named_output(r))
        if got is not None:
            start, end = got
            if start is not None:
                self._starts.append(start)
            self._exits.append(end)
