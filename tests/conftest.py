"""Shared fixtures: a virtual clock, seeded ids, a small organisation, ledgers on tmp_path.

The organisation (`org_commands`), used across unit and integration tests:

    root            admin
    ai2             program            managed by pm
    ai2/olmo        project, shares 3  managed by mgr; members alice, bob
    ai2/tulu        project, shares 1  member carol
    n1, n2          8 x h100 each
    a1              4 x a100
    (20 GPUs in all: 16 h100, 4 a100; the contract cap is the default 8 h)
"""

from __future__ import annotations

import itertools
import os
import re
import resource
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from schemas import commands as c


def pytest_configure(config: pytest.Config) -> None:
    """The suite runs without the caller's secret-looking variables (a CI's `GITHUB_TOKEN`, a
    developer's `OPENAI_KEY`): a submit from such a shell leaves them out with a note line, and
    the tests that count a command's lines, or plant their own secrets, must not depend on the
    shell they were started from. Tests that need one set it themselves."""
    from ledger.core.secret_shapes import SECRET_NAMES

    if not hasattr(config, "workerinput") and (turns := os.environ.pop(TURNS, "")):
        _TURNS_DIR[:] = [turns]  # xdist's controller: its workers are told (`TURNS`)
    kept = {"GPULEDGER_PG_DSN"}  # scripts/test's own PostgreSQL (a `_DSN` name is a secret's)
    for name in [n for n in os.environ if re.match(SECRET_NAMES, n) and n not in kept]:
        del os.environ[name]
    # the CLI keeps the position of its last write under XDG_STATE_HOME (ledger.wire.written):
    # the suite's own, not the caller's home
    import atexit
    import shutil
    import tempfile

    state = tempfile.mkdtemp(prefix="gpuledger-test-state-")
    os.environ["XDG_STATE_HOME"] = state
    atexit.register(shutil.rmtree, state, True)


SLURM_FILES = "test_slurm"
"""The test files (`tests/integration/test_slurm*.py`) that run on the suite's Slurm clusters
(the fixture `cluster` of test_slurm.py): each file on the cluster of its group, one set of GPUs
with its own foreign jobs, so a group's files run one after the other on one worker. The clusters
share one host and their jobs one user (`nobody`): a test's job never signals processes by name
(a job's `pkill -f slurm_script` killed every cluster's batch scripts: CI of stops 55 and 56), and
a test kills by a pid only while it is still what the test meant (`test_slurm_trees.kill_of_job`,
`Cluster.running`): pids wrap fast here."""

SLURM_SECONDS: dict[str, float] = {
    "test_slurm": 529,
    "test_slurm_command_path": 39,
    "test_slurm_ctldloss": 164,
    "test_slurm_epilog": 227,
    "test_slurm_faults": 255,
    "test_slurm_foreign_work": 66,
    "test_slurm_gang": 814,  # alone on its cluster and worker
    "test_slurm_marks": 33,
    "test_slurm_nodefail": 309,
    "test_slurm_nodefail_kill": 312,
    "test_slurm_opening": 118,
    "test_slurm_reaping": 18,
    "test_slurm_records": 95,
    "test_slurm_stepd": 42,
    "test_slurm_stops": 435,
    "test_slurm_stopend": 182,
    "test_slurm_takeback_doubt": 189,
    "test_slurm_trees": 127,
    "test_slurm_unpinned": 46,
    "test_slurm_world": 543,
}
"""Each Slurm file's seconds, its tests' own times with set-up and tear-down, as scripts/test runs
them: the split below balances on them. Stop 62's CI (2026-12-07, s63): each Slurm group's own
seconds (slurm-a 759, slurm-b 1,062, slurm-c 702, slurm-d 1,204, slurm-g 814) shared over its
files in the proportions measured before (2026-12-03, load 16-32; docs/benchmarks.md, "The test
suite's Slurm groups"); the split of those measured before left slurm-d 1,204 s and slurm-c 702 s.
A Slurm file missing here fails the collection: measure it and add it."""

GANG = "slurm-g"
"""The Slurm group of the files that need a cluster of two nodes (gangs, `SLURM_GANG_FILES`), on
the cluster scripts/test starts with two slurmd (GPULEDGER_SLURM_NODES=2): theirs alone."""
SLURM_GANG_FILES = ("test_slurm_gang",)

