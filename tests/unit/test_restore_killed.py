"""atk50-25 F7: `store restore --from-kafka` (and `store copy`) killed -9 after its write left
every event and no relay progress table: a rerun refused ("already holds N events") and the
next relay warned of "a dropped table?" that nobody dropped. The table is made, empty, before
the events (`copying.write_log`): a store killed after its write says no relay published
anywhere yet (progress 0), as a new ledger's does. A real SQLite store."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ledger.store import locate, relay_progress
from ledger.store.application import Ledger
from ledger.store.copying import write_log
from ledger.store.relay import open_store
from projections.source import follow


class Killed(BaseException):
    """The process killed between the write and the progress row."""


def test_a_copy_killed_after_its_write_keeps_an_empty_progress_table(
    org_ledger: Ledger, tmp_path: Path
) -> None:
    def pages() -> Iterator[Sequence[Any]]:
        with locate.open_source(org_ledger.home, "sqlite") as source:
            yield from follow(source)
        raise Killed  # after the last page is written, before the caller keeps the row

    dst = tmp_path / "restored"
    dst.mkdir()
    with pytest.raises(Killed):
        write_log(pages(), dst, None)
    recorder = open_store(dst)
    try:
        assert recorder.max_notification_id() == org_ledger.position
        assert relay_progress.read(recorder, "gpuledger.events") == 0  # was None: no table
    finally:
        recorder.datastore.close()  # type: ignore[attr-defined]
