"""Which Slurm cluster a server talks to is among the settings every server of a store runs
alike (docs/ha.md; atk40-28 F2): two real Slurm clusters of this file's own
(`private_clusters`, each with its own controller port), real PostgreSQL, real servers.
Before, a standby started with the other cluster's `SLURM_CONF`, or with
`GPULEDGER_SLURM_UNTRACKED_OK=1`, stood by and took the first cluster's work over to the other
one after a failover; a Slurm server on PostgreSQL started while slurmctld did not answer,
with no word on its cluster to compare."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from ledger.store import lease
from tests.integration import waits
from tests.integration.hakit import free_port, log_events, make_group
from tests.integration.serverkit import BUDGET, GPULEDGER, cli, env_for, read_served
from tests.integration.test_ha_settings import one_line

PARTITION = os.environ.get("GPULEDGER_SLURM_PARTITION", "gpuledger")
VANISH_S = 5
"""The missing-run limit of the server that must not call its job lost
(`GPULEDGER_SLURM_VANISH_AFTER_S`; the executor's own is 30 s)."""


@dataclass
class Private:
    """A Slurm cluster of this file's own: its data dir, ports, node and slurm.conf."""

    data: str
    ctld: str
    slurmd: str
    node: str
    conf: str = ""


CLUSTERS: dict[str, Private] = {}
"""This file's two clusters, "a" and "b" (`private_clusters`)."""


@pytest.fixture(scope="module", autouse=True)
def private_clusters() -> Iterator[None]:
    """Two real Slurm clusters of this file's own (scripts/slurm/slurm, each its own data dir,
    ports and node name): its tests stop a controller and start another cluster in its place,
    which the suite's Slurm test groups, running beside this file on their clusters, must
    never see (they did on the suite's second cluster)."""
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True)
    try:
        for key in ("a", "b"):
            # as scripts/test makes its clusters' dirs: pytest's own tmp dirs are 0700, and a
            # job's user must reach the spool under it
            data = tempfile.mkdtemp(prefix=f"gpuledger-ha-slurm-{key}.")
            node = f"{host.stdout.strip()}-ha{key}"
            c = Private(data, str(free_port()), str(free_port()), node)
            CLUSTERS[key] = c
            c.conf = _slurm(c.data, c.ctld, c.slurmd, c.node, "up")
        yield
    finally:
        for c in CLUSTERS.values():
            with contextlib.suppress(AssertionError):
                _slurm(c.data, c.ctld, c.slurmd, c.node, "down")
            shutil.rmtree(c.data, ignore_errors=True)
        CLUSTERS.clear()


def _confs() -> tuple[str, str]:
    return CLUSTERS["a"].conf, CLUSTERS["b"].conf


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


def _clear(conf: str, top: Path) -> None:
    """A test's end: every job of the partition on the cluster of `conf` cancelled, and the
    test's servers' directory `top` removed."""
    env = {**os.environ, "SLURM_CONF": conf}
    subprocess.run(["scancel", "--partition", PARTITION], env=env, capture_output=True,
                   timeout=60, check=False)  # fmt: skip
    shutil.rmtree(top, ignore_errors=True)


def test_a_server_talking_to_another_slurm_cluster_never_leads(
    tmp_path: Path, pg_store: str
) -> None:
    conf_a, conf_b = _confs()
    _answering(conf_a)
    _answering(conf_b)
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    args = ("--executor", "slurm", "--partition", PARTITION)
    args += ("--slurm-jobs-dir", str(home / "jobs"))  # one for all (atk46-ha F4)
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
        # so is one that would write its runs' marks elsewhere (its own home: atk46-ha F4)
        err = one_line(serve(tmp_path / "d", pg_store, "--lease", g.lease, *args[:-2]))
        want = f'slurm_jobs_dir "{home / "jobs"}" (recorded) against "{tmp_path / "d" / "jobs"}"'
        assert want in err, err
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
    data_b, ports = CLUSTERS["b"].data, (CLUSTERS["b"].ctld, CLUSTERS["b"].slurmd)
    node_b, node_c = CLUSTERS["b"].node, CLUSTERS["b"].node + "-other"
    _answering(conf_b)
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    args = ("--lease", "5s", "--executor", "slurm", "--partition", PARTITION)
    args += ("--slurm-jobs-dir", str(home / "jobs"))  # one for all (atk46-ha F4)
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