SLURM_CONF_OF = {
    "slurm-a": "SLURM_CONF",
    "slurm-b": "GPULEDGER_SLURM_CONF_B",
    "slurm-c": "GPULEDGER_SLURM_CONF_C",
    "slurm-d": "GPULEDGER_SLURM_CONF_D",
    GANG: "GPULEDGER_SLURM_CONF_G",
}
"""Each Slurm group's cluster: the variable holding its slurm.conf (scripts/test starts one
cluster per group, each with its own data dir, ports, munge and node name, and exports each)."""


def split_files(seconds: dict[str, float], names: tuple[str, ...]) -> dict[str, list[str]]:
    """Pure: the files in one group per name, of near-equal seconds: the longest file first, each
    to the group with fewer seconds so far (ties: the first group; files of equal seconds by
    name). The groups differ by at most the longest file's seconds. (The Slurm files over their
    clusters, `SLURM_CONF_OF`; the PostgreSQL outage files over their pairs, `PG_OUTAGE_GROUPS`.)"""
    groups: dict[str, list[str]] = {g: [] for g in names}
    total = dict.fromkeys(names, 0.0)
    for name in sorted(seconds, key=lambda n: (-seconds[n], n)):
        group = min(total, key=lambda g: total[g])
        groups[group].append(name)
        total[group] += seconds[name]
    return {g: sorted(files) for g, files in groups.items()}


SLURM_GROUPS = split_files(
    {f: s for f, s in SLURM_SECONDS.items() if f not in SLURM_GANG_FILES},
    tuple(g for g in SLURM_CONF_OF if g != GANG),
) | {GANG: sorted(SLURM_GANG_FILES)}
"""The Slurm group of every Slurm file: "slurm-a" on one cluster, "slurm-b" on another, ..."""


def _group_of(path: Path, prefix: str, groups: dict[str, list[str]], unmeasured: str) -> str | None:
    """The group (of `groups`) of an integration test file whose name starts with `prefix`,
    None for any other file; such a file in no group is an error saying `unmeasured`."""
    if path.parent.name != "integration" or not path.name.startswith(prefix):
        return None
    for group, names in groups.items():
        if path.stem in names:
            return group
    raise pytest.UsageError(f"{path.name} is {unmeasured}")


def slurm_group(path: Path) -> str | None:
    """The Slurm group of a test file, None for a file that is not one of the Slurm files; a
    Slurm file in no group (not in `SLURM_SECONDS`) is an error."""
    return _group_of(path, SLURM_FILES, SLURM_GROUPS,
                     "a Slurm test file in no Slurm group: measure it alone (`pytest "
                     "--durations=0`) and add its seconds to SLURM_SECONDS in "
                     "tests/conftest.py")  # fmt: skip


def slurm_conf(group: str, environ: Mapping[str, str]) -> str:
    """The slurm.conf of a Slurm group's cluster, from `environ`; raises `LookupError` with what
    to do when it is not set. Run by one process (no xdist workers), every group may use the
    first group's cluster: their files then run one after the other, never side by side."""
    name = SLURM_CONF_OF[group]
    conf = environ.get(name, "")
    if not conf and group not in ("slurm-a", GANG) and "PYTEST_XDIST_WORKER" not in environ:
        conf = environ.get(SLURM_CONF_OF["slurm-a"], "")  # (one node: never the gang group's)
    if not conf:
        nodes = "GPULEDGER_SLURM_NODES=2 " if group == GANG else ""
        raise LookupError(
            f"{name} is not set to a slurm.conf (the cluster of the {group} tests); run the suite "
            "with scripts/test, which starts one cluster per group, or "
            f"`export {name}=$({nodes}GPULEDGER_SLURM_DATA=DIR scripts/slurm/slurm up)`"
        )
    others = {environ.get(v, "") for g, v in SLURM_CONF_OF.items() if g != group}
    if "PYTEST_XDIST_WORKER" in environ and conf in others:
        raise LookupError(
            f"{name} is another Slurm group's cluster too ({conf}): under xdist the "
            "groups run side by side and need a cluster each (scripts/test starts one per group)"
        )
    return conf


PG_OUTAGE = "test_pg_outage_"
"""The test files (`tests/integration/test_pg_outage_*.py`) that stop, freeze and kill a
PostgreSQL primary and its synchronous standby (`pg_outage_pair`, each test on a fresh database
of it). The pair is a session fixture: each xdist worker starts its own, on free ports in a
directory of its own, so the files split into groups (`PG_OUTAGE_GROUPS`), each on one worker
with that worker's pair: one group's outage never reaches another's."""

