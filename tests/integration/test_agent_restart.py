"""A node agent restarted while one of its runs is an orphan slow to die (atk43 F6): real `serve`
and `agent` processes (the cluster of agentkit.py), real jobs."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.integration.agentkit import (
    Cluster,
    alive,
    all_events,
    cluster,
    held_twice,
    part_log,
    running_pid,
    template,
    until,
    wait_for,
    with_flags,
)

__all__ = ["cluster", "template"]  # the fixtures, shared with agentkit.py

NODE = "node-a"


def node_row(c: Cluster, node: str) -> dict[str, Any]:
    rows = json.loads(c.cli("node", "list", "--json").stdout)
    return next(n for n in rows if n["node"] == node)


@with_flags(serve=("--node-fence", "4s", "--node-lost-after", "10s"))
def test_an_agent_restart_keeps_adopted_jobs_while_an_orphan_is_slow_to_die(
    cluster: Cluster,
) -> None:
    """atk43 F6: a restarted agent stopped the run the ledger cancelled while it was away and
    waited for it to go before it registered, sending nothing meanwhile: an orphan that ignores
    SIGTERM (a long grace, or D state) held it past the node-lost timeout and the fence, so its
    own lease watchdog killed another user's healthy job it had just adopted, recorded
    `node_lost`. It now registers at once and keeps the node's lease while the orphan stops;
    the orphan's GPU stays `stopping`, and a job waits for it (never placed on it) until it is
    gone."""
    c = cluster
    for other in ("node-b", "node-c"):  # every job lands on node-a
        c.cli("node", "drain", other, "--reason", "test")
    go = c.home.parent / "go"
    innocent = c.submit(1, "echo $$; while :; do date +%s; sleep 0.2; done", user="alice")
    orphan = c.submit(1, f"trap '' TERM; {until(go, 0)}", "--grace", "2m")
    (node_i, pid_i), (node_o, pid_o) = running_pid(c, innocent), running_pid(c, orphan)
    assert node_i == node_o == NODE
    (orphan_slot,) = c.job(orphan)["slots"]
    log_i = part_log(c.job(innocent)["logs"][0])
    ag = c.agents[NODE]
    ag.kill()  # an agent restart (an upgrade, a crash)
    c.cli("cancel", str(orphan))  # while the agent is away
    ag.start()
    assert f"stopping job {orphan}" in ag.text()
    # past the node-lost timeout (10 s: the agent's restart itself took over 5 s at load 13)
    # + the fence (4 s) + the grace (1 s), with a margin
    time.sleep(19)
    assert alive(pid_o)  # the orphan still ignores its SIGTERM
    assert alive(pid_i), c.why()  # the adopted job was not fenced
    ticks = log_i.read_text().split()[1:]
    assert time.time() - int(ticks[-1]) < 3  # and it still runs: its own output says so
    assert c.job(innocent)["status"] == "running"
    assert c.events("node.lost.v1") == [] and c.nodes()[NODE] == "active"
    # the orphan's GPU is held while it lives: shown stopping, and a job placed on it waits
    row = node_row(c, NODE)
    assert row["stopping_gpus"] == orphan_slot["gpu_indices"], row
    assert row["free_gpus"] == 0
    probe = f"if kill -0 {pid_o} 2>/dev/null; then echo shared; else echo alone; fi; sleep 600"
    new = c.submit(1, probe)
    time.sleep(3)
    # not placed on it while its old processes live (atk47-23 F8): it waits, and says for what
    assert c.job(new)["status"] == "pending" and alive(pid_o)
    said = c.cli("explain", str(new)).stdout
    assert "stopped runs still in their grace" in said and f"job {orphan}'s SIGKILL" in said, said
    go.touch()  # the orphan ends at last
    wait_for("the orphan to be gone", lambda: not alive(pid_o), 30, c.why)
    j = c.wait_status(new, "running")
    assert j["slots"][0]["gpu_indices"] == orphan_slot["gpu_indices"]
    out = part_log(j["logs"][0])
    assert wait_for("the new job's word", lambda: out.read_text().split(), 30, c.why) == ["alone"]
    wait_for("the orphan's end recorded",
             lambda: [e for e in c.events("job.run_ended.v2") if e["job_id"] == orphan], 30,
             c.why)  # fmt: skip
    assert node_row(c, NODE)["stopping_gpus"] == []
    assert alive(pid_i) and c.job(innocent)["status"] == "running"
    assert held_twice(all_events(c)) == []
