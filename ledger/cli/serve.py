"""`gpuledger up` and `gpuledger serve`: flags into a `ServeConfig`, then the one composition
root (`ledger.server.run.serve`); and `gpuledger status`.

`up` is `serve` on the data directory's Unix socket (TCP only with `--listen`) with a local
executor: by default a node agent per node in this process (`ledger.agent.local`), so a laptop
runs what a cluster runs; `--executor local` runs jobs through the supervised executor inside
the service, `--executor slurm --partition P` on a Slurm partition (docs/slurm.md). With
`--kafka` a relay thread publishes the log for other readers.

Stopping it (Ctrl-C, SIGTERM, or kill -9) leaves jobs running under their supervisors; the next
`up` adopts them before taking work and records the exits that happened meanwhile."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ledger.cli._common import Ctx, pass_ctx
from ledger.cli.output import LOG_LEVELS, echo_json, log_level_option, setup_logging
from ledger.dispatch import registry
from ledger.engines.supervised import DEBUG_LIMIT_S
from schemas import commands as c
from schemas.api import SILENT_S
from schemas.errors import InvalidCommand, LedgerError
from schemas.units import format_time, parse_duration

if TYPE_CHECKING:
    from schemas.api import Health

EXECUTORS = {"agents": "agents", "agent": "agents", "local": "local", "slurm": "slurm"}
"""`up --executor` -> the server's executor (`agents`: the node agents `up` runs; `agent` is the
same, the name earlier versions used)."""


def _node_spec(text: str) -> tuple[str, int, str]:
    name, _, rest = text.partition(":")
    gpus, _, gpu_type = rest.partition(":")
    if not name or not gpus.isdigit():
        raise InvalidCommand(
            f"invalid node {text!r}", hint="use NAME:GPUS[:TYPE], e.g. local:4:h100"
        )
    return name, int(gpus), gpu_type or "gpu"


@click.command()
@click.option(
    "--node", "nodes", multiple=True, help="Register NAME:GPUS[:TYPE] if missing (repeatable)."
)
@click.option("--interval", default="2s", show_default=True, help="Time between dispatcher cycles.")
@click.option(
    "--grace",
    default="30s",
    show_default=True,
    help="SIGTERM-to-SIGKILL grace when a job is stopped (a job's own --grace wins).",
)
@click.option(
    "--run-as",
    type=click.Choice(["submitter", "service"]),
    default="submitter",
    envvar="GPULEDGER_RUN_AS",
    show_default=True,
    help="As root: run jobs as the submitting OS user, or as the service's own user.",
)
@click.option(
    "--debug-limit",
    default=f"{DEBUG_LIMIT_S}s",
    show_default=True,
    help="Debug-lane jobs are stopped after at most this long.",
)
@click.option(
    "--sample-every", default="30s", show_default=True, help="GPU utilisation sampling period."
)
@click.option(
    "--utilisation-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Test source of utilisation when NVML is absent (default: HOME/utilisation).",
)
@click.option(
    "--squat-after",
    default="1h",
    show_default=True,
    help="Past its contract, a job idle this long is squatting (a preemption victim).",
)
@click.option(
    "--policy",
    type=click.Choice(["fairshare", "fifo"]),
    default=registry.DEFAULT,
    show_default=True,
)
@click.option("--margin", type=float, default=0.1, show_default=True, help="Preemption hysteresis.")
@click.option("--debug-lane/--no-debug-lane", default=True, show_default=True)
@click.option(
    "--kafka",
    "kafka",
    envvar="GPULEDGER_KAFKA",
    default=None,
    help="Bootstrap HOST:PORT: relay the log to Kafka for other readers (`relay status`).",
)
@click.option(
    "--executor",
    "executor_name",
    type=click.Choice(["agents", "local", "slurm", "agent"]),
    default="agents",
    show_default=True,
    help="Run placed jobs as local processes; or serve the API and run them through a local "
    "node agent per node (agents, as `serve --executor agents`; `agent` is the same); or as "
    "Slurm jobs on --partition.",
)
@click.option(
    "--partition",
    envvar="GPULEDGER_SLURM_PARTITION",
    default=None,
    help="The Slurm partition gpu-ledger owns (with --executor slurm).",
)
@click.option("--until-idle", is_flag=True, help="Exit once nothing is pending or running.")
@click.option("--for", "run_for", default=None, help="Exit after this long (e.g. 10m).")
@click.option(
    "--listen",
    default=None,
    help="HOST:PORT: serve the HTTP API on TCP too (default: the Unix socket only).",
)
@log_level_option
@pass_ctx
def up(
    ctx: Ctx,
    nodes: tuple[str, ...],
    interval: str,
    grace: str,
    run_as: str,
    debug_limit: str,
    sample_every: str,
    utilisation_dir: Path | None,
    squat_after: str,
    policy: str,
    margin: float,
    debug_lane: bool,
    kafka: str | None,
    executor_name: str,
    partition: str | None,
    until_idle: bool,
    run_for: str | None,
    listen: str | None,
    log_level: str,
) -> None:
    """Run the service on this machine: the server on the data directory's socket and a local
    node agent per node (every cycle snapshots, decides, appends; the agents run placed jobs
    with CUDA_VISIBLE_DEVICES set to their GPUs), or local processes or Slurm jobs instead of
    the agents. Stopping it leaves jobs running."""
    from ledger.server.run import Up
    from ledger.server.run import serve as run_server
    from ledger.wire import config as cfg

    setup_logging(log_level)
    for_s = None if run_for is None else parse_duration(run_for)
    ctx.ledger(live=True)  # the data directory's own (refused beside a running server)
    cfg.check_grace(cfg.merge(cfg.ServeConfig(), grace=grace).grace.seconds)  # before any node
    _register_nodes(ctx, nodes)
    config = cfg.merge(
        cfg.ServeConfig(),
        listen=listen or "",
        interval=interval,
        policy=policy,
        margin=margin,
        debug_lane=debug_lane,
        squat_after=squat_after,
        executor=EXECUTORS[executor_name],
        partition=partition,
        grace=grace,
        run_as=run_as,
        debug_limit=debug_limit,
        sample_every=sample_every,
        utilisation_dir=None if utilisation_dir is None else str(utilisation_dir),
        kafka=kafka or "",
        log_level=log_level.upper(),
    )
    up_ = Up(until_idle=until_idle, for_s=for_s)
    sys.exit(run_server(ctx.home, config, ctx.own_actor, up=up_))


def _register_nodes(ctx: Ctx, nodes: tuple[str, ...]) -> None:
    ledger = ctx.ledger(live=True)
    cmds: list[c.AnyCommand] = []
    for text in nodes:
        name, gpus, gpu_type = _node_spec(text)
        have = ledger.state.nodes.get(name)
        if have is None or have.state == "removed":
            cmd = c.RegisterNode(actor=ctx.own_actor, node=name, gpus=gpus, gpu_type=gpu_type)
            cmds.append(cmd)
    if cmds:
        ledger.execute_all(cmds)


@click.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="GPULEDGER_CONFIG",
    default=None,
    help="TOML config file (every key: examples/serve.toml); flags override it.",
)
@click.option("--listen", default=None, help="HOST:PORT of the HTTP API [127.0.0.1:8470].")
@click.option("--socket", "socket_path", default=None, help="Unix socket [<home>/gpuledger.sock].")
@click.option("--tls-cert", default=None, help="PEM certificate: serve HTTPS.")
@click.option("--tls-key", default=None, help="PEM private key of --tls-cert.")
@click.option("--interval", default=None, help="Time between dispatcher cycles [2s].")
@click.option("--policy", type=click.Choice(["fairshare", "fifo"]), default=None)
@click.option("--margin", type=float, default=None, help="Preemption hysteresis [0.1].")
@click.option("--debug-lane/--no-debug-lane", default=None)
@click.option(
    "--squat-after", default=None, help="Past its contract, a job idle this long squats [1h]."
)
@click.option(
    "--executor",
    type=click.Choice(["none", "record", "local", "agents", "slurm"]),
    default=None,
    help="agents: node agents run placements; local: run them here, like `up`; "
    "slurm: run them as Slurm jobs on --partition; record: only record placements (nothing "
    "runs); none: place nothing [default].",
)
@click.option(
    "--run-as",
    type=click.Choice(["submitter", "service"]),
    default=None,
    help="submitter: each job as its owner's OS account (uid min_uid-max_uid) [default]; "
    "service: every job as the service's own account.",
)
@click.option(
    "--partition",
    default=None,
    help="The Slurm partition gpu-ledger owns (with --executor slurm).",
)
@click.option(
    "--slurm-jobs-dir",
    default=None,
    help="With --executor slurm: the runs' directories (batch scripts, marks), one every "
    "server of a store and the nodes see at this path (docs/ha.md) [<home>/jobs].",
)
@click.option(
    "--node-lost-after",
    default=None,
    help="With agents: mark a node lost after its agent is silent this long [60s].",
)
@click.option(
    "--node-fence",
    default=None,
    help="With agents or Slurm: how long a lost node's runs stay in doubt before they end [5m].",
)
@click.option(
    "--grace",
    default=None,
    help="SIGTERM-to-SIGKILL grace when a job is stopped (a job's own --grace wins) [30s].",
)
@click.option("--kafka", default=None, help="Kafka bootstrap HOST:PORT for the relay.")
@click.option(
    "--store",
    default=None,
    metavar="DSN",
    help="The log's PostgreSQL store (postgresql://...): several servers may serve it, one "
    "leading (docs/ha.md) [the SQLite file in the data directory].",
)
@click.option("--advertise", default=None, help="The URL others reach this server at.")
@click.option("--lease", default=None, help="The leader's lease on a PostgreSQL store [5s].")
@click.option(
    "--new-settings",
    is_flag=True,
    default=None,
    help="With --store: record this server's settings (lease, node-lost timeout, fence, "
    "executor, policy) in place of the store's when it takes the lease; once nobody leads "
    "(docs/ha.md).",
)
@click.option(
    "--abandon-runs",
    is_flag=True,
    default=None,
    help="With --new-settings onto another Slurm cluster: record lost the runs the ledger "
    "holds that the new cluster does not list (they run on, unaccounted, on the recorded "
    "one until a server talks to it again, which stops them; placed ones are submitted "
    "again); without it such a change is refused (docs/ha.md).",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None)
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default=None)
@pass_ctx
def serve(
    ctx: Ctx,
    config_file: Path | None,
    listen: str | None,
    socket_path: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    interval: str | None,
    policy: str | None,
    margin: float | None,
    debug_lane: bool | None,
    squat_after: str | None,
    executor: str | None,
    run_as: str | None,
    partition: str | None,
    slurm_jobs_dir: str | None,
    node_lost_after: str | None,
    node_fence: str | None,
    grace: str | None,
    kafka: str | None,
    store: str | None,
    advertise: str | None,
    lease: str | None,
    new_settings: bool | None,
    abandon_runs: bool | None,
    log_format: str | None,
    log_level: str | None,
) -> None:
    """The ledger server: the single writer of the data directory, with an authenticated HTTP
    API (bearer tokens over TCP, OS users over its Unix socket) for every command and read."""
    from ledger.server.run import serve as run_server
    from ledger.wire import config as cfg

    config = cfg.merge(
        cfg.load(config_file),
        listen=listen,
        socket=socket_path,
        tls_cert=tls_cert,
        tls_key=tls_key,
        interval=interval,
        policy=policy,
        margin=margin,
        debug_lane=debug_lane,
        squat_after=squat_after,
        executor=executor,
        run_as=run_as,
        partition=partition,
        slurm_jobs_dir=slurm_jobs_dir,
        node_lost_after=node_lost_after,
        node_fence=node_fence,
        grace=grace,
        kafka=kafka,
        store=store,
        advertise=advertise,
        lease=lease,
        new_settings=new_settings or None,
        abandon_runs=abandon_runs or None,
        log_format=log_format,
        log_level=log_level,
    )
    setup_logging(config.log_level, config.log_format)
    if store and _has_password(store):
        logging.getLogger("gpuledger.server").warning(
            "the PostgreSQL password in --store is readable by every local user (ps, "
            "/proc/PID/cmdline): leave it out of the DSN and put it in a PGPASSFILE "
            "(libpq's ~/.pgpass), or give the DSN as the config key `store` (docs/security.md)"
        )
    sys.exit(run_server(ctx.home, config, actor=ctx.own_actor))  # never $GPULEDGER_URL's


def _relay_lag(h: Health) -> str:
    """The relay's lag as `relay status` tells it (`relay_health.lag_kind`): exact only where
    the relay watches its topic; "lag 0 events, connecting" was shown while it wrote the log
    again to a topic found deleted (s51)."""
    from ledger.store.relay_health import WATCHING, lag_kind

    lag = int(h.relay_lag or 0)
    kind = lag_kind(lag, h.relay_state in WATCHING)
    if kind == "exact":
        return f"{lag} events"
    if kind == "floor":
        return f"at least {lag} events (the relay is not watching its topic)"
    return "unknown (the relay is not watching its topic, which may lack events)"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def status(ctx: Ctx, as_json: bool) -> None:
    """Is the server up? Version, last cycle, projection and relay lag, event count; with
    several servers on one store, this one's role, the leader and every server's lag."""
    from schemas.api import Health

    if ctx.remote is None:
        if as_json:
            echo_json({"status": "down", "home": str(ctx.home)})
        else:
            click.echo(f"down: no server answers on {ctx.home} (and GPULEDGER_URL is not set)")
        sys.exit(3)
    h = ctx.remote.get("health", type=Health)
    if as_json:
        echo_json(h)
        return
    last = (
        "no cycle yet"
        if h.last_cycle_at is None
        else f"{format_time(h.last_cycle_at)} ({(h.last_cycle_s or 0) * 1000:.0f} ms)"
    )
    relay = "no Kafka" if h.relay_lag is None else f"{_relay_lag(h)}, {h.relay_state}"
    if h.relay_lag is None and h.relay_state is not None:  # a standby told no position
        relay = f"unknown, {h.relay_state}"
    if h.relay_error:
        relay += f": {h.relay_error}"
    click.echo(f"{h.status}: gpu-ledger {h.version} at {ctx.remote.url}")
    click.echo(f"  events        {h.head}")
    click.echo(f"  last cycle    {last}, {h.cycles} cycles")
    click.echo(f"  projection    lag {h.projection_lag} events")
    click.echo(f"  relay         lag {relay}")
    if h.executor:
        placing = "" if h.placing else ": nothing is placed, jobs wait (start it with an executor)"
        click.echo(f"  executor      {h.executor}{placing}")
    if h.jobs_run_as:
        click.echo(f"  jobs run as   {h.jobs_run_as}")
    if h.engine_note:
        click.echo(f"  engine        {h.engine_note}")
    if h.engine_away is not None:
        since = "" if h.engine_away_since is None else f" since {format_time(h.engine_away_since)}"
        click.echo(
            f"  outage        the {h.executor or 'engine'} executor is not open{since}: "
            f"{h.engine_away}; nothing is placed until it opens"
        )
    if h.unobserved:
        since = "" if h.unobserved_since is None else f" since {format_time(h.unobserved_since)}"
        said = f" ({h.unobserved_why})" if h.unobserved_why else ""
        click.echo(
            f"  outage        the engine cannot observe {', '.join(h.unobserved)}{since}{said}: "
            "nothing is placed on or preempted from them"
        )
    if h.last_error:
        click.echo(f"  last error    {h.last_error}")
    if h.store_error:
        said = h.store_error if "does not commit" in h.store_error else (
            f"{h.store} does not answer: {h.store_error}")  # fmt: skip
        click.echo(f"  store         {said}")
    if h.role != "single":  # one of several servers on a PostgreSQL store (docs/ha.md)
        silent = {s.address: s.seen_s_ago for s in h.servers if s.seen_s_ago > SILENT_S}
        leader = h.leader or "none"
        ago = silent.get(h.leader) if h.leader else None
        then = (f"nobody takes over once its lease expires: {h.no_taker}" if h.no_taker
                else "a standby takes over once its lease expires")  # fmt: skip
        why = [] if ago is None else [f"not heard from for {ago:.0f} s; {then}"]
        away = _leader_away(h, ctx.remote.url)
        if away:
            why.append(away)
        if why:
            leader += f" (does not answer: {'; '.join(why)})"
        elif h.leader and h.leader not in {s.address for s in h.servers}:
            leader += " (not heard from in the last minute)"
        click.echo(f"  role          {h.role}, epoch {h.epoch}, leader {leader}")
        if h.settings_error:
            click.echo(f"  settings      this server will not lead: {h.settings_error}")
        if h.address_error:
            click.echo(f"  address       this server will not lead: {h.address_error}")
        if h.older_servers:
            click.echo(f"  older         refused the lease (an earlier version): {h.older_servers};"
                       " upgrade them (docs/ha.md)")  # fmt: skip
        lease = _lease_line(h)
        if lease:
            click.echo(f"  lease         {lease}")
        for s in h.servers:
            quiet = f", not heard from for {s.seen_s_ago:.0f} s" if s.address in silent else ""
            # only the lease's holder leads (a server of before this said "leader" for any
            # server whose last report did)
            role = s.role if s.role != "leader" else "ex-leader"
            role = "leader" if s.address == h.leader else role
            click.echo(f"  server        {s.address} {role}, lag {s.lag} events{quiet}")


PROBE_S = 2.0
"""How long `status`, answered by a standby, waits for the leader's own health answer."""


