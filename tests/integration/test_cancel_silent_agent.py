"""atk52-23 F6 from outside, with a real `gpuledger serve --executor agents` and real agents: the
second `cancel` of a job whose run is stopping while its node's agent is down (kill -9) said
"killed now", though nothing could kill it until the agent was back. It now says when the
agent was last heard from (the node view's `heard_from`, the executor's own clock of it) and
that the SIGKILL is sent once the agent is back; it is, then."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ledger.cli.submit import SILENT_S
from tests.integration.agentkit import (
    Cluster,
    alive,
    cluster,
    template,
    wait_for,
    with_flags,
)

__all__ = ["cluster", "template"]  # the fixtures


def _heard_from(c: Cluster, node: str) -> float | None:
    rows = json.loads(c.cli("node", "list", "--json").stdout)
    got: float | None = next(r for r in rows if r["node"] == node)["heard_from"]
    return got


@with_flags(serve=("--node-lost-after", "120s"))
def test_a_second_cancel_while_the_nodes_agent_is_down_says_the_kill_waits_for_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    termed = tmp_path / "termed"
    job = c.submit(1, f"echo $$; trap 'touch {termed}' TERM; while :; do sleep 0.1; done",
                   "--grace", "120s")  # fmt: skip
    row = c.wait_status(job, "running")
    node, log = row["logs"][0].split(":", 1)
    pid = int(wait_for("its pid", lambda: Path(log).read_text().split(), 30, c.why)[0])
    heard = _heard_from(c, node)
    assert heard is not None and time.time() - heard < SILENT_S, heard  # it beats
    c.cli("cancel", str(job))
    wait_for("its SIGTERM", termed.exists, 30, c.why)
    c.agents[node].kill()  # kill -9: its job's supervisor keeps the run
    down = time.time()
    wait_for("the node silent", lambda: time.time() - (_heard_from(c, node) or 0) > SILENT_S + 1,
             60, c.why)  # fmt: skip
    last = _heard_from(c, node)
    assert last is not None and last <= down + 0.5, (last, down)
    out = c.cli("cancel", str(job)).stdout
    assert "killed now" not in out, out  # the old code's promise
    assert f"{node}'s agent has not been heard from since" in out, out
    assert "sent when the agent is back" in out, out
    time.sleep(2)
    assert alive(pid), "killed with its agent down?"
    assert c.job(job)["status"] == "stopping"
    c.agents[node].start()  # back: the owed SIGKILL, not the rest of its 120 s grace
    t0 = time.monotonic()
    wait_for("its end", lambda: [e for e in c.events("job.run_ended.v2") if e["job_id"] == job],
             60, c.why)  # fmt: skip
    assert time.monotonic() - t0 < 45
    assert not alive(pid)
    (ended,) = [e for e in c.events("job.run_ended.v2") if e["job_id"] == job]
    assert ended["killed"] or ended["exit_code"] in (-9, 137), ended
