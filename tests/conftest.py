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
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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
    from ledger.core.runas import SECRET_NAMES

    for name in [n for n in os.environ if re.match(SECRET_NAMES, n)]:
        del os.environ[name]


SLURM_FILES = "test_slurm"
"""The test files (`tests/integration/test_slurm*.py`) that share the suite's one Slurm cluster
(the session fixture `cluster` of test_slurm.py): one set of GPUs, with its own foreign jobs."""

PG_OUTAGE = "test_pg_outage_"
"""The test files (`tests/integration/test_pg_outage_*.py`) that share one PostgreSQL primary and
standby (`pg_outage_pair`, each test on a fresh database of it): one group, on one worker."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`scripts/test` runs the suite on two workers (pytest-xdist, `--dist loadgroup`). Each test
    file is one group, run on one worker in its order, as it runs alone: its module-scoped
    fixtures (a server, a ledger) are made once, and a test may build on the one before it.
    Every test of the Slurm files is in one group: they share the suite's one cluster; so are
    the PostgreSQL outage files, which share one PostgreSQL pair.

    The Slurm group comes first, the others in file order (the integration files, then the unit
    ones): `scripts/test` passes `--no-loadscope-reorder`, so a worker takes the groups in this
    order. The Slurm group is the longest (~18 of the suite's minutes, on one worker): started
    first, the other worker takes everything else beside it. xdist's own order (the groups with
    the most tests first) started it halfway and left files of one long test, such as
    test_pg_outage_*.py, to the end, each one a tail that one worker ran alone."""
    slurm: list[pytest.Item] = []
    rest: list[pytest.Item] = []
    for item in items:
        if item.path.parent.name == "integration" and item.path.name.startswith(SLURM_FILES):
            group = "slurm"
            slurm.append(item)
        elif item.path.parent.name == "integration" and item.path.name.startswith(PG_OUTAGE):
            group = "pg_outage"  # one PostgreSQL pair for them all (pgoutkit.py)
            rest.append(item)
        else:
            group = f"{item.path.parent.name}/{item.path.stem}"
            rest.append(item)
        item.add_marker(pytest.mark.xdist_group(group))
    items[:] = slurm + rest


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
    """An initialised, empty ledger (admin `root`) on the real SQLite store."""
    led = Ledger(home, clock, seeded_ids(1))
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
