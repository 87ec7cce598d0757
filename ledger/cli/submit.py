"""`submit` and `cancel`: a job as sbatch takes it, and its end as scancel asks for it.

`gpuledger submit [options] -- command ...` or `gpuledger submit [options] script.sh [args]`. A
batch script's `#GPULEDGER` lines hold `submit` options as they are written here, and its
`#SBATCH` lines the sbatch options this ledger understands (`SBATCH`); any other `#SBATCH`
option is refused by name, with nothing submitted. Options on the command line win over the
script's, as with sbatch. The job carries its world: the directory it was submitted from
(`-D`), the environment (`--export`, names matching the secret pattern left out), its output
files (`-o`, `-e`) and name (`-J`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import select
import shlex
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from ledger.cli._common import Ctx, build, os_user, pass_ctx
from ledger.cli.output import echo_json, shown_bytes
from ledger.cli.output import utf8 as _utf8
from ledger.core.jobs import parse_array, parse_dependency
from ledger.core.secret_shapes import SECRET_NAMES, secret_value
from ledger.engines.accounts import own_umask
from ledger.engines.job_paths import path_refusal, program_refusal
from ledger.engines.ulimits import own_limits
from ledger.store.requests import valid_key
from schemas import commands as c
from schemas.bounds import ENV_NAME_PATTERN, LIMIT_NAMES, MAX_ARRAY_TASKS, MAX_ENV_VALUE
from schemas.errors import InvalidCommand, LedgerError
from schemas.events import JobFinished, JobKillOrdered, JobSubmitted
from schemas.units import format_duration, limit_words, parse_duration, parse_job_time

ENV_NAME = re.compile(ENV_NAME_PATTERN)


def _labels(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise InvalidCommand(f"invalid label {p!r}", hint="use KEY=VALUE")
        out[key] = value
    return out


# --- batch scripts ------------------------------------------------------------------------------

SBATCH: dict[str, str | None] = {
    "-A": "-A", "--account": "-A",
    "-G": "-G", "--gpus": "-G",
    "-t": "-t", "--time": "-t",
    "-J": "-J", "--job-name": "-J",
    "-o": "-o", "--output": "-o",
    "-e": "-e", "--error": "-e",
    "-D": "-D", "--chdir": "-D",
    "--export": "--export",
    "-a": "--array", "--array": "--array",
    "-d": "--dependency", "--dependency": "--dependency",
    "--gres": None,  # gpu:N or gpu:TYPE:N, below
    "--requeue": "--resumable", "--no-requeue": "--not-resumable",
    "--priority": "--priority",
    "--propagate": "--propagate",
}  # fmt: skip
"""The sbatch options a `#SBATCH` line may use, and the `submit` option each one is."""
_FLAGS = {"--requeue", "--no-requeue"}


def directives(text: str, name: str) -> list[str]:
    """Pure: a batch script's `#GPULEDGER` and `#SBATCH` lines as `submit` options, read as
    sbatch reads them: from the top, until the first line that is neither blank nor a comment.
    An `#SBATCH` option this ledger does not understand is one error naming it and its line."""
    out: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break
        for prefix, translate in (("#GPULEDGER", False), ("#SBATCH", True)):
            if stripped.startswith(prefix) and stripped[len(prefix) : len(prefix) + 1] in " \t":
                try:
                    words = shlex.split(stripped[len(prefix) :], comments=True)
                except ValueError as err:
                    raise InvalidCommand(f"{name} line {number}: {err}") from err
                out += _sbatch(words, name, number) if translate else words
    return out


def _sbatch(words: list[str], name: str, number: int) -> list[str]:
    """Pure: one `#SBATCH` line's options as `submit` options (or one error naming the first
    option it does not understand)."""
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        option, eq, value = word.partition("=")
        if option not in SBATCH and word[:2] in SBATCH and not word.startswith("--"):
            option, eq, value = word[:2], "=", word[2:]  # `-t2`, as sbatch reads it (atk63 L3)
        if option not in SBATCH:
            raise InvalidCommand(
                f"{name} line {number}: #SBATCH {option} is not an option gpu-ledger understands",
                hint="see docs/slurm-users.md for the sbatch options it takes; remove the line or "
                "write it as a #GPULEDGER line",
            )
        if option in _FLAGS or (option == "--propagate" and not eq):
            out.append(str(SBATCH[option]))  # a bare --propagate is ALL
            i += 1
            continue
        if not eq:
            if i + 1 >= len(words):
                raise InvalidCommand(f"{name} line {number}: #SBATCH {option} needs a value")
            value = words[i + 1]
            i += 1
        i += 1
        if option == "--gres":
            out += _gres(value, name, number)
        elif option in ("-G", "--gpus") and ":" in value:
            kind, _, count = value.rpartition(":")
            out += ["--gpu-type", kind, "-G", count]
        else:
            out += [str(SBATCH[option]), value]
    return out


def _gres(value: str, name: str, number: int) -> list[str]:
    parts = value.split(":")
    if parts[0] != "gpu" or len(parts) not in (2, 3):
        raise InvalidCommand(
            f"{name} line {number}: #SBATCH --gres={value}: only gpu:N or gpu:TYPE:N",
        )
    return ["-G", parts[-1]] + (["--gpu-type", parts[1]] if len(parts) == 3 else [])


def _script(command: tuple[str, ...]) -> tuple[Path, str] | None:
    """The batch script `command` starts with (a file whose first line is `#!`), and its
    text; None for a command that is no script."""
    if not command or not os.path.isfile(command[0]):
        return None
    path = Path(command[0])
    try:
        text = path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as err:
        raise InvalidCommand(f"cannot read {path}: {err.strerror}") from err
    return (path, text) if text.startswith("#!") else None


def script_name(path: Path, chdir: str | None) -> str:
    """How the recorded command names a batch script: by its absolute path, or by its bare name
    when it lies directly in the job's working directory, as `sh run.sh` names it there (the
    path rule then gives one answer for the one file: `submit run.sh` in a group project
    directory was refused where `submit -- sh run.sh` ran, atk44n F13)."""
    full = os.path.abspath(path)
    if os.path.realpath(os.path.dirname(full)) == workdir(chdir):
        return os.path.basename(full)
    return full


def interpreter(text: str, name: str) -> tuple[str, ...]:
    """Pure: the program a script's `#!` line names and its one optional argument, as the
    kernel reads it (`#!/usr/bin/env python3` is `/usr/bin/env`, `python3`)."""
    words = text.splitlines()[0][2:].strip().split(None, 1)
    if not words or not words[0].startswith("/"):
        raise InvalidCommand(
            f"{name}: its #! line names no interpreter by an absolute path",
            hint="start it with #!/bin/bash (or #!/usr/bin/env python3, ...)",
        )
    return tuple(words)


def _merged(ctx: click.Context, options: list[str], name: str) -> dict[str, Any]:
    """The command line's values, with the script's options where the command line gave
    none (sbatch's precedence)."""
    assert ctx.command is not None
    try:
        from_script = ctx.command.make_context(f"{name} directives", [*options, "--", "true"])
    except click.UsageError as err:
        raise InvalidCommand(f"{name}: {err.format_message()}") from err
    params = dict(ctx.params)
    for key, value in from_script.params.items():
        if key != "command" and ctx.get_parameter_source(key) == click.core.ParameterSource.DEFAULT:
            params[key] = value
    return params


# --- the job's world ------------------------------------------------------------------------------


def environment(
    export: str, environ: Mapping[str, str], secret: str = SECRET_NAMES
) -> tuple[dict[str, str], list[str], list[str]]:
    """Pure: the job's environment as sbatch's `--export` says (`ALL`, `NONE`, `NAME,...`,
    `ALL,NAME=value,...`), without the secrets (names that match `secret`, values of a
    secret's shape, a password in a URL, a token or a private key: `secret_value`); the secrets
    `ALL` left out (for the note `submit` prints); and the variables `ALL` leaves out because
    no job could be given them as they are (a shell's exported functions, `BASH_FUNC_module%%`
    of environment modules, whose names are no variable names; a NUL; a value over the bound;
    a name or value that is not UTF-8, as a shell's OLDPWD after a `cd` into a Latin-1
    directory, atk46-23r R2). A variable named on its own must be sendable and no secret, or it
    is one error."""
    pattern = re.compile(secret)

    def hidden(key: str, value: str | None) -> bool:
        return bool(pattern.search(key)) or (value is not None and secret_value(value))

    parts = [p.strip() for p in export.split(",") if p.strip()]
    if not parts:
        raise InvalidCommand("--export is empty", hint="use ALL, NONE or NAME[,NAME=value...]")
    everything = parts[0].upper() == "ALL"
    if parts[0].upper() in ("ALL", "NONE"):
        parts = parts[1:]
    env: dict[str, str] = {}
    unsendable: list[str] = []
    left: list[str] = []
    if everything:
        for key, value in environ.items():
            if hidden(key, value):
                if not key.startswith("GPULEDGER_"):  # the CLI's own (its token): no news
                    left.append(key)
                continue
            if _sendable(key, value):
                env[key] = value
            else:
                unsendable.append(key)
    for part in parts:
        key, eq, value = part.partition("=")
        if hidden(key, value if eq else environ.get(key)):
            raise InvalidCommand(
                f"environment variable {shown_bytes(key[:64])} is not sent to jobs: "
                + (
                    "its name is one that holds secrets"
                    if pattern.search(key)
                    else "its value is a secret's (a password in a URL, a token or a private key)"
                ),
                hint="leave it out of --export; pass it to the job another way (a file only "
                "you can read)",
            )
        if eq:
            env[key] = value
        elif key in environ:
            env[key] = environ[key]
        if key in env and not _sendable(key, env[key]):
            raise InvalidCommand(
                f"environment variable {shown_bytes(key[:64])} cannot be sent: "
                + (
                    f"its value is {len(env[key])} characters (at most {MAX_ENV_VALUE})"
                    if len(env[key]) > MAX_ENV_VALUE
                    else "its value is not valid UTF-8"
                    if ENV_NAME.fullmatch(key) and not _utf8(env[key])
                    else "it is no variable name or its value holds a NUL"
                ),
                hint="leave it out of --export",
            )
    return env, sorted(left), sorted(unsendable)


def propagated(text: str, limits: Mapping[str, int]) -> dict[str, int]:
    """Pure: the soft resource limits (`limits`, this process's) a job takes, as sbatch's
    `--propagate` names them: ALL (the default, Slurm's PropagateResourceLimits=ALL), NONE (the
    job keeps its engine's limits), or a list of AS, CORE, CPU, DATA, FSIZE, MEMLOCK, NOFILE,
    NPROC, RSS, STACK (any case)."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names in (["all"], []):
        return dict(limits)
    if names == ["none"]:
        return {}
    unknown = [n for n in names if n not in LIMIT_NAMES]
    if unknown:
        raise InvalidCommand(
            f"--propagate: {shown_bytes(unknown[0].upper()[:32])} is no resource limit",
            hint="use ALL, NONE or some of " + ",".join(n.upper() for n in LIMIT_NAMES),
        )
    return {n: limits[n] for n in names if n in limits}


def unsendable_reason(name: str, value: str) -> str:
    """Pure: why no job can be given the variable `name`=`value` as it is (for `submit`'s note),
    or "" when it can."""
    if not _utf8(name) or not _utf8(value):
        return "not UTF-8"
    if not ENV_NAME.fullmatch(name):
        return "no variable name"  # a shell function's, or not ASCII (Cyrillic letters, ...)
    if "\x00" in value:
        return "a NUL"
    if len(value) > MAX_ENV_VALUE:
        return f"over {MAX_ENV_VALUE} characters"
    return ""


def _sendable(name: str, value: str) -> bool:
    return (
        bool(ENV_NAME.fullmatch(name))
        and len(value) <= MAX_ENV_VALUE
        and "\x00" not in value
        and _utf8(value)
    )


_WHAT = {
    "workdir": "the working directory (-D, or here)",
    "stdout": "-o/--output",
    "stderr": "-e/--error",
    "job_name": "-J/--job-name",
}


def utf8_refusal(fields: Mapping[str, Any]) -> None:
    """Pure: one `InvalidCommand` line naming the first of a submission's fields (its working
    directory, an argument of its command, -o, -e, -J or any other option) that is not valid
    UTF-8, which a request cannot carry (sbatch passes the bytes; the ledger's log is JSON).
    Nothing is sent then: it was an `[internal]` UnicodeEncodeError (atk46-23r R2)."""

    def strings(value: Any) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, Mapping):
            return [s for k, v in value.items() for s in (*strings(k), *strings(v))]
        if isinstance(value, (list, tuple)):
            return [s for v in value for s in strings(v)]
        return []

    for key, value in fields.items():
        if key == "command":
            bad = [(i, a) for i, a in enumerate(value, 1) if not _utf8(a)]
            what = f"argument {bad[0][0]} of the command" if bad else ""
            text = bad[0][1] if bad else ""
        else:
            text = next((s for s in strings(value) if not _utf8(s)), "")
            what = _WHAT.get(key, f"--{key.replace('_', '-')}")
        if what and text:
            raise InvalidCommand(
                f"{what} is not valid UTF-8: {shown_bytes(text)}",
                hint="rename it in UTF-8 (e.g. `convmv -f latin1 -t utf8`), or choose another",
            )


def path_warnings(wd: str, outputs: tuple[str, ...], command: Sequence[str] = ()) -> list[str]:
    """What the path rule (T19 in docs/security.md) would refuse at launch, as far as the
    submitting host sees it, one line each: a directory on the way to the working directory or
    to an output file's directory (one with no `%` pattern) that others may write without the
    sticky bit, that belongs to another account than the submitter or root, or a link there
    that is not the submitter's; the same of the command's program and script, opened by name
    when the job starts (`job_paths.check_command`, atk43 F1). Only warned of: the job's node
    may see another filesystem (a path mounted there alone, or otherwise); its launch checks
    again and refuses it there."""
    ways = [(wd, "working directory", wd)] if wd else []
    for name in outputs:
        where = os.path.dirname(name)
        if name and "%" not in where and (where.startswith("/") or wd):
            ways.append((os.path.join(wd, where) if wd else where, "output file", name))
    said = [path_refusal(directory or "/", what, shown) for directory, what, shown in ways]
    said += program_refusal(wd, command, relative=not (wd and said[0]))  # said once
    return list(dict.fromkeys(why for why in said if why))


def warnings_as(
    job_user: str, wd: str, outputs: tuple[str, ...], command: Sequence[str]
) -> list[str]:
    """`path_warnings` as the job's user sees them: the caller's own job here ("" is the
    identity a server fills in, the caller's token); another's (`--user`, `--as` or
    $GPULEDGER_USER) in a child process that takes that user's OS account, when the caller is
    root and the account exists, else none (the launch, as the user, checks). The rule's
    "another account" and "the user's own link" are the job user's: root submitting for a user
    was warned of every directory of the user's (atk43n F3)."""
    if job_user in ("", os_user()):
        return path_warnings(wd, outputs, command)
    if os.geteuid() != 0:
        return []
    try:
        pw = pwd.getpwnam(job_user)
    except KeyError:
        return []
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.close(read_end)
            os.initgroups(pw.pw_name, pw.pw_gid)
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            with os.fdopen(write_end, "w") as out:
                json.dump(path_warnings(wd, outputs, command), out)
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], WARN_TIMEOUT_S)
        text = os.read(read_end, 1 << 20).decode() if ready else ""
        said = json.loads(text) if text else []
    except (OSError, ValueError):
        said = []
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return [str(why) for why in said] if isinstance(said, list) else []


WARN_TIMEOUT_S = 10.0
"""How long `submit` waits for its path checks as another user (a dead network file system
hangs them): then it says nothing, and the launch checks."""


def workdir(chdir: str | None) -> str:
    """The directory the job starts in: `-D` (relative to here), else here, as sbatch does; its
    real path, the links in it resolved now, by the submitter (at launch a link in the path is
    followed only by the path rule: another account may have put it there meanwhile, T19)."""
    where = Path(chdir) if chdir else Path.cwd()
    return os.path.realpath(where)


# --- the commands ---------------------------------------------------------------------------------


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--account", "-A", "account_path", default=None, help="The project to charge.")
@click.option("--gpus", "-G", type=int, default=None, help="How many GPUs.")
@click.option("--gpu-type", default=None)
@click.option("--cluster", default=None)
@click.option(
    "--min-runtime",
    default=None,
    help="Contract: time it may not be preempted once placed, in -t's forms (default: the "
    "cap; 0 = unfunded).",
)
@click.option("--resumable/--not-resumable", default=False, show_default=True)
@click.option(
    "--priority",
    type=int,
    default=0,
    show_default=True,
    help="Orders jobs inside one team only; above 0: managers and admins only.",
)
@click.option(
    "--time",
    "--time-limit",
    "-t",
    "time_limit",
    default=None,
    help="Wall time, as sbatch reads it: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, "
    "or 90s, 2h; <= 15m makes a debug job.",
)
@click.option(
    "--grace", default=None, help="SIGTERM-to-SIGKILL grace when stopped (default 30s, at most 2m)."
)
@click.option("--chdir", "-D", default=None, help="Start in this directory (default: here).")
@click.option(
    "--export",
    default="ALL",
    show_default=True,
    help="The environment it gets: ALL, NONE, or NAME[,NAME=value...] (ALL,... adds to all).",
)
@click.option(
    "--propagate",
    default="ALL",
    is_flag=False,
    flag_value="ALL",
    show_default=True,
    help="The soft resource limits it takes from here, as sbatch's --propagate: ALL, NONE, or "
    "some of AS,CORE,CPU,DATA,FSIZE,MEMLOCK,NOFILE,NPROC,RSS,STACK.",
)
@click.option("--output", "-o", default=None, help="Output file (%j %u %x %a %A %N patterns).")
@click.option("--error", "-e", default=None, help="Error file (default: the output file).")
@click.option("--job-name", "-J", default=None, help="Its name (%x; default the command's).")
@click.option("--array", "-a", "array", default=None, help="A job array: 0-15, 1,3,5, 0-15%4.")
@click.option(
    "--dependency",
    "-d",
    default=None,
    help="afterok|afterany|afternotok:ID[:ID...][,...] or singleton.",
)
@click.option("--label", "labels", multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--duration", default=None, help="Known run time (simulated execution only).")
@click.option("--user", default=None, help="Submit on behalf of USER (managers and admins).")
@click.option(
    "--idempotency-key",
    "key",
    default=None,
    help="Send it under this key (1-128 printable characters): the same submit sent again with "
    "it is answered with the first one's job, never a second (the key an unknown outcome named).",
)
@click.option("--json", "as_json", is_flag=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
def submit(ctx: Ctx, /, **given: Any) -> None:
    """Submit a job: `gpuledger submit -A ai2/olmo -G 8 --min-runtime 2h -- python train.py`, or
    a batch script with #GPULEDGER and #SBATCH lines: `gpuledger submit train.sh`."""
    here = click.get_current_context()
    script = _script(given["command"])
    if script is not None:
        path, text = script
        given = _merged(here, directives(text, path.name), path.name)
        # run as sbatch runs it: through its #! line's interpreter (no execute bit needed)
        given["command"] = (*interpreter(text, path.name), script_name(path, given["chdir"]),
                            *given["command"][1:])  # fmt: skip
        given["job_name"] = given["job_name"] or path.name  # sbatch's default name
    if not given["account_path"] or given["gpus"] is None:
        missing = "-A/--account" if not given["account_path"] else "-G/--gpus"
        raise InvalidCommand(f"missing {missing}", hint="give it, or put it on a #SBATCH line")
    key = given["key"]
    if key is not None and not valid_key(key):
        raise InvalidCommand(
            f"invalid --idempotency-key {key!r}", hint="1-128 printable ASCII characters"
        )
    cmd = _submission(ctx, given)
    appended = ctx.execute(cmd, key)
    jobs = [ev for ev in appended.events if isinstance(ev, JobSubmitted)]
    if given["as_json"]:
        echo_json(jobs[0] if len(jobs) == 1 else jobs)
        return
    job = jobs[0]
    contract = format_duration(job.min_runtime_s)
    funded = "unfunded" if job.min_runtime_s == 0 else f"contract {contract}"
    debug = ", debug class" if job.debug else ""
    if len(jobs) > 1:
        click.echo(
            f"submitted array job {job.job_id} to {job.account}: {len(jobs)} tasks (jobs "
            f"{job.job_id}-{jobs[-1].job_id}), {job.gpus} GPUs each, {funded}{debug}"
        )
    else:
        click.echo(f"submitted job {job.job_id} to {job.account}: {job.gpus} GPUs, {funded}{debug}")
    if job.max_time_s is not None and job.time_limit_s is not None:
        click.echo(taken_note(job, cmd.min_runtime_s))


def taken_note(job: JobSubmitted, asked_min_runtime_s: int | None) -> str:
    """Pure: the one line `submit` says of a job given no time limit on a partition with a
    MaxTime: the limit it took from it (as Slurm gives a job without `--time` its partition's
    limit) and, when its asked contract was longer, that the contract was cut to it."""
    assert job.max_time_s is not None and job.time_limit_s is not None
    cut = asked_min_runtime_s is not None and asked_min_runtime_s > job.min_runtime_s
    asked = format_duration(asked_min_runtime_s)
    contract = f"; its contract ({asked}) is cut to it" if cut else ""
    limit, longest = limit_words(job.time_limit_s), limit_words(job.max_time_s)
    return (
        f"note: no time limit given: its limit is {limit}, the partition's MaxTime as the "
        f"service last read it ({longest}) less its grace and a minute, at which the ledger "
        f"stops it{contract} (-t asks another, within MaxTime)"
    )


def _submission(ctx: Ctx, g: Mapping[str, Any]) -> c.SubmitJob:
    """The SubmitJob the options say, built through its bounded type."""
    environ = os.environ
    env, left, unsendable = environment(g["export"], environ)
    if left:
        click.echo(
            f"note: not sent (secrets, by name or by value: a password in a URL, a token, a "
            f"private key): {', '.join(left)}; pass them to the job another way (a file only "
            "you can read)",
            err=True,
        )
    if unsendable:
        more = " ..." if len(unsendable) > 8 else ""
        shown = ", ".join(
            f"{shown_bytes(n[:64])[1:-1]} ({unsendable_reason(n, environ[n])})"
            for n in unsendable[:8]
        )
        click.echo(
            f"note: --export=ALL left out {len(unsendable)} variable(s) no job can be given "
            f"as they are: {shown}{more}",
            err=True,
        )
    tasks, limit = parse_array(g["array"]) if g["array"] else ((), None)
    fields: dict[str, Any] = dict(
        actor=ctx.actor,
        account=g["account_path"],
        gpus=g["gpus"],
        gpu_type=g["gpu_type"],
        cluster=g["cluster"],
        min_runtime_s=(
            None if g["min_runtime"] is None else parse_job_time(g["min_runtime"], "--min-runtime")
        ),
        resumable=g["resumable"],
        priority=g["priority"],
        time_limit_s=_time_limit(g["time_limit"]),
        unlimited=asks_unlimited(g["time_limit"]),
        command=g["command"],
        labels=_labels(g["labels"]),
        duration_s=None if g["duration"] is None else float(parse_duration(g["duration"])),
        user=g["user"],
        grace_s=None if g["grace"] is None else parse_duration(g["grace"]),
        workdir=workdir(g["chdir"]),
        env=env,
        stdout=g["output"] or "",
        stderr=g["error"] or "",
        job_name=g["job_name"] or "",
        array=tasks,
        array_limit=limit,
        dependency=parse_dependency(g["dependency"]) if g["dependency"] else (),
        umask=own_umask(),  # the job's and its output files', as sbatch records it
        ulimits=propagated(g["propagate"], own_limits()),  # as sbatch propagates them
    )
    utf8_refusal(fields)
    outputs = (fields["stdout"], fields["stderr"])
    job_user = g["user"] or ctx.actor
    for why in warnings_as(job_user, fields["workdir"], outputs, fields["command"]):
        click.echo(
            f"warning: {why} (as this host sees it: the launch on the job's node checks "
            "again and fails the job if it is so there)",
            err=True,
        )
    return build(c.SubmitJob, **fields)


def _time_limit(text: str | None) -> int | None:
    """`-t` as sbatch reads it; 0, UNLIMITED and INFINITE ask for no limit, as in Slurm."""
    if text is None or text.strip().upper() in ("UNLIMITED", "INFINITE"):
        return None
    return parse_job_time(text) or None


def asks_unlimited(text: str | None) -> bool:
    """Pure: `-t` asks for no time limit (0, UNLIMITED, INFINITE), not merely none given: on a
    partition with a MaxTime such a job is refused (`SubmitJob.unlimited`), one without `-t`
    takes MaxTime's."""
    return text is not None and _time_limit(text) is None


_JOB_REF = re.compile(r"^(\d+)(?:_(\d+))?$")


def job_ref(text: str) -> tuple[int, int | None] | None:
    """Pure: a job named as Slurm names it: `ID` (a job, or a whole array by its id) or
    `ARRAY_TASK` (one task of an array: `17_0`), as (id, task or None); None for anything else."""
    m = _JOB_REF.match(text.strip())
    if m is None or int(m[1]) > 2**53 or (m[2] is not None and int(m[2]) > 2**31):
        return None
    return int(m[1]), None if m[2] is None else int(m[2])


def task_job(ctx: Ctx, array: int, task: int) -> int:
    """The job id of task `task` of the array `array` (one clear error when it has none)."""
    for row in ctx.read("jobs", job_ids=(array,), limit=MAX_ARRAY_TASKS):
        if row.array_job_id == array and row.array_task_id == task:
            return int(row.job_id)
    raise InvalidCommand(
        f"job {array} is no array with a task {task}",
        hint=f"see `gpuledger jobs -j {array}`",
    )


@click.command()
@click.argument("job_ids", nargs=-1, required=True)
@pass_ctx
def cancel(ctx: Ctx, job_ids: tuple[str, ...]) -> None:
    """Cancel JOB_ID... (its owner, a manager of its account, or an admin), like scancel: the id
    of a job array (its first task's) cancels every unfinished task of it, ARRAY_TASK (`17_0`)
    that task alone. Each id is cancelled on its own; one that cannot be is one error line, and
    the exit code is 1; an id an earlier one of the same command cancelled is no error.

    A cancel sends SIGTERM and gives the job its grace (`submit --grace`) before SIGKILL; cancel
    it again while it is `stopping` (its processes in that grace) and it is killed at once, as
    a second scancel (or `scancel --signal=KILL`) ends a job Slurm is stopping."""
    failed = 0
    done: set[int] = set()
    for text in job_ids:
        ref = job_ref(text)
        if ref is None:
            click.echo(f"error: invalid job id {text!r} (ID or ARRAY_TASK) [usage]", err=True)
            failed += 1
            continue
        try:
            job_id = ref[0] if ref[1] is None else task_job(ctx, ref[0], ref[1])
            if job_id in done:
                click.echo(f"job {text}: already cancelled above")
                continue
            cmd = c.CancelJob(actor=ctx.actor, job_id=job_id, whole_array=ref[1] is None)
            appended = ctx.execute(cmd)
        except LedgerError as err:  # one line each, and on to the next id
            click.echo(f"error: {' '.join(err.line().split())} [{err.code}]", err=True)
            failed += 1
            continue
        killed = sorted({ev.job_id for ev in appended.events if isinstance(ev, JobKillOrdered)})
        ends = [ev for ev in appended.events if isinstance(ev, JobFinished)]
        if killed and not ends:  # every task of an array in its grace (atk47-23 F13)
            what = f"job {killed[0]} was" if len(killed) == 1 else (
                f"jobs {', '.join(map(str, killed))} were")  # fmt: skip
            click.echo(f"{what} stopping: {_killed(ctx, killed)} (position {appended.position})")
            continue
        # a job past its time limit ends `time_limit`: it timed out, the cancel cut its grace;
        # one whose command had exited 0 ends `completed`: the cancel cut its leftovers' grace
        ended = [ev.job_id for ev in ends if ev.reason in ("cancelled", "time_limit", "completed")]
        done.update(ended)
        what = f"job {ended[0]}" if len(ended) == 1 else f"jobs {', '.join(map(str, ended))}"
        click.echo(f"cancelled {what} (position {appended.position})")
        if killed:  # a requeued job's earlier run in its grace (atk50b-23 F2)
            click.echo(f"  the earlier run of {', '.join(map(str, killed))} was still stopping: "
                       f"{_killed(ctx, killed)}")  # fmt: skip
        timed = [ev.job_id for ev in ends if ev.reason == "time_limit"]
        if timed:
            click.echo(f"  {', '.join(map(str, timed))} had passed its time limit: recorded "
                       f"time_limit, {_killed(ctx, timed)}")  # fmt: skip
        done_ = [ev.job_id for ev in ends if ev.reason == "completed"]
        if done_:  # atk52-23 F2
            click.echo(f"  {', '.join(map(str, done_))} had completed (its command exited 0): "
                       f"recorded completed; the processes it left: "
                       f"{_killed(ctx, done_)}")  # fmt: skip
        for ev in ends:  # its command had exited non-zero: its code kept (atk54-23 F4)
            if ev.reason == "cancelled" and ev.exit_code is not None:
                click.echo(f"  {ev.job_id}'s command had exited {ev.exit_code}: recorded "
                           f"cancelled with exit code {ev.exit_code}")  # fmt: skip
        never = [ev.job_id for ev in ends if ev.reason == "dependency_never_satisfied"]
        if never:
            click.echo(f"  and so {', '.join(map(str, never))} can never run (their dependency)")
    if failed:
        sys.exit(1)


def _killed(ctx: Ctx, jobs: Sequence[int]) -> str:
    """What a kill the cancel ordered (`job.kill_ordered.v1`) does now: a service's engine kills
    at once where it hears from the nodes (`kill_words`); with none running (the command was
    embedded) nothing can until one starts, which then kills at once (stop51: `killed now` was
    said with `up` down)."""
    if ctx.remote is None:
        return "SIGKILL ordered (no service runs now: killed as soon as one starts)"
    from ledger.store.clock import SystemClock

    try:
        rows = ctx.read("nodes")
    except LedgerError:  # the kill is ordered; only its words would say less
        rows = []
    return kill_words(rows, jobs, SystemClock().now())


SILENT_S = 10.0
"""A node not heard from for longer (twice an agent's default heartbeat) is silent: a kill
ordered for a run on it waits for its agent (atk52-23 F6)."""


def kill_words(rows: Sequence[Any], jobs: Sequence[int], now: float) -> str:
    """Pure: what a kill ordered now for `jobs` does, from the node view (`NodeRow`s): "killed
    now", or, when a node they are on (among its `jobs` or `stopping_jobs`) has not been heard
    from for more than `SILENT_S`, that the SIGKILL is owed until that node's agent is back."""
    from schemas.units import when

    wanted = set(jobs)
    silent = [
        r for r in rows
        if wanted & {*r.jobs, *r.stopping_jobs}
        and r.heard_from is not None and now - r.heard_from > SILENT_S
    ]  # fmt: skip
    if not silent:
        return "killed now"
    nodes = "; ".join(
        f"{r.node}'s agent has not been heard from since {when(r.heard_from)} "
        f"({now - r.heard_from:.0f} s ago)"
        for r in silent
    )
    return (
        f"SIGKILL ordered, not sent yet: {nodes}; it is sent when the agent is back (if the "
        "node stays silent, the ledger records it lost and its lease fences its processes)"
    )


COMMANDS = [submit, cancel]
