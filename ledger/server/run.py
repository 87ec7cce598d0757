"""The composition root of `gpuledger serve` and `gpuledger up`: the ledger, the executor, the
service loop, its worker thread, and uvicorn on the Unix socket (and TCP when asked).

`up` is `serve` on the data directory's socket with a local executor: its node agents in this
process (`ledger.agent.local`, executor "agents"), the supervised executor ("local") or Slurm;
it logs each job's start and end, and may stop once idle or after a while (`Up`).

Start: 1 open the ledger  2 make the executor (one factory, `make_executor`)  3 bind the Unix
socket in the data directory and the TCP listener (TLS when configured)  4 open the service
loop and start the worker  5 serve both with one app (`up`: start its agents first).

Stop (SIGINT/SIGTERM): refuse new writes (503), let uvicorn finish the requests in flight, let
the worker finish its queue and the current cycle, flush the relay, leave running jobs running
(an agent's jobs are not ours to stop; the local executor's keep running under their supervisors
and Slurm's under Slurm, and the next start adopts them), exit 0.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import functools
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable, Coroutine, Generator, Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import uvicorn

from ledger.agent import local
from ledger.core import runas
from ledger.cycle.accounts import os_account
from ledger.cycle.executor import Executor
from ledger.cycle.loop import ServiceLoop
from ledger.dispatch import registry
from ledger.engines.gpu_util import UtilSource, pick_source
from ledger.engines.none import NoExecutor
from ledger.engines.supervise import JOB_NOFILE_VAR
from ledger.engines.supervised import SupervisedExecutor, handled_jobs
from ledger.server import identity, whatifs
from ledger.server.app import create_asgi
from ledger.server.connections import Limits, fit_files, limits_from_env, positive_settings
from ledger.server.ha import Leadership, relay_word, statement_bound_s
from ledger.server.ha_front import HAFront
from ledger.server.leadstart import _leadership
from ledger.server.leadstart import _runs_left as _runs_left
from ledger.server.leadstart import service_account as service_account
from ledger.server.leadstart import settings_of as settings_of
from ledger.server.protocol import protocol_for
from ledger.server.worker import Worker
from ledger.store import lease, locate, pgdeadline
from ledger.store.application import Ledger
from ledger.wire import SOCKET_NAME
from ledger.wire.config import ServeConfig, check_grace, slurm_jobs_dir
from schemas.bounds import MAX_ARRAY_TASKS
from schemas.codec import FREEZE_EVERY_S
from schemas.errors import InvalidCommand, LedgerError

log = logging.getLogger("gpuledger.server")


class _Once(logging.Filter):
    """uvicorn says "Started/Finished server process" once per listener; the process is one:
    each line passes once."""

    LINES = frozenset({"Started server process [%d]", "Finished server process [%d]"})

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in self.LINES:
            return True
        first = record.msg not in self.seen
        self.seen.add(str(record.msg))
        return first


SEND_WAIT_S = 10.0
"""A stop waits this long for answers still being sent, then closes their connections: a client
that never reads its answer held a stopping server (and its data directory) for as long as it
liked (atk34-25 F1b)."""


class StoppedStarting(SystemExit):
    """A stop (SIGTERM, SIGINT) during the start, before the worker runs: the start ends where it
    is (psycopg cancels a statement under way on the server's side), exit 0. A start waiting on
    the store ignored SIGTERM over a minute (a commit waiting for a synchronous standby that
    was away: atk49 F7)."""


class _Starting:
    """The signal handler of a start (`serve`): until `over()`, a signal ends the start at once
    (`StoppedStarting`); then it only asks the server to stop (`early`)."""

    def __init__(self, early: threading.Event) -> None:
        self.early = early
        self.on = True

    def signalled(self, signum: int, _frame: Any) -> None:
        self.early.set()
        if self.on:
            self.on = False  # once: the unwinding is not interrupted again
            log.info("stopping during the start (%s): nothing was served",
                     signal.Signals(signum).name)  # fmt: skip
            raise StoppedStarting(0)

    def over(self) -> None:
        self.on = False


class _Server(uvicorn.Server):
    """Signals are ours (one handler stops both listeners and the worker, in order)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def socket_path(home: Path, config: ServeConfig) -> Path:
    return Path(config.socket) if config.socket else home / SOCKET_NAME


def _bind_unix(path: Path) -> socket.socket:
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # stale: the last server did not clean up
        else:
            raise InvalidCommand(
                f"a server already runs on {path}", hint="stop it first, or use its API"
            )
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o666)  # anyone local may connect: SO_PEERCRED says who they are
    sock.listen(1024)
    return sock