def _lease_line(h: Health) -> str:
    """The leader's lease in words: its length, its last renewal, when it expires (or how long
    ago it ran out without anyone taking it: a leader that stopped renewing)."""
    left, ago = h.lease_expires_in_s, h.lease_renewed_s_ago
    if left is None or not h.lease_s:
        return ""
    renewed = "" if ago is None else f", renewed {ago:.1f} s ago"
    # this server's own link failing lately (`store_seen.store_trouble`), not the store away:
    # its view of the row is as old as its last read, never the leader's fault (atk45ha F3)
    lately = (h.store_error or "").startswith("a lease statement ")
    if h.store_error and not lately:  # nobody can lead meanwhile (atk33-28 F6, F10)
        return f"{h.lease_s:g} s{renewed}: nobody leads until the store answers and commits"
    read = h.lease_read_s_ago
    if read is not None and read > h.lease_s / 3 + 1.0:
        return (f"{h.lease_s:g} s{renewed} as this server last read it, {read:.1f} s ago: its "
                "own link to the store fails (the `store` line); the leader's renewals are not "
                "seen from here")  # fmt: skip
    if left < 0:
        then = ("a standby takes it at its next try" if not h.no_taker else
                f"no server takes it: {h.no_taker}; start one with the recorded settings "
                "(docs/ha.md)")  # fmt: skip
        return (f"{h.lease_s:g} s{renewed}, expired {-left:.1f} s ago: the leader does not "
                f"renew it (down, paused or cut off from the store); {then}")  # fmt: skip
    every = h.lease_s / 3
    late = (f" (late: the leader renews every {every:.1f} s)"
            if ago is not None and ago > every + 1.0 else "")  # fmt: skip
    return f"{h.lease_s:g} s{renewed}, expires in {left:.1f} s{late}"


def _leader_away(h: Health, asked: str) -> str:
    """Why the leader does not answer its own health check ("" when it does, or when the
    server asked is the leader): a standby's word on the lease is a second's old."""
    if h.role != "standby" or not h.leader or h.leader == asked:
        return ""
    from ledger.wire.client import Client
    from schemas.api import Health

    client = Client(h.leader, timeout=PROBE_S)
    try:
        client.get("health", type=Health)
    except LedgerError as err:
        return err.message
    finally:
        client.close()
    return ""


COMMANDS = [up, serve, status]


def _has_password(dsn: str) -> bool:
    """Whether a DSN carries a password (then anyone who can read the argv can read it)."""
    from ledger.store.pgread import connect_params

    try:
        return bool(connect_params(dsn).get("password"))
    except Exception:
        return False  # an invalid DSN is refused later, in one line
