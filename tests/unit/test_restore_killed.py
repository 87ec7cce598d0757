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


def _log(ledger: Ledger) -> list[Any]:
    with locate.open_source(ledger.home, "sqlite") as source:
        return [r for page in follow(source, page=2) for r in page]


@pytest.mark.parametrize("written", [1, 3, "all"])
def test_a_restore_rerun_after_a_kill_writes_the_rest(
    written: int | str, org_ledger: Ledger, tmp_path: Path
) -> None:
    """s51: the rerun of a restore killed while it wrote (pages, one transaction each: the
    start of the log written) or after (every event, no progress row) refused ("the destination
    already holds N events"). With `resume` it compares what is there byte for byte with the
    log's start and writes the rest."""
    log = _log(org_ledger)
    upto = len(log) if written == "all" else int(written)

    def killed() -> Iterator[Sequence[Any]]:
        yield log[:upto]
        raise Killed

    dst = tmp_path / "restored"
    dst.mkdir()
    with pytest.raises(Killed):
        write_log(killed(), dst, None)
    copied = write_log([log[:2], log[2:]], dst, None, resume="restore")
    assert (copied.events, copied.head) == (len(log), len(log))
    with locate.open_source(dst, "sqlite") as source:
        got = [(r.position, r.tag, bytes(r.data)) for page in follow(source) for r in page]
    assert got == [(r.position, r.tag, bytes(r.data)) for r in log]


def test_a_restore_into_a_store_holding_another_log_is_refused_naming_what_to_do(
    org_ledger: Ledger, tmp_path: Path
) -> None:
    log = _log(org_ledger)
    dst = tmp_path / "restored"
    dst.mkdir()
    write_log([log[:3]], dst, None)
    from ledger.store.copying import CopyError

    with pytest.raises(CopyError) as got:  # a shorter log than the store holds
        write_log([log[:2]], dst, None, resume="restore")
    assert "already holds 3 events and the log ends at position 2" in got.value.message
    assert "restore into an empty store" in str(got.value.hint)
    first = log[0]._replace(data=bytes(log[0].data) + b" ")  # another log's first event
    with pytest.raises(CopyError) as got:
        write_log([[first, *log[1:]]], dst, None, resume="restore")
    assert "its event at position 1 is not the log's" in got.value.message
    assert "nothing was written" in got.value.message
    with locate.open_source(dst, "sqlite") as source:
        assert sum(len(page) for page in follow(source)) == 3