def _reachable_home() -> Path:
    """A ledger home its jobs' users reach (pytest's own directories are root's alone): the
    Slurm job, run as `nobody`, marks its launch under it."""
    top = Path(tempfile.mkdtemp(prefix="gpuledger-ha-slurm-"))
    top.chmod(0o755)
    return top / "server-0"


def _jobs(home: Path) -> dict[int, str]:
    """`jobs --json`'s statuses, from the server on `home` while one answers there (polled:
    no `gpuledger` process a poll), else from the store (`serverkit.read_served`)."""
    rows = read_served(home, "jobs?limit=200", "jobs")
    return {int(r["job_id"]): str(r["status"]) for r in rows}


def _nodes(home: Path) -> set[str]:
    """The nodes `node list` names (`_jobs`' way)."""
    return {str(n["node"]) for n in read_served(home, "nodes", "node", "list")}


def _controller_in_place(data_b: str, state: Path) -> subprocess.Popen[bytes]:
    """Kill cluster B's slurmctld and start one in its place from a copy of B's config whose
    only change is `StateSaveLocation` (`state`): the same name, host, port and munge, as in
    atk43ha F5. Returns it (the caller kills it and starts B's again)."""
    conf = Path(data_b) / "slurm.conf"
    pid = int((Path(data_b) / "slurmctld.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    waits.wait_for("B's slurmctld to die", lambda: not Path(f"/proc/{pid}").exists(), 30)
    state.mkdir(parents=True)
    copy = state.parent / "slurm.conf"
    text = re.sub(r"(?m)^StateSaveLocation=.*$", f"StateSaveLocation={state}", conf.read_text())
    copy.write_text(text)
    for other in Path(data_b).glob("*.conf"):  # gres.conf, cgroup.conf: read beside it
        if other.name != "slurm.conf":
            (state.parent / other.name).write_text(other.read_text())
    with (state.parent / "slurmctld.out").open("ab") as log:  # the child keeps its own copy
        env = {**os.environ, "SLURM_CONF": str(copy)}
        return subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(copy)], stdout=log,
                                stderr=log, env=env)  # fmt: skip


