"""A node agent's report never says a run is gone without its end (atk55-23 F1).

The reporter thread read what runs here (`SupervisedExecutor.handled`) while the main loop's
watch had dropped an ended run from it but not yet put its end in the outbox: the server heard
the node no longer had the stopped run, let the job's next placement launch (its `Fence`), and
only with the next report learnt that the run had completed by itself: the completed job's
command ran a second time on another node. The race is forced here: the reporter sends in the
middle of the executor's observation."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from ledger.agent import node
from ledger.cycle.executor import Exit, Observed
from schemas import agent as a
from schemas.errors import Unavailable


class Executor:
    """Job 98's run 1 (launch 1) ends, by itself, during `observe`; the reporter sends then."""

    def __init__(self, during: Any) -> None:
        self.jobs = {98: 1}
        self.during = during

    def handled(self) -> dict[int, int]:
        return dict(self.jobs)

    def observe(self, now: float, nodes: Any) -> Observed:
        del self.jobs[98]  # gone from what runs here, as `SupervisedExecutor._poll` does
        self.during()  # the reporter thread runs now
        end = Exit(98, 0, now, "exited", "98.1", "STOPPED", by_itself=True, run=0)
        return Observed(stopped=(end,))


def agent(ex: Any, sent: list[a.Report], posted: threading.Event) -> Any:
    ag: Any = object.__new__(node.NodeAgent)

    def call(method: str, path: str, body: a.Report, kind: Any) -> Any:
        sent.append(body)
        posted.set()
        raise Unavailable("not taken")  # kept in the outbox: nothing else of `_send` matters

    ag.ex = ex
    ag.s = SimpleNamespace(node="n3")
    ag.outbox = node.Outbox()
    ag.finished = set()
    ag.applied = "v1"
    ag._out_lock = threading.Lock()
    ag._draining = False
    ag._no_reaping = False
    ag._error = lambda err: None
    ag._client_for_test = SimpleNamespace(call=call)
    return ag


def test_a_report_sent_while_a_run_ends_says_it_gone_only_with_its_end() -> None:
    sent: list[a.Report] = []
    posted = threading.Event()
    threads: list[threading.Thread] = []

    def reporter_now() -> None:
        t = threading.Thread(target=lambda: node.NodeAgent._send(ag, ag._client_for_test))
        threads.append(t)
        t.start()
        posted.wait(0.5)  # before the fix it sent at once; after, it waits for the watch

    ag = agent(Executor(reporter_now), sent, posted)
    ag._watch(1000.0)
    for t in threads:
        t.join(5)
    node.NodeAgent._send(ag, ag._client_for_test)  # the next report: the outbox again
    for rep in sent:
        running = {(p.job_id, p.run) for p in rep.running}
        ended = {(x.job_id, x.run) for x in rep.exited}
        assert (98, 0) in running or (98, 0) in ended, rep
    assert any((98, 0) in {(x.job_id, x.run) for x in rep.exited} for rep in sent)
