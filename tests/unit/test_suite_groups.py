"""The suite's own grouping (tests/conftest.py): under `scripts/test`'s workers, the Slurm files
are groups, each on one worker and its own cluster, each other file on one worker in its
order, and the files spread. Run on a small
tree of sleeping tests with the project's hook, through pytest-xdist as `scripts/test` runs it;
it fails when the pinned pytest and pytest-xdist stop grouping (pytest 9 ignores xdist 3.8's
renaming: the Slurm tests ran on both workers and failed each other)."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    GANG,
    PART,
    PG_OUTAGE_GROUPS,
    PG_OUTAGE_SECONDS,
    REST_SECONDS,
    SLURM_CONF_OF,
    SLURM_GROUPS,
    SLURM_SECONDS,
    TURNS,
    costliest_groups,
    group_of_report,
    longest_groups,
    slurm_conf,
    split_files,
)

REPO = Path(__file__).resolve().parents[2]
A, B = SLURM_GROUPS["slurm-a"][0], SLURM_GROUPS["slurm-b"][0]
"""A Slurm file of each group."""
PG_A, PG_B = PG_OUTAGE_GROUPS["pg_outage-a"][0], PG_OUTAGE_GROUPS["pg_outage-b"][0]
"""A PostgreSQL outage file of each group."""

TESTS = "".join(f"def test_{i}():\n    time.sleep(0.2)\n\n\n" for i in range(4))


def _environ(part: str | None = None) -> dict[str, str]:
    """This environment for a nested session, with `PART` as given (none: unset). The suite's
    own run has it set (scripts/test's two parts), and a nested session inherited it: CI ran
    only its non-Slurm tests and these tests failed. Only pytest-xdist of the installed plugins
    is loaded: the others' imports (schemathesis, faker, anyio, hypothesis) cost each nested
    process ~2 CPU s, most of this file's 52 s, and none of them groups or orders a test."""
    env = {k: v for k, v in os.environ.items() if k != PART}
    plugins = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_PLUGINS": "xdist.plugin"}
    return env | plugins | ({PART: part} if part is not None else {})


def test_each_slurm_group_runs_on_one_worker_of_its_own_and_the_rest_spreads(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tests" / "integration"
    tree.mkdir(parents=True)
    (tmp_path / "conftest.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )
    for name in (A, B, "test_other", "test_more"):
        (tree / f"{name}.py").write_text("import time\n\n\n" + TESTS)
    (tmp_path / "tests" / "unit").mkdir()
    (tmp_path / "tests" / "unit" / "test_slurm_pure.py").write_text("import time\n\n\n" + TESTS)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "-v", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_environ(),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ran = re.findall(r"^\[(gw\d)\] .*PASSED (\S+)", run.stdout, re.M)
    assert len(ran) == 20, run.stdout
    for name, group in ((A, "slurm-a"), (B, "slurm-b")):
        mine = [(w, t) for w, t in ran if t.startswith(f"tests/integration/{name}.py::")]
        assert len(mine) == 4 and all(t.endswith(f"@{group}") for _, t in mine), ran
    on = {g: {w for w, t in ran if t.endswith(f"@{g}")} for g in ("slurm-a", "slurm-b")}
    # each group on one worker, the two on different workers (each starts with one)
    assert len(on["slurm-a"]) == len(on["slurm-b"]) == 1 and on["slurm-a"] != on["slurm-b"], ran
    for other in ("integration/test_other", "integration/test_more", "unit/test_slurm_pure"):
        # every other file is a group of its own, on one worker, in its order
        mine = [(w, t) for w, t in ran if t.startswith(f"tests/{other}.py::")]
        assert len(mine) == 4 and len({w for w, _ in mine}) == 1, ran
        assert [t.split("::")[1] for _, t in mine] == [f"test_{i}@{other}" for i in range(4)]
    assert len({w for w, _ in ran}) == 2, ran  # and the files spread over both


def test_no_two_test_files_share_a_name() -> None:
    """The suite's files are imported by their base name (no packages): two of one name fail the
    collection of a run that gathers both (the `alone` part did: "import file mismatch")."""
    from collections import Counter
    from pathlib import Path

    names = Counter(p.name for p in Path(__file__).parents[1].rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []


def test_the_slurm_groups_are_taken_first_then_the_postgresql_outage_groups(
    tmp_path: Path,
) -> None:
    """`scripts/test` passes `--no-loadscope-reorder`: a worker takes the groups in the order the
    hook gives them, the two Slurm groups first (the longest groups: taken halfway, the one
    Slurm group was the run's tail), then the other files in their order. xdist's own order
    (the groups with the most tests first) would take the unit file of 10 tests first and the
    one-test files last. The PostgreSQL outage files are two groups (`PG_OUTAGE_GROUPS`, each on
    its worker's pair: `pg_outage_pair`), the first of the rest (`REST_SECONDS`: the longest)."""
    assert "--no-loadscope-reorder" in (REPO / "scripts" / "test").read_text()
    tree = tmp_path / "tests" / "integration"
    tree.mkdir(parents=True)
    _hooked(tmp_path)
    one = "def test_0():\n    pass\n"
    for name in ("test_aaa", PG_B, PG_A, "test_zzz"):
        (tree / f"{name}.py").write_text(one)
    for name in (B, A):
        (tree / f"{name}.py").write_text(TESTS.replace("time.sleep(0.2)", "pass"))
    (tmp_path / "tests" / "unit").mkdir()
    (tmp_path / "tests" / "unit" / "test_many.py").write_text(
        "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(10))
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1",
         "--dist", "loadgroup", "--no-loadscope-reorder", "-v", "--rootdir", str(tmp_path),
         str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_environ(),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ran = re.findall(r"^\[gw0\] .*PASSED (\S+)", run.stdout, re.M)
    assert len(ran) == 22, run.stdout
    groups = list(dict.fromkeys(t.split("@", 1)[1] for t in ran))
    # the rest's longest groups first (`REST_SECONDS`): the PostgreSQL outage group, taken
    # halfway through the files, was a tail one worker ran alone (s54-suite)
    outage = sorted(PG_OUTAGE_GROUPS, key=lambda g: -REST_SECONDS[g])
    assert groups == ["slurm-a", "slurm-b", *outage, "integration/test_aaa",
                      "integration/test_zzz", "unit/test_many"], ran  # fmt: skip


def test_the_postgresql_outage_groups_start_on_two_workers_each_with_its_own_pair(
    tmp_path: Path,
) -> None:
    """Each outage group runs on one worker, the two on different workers (each takes one
    first), and a session fixture (as `pg_outage_pair`) is made once per worker: each group's
    tests share one pair, never the other group's (s54-pgsplit: they were one group, ~20 min of
    one worker at load)."""
    tree = tmp_path / "tests" / "integration"
    tree.mkdir(parents=True)
    _hooked(tmp_path)
    (tree / "conftest.py").write_text(
        "import uuid\nimport pytest\n\n\n@pytest.fixture(scope='session')\n"
        "def pair():\n    return uuid.uuid4().hex\n"
    )
    seen = tmp_path / "seen"
    files = [*PG_OUTAGE_GROUPS["pg_outage-a"][:2], *PG_OUTAGE_GROUPS["pg_outage-b"][:2]]
    for name in files:
        (tree / f"{name}.py").write_text(
            "import time\n\n\n" + "".join(
                f"def test_{i}(pair):\n    time.sleep(0.2)\n"
                f"    with open({str(seen)!r}, 'a') as f:\n"
                f"        f.write(f'{name} {{pair}}\\n')\n\n\n"
                for i in range(2)
            )
        )  # fmt: skip
    (tree / "test_other.py").write_text("def test_0():\n    pass\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "--no-loadscope-reorder", "-v", "--rootdir", str(tmp_path),
         str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_environ("rest"),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ran = re.findall(r"^\[(gw\d)\] .*PASSED (\S+)", run.stdout, re.M)
    assert len(ran) == 9, run.stdout
    on = {g: {w for w, t in ran if t.endswith(f"@{g}")} for g in PG_OUTAGE_GROUPS}
    assert all(len(w) == 1 for w in on.values()) and len(set.union(*on.values())) == 2, ran
    pairs: dict[str, set[str]] = {g: set() for g in PG_OUTAGE_GROUPS}
    for line in seen.read_text().splitlines():
        name, pair = line.split()
        pairs[next(g for g, fs in PG_OUTAGE_GROUPS.items() if name in fs)].add(pair)
    # one pair for each group's tests, another for the other group's
    assert all(len(p) == 1 for p in pairs.values()) and len(set.union(*pairs.values())) == 2


def test_every_postgresql_outage_file_is_in_exactly_one_group_and_the_groups_balance() -> None:
    files = {p.stem for p in (REPO / "tests" / "integration").glob("test_pg_outage_*.py")}
    assert set(PG_OUTAGE_SECONDS) == files
    assert all(s > 0 for s in PG_OUTAGE_SECONDS.values()), PG_OUTAGE_SECONDS
    grouped = [f for names in PG_OUTAGE_GROUPS.values() for f in names]
    assert sorted(grouped) == sorted(files)  # each file once
    sums = [sum(PG_OUTAGE_SECONDS[f] for f in names) for names in PG_OUTAGE_GROUPS.values()]
    assert max(sums) - min(sums) <= max(PG_OUTAGE_SECONDS.values()), sums
    assert {g: REST_SECONDS[g] for g in PG_OUTAGE_GROUPS} == dict(
        zip(PG_OUTAGE_GROUPS, sums, strict=True)
    )


def test_an_outage_file_in_no_group_fails_the_collection(tmp_path: Path) -> None:
    tree = tmp_path / "tests" / "integration"
    tree.mkdir(parents=True)
    _hooked(tmp_path)
    (tree / "test_pg_outage_unmeasured.py").write_text("def test_0():\n    pass\n")
    run = _nested(tmp_path, "")
    assert run.returncode != 0 and "passed" not in run.stdout, run.stdout
    assert "test_pg_outage_unmeasured.py is a PostgreSQL outage test file in no outage group" in (
        run.stdout + run.stderr
    )


def test_every_slurm_file_is_in_exactly_one_group_and_the_groups_balance() -> None:
    """Every `tests/integration/test_slurm*.py` has measured seconds and so one group; the two
    groups differ by at most the longest file; each group has its own cluster's variable, and
    scripts/test starts both clusters and fails when either does not start."""
    files = {p.stem for p in (REPO / "tests" / "integration").glob("test_slurm*.py")}
    assert set(SLURM_SECONDS) == files
    assert all(s > 0 for s in SLURM_SECONDS.values()), SLURM_SECONDS
    grouped = [f for names in SLURM_GROUPS.values() for f in names]
    assert sorted(grouped) == sorted(files)  # each file once
    assert set(SLURM_GROUPS) == set(SLURM_CONF_OF) == {"slurm-a", "slurm-b", "slurm-c", "slurm-d",
                                                        GANG}  # fmt: skip
    assert SLURM_GROUPS[GANG] == ["test_slurm_gang"]  # the two-node cluster's files alone
    sums = [sum(SLURM_SECONDS[f] for f in SLURM_GROUPS[g]) for g in SLURM_GROUPS if g != GANG]
    assert max(sums) - min(sums) <= max(SLURM_SECONDS.values()), sums
    assert len(set(SLURM_CONF_OF.values())) == len(SLURM_CONF_OF)
    script = (REPO / "scripts" / "test").read_text()
    # one cluster per group, each exported under its group's variable, a start that fails fails
    [letters] = re.findall(r"^CLUSTERS=\((.*)\)$", script, re.M)
    assert [f"slurm-{x}" for x in letters.split()] == list(SLURM_CONF_OF)
    assert all(v == "SLURM_CONF" or v == f"GPULEDGER_SLURM_CONF_{g[-1].upper()}"
               for g, v in SLURM_CONF_OF.items())  # fmt: skip
    assert 'conf="GPULEDGER_SLURM_CONF$(suffix "$letter")"' in script
    assert "did not start; the Slurm executor tests need it" in script and "exit 1" in script
    assert "GPULEDGER_SLURM_NODES=2" in script  # the gang group's cluster: two slurmd
    # a worker per group: the gang group waits for no other group's end
    assert f"GPULEDGER_TEST_SLURM_WORKERS:-{len(SLURM_CONF_OF)}" in script


@pytest.mark.parametrize(
    ("seconds", "want_a", "want_b"),
    [
        ({"x": 5, "y": 4, "z": 3, "w": 2}, ["w", "x"], ["y", "z"]),
        ({"one": 10, "two": 1, "three": 1}, ["one"], ["three", "two"]),
        ({"p": 2, "q": 2}, ["p"], ["q"]),  # equal seconds: by name
    ],
)
def test_the_split_puts_each_file_with_the_lighter_group_longest_first(
    seconds: dict[str, float], want_a: list[str], want_b: list[str]
) -> None:
    got = split_files(seconds, ("slurm-a", "slurm-b"))
    assert got == {"slurm-a": want_a, "slurm-b": want_b}


def test_the_split_spreads_over_every_cluster() -> None:
    seconds = {"x": 9, "y": 5, "z": 4, "w": 3, "v": 1}
    got = split_files(seconds, ("a", "b", "c"))
    assert got == {"a": ["x"], "b": ["v", "y"], "c": ["w", "z"]}


@pytest.mark.parametrize(
    ("case", "environ", "group", "want"),
    [
        ("each group its own", {"SLURM_CONF": "a", "GPULEDGER_SLURM_CONF_B": "b",
                                "PYTEST_XDIST_WORKER": "gw0"}, "slurm-b", "b"),
        ("one process: b may use a's", {"SLURM_CONF": "a"}, "slurm-b", "a"),
        ("workers: b missing", {"SLURM_CONF": "a", "PYTEST_XDIST_WORKER": "gw1"}, "slurm-b",
         LookupError),
        ("workers: one cluster for both", {"SLURM_CONF": "a", "GPULEDGER_SLURM_CONF_B": "a",
                                           "PYTEST_XDIST_WORKER": "gw1"}, "slurm-a", LookupError),
        ("a missing", {"GPULEDGER_SLURM_CONF_B": "b"}, "slurm-a", LookupError),
        ("one process: d may use a's", {"SLURM_CONF": "a"}, "slurm-d", "a"),
        ("workers: d its own", {"SLURM_CONF": "a", "GPULEDGER_SLURM_CONF_D": "d",
                                "PYTEST_XDIST_WORKER": "gw3"}, "slurm-d", "d"),
        ("workers: c shares b's", {"GPULEDGER_SLURM_CONF_B": "b", "GPULEDGER_SLURM_CONF_C": "b",
                                   "PYTEST_XDIST_WORKER": "gw2"}, "slurm-c", LookupError),
    ],
)  # fmt: skip
def test_each_slurm_group_has_its_own_cluster_under_workers(
    case: str, environ: dict[str, str], group: str, want: str | type[Exception]
) -> None:
    if isinstance(want, str):
        assert slurm_conf(group, environ) == want, case
    else:
        with pytest.raises(want):
            slurm_conf(group, environ)


def test_a_slurm_file_in_no_group_fails_the_collection(tmp_path: Path) -> None:
    tree = tmp_path / "tests" / "integration"
    tree.mkdir(parents=True)
    (tmp_path / "conftest.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )
    (tree / "test_slurm_unmeasured.py").write_text("def test_0():\n    pass\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_environ(),
    )  # fmt: skip
    assert run.returncode != 0 and "passed" not in run.stdout, run.stdout
    assert "test_slurm_unmeasured.py is a Slurm test file in no Slurm group" in (
        run.stdout + run.stderr
    )


def test_setup_writes_the_bytecode_of_every_package_of_ours() -> None:
    """With PYTHONDONTWRITEBYTECODE set, nothing else writes it: each CLI call and server start
    of the suite would compile our modules from source again (scripts/setup)."""
    lines = (REPO / "scripts" / "setup").read_text().splitlines()
    compiles = [line for line in lines if "-m compileall" in line and not line.startswith("#")]
    assert len(compiles) == 1, compiles
    assert {"schemas", "ledger", "projections"} <= set(compiles[0].split())


def _hooked(tmp_path: Path) -> None:
    """A conftest.py in `tmp_path` with the suite's grouping hook."""
    (tmp_path / "conftest.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )


def _nested(tmp_path: Path, part: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A pytest session on `tmp_path` with `PART` set to `part`."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "--rootdir",
         str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_environ(part),
    )  # fmt: skip


@pytest.mark.parametrize("part", ["slurm", "rest", ""])
def test_each_part_runs_its_files_only(tmp_path: Path, part: str) -> None:
    """`scripts/test` runs the Slurm files (`slurm`) beside the rest (`rest`) with their own
    workers; unset or empty, a session runs every file. Nothing of the other part runs."""
    tree = tmp_path / "tests" / "integration"
    tree.mkdir(parents=True)
    _hooked(tmp_path)
    for name in (A, "test_other"):
        (tree / f"{name}.py").write_text("def test_0():\n    pass\n")
    run = _nested(tmp_path, part, "-v")
    assert run.returncode == 0, run.stdout + run.stderr
    ran = set(re.findall(r"^tests/integration/(\w+)\.py::test_0 PASSED", run.stdout, re.M))
    want = {"slurm": {A}, "rest": {"test_other"}, "": {A, "test_other"}}[part]
    assert ran == want, run.stdout


def test_an_unknown_part_is_refused(tmp_path: Path) -> None:
    _hooked(tmp_path)
    (tmp_path / "test_x.py").write_text("def test_0():\n    pass\n")
    run = _nested(tmp_path, "slrum")
    assert run.returncode != 0 and "give slurm, rest or nothing" in run.stdout + run.stderr


def test_a_run_ends_with_its_longest_groups_and_their_seconds_a_worker() -> None:
    """Each part's output ends with where its time went (s55: CI printed the 30 slowest tests
    only, and a part's chains, its groups, had to be guessed from them)."""
    ids = {
        "tests/integration/test_server.py::test_a@integration/test_server": 3.0,
        "tests/integration/test_server_schema.py::test_x[POST /v1/batch]@integration/"
        "test_server_schema": 131.0,
        "tests/integration/test_pg_outage_lead.py::test_b@pg_outage-a": 46.5,
        "tests/unit/test_x.py::test_c": 0.2,
    }
    assert [group_of_report(i) for i in ids] == [
        "integration/test_server", "integration/test_server_schema", "pg_outage-a",
        "tests/unit/test_x.py",
    ]  # fmt: skip
    seconds = {group_of_report(i): s for i, s in ids.items()}
    assert longest_groups(seconds, 3, top=2) == (
        "=== the groups' own seconds (set-up, call, tear-down): 181 s in 4 groups, 60 s a "
        "worker over 3; the longest: integration/test_server_schema 131 s, pg_outage-a 46 s ==="
    )


def test_a_run_says_its_groups_cpu_seconds_costliest_first() -> None:
    """On two cores the suite is CPU-bound: the line after the seconds names where the CPU went
    (s60: a group's wall seconds, inflated by the others' load, hid which cut would help)."""
    cpu = {"slurm-a": 120.0, "integration/test_server": 300.4, "tests/unit/test_x.py": 0.5}
    assert costliest_groups(cpu, 200.0, top=2) == (
        "=== the groups' CPU seconds (theirs and their processes'): 421 s, 2.10 cores over "
        "their 200 s; the costliest: integration/test_server 300 s, slurm-a 120 s ==="
    )


def test_the_rests_groups_take_turns_and_a_slurm_group_that_ends_opens_one(
    tmp_path: Path,
) -> None:
    """scripts/test runs one session on the Slurm groups' workers and the rest's (`TURNS`): the
    rest's groups run while their worker holds a turn; `at-first` turns are open, one more
    each time a Slurm group ends. Four workers, one turn at first of two: while the Slurm file
    runs (it takes no turn) no two rest files (each 4 x 0.3 s) run at once; its end opens the
    second. Without turns three rest files ran beside it at once."""
    tree = tmp_path / "tests" / "integration"
    tree.mkdir(parents=True)
    (tmp_path / "conftest.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.conftest import (  # noqa: F401\n"
        "    pytest_collection_modifyitems, pytest_configure, pytest_configure_node,\n"
        "    pytest_runtest_protocol)\n"
    )
    spans = tmp_path / "spans"
    spans.mkdir()
    names = (A, "test_one", "test_two", "test_three")
    for name in names:
        (tree / f"{name}.py").write_text(
            "import time\nfrom pathlib import Path\n\n\n"
            + "".join(
                f"def test_{i}():\n    began = time.monotonic()\n    time.sleep(0.3)\n"
                f"    Path({str(spans / f'{name}-{i}')!r}).write_text("
                "f'{began} {time.monotonic()}')\n\n\n"
                for i in range(4)
            )
        )
    turns = tmp_path / "turns"
    turns.mkdir()
    (turns / "turn-1").touch()
    (turns / "turn-2").touch()
    (turns / "at-first").write_text("1\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "4",
         "--dist", "loadgroup", "--no-loadscope-reorder", "--rootdir", str(tmp_path),
         str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=_environ() | {TURNS: str(turns)},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    span: dict[str, tuple[float, float]] = {}
    for name in names:
        times = [tuple(map(float, (spans / f"{name}-{i}").read_text().split())) for i in range(4)]
        span[name] = (min(t[0] for t in times), max(t[1] for t in times))
    slurm_ended = span[A][1]
    rest = [span[n] for n in names[1:]]
    for a, b in itertools.combinations(rest, 2):
        if a[0] < b[1] and b[0] < a[1]:  # two at once: only once the Slurm group has ended
            assert max(a[0], b[0]) >= slurm_ended, span
    assert sorted(p.name for p in turns.iterdir()) == [
        "at-first", "ended-slurm-a", "turn-1", "turn-2"]  # fmt: skip