PG_OUTAGE_SECONDS: dict[str, float] = {
    "test_pg_outage_agents": 162,
    "test_pg_outage_frozen": 180,
    "test_pg_outage_hung": 116,
    "test_pg_outage_hung_cli": 87,
    "test_pg_outage_in_doubt": 156,
    "test_pg_outage_jobs": 107,
    "test_pg_outage_lead": 238,
    "test_pg_outage_new_settings": 105,
    "test_pg_outage_primary_stopped": 12,
    "test_pg_outage_schema_lock": 17,
    "test_pg_outage_sessions": 60,
    "test_pg_outage_start": 78,
    "test_pg_outage_stop": 57,
}
"""Each outage file's seconds, its tests' own times with set-up and tear-down, as scripts/test
runs them (2026-12-06, load 10-27; docs/benchmarks.md, "The PostgreSQL outage files on two
pairs"): the split balances on them. An outage file missing here fails the collection: measure
it and add it."""

PG_OUTAGE_GROUPS = split_files(PG_OUTAGE_SECONDS, ("pg_outage-a", "pg_outage-b"))
"""The outage group of every outage file: two groups, so two workers and two pairs (the one
group, ~1,200 s at load 14-30 and ~12 min in CI, was the rest's longest serial chain)."""


def pg_outage_group(path: Path) -> str | None:
    """The outage group of a test file, None for a file that is not an outage file; an outage
    file in no group (not in `PG_OUTAGE_SECONDS`) is an error."""
    return _group_of(path, PG_OUTAGE, PG_OUTAGE_GROUPS,
                     "a PostgreSQL outage test file in no outage group: measure it alone "
                     "(`scripts/test FILE --durations=0`) and add its seconds to "
                     "PG_OUTAGE_SECONDS in tests/conftest.py")  # fmt: skip


REST_SECONDS = {
    **{g: sum(PG_OUTAGE_SECONDS[f] for f in files) for g, files in PG_OUTAGE_GROUPS.items()},
    "integration/test_node_agents": 260,
    "integration/test_node_agents_ids": 130,
    "integration/test_dashboard_scale": 287,
    "integration/test_sbatch_like": 286,
    "integration/test_leader_exit_stop_up": 256,
    "integration/test_server": 234,
    "integration/test_ha_slurm_cluster": 216,
    "security/test_security_kafka": 202,
    "integration/test_dashboard_whatif": 190,
    "integration/test_audit_progress": 165,
    "integration/test_server_schema": 160,
}
"""The rest part's longest groups and their seconds, their tests' own times (the files: stop 57's
CI, 2026-12-06, its 15 longest groups; test_server_schema, under them since s57, ~160 s; the
PostgreSQL outage groups: `PG_OUTAGE_SECONDS`). The rest takes them first, longest first, then
the other files in their order: the outage files, then one group on one worker (~12 min in the
last CI's timings), were taken halfway through the files (`test_pg_*`), where on three workers
they would end minutes after the others; test_leader_exit_stop_up and test_ha_slurm_cluster,
not listed before, were taken in file order; test_node_agents' 391 s split with its identity
tests (test_node_agents_ids.py, s60) as the two took 122 s and 60 s at load ~3."""