def test_a_controller_back_as_another_cluster_is_neither_read_nor_placed_on(
    tmp_path: Path, pg_store: str
) -> None:
    """atk43ha F5: the leader's slurmctld goes away and another cluster's (the same name, host
    text and port; another `StateSaveLocation`) answers in its place. The leader said nothing,
    recorded the running job lost (exit -1) once it was missing from the other cluster's list,
    and would have placed there: the identity was checked at a server's start only. Now it
    says so in one line, `status` says why no node is observed, the job stays running in the
    ledger and nothing is placed until its own cluster answers again."""
    _, conf_b = _confs()
    data_b, ports = CLUSTERS["b"].data, (CLUSTERS["b"].ctld, CLUSTERS["b"].slurmd)
    node_b = CLUSTERS["b"].node
    _answering(conf_b)
    home = _reachable_home()
    cli(home, "init", "--admin", "root", "--store", pg_store)
    (tmp_path / "budget.toml").write_text(BUDGET)
    cli(home, "budget", "apply", str(tmp_path / "budget.toml"), GPULEDGER_USER="root")
    log = tmp_path / "leader.log"
    with log.open("ab") as out:  # the leader, on cluster B: B's identity is recorded
        proc = subprocess.Popen(
            [GPULEDGER, "serve", "--store", pg_store, "--listen", f"127.0.0.1:{free_port()}",
             "--lease", "5s", "--executor", "slurm", "--partition", PARTITION, "--run-as",
             "service", "--interval", "0.5s"],
            env=env_for(home, SLURM_CONF=conf_b, GPULEDGER_SLURM_VANISH_AFTER_S=str(VANISH_S)),
            stdout=out, stderr=out,
        )  # fmt: skip
    state_c = Path(tempfile.mkdtemp(prefix="gpuledger-ha-slurm-c-")) / "state"
    ctld_c: subprocess.Popen[bytes] | None = None
    text = lambda: log.read_text(errors="replace")  # noqa: E731
    try:
        waits.wait_for("the server on cluster B to listen", lambda: "listening on" in text(),
                       90, text)  # fmt: skip
        waits.wait_for("the server on cluster B to lead", lambda: lease.leading_now(pg_store)
                       is not None, 30, text)  # fmt: skip
        waits.wait_for("B's node", lambda: node_b in _nodes(home), 60, text)
        submit = ("submit", "-A", "ai2/olmo", "-G", "1", "--", "sleep", "1000")
        cli(home, *submit, GPULEDGER_USER="alice")
        waits.wait_for("job 1 to run", lambda: _jobs(home).get(1) == "running", 120, text)
        ctld_c = _controller_in_place(data_b, state_c)  # C answers in B's controller's place
        _answering(conf_b)
        said = "the slurmctld that answers is another cluster than this server's: slurm_state"
        waits.wait_for("the leader to say C is another cluster", lambda: said in text(), 60, text)
        cli(home, *submit, GPULEDGER_USER="alice")
        time.sleep(3 * VANISH_S)  # past the time after which a run missing from Slurm's list is
        # gone (the executor's 30 s by default: the test slept 45 s)
        assert _jobs(home) == {1: "running", 2: "pending"}, text()
        status = cli(home, "status").stdout
        assert "outage        the engine cannot observe" in status, status
        assert said in status and str(state_c) in status, status
        assert text().count(said) == 1, text()  # one line, not one per cycle
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        if ctld_c is not None:
            ctld_c.kill()
            ctld_c.wait(timeout=30)
        _slurm(data_b, *ports, node_b, "up")
        _answering(conf_b)
        _clear(conf_b, home.parent)
        shutil.rmtree(state_c.parent, ignore_errors=True)


def _row(dsn: str) -> object:
    with psycopg.connect(dsn, autocommit=True) as con:
        row = con.execute(f"SELECT to_jsonb(l) FROM {lease.LEADER_TABLE} l").fetchone()
    return row[0] if row else None


