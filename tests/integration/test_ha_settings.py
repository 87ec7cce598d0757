"""Mistaken or hostile settings on a PostgreSQL store, each refused in one line (atk28 F5, F7):
a lease outside 1-60 s, a lease other than the one the leading server holds, a wrong password;
a refused `init` leaves nothing behind."""

from __future__ import annotations

import re
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from tests.integration.hakit import free_port, make_group
from tests.integration.serverkit import cli


def one_line(proc: object) -> str:
    """Exit 1 with one error line (`serve` may warn first that --store carries a password)."""
    err = str(proc.stderr)  # type: ignore[attr-defined]
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, err  # type: ignore[attr-defined]
    assert err.endswith(errors[0] + "\n") and "internal error" not in err, err
    assert all(ln == errors[0] or "WARNING" in ln for ln in err.splitlines()), err
    return errors[0]


def serve(home: Path, dsn: str, *args: str) -> object:
    return cli(home, "serve", "--store", dsn, "--listen", f"127.0.0.1:{free_port()}", *args,
               ok=False, timeout=120)  # fmt: skip


def test_a_lease_out_of_bounds_or_unlike_the_leaders_is_refused_in_one_line(
    tmp_path: Path, pg_store: str
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    for bad in ("1h", "1000d", "0s", "61s"):
        assert "lease" in one_line(serve(tmp_path / f"h-{bad}", pg_store, "--lease", bad))
    g = make_group(tmp_path, pg_store, 1, "--lease", "5s", home=home)
    try:
        g.start(g.members[0])
        g.leader()
        err = one_line(serve(tmp_path / "other", pg_store, "--lease", "3s"))
        assert "use a lease of 5s" in err and "--lease 5s" in err, err
        # atk33-28 F5: a standby with another executor or policy would change both when it
        # took over (a server with --executor none took a cluster's agents: jobs killed)
        err = one_line(serve(tmp_path / "fifo", pg_store, "--lease", "5s", "--policy", "fifo"))
        assert "runs --executor none with policy fairshare-7" in err, err
        assert "started with --executor none and policy fifo-1" in err, err
        err = one_line(serve(tmp_path / "rec", pg_store, "--lease", "5s", "--executor", "record"))
        assert "this server was started with --executor record" in err, err
    finally:
        g.stop()


def test_a_wrong_password_says_libpqs_cause_in_one_line_and_a_failed_init_leaves_no_home(
    tmp_path: Path, pg_store: str
) -> None:
    assert conninfo_to_dict(pg_store).get("password"), pg_store  # the script's DSN has one
    wrong = re.sub(r"://([^:@/]+):[^@]*@", r"://\1:WRONGPASS123@", pg_store, count=1)
    home = tmp_path / "fresh"
    err = one_line(cli(home, "init", "--admin", "root", "--store", wrong, ok=False, timeout=120))
    assert "password authentication failed" in err and "WRONGPASS123" not in err, err
    assert not home.exists(), list(home.iterdir())
    ok = tmp_path / "ok"
    cli(ok, "init", "--admin", "root", "--store", pg_store)
    err = one_line(serve(tmp_path / "wrong", wrong))
    assert "password authentication failed" in err, err
    again = tmp_path / "again"  # init on a store that has a ledger: refused, nothing left
    one_line(cli(again, "init", "--admin", "root", "--store", pg_store, ok=False, timeout=120))
    assert not again.exists()