PART = "GPULEDGER_TEST_PART"
"""`slurm`: only the Slurm files (`SLURM_GROUPS`); `rest`: all but them; unset: all.
(scripts/test runs both in one session: `TURNS`.)"""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`scripts/test` runs the suite on workers (pytest-xdist, `--dist loadgroup`). Each test
    file is one group, run on one worker in its order, as it runs alone: its module-scoped
    fixtures (a server, a ledger) are made once, and a test may build on the one before it.
    The Slurm files are groups "slurm-a", "slurm-b", ... (`SLURM_GROUPS`), each on its own
    cluster: a group's files share one cluster, so they run on one worker; the PostgreSQL outage
    files are groups too (`PG_OUTAGE_GROUPS`), each on one worker and its pair.

    The Slurm groups come first, then the rest's longest groups (`REST_SECONDS`), the others in
    file order (the integration files, then the unit ones): `scripts/test` passes
    `--no-loadscope-reorder`, so a worker takes the groups in this order, and xdist hands each
    worker one group to start with: each worker starts with one Slurm group (the Slurm files
    wait on Slurm's clocks, KillWait and SlurmdTimeout, far more than they use the CPU: one
    group took ~18-21 of the suite's minutes on one worker) and takes the other files as it
    ends. xdist's own order (the groups with the most tests first) started the Slurm tests
    halfway and left files of one long test, such as test_pg_outage_*.py, to the end, each one a
    tail that one worker ran alone. With `PART` set, only that part's tests run. (scripts/test:
    one session on eight workers, the Slurm groups on five, the gang group's among them, the rest
    on three and then on the Slurm groups' workers as they end: `TURNS`; the rest's longest
    groups first: `REST_SECONDS`.)"""
    slurm: dict[str, list[pytest.Item]] = {g: [] for g in SLURM_GROUPS}
    rest: list[pytest.Item] = []
    for item in items:
        in_slurm = slurm_group(item.path)
        if in_slurm is not None:
            group = in_slurm
            slurm[group].append(item)
        elif (outage := pg_outage_group(item.path)) is not None:
            group = outage  # the pair of the worker that runs the group (pgoutkit.py)
            rest.append(item)
        else:
            group = f"{item.path.parent.name}/{item.path.stem}"
            rest.append(item)
        item.add_marker(pytest.mark.xdist_group(group))
    ordered = [i for group in slurm.values() for i in group]
    rest = longest_first(rest)
    part = os.environ.get(PART, "")
    if part not in ("", "slurm", "rest"):
        raise pytest.UsageError(f"{PART}={part!r}: give slurm, rest or nothing")
    if part:  # only one part's tests
        kept, dropped = (ordered, rest) if part == "slurm" else (rest, ordered)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    else:
        items[:] = ordered + rest


TURNS = "GPULEDGER_TEST_TURNS"
"""A directory of turns (scripts/test makes it): lock files `turn-1` ... `turn-N` (N:
`GPULEDGER_TEST_REST_AT_ONCE`, 5) and `at-first` holding a number (`GPULEDGER_TEST_WORKERS`, 3).
Under xdist a group of the rest runs only while its worker holds a turn (`flock`, given back
after the group's last test or when the worker dies); of the N turns, `at-first` are open at
first and one more each time a Slurm group ends (its worker leaves `ended-<group>` there). So
in scripts/test's one session on 5 + 3 workers, three take the rest while the five Slurm groups
run, and each worker whose Slurm group has ended takes the rest's groups too, up to N at once
(the Slurm groups wait on Slurm's clocks, ~2.3 of 2 cores for the four one-node groups: a rest
group in an ended Slurm group's place keeps the machine's load about where it was; the gang
group, `GANG`, on a worker of its own from the start, is one more process then, and its end one
more turn). Read by the controller
and handed to its workers (`pytest_configure_node`): a session a test starts itself never waits
for a turn its own worker holds."""

_TURNS_DIR: list[str] = []
"""The controller's `TURNS` directory (taken out of the environment: nested sessions inherit
nothing of it)."""

_HELD: dict[str, Any] = {}
"""This worker's turn: its group and the open lock file."""


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller, per worker: the turns' directory (`TURNS`)."""
    if _TURNS_DIR:
        node.workerinput[TURNS] = _TURNS_DIR[0]


