"""The bounds of every value a command or an event carries: one named type per kind of value.

Commands and events declare their fields with these types, so the limits live in the schema
(`msgspec.Meta`), travel into the exported JSON Schemas, and are checked wherever a command is
built from outside data: the CLI and the budget TOML loader build commands with
`msgspec.convert`, the HTTP API decodes them, and the domain re-checks every command it is handed
(`validate`), so a Struct built in Python with a bad value is refused too. A bounded float is
finite: NaN and infinity fail `ge`/`le`.

Integers fit the columns that store them exactly (SQLite INTEGER, DuckDB INTEGER/BIGINT); times
are seconds since the epoch before the year 3000; durations are whole seconds up to ten years.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from schemas.errors import InvalidCommand, TooLarge

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
"""A user, node or account-path part: letters, digits, '_', '.', '-', at most 63 characters."""

INT32_MAX = 2**31 - 1
TEN_YEARS_S = 10 * 365 * 86_400
YEAR_3000 = 32_503_680_000.0
MAX_GPUS_PER_NODE = 64

MAX_NAME = 63
Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME)]
"""A user, node, GPU type or cluster name (the domain checks the characters: NAME_PATTERN).
Lengths only: what else a name must be, the domain says (one copy of each rule)."""
AccountPath = Annotated[str, msgspec.Meta(max_length=255)]
Actor = Annotated[str, msgspec.Meta(max_length=64)]
Text = Annotated[str, msgspec.Meta(max_length=1_000)]
"""Reasons and notes people write."""
LongText = Annotated[str, msgspec.Meta(max_length=65_536)]
"""Text the dispatcher writes (a wait reason may list many jobs)."""
Token = Annotated[str, msgspec.Meta(max_length=128)]
"""Ids, hashes, cycle ids, policy versions."""
TokenId = Annotated[str, msgspec.Meta(max_length=32)]
"""A bearer token's public id (the domain checks its form: 8 to 32 lowercase hex digits)."""
Sha256Hex = Annotated[str, msgspec.Meta(max_length=64)]
"""A SHA-256 digest (the domain checks its form: lowercase hex)."""

MAX_JOB_ID = 2**53
JobId = Annotated[int, msgspec.Meta(ge=1, le=MAX_JOB_ID)]
Position = Annotated[int, msgspec.Meta(ge=0, le=2**62)]
JobGpus = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
NodeGpus = Annotated[int, msgspec.Meta(ge=1, le=MAX_GPUS_PER_NODE)]
GpuIndex = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPUS_PER_NODE - 1)]
Count = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Shares = Annotated[int, msgspec.Meta(ge=0, le=1_000_000_000)]
Priority = Annotated[int, msgspec.Meta(ge=-1_000_000_000, le=1_000_000_000)]
Seconds = Annotated[int, msgspec.Meta(ge=0, le=TEN_YEARS_S)]
"""A whole number of seconds: a contract (`min_runtime_s`: 0 unfunded, else at least 1 s)."""
PositiveSeconds = Annotated[int, msgspec.Meta(ge=1, le=TEN_YEARS_S)]
RECORDED_GRACE_S = 3600
GraceSeconds = Annotated[int, msgspec.Meta(ge=0, le=RECORDED_GRACE_S)]
"""SIGTERM-to-SIGKILL grace of a job being stopped, as recorded: whole seconds, at most the hour
submit took before `MAX_GRACE_S` (events and the agents' parts read every recorded job)."""
DEFAULT_GRACE_S = 30.0
"""The services' grace for a job that names none (`serve`/`up --grace`'s default)."""
MAX_GRACE_S = 120
"""The most SIGTERM-to-SIGKILL grace a job may ask for (`submit --grace`), a service may be
started with (`serve`/`up`/`agent --grace`), and the most any job gets at its stop, recorded
before this cap or not (`job_grace`): like Slurm's KillWait, the
time a job may outlive its limit or a cancel is the site's, not the user's (a `-t 0:05 --grace
1h` debug job held its GPU an hour past its limit: atk46-23 F7)."""
SubmitGraceSeconds = Annotated[int, msgspec.Meta(ge=0, le=MAX_GRACE_S)]


