"""`gpuledger agent`: the node agent (runs this node's parts of placements), `agent status`, and
`agent --drain`. Thin: the agent itself is `ledger.agent.node`."""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path

import click

from ledger.agent import config as cfg
from ledger.cli.output import echo_json, setup_logging
from ledger.store.clock import SystemClock
from ledger.wire.config import check_grace
from schemas.errors import InvalidCommand
from schemas.units import format_time

_now = SystemClock().now


def _token(config: cfg.AgentConfig) -> str:
    if config.token:
        return config.token.strip()
    if not config.token_file:
        raise InvalidCommand(
            "the agent needs its node token",
            hint="pass --token (or token_file in its config): gpuledger token create --node NAME",
        )
    path = Path(config.token_file)
    try:
        st = path.stat()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InvalidCommand(
                f"{path} is readable by others", hint=f"run `chmod 600 {path}` (it holds a secret)"
            )
        return path.read_text().strip()
    except OSError as err:
        raise InvalidCommand(f"cannot read token file {path}: {err.strerror}") from err


def _gpus(config: cfg.AgentConfig) -> tuple[int, str, str]:
    """(count, type, where they came from): flags/config win, else NVML."""
    from ledger.agent.host import gpus_from_nvml

    found = None if config.gpus and config.gpu_type else gpus_from_nvml()
    count = config.gpus or (found[0] if found else 0)
    if count <= 0:
        raise InvalidCommand(
            "no GPU count: NVML is absent here", hint="pass --gpus N (and --gpu-type TYPE)"
        )
    gpu_type = config.gpu_type or (found[1] if found else "") or "gpu"
    source = "flags" if config.gpus else "NVML"
    return count, gpu_type, source


def _run(config: cfg.AgentConfig, drain: bool) -> int:
    from ledger.agent.host import hold_node, short_hostname
    from ledger.agent.lease import jobs_may_not_enter, others_may_write
    from ledger.agent.node import LEASE_FILE, STATUS_FILE, NodeAgent, Settings
    from ledger.engines.gpu_util import pick_source
    from ledger.engines.supervised import SupervisedExecutor

    check_grace(config.grace.seconds)  # before anything starts, as serve/up (atk49-23)
    setup_logging(config.log_level, config.log_format)
    import logging

    log = logging.getLogger("gpuledger.agent")
    if not config.url:
        raise InvalidCommand("the agent needs the server's URL", hint="pass --url http://HOST:PORT")
    node = config.node or short_hostname()
    count, gpu_type, source = _gpus(config)
    state = Path(config.state_dir)
    foreign = others_may_write(state, os.geteuid())
    if foreign:
        raise InvalidCommand(
            f"the agent's state directory is not its own: {foreign}",
            hint="use a directory only the agent's account may write (chmod go-w)",
        )
    as_others = config.run_as == "submitter" and os.geteuid() == 0 and not drain
    closed = jobs_may_not_enter(state) if as_others else ""
    if closed:  # said, not refused: a job that never checkpoints still runs
        click.echo(
            f"warning: jobs run as their submitters cannot reach their checkpoint files in the "
            f"agent's state directory: {closed}; let other accounts pass through it (chmod o+x: "
            f"its runs stay private, 0711)",
            err=True,
        )
    hold_node(node, config.url, state)  # before anything is adopted or launched; held to the end
    util = pick_source(
        Path(config.utilisation_dir) if config.utilisation_dir else state / "utilisation"
    )
    executor = SupervisedExecutor(
        state,
        Path(config.log_dir) if config.log_dir else state / "jobs",
        grace_s=config.grace.seconds,
        run_as=config.run_as,
        debug_limit_s=config.debug_limit.seconds,
        util=util,
        sample_every_s=config.sample_every.seconds,
        extra_env={"GPULEDGER_URL": config.url},
        local_node=node,
        fork_supervisors=True,
        lease=state / LEASE_FILE,
    )
    settings = Settings(
        node=node,
        url=config.url,
        token=_token(config),
        gpus=count,
        gpu_type=gpu_type,
        gpu_source=source,
        address=config.address,
        heartbeat_s=config.heartbeat.seconds,
        poll_wait_s=min(30.0, config.poll_wait.seconds),
        check_every_s=config.check_every.seconds,
    )
    agent = NodeAgent(settings, executor, state / STATUS_FILE, util)
    try:
        if drain:
            n = agent.drain()
            click.echo(f"drained node {node}: stopped {n} job(s)")
            return 0
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: agent.stop_event.set())
        log.info(
            "agent for node %s: %d GPU(s) %s (%s), server %s, state %s, utilisation: %s",
            node, count, gpu_type, source, config.url, state, util.name,
        )  # fmt: skip
        if executor.containment.gpus_open:  # once, at start; `agent status` says it too
            log.warning("%s; docs/agent.md, GPU device files", executor.containment.gpus_open)
        if executor.adopted:
            log.info("adopted %d running job(s): %s", len(executor.adopted),
                     ", ".join(str(h.job_id) for h in executor.adopted))  # fmt: skip
        agent.run()
        log.info("stopped: %d job(s) keep running and will be adopted", len(executor.running()))
        return 0
    finally:
        executor.close()


