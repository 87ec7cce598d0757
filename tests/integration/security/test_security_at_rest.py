"""Red team, another account on the host (threat model row T13, docs/security.md): the store,
which holds every job's command, is created readable by its owner only, and so are the files
SQLite writes beside it."""

from __future__ import annotations

import stat
from pathlib import Path

from ledger.store import EVENTS_DB
from ledger.store.application import Ledger
from schemas import commands as c


def test_the_store_and_its_wal_are_created_for_their_owner_only(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    ledger = Ledger(home)
    try:
        ledger.execute(c.InitLedger(actor="root", admin="root"))
        ledger.execute(c.OpenAccount(actor="root", path="ai2", kind="program"))
        files = sorted(home.glob(f"{EVENTS_DB}*"))
        assert [f.name for f in files][:1] == [EVENTS_DB], files
        for f in files:
            mode = stat.S_IMODE(f.stat().st_mode)
            assert mode & 0o077 == 0, f"{f.name} is {oct(mode)}"
    finally:
        ledger.close()


def test_an_existing_store_keeps_its_mode(tmp_path: Path) -> None:
    """An operator's choice (a group that reads the store) is not undone at the next start."""
    home = tmp_path / "ledger"
    Ledger(home).close()
    (home / EVENTS_DB).chmod(0o640)
    Ledger(home).close()
    assert stat.S_IMODE((home / EVENTS_DB).stat().st_mode) == 0o640
