"""Which OS account a server runs as is among the settings every server of a store runs alike
(docs/ha.md; `ledger.wire.config.admission_of`): real PostgreSQL, real servers run as two real
OS accounts (made with useradd; neither root). Before, only whether the server ran as root was
recorded, so servers of two service accounts counted as alike: after a failover the new
leader ran jobs as another uid, and its `scancel` of the old leader's Slurm jobs was refused
(the GPU stayed "stopping", the next job stayed placed) (atk42-28 F1).

The project's venv is root's (other accounts cannot read its interpreter), so a server of
another account runs Debian's /usr/bin/python3 (the same 3.11) with the venv's site-packages
added: the same code, the same libraries."""

from __future__ import annotations

import os
import signal
import subprocess
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ledger.store import lease
from tests.integration import userkit, waits
from tests.integration.hakit import free_port
from tests.integration.serverkit import cli, env_for
from tests.integration.test_ha_settings import one_line

LEASE = "2s"
RUN_CLI = (
    "import site, sys; site.addsitedir(sys.argv.pop(1)); sys.argv[0] = 'gpuledger'; "
    "from ledger.cli import main; sys.exit(main())"
)
"""`gpuledger` for another account: the venv's site-packages (`sys.argv[1]`), then the CLI."""


def as_user(user: userkit.User, *args: str) -> list[str]:
    """`gpuledger ARGS` run as `user` (its uid, gid and groups)."""
    site = sysconfig.get_paths()["purelib"]
    return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups",
            "/usr/bin/python3", "-c", RUN_CLI, site, *args]  # fmt: skip


@contextmanager
def home_of(user: userkit.User) -> Iterator[Path]:
    """A server's own home (its projection, its socket), the account's, where it may enter."""
    with userkit.shared_dir("gpuledger-svc-") as top:
        home = top / user.name
        home.mkdir()
        os.chown(home, user.uid, user.gid)
        yield home


def serve_args(dsn: str, *more: str) -> tuple[str, ...]:
    return ("serve", "--store", dsn, "--listen", f"127.0.0.1:{free_port()}", "--lease", LEASE,
            "--executor", "record", *more)  # fmt: skip


def start(user: userkit.User, home: Path, log: Path, dsn: str, *more: str) -> subprocess.Popen:
    """A server of `user`'s account on `dsn`, once it listens."""
    with log.open("ab") as out:
        proc = subprocess.Popen(as_user(user, *serve_args(dsn, *more)), env=env_for(home),
                                stdout=out, stderr=out, cwd=home)  # fmt: skip

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"{user.name}'s server exited {proc.returncode}: {log.read_text()}"
            )
        return "listening on" in log.read_text(errors="replace")

    waits.wait_for(f"{user.name}'s server to listen", listening, 90, log.read_text)
    return proc


def refused(user: userkit.User, home: Path, dsn: str, *more: str) -> str:
    """The one line a server of `user`'s account is refused with at its start."""
    done = subprocess.run(as_user(user, *serve_args(dsn, *more)), env=env_for(home), cwd=home,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    return one_line(done)


def stop(proc: subprocess.Popen, dsn: str) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    waits.wait_for("nobody to lead", lambda: lease.leading_now(dsn) is None, 30)


def test_a_server_of_another_service_account_never_leads_until_new_settings(
    tmp_path: Path, pg_store: str
) -> None:
    cli(tmp_path / "init", "init", "--admin", "root", "--store", pg_store)
    with userkit.os_user("glsa", groups=0) as a, userkit.os_user("glsb", groups=0) as b:
        named_a, named_b = f'"{a.name} (uid {a.uid})"', f'"{b.name} (uid {b.uid})"'
        with home_of(a) as home_a, home_of(b) as home_b:
            proc = start(a, home_a, tmp_path / "a.log", pg_store)
            try:
                # b's server is refused while a's leads, and once nobody leads, naming both
                err = refused(b, home_b, pg_store)
                assert f"service_account {named_a} (recorded) against {named_b} here" in err, err
                assert "holds the lease now" in err and "--new-settings" in err, err
                stop(proc, pg_store)
                err = refused(b, home_b, pg_store)
                assert f"service_account {named_a} (recorded) against {named_b} here" in err, err
                assert "recorded by the last leader" in err, err
                # --new-settings changes it deliberately; then a's is the one refused
                proc = start(b, home_b, tmp_path / "b.log", pg_store, "--new-settings")
                waits.wait_for("b's server to lead", lambda: lease.leading_now(pg_store), 30)
                err = refused(a, home_a, pg_store)
                assert f"service_account {named_b} (recorded) against {named_a} here" in err, err
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=60)


def test_a_root_server_is_told_the_service_account_the_store_records(
    tmp_path: Path, pg_store: str
) -> None:
    """The suite's own servers run as root: one started on a store whose leader ran as a
    service account is refused naming both accounts (the names a person acts on)."""
    home = tmp_path / "root-server"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    with userkit.os_user("glsc", groups=0) as c, home_of(c) as home_c:
        proc = start(c, home_c, tmp_path / "c.log", pg_store)
        try:
            err = one_line(cli(home, *serve_args(pg_store), ok=False, timeout=120))
            assert (f'service_account "{c.name} (uid {c.uid})" (recorded) against '
                    '"root (uid 0)" here') in err, err  # fmt: skip
            assert "service_runs_as_root false (recorded) against true here" in err, err
        finally:
            stop(proc, pg_store)