class _AgentGroup(click.Group):
    """Runs the agent when no subcommand is named."""


@click.group(cls=_AgentGroup, invoke_without_command=True)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="GPULEDGER_AGENT_CONFIG",
    default=None,
    help="TOML config file (every key: examples/agent.toml); flags override it.",
)
@click.option("--node", default=None, help="This node's name in the ledger [hostname -s].")
@click.option(
    "--url",
    default=None,
    help="The server: http(s)://HOST:PORT, or a comma-separated list of the servers of one "
    "store (the agent follows the leader, docs/ha.md).",
)
@click.option(
    "--token",
    envvar="GPULEDGER_NODE_TOKEN",
    default=None,
    help="The node token (or $GPULEDGER_NODE_TOKEN).",
)
@click.option("--gpus", type=int, default=None, help="GPUs of the node [from NVML].")
@click.option("--gpu-type", default=None, help="GPU type [from NVML].")
@click.option(
    "--address", default=None, help="Where other nodes reach this one [as seen by the server]."
)
@click.option(
    "--state-dir",
    default=None,
    help="State file, run directories, lock [/var/lib/gpuledger/agent].",
)
@click.option("--grace", default=None, help="SIGTERM-to-SIGKILL grace [30s, at most 2m].")
@click.option("--run-as", type=click.Choice(["submitter", "service"]), default=None)
@click.option("--heartbeat", default=None, help="Time between heartbeats [5s].")
@click.option("--sample-every", default=None, help="GPU utilisation sampling period [30s].")
@click.option("--utilisation-dir", default=None, help="Test source of utilisation without NVML.")
@click.option("--check-every", default=None, help="How often job processes are looked at [0.2s].")
@click.option("--log-level", default=None)
@click.option(
    "--drain",
    is_flag=True,
    help="Stop every job of this node (SIGTERM, grace, SIGKILL), report their exits, exit.",
)
@click.pass_context
def agent(
    cctx: click.Context,
    /,
    config_file: Path | None,
    drain: bool,
    **flags: object,
) -> None:
    """The node agent: registers this node with the server, runs the ledger's placements on it
    (CUDA_VISIBLE_DEVICES = their GPUs), and reports starts, exits, utilisation and checkpoints.
    Stopping or killing it leaves jobs running; the next agent adopts them."""
    config = cfg.merge(cfg.load(config_file), **flags)
    cctx.meta["agent_config"] = config
    if cctx.invoked_subcommand is not None:
        return
    if cctx.get_parameter_source("token") == click.core.ParameterSource.COMMANDLINE:
        click.echo(  # atk33-28 F12, as serve says of a password in --store (security.md T22)
            "warning: the node token in --token is readable by every local user (ps, "
            "/proc/PID/cmdline): give it as GPULEDGER_NODE_TOKEN or the config's `token`",
            err=True,
        )
    sys.exit(_run(config, drain))


@agent.command("status")
@click.option("--state-dir", default=None, help="The agent's state directory [from its config].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def agent_status(cctx: click.Context, state_dir: str | None, as_json: bool) -> None:
    """What the agent of this state directory runs and when it last reached the server."""
    from ledger.agent.node import read_status
    from ledger.engines.supervised import live_processes

    config: cfg.AgentConfig = cctx.meta["agent_config"]
    state = Path(state_dir or config.state_dir)
    st = read_status(state)
    if st is None:
        raise InvalidCommand(f"no agent state in {state}", hint="pass --state-dir (or --config)")
    alive = _alive(int(st["pid"]))
    procs = live_processes(state)
    if as_json:
        echo_json({**st, "running": alive, "processes": [p.job_id for p in procs]})
        return
    last = st.get("last_contact_at")
    ago = "never" if last is None else f"{format_time(last)} ({_now() - last:.0f}s ago)"
    click.echo(
        f"node {st['node']}: agent {'running' if alive else 'not running'} (pid {st['pid']})"
    )
    click.echo(f"  server        {st['url']}")
    click.echo(f"  last contact  {ago}")
    if st.get("last_error"):
        click.echo(f"  last error    {st['last_error']}")
    click.echo(f"  GPUs          {st.get('gpus')} x {st.get('gpu_type')} ({st.get('gpu_source')})")
    click.echo(f"  utilisation   {st.get('utilisation')}")
    click.echo(f"  containment   {st.get('containment') or 'unknown'}")
    jobs = ", ".join(
        f"{p.job_id} (pids {' '.join(map(str, p.pids or (p.pid,)))}, "
        f"GPUs {','.join(map(str, p.gpu_indices))})"
        for p in procs
    )
    click.echo(f"  jobs          {jobs or 'none'}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


COMMANDS = [agent]
