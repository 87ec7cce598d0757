"""`proc.write_atomic` from many threads at once (an agent renews its lease from several):
every write lands whole, none fails (atk39-25 F5: one temporary name per process made one
thread's rename fail on a file another had unlinked, and the agent died)."""

from __future__ import annotations

import threading
from pathlib import Path

from ledger.engines.proc import write_atomic


def test_threads_writing_one_file_at_once_never_fail_and_leave_a_whole_write(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lease"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def writer(n: int) -> None:
        start.wait()
        try:
            for i in range(300):
                write_atomic(path, f'{{"until": {n}.{i}}}\n'.encode(), sync=False)
        except BaseException as err:  # the test collects every failure
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    text = path.read_text()
    assert text.startswith('{"until": ') and text.endswith("}\n")
    assert [p.name for p in tmp_path.iterdir()] == ["lease"]
