"""Which processes the agent believes are its runs' when its run directories are gone
(ledger/engines/found.py, atk36-23 F6/F3): a part's group names its run; without groups, only
processes holding a record the agent's user made, in a directory of the run's name."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.engines.found import _key_of_group, _made_here


def test_a_group_names_its_run_and_nothing_else_is_one() -> None:
    assert _key_of_group("s1a2b3/12.3.0") == (12, 3, 0)
    assert _key_of_group("s1a2b3/12.3.1") == (12, 3, 1)
    for other in ("", "s1a2b3/", "s1a2b3/12.3", "s1a2b3/12.x.0", "s1a2b3/a.b.c", "s1/1.2.3.4"):
        assert _key_of_group(other) is None, other


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """A process holding the record of run 7.2 rank 0 on descriptor 9 (as a supervisor's job
    does), and one marked the same way that holds none (a forger)."""
    record = tmp_path / "runs" / "7.2" / "0" / "record"
    record.parent.mkdir(parents=True)
    record.write_bytes(b"")
    held = subprocess.Popen(["sh", "-c", f"exec 9<'{record}'; exec sleep 30"])
    bare = subprocess.Popen(["sleep", "30"])
    yield held, bare
    for p in (held, bare):
        p.kill()
        p.wait()


def test_only_processes_holding_the_runs_record_are_its(
    holders: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]],
) -> None:
    held, bare = holders
    fd9 = Path(f"/proc/{held.pid}/fd/9")
    for _ in range(250):
        if fd9.exists():
            break
        time.sleep(0.02)
    assert _made_here((7, 2, 0), [held.pid, bare.pid]) == [held.pid, bare.pid]  # same uid
    assert _made_here((7, 2, 0), [bare.pid]) == []  # nobody holds the record: a forgery
    assert _made_here((7, 3, 0), [held.pid, bare.pid]) == []  # the record is another run's
    assert _made_here((7, 2, 1), [held.pid]) == []  # another rank's
