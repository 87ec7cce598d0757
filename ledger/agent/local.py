"""The local node agents of `gpuledger up --executor agents`: one machine, one command. An edge.

`up` then runs the server (`ledger.server.run.serve` with `executor = "agents"`, on the data
directory's Unix socket) and, in the same process, one node agent for each node of the ledger
(every node is a name for this host, as with `up`'s local executor; the usual single node gives
one agent). Each agent is the cluster's `NodeAgent`, talking to the server over HTTP on that
socket with the node's own token, so a laptop runs exactly what a cluster runs:

    <home>/agents/<node>/token        the node token up made for its agent (0600; made once, by
                                      the admin who runs `up`, and reused while it is valid)
    <home>/agents/<node>/             the agent's state directory (state file, run directories,
                                      lock; see `ledger.engines.supervised`)
    <home>/jobs/job-<id>.log          job output, as with the local executor

Stopping `up` (Ctrl-C, SIGTERM, kill -9) stops its agents with it; the jobs keep running under
their supervisors, and the next `up` adopts them (its agents re-attach before taking work).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from ledger.agent.node import LEASE_FILE, STATUS_FILE, NodeAgent, Settings
from ledger.core import tokens
from ledger.engines.gpu_util import UtilSource
from ledger.engines.supervised import SupervisedExecutor
from ledger.store.application import Ledger
from ledger.store.clock import new_token_secret

log = logging.getLogger("gpuledger.up")

AGENTS_DIR = "agents"


@dataclass(frozen=True)
class LocalSettings:
    """What `up` hands its agents (the flags of `up` that concern running jobs)."""

    grace_s: float
    run_as: str
    debug_limit_s: float
    sample_every_s: float
    util: UtilSource
    check_every_s: float = 0.1
    heartbeat_s: float = 1.0


def state_dir(home: Path, node: str) -> Path:
    return home / AGENTS_DIR / node


def node_token(ledger: Ledger, node: str, actor: str, now: float) -> str:
    """The secret of the node token of `node`'s local agent: the one kept in its state directory
    while the ledger still honours it, otherwise a new one (recorded by `actor`, an admin)."""
    path = state_dir(ledger.home, node) / "token"
    with contextlib.suppress(FileNotFoundError, ValueError):
        secret = path.read_text().strip()
        token = tokens.valid(ledger.state, secret, now)
        if token is not None and token.scope_node == node:
            return secret
    secret = new_token_secret()
    ledger.execute(
        tokens.issue(
            actor, actor, secret, name=f"local agent of {node}", scope="node", scope_node=node
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


class LocalAgents:
    """The node agents of `up`, one thread each in this process (see the module doc)."""

    def __init__(
        self,
        home: Path,
        nodes: dict[str, tuple[int, str]],
        tokens: dict[str, str],
        s: LocalSettings,
    ) -> None:
        self.home = home
        self.nodes = nodes
        """Node -> (GPUs, GPU type), as the ledger has them."""
        self.tokens = tokens
        self.s = s
        self.agents: list[tuple[NodeAgent, SupervisedExecutor, threading.Thread]] = []
        self.socket = ""

    def start(self, url: str, socket: str) -> None:
        """One agent per node, each adopting its jobs before it takes work (`NodeAgent.run`);
        `url` is the server's URL for the agents, `socket` its Unix socket (the jobs' way in)."""
        self.socket = socket
        for node, (gpus, gpu_type) in sorted(self.nodes.items()):
            state = state_dir(self.home, node)
            executor = SupervisedExecutor(
                state,
                self.home / "jobs",
                grace_s=self.s.grace_s,
                run_as="service" if self.s.run_as == "service" else "submitter",
                debug_limit_s=self.s.debug_limit_s,
                util=self.s.util,
                sample_every_s=self.s.sample_every_s,
                # `gpuledger checkpoint` inside a job reaches this server on its socket, as
                # the job (its token)
                extra_env={
                    "GPULEDGER_HOME": str(self.home.resolve()),
                    "GPULEDGER_URL": f"unix:{self.socket}",
                },
                local_node=node,
                lease=state / LEASE_FILE,
            )
            if executor.adopted:
                log.info("node %s: adopted %d job(s): %s", node, len(executor.adopted),
                         ", ".join(str(h.job_id) for h in executor.adopted))  # fmt: skip
            settings = Settings(
                node=node, url=url, token=self.tokens[node], gpus=gpus, gpu_type=gpu_type,
                gpu_source="ledger", address="127.0.0.1", heartbeat_s=self.s.heartbeat_s,
                poll_wait_s=20.0, check_every_s=self.s.check_every_s,
            )  # fmt: skip
            agent = NodeAgent(settings, executor, state / STATUS_FILE, self.s.util)
            thread = threading.Thread(target=_run, args=(agent,), name=f"agent-{node}", daemon=True)
            thread.start()
            self.agents.append((agent, executor, thread))
        log.info("utilisation: %s", self.s.util.name)

    def stop(self) -> None:
        """Stop the agents; their jobs keep running (the next `up` adopts them)."""
        for agent, _, _ in self.agents:
            agent.stop_event.set()
            agent.wake.set()
            agent.report_wake.set()
        running = 0
        for _agent, executor, thread in self.agents:
            thread.join(timeout=30)
            running += len(executor.running())
            executor.close()
        self.agents.clear()
        if running:
            log.info("stopped: %d job(s) keep running and will be adopted", running)


def _run(agent: NodeAgent) -> None:
    try:
        agent.run()
    except Exception:  # an agent that dies says why; `up` keeps its other parts running
        log.exception("the local agent of node %s stopped", agent.s.node)
