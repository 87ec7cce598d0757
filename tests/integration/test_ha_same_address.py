"""Two servers on one store that advertise the same URL (atk45ha L2): clients and agents reach
one of them at random, a standby forwards writes to "the leader" that may be itself, and
`status` shows one row for both. Before, a second server at the leader's address started and
stood by, and nothing said so. Now `serve` refuses in one line (real PostgreSQL, real servers;
the running side, two started together, is tests/unit/test_same_address.py)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration import waits
from tests.integration.hakit import make_group
from tests.integration.serverkit import cli
from tests.integration.test_ha_settings import one_line, serve

SHARED = "http://gpuledger-ha.example:8470"


def test_a_second_server_at_the_leader_s_address_is_refused_in_one_line(
    tmp_path: Path, pg_store: str
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    g = make_group(tmp_path, pg_store, 1, "--advertise", SHARED, home=home)
    (s0,) = g.members
    try:
        g.start(s0)
        waits.wait_for("s0 to lead", lambda: "leading at epoch" in s0.text(), 60, g.why)
        began = time.monotonic()
        err = one_line(serve(tmp_path / "b", pg_store, "--lease", g.lease, "--advertise", SHARED))
        assert f"another server reports at this server's address {SHARED} (" in err, err
        assert "each server needs its own --advertise" in err, err
        assert time.monotonic() - began < 60
        # so is one at another text of it (atk46-ha F3: the text was compared)
        written = "HTTP://GPULEDGER-HA.example:8470/"
        err = one_line(serve(tmp_path / "d", pg_store, "--lease", g.lease, "--advertise", written))
        assert f"another server reports at this server's address {written} (" in err, err
        # another address stands by as ever
        ok = tmp_path / "c"
        other = make_group(tmp_path / "other", pg_store, 1)
        other.members[0].home = ok
        ok.mkdir()
        other.lease = g.lease
        other.start(other.members[0])
        h = other.members[0].health() or {}
        assert h.get("role") == "standby" and not h.get("address_error"), h
        other.stop()
    finally:
        g.stop()