def test_new_settings_onto_another_cluster_leaves_no_run_of_the_recorded_one_behind(
    tmp_path: Path, pg_store: str
) -> None:
    """atk43ha F2: every server stopped, one started with `--new-settings` and another
    cluster's `SLURM_CONF` (a change, not a move: the new cluster lists none of the ledger's
    runs) recorded the job running on the recorded cluster lost (exit -1) while it ran on
    there, out of the ledger's reach. Now that start is refused in one line naming the runs,
    the store left as it was, unless the operator gives `--abandon-runs`."""
    conf_a, conf_b = _confs()
    _answering(conf_a)
    _answering(conf_b)
    home = _reachable_home()
    cli(home, "init", "--admin", "root", "--store", pg_store)
    (tmp_path / "budget.toml").write_text(BUDGET)
    cli(home, "budget", "apply", str(tmp_path / "budget.toml"), GPULEDGER_USER="root")
    args = ("--lease", "5s", "--executor", "slurm", "--partition", PARTITION, "--run-as",
            "service", "--interval", "0.5s")  # fmt: skip
    args += ("--slurm-jobs-dir", str(home / "jobs"))  # one for all (atk46-ha F4)
    g = make_group(tmp_path, pg_store, 1, *args[2:], home=home)
    g.lease = "5s"
    (s0,) = g.members
    procs: list[subprocess.Popen[bytes]] = []
    try:
        g.start(s0)  # on cluster A (the suite's SLURM_CONF)
        assert g.leader() is s0
        waits.wait_for("A's node", lambda: _nodes(home) != set(), 60, g.why)
        cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--", "sleep", "1000",
            GPULEDGER_USER="alice")  # fmt: skip
        waits.wait_for("job 1 to run", lambda: _jobs(home).get(1) == "running", 120, g.why)
        s0.kill(signal.SIGTERM)  # "stop every server"
        before, events = _row(pg_store), len(log_events(home))
        err = one_line(serve(tmp_path / "b", pg_store, *args, "--new-settings",
                             SLURM_CONF=conf_b))  # fmt: skip
        assert "--new-settings onto another Slurm cluster (slurm_cluster" in err, err
        assert "would record lost 1 runs the ledger holds that it does not list (jobs 1)" in err
        assert "--abandon-runs" in err, err
        assert _row(pg_store) == before  # nothing written: the lease row as it was
        assert len(log_events(home)) == events and _jobs(home) == {1: "running"}
        # the operator's word: the runs are abandoned (recorded lost; they run on, on A), by
        # the same server (its home holds the run's marks: it carried the run as one its Slurm
        # forgot, `running`, and recorded nothing, atk45ha L1)
        log = tmp_path / "abandon.log"
        with log.open("ab") as out:
            procs.append(subprocess.Popen(
                [GPULEDGER, "serve", "--store", pg_store, "--listen", f"127.0.0.1:{free_port()}",
                 *args, "--new-settings", "--abandon-runs"],
                env=env_for(home, SLURM_CONF=conf_b), stdout=out, stderr=out,
            ))  # fmt: skip
        text = lambda: log.read_text(errors="replace")  # noqa: E731
        lost = "job 1 has no run in the engine after a restart: recording it lost"
        waits.wait_for("the abandoned run recorded lost", lambda: lost in text(), 120, text)
        assert "--abandon-runs onto another Slurm cluster" in text(), text()
        waits.wait_for("job 1 recorded lost", lambda: _jobs(home).get(1) != "running", 60, text)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        g.stop()
        _clear(conf_a, home.parent)


def test_an_sbatch_that_lands_on_another_cluster_is_cancelled_there_and_submitted_again(
    tmp_path: Path,
) -> None:
    """Issue 28, left open after atk44ha F1: a controller swapped in the second before an
    sbatch (after the identity was confirmed), or during sbatch's own ~9 s retries, took the
    run, which kept that cluster's Slurm id: missing on its own cluster, then ended as a
    vanished run while it ran there. Real Slurm: B's slurmctld is killed and C (B's config,
    another `StateSaveLocation`) started in its place just before the executor's sbatch runs;
    sbatch retries and lands on C. The executor asks the identity again after it, finds the
    run in C's list (its comment), cancels it there, and submits it again on B once B answers."""
    from ledger.core.state import Node
    from ledger.cycle.executor import Launch, Orders
    from ledger.engines.slurm.executor import SlurmExecutor
    from schemas.events import GpuSlot

    _, conf_b = _confs()
    b = CLUSTERS["b"]
    _answering(conf_b)
    env_b = {**os.environ, "SLURM_CONF": conf_b}
    ex = SlurmExecutor(PARTITION, "0123abcd4567", tmp_path / "logs", run_as="service", env=env_b)
    ex.check()
    nodes = {b.node: Node(name=b.node, cluster="c", gpus=4, gpu_type="fake")}
    assert ex.adopt({}, time.time()) == set()
    ex.observe(time.time(), nodes)
    state_c = Path(tempfile.mkdtemp(prefix="gpuledger-ha-slurm-c-")) / "state"
    ctld_c: list[subprocess.Popen[bytes]] = []
    real = ex._run

    def swap_then(args: list[str], stdin: str | None = None, env: object = None) -> str:
        if args[0] == "sbatch" and not ctld_c:  # B gone, C in its place: sbatch retries to it
            ctld_c.append(_controller_in_place(b.data, state_c))
        return real(args, stdin, env)  # type: ignore[arg-type]

    ex._run = swap_then  # type: ignore[method-assign]
    env_c = {**os.environ, "SLURM_CONF": str(state_c.parent / "slurm.conf")}
    try:
        launch = Launch(4, (GpuSlot(node=b.node, gpu_indices=(0,)),), ("sleep", "300"), None,
                        "alice", "ai2/olmo")  # fmt: skip
        ex.carry_out(Orders(launches=(launch,)), time.time())
        assert ctld_c, "no sbatch"
        assert ex._runs[4].slurm_id is None  # landed on C: never launched on B
        on_c = subprocess.run(["scontrol", "-o", "show", "job"], env=env_c, capture_output=True,
                              text=True, timeout=60, check=False).stdout  # fmt: skip
        mine = [line for line in on_c.splitlines() if "JobName=gpuledger-4 " in line]
        assert len(mine) == 1 and "JobState=CANCELLED" in mine[0], on_c
        ctld_c[0].kill()
        ctld_c[0].wait(timeout=30)
        _slurm(b.data, b.ctld, b.slurmd, b.node, "up")  # B answers again
        _answering(conf_b)

        def submitted_on_b() -> bool:
            ex.observe(time.time(), nodes)
            if ex._probe.thread is not None:
                ex._probe.thread.join(timeout=30)
            return ex._runs[4].slurm_id is not None

        waits.wait_for("the run submitted again on B", submitted_on_b, 120)
        on_b = subprocess.run(["scontrol", "-o", "show", "job", ex._runs[4].slurm_id or ""],
                              env=env_b, capture_output=True, text=True, timeout=60,
                              check=False).stdout  # fmt: skip
        assert "JobName=gpuledger-4 " in on_b and "job=4:run=0" in on_b, on_b
    finally:
        for proc in ctld_c:
            proc.kill()
            proc.wait(timeout=30)
        _slurm(b.data, b.ctld, b.slurmd, b.node, "up")
        _answering(conf_b)
        subprocess.run(["scancel", "--partition", PARTITION], env=env_b, capture_output=True,
                       timeout=60, check=False)  # fmt: skip
        shutil.rmtree(state_c.parent, ignore_errors=True)