def _bind_tcp(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidCommand(f"invalid listen address {listen!r}", hint="use HOST:PORT")
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), int(port)))
    except OSError as err:
        sock.close()
        raise InvalidCommand(f"cannot listen on {listen}: {err.strerror}") from err
    sock.listen(1024)
    return sock


def _hands_over_cleanly(config: ServeConfig, ha: Leadership, service: ServiceLoop) -> bool:
    """Whether this server's stop hands its lease over as clean: always, but for Slurm's
    executor while a placed run still waits for its last holder's sbatch
    (`takeover.hands_over_cleanly`, atk46-ha F1)."""
    if config.executor != "slurm":
        return True
    from ledger.engines.slurm.takeover import hands_over_cleanly

    waiting = getattr(service.executor, "in_flight", None)
    return hands_over_cleanly(ha.lease.handed_over, waiting, service.clock.now())


def make_executor(
    ledger: Ledger,
    config: ServeConfig,
    actor: str,
    may_act: Callable[[], bool] | None = None,
    keeping: Callable[[], float | None] | None = None,
    keep_delay_s: float = 0.0,
    cluster: Mapping[str, object] | None = None,
    abandoned: Set[tuple[int, int]] = frozenset(),
    handed_over: bool = False,
) -> Executor:
    """The executor `config` names, the only place one is made for the service. Slurm's is
    checked first (the partition exists and Slurm will neither reorder nor preempt on it; one
    clear error otherwise), and the partition's GPU nodes are registered by `actor`, the admin
    starting the server. `may_act`: the lease of a leader among several servers, which Slurm's
    executor checks before each sbatch and scancel (the agents check the epoch themselves).
    `keeping`: how long from now a server on the store may still keep a node's lease (None:
    not known), before which the agents' executor counts no node lost
    (`ledger.server.ha.Leadership.keeping`); `keep_delay_s`: when the servers begin to keep
    (`KeepTiming.delay_s`), told to each agent that registers; `cluster`: the Slurm cluster the
    store records (`cluster.identity`; None: the first one Slurm's executor reads), which it
    checks whenever slurmctld answers after being away; `abandoned`: the runs (job, run)
    `--abandon-runs` left on the recorded cluster, recorded lost at its takeover;
    `handed_over`: the lease was taken after a clean stop (`Lease.handed_over`)."""
    home = ledger.home
    if config.executor == "slurm":
        from ledger.engines.slurm import open_executor

        return open_executor(
            ledger,
            config.partition,
            slurm_jobs_dir(config, home),  # one directory for every server (atk46-ha F4)
            config.grace.seconds,
            actor,
            config.run_as,
            may_act,
            config.node_fence.seconds,
            cluster,
            abandoned,
            handed_over,
            slurm_vanish_after_s(os.environ),
        )
    if config.executor == "agents":
        from ledger.engines.agents import AgentExecutor

        return AgentExecutor(
            ledger,
            node_lost_after_s=config.node_lost_after.seconds,
            node_fence_s=config.node_fence.seconds,
            grace_s=config.grace.seconds,
            keeping=keeping if keeping is not None else lambda: -math.inf,
            keep_delay_s=keep_delay_s,
        )
    if config.executor == "local":
        util = _utilisation(home, config)
        log.info("utilisation: %s", util.name)
        return SupervisedExecutor(
            home / "agent",
            home / "jobs",
            grace_s=config.grace.seconds,
            run_as=config.run_as,
            debug_limit_s=config.debug_limit.seconds,
            util=util,
            sample_every_s=config.sample_every.seconds,
            extra_env={"GPULEDGER_HOME": str(home.resolve())},
        )
    return NoExecutor()


