"""A part's checkpoint is its `work/checkpoint` name itself, never what a link there points to
(docs/agent.md, "Checkpoints"; atk43 F9)."""

from __future__ import annotations

import os
from pathlib import Path

from ledger.engines.runs import checkpoint_mtime


def test_a_link_at_the_checkpoint_name_is_not_followed(tmp_path: Path) -> None:
    """A job may put a link at its checkpoint name to a file it cannot even stat: the service
    (root) reads the link's own time, so the target's changes are neither told to the job nor
    recorded as its checkpoints."""
    secret = tmp_path / "secret"
    secret.write_text("s")
    run = tmp_path / "run"
    (run / "work").mkdir(parents=True)
    (run / "work" / "checkpoint").symlink_to(secret)
    os.utime(run / "work" / "checkpoint", (1_000.0, 1_000.0), follow_symlinks=False)
    os.utime(secret, (5_000.0, 5_000.0))
    assert checkpoint_mtime([run]) == 1_000.0
    os.utime(secret, (9_000.0, 9_000.0))
    assert checkpoint_mtime([run]) == 1_000.0


def test_the_latest_of_the_parts_files_and_none_without_one(tmp_path: Path) -> None:
    a, b, none = tmp_path / "a", tmp_path / "b", tmp_path / "none"
    for run, at in ((a, 2_000.0), (b, 3_000.0)):
        (run / "work").mkdir(parents=True)
        (run / "work" / "checkpoint").write_text("")
        os.utime(run / "work" / "checkpoint", (at, at))
    assert checkpoint_mtime([a, b, none]) == 3_000.0
    assert checkpoint_mtime([none]) == 0.0
