"""`gpuledger serve`'s configuration (and `up`'s, which is `serve` with a local executor): one
TOML file, every key below, flags override it.

Unknown keys are rejected (a typo must not silently fall back to a default). The documented
example is `examples/serve.toml`. Durations are `schemas.units` types, parsed once here: a bad
one is an error at start that names the key or the flag.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, TypeVar

import msgspec

from ledger.core.runas import admission_meaning
from ledger.core.secret_shapes import SECRET_NAMES
from schemas import toml_bounds, units
from schemas.bounds import MAX_GRACE_S
from schemas.errors import InvalidCommand
from schemas.units import Duration, Interval

C = TypeVar("C", bound=msgspec.Struct)


MAX_JOB_BYTES_PER_USER = 256 << 20
"""`ServeConfig.max_job_bytes_per_user`'s default: 20,000 jobs of a 12 KiB command and
environment each, or 256 jobs of a 1 MiB one."""


class ServeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every key of the config file (all optional)."""

    listen: str = "127.0.0.1:8470"
    """HOST:PORT of the HTTP API (port 0 picks a free one); "" serves the Unix socket only."""
    socket: str = ""
    """Path of the Unix socket for local callers; default `<home>/gpuledger.sock`."""
    tls_cert: str = ""
    """PEM certificate: serve HTTPS on `listen` (needs `tls_key`)."""
    tls_key: str = ""
    """PEM private key of `tls_cert`."""
    interval: Interval = Interval("2s")
    """Time between dispatcher cycles."""
    policy: Literal["fairshare", "fifo"] = "fairshare"
    """The dispatcher policy."""
    margin: float = 0.1
    """Preemption hysteresis of the fair-share policy."""
    debug_lane: bool = True
    """Let small debug jobs preempt jobs past their contract."""
    squat_after: Duration = Duration("1h")
    """Past its contract, a job whose GPUs sit below the squat threshold (10%) this long is
    squatting: listed by `squatters` and a preferred preemption victim."""
    executor: Literal["none", "record", "local", "agents", "slurm"] = "none"
    """"agents": node agents (`gpuledger agent`) run placements; "local": run jobs here as
    processes, like `up`; "slurm": run them as Slurm jobs on `partition` (docs/slurm.md);
    "none": nothing runs, so nothing is placed (jobs wait; `status` says so); "record":
    placements are only recorded and count as started, nothing runs (a ledger without an
    engine: demos, tests)."""
    partition: str = ""
    """The Slurm partition gpu-ledger owns (executor "slurm"); checked at start."""
    slurm_jobs_dir: str = ""
    """Executor "slurm": the directory of the runs' batch scripts and marks (launched, alive,
    ended), which the compute nodes write and every server on the store reads: one directory
    that all of them (and the nodes) see at this path; "" = `<home>/jobs` (one server). The
    store records it with the settings: a server given another never leads (docs/ha.md)."""
    node_lost_after: Duration = Duration("60s")
    """With node agents: a node whose agent is silent this long is marked lost; its GPUs are
    never placed on again before that (nor after, until it returns)."""
    node_fence: Duration = Duration("5m")
    """With node agents: how long after a node is lost its runs stay in doubt (they may live on
    a partitioned node): its agent's report of how they ended is recorded as it happened; past
    the fence (plus each job's grace) the node's parts have stopped themselves (their lease ran
    out) and its jobs end `node_failure` (resumable ones requeued, run elsewhere)."""
    grace: Duration = Duration("30s")
    """SIGTERM-to-SIGKILL grace when the executor preempts a job (a job's own grace wins); at
    most 120 s (`MAX_GRACE_S`): more is refused at start."""
    run_as: Literal["submitter", "service"] = "submitter"
    """"submitter": a job runs as its owner's OS account (the ledger user's name, or its
    `os_accounts` entry), which must exist with a uid of at least `min_uid`; a submission
    whose owner has none is refused, and a job is never launched as an account the rule does
    not accept. "service": every job runs as the service's own account (a service running as
    a dedicated unprivileged user; as root it would run every job as root, and says so)."""
    min_uid: int = 1000
    """The lowest uid a job may run as: accounts below it are the system's (daemon, nobody's
    kin on some systems), and only an admin may add one as a member."""
    max_uid: int = 60000
    """The highest uid a job may run as (Debian's UID_MAX): above it are the system's
    dynamically allocated accounts (Debian's `slurm` is 64030) and `nobody` (65534). Accounts
    whose shell is nologin or false are the system's too, whatever their uid."""
    root_jobs: bool = False
    """Root's own jobs may run as root (never anyone else's)."""
    os_accounts: dict[str, str] = {}
    """Ledger user -> OS account name, where they differ (only this file maps them)."""
    privileged_groups: list[str] = []
    """OS groups with the system's rights besides the built-in ones (sudo, adm, systemd-journal,
    ssl-cert, docker, ...: `ledger.core.runas.PRIVILEGED_GROUPS`), e.g. the site's service
    groups: only an admin adds a member in one, and its jobs are its own or an admin's."""
    secret_env: str = SECRET_NAMES
    """Environment variables whose names match this regular expression are never recorded
    with a job (the CLI leaves the same ones out before it sends anything)."""
    debug_limit: Duration = Duration("15m")
    """Local jobs: debug-lane jobs are stopped after at most this long."""
    sample_every: Interval = Interval("30s")
    """Local jobs: GPU utilisation sampling period."""
    utilisation_dir: str = ""
    """Local jobs: the test source of utilisation where NVML is absent (a file per job, see
    docs/agent.md); "" = `<home>/utilisation`."""
    kafka: str = ""
    """Kafka bootstrap HOST:PORT: relay the log and feed the projection from the topic."""
    log_format: Literal["text", "json"] = "text"
    """Log lines as text or as one JSON object per line."""
    log_level: Literal["debug", "info", "warning", "error", "DEBUG", "INFO", "WARNING", "ERROR"] = (
        "INFO"
    )
    """gpu-ledger's own log level (libraries log only their warnings, all at debug)."""
    max_batch: int = msgspec.field(default=256)
    """Most commands committed in one store transaction (group commit)."""
    store: str = ""
    """Where the log lives: "" (or "sqlite") for the SQLite file in the data directory, or a
    PostgreSQL DSN (`postgresql://USER@HOST1:5432,HOST2:5432/DB?target_session_attrs=read-write`):
    then two or more servers may serve one ledger, one leading (docs/ha.md)."""
    advertise: str = ""
    """The URL other servers, clients and agents reach this server at (shown as the leader's
    address; writes sent to a standby go there); default `http://` + `listen`."""
    lease: Duration = Duration("5s")
    """With a PostgreSQL store: the leader's lease. A leader that cannot renew it within this
    long stops acting; a standby takes over once it has expired (failover within about twice
    this)."""
    new_settings: bool = False
    """With a PostgreSQL store: start with other settings (lease, node-lost timeout, fence,
    executor, policy, the admission and security settings: `admission_of`) than the ones the
    store records, and record them when this server takes the lease (only once nobody leads;
    settings recorded after this server started are never replaced). Give it to one server,
    once, as `serve --new-settings`: `true` in a config file is refused (docs/ha.md, "Changing
    the settings")."""
    abandon_runs: bool = False
    """With `--new-settings` onto another Slurm cluster: the runs the ledger holds that the
    new cluster does not list (they run on the recorded one) are recorded lost, and run on
    there unaccounted until a server talks to that cluster again, which stops them (placed
    ones are submitted again); without it such a change is refused in one line (docs/ha.md). The
    command line's `serve --abandon-runs` only: `true` in a config file is refused."""
    max_jobs_per_user: int = 20_000
    """Unfinished jobs (pending, placed, running; each array task one) one user may own; a
    submission past it is refused with one line (Slurm's MaxSubmitJobs). 0: no limit."""
    max_array_size: int = 10_000
    """Tasks one job array may have (Slurm's MaxArraySize; at most 10,000). 0: 10,000."""
    max_job_bytes_per_user: int = MAX_JOB_BYTES_PER_USER
    """About the bytes one user's unfinished jobs may hold in the server's memory, all together
    (their command lines, environments, labels and paths, the job ids their dependencies name,
    and 1 KiB each: `held_bytes`); a
    submission past it is refused with one line (403). 0: no limit."""