def slurm_vanish_after_s(env: Mapping[str, str]) -> float | None:
    """`GPULEDGER_SLURM_VANISH_AFTER_S`: how long a run of Slurm's executor may be missing from
    every read before it counts as gone (None: not set, the executor's own 30 s); InvalidCommand
    (one line) for a value that is not a positive number."""
    from ledger.engines.slurm.opening import VANISH_AFTER_ENV

    got = positive_settings(dict(env), ((VANISH_AFTER_ENV, "vanish_after_s", float),))
    return got.get("vanish_after_s")


def _one_server(home: Path) -> IO[bytes]:
    """Hold `<home>/serve.lock` for the life of this process: a second server on the same data
    directory (another socket or port) is refused at once, before it loads anything."""
    home.mkdir(parents=True, exist_ok=True)
    lock = (home / "serve.lock").open("ab")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise InvalidCommand(
            f"a server already runs on {home}",
            hint="one server per data directory: use it (the CLI finds its socket), or stop it",
        ) from None
    return lock


def _check_other_mode(home: Path, executor: str) -> None:
    """The local executor (HOME/agent) and `up`'s local agents (HOME/agents/NODE) keep their runs
    apart: a server with one may not start while the other's runs are unfinished (it would not
    know them, and would launch them again or record them lost while they still run)."""
    if executor not in ("local", "agents"):
        return
    others = [home / "agent"] if executor == "agents" else sorted((home / "agents").glob("*"))
    held = sorted({j for d in others for j in handled_jobs(d)})
    if held:
        other = "local" if executor == "agents" else "agents"
        raise InvalidCommand(
            f"jobs {', '.join(map(str, held))} run under the {other} executor",
            hint=f"keep using `--executor {other}` (serve or up) until they end",
        )


def _utilisation(home: Path, config: ServeConfig) -> UtilSource:
    """NVML, or the test source of utilisation (`utilisation_dir`, else `<home>/utilisation`)."""
    return pick_source(
        Path(config.utilisation_dir) if config.utilisation_dir else home / "utilisation"
    )


@dataclass(frozen=True)
class Up:
    """What `up` asks of the server beyond `serve`: a node agent per node in this process when
    the executor is "agents", a log line for each job's start and end, and a stop once nothing
    is pending or running (`until_idle`) or after `for_s` seconds."""

    until_idle: bool = False
    for_s: float | None = None


