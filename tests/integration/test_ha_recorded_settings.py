"""The settings every server of a store runs alike (lease, node-lost timeout, fence, executor,
policy) are recorded in the store and checked at every take of the lease, not only at a
server's start against a live lease (attack atk38-28 F1, F1b, F3): real PostgreSQL, real
servers, a real agent and a real job (with a child), checked from the job's side.

- Two servers with other settings never lead by turns: one started while the leader was frozen
  past its lease is refused at its start, and once one server has recorded new settings
  (`--new-settings`) a server with the old ones takes no lease and says why (log, health,
  `status`). Before, both ran, and a failover to the shorter fence ran a job twice (or to
  `--executor none` left the agents' jobs to die).
- A new, shorter fence waits out the node leases the old one granted: a node out of contact
  while the servers were restarted with the new fence has its job released only once its
  lease (by the old fence) has ended (the job ran in two launches for 21-42 s)."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from ledger.store import lease
from ledger.wire.client import Client
from schemas import commands as c
from schemas.errors import LedgerError
from tests.integration import waits
from tests.integration.hakit import make_group
from tests.integration.pgoutkit import JOB
from tests.integration.pgoutkit import alive as _alive
from tests.integration.serverkit import cli, init_on_store, make_token
from tests.integration.test_ha_settings import one_line, serve
from tests.integration.test_node_agents import Agent


def test_a_lease_with_other_settings_than_the_recorded_ones_is_never_taken(pg_store: str) -> None:
    lease.setup(pg_store)
    long = lease.Lease(pg_store, "long", "http://long", 2.0, (3.0, 60.0), '{"executor":"agents"}')
    short = lease.Lease(pg_store, "short", "http://short", 2.0, (3.0, 4.0), '{"executor":"agents"}')
    none = lease.Lease(pg_store, "none", "http://none", 2.0, (3.0, 60.0), '{"executor":"none"}')
    try:
        # started together on a new store: both agreed (nothing recorded, nobody led)
        assert long.acquire()
        long.release()
        # the lease is free, and neither may take it: their settings are not the recorded ones
        assert not short.acquire() and not none.acquire()
        why = short.refusal(short.leader())
        assert why is not None and "--node-fence 60s" in why and "recorded by" in why, why
        why = none.refusal(none.leader())
        assert why is not None and "ran --executor" in why, why
        with pytest.raises(LedgerError, match="--node-fence 60s"):
            lease.agree(pg_store, short.settings)
        # --new-settings: replaces settings recorded before it started, never ones after
        since = lease.agree(pg_store, short.settings, change=True)
        late = lease.Lease(pg_store, "late", "http://late", 2.0, (3.0, 30.0), None, since)
        short.since = since
        assert short.acquire() and short.refusal(short.leader()) is None
        short.release()
        assert not late.acquire() and not long.acquire()  # recorded after `late` started
        late.close()
        # one started to change them gives up once another leads by the recorded ones
        since = lease.agree(pg_store, long.settings, change=True)
        changer = lease.Lease(pg_store, "changer", "http://changer", 2.0, (3.0, 60.0), None, since)
        assert short.acquire()  # the recorded settings' server leads
        assert changer.refusal(changer.leader()) is not None and changer.since is None
        short.release()
        assert not changer.acquire()
        changer.close()
        assert "--node-fence 4s" in str(long.refusal(long.leader()))
    finally:
        for one in (long, short, none):
            one.close()


def _frozen_past_its_lease(m: object, lease_s: float) -> None:
    m.proc.send_signal(signal.SIGSTOP)  # type: ignore[attr-defined]
    time.sleep(lease_s + 1.5)  # its lease ran out: nobody leads


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (("--node-lost-after", "3s", "--node-fence", "20s"),
         ("--node-lost-after", "3s", "--node-fence", "4s"), "--node-fence 4s"),
        (("--executor", "record"), ("--executor", "none"), "ran --executor none"),
    ],
    ids=["fence", "executor"],
)  # fmt: skip
def test_servers_with_other_settings_never_lead_by_turns(
    tmp_path: Path, pg_store: str, old: tuple[str, ...], new: tuple[str, ...], said: str
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    g = make_group(tmp_path, pg_store, 2, *old, home=home)
    s0, s1 = g.members
    frozen = None
    try:
        g.start(s0)
        g.leader()
        _frozen_past_its_lease(s0, 2.0)
        frozen = s0
        # nobody leads, but the store records s0's settings: another server is refused at once
        err = one_line(serve(tmp_path / "other", pg_store, "--lease", g.lease, *new))
        assert "recorded by the last leader" in err or "the store records it" in err, err
        # one started to change them (--new-settings) leads, and records them
        g.args = (*new, "--new-settings")
        g.start(s1)
        s0.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        frozen = None
        assert g.leader() is s1
        s1.kill(signal.SIGTERM)  # a clean stop: the lease is free at once
        # s0, started with the old settings, never takes it, and says why
        until = time.monotonic() + 4 * 2.0
        while time.monotonic() < until:
            h = s0.health() or {}
            assert h.get("role") == "standby", (h, g.why())
            time.sleep(0.2)
        h = s0.health() or {}
        assert said in str(h.get("settings_error")), (h, g.why())
        assert "this server will not lead" in s0.text() and said in s0.text(), g.why()
        out = cli(home, "status", GPULEDGER_URL=s0.url)
        assert "this server will not lead" in out.stdout and said in out.stdout, out.stdout
        # started again with the recorded settings, s1 leads (s0 stands by, naming it)
        g.args = new
        g.start(s1)
        assert g.leader() is s1
    finally:
        if frozen is not None and frozen.proc is not None:
            frozen.proc.send_signal(signal.SIGCONT)
        g.stop()


OLD_LOST_S, OLD_FENCE_S, NEW_FENCE_S = 3, 20, 4
"""A node lease of 3 + 20 - 3 = 20 s under the old settings; the new fence releases a lost
node's job 4 s + 1 s of grace after the node is counted lost, 3 s after its last word."""


