"""A standby whose link to PostgreSQL goes silent and heals (atk61-ha F1): the bytes sent during
the cut are lost for good (a firewall or NAT that lost the flow's state drops them; TCP would
give up after ~15 min, and a middlebox that acknowledges them never), so its worker's statement
is never answered. The leader is killed meanwhile. Before, once the cut healed the standby took
the lease, handed it over within 1.7 s ("the worker has not taken up the leader's work") and
never led again, its health saying nothing. Now the worker's store connection is abandoned (at
the hand-over, or at the store's statement bound, `ha.statement_bound_s`: 12 s here) and the
survivor leads within `LEADS_WITHIN_S` of the heal."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.integration import waits
from tests.integration.hakit import alices_ledger, make_group
from tests.integration.serverkit import GPULEDGER, env_for
from tests.integration.test_ha import Proxy

LEADS_WITHIN_S = 12.0
"""The bound from the heal: a take (0.5 s), the worker's hand-over (a third of the 5 s lease),
its statement abandoned and the take again, a lease's time to spare for a loaded host."""


def test_a_standby_cut_silently_while_the_leader_dies_leads_once_the_cut_heals(
    tmp_path: Path, pg_store: str
) -> None:
    home, token = alices_ledger(tmp_path, pg_store)
    proxy = Proxy(pg_store)
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    g.lease = "5s"
    leader, standby = g.members
    standby.dsn = proxy.via
    try:
        g.start(leader)
        assert g.leader() is leader
        g.start(standby)
        waits.wait_for("the standby to name the leader", lambda: (standby.health() or {}).get(
            "leader") == leader.url, 30, g.why)  # fmt: skip
        proxy.cut.set()  # the standby's follow (every 0.2 s) is swallowed
        time.sleep(1.0)
        leader.kill()
        time.sleep(7.0)  # the leader's lease has run out; the worker's statement hangs
        proxy.cut.clear()
        healed = time.monotonic()
        waits.wait_for("the survivor to lead", lambda: (standby.health() or {}).get(
            "role") == "leader", 40, g.why)  # fmt: skip
        took = time.monotonic() - healed
        print(f"led {took:.1f} s after the heal")
        assert took < LEADS_WITHIN_S, (took, g.why())
        done = subprocess.run(
            [GPULEDGER, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h"],
            env=env_for(Path("/nonexistent"), GPULEDGER_URL=standby.url, GPULEDGER_TOKEN=token),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (done.stderr, g.why())
    finally:
        g.stop()
        proxy.close()