def serve(home: Path, config: ServeConfig, actor: str = "", *, up: Up | None = None) -> int:
    """Run until SIGINT/SIGTERM (or, for `up`, until idle or out of time); returns the exit code
    (0 on a clean stop). `actor`: the admin starting it (Slurm's nodes and `up`'s node tokens are
    recorded by them)."""
    if config.abandon_runs and not config.new_settings:
        raise InvalidCommand("--abandon-runs goes with --new-settings (onto another Slurm "
                             "cluster): alone it changes nothing", hint="docs/ha.md")  # fmt: skip
    early = threading.Event()  # a signal before the listeners run still stops us cleanly
    starting = _Starting(early)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, starting.signalled)
    if bool(config.tls_cert) != bool(config.tls_key):
        raise InvalidCommand("TLS needs both --tls-cert and --tls-key")
    check_grace(config.grace.seconds)  # before anything starts (atk49-23 F6)
    # 1 one server per data directory, told before anything is loaded; local runs stay with the
    #   executor that started them
    _lock = _one_server(home)  # held while this function runs: as long as the server
    whatifs.sweep(home)  # what a server killed mid what-if left
    _check_other_mode(home, config.executor)
    # 2 live work only: the newest verified snapshot plus the tail (a whole-log fold took 687 s
    # at 5M events); finished jobs are read from the projection
    dsn = locate.store_of(home, config.store or None)
    locate.remember(home, dsn)
    if dsn:  # whatever ends it (but kill -9: the next start here cancels them)
        atexit.register(lease.end_sessions, dsn)
    ledger = Ledger(home, live=True, store=dsn or "sqlite")
    if not ledger.state.initialised:
        raise InvalidCommand(f"no ledger in {home}", hint="run `gpuledger init --admin USER` first")
    # several servers may share a PostgreSQL store: then the lease says who leads (docs/ha.md)
    policy = registry.build(
        config.policy,
        {
            "margin": config.margin,
            "debug_lane": config.debug_lane,
            "squat_after_s": config.squat_after.seconds,
        },
        known_only=True,
    )
    try:
        ha, cluster, abandoned = _leadership(ledger, config, policy) if dsn else (None, None, set())
    except BaseException:  # a start refused (or stopped) here takes no snapshot at its exit: its
        ledger.ending = True  # commit may wait for a synchronous standby that is away, and the
        raise  # exit hung in it for good after its one line (atk50b-ha F2)
    # 2 the executor before any line is logged: a partition Slurm would overrule is one error
    # (a standby makes it when it takes the lead)
    executor = make_executor(ledger, config, actor) if ha is None else NoExecutor()
    log.info(
        "state: the snapshot at position %d and %d events after it",
        ledger.restored_from,
        ledger.position - ledger.restored_from,
    )
    agents = _local_agents(ledger, config, actor) if up is not None else None
    # what `up` says it runs once it listens, counted before the worker thread moves the state
    nodes = sum(1 for n in ledger.state.nodes.values() if n.state != "removed")
    what = f"{home}, {nodes} nodes, policy {config.policy}"
    # 3 the listeners
    unix_path = socket_path(home, config)
    unix_sock = _bind_unix(unix_path)
    tcp_sock = _bind_tcp(config.listen) if config.listen else None
    if ha is not None and not config.advertise and tcp_sock is not None:
        host, port = tcp_sock.getsockname()[:2]  # the port bound (`listen` may ask for 0)
        ha.lease.address = f"{'https' if config.tls_cert else 'http'}://{host}:{port}"
    # 4 who a job runs as (asked at each submission and launch), the service loop, its worker
    rule = _run_as(ledger, config)
    service = ServiceLoop(
        ledger,
        executor,
        policy,
        kafka=config.kafka or None,
        log=logging.getLogger("gpuledger.service"),
        reports_starts=config.executor in ("local", "agents", "slurm"),
        lifecycle_dir=None if up is None else home / "jobs",
        run_as=rule,
        placing=config.executor != "none",
    )
    service.open(lead=ha is None)
    if ha is None:
        service.record_settings(config.interval.seconds, config.executor, config.grace.seconds)
    service.about = {"executor": config.executor, "jobs_run_as": run_as_words(config)}
    if not service.placing:
        log.warning("no executor (--executor none): nothing is placed; jobs wait in the queue")
    worker = Worker(service, tick_s=config.interval.seconds, max_batch=config.max_batch,
                    freeze_every_s=FREEZE_EVERY_S)  # fmt: skip
    limits = _fit_descriptors(limits_from_env())
    front = create_asgi(worker, clock=ledger.clock.now, limits=limits,
                        os_accounts=dict(config.os_accounts))  # fmt: skip
    app: Any = front
    if ha is not None:
        worker.ha = ha
        worker.promote, worker.demote = _roles(ha, service, config, actor, cluster, abandoned)
        ha.position = lambda: ledger.position
        ha.appending = lambda: ledger.store_call_began(worker.thread_id)
        ha.abandon = lambda: pgdeadline.abandon(worker.thread_id)
        pgdeadline.deadline_s = statement_bound_s(ha.lease.lease_s, ledger.lock_timeout_s())
        ha.relay = lambda: relay_word(service.relay_state(), service.relay_position())
        ha.notify = worker.nudge
        # behind the connections' front (each request's caller claims its connection, one
        # without a valid token is metered), forwarding only writes of tokens it knows
        front.app = HAFront(front.app, ha, lambda: ledger.position, _keep_node(service),
                            _valid_token(ledger), lambda: worker.read_at)  # fmt: skip
    # a statement is tried again after a connection error only while the server goes on (and a
    # leader's lease runs: a fenced append past it is refused anyway)
    ledger.give_up_when(lambda: not worker.accepting or (
        ha is not None and ha.leading and not ha.lease.may_act()))  # fmt: skip
    starting.over()  # from here on a signal is the stop below (`_serve_all`)
    worker.start()
    if ha is not None:
        ha.start()
    worker.idle.append(lambda: snapshot_ahead(ledger))  # after what the reads want first
    servers = []
    close_up: Callable[[], None] | None = None
    once = _Once()  # one process: its start and end said once, not per listener
    logging.getLogger("uvicorn.error").addFilter(once)
    try:
        # 5 serve
        common: dict[str, Any] = dict(
            app=app, http=protocol_for(front.connections), lifespan="off", log_config=None,
            access_log=False, timeout_graceful_shutdown=SEND_WAIT_S,
            ws="none",  # an Upgrade is a plain request, counted and freed (atk37-25 F6)
        )  # fmt: skip
        unix_server = _Server(uvicorn.Config(**common, uds=str(unix_path)))
        servers.append((unix_server, unix_sock))
        urls = [f"unix:{unix_path}"]
        if tcp_sock is not None:
            tls: dict[str, Any] = {}
            if config.tls_cert:
                tls = dict(ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key)
            servers.append((_Server(uvicorn.Config(**common, **tls)), tcp_sock))
            host, port = tcp_sock.getsockname()[:2]
            scheme = "https" if config.tls_cert else "http"
            urls.insert(0, f"{scheme}://{host}:{port}")
        log.info("listening on %s (ledger %s, policy %s)", " and ".join(urls), home, config.policy)
        if up is None and config.log_format == "text":
            print(f"gpuledger serve: listening on {' '.join(urls)}", file=sys.stderr, flush=True)
        if up is not None:
            close_up = _start_up(up, service, agents, what, unix_path, early.set)
        _run_loop(_serve_all(servers, worker, early, watch=up is not None,
                             away=lambda: None if ha is None else ha.store_error(),
                             giving_up=lambda: None if ha is None else ha.give_up()))  # fmt: skip
    finally:
        if not front.stop_reads():  # no read thread in DuckDB at the interpreter's end
            log.warning("stopping with a read still under way")
        if close_up is not None:
            close_up()
        if ha is not None:
            ha.give_up()  # (the signal's `stop` said it first) no lease is taken from here on
        worker.stop(lambda: ha is not None and ha.unreachable is not None)  # its queue, cycle
        away = ha is not None and (ha.unreachable is not None or worker.follow_error is not None)
        if ha is not None:  # the lease handed over before the relay's stop: a standby leads
            service.shut_executor()  # and publishes the rest (atk56-25 F1: it waited 17-29 s)
            ha.stop(_hands_over_cleanly(config, ha, service))  # hands the lease over at once
        service.close(store_away=away)
        with contextlib.suppress(OSError):
            unix_path.unlink()
        log.info("stopped cleanly at position %d", ledger.position)
        logging.getLogger("uvicorn.error").removeFilter(once)
    return 0