def test_a_shorter_fence_waits_out_the_node_leases_granted_by_the_old_one(
    tmp_path: Path, pg_store: str
) -> None:
    home = tmp_path / "server-0"
    init_on_store(home, tmp_path, pg_store, "node-a", 2, "sim")
    cli(home, "node", "add", "node-b", "--gpus", "2", "--gpu-type", "sim", GPULEDGER_USER="root")
    token = make_token(home, "--user", "alice")
    marks = Path(tempfile.mkdtemp(prefix="gpuledger-marks-"))
    marks.chmod(0o1777)  # the job runs as nobody
    common = ("--executor", "agents", "--run-as", "service", "--interval", "0.5s", "--grace", "1s")
    g = make_group(tmp_path, pg_store, 2, *common, "--node-lost-after", f"{OLD_LOST_S}s",
                   "--node-fence", f"{OLD_FENCE_S}s", home=home)  # fmt: skip
    agents = {}
    for node in ("node-a", "node-b"):
        node_token = make_token(home, "--node", node, "--name", node)
        agents[node] = Agent(node, tmp_path / node, node_token, g.urls, tmp_path / f"{node}.log")
    client = Client(g.urls, token, timeout=30)
    job_id = 0
    pids: list[int] = []
    cut = None

    def why() -> str:
        return g.why() + "".join(f"\n--- {n}\n{a.text()[-3000:]}" for n, a in agents.items())

    try:
        s0, s1 = g.members
        g.start(s0)
        g.leader()
        for agent in agents.values():
            agent.start()
        got = client.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=2, min_runtime_s=60,
                                         resumable=True,
                                         command=("sh", "-c", JOB.format(dir=marks))))  # fmt: skip
        job_id = got.events[0].job_id  # type: ignore[union-attr]
        mark = marks / str(job_id)

        def starts() -> list[list[int]]:
            lines = mark.read_text().splitlines() if mark.exists() else []
            return [[int(w) for w in ln.split()[1:3]] for ln in lines if ln.startswith("start")]

        pids = waits.wait_for("the job to start", lambda: starts() or None, 120, why)[0]
        row = next(j for j in client.get("jobs", {"limit": 100}) if j["job_id"] == job_id)
        nodes = row["nodes"] if isinstance(row["nodes"], list) else str(row["nodes"]).split(",")
        cut = agents.get(str(nodes[0]).strip())
        assert cut is not None and cut.proc is not None, (row, why())
        cut.proc.send_signal(signal.SIGSTOP)  # its node is out of contact from now on
        # the documented way to change the fence: stop them all, start with the new one
        s0.kill(signal.SIGTERM)
        g.args = (*common, "--node-lost-after", f"{OLD_LOST_S}s",
                  "--node-fence", f"{NEW_FENCE_S}s", "--new-settings")  # fmt: skip
        g.start(s1)
        again = waits.wait_for("the job to start again", lambda: starts()[1:] or None, 120, why)
        # the first launch's processes had stopped by then (their node lease ran out)
        assert not any(_alive(p) for p in pids), (pids, again, why())
    finally:
        if cut is not None and cut.proc is not None:
            cut.proc.send_signal(signal.SIGCONT)
        if job_id:
            with contextlib.suppress(LedgerError):
                client.execute(c.CancelJob(actor="", job_id=job_id))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        client.close()
        for agent in agents.values():
            if agent.proc is not None and agent.proc.poll() is None:
                agent.kill(signal.SIGKILL)
        g.stop()


def test_new_settings_is_a_flag_that_acts_once(tmp_path: Path, pg_store: str) -> None:
    """`new_settings = true` left in a config file reverted the store's settings at every start
    while nobody led, and then only that server might lead (atk39-28 F3): it is refused in one
    line, and the flag changes nothing when the store records the server's settings already."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    stale = tmp_path / "stale.toml"
    stale.write_text('new_settings = true\nnode_fence = "60s"\n')
    err = one_line(serve(tmp_path / "stale", pg_store, "--config", str(stale)))
    assert "new_settings" in err and "command line only" in err, err
    lease.setup(pg_store)
    mine = lease.Settings(2.0, (3.0, 4.0), '{"executor":"agents"}')
    taker = lease.Lease(pg_store, "a", "http://a", 2.0, (3.0, 4.0), '{"executor":"agents"}')
    try:
        assert taker.acquire()
        taker.release()
        assert lease.agree(pg_store, mine, change=True) is None  # recorded already: nothing
        other = lease.Settings(2.0, (3.0, 60.0), '{"executor":"agents"}')
        assert lease.agree(pg_store, other, change=True) is not None
    finally:
        taker.close()
