"""A checkpoint a job said just before it ended is reported with its run (s61-red-C).

A job whose start the server had not recorded yet says its checkpoint through its file
(`gpuledger checkpoint`'s fallback); when the job then ended before the agent's next look, that
look saw both the file's change and the end, and the run had already left the executor's runs:
the checkpoint was dropped (test_security_nodes found no job.checkpointed.v1 of a job whose own
`gpuledger checkpoint` had said ok, in a whole run at load)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from ledger.agent import node
from ledger.cycle.executor import Exit, Observed
from schemas import agent as a


class Executor:
    """No run here any more: job 98's run 2 (launch 3) ended in the look being queued."""

    def launch_of(self, job_id: int) -> int | None:
        return None


def agent() -> Any:
    """An agent of node n3 with an empty outbox, whose executor has no run (no process)."""
    ag: Any = object.__new__(node.NodeAgent)
    ag.ex = Executor()
    ag.s = SimpleNamespace(node="n3")
    ag.outbox = node.Outbox()
    ag.finished = set()
    ag._out_lock = threading.Lock()
    ag._no_reaping = False
    return ag


def test_a_checkpoint_seen_with_its_runs_end_is_reported_for_that_run() -> None:
    ag = agent()
    end = Exit(98, 0, 1000.0, "exited", "98.3", "EXITED", run=2)
    node.NodeAgent._queue(ag, Observed(checkpoints=(98,), exits=(end,)))
    assert ag.outbox.checkpoints == [a.PartCheckpoint(job_id=98, run=2)]
    assert [(x.job_id, x.run) for x in ag.outbox.exited] == [(98, 2)]


def test_a_checkpoint_of_a_job_with_no_run_here_is_still_dropped() -> None:
    ag = agent()
    node.NodeAgent._queue(ag, Observed(checkpoints=(98,)))
    assert ag.outbox.checkpoints == []
