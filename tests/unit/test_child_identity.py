"""A job's identity is its pid and /proc start time, written by its supervisor right after it
starts it. A job that ended before that write (a loaded host; CI of stop 58) was named
`PID None`: `read_identity` refused the file, so the agent's and the audit's view of the host
(`live_processes`) lost the part while a child it left still held the GPU."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from ledger.engines.proc import alive, start_time
from ledger.engines.runs import read_identity
from ledger.engines.supervise import _identity


def test_a_child_that_ended_before_its_identity_was_written_is_still_named(
    tmp_path: Path,
) -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        started = start_time(child.pid)
        assert started is not None
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped yet
        assert start_time(child.pid) is None  # gone, for any reader
        (tmp_path / "job").write_bytes(_identity(child.pid, "1.000000"))
        assert read_identity(tmp_path / "job") == (child.pid, started)
        assert not alive(child.pid, started)  # and ended
    finally:
        child.kill()
        child.wait()