def admission_of(
    config: ServeConfig,
    service: tuple[int, str],
    slurm: dict[str, object] | None = None,
    jobs_dir: Path | None = None,
) -> str:
    """Pure: the settings that change what a leader admits or how it runs what it admits, as
    canonical JSON (config key -> value, sorted; `lease.Settings.admission`): who jobs run as
    and the uid range (`ledger.core.runas.admit`: a manager may add a system account only where
    `min_uid` allows it), root's own jobs, the OS accounts and privileged groups, the secret
    names stripped from a job's environment, the per-user caps, the preemption grace, the Slurm
    partition, the local debug limit and the cycle interval. A standby started with others
    admitted, after a failover, what the leader refused (atk39-28 F2). What stays per server:
    where it listens and how it is reached, its logs, Kafka, the group commit's batch and the
    utilisation sampling. `service`: the account the server runs as (uid, name), which decides
    with `run_as` whose account a job runs as (`accounts.account_for`: not root, every job runs
    as the server's own account) and who may signal its jobs (`scancel` of a job another
    account submitted is refused): a root leader and a standby of a service account with one
    config file recorded the same settings, and a failover ran everyone's jobs as one account
    (atk40-28 F1); two standbys of two service accounts recorded only "not root", and after a
    failover the new leader could not cancel the jobs the old one ran (atk42-28 F1).
    `slurm`: with the Slurm executor, which cluster this server talks to and
    whether it accepts untracked processes (`ledger.engines.slurm.cluster.identity`): a standby
    with another `SLURM_CONF` took over another cluster's partition (atk40-28 F2); `jobs_dir`
    (with `slurm`): the run directory (`slurm_jobs_dir`), whose marks the next leader reads: one
    with its own found none of a run that ended around a kill -9 of the leader and recorded it
    never started (atk46-ha F4). The text is
    of `admission_meaning`: settings written otherwise that mean the same are recorded alike."""
    admission: dict[str, object] = {
        "service_runs_as_root": service[0] == 0,
        "service_account": f"{service[1]} (uid {service[0]})",
        "run_as": config.run_as,
        "min_uid": config.min_uid,
        "max_uid": config.max_uid,
        "root_jobs": config.root_jobs,
        "os_accounts": config.os_accounts,
        "privileged_groups": sorted(set(config.privileged_groups)),
        "secret_env": config.secret_env,
        "max_jobs_per_user": config.max_jobs_per_user,
        "max_array_size": config.max_array_size,
        **(
            {"max_job_bytes_per_user": config.max_job_bytes_per_user}
            if config.max_job_bytes_per_user != MAX_JOB_BYTES_PER_USER
            else {}  # recorded only when set: settings recorded before it was stay equal
        ),
        "grace_s": float(config.grace.seconds),
        "partition": config.partition,
        "debug_limit_s": float(config.debug_limit.seconds),
        "interval_s": float(config.interval.seconds),
    }
    if slurm is not None:
        admission.update(slurm)
        if jobs_dir is not None:
            admission["slurm_jobs_dir"] = str(jobs_dir)
    return msgspec.json.encode(admission_meaning(admission), order="sorted").decode()


