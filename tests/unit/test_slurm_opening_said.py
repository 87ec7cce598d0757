"""A server whose Slurm executor is not open yet says why once per change, not at every
probe (`ledger.engines.slurm.opening.SlurmOpening`): a standby that took the lease while
another cluster answered in its cluster's place logged the same "another cluster" warning
every 5 s (atk44ha, note on docs/ha.md's "says so in one log line")."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ledger.engines.slurm.cluster import OtherCluster
from ledger.engines.slurm.executor import SlurmExecutor
from ledger.engines.slurm.opening import SlurmOpening
from schemas.errors import EngineAway, EngineError


def test_the_reason_the_executor_stays_closed_is_said_once_per_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scontrol = tmp_path / "scontrol"  # `scontrol ping`: the controller answers
    scontrol.write_text("#!/bin/sh\necho 'Slurmctld(primary) at vm is UP'\n")
    scontrol.chmod(0o755)
    slurm = SlurmExecutor(
        "gpuledger", "0123abcd4567", tmp_path, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}
    )
    why: list[EngineError] = [OtherCluster("the slurmctld that answers is another cluster")]

    def open_now() -> None:
        raise why[0]

    opening = SlurmOpening(slurm, open_now)
    opening.probe_every_s = 5.0
    caplog.set_level(logging.WARNING, "gpuledger")
    for step in range(6):  # 30 s of probes while the other cluster answers
        with pytest.raises(EngineAway, match="another cluster"):
            opening.adopt({}, 100.0 + 5 * step)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["the slurmctld that answers is another cluster"], said
    why[0] = EngineError("partition gpuledger is missing")  # another reason: said, once
    for step in range(6, 9):
        with pytest.raises(EngineAway):
            opening.adopt({}, 100.0 + 5 * step)
    said = [r.getMessage() for r in caplog.records]
    assert said[1:] == ["Slurm refuses: partition gpuledger is missing"], said