def job_grace(asked: float | None, default: float) -> float:
    """Pure: the grace a job gets when stopped: its own, else the service's `default` (the
    admin's setting), at most `MAX_GRACE_S` either way. The one cap every engine and read
    applies: an agent is handed the service's grace as the part's own and caps it, so a service
    grace above the cap (a log written before `--grace` was refused above it) is the cap's
    (atk49-23 F6: the reads said stop + 600 s, the agent killed at stop + 120 s)."""
    return min(float(default if asked is None else asked), float(MAX_GRACE_S))


Umask = Annotated[int, msgspec.Meta(ge=0, le=0o777)]
"""A file mode creation mask (`umask`), as a number (0o022 is 18)."""
LIMIT_NAMES = ("as", "core", "cpu", "data", "fsize", "memlock", "nofile", "nproc", "rss", "stack")
"""The resource limits a job takes from its submitter, as Slurm's PropagateResourceLimits=ALL
(its default) names them: RLIMIT_AS, _CORE, _CPU, _DATA, _FSIZE, _MEMLOCK, _NOFILE, _NPROC,
_RSS and _STACK."""
LimitName = Literal[
    "as", "core", "cpu", "data", "fsize", "memlock", "nofile", "nproc", "rss", "stack"
]
UNLIMITED = -1
"""A limit that is no limit (RLIM_INFINITY, `ulimit ... unlimited`)."""
LimitValue = Annotated[int, msgspec.Meta(ge=UNLIMITED, le=2**63 - 1)]
"""A soft resource limit in getrlimit's units (bytes, seconds or a count), -1 unlimited."""
Ulimits = Annotated[dict[LimitName, LimitValue], msgspec.Meta(max_length=len(LIMIT_NAMES))]
"""The submitter's soft resource limits by name (`LIMIT_NAMES`), as `submit` read them."""
PositiveInterval = Annotated[float, msgspec.Meta(ge=0.001, le=float(TEN_YEARS_S))]
"""How often a loop runs (seconds, a fraction allowed)."""
FloatSeconds = Annotated[float, msgspec.Meta(ge=0.0, le=float(TEN_YEARS_S))]
"""Seconds with a fraction (a simulated run time, a usage window). A config's written duration
("2h") is `schemas.units.Duration`."""
Epoch = Annotated[float, msgspec.Meta(ge=0.0, le=YEAR_3000)]
ExitCode = Annotated[int, msgspec.Meta(ge=-INT32_MAX - 1, le=INT32_MAX)]
Percent = Annotated[float, msgspec.Meta(ge=0.0, le=100.0)]
TeamDepth = Annotated[int, msgspec.Meta(ge=1, le=64)]
"""How deep a team sits in the budget tree (1 = programs, 2 = projects under programs)."""