def check_grace(grace_s: float) -> None:
    """Pure: `--grace` (`grace` in the file) above `MAX_GRACE_S` is refused at start, one line:
    every engine caps a job's grace there, so a longer one would be promised by nothing but
    the setting (atk49-23 F6: `up --grace 10m` started; its jobs were killed 120 s after a
    stop that every read said would get 600 s)."""
    if grace_s > MAX_GRACE_S:
        raise InvalidCommand(
            f"--grace {grace_s:g}s is more than the {MAX_GRACE_S} s any job gets at its stop",
            hint=f"give at most --grace {MAX_GRACE_S}s (a job's own submit --grace has the "
            "same bound)",
        )


def slurm_jobs_dir(config: ServeConfig, home: Path) -> Path:
    """Pure: the Slurm executor's run directory (`slurm_jobs_dir`, else `<home>/jobs`), absolute
    (relative to the working directory) as the batch scripts name it and the store records it:
    a new leader reads an adopted run's marks there, and a leader with another found none and
    recorded a run that ran to exit 0 as never started (atk46-ha F4)."""
    return Path(
        os.path.abspath(Path(config.slurm_jobs_dir) if config.slurm_jobs_dir else home / "jobs")
    )


def load(path: Path | None) -> ServeConfig:
    """The config file as a ServeConfig (defaults when `path` is None); one clear error line.
    `new_settings = true` is refused: a one-time change is a command-line flag, never a key left
    in a file (a stale file reverted the store's settings at every start while nobody led, and
    then only its server might lead: atk39-28 F3)."""
    config = load_as(ServeConfig, path, "examples/serve.toml")
    if config.abandon_runs:
        raise InvalidCommand(
            f"config {path}: abandon_runs is a one-time choice, given on the command line only",
            hint="remove it from the file; give `serve --new-settings --abandon-runs` once "
            "(docs/ha.md, changing the settings)",
        )
    if config.new_settings:
        raise InvalidCommand(
            f"config {path}: new_settings is a one-time change, given on the command line only",
            hint="remove it from the file; start one server once with `serve --new-settings` "
            "(docs/ha.md, changing the settings)",
        )
    return config