def _slow_sbatch_conf(conf: str, where: Path, flag: Path) -> str:
    """A copy of `conf` for the clients alone (the controller's own is unchanged, so the
    cluster's identity is the same) whose `sbatch` runs a site cli_filter that sleeps as many
    seconds as `flag` says, before it sends a ledger's job (`gpuledger-*`): a slow pre-submit
    step, as an LDAP lookup or a busy munged makes one (atk45ha F1)."""
    where.mkdir(parents=True)
    where.chmod(0o755)
    text = Path(conf).read_text()
    (where / "slurm.conf").write_text(text + "\nCliFilterPlugins=cli_filter/lua\n")
    (where / "cli_filter.lua").write_text(f"""
function slurm_cli_setup_defaults(options, early_pass) return slurm.SUCCESS end
function slurm_cli_post_submit(offset, job_id, step_id) return slurm.SUCCESS end
function slurm_cli_pre_submit(options, pack_offset)
  local f = io.open("{flag}", "r")
  if f ~= nil then
    local n = f:read("*l"); f:close()
    if string.sub(options["job-name"] or "", 1, 10) == "gpuledger-" then
      os.execute("sleep " .. (n or "12"))
    end
  end
  return slurm.SUCCESS
end
""")
    return str(where / "slurm.conf")


def _named(conf: str, name: str) -> list[str]:
    """Every Slurm job of job name `name` the cluster lists (any state), one line each (an
    earlier test's too, listed for `MinJobAge`)."""
    env = {**os.environ, "SLURM_CONF": conf}
    done = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True,
                          timeout=60, env=env, check=False)  # fmt: skip
    return [ln for ln in done.stdout.splitlines() if f" JobName={name} " in ln]


