"""Which Slurm cluster a server talks to is among the settings every server of a store runs
alike (docs/ha.md; atk40-28 F2): two real Slurm clusters (scripts/test starts two, `SLURM_CONF`
and `GPULEDGER_SLURM_CONF_B`, each with its own controller port), real PostgreSQL, real
servers. Before, a standby started with the other cluster's `SLURM_CONF`, or with
`GPULEDGER_SLURM_UNTRACKED_OK=1`, stood by and took the first cluster's work over to the other
one after a failover; a Slurm server on PostgreSQL started while slurmctld did not answer,
with no word on its cluster to compare."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration import waits
from tests.integration.hakit import free_port, make_group
from tests.integration.serverkit import cli
from tests.integration.test_ha_settings import one_line

PARTITION = os.environ.get("GPULEDGER_SLURM_PARTITION", "gpuledger")


def _confs() -> tuple[str, str]:
    a, b = os.environ.get("SLURM_CONF", ""), os.environ.get("GPULEDGER_SLURM_CONF_B", "")
    if not (a and b and a != b and Path(a).is_file() and Path(b).is_file()):
        pytest.fail("SLURM_CONF and GPULEDGER_SLURM_CONF_B must name two clusters' slurm.conf "
                    "(scripts/test starts both)", pytrace=False)  # fmt: skip
    return a, b


def serve(home: Path, dsn: str, *args: str, **env: str) -> object:
    return cli(home, "serve", "--store", dsn, "--listen", f"127.0.0.1:{free_port()}", *args,
               ok=False, timeout=120, **env)  # fmt: skip


def _answering(conf: str) -> None:
    """Wait for `conf`'s slurmctld (the Slurm test files beside this one stop it at times)."""

    def up() -> bool:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "SLURM_CONF": conf}, check=False)  # fmt: skip
        return " is UP" in done.stdout

    waits.wait_for(f"slurmctld of {conf} to answer", up, 180)


def _silent_copy(conf: str, tmp_path: Path) -> str:
    """`conf` with its controller moved to a port nobody listens on: a cluster whose slurmctld
    does not answer."""
    text = Path(conf).read_text()
    moved = re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=9", text)
    assert moved != text, text
    copy = tmp_path / "silent" / "slurm.conf"
    copy.parent.mkdir()
    copy.write_text(moved)
    for inc in re.findall(r"(?m)^Include\s+(\S+)", text):  # relative includes, if any
        if not inc.startswith("/"):
            (copy.parent / inc).write_text((Path(conf).parent / inc).read_text())
    return str(copy)


def test_a_server_talking_to_another_slurm_cluster_never_leads(
    tmp_path: Path, pg_store: str
) -> None:
    conf_a, conf_b = _confs()
    _answering(conf_a)
    _answering(conf_b)
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    args = ("--executor", "slurm", "--partition", PARTITION)
    g = make_group(tmp_path, pg_store, 2, *args, home=home)
    g.lease = "5s"  # a Slurm leader's cycle on a loaded machine let a 2 s lease run out
    s0, s1 = g.members
    try:
        g.start(s0)  # on cluster A (the suite's SLURM_CONF)
        assert g.leader() is s0
        # the other cluster's server is refused at its start, naming what differs
        err = one_line(serve(tmp_path / "b", pg_store, "--lease", g.lease, *args,
                             SLURM_CONF=conf_b))  # fmt: skip
        assert "slurm_cluster" in err and "(recorded) against" in err, err
        assert "the leader" in err and "--new-settings" in err, err
        # so is one of cluster A that accepts untracked processes
        err = one_line(serve(tmp_path / "u", pg_store, "--lease", g.lease, *args,
                             GPULEDGER_SLURM_UNTRACKED_OK="1"))  # fmt: skip
        assert "slurm_untracked_ok false (recorded) against true here" in err, err
        # one whose slurmctld does not answer does not start: its cluster is not known
        err = one_line(serve(tmp_path / "s", pg_store, "--lease", g.lease, *args,
                             SLURM_CONF=_silent_copy(conf_a, tmp_path)))  # fmt: skip
        assert "slurmctld does not answer" in err, err
        # a standby of the same cluster stands by, and takes over when the leader stops
        g.start(s1)
        assert g.leader() is s0
        s0.kill(signal.SIGTERM)
        assert g.leader() is s1
        s1.kill(signal.SIGTERM)
        # nobody leads now: the other cluster's server is refused all the same
        _answering(conf_b)
        err = one_line(serve(tmp_path / "b", pg_store, "--lease", g.lease, *args,
                             SLURM_CONF=conf_b))  # fmt: skip
        assert "recorded by the last leader" in err and "slurm_cluster" in err, err
    finally:
        g.stop()
