"""A gang's time limit on the node agents when its agents come back at different times
(atk58 F3): real `serve` and `agent` processes (the cluster of agentkit.py), a real
two-node job whose parts note their SIGTERM, their lives read from /proc."""

from __future__ import annotations

import signal
import threading
import time

from tests.integration.agentkit import (
    Cluster,
    alive,
    cluster,
    template,
    wait_for,
    with_flags,
)

__all__ = ["cluster", "template"]  # the fixtures, shared with agentkit.py

LIMIT_S, GRACE_S = 40, 15
BOUND_S = min(GRACE_S, 10)
"""A limit an agent notices late: SIGTERM when it looks, SIGKILL min(grace, 10 s) later."""


def _last_alive(pids: dict[str, int]) -> tuple[dict[str, float], threading.Event]:
    """Each node's part -> the last time it was seen alive (a lower bound of its death under any
    load), kept by a thread reading /proc every 50 ms; the event is set once all are gone."""
    seen = dict.fromkeys(pids, time.time())
    done = threading.Event()

    def watch() -> None:
        while any(alive(p) for p in pids.values()):
            for node, p in pids.items():
                if alive(p):
                    seen[node] = time.time()
            time.sleep(0.05)
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    return seen, done


@with_flags(serve=("--node-lost-after", "300s"))
def test_a_gang_part_whose_agent_came_back_later_keeps_its_own_term_and_bound(
    cluster: Cluster,
) -> None:
    """Both agents of a gang killed -9 after its start; back past its limit and grace, node-a's
    first, node-b's 6 s later: each gives its part its SIGTERM and min(grace, 10 s). node-a's
    part ended first, which ended the run and the job; node-b's part, the ledger no longer
    running it there, was SIGKILLed at once, about 6 s after its SIGTERM, and the job's end
    was recorded before its death. Now the run ends with its last part."""
    c = cluster
    c.cli("node", "drain", "node-c", "--reason", "test")  # the gang spans node-a and node-b
    notes = c.home.parent / "notes"
    notes.mkdir()
    part = (f"trap 'date +%s.%N >> {notes}/term-$GPULEDGER_NODE' TERM;"
            f" echo $$ > {notes}/pid-$GPULEDGER_NODE; while :; do sleep 0.1; done")  # fmt: skip
    gang = c.submit(4, part, "-t", f"{LIMIT_S}s", "--grace", f"{GRACE_S}s")
    started = c.wait_status(gang, "running")["started_at"]
    first, then = "node-a", "node-b"
    files = {n: notes / f"pid-{n}" for n in (first, then)}
    wait_for("both parts' pids", lambda: all(f.exists() and f.read_text().strip()
                                             for f in files.values()), 30, c.why)  # fmt: skip
    pids = {n: int(f.read_text()) for n, f in files.items()}
    seen, done = _last_alive(pids)
    for node in (first, then):
        c.agents[node].kill(signal.SIGKILL)
    # the case under test: both agents gone before the limit (a 10 s one had passed, loaded)
    assert time.time() < started + LIMIT_S, (started, time.time())
    time.sleep(max(0.0, started + LIMIT_S + GRACE_S + 2 - time.time()))
    assert all(alive(p) for p in pids.values()), "a part ended while no agent watched"
    c.agents[first].start()
    time.sleep(6)
    c.agents[then].start()
    assert done.wait(120), (pids, c.why())
    j = c.wait_status(gang, "finished", timeout=60)
    assert j["finish_reason"] == "time_limit", j
    for node in pids:
        term = notes / f"term-{node}"
        assert term.exists(), f"{node}'s part got no SIGTERM"
        termed = float(term.read_text().split()[0])
        # before: node-b's part was SIGKILLed ~6 s after its SIGTERM
        assert seen[node] >= termed + BOUND_S - 0.3, (node, seen[node] - termed, c.why())
    # the job ends with its last part: not before its death (before: node-a's part's end)
    assert j["finished_at"] >= max(seen.values()) - 0.3, (j, seen)