def test_a_failover_during_a_slow_sbatch_runs_the_job_once(tmp_path: Path, pg_store: str) -> None:
    """atk45ha F1: the leader is killed (kill -9) while its `sbatch` is slow (a site
    cli_filter): its `sbatch` child lives on and lands after the standby took the lease.
    Before, the new leader submitted the run again at once; the late copy, taken for a run
    the ledger no longer runs, was stopped through the run's `stopping` mark, which the new
    copy found: it exited 143 and the job was recorded `failed`, "never ran". Now the new
    leader waits for that sbatch (its timeout + 5 s) and adopts the late copy: one Slurm job,
    the job runs."""
    conf_a = CLUSTERS["a"].conf
    _answering(conf_a)
    home = _reachable_home()
    cli(home, "init", "--admin", "root", "--store", pg_store)
    (tmp_path / "budget.toml").write_text(BUDGET)
    cli(home, "budget", "apply", str(tmp_path / "budget.toml"), GPULEDGER_USER="root")
    flag = tmp_path / "slow-sbatch"
    earlier = {ln.split()[0] for ln in _named(conf_a, "gpuledger-1")}
    slow = _slow_sbatch_conf(conf_a, home.parent / "slow", flag)
    args = ("--lease", "5s", "--executor", "slurm", "--partition", PARTITION, "--run-as",
            "service", "--interval", "0.5s")  # fmt: skip
    args += ("--slurm-jobs-dir", str(home / "jobs"))  # one for all (atk46-ha F4)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {"s0": tmp_path / "s0.log", "s1": tmp_path / "s1.log"}
    text = lambda name: logs[name].read_text(errors="replace")  # noqa: E731
    why = lambda: "".join(f"\n--- {n}\n{text(n)[-3000:]}" for n in logs if logs[n].exists())  # noqa: E731
    orphan: list[int] = []
    try:
        for name, h, conf in (("s0", home, slow), ("s1", tmp_path / "s1", conf_a)):
            with logs[name].open("ab") as out:
                procs[name] = subprocess.Popen(
                    [GPULEDGER, "serve", "--store", pg_store, "--listen",
                     f"127.0.0.1:{free_port()}", *args],
                    env=env_for(h, SLURM_CONF=conf), stdout=out, stderr=out,
                )  # fmt: skip
            waits.wait_for(f"{name} to listen", lambda n=name: "listening on" in text(n), 90, why)  # type: ignore[misc]
            if name == "s0":
                waits.wait_for("s0 to lead", lambda: "leading at epoch" in text("s0"), 60, why)
        waits.wait_for("A's node", lambda: _nodes(home) != set(), 60, why)
        flag.write_text("12\n")
        cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--", "sleep", "1000",
            GPULEDGER_USER="alice")  # fmt: skip

        def in_flight() -> bool:  # s0's own child (other runs on this host submit a job 1)
            done = subprocess.run(["pgrep", "-P", str(procs["s0"].pid), "-f",
                                   "sbatch --job-name=gpuledger-1 "],
                                  capture_output=True, text=True, check=False)  # fmt: skip
            orphan[:] = [int(p) for p in done.stdout.split()]
            return bool(orphan)

        waits.wait_for("s0's sbatch of job 1", in_flight, 60, why)
        procs["s0"].kill()  # kill -9: its sbatch child lives on
        procs["s0"].wait(timeout=60)
        flag.unlink()  # the new leader's own sbatch is fast
        waits.wait_for("s1 to lead", lambda: "leading at epoch" in text("s1"), 60, why)
        took = time.monotonic()
        waits.wait_for("job 1 to run", lambda: _jobs(home).get(1) == "running", 120, why)
        assert "job 1 run 0 waits until" in text("s1"), why()
        time.sleep(max(0.0, took + 32 - time.monotonic()))  # past the wait: nothing resubmitted
        copies = [c for c in _named(conf_a, "gpuledger-1") if c.split()[0] not in earlier]
        assert len(copies) == 1 and "JobState=RUNNING" in copies[0], (copies, why())
        assert _jobs(home).get(1) == "running", why()
        assert "second copy" not in text("s1") and "no longer runs" not in text("s1"), why()
    finally:
        flag.unlink(missing_ok=True)
        for pid in orphan:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        _clear(conf_a, home.parent)