Arg = Annotated[str, msgspec.Meta(max_length=4_096)]
CommandLine = Annotated[tuple[Arg, ...], msgspec.Meta(max_length=1_024)]
MAX_PATH = 4_096
Path = Annotated[str, msgspec.Meta(max_length=MAX_PATH)]
"""A file or directory path as submitted (a job's working directory, its output file pattern):
submit keeps an output pattern's expansion within it too (`ledger.core.jobs.check_pattern`)."""
MAX_LOG_PATH = 2 * MAX_PATH + 1
"""The longest output file a job's launch may name: its working directory (a `Path`), '/', and
its output pattern written out (within `MAX_PATH`). Every reader of a launch (the agents' poll
answer, an agent's start report) takes this much, so no submission can make one it refuses
(a 4,103-character default output under a 4,085-character cwd wedged a node: atk46-23 F13)."""
LogPath = Annotated[str, msgspec.Meta(max_length=MAX_LOG_PATH)]
LogItem = Annotated[str, msgspec.Meta(max_length=MAX_NAME + 1 + MAX_LOG_PATH)]
"""Where one part of a run writes: `<node>:<path>` (the node's name as the prefix: a path of
4,096 characters was refused with it, the run's start dropped: atk46-23 F14)."""
LogPaths = Annotated[tuple[LogItem, ...], msgspec.Meta(max_length=1_000_000)]
"""Where a job's parts write their output: one path per part (at most one part per GPU)."""
EnvName = Annotated[str, msgspec.Meta(max_length=255)]
"""An environment variable's name (the domain checks its form: ENV_NAME_PATTERN)."""
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_ENV_VALUE = 16_384
EnvValue = Annotated[str, msgspec.Meta(max_length=MAX_ENV_VALUE)]
MAX_ENV_BYTES = 256 * 1024
"""The most a job's environment may hold, names and values together (the domain checks it)."""
MAX_ENV_VARS = 2_048
Environment = Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=MAX_ENV_VARS)]
"""A job's environment as submitted (after `--export`): at most 2,048 variables."""
EnvPairs = Annotated[tuple[tuple[EnvName, EnvValue], ...], msgspec.Meta(max_length=MAX_ENV_VARS)]
"""A job's environment as its launch carries it (the agents' poll answer): what `Environment`
takes, so a value submit accepts never fails a reader (4,096 per value there, 16,384 at submit,
killed an agent's poll: atk46-23 F13)."""
MAX_JOB_NAME = 255
JobName = Annotated[str, msgspec.Meta(max_length=MAX_JOB_NAME)]
"""A job's name (`-J`): what `%x` writes and `--dependency=singleton` groups by."""
MAX_ARRAY_TASKS = 10_000
MAX_ARRAY_INDEX = 4_000_000
ArrayIndex = Annotated[int, msgspec.Meta(ge=0, le=MAX_ARRAY_INDEX)]
"""A job array's task index (`--array=0-15`, `1,3,5`)."""
ArrayTasks = Annotated[tuple[ArrayIndex, ...], msgspec.Meta(max_length=MAX_ARRAY_TASKS)]
ArrayLimit = Annotated[int, msgspec.Meta(ge=1, le=MAX_ARRAY_TASKS)]
"""How many tasks of an array may hold GPUs at once (`--array=0-15%4`)."""
LabelKey = Annotated[str, msgspec.Meta(max_length=63)]
Labels = Annotated[dict[LabelKey, Text], msgspec.Meta(max_length=64)]
Config = Annotated[dict[LabelKey, Text], msgspec.Meta(max_length=64)]
GpuIndices = Annotated[tuple[GpuIndex, ...], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)]
Utilisation = Annotated[tuple[Percent, ...], msgspec.Meta(max_length=1_000_000)]
KeyValue = (
    Annotated[int, msgspec.Meta(ge=-(2**62), le=2**62)]
    | Annotated[float, msgspec.Meta(ge=-1e18, le=1e18)]
    | Annotated[str, msgspec.Meta(max_length=255)]
)
SortKey = Annotated[tuple[KeyValue, ...], msgspec.Meta(max_length=32)]

MAX_EVENT_BYTES = 900 * 1024
"""The most one event may take stored (its JSON), so every reader takes it: the relay publishes
each event as one Kafka record, and a broker refuses a record past its `message.max.bytes`
(1,048,588 by default; the relay sets it on the topic it creates), key and headers included
(under 1 KiB). A command whose event would be larger is refused, nothing written (a 1.2 MB
command line stopped the relay for good: atk44-25 F8). The dispatcher's decision records are
not refused here (a cycle must go on); the relay says which record it cannot publish."""
MAX_DEPENDENCY_IDS = 1_024
"""The most job ids a submission's dependency may name in all its terms together, each id
counted once per kind (`afterok:5,afterok:5:6` names two): every one is looked up in the state
when the job is submitted, so their number bounds what the submission costs the group commit
(1,024 terms of 1,024 ids each were allowed, every one looked up, repeats included: a plain
user's 825 KB submit held the server 50 s, atk45-25 F3). The schema bounds each term's list to
1,024 ids and the terms to 1,024 (`schemas.event_base.LISTED`); this bounds their sum."""
MAX_FOREIGN_DEPENDENTS = 10_000
"""The most unfinished jobs that may wait on one job when another user's submission adds to
them: a job's end ends, in its own write, every dependent it makes impossible, so their number
is what another user's jobs make that write cost (atk46-25: 40,000 held the writer 4 s, 44,000
made the job's end unrecordable). A submission naming a job of another user is refused (409)
when the job would have more waiting on it; the owner's own submissions are not."""
MAX_REQUEST_WRITTEN = 16 << 20
"""The most one request (a command, an array's every task, a batch) may write to the log, all
its events together (a 105 KB array request of 1,000 tasks wrote 186 MiB: atk44-25 F12)."""


