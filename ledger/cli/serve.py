"""`gpuledger up`: the service on the embedded default (ledger, projector, dispatcher loop,
LocalExecutor), or fed by Kafka with `--kafka`."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path

import click

from ledger.cli._common import Ctx, echo_json, fmt_time, parse_duration, pass_ctx
from ledger.clock import SystemClock
from ledger.dispatch import registry
from schemas import commands as c
from schemas.errors import InvalidCommand


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
    "--grace", default="30s", show_default=True, help="SIGTERM-to-SIGKILL grace on preemption."
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
    help="Bootstrap HOST:PORT: relay the log to Kafka and feed the projection from it.",
)
@click.option("--until-idle", is_flag=True, help="Exit once nothing is pending or running.")
@click.option("--for", "run_for", default=None, help="Exit after this long (e.g. 10m).")
@click.option("--log-level", default="INFO", show_default=True)
@pass_ctx
def up(
    ctx: Ctx,
    nodes: tuple[str, ...],
    interval: str,
    grace: str,
    policy: str,
    margin: float,
    debug_lane: bool,
    kafka: str | None,
    until_idle: bool,
    run_for: str | None,
    log_level: str,
) -> None:
    """Run the service: every cycle snapshots, decides, appends, and runs placed jobs as local
    processes with CUDA_VISIBLE_DEVICES set to their GPUs."""
    from ledger.executors import LocalExecutor
    from ledger.loop import ServiceLoop, make_policy, wait_time

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    log = logging.getLogger("gpuledger.up")
    clock = SystemClock()
    ledger = ctx.ledger()
    _register_nodes(ctx, nodes)
    executor = LocalExecutor(ctx.home / "jobs", grace_s=parse_duration(grace))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    deadline = None if run_for is None else clock.now() + parse_duration(run_for)
    tick = parse_duration(interval) or 1
    loop = ServiceLoop(
        ledger, executor, make_policy(policy, margin, debug_lane), kafka=kafka, log=log
    )
    loop.open()
    loop.record_settings(float(tick), "local")
    log.info("up: %s, %d nodes, policy %s", ctx.home, len(ledger.state.nodes), policy)
    try:
        while not stop.is_set():
            now = clock.now()
            result = loop.step(now)
            if until_idle and loop.idle():
                log.info("nothing pending or running: exiting")
                break
            if deadline is not None and now >= deadline:
                break
            stop.wait(wait_time(result, tick, clock.now()))
    finally:
        # `up` runs jobs as its own children: they stop with it and their exits are recorded
        loop.close(stop_jobs=True)


def _register_nodes(ctx: Ctx, nodes: tuple[str, ...]) -> None:
    ledger = ctx.ledger()
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
    "--executor",
    type=click.Choice(["none", "local"]),
    default=None,
    help="none: node agents run placements [default]; local: run them here, like `up`.",
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
    executor: str | None,
    kafka: str | None,
    log_format: str | None,
    log_level: str | None,
) -> None:
    """The ledger server: the single writer of the data directory, with an authenticated HTTP
    API (bearer tokens over TCP, OS users over its Unix socket) for every command and read."""
    from ledger.server import config as cfg
    from ledger.server.run import serve as run_server

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
        executor=executor,
        kafka=kafka,
        log_format=log_format,
        log_level=log_level,
    )
    sys.exit(run_server(ctx.home, config))


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
        else f"{fmt_time(h.last_cycle_at)} ({(h.last_cycle_s or 0) * 1000:.0f} ms)"
    )
    relay = "no Kafka" if h.relay_lag is None else f"{h.relay_lag} events"
    click.echo(f"{h.status}: gpu-ledger {h.version} at {ctx.remote.url}")
    click.echo(f"  events        {h.head}")
    click.echo(f"  last cycle    {last}, {h.cycles} cycles")
    click.echo(f"  projection    lag {h.projection_lag} events")
    click.echo(f"  relay         lag {relay}")
    if h.last_error:
        click.echo(f"  last error    {h.last_error}")


COMMANDS = [up, serve, status]