def test_new_settings_while_a_cancelled_run_is_still_stopping_names_it(
    tmp_path: Path, pg_store: str
) -> None:
    """atk45ha F2: a cancelled job whose run is still stopping on the recorded cluster (its
    command traps SIGTERM and lingers) made `serve --new-settings` onto another cluster exit
    70, "internal error: KeyError: <job>", with or without `--abandon-runs`: the job has
    finished, its run is still held. Now the refusal names it in one line, apart from the
    running ones."""
    conf_a, conf_b = _confs()
    _answering(conf_a)
    _answering(conf_b)
    home = _reachable_home()
    cli(home, "init", "--admin", "root", "--store", pg_store)
    (tmp_path / "budget.toml").write_text(BUDGET)
    cli(home, "budget", "apply", str(tmp_path / "budget.toml"), GPULEDGER_USER="root")
    args = ("--lease", "5s", "--executor", "slurm", "--partition", PARTITION, "--run-as",
            "service", "--interval", "0.5s", "--grace", "120s")  # fmt: skip
    args += ("--slurm-jobs-dir", str(home / "jobs"))  # one for all (atk46-ha F4)
    log = tmp_path / "a.log"
    text = lambda: log.read_text(errors="replace")  # noqa: E731
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [GPULEDGER, "serve", "--store", pg_store, "--listen", f"127.0.0.1:{free_port()}",
             *args], env=env_for(home, SLURM_CONF=conf_a), stdout=out, stderr=out,
        )  # fmt: skip
    try:
        waits.wait_for("A's node", lambda: _nodes(home) != set(), 90, text)
        cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--", "sh", "-c",
            "trap 'sleep 100' TERM; sleep 1000 & wait", GPULEDGER_USER="alice")  # fmt: skip
        waits.wait_for("job 1 to run", lambda: _jobs(home).get(1) == "running", 120, text)
        cli(home, "cancel", "1", GPULEDGER_USER="alice")
        waits.wait_for("job 1 cancelled", lambda: 1 not in _jobs(home) or _jobs(home)[1] !=
                       "running", 60, text)  # fmt: skip
        time.sleep(2)  # its SIGTERM sent: the command lingers in its trap
        proc.send_signal(signal.SIGTERM)  # "stop every server", its run still stopping
        proc.wait(timeout=60)
        copies = _named(conf_a, "gpuledger-1")
        assert any("JobState=RUNNING" in c for c in copies), copies
        err = one_line(serve(tmp_path / "b", pg_store, *args, "--new-settings",
                             SLURM_CONF=conf_b))  # fmt: skip
        want = "would leave 1 runs being stopped on the recorded one that it does not list (jobs 1)"
        assert want in err, err
        log = tmp_path / "b.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [GPULEDGER, "serve", "--store", pg_store, "--listen", f"127.0.0.1:{free_port()}",
                 *args, "--new-settings", "--abandon-runs"],
                env=env_for(tmp_path / "b", SLURM_CONF=conf_b), stdout=out, stderr=out,
            )  # fmt: skip
        waits.wait_for("the abandoning server to lead", lambda: "leading at epoch" in text() or
                       proc.poll() is not None, 120, text)  # fmt: skip
        assert proc.poll() is None and "internal error" not in text(), text()
        assert "leaves 1 runs being stopped on the recorded one" in text(), text()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        _clear(conf_a, home.parent)