SPARE_FDS = 256
"""Descriptors beyond the connections' cap the server keeps for itself (its stores, logs, the
projection, the agents' state files, subprocesses' pipes)."""


def _fit_descriptors(limits: Limits) -> Limits:
    """The connections' caps fitted to this process's open files: its soft limit raised to
    the hard one first (or, with no hard limit, to what the caps want), then every cap sized
    from what it got (`connections.fit_files`: `SPARE_FDS` kept for the server's own, the
    admins' reserve kept), and what it chose said in the log. (Kept at 1,104 under a hard
    limit of 1,024 with only a warning, the caps never applied: 17 tokenless addresses took
    every descriptor and root's `status` on the socket was reset, atk38-25 F7.)"""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:  # what the jobs it starts get back (`supervise.run`)
        os.environ.setdefault(JOB_NOFILE_VAR, str(soft))
    want = limits.most + SPARE_FDS
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        for new in (hard, max(soft, want)):
            if new == resource.RLIM_INFINITY:
                continue
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            except (ValueError, OSError):
                continue
            soft = new
            break
    files = want if soft == resource.RLIM_INFINITY else soft
    fitted = fit_files(limits, files, SPARE_FDS)
    log.info(
        "open files: %d; connections: %d over TCP, %d more on the Unix socket, %d more for the "
        "host's admins there%s",
        files, fitted.max_connections, fitted.local_reserve, fitted.admin_reserve,
        "" if fitted == limits else (
            f" (lowered from {limits.max_connections}, {limits.local_reserve} and "
            f"{limits.admin_reserve} to fit the open files; raise LimitNOFILE= for more)"),
    )  # fmt: skip
    return fitted


