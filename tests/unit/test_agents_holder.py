"""One agent per node (`AgentExecutor.holds`/`take`): another agent is refused while a run the
holder launched may be alive (its lease plus the largest grace of the node's runs, and while
the ledger still has runs there), and the holder is recorded, so a restarted server refuses
the other agent too (atk38-23 F4, F5)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ledger.core.evolve import evolve
from ledger.core.state import Job, Node, State
from ledger.engines.agents import AgentExecutor
from schemas import agent as a
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidTransition

LOST, FENCE, GRACE = 10.0, 20.0, 1.0


class FakeLedger:
    """The executor's view of the ledger: its state, and the commands it records (folded)."""

    def __init__(self) -> None:
        self.state = State()
        self.state.nodes["n1"] = Node(name="n1", cluster="c", gpu_type="t", gpus=2)
        self.recorded: list[Any] = []

    def execute(self, cmd: Any) -> None:
        assert isinstance(cmd, c.RecordNodeAgent)
        self.recorded.append(cmd)
        evolve(self.state, e.NodeAgentChanged(event_id="x", at=0.0, actor=cmd.actor,
                                              node=cmd.node, agent=cmd.agent))  # fmt: skip


def executor(ledger: FakeLedger) -> AgentExecutor:
    return AgentExecutor(ledger, node_lost_after_s=LOST, node_fence_s=FENCE, grace_s=GRACE)


def ask(ex: AgentExecutor, agent: str, now: float) -> None:
    """A request of `agent` for n1, as the API makes it."""
    if not ex.holds("n1", agent, now):
        ex.take("n1", agent, now)


def test_the_first_agent_takes_the_node_and_is_recorded_once() -> None:
    led = FakeLedger()
    ex = executor(led)
    ask(ex, "a", 100.0)
    ask(ex, "a", 105.0)
    assert [r.agent for r in led.recorded] == ["a"]
    assert led.state.nodes["n1"].agent == "a"


def test_another_agent_is_refused_until_the_holders_lease_and_grace_have_passed() -> None:
    led = FakeLedger()
    ex = executor(led)
    ask(ex, "a", 100.0)
    with pytest.raises(InvalidTransition, match="held by another agent"):
        ask(ex, "b", 100.0 + LOST + FENCE + GRACE - 0.1)
    ask(ex, "b", 100.0 + LOST + FENCE + GRACE)
    assert led.state.nodes["n1"].agent == "b"


def test_the_hold_lasts_the_largest_grace_of_the_nodes_runs_and_while_the_ledger_has_runs() -> None:
    led = FakeLedger()
    ex = executor(led)
    ask(ex, "a", 100.0)
    spec = msgspec.json.decode(
        b'{"type":"job.submitted.v2","event_id":"s","at":0,"actor":"u","job_id":7,'
        b'"account":"p","user":"u","gpus":2,"grace_s":30,"min_runtime_s":3600}',
        type=e.AnyEvent,
    )
    assert isinstance(spec, e.JobSubmitted)
    led.state.jobs[7] = Job(spec=spec, status="running")
    led.state.node_jobs["n1"] = {7}
    with pytest.raises(InvalidTransition, match=r"its runs \(job\(s\) 7\) may be alive"):
        ask(ex, "b", 100.0 + LOST + FENCE + 29.0)  # within the job's own grace
    with pytest.raises(InvalidTransition, match=r"job\(s\) 7"):
        ask(ex, "b", 10_000.0)  # the run is not ended by the node-lost rules yet
    led.state.node_jobs["n1"] = set()  # the node lost, its fence passed: the run ended
    ask(ex, "b", 10_000.0)


def test_a_restarted_server_knows_the_holder_and_counts_it_heard_from_its_start() -> None:
    led = FakeLedger()
    ask(executor(led), "a", 100.0)
    ex = executor(led)  # the server restarted: nothing in memory
    ex.adopt({}, 500.0)
    with pytest.raises(InvalidTransition, match="held by another agent"):
        ask(ex, "b", 500.0 + LOST + FENCE)
    ask(ex, "a", 510.0)  # the holder itself: no new record
    ask(ex, "b", 510.0 + LOST + FENCE + GRACE)
    assert [r.agent for r in led.recorded] == ["a", "b"]


def test_a_request_naming_no_agent_is_never_the_holders() -> None:
    """atk39-23 F8: "" (no header) was taken for the holder; the API now refuses such a
    request (400) before asking, and "" is not the holder either."""
    led = FakeLedger()
    ex = executor(led)
    ask(ex, "a", 100.0)
    assert not ex.holds("n1", "", 101.0)
    assert [r.agent for r in led.recorded] == ["a"]


