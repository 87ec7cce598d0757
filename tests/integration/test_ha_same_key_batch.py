"""Two copies of one keyed write in one group commit (attack atk49 F1): the second copy is
answered with what the first appended, as a copy in a later batch is; it was refused 400 "the
same key twice in one batch" while the first committed (the CLI said the submit failed, exit
1, and the job ran). Real servers on a real PostgreSQL, the real CLI.

- Concurrent POSTs of one submit with one key to the leader: every copy is answered the same
  success (the same job), and the log holds one submit per key.
- The CLI through a standby while the leader is frozen within its lease: the standby's forward
  and the CLI's own retry at the leader (after its 10 s for the standby) wait in the frozen
  leader's sockets and are batched together when it wakes; the CLI says "submitted", once."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

from ledger.wire.client import LIST_TIMEOUT_S
from tests.integration.hakit import alices_ledger, log_events, make_group
from tests.integration.serverkit import GPULEDGER, env_for

ROUNDS, COPIES = 8, 4
"""The attack saw 5 of 6 rounds of 4 copies batched together (at least two in one batch)."""


def _post(port: int, token: str, key: str, body: bytes, out: list[tuple[int, str]]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/commands/submit", body=body, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
        "Idempotency-Key": key})  # fmt: skip
    resp = conn.getresponse()
    out.append((resp.status, resp.read().decode()))
    conn.close()


def test_copies_of_one_key_sent_at_once_are_all_answered_with_the_first_ones_success(
    tmp_path: Path, pg_store: str
) -> None:
    home, token = alices_ledger(tmp_path, pg_store)
    g = make_group(tmp_path, pg_store, 1, "--interval", "0.5s", home=home)
    body = json.dumps({"actor": "", "account": "ai2/olmo", "gpus": 1,
                       "min_runtime_s": 3600}).encode()  # fmt: skip
    rounds: list[list[tuple[int, str]]] = []
    try:
        leader = g.start(g.members[0])
        g.leader()
        for r in range(ROUNDS):
            answers: list[tuple[int, str]] = []
            threads = [
                threading.Thread(target=_post, args=(leader.port, token, f"k-{r}", body, answers))
                for _ in range(COPIES)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(90)
            rounds.append(answers)
        g.stop()
        events = log_events(home)
    finally:
        g.stop()
    for answers in rounds:
        assert len(answers) == COPIES and {s for s, _ in answers} <= {200, 201}, answers
        jobs = {json.loads(a)["events"][0]["job_id"] for _, a in answers}
        assert len(jobs) == 1, answers
    submitted = [e for e in events if e["type"] == "job.submitted.v2"]
    assert len(submitted) == ROUNDS, submitted


def test_the_clis_retry_at_a_frozen_leader_batched_with_the_standbys_forward_says_submitted(
    tmp_path: Path, pg_store: str
) -> None:
    home, token = alices_ledger(tmp_path, pg_store)
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    g.lease = "40s"  # frozen for 2 x the CLI's 10 s, it keeps its lease: the standby forwards
    frozen = None
    try:
        for m in g.members:
            g.start(m)
        leader = g.leader()
        standby = next(m for m in g.members if m is not leader)
        assert leader.proc is not None
        leader.proc.send_signal(signal.SIGSTOP)
        frozen = leader
        proc = subprocess.Popen(
            [GPULEDGER, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h"],
            env=env_for(Path("/nonexistent"), GPULEDGER_URL=f"{standby.url},{leader.url}",
                        GPULEDGER_TOKEN=token),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        time.sleep(2 * LIST_TIMEOUT_S + 2)  # both copies now wait on the frozen leader
        leader.proc.send_signal(signal.SIGCONT)
        frozen = None
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.startswith("submitted job 1 "), (out, g.why())
        g.stop()
        events = log_events(home)
    finally:
        if frozen is not None and frozen.proc is not None:
            frozen.proc.send_signal(signal.SIGCONT)
        g.stop()
    assert len([e for e in events if e["type"] == "job.submitted.v2"]) == 1