RUNS = ("local", "agents", "slurm")
"""The executors that run processes (and so run them as someone)."""


def _run_as(ledger: Ledger, config: ServeConfig) -> runas.RunAs | None:
    """The run-as rule of `config`, set on `ledger` (`Ledger.admit`): asked of every
    submission when jobs run as their owners (`run_as = "submitter"` with an executor that runs
    processes), of every member added, and of every job's environment (secrets stripped); the
    rule itself, for the dispatcher to ask before each launch, or None when it does not apply."""
    try:
        secret = re.compile(config.secret_env).pattern
    except re.error as err:
        raise InvalidCommand(f"invalid secret_env {config.secret_env!r}: {err}") from err
    if config.min_uid < 1:
        raise InvalidCommand("min_uid must be at least 1", hint="uid 0 is root: see root_jobs")
    if config.max_uid < config.min_uid:
        raise InvalidCommand("max_uid must be at least min_uid", hint="see docs/slurm-users.md")
    rule = runas.RunAs(
        config.min_uid,
        config.max_uid,
        config.root_jobs,
        dict(config.os_accounts),
        runas.PRIVILEGED_GROUPS | frozenset(config.privileged_groups),
    )
    owners = config.run_as == "submitter" and config.executor in RUNS
    if (
        min(config.max_jobs_per_user, config.max_job_bytes_per_user) < 0
        or not 0 <= config.max_array_size <= MAX_ARRAY_TASKS
    ):
        raise InvalidCommand(
            "max_jobs_per_user and max_job_bytes_per_user must be 0 or more, "
            "max_array_size 0 to 10,000",
            hint="0: no limit of the site's own",
        )
    limits = runas.SubmitLimits(
        config.max_jobs_per_user, config.max_array_size, config.max_job_bytes_per_user
    )
    ledger.admit = functools.partial(
        runas.admit, lookup=os_account, rule=rule, submissions=owners, secret=secret, limits=limits
    )
    if config.executor in RUNS and config.run_as == "service" and os.geteuid() == 0:
        log.warning(
            "run_as = service and the service runs as root: other users' jobs run as nobody "
            "(never as root), root's own as root; run the service as a dedicated unprivileged "
            "user, or use run_as = submitter"
        )
    return rule if owners else None