def test_a_copy_landed_on_another_cluster_runs_nothing_when_the_leader_died_before_its_check(
    tmp_path: Path, pg_store: str
) -> None:
    """atk45ha F4: B's slurmctld is swapped for C's (B's config, another `StateSaveLocation`)
    during the leader's `sbatch` (slowed by a site cli_filter), and the leader is killed (kill
    -9) before its landing check (`Watch.landed`) runs: the orphaned `sbatch` lands on C, and
    nobody cancels it there. Before, C ran the job's command, out of the ledger's reach (a
    second copy once the next leader submitted the run on B). Now the batch script asks which
    cluster started it before anything of the job's, and ends with exit 123 on C: the command
    never runs there."""
    b = CLUSTERS["b"]
    _answering(b.conf)
    home = _reachable_home()
    cli(home, "init", "--admin", "root", "--store", pg_store)
    (tmp_path / "budget.toml").write_text(BUDGET)
    cli(home, "budget", "apply", str(tmp_path / "budget.toml"), GPULEDGER_USER="root")
    flag = tmp_path / "slow-sbatch"
    slow = _slow_sbatch_conf(b.conf, home.parent / "slow", flag)
    ran = home.parent / "ran"  # the command's own trace, wherever it runs
    ran.mkdir()
    ran.chmod(0o1777)
    log = tmp_path / "s0.log"
    text = lambda: log.read_text(errors="replace")  # noqa: E731
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [GPULEDGER, "serve", "--store", pg_store, "--listen", f"127.0.0.1:{free_port()}",
             "--lease", "5s", "--executor", "slurm", "--partition", PARTITION, "--run-as",
             "service", "--interval", "0.5s"], env=env_for(home, SLURM_CONF=slow),
            stdout=out, stderr=out,
        )  # fmt: skip
    state_c = Path(tempfile.mkdtemp(prefix="gpuledger-ha-slurm-c-")) / "state"
    env_c = {**os.environ, "SLURM_CONF": str(state_c.parent / "slurm.conf")}
    ctld_c: subprocess.Popen[bytes] | None = None
    orphan: list[int] = []
    try:
        waits.wait_for("B's node", lambda: b.node in _nodes(home), 90, text)
        flag.write_text("15\n")
        cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--", "sh", "-c",
            f'echo "$SLURM_JOB_ID" >> {ran}/job-1; sleep 600', GPULEDGER_USER="alice")  # fmt: skip

        def in_flight() -> bool:  # its own child (other runs submit a job 1 too)
            done = subprocess.run(["pgrep", "-P", str(proc.pid), "-f",
                                   "sbatch --job-name=gpuledger-1 "],
                                  capture_output=True, text=True, check=False)  # fmt: skip
            orphan[:] = [int(p) for p in done.stdout.split()]
            return bool(orphan)

        waits.wait_for("the leader's sbatch of job 1", in_flight, 60, text)
        ctld_c = _controller_in_place(b.data, state_c)  # C answers in B's controller's place
        proc.kill()  # kill -9 before its sbatch returns: no landing check, no cancel on C
        proc.wait(timeout=60)

        def on_c() -> list[str]:
            done = subprocess.run(["scontrol", "-o", "show", "job"], env=env_c, text=True,
                                  capture_output=True, timeout=60, check=False)  # fmt: skip
            return [ln for ln in done.stdout.splitlines() if " JobName=gpuledger-1 " in ln]

        def ended_on_c() -> bool:  # (or its command ran: the code before)
            return (ran / "job-1").exists() or any(
                re.search(r"JobState=(FAILED|COMPLETED|CANCELLED)", ln) for ln in on_c()
            )

        waits.wait_for("the orphaned sbatch's copy on C to end", ended_on_c, 180,
                       lambda: f"{on_c()}\n{text()[-2000:]}")  # fmt: skip
        copies = on_c()
        assert not (ran / "job-1").exists(), (copies, (ran / "job-1").read_text())
        assert len(copies) == 1 and "ExitCode=123:0" in copies[0], copies
        assert "StartTime=Unknown" not in copies[0], copies  # C started it: its script refused
    finally:
        flag.unlink(missing_ok=True)
        for pid in orphan:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        if ctld_c is not None:
            subprocess.run(["scancel", "--partition", PARTITION], env=env_c, capture_output=True,
                           timeout=60, check=False)  # fmt: skip
            ctld_c.kill()
            ctld_c.wait(timeout=30)
        _slurm(b.data, b.ctld, b.slurmd, b.node, "up")
        _answering(b.conf)
        _clear(b.conf, home.parent)
        shutil.rmtree(state_c.parent, ignore_errors=True)
