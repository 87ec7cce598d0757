"""What submit accepts, every reader of the launch takes (`schemas.bounds`): the agents' poll
answer reads any environment, working directory and output file a submission may make; a part
an agent still cannot read fails alone (atk46-23 F13); a start is recorded whatever its log
paths (atk46-23 F14)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from ledger.core.jobs import DEFAULT_OUTPUT
from ledger.core.state import State
from ledger.cycle.executor import Exit, Observed, Start, launch_of
from ledger.cycle.record import record
from schemas import agent as a
from schemas import commands as c
from schemas.bounds import MAX_ENV_VALUE, MAX_GRACE_S, MAX_PATH, job_grace
from schemas.errors import InvalidCommand
from tests.unit.test_cycle_record import FakeLedger, place
from tests.unit.test_jobs_world import World


@pytest.fixture
def w(org_state: State) -> World:
    return World(org_state)


@pytest.fixture
def ledger(org_state: State, counter_ids: Callable[[], str]) -> FakeLedger:
    """Job 1 (carol, 4 GPUs) placed on n2: its start not recorded yet."""
    led = FakeLedger(org_state, counter_ids)
    led.execute(c.SubmitJob(actor="carol", account="ai2/tulu", gpus=4, min_runtime_s=0))
    place(led, 1, "n2", 4)
    return led


DEEP = "/" + "/".join(["d" * 200] * 20) + "/" + "e" * 64  # 4,085 characters: a legal cwd


def part_of(world: World, job_id: int, **over: Any) -> dict[str, Any]:
    """The builtins of the part the server hands the job's node (`AgentExecutor`'s fields)."""
    job = world.state.jobs[job_id]
    la = launch_of(job_id, job, job.spec.user)
    part = a.Part(
        job_id=job_id, run=0, slots=job.slots, command=la.command or ("true",), user=la.user,
        account=la.account, workdir=la.workdir, env=la.env, stdout=la.stdout, stderr=la.stderr,
        job_name=la.job_name,
    )  # fmt: skip
    return msgspec.to_builtins(part) | over


def answer(*parts: dict[str, Any]) -> bytes:
    body = {"node": "n1", "version": "v1", "parts": list(parts), "server_time": 1.0}
    return msgspec.json.encode(body)


def test_the_longest_environment_and_output_submit_accepts_reach_the_agent(w: World) -> None:
    """A 16,384-character LD_LIBRARY_PATH and the default output under a 4,085-character cwd
    (4,103 characters): both were refused by the agent's schema, killing its poll thread."""
    (job,) = w.submit(env={"LD_LIBRARY_PATH": "x" * MAX_ENV_VALUE}, workdir=DEEP, command=("t",))
    w.place(job.job_id)
    asg, unreadable = a.decode_assignment(answer(part_of(w, job.job_id)))
    assert unreadable == ()
    (part,) = asg.parts
    assert part.env == (("LD_LIBRARY_PATH", "x" * MAX_ENV_VALUE),)
    assert part.stdout == f"{DEEP}/{DEFAULT_OUTPUT.replace('%j', str(job.job_id))}"
    assert len(part.stdout) > 4_096


def test_an_output_pattern_that_would_expand_past_a_path_is_refused_at_submit(w: World) -> None:
    """Thirty `%x` of a 200-character name: 6,000 characters once written out."""
    with pytest.raises(InvalidCommand, match="6,000 characters once written out; at most 4,096"):
        w.submit(job_name="x" * 200, stdout="%x" * 30, workdir="/tmp", command=("t",))
    (ok,) = w.submit(job_name="x" * 200, stdout="/o/" + "%x" * 20, command=("t",))
    assert ok.stdout.count("%x") == 20


def test_a_part_the_agent_cannot_read_fails_alone(w: World) -> None:
    """An answer with one part out of bounds (an older server's, a newer field's): the others
    are read, the bad one is named with its job and run (its launch fails, once)."""
    jobs = [w.submit(command=("t",), workdir="/tmp")[0].job_id for _ in range(2)]
    for i, j in enumerate(jobs):
        w.place(j, "n1", i)
    bad = part_of(w, jobs[0], stdout="/" + "s" * (2 * MAX_PATH + 5), run=3)
    asg, unreadable = a.decode_assignment(answer(bad, part_of(w, jobs[1])))
    assert [p.job_id for p in asg.parts] == [jobs[1]]
    assert [(u.job_id, u.run) for u in unreadable] == [(jobs[0], 3)]
    assert "parts[0].stdout" not in unreadable[0].why and "length <=" in unreadable[0].why


def test_a_start_whose_log_path_fills_a_path_is_recorded_with_its_node(ledger: FakeLedger) -> None:
    """`n2:` + a 4,096-character path: the start was refused (its item over 4,096) and the
    run ran uncharged, `started_at` null."""
    path = "/" + "p" * (MAX_PATH - 1)
    seen = Observed(starts=(Start(1, "1.1", logs=(f"n2:{path}",), started_at=5.0),))
    record(ledger, seen, "agent")
    job = ledger.state.jobs[1]
    assert (job.status, job.logs) == ("running", (f"n2:{path}",)) and job.started_at is not None


def test_a_start_refused_with_its_logs_is_recorded_without_them_and_said(
    ledger: FakeLedger, caplog: pytest.LogCaptureFixture
) -> None:
    seen = Observed(
        starts=(Start(1, "1.1", logs=("n2:/" + "p" * 10_000,), started_at=5.0),),
        exits=(Exit(1, 0, 9.0, "exited", "1.1"),),
    )
    with caplog.at_level(logging.ERROR, logger="ledger.cycle.record"):
        record(ledger, seen, "agent")
    job = ledger.state.jobs[1]
    assert (job.status, job.logs) == ("finished", ()) and job.started_at is not None
    assert "start of job 1 refused with its log paths" in caplog.text


def test_a_jobs_grace_is_capped_at_submit_and_at_its_stop(w: World) -> None:
    """`--grace 1h` let a job outlive its limit (a debug job its debug limit) by an hour
    (atk46-23 F7): submit takes at most MAX_GRACE_S, and a job recorded before the cap gets
    no more at its stop; the service's own default is the admin's, under the same cap."""
    with pytest.raises(InvalidCommand, match="grace_s"):
        w.submit(grace_s=3600, command=("t",))
    (ok,) = w.submit(grace_s=MAX_GRACE_S, command=("t",))
    assert ok.grace_s == MAX_GRACE_S == 120
    assert (job_grace(3600, 30.0), job_grace(5, 30.0), job_grace(None, 100.0)) == (120, 5, 100)
    assert job_grace(None, 600.0) == 120  # the service's too (atk49-23 F6)


def test_explain_says_a_job_past_its_limit_is_stopping(w: World) -> None:
    """A job in its limit's grace was shown plain running, `explain` silent on it (F7)."""
    from ledger.reads.explain import limit_line
    from schemas.units import when

    (job,) = w.submit(time_limit_s=5, grace_s=60, command=("t",))
    w.place(job.job_id)
    w.run(c.StartJob(actor="@executor", job_id=job.job_id))
    running = w.state.jobs[job.job_id]
    start = running.started_at
    assert start is not None and limit_line(running, start + 4, 30.0) == []
    (line,) = limit_line(running, start + 10, 30.0)
    assert f"reached its time limit at {when(start + 5)}: it is stopping" in line
    assert f"SIGKILL at {when(start + 65)} at the latest" in line
