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

from ledger.store import lease
from tests.integration import waits
from tests.integration.hakit import free_port, make_group
from tests.integration.serverkit import GPULEDGER, cli, env_for
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


def _slurm(data: str, ctld: str, slurmd: str, node: str, *args: str) -> str:
    """scripts/slurm/slurm ARGS for the cluster of data dir `data` (its ports, its node)."""
    env = {**os.environ, "GPULEDGER_SLURM_DATA": data, "GPULEDGER_SLURMCTLD_PORT": ctld,
           "GPULEDGER_SLURMD_PORT": slurmd, "GPULEDGER_SLURM_NODE": node}  # fmt: skip
    script = Path(__file__).resolve().parents[2] / "scripts" / "slurm" / "slurm"
    done = subprocess.run([str(script), *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, f"slurm {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def test_another_cluster_in_the_place_of_the_recorded_one_is_told_apart(
    tmp_path: Path, pg_store: str
) -> None:
    """atk42-28 F3: a cluster of the same name, controller host text and port as the
    recorded one (cluster B stopped, a new cluster C started on B's ports) was one cluster to
    the servers: a standby of C would have taken B's work over. Where each controller saves
    its cluster's state (`StateSaveLocation`, as the answering slurmctld says) tells them
    apart."""
    _, conf_b = _confs()
    data_b = os.environ.get("GPULEDGER_SLURM_DATA_B", "")
    ports = (os.environ.get("GPULEDGER_SLURMCTLD_PORT_B", ""),
             os.environ.get("GPULEDGER_SLURMD_PORT_B", ""))  # fmt: skip
    if not (data_b and all(ports)):
        pytest.fail("scripts/test names the second cluster's data dir and ports", pytrace=False)
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True)
    # cluster C's node: no cluster of the suite's (scripts/test: <host>, <host>-b, -c, -d)
    node_b, node_c = f"{host.stdout.strip()}-b", f"{host.stdout.strip()}-other"
    _answering(conf_b)
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    args = ("--lease", "5s", "--executor", "slurm", "--partition", PARTITION)
    log = tmp_path / "leader.log"
    with log.open("ab") as out:  # the leader, on cluster B: B's identity is recorded
        proc = subprocess.Popen(
            [GPULEDGER, "serve", "--store", pg_store, "--listen", f"127.0.0.1:{free_port()}",
             *args], env=env_for(home, SLURM_CONF=conf_b), stdout=out, stderr=out,
        )  # fmt: skip
    data_c = tmp_path / "cluster-c"
    try:
        listens = lambda: "listening on" in log.read_text(errors="replace")  # noqa: E731
        waits.wait_for("the server on cluster B to listen", listens, 90, log.read_text)
        leads = lambda: lease.leading_now(pg_store) is not None  # noqa: E731
        waits.wait_for("the server on cluster B to lead", leads, 30, log.read_text)
        _slurm(data_b, *ports, node_b, "down")
        conf_c = _slurm(str(data_c), *ports, node_c, "up")
        _answering(conf_c)
        err = one_line(serve(tmp_path / "c", pg_store, *args, SLURM_CONF=conf_c))
        assert "slurm_state" in err and "(recorded) against" in err, err
        assert str(data_c) in err and "slurm_cluster" not in err, err
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        if data_c.exists():
            _slurm(str(data_c), *ports, node_c, "down")
        _slurm(data_b, *ports, node_b, "up")
        _answering(conf_b)