def group_of_item(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark and mark.args else ""


def open_turns(turns: Path) -> int:
    """How many of the turns in `turns` are open now: `at-first`, plus one a Slurm group ended,
    never more than there are turns."""
    first = int((turns / "at-first").read_text())
    return min(len(list(turns.glob("turn-*"))), first + len(list(turns.glob("ended-*"))))


def take_turn(turns: Path, poll_s: float = 0.2) -> Any:
    """Block until one of the open turns in `turns` is this process's (`flock`); the open file
    (closing it gives the turn back)."""
    import fcntl
    import time

    while True:
        for k in range(1, open_turns(turns) + 1):
            held = open(turns / f"turn-{k}", "rb")  # noqa: SIM115 (kept while the group runs)
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.close()
                continue
            return held
        time.sleep(poll_s)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under xdist with `TURNS`: a rest group's first test waits for a turn, its last gives it
    back (the module's fixtures torn down within it); a Slurm group's last opens one more."""
    workerinput = getattr(item.config, "workerinput", None)
    turns = Path(workerinput[TURNS]) if workerinput and TURNS in workerinput else None
    group = group_of_item(item)
    if turns and group not in SLURM_GROUPS and _HELD.get("group") != group:
        if _HELD:
            _HELD.pop("file").close()
            _HELD.clear()
        _HELD["file"] = take_turn(turns)
        _HELD["group"] = group
    yield
    last = nextitem is None or group_of_item(nextitem) != group
    if _HELD and last:
        _HELD.pop("file").close()
        _HELD.clear()
    if turns and last and group in SLURM_GROUPS:
        (turns / f"ended-{group}").touch()


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """Pure: `items` with the groups of `REST_SECONDS` first, longest first (a stable sort: each
    group's tests in their order, the other groups in theirs)."""
    rank = {g: i for i, g in enumerate(sorted(REST_SECONDS, key=lambda g: -REST_SECONDS[g]))}

    def place(item: pytest.Item) -> int:
        return rank.get(group_of_item(item), len(rank))

    return sorted(items, key=place)


def group_of_report(nodeid: str) -> str:
    """Pure: the xdist group a report's node id names (`--dist loadgroup` appends `@group`),
    else its file."""
    last = nodeid.rsplit("::", 1)[-1]
    return last.rsplit("@", 1)[1] if "@" in last else nodeid.split("::", 1)[0]


def longest_groups(seconds: Mapping[str, float], workers: int, top: int = 15) -> str:
    """Pure: the line that ends a run's output: the `top` longest groups by their tests' own
    seconds, and all the groups' seconds over the workers (what the run's wall cannot beat)."""
    total = sum(seconds.values())
    ranked = sorted(seconds.items(), key=lambda gs: (-gs[1], gs[0]))[:top]
    return (f"=== the groups' own seconds (set-up, call, tear-down): {total:,.0f} s in "
            f"{len(seconds)} groups, {total / max(1, workers):,.0f} s a worker over {workers}; "
            "the longest: " + ", ".join(f"{g} {s:,.0f} s" for g, s in ranked) + " ===")  # fmt: skip


def costliest_groups(cpu: Mapping[str, float], wall: float, top: int = 15) -> str:
    """Pure: the line after it: the groups' CPU seconds (their workers' and the processes those
    reaped: servers, agents, CLIs; not Kafka's, PostgreSQL's or Slurm's daemons), the `top`
    costliest first. On two cores the suite is CPU-bound (load 10-27 in CI), so a cut in these,
    not in a group's wall seconds, is what shortens the run."""
    total = sum(cpu.values())
    ranked = sorted(cpu.items(), key=lambda gs: (-gs[1], gs[0]))[:top]
    return (f"=== the groups' CPU seconds (theirs and their processes'): {total:,.0f} s, "
            f"{total / max(1.0, wall):.2f} cores over their {wall:,.0f} s; the costliest: "
            + ", ".join(f"{g} {s:,.0f} s" for g, s in ranked) + " ===")  # fmt: skip


_SECONDS: dict[str, float] = {}
"""Each group's tests' own seconds in this run (`pytest_runtest_logreport`)."""
_CPU: dict[str, float] = {}
_BEGAN = [time.monotonic()]
"""When this process began the run (the conftest's import)."""
"""Each group's CPU seconds in this run (`_cpu_of`, carried in the reports' properties)."""
CPU_KEY = "cpu_s"


def _cpu_now() -> float:
    """This process's CPU seconds and those of the children it has reaped."""
    own, reaped = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def _cpu_of(item: pytest.Item) -> Iterator[None]:
    began = _cpu_now()
    try:
        yield
    finally:
        item.user_properties.append((CPU_KEY, _cpu_now() - began))


pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_cpu_of)
pytest_runtest_call = pytest.hookimpl(wrapper=True)(_cpu_of)
pytest_runtest_teardown = pytest.hookimpl(wrapper=True)(_cpu_of)
"""Each phase's CPU seconds, in its report (made after the phase: xdist carries it to the
controller); a phase's report holds the properties of the phases before it too."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    group = group_of_report(report.nodeid)
    _SECONDS[group] = _SECONDS.get(group, 0.0) + report.duration
    spent = [v for k, v in report.user_properties if k == CPU_KEY]
    if spent:  # the last one is this phase's: the ones before it were counted with theirs
        _CPU[group] = _CPU.get(group, 0.0) + float(spent[-1])


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """CI's output says which groups its run's time went to (the rest part's longest chains:
    `REST_SECONDS`, `PG_OUTAGE_SECONDS`, `SLURM_SECONDS` are measured so)."""
    if hasattr(config, "workerinput") or not _SECONDS:
        return
    n = getattr(config.option, "numprocesses", None)
    workers = n if isinstance(n, int) and n > 0 else 1
    terminalreporter.write_line(longest_groups(_SECONDS, workers))
    if _CPU:
        wall = time.monotonic() - _BEGAN[0]
        terminalreporter.write_line(costliest_groups(_CPU, wall))


settings.register_profile("suite", deadline=None)
settings.load_profile("suite")
"""Property tests check what holds, not how fast: hypothesis's default 200 ms deadline per example
failed `test_order_is_total_and_deterministic` in a unit run at load 17 (speed is measured in
benchmarks, never in tests)."""

T0 = 1_000.0
"""Where every test clock starts (seconds since the epoch)."""


def _org_commands() -> list[c.AnyCommand]:
    root = "root"
    return [
        c.InitLedger(actor=root, admin=root),
        c.OpenAccount(actor=root, path="ai2", kind="program"),
        c.OpenAccount(actor=root, path="ai2/olmo", kind="project", shares=3),
        c.OpenAccount(actor=root, path="ai2/tulu", kind="project", shares=1),
        c.AddMember(actor=root, user="alice", project="ai2/olmo"),
        c.AddMember(actor=root, user="bob", project="ai2/olmo"),
        c.AddMember(actor=root, user="carol", project="ai2/tulu"),
        c.GrantManager(actor=root, user="mgr", account="ai2/olmo"),
        c.GrantManager(actor=root, user="pm", account="ai2"),
        c.RegisterNode(actor=root, node="n1", gpu_type="h100", gpus=8),
        c.RegisterNode(actor=root, node="n2", gpu_type="h100", gpus=8),
        c.RegisterNode(actor=root, node="a1", gpu_type="a100", gpus=4),
    ]


@pytest.fixture
def org_commands() -> list[c.AnyCommand]:
    """The commands that build the organisation above, `InitLedger` first."""
    return _org_commands()


@pytest.fixture
def counter_ids() -> Callable[[], str]:
    """Readable deterministic event ids for the pure domain: e1, e2, ..."""
    n = itertools.count(1)
    return lambda: f"e{next(n)}"


@pytest.fixture
def org_state(counter_ids: Callable[[], str]) -> State:
    """The organisation folded through the pure domain (decide + evolve) at T0."""
    state = State()
    for cmd in _org_commands():
        for ev in decide(state, cmd, T0, counter_ids):
            evolve(state, ev)
    return state


@pytest.fixture
def clock() -> SimClock:
    return SimClock(T0)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A fresh ledger home (the directory holding events.sqlite)."""
    return tmp_path / "home"


@pytest.fixture
def ledger(home: Path, clock: SimClock) -> Iterator[Ledger]:
    """An initialised, empty ledger (admin `root`) on the home's store (SQLite, or the PostgreSQL
    database `any_home` names: made by `NewLedger`, as `init --store` does)."""
    from ledger.store.creating import NewLedger

    led = NewLedger(home, clock, seeded_ids(1))
    led.execute(c.InitLedger(actor="root", admin="root"))
    yield led
    led.close()


@pytest.fixture
def org_ledger(ledger: Ledger) -> Ledger:
    """`ledger` with the organisation above appended in one batch."""
    ledger.execute_all(_org_commands()[1:])
    return ledger


# --- PostgreSQL -----------------------------------------------------------------------------------


def pg_admin_dsn() -> str:
    """The shared PostgreSQL from ``GPULEDGER_PG_DSN`` (``scripts/test`` starts one and exports
    it). Missing is an error of every test that needs it, never a skip."""
    import os

    dsn = os.environ.get("GPULEDGER_PG_DSN", "")
    if not dsn:
        pytest.fail(
            "GPULEDGER_PG_DSN is not set: run the tests through scripts/test, which starts a "
            "PostgreSQL (scripts/postgres/postgres up)",
            pytrace=False,
        )
    return dsn


def fresh_database(admin_dsn: str, name: str) -> str:
    """Create the database `name` (dropped first if a crashed run left it); its DSN."""
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        con.execute(f'CREATE DATABASE "{name}"')
    base, _, rest = admin_dsn.partition("?")
    return base.rsplit("/", 1)[0] + "/" + name + (f"?{rest}" if rest else "")


def drop_database(admin_dsn: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """The DSN of a fresh, empty PostgreSQL database for this test (dropped afterwards)."""
    import re
    import uuid

    admin = pg_admin_dsn()
    slug = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
    name = f"t_{slug}_{uuid.uuid4().hex[:8]}"
    yield fresh_database(admin, name)
    drop_database(admin, name)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_home(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A fresh ledger home whose log is the SQLite file in it, or a fresh PostgreSQL database
    (the home's `store` file names it): the store contract runs against both."""
    from ledger.store import locate

    home = tmp_path / "home"
    if request.param == "postgresql":
        locate.remember(home, request.getfixturevalue("pg_store"))
    return home
