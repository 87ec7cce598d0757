"""`gpuledger up`: one machine, one command. By default the server (`serve --executor agents`: the
service loop behind the HTTP API, on the data directory's Unix socket and a loopback port) and a
local node agent per node in this process (`ledger.agent.local`), so a laptop runs what a cluster
runs; `--executor local` runs the service loop with the supervised executor inside it (no API);
`--executor slurm --partition P` runs the placed jobs on a Slurm partition (docs/slurm.md). With
`--kafka` a relay thread publishes the log for other readers.

Stopping it (Ctrl-C, SIGTERM, or kill -9) leaves jobs running under their supervisors; the next
`up` adopts them before taking work and records the exits that happened meanwhile."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ledger.cli._common import Ctx, pass_ctx
from ledger.cli.output import echo_json, log_level_option, setup_logging
from ledger.cycle.executor import ServiceExecutor
from ledger.cycle.loop import ServiceLoop, make_policy
from ledger.dispatch import registry
from ledger.engines.gpu_util import pick_source
from ledger.engines.supervised import DEBUG_LIMIT_S, SupervisedExecutor
from ledger.store.clock import SystemClock
from schemas import commands as c
from schemas.errors import InvalidCommand
from schemas.units import format_time, parse_duration, parse_interval


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
    type=click.Choice(["local", "agent", "slurm"]),
    default="agent",
    show_default=True,
    help="Run placed jobs as local processes; or serve the API and run them through a local "
    "node agent per node (agent); or as Slurm jobs on --partition.",
)
@click.option(
    "--partition",
    envvar="GPULEDGER_SLURM_PARTITION",
    default=None,
    help="The Slurm partition gpu-ledger owns (with --executor slurm).",
)
@click.option("--until-idle", is_flag=True, help="Exit once nothing is pending or running.")
@click.option("--for", "run_for", default=None, help="Exit after this long (e.g. 10m).")
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
    log_level: str,
) -> None:
    """Run the service on this machine: the server and a local node agent per node (every cycle
    snapshots, decides, appends; the agents run placed jobs with CUDA_VISIBLE_DEVICES set to
    their GPUs), or the loop alone with local processes or Slurm jobs. Stopping it leaves jobs
    running."""
    setup_logging(log_level)
    log = logging.getLogger("gpuledger.up")
    clock = SystemClock()
    ledger = ctx.ledger(live=True)
    _register_nodes(ctx, nodes)
    _check_other_mode(ctx.home, executor_name)
    deadline = None if run_for is None else clock.now() + parse_duration(run_for)
    if executor_name == "agent":
        _up_with_agents(
            ctx, interval, grace, run_as, debug_limit, sample_every, utilisation_dir,
            squat_after, policy, margin, debug_lane, kafka, until_idle, deadline, log_level,
        )  # fmt: skip
        return
    executor: ServiceExecutor
    if executor_name == "local":
        util = pick_source(utilisation_dir or ctx.home / "utilisation")
        executor = SupervisedExecutor(
            ctx.home / "agent",
            ctx.home / "jobs",
            grace_s=parse_duration(grace),
            run_as="service" if run_as == "service" else "submitter",
            debug_limit_s=parse_duration(debug_limit),
            util=util,
            sample_every_s=parse_interval(sample_every, "--sample-every"),
            extra_env={"GPULEDGER_HOME": str(ctx.home.resolve())},
        )
        log.info("utilisation: %s", util.name)
    else:
        from ledger.engines.slurm import open_executor

        executor = open_executor(
            ledger, partition, ctx.home / "jobs", parse_duration(grace), ctx.actor
        )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    tick = parse_interval(interval)
    loop = ServiceLoop(
        ledger,
        executor,
        make_policy(policy, margin, debug_lane, parse_duration(squat_after)),
        kafka=kafka,
        log=log,
        lifecycle_dir=ctx.home / "jobs",
    )
    loop.open()  # scheduling reads the store; with --kafka a relay publishes it
    try:
        loop.record_settings(float(tick), executor_name)
        log.info("up: %s, %d nodes, policy %s", ctx.home, len(ledger.state.nodes), policy)
        log.info("job output goes to %s/job-N.log", ctx.home / "jobs")
        loop.run(stop, tick, until_idle=until_idle, deadline=deadline)
    finally:
        # supervised jobs keep running (the next `up` adopts them); Slurm's run on
        stop.set()
        loop.close(stop_jobs=True)


def _check_other_mode(home: Path, executor: str) -> None:
    """`up`'s local agents (HOME/agents/NODE) and its local executor (HOME/agent) keep their
    runs apart: one may not start while the other's runs are unfinished (it would not know them,
    and would launch them again or call them lost)."""
    from ledger.engines.supervised import handled_jobs

    if executor == "slurm":
        return
    others = [home / "agent"] if executor == "agent" else sorted((home / "agents").glob("*"))
    held = sorted({j for d in others for j in handled_jobs(d)})
    if held:
        other = "local" if executor == "agent" else "agent"
        raise InvalidCommand(
            f"jobs {', '.join(map(str, held))} run under `up --executor {other}`",
            hint=f"keep using `gpuledger up --executor {other}` until they end",
        )


def _up_with_agents(
    ctx: Ctx,
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
    until_idle: bool,
    deadline: float | None,
    log_level: str,
) -> None:
    """`up --executor agent`: the server (Unix socket and a loopback port) and one node agent
    per node in this process (`ledger.agent.local`); exits as `serve` does."""
    from ledger.agent import local
    from ledger.server.run import serve as run_server
    from ledger.wire import config as cfg

    clock = SystemClock()
    ledger = ctx.ledger(live=True)
    nodes = {
        name: (n.gpus, n.gpu_type) for name, n in ledger.state.nodes.items() if n.state != "removed"
    }
    tokens = {name: local.node_token(ledger, name, ctx.actor, clock.now()) for name in nodes}
    util = pick_source(utilisation_dir or ctx.home / "utilisation")
    agents = local.LocalAgents(
        ctx.home,
        nodes,
        tokens,
        local.LocalSettings(
            grace_s=parse_duration(grace),
            run_as=run_as,
            debug_limit_s=parse_duration(debug_limit),
            sample_every_s=parse_interval(sample_every, "--sample-every"),
            util=util,
        ),
    )

    said: list[bool] = []

    def done(service: ServiceLoop) -> bool:
        if until_idle and service.idle():
            if not said:
                logging.getLogger("gpuledger.up").info("nothing pending or running: exiting")
                said.append(True)
            return True
        return deadline is not None and clock.now() >= deadline

    config = cfg.merge(
        cfg.ServeConfig(),
        listen="127.0.0.1:0",
        interval=interval,
        policy=policy,
        margin=margin,
        debug_lane=debug_lane,
        squat_after=squat_after,
        executor="agents",
        kafka=kafka or "",
        log_level=log_level.upper(),
    )
    start = local.companion(agents, done if until_idle or deadline is not None else None)

    def begin(worker: Any, urls: list[str], stop: Callable[[], None]) -> Callable[[], None]:
        log = logging.getLogger("gpuledger.up")
        log.info("up: %s, %d nodes, policy %s, local agents", ctx.home, len(nodes), policy)
        log.info("job output goes to %s/job-N.log", ctx.home / "jobs")
        return start(worker, urls, stop)

    sys.exit(
        run_server(ctx.home, config, ctx.actor, companion=begin, lifecycle_dir=ctx.home / "jobs")
    )


def _register_nodes(ctx: Ctx, nodes: tuple[str, ...]) -> None:
    ledger = ctx.ledger(live=True)
    cmds: list[c.AnyCommand] = []
    for text in nodes:
        name, gpus, gpu_type = _node_spec(text)
        have = ledger.state.nodes.get(name)
        if have is None or have.state == "removed":
            cmds.append(c.RegisterNode(actor=ctx.actor, node=name, gpus=gpus, gpu_type=gpu_type))
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
    type=click.Choice(["none", "local", "agents", "slurm"]),
    default=None,
    help="agents: node agents run placements; local: run them here, like `up`; "
    "slurm: run them as Slurm jobs on --partition; none: only record them [default].",
)
@click.option(
    "--partition",
    default=None,
    help="The Slurm partition gpu-ledger owns (with --executor slurm).",
)
@click.option(
    "--node-lost-after",
    default=None,
    help="With agents: mark a node lost after its agent is silent this long [60s].",
)
@click.option("--kafka", default=None, help="Kafka bootstrap HOST:PORT for the relay.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None)
@click.option("--log-level", default=None)
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
    partition: str | None,
    node_lost_after: str | None,
    kafka: str | None,
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
        partition=partition,
        node_lost_after=node_lost_after,
        kafka=kafka,
        log_format=log_format,
        log_level=log_level,
    )
    setup_logging(config.log_level, config.log_format)
    sys.exit(run_server(ctx.home, config, actor=ctx.actor))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def status(ctx: Ctx, as_json: bool) -> None:
    """Is the server up? Version, last cycle, projection and relay lag, event count."""
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
    relay = "no Kafka" if h.relay_lag is None else f"{h.relay_lag} events, {h.relay_state}"
    if h.relay_error:
        relay += f": {h.relay_error}"
    click.echo(f"{h.status}: gpu-ledger {h.version} at {ctx.remote.url}")
    click.echo(f"  events        {h.head}")
    click.echo(f"  last cycle    {last}, {h.cycles} cycles")
    click.echo(f"  projection    lag {h.projection_lag} events")
    click.echo(f"  relay         lag {relay}")
    if h.last_error:
        click.echo(f"  last error    {h.last_error}")


COMMANDS = [up, serve, status]