def run_as_words(config: ServeConfig) -> str:
    """Who jobs run as, in words (`status`)."""
    if config.executor not in RUNS:
        return "no job runs here"
    if config.run_as == "service":
        if os.geteuid() == 0:  # `ledger.engines.accounts`: never as root for someone else
            return "nobody (other users' jobs; root's own as root)"
        return "the service's own account"
    root = ", root's own as root" if config.root_jobs else ""
    return f"their owners' OS accounts (uid {config.min_uid}-{config.max_uid}{root})"


def _roles(
    ha: Leadership,
    service: ServiceLoop,
    config: ServeConfig,
    actor: str,
    cluster: Mapping[str, object] | None = None,
    abandoned: Set[tuple[int, int]] = frozenset(),
) -> tuple[Callable[[], None], Callable[[], None]]:
    """What the worker runs when this server takes the lead, and when it gives it up."""
    ledger = service.ledger

    def promote() -> None:
        ledger.fence(ha.lease.epoch)  # from now on every append proves the lease is ours
        service.lead(
            make_executor(
                ledger,
                config,
                actor,
                ha.lease.may_act,
                ha.keeping,
                ha.timing.delay_s,
                cluster,
                abandoned,
                ha.lease.handed_over,
            ),
            epoch=ha.lease.epoch,
            may_act=ha.lease.may_act,
            holds=ha.lease.holds,
        )
        service.record_settings(config.interval.seconds, config.executor, config.grace.seconds)
        log.info("leading at epoch %d from position %d", ha.lease.epoch, ledger.position)

    def demote() -> None:
        service.step_down()
        log.warning("standing by at position %d (epoch %d is over)", ledger.position,
                    ha.lease.epoch)  # fmt: skip

    return promote, demote


def _valid_token(ledger: Ledger) -> Callable[[str], bool]:
    """Whether an `Authorization` header holds a token valid in `ledger`'s folded state now
    (`identity.from_bearer`): what a standby forwards (`HAFront`)."""

    def valid(authorization: str) -> bool:
        try:
            identity.from_bearer(ledger.state, authorization, ledger.clock.now())
        except LedgerError:
            return False
        return True

    return valid


def _keep_node(service: ServiceLoop) -> Callable[[str, str], bool]:
    """Whether a server whose store is away keeps `node`'s lease: asked with that node's own
    token, for a node it does not count lost (its jobs may be released elsewhere). A leader's
    own agents' executor counts the keep as the node's contact (it never counts a node lost
    that it kept)."""
    ledger = service.ledger

    def keep(node: str, authorization: str) -> bool:
        n = ledger.state.nodes.get(node)
        if n is None or n.state in ("lost", "removed"):
            return False
        try:
            who = identity.from_bearer(ledger.state, authorization, ledger.clock.now())
        except Exception:
            return False
        if who.actor != f"@node:{node}":
            return False
        from ledger.engines.agents import AgentExecutor

        if isinstance(service.executor, AgentExecutor):
            service.executor.touch(node, ledger.clock.now())
        return True

    return keep


def _local_agents(ledger: Ledger, config: ServeConfig, actor: str) -> local.LocalAgents | None:
    """`up`'s node agents, one per node of the ledger, when the executor is "agents": each with
    the node token it keeps in its state directory (made by `actor` when it has none that is
    still valid)."""
    if config.executor != "agents":
        return None
    now = ledger.clock.now()
    nodes = {
        name: (n.gpus, n.gpu_type) for name, n in ledger.state.nodes.items() if n.state != "removed"
    }
    tokens = {name: local.node_token(ledger, name, actor, now) for name in nodes}
    settings = local.LocalSettings(
        grace_s=config.grace.seconds,
        run_as=config.run_as,
        debug_limit_s=config.debug_limit.seconds,
        sample_every_s=config.sample_every.seconds,
        util=_utilisation(ledger.home, config),
    )
    return local.LocalAgents(ledger.home, nodes, tokens, settings)