def check_written(tag: str, size: int, total: int) -> None:
    """Pure: None if an event of `size` bytes, `total` with the request's events before it,
    stays within MAX_EVENT_BYTES and MAX_REQUEST_WRITTEN, else `TooLarge` in one line."""
    if size > MAX_EVENT_BYTES:
        raise TooLarge(
            f"{tag} would be {size:,} bytes stored, more than the {MAX_EVENT_BYTES:,} an event "
            "may be (what every reader of the log, Kafka's included, accepts); nothing written",
            hint="shorten the command line, environment or labels (put long arguments in a file)",
        )
    if total + size > MAX_REQUEST_WRITTEN:
        raise TooLarge(
            f"this request would write more than {MAX_REQUEST_WRITTEN:,} bytes to the log "
            f"(at its {tag}); nothing written",
            hint="submit fewer array tasks or a shorter command, or split the batch",
        )


S = TypeVar("S", bound=msgspec.Struct)


def validate(value: S) -> S:
    """`value` if every field is inside its type's bounds, else `msgspec.ValidationError`.

    Structs built in Python skip their `Meta` checks; a round trip through builtins applies them
    (not through JSON, which would turn NaN and infinity into null)."""
    checked: S = msgspec.convert(msgspec.to_builtins(value), type(value))
    return checked


_EXPECTED = re.compile(r"^Expected `(?P<what>[^`]+)`(?P<rest>.*?)(?: - at `\$\.?(?P<at>[^`]*)`)?$")


def describe(err: msgspec.ValidationError, data: Any = None) -> str:
    """One readable clause from msgspec's message, with the offending value when `data` (the
    builtins that failed) is given: "`priority` must be int <= 1000000000, got 10**20"."""
    m = _EXPECTED.match(str(err))
    if m is None:
        return str(err)
    at = f"`{m['at']}` " if m["at"] else ""
    rest = m["rest"].strip()
    rest = rest.replace("got `", "not `") if rest.startswith("got") else rest
    text = f"{at}must be {m['what']} {rest}".rstrip().replace(" ,", ",")
    found, value = field_value(data, m["at"] or "")
    if found and not isinstance(value, dict | list):
        # the value says more than the type msgspec named ("got `null`, got None": atk48-29 F10)
        text = re.sub(r", got `[^`]*`$", "", text)
        shown = "null" if value is None else repr(value)
        text += f", got {shown if len(shown) <= 40 else shown[:37] + '...'}"
    return text


_STEP = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def field_value(data: Any, path: str) -> tuple[bool, Any]:
    """Pure: (True, the value at a msgspec error path like `slots[0].node`) in `data`, or
    (False, None) when the path does not lead to one."""
    if data is None:
        return False, None
    value = data
    try:
        for name, index in _STEP.findall(path):
            value = value[name] if name else value[int(index)]
    except (KeyError, IndexError, TypeError):
        return False, None
    return True, value


def check(value: Any, typ: Any, what: str) -> Any:
    """`value` converted to `typ` (a bounded type above), else one `InvalidCommand` naming
    `what` (an option, a field)."""
    try:
        return msgspec.convert(value, typ)
    except msgspec.ValidationError as e:
        raise InvalidCommand(f"invalid {what}: {describe(e, value)}") from e


def check_command(cmd: msgspec.Struct) -> None:
    """Every field of a command inside its type's bounds: the one check of them, whoever built
    the command (a Struct built in Python skips its `Meta`), the domain's `decide` and the
    HTTP client alike (a client checks before any request, without loading the domain); out of
    bounds is one `InvalidCommand` naming the command and the field."""
    try:
        validate(cmd)
    except msgspec.ValidationError as err:
        op = type(cmd).__struct_config__.tag
        data = msgspec.to_builtins(cmd)
        field = str(err).rpartition("at `$.")[2].rstrip("`")
        found, value = field_value(data, field)
        fields = {field: value} if found and field.isidentifier() else {}
        raise InvalidCommand(
            f"invalid {op} command: {describe(err, data)}", op=op, **fields
        ) from err


MAX_READ_ROWS = 10_000
"""The most rows a read answers through the server in one page (`ledger.server.pooled`); the
CLI asks one row more than it shows, to say whether more match, only below it."""
