"""The suite's own grouping (tests/conftest.py): under `scripts/test`'s two workers, every test of
the Slurm files runs on one worker (they share one cluster), each other file on one worker in its
order, and the files spread. Run on a small
tree of sleeping tests with the project's hook, through pytest-xdist as `scripts/test` runs it;
it fails when the pinned pytest and pytest-xdist stop grouping (pytest 9 ignores xdist 3.8's
renaming: the Slurm tests ran on both workers and failed each other)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TESTS = "".join(f"def test_{i}():\n    time.sleep(0.2)\n\n\n" for i in range(4))


def test_the_slurm_files_run_on_one_worker_and_the_rest_spreads(tmp_path: Path) -> None:
    tree = tmp_path / "tests" / "integration"
    tree.mkdir(parents=True)
    (tmp_path / "conftest.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )
    for name in ("test_slurm_a", "test_slurm_b", "test_other", "test_more"):
        (tree / f"{name}.py").write_text("import time\n\n\n" + TESTS)
    (tmp_path / "tests" / "unit").mkdir()
    (tmp_path / "tests" / "unit" / "test_slurm_pure.py").write_text("import time\n\n\n" + TESTS)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "-v", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ran = re.findall(r"^\[(gw\d)\] .*PASSED (\S+)", run.stdout, re.M)
    assert len(ran) == 20, run.stdout
    slurm = {w for w, test in ran if "/integration/test_slurm_" in test}
    assert len(slurm) == 1, ran  # one worker for every test of the Slurm files
    assert all(t.endswith("@slurm") for _, t in ran if "/integration/test_slurm_" in t), ran
    assert not any(t.endswith("@slurm") for _, t in ran if "/integration/test_slurm_" not in t)
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


def test_the_slurm_group_is_taken_first_and_the_postgresql_outage_files_are_one_group(
    tmp_path: Path,
) -> None:
    """`scripts/test` passes `--no-loadscope-reorder`: a worker takes the groups in the order the
    hook gives them, the Slurm files first (the longest group: taken halfway, it was the run's
    tail), then the other files in their order. xdist's own order (the groups with the most tests
    first) would take the unit file of 10 tests first and the one-test files last. The
    PostgreSQL outage files are one group (they share one pair: `pg_outage_pair`)."""
    assert "--no-loadscope-reorder" in (REPO / "scripts" / "test").read_text()
    tree = tmp_path / "tests" / "integration"
    tree.mkdir(parents=True)
    (tmp_path / "conftest.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )
    one = "def test_0():\n    pass\n"
    for name in ("test_aaa", "test_pg_outage_a", "test_pg_outage_b", "test_zzz"):
        (tree / f"{name}.py").write_text(one)
    (tree / "test_slurm_a.py").write_text(TESTS.replace("time.sleep(0.2)", "pass"))
    (tmp_path / "tests" / "unit").mkdir()
    (tmp_path / "tests" / "unit" / "test_many.py").write_text(
        "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(10))
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1",
         "--dist", "loadgroup", "--no-loadscope-reorder", "-v", "--rootdir", str(tmp_path),
         str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ran = re.findall(r"^\[gw0\] .*PASSED (\S+)", run.stdout, re.M)
    assert len(ran) == 18, run.stdout
    groups = list(dict.fromkeys(t.split("@", 1)[1] for t in ran))
    assert groups == ["slurm", "integration/test_aaa", "pg_outage", "integration/test_zzz",
                      "unit/test_many"], ran  # fmt: skip