def _start_up(
    up: Up,
    service: ServiceLoop,
    agents: local.LocalAgents | None,
    what: str,
    unix_path: Path,
    stop: Callable[[], None],
) -> Callable[[], None]:
    """Once the server listens: say what runs (`what`), start the local agents on the Unix
    socket, and watch every cycle (on the worker thread) for the moment to stop; returns what
    stops the agents (their jobs keep running)."""
    said = logging.getLogger("gpuledger.up")
    said.info("up: %s%s", what, ", local agents" if agents is not None else "")
    said.info(
        "job output goes where each job asks (-o; gpuledger-N.out in its working directory by "
        "default; %s/job-N.log for one with none): each start line names it",
        service.home / "jobs",
    )
    if agents is not None:
        agents.start(f"unix:{unix_path}", str(unix_path))
    deadline = None if up.for_s is None else service.clock.now() + up.for_s
    if up.until_idle or deadline is not None:
        stopping: list[bool] = []  # cycles may run until the stop takes effect: say it once

        def check(_cycle_s: float) -> None:
            if up.until_idle and service.idle():
                if not stopping:
                    said.info("nothing pending or running: exiting")
                stopping.append(True)
                stop()
            elif deadline is not None and service.clock.now() >= deadline:
                stop()

        service.on_cycle.append(check)
    return agents.stop if agents is not None else lambda: None


def snapshot_ahead(ledger: Ledger) -> None:
    """Idle work: a live ledger's snapshot once half its interval has passed, so that the group
    commit crossing the interval (which encodes the whole live state, ~0.2 s at 10k live jobs,
    while the event loop waits) rarely has to."""
    if ledger.state.live_only and ledger.position - ledger.snapshot_position >= max(
        1, ledger.snapshot_every // 2
    ):
        ledger.snapshot_state()


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    """uvloop when it is installed (uvicorn[standard] brings it): cheaper socket I/O."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


async def _serve_all(
    servers: list[tuple[_Server, socket.socket]],
    worker: Worker,
    early: threading.Event,
    *,
    watch: bool = False,
    away: Callable[[], str | None] = lambda: None,
    giving_up: Callable[[], None] = lambda: None,
) -> None:
    """Serve until SIGINT/SIGTERM; with `watch`, also until `early` is set from another thread.
    `away`: why the store does not answer, if it does not (the requests waiting on the worker
    are then answered 503 at the stop: `Worker.refuse_waiting`); `giving_up`: called at the
    stop (a server under a lease takes none from then on: `Leadership.give_up`)."""
    loop = asyncio.get_running_loop()
    refusing: list[asyncio.Future[None]] = []

    async def refuse_while_away() -> None:
        said = False
        while True:
            why = away()
            if why is not None and (n := worker.refuse_waiting(why)) and not said:
                said = True
                log.info("stopping while the store does not answer: %d request(s) waiting on "
                         "it answered 503", n)  # fmt: skip
            await asyncio.sleep(0.1)

    def stop() -> None:
        log.info("stopping: no more writes; finishing requests in flight and the current cycle")
        giving_up()  # no lease taken from here on: a stopping leader took it again (atk56-25 F1)
        worker.accepting = False
        worker.service.ledger.ending = True
        for server, _ in servers:
            server.should_exit = True
        if not refusing:
            refusing.append(asyncio.ensure_future(refuse_while_away()))

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    if early.is_set():
        stop()

    async def watcher() -> None:  # a stop asked for from another thread (`up`'s worker)
        while not early.is_set():
            await asyncio.sleep(0.1)
        stop()

    watching = asyncio.ensure_future(watcher()) if watch and not early.is_set() else None
    await asyncio.gather(*(server.serve(sockets=[sock]) for server, sock in servers))
    for task in (watching, *refusing):
        if task is not None:
            task.cancel()
