"""`GPULEDGER_SLURM_VANISH_AFTER_S`: how long a run of Slurm's executor may be missing from
every read of Slurm's before it counts as gone (30 s, `SlurmExecutor.vanish_after_s`). It had
no setting, so the tests that wait past it slept 45 s (test_ha_slurm_cluster); the server reads
it at start (`run.slurm_vanish_after_s`) and hands it to `open_executor`."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from ledger.server import run
from ledger.wire.config import ServeConfig
from schemas.errors import InvalidCommand

SLURM = ServeConfig(executor="slurm", partition="gpu")


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, None),
        ({"GPULEDGER_SLURM_VANISH_AFTER_S": "5"}, 5.0),
        ({"GPULEDGER_SLURM_VANISH_AFTER_S": "0.5"}, 0.5),
    ],
    ids=["unset: the executor's own", "whole seconds", "a fraction"],
)
def test_the_servers_slurm_executor_gets_the_missing_run_limit_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], want: float | None
) -> None:
    import ledger.engines.slurm as slurm

    got: list[Any] = []
    monkeypatch.setattr(slurm, "open_executor", lambda *a: got.append(a[-1]))
    monkeypatch.delenv("GPULEDGER_SLURM_VANISH_AFTER_S", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    run.make_executor(types.SimpleNamespace(home=tmp_path), SLURM, "root")  # type: ignore[arg-type]
    assert got == [want]


@pytest.mark.parametrize("text", ["0", "-3", "soon", "nan"])
def test_a_missing_run_limit_that_is_not_a_positive_number_is_refused_in_one_line(
    text: str,
) -> None:
    with pytest.raises(InvalidCommand) as err:
        run.slurm_vanish_after_s({"GPULEDGER_SLURM_VANISH_AFTER_S": text})
    assert err.value.message == f"invalid GPULEDGER_SLURM_VANISH_AFTER_S {text!r}"
    assert err.value.hint == "give a positive number"
