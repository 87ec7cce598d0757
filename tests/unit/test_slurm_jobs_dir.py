"""With the Slurm executor every server of a store uses one run directory (`slurm_jobs_dir`,
docs/ha.md "Run it"): the runs' batch scripts and marks live there, and the leader after a
failover reads an adopted run's end there. Each server wrote under its own `<home>/jobs`, and a
run that ended around a kill -9 of the leader was recorded `launch_failed`, "its command never
ran", though it ran to exit 0 (atk46-ha F4). The store records the directory with the
settings, so a server given another is refused in one line and never leads."""

from __future__ import annotations

import types
from pathlib import Path

import msgspec
import pytest

from ledger.dispatch import registry
from ledger.server import run
from ledger.store import lease
from ledger.wire.config import ServeConfig, slurm_jobs_dir

CLUSTER = {"slurm_cluster": "gpuledger at head port 6817", "slurm_state": "/srv/state",
           "slurm_untracked_ok": False}  # fmt: skip
SLURM = ServeConfig(executor="slurm", partition="gpu")


def _settings(config: ServeConfig, home: Path) -> lease.Settings:
    policy = registry.build(config.policy, {}, known_only=True)
    return run.settings_of(config, policy, dict(CLUSTER), slurm_jobs_dir(config, home))


def test_two_servers_with_their_own_homes_and_no_shared_jobs_dir_do_not_both_lead(
    tmp_path: Path,
) -> None:
    """The default, `<home>/jobs`, differs between two servers of their own homes (as docs/ha.md
    has them): the second is refused in one line naming both directories."""
    first = _settings(SLURM, tmp_path / "h0")
    second = _settings(SLURM, tmp_path / "h1")
    why = lease.refusal(second, first, "host0:1:abc", live=True)
    assert why is not None
    assert "\n" not in why
    assert (
        f'slurm_jobs_dir "{tmp_path}/h0/jobs" (recorded) against "{tmp_path}/h1/jobs" here' in why
    )


def test_another_configured_jobs_dir_is_refused_and_the_same_one_agrees(tmp_path: Path) -> None:
    shared = msgspec.structs.replace(SLURM, slurm_jobs_dir=str(tmp_path / "shared"))
    first = _settings(shared, tmp_path / "h0")
    assert lease.refusal(_settings(shared, tmp_path / "h1"), first, "host0:1:abc", True) is None
    other = msgspec.structs.replace(SLURM, slurm_jobs_dir=str(tmp_path / "other"))
    why = lease.refusal(_settings(other, tmp_path / "h1"), first, "host0:1:abc", True)
    assert why is not None and "slurm_jobs_dir" in why, why


def test_a_store_recorded_before_the_key_is_not_refused(tmp_path: Path) -> None:
    """A row an earlier version wrote has no `slurm_jobs_dir`: not compared; the next take
    records it (`lease.admission_differences`)."""
    import json

    first = _settings(SLURM, tmp_path / "h0")
    earlier = json.loads(first.admission or "{}")
    del earlier["slurm_jobs_dir"]
    recorded = lease.Settings(first.lease_s, first.node, first.work, json.dumps(earlier))
    assert lease.refusal(_settings(SLURM, tmp_path / "h1"), recorded, "h", True) is None


def test_the_slurm_executor_is_made_with_the_configured_jobs_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ledger.engines.slurm as slurm

    got: list[Path] = []
    monkeypatch.setattr(slurm, "open_executor", lambda _l, _p, log_dir, *_a: got.append(log_dir))
    ledger = types.SimpleNamespace(home=tmp_path / "home")
    config = msgspec.structs.replace(SLURM, slurm_jobs_dir=str(tmp_path / "shared"))
    run.make_executor(ledger, config, "root")  # type: ignore[arg-type]
    run.make_executor(ledger, SLURM, "root")  # type: ignore[arg-type]
    assert got == [tmp_path / "shared", tmp_path / "home" / "jobs"]


def test_a_relative_jobs_dir_is_recorded_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = msgspec.structs.replace(SLURM, slurm_jobs_dir="runs")
    assert slurm_jobs_dir(config, Path("h")) == tmp_path / "runs"
    assert slurm_jobs_dir(SLURM, Path("h")) == tmp_path / "h" / "jobs"