def load_as(cls: type[C], path: Path | None, example: str) -> C:
    """The TOML file at `path` as `cls` (defaults when `path` is None): unknown keys and bad
    values are one clear error line pointing at the documented `example`."""
    if path is None:
        return cls()
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InvalidCommand(f"cannot read config {path}: {err.strerror}") from err
    try:  # bounded before msgspec's TOML (tomllib) sees it, like a budget file
        toml_bounds.check(data.decode("utf-8"), f"config {path}")
    except UnicodeDecodeError as err:
        raise InvalidCommand(f"config {path} is not valid TOML: {err}") from err
    try:
        return msgspec.toml.decode(data, type=cls, dec_hook=units.dec_hook)
    except msgspec.ValidationError as err:
        raise InvalidCommand(f"config {path}: {err}", hint=f"see {example}") from err
    except msgspec.DecodeError as err:
        raise InvalidCommand(f"config {path} is not valid TOML: {err}") from err


def merge(config: C, **flags: object) -> C:
    """Flags given on the command line (not None) override the file; a duration is parsed here
    (an error names the flag)."""
    kinds = {f.name: f.type for f in msgspec.structs.fields(config)}
    given = {
        k: _written(kinds[k], v, f"--{k.replace('_', '-')}")
        for k, v in flags.items()
        if v is not None
    }
    return msgspec.structs.replace(config, **given)


def _written(kind: object, value: object, flag: str) -> object:
    if kind in (Duration, Interval) and isinstance(value, str):
        return kind(value, flag)
    return value


def keys(cls: type[msgspec.Struct] = ServeConfig) -> dict[str, str]:
    """Key -> its documentation (of `cls`'s docstrings), for the docs drift tests."""
    import ast
    import inspect
    import itertools

    tree = ast.parse(inspect.getsource(cls))
    out: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            out[node.target.id] = str(nxt.value.value)
    return out