def test_a_running_job_put_back_on_its_nodes_list_after_a_restart_has_its_whole_world() -> None:
    """atk38-23 F8: `adopt` put a running job back with its command only: a node that had to
    launch it again ran it without its directory, environment, output file, umask or token."""
    led = FakeLedger()
    tokens: list[Any] = []
    led.execute_all = tokens.extend  # type: ignore[attr-defined]
    spec = msgspec.json.decode(
        b'{"type":"job.submitted.v2","event_id":"s","at":0,"actor":"u","job_id":7,'
        b'"account":"p","user":"u","gpus":2,"min_runtime_s":3600,"command":["python","t.py"],'
        b'"workdir":"/home/u/proj","env":{"MY_VAR":"x"},"stdout":"out-%j.log","umask":18}',
        type=e.AnyEvent,
    )
    assert isinstance(spec, e.JobSubmitted)
    slot = e.GpuSlot(node="n1", gpu_indices=(0, 1))
    led.state.jobs[7] = Job(spec=spec, status="running", slots=(slot,))
    ex = executor(led)
    assert ex.adopt({7: 0}, 100.0) == {7}
    [part] = ex.board.current("n1")[1]
    assert (part.workdir, dict(part.env), part.umask) == ("/home/u/proj", {"MY_VAR": "x"}, 18)
    assert part.stdout == "/home/u/proj/out-7.log" and part.command == ("python", "t.py")
    assert part.job_token and [t.scope_job for t in tokens] == [7]


@pytest.mark.parametrize("actor", ["alice", "@node:n1", "@job:1"])
def test_only_the_executor_or_an_admin_records_a_nodes_agent(actor: str) -> None:
    """The holder decides which agent is refused: a user, a node's own token or a job's may not
    record it through the API (`node.agent`, the route the API matrix now lists too)."""
    from ledger.core.authz import authorise
    from schemas.errors import NotAuthorised

    state = FakeLedger().state
    with pytest.raises(NotAuthorised):
        authorise(state, c.RecordNodeAgent(actor=actor, node="n1", agent="a" * 64))
    authorise(state, c.RecordNodeAgent(actor="@executor", node="n1", agent="a" * 64))


def _rebooting() -> tuple[AgentExecutor, FakeLedger]:
    """n1 runs job 7 (run 0, adopted after a restart), held by agent "a"."""
    led = FakeLedger()
    led.execute_all = lambda cmds: None  # type: ignore[attr-defined]
    spec = msgspec.json.decode(
        b'{"type":"job.submitted.v2","event_id":"s","at":0,"actor":"u","job_id":7,'
        b'"account":"p","user":"u","gpus":2,"min_runtime_s":3600,"resumable":true}',
        type=e.AnyEvent,
    )
    assert isinstance(spec, e.JobSubmitted)
    led.state.jobs[7] = Job(spec=spec, status="running",
                            slots=(e.GpuSlot(node="n1", gpu_indices=(0, 1)),))  # fmt: skip
    ex = executor(led)
    ask(ex, "a", 100.0)
    assert ex.adopt({7: 0}, 100.0) == {7}
    return ex, led


def test_a_believed_reboot_takes_the_ends_its_agent_recorded_before_it_first() -> None:
    """atk43 F4: the reboot ended every run at once as `node_failure`, before the agent's
    report of the exit its supervisor had recorded (0, before the reboot): a completed job was
    recorded failed, a resumable one requeued and run again. The report its first request
    carries is now taken first: the run ends as it did."""
    ex, _ = _rebooting()
    first = a.Report(node="n1", exited=(a.PartExited(job_id=7, run=0, exit_code=0,
                                                     ended_at=150.0),))  # fmt: skip
    assert ex.take("n1", "b", 200.0, rebooted=("a", 10.0), first=first)
    [end] = ex.observe(200.0, {}).exits
    assert (end.job_id, end.exit_code, end.reason, end.at) == (7, 0, "exited", 150.0)
    assert ex.fence.blocking(7, 200.0) == []  # its own end: nothing of it left there


def test_a_run_a_believed_reboot_ends_runs_elsewhere_only_once_its_agent_says_it_is_gone() -> None:
    """atk43 F2: the reboot dropped every stopped run of the node from the fence: the job was
    placed elsewhere while its agent still had it alive (run twice, 30 s). Now the run ended by
    the reboot blocks its job (and holds its GPUs) until the agent reports, as of the list
    without it, that it has none of it."""
    ex, _ = _rebooting()
    assert ex.take("n1", "b", 200.0, rebooted=("a", 10.0))
    [end] = ex.observe(200.0, {}).exits
    assert (end.job_id, end.exit_code, end.reason) == (7, -1, "node_failure")
    assert ex.fence.blocking(7, 200.0) == ["n1"] and ex.fence.holding(200.0) == {"n1": {0, 1}}
    version = ex.board.version("n1")
    alive = a.Report(node="n1", version=version, running=(a.PartRun(job_id=7, run=0),))
    ex.receive(alive, 201.0)
    assert ex.fence.blocking(7, 201.0) == ["n1"]  # still alive there: not elsewhere yet
    ex.receive(a.Report(node="n1", version=version, running=()), 202.0)
    assert ex.fence.blocking(7, 202.0) == []
