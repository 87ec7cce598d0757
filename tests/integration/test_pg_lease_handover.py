"""The lease on a real PostgreSQL: a server that took it but whose worker does not take up the
leader's work (busy, e.g. still waiting on a store that just came back) hands it over within
about one renewal instead of renewing it for nobody (after an outage one held it ~30 s so and
nobody could write: atk33-28 F7), and takes none again before its worker has looked."""

from __future__ import annotations

import time

from ledger.server.ha import Leadership
from ledger.store import lease
from tests.integration import waits

LEASE_S = 2.0


def _worker_that_leads(ha: Leadership) -> None:
    """What the worker does when woken: look at the role, and lead while the lease runs."""
    ha.turned_at = time.monotonic()
    ha.leading = ha.lease.may_act()


def test_a_server_whose_worker_never_takes_up_the_lease_hands_it_to_one_that_does(
    pg_store: str,
) -> None:
    lease.setup(pg_store)
    busy = Leadership(lease.Lease(pg_store, "busy", "http://busy", LEASE_S))
    ready = Leadership(lease.Lease(pg_store, "ready", "http://ready", LEASE_S))
    ready.notify = lambda: _worker_that_leads(ready)
    busy.start()  # its worker never looks at the role (busy.turned_at stays 0)
    try:
        assert busy.lease.epoch == 1 and lease.leading_now(pg_store) == "http://busy"
        took = time.monotonic()
        ready.start()
        waits.wait_for("the ready server to lead", lambda: ready.leading, 10)
        handed = time.monotonic() - took
        assert handed <= busy.ready_s + LEASE_S / 3 + 1.0, handed  # about one renewal
        assert lease.leading_now(pg_store) == "http://ready"
        assert not busy.lease.may_act() and busy.leader_address() in ("", "http://ready")
        time.sleep(LEASE_S)  # the busy server takes nothing back meanwhile
        assert ready.lease.may_act() and ready.lease.epoch == 2
    finally:
        ready.stop()
        busy.stop()
