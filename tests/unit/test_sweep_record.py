"""A sweep's record of the runs it finished (`runs.jsonl`), which a rerun goes on from
(atk61-29c F2): a run is known by its place (`NNN/POLICY`) and workload, from any directory;
a line cut short by a kill is no record."""

from __future__ import annotations

import json
from pathlib import Path

from ledger.cli.sim_pool import recorded_runs


def test_a_run_is_known_by_its_place_and_workload_and_a_cut_line_is_none(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    whole = {"workload": "seed=1", "run": {"home": "/x/runs/s/001/fifo", "policy": "fifo"}}
    other = {"workload": "seed=2", "run": {"home": "runs/s/002/fifo", "policy": "fifo"}}
    path.write_text(json.dumps(whole) + "\n" + json.dumps(other)[:30] + "\n")
    assert recorded_runs(path) == {("001/fifo", "seed=1"): whole["run"]}
    assert recorded_runs(tmp_path / "none.jsonl") == {}
