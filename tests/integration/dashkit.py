"""A ledger holding a simulated history that ends shortly before now, plus live work on top of
it (pending jobs with commands, a drained node, a lost one), for the dashboard and metrics
tests."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from ledger.sim.runner import Cluster, SimConfig, simulate
from ledger.sim.workload import Synthetic, synthetic
from ledger.store.application import Ledger
from tests.integration.serverkit import Server, cli

NODES = 6
SECRET = "--secret-flag-of-team-b"


@dataclass
class Dashboard:
    home: Path
    user_a: str
    """A plain member of `project_a`."""
    project_a: str
    user_b: str
    project_b: str
    job_b: int
    """A job of `user_b` whose command holds SECRET."""


def build(home: Path, *, days: float = 3.0, seed: int = 3, load: float = 1.0) -> Dashboard:
    """Simulate `days` ending half a day ago, then submit live work as real users."""
    now = math.floor(time.time())
    work = synthetic(
        Synthetic(
            seed=seed, programs=2, teams=4, users=12, days=days, capacity_gpus=NODES * 8, load=load
        )
    )
    config = SimConfig(
        cluster=Cluster(nodes=NODES), days=days, seed=seed, start_at=now - (days + 0.5) * 86400
    )
    simulate(work, config, home)
    ledger = Ledger(home)
    try:
        members = {p: sorted(us) for p, us in ledger.state.members.items() if us}
    finally:
        ledger.close()
    (project_a, users_a), (project_b, users_b) = sorted(members.items())[:2]
    user_a, user_b = users_a[0], users_b[0]
    cli(home, "node", "drain", f"n{NODES:03d}", "--reason", "maintenance", GPULEDGER_USER="root")
    cli(home, "node", "lost", f"n{NODES - 1:03d}", "--reason", "power", GPULEDGER_USER="root")
    job_b = 0
    for i in range(8):  # more than the active nodes hold: some stay pending
        user, project = (user_b, project_b) if i % 2 else (user_a, project_a)
        out = cli(
            home, "submit", "-A", project, "-G", "8", "--min-runtime", "1h", "--json",
            "--", "python", "train.py", f"--run={i}", *([SECRET] if user == user_b else []),
            GPULEDGER_USER=user,
        )  # fmt: skip
        if user == user_b:
            job_b = int(_job_id(out.stdout))
    return Dashboard(home, user_a, project_a, user_b, project_b, job_b)


def with_pending(
    home: Path, *, days: float, pending: int, at: float, seed: int = 3, load: float = 2.0
) -> tuple[Dashboard, list[tuple[str, str]], int]:
    """A busy history (`build`) and then `pending` submissions of its members at `at`: the
    scale tests' and the scale benchmarks' homes. (dashboard, members, first pending job id)."""
    from projections.testing.synthetic import append_to_store, pending_submissions

    dash = build(home, days=days, seed=seed, load=load)
    ledger = Ledger(home)
    try:
        members = sorted((p, u) for p, us in ledger.state.members.items() for u in us)
        first = ledger.state.next_job_id
    finally:
        ledger.close()
    append_to_store(home, pending_submissions(pending, members, first_job_id=first, at=at))
    return dash, members, first


def _job_id(text: str) -> int:
    import json

    body = json.loads(text)
    if isinstance(body, dict) and "job_id" in body:
        return int(body["job_id"])
    for ev in body.get("events", []) if isinstance(body, dict) else body:
        if ev.get("type") == "job.submitted.v2":
            return int(ev["job_id"])
    raise AssertionError(f"no job id in {text!r}")


def cycled(server: Server, cycles: int, within_s: float) -> None:
    """Wait until `server` has run `cycles` dispatcher cycles (its log in the failure)."""
    deadline = time.monotonic() + within_s
    while server.request("GET", "/v1/health")[1]["cycles"] < cycles:
        assert time.monotonic() < deadline, server.log_path.read_text()
        time.sleep(0.1)


Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]
"""A scrape: metric name -> its samples by their sorted labels."""


def scrape(server: Server, token: str) -> Samples:
    """Every sample of the server's /metrics, read as `token`."""
    from prometheus_client.parser import text_string_to_metric_families

    text = server.read("/metrics", token)  # a 429 (a minute's reads: a deep queue's) waited out
    raw = text.decode() if isinstance(text, bytes) else str(text)
    out: Samples = {}
    for fam in text_string_to_metric_families(raw):
        for x in fam.samples:
            out.setdefault(x.name, {})[tuple(sorted(x.labels.items()))] = x.value
    return out
