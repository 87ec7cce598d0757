"""The agent's state directory must let the jobs' own accounts reach their checkpoint files in
it when jobs run as their submitters, or the agent says so (docs/agent.md; atk43 F10)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.agent import host as agent_host
from ledger.agent.lease import jobs_may_not_enter
from ledger.cli import cli


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every account may pass into (pytest's own are 0700)."""
    where = Path(tempfile.mkdtemp(prefix="gpuledger-state-", dir="/tmp"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where)


def test_a_directory_others_may_not_pass_is_named(open_dir: Path) -> None:
    state = open_dir / "a" / "state"
    state.mkdir(parents=True)
    assert jobs_may_not_enter(state) == ""
    (open_dir / "a").chmod(0o700)
    try:
        assert jobs_may_not_enter(state).startswith(f"{open_dir / 'a'} does not let other")
        assert jobs_may_not_enter(state / "not-made-yet").startswith(f"{open_dir / 'a'} ")
    finally:
        (open_dir / "a").chmod(0o755)
    state.chmod(0o711)  # passed through, not listed: enough
    assert jobs_may_not_enter(state) == ""


class Started(Exception):
    """The agent got past its checks of the state directory."""


@pytest.mark.parametrize("run_as", ["submitter", "service"])
def test_an_agent_for_submitters_warns_of_a_0700_state_directory_in_one_line(
    open_dir: Path, run_as: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def hold_node(*_: object) -> None:
        raise Started

    monkeypatch.setattr(agent_host, "hold_node", hold_node)
    state = open_dir / "state"
    state.mkdir()
    state.chmod(0o700)
    args = ["agent", "--node", "n1", "--url", "http://127.0.0.1:1", "--gpus", "1",
            "--state-dir", str(state), "--run-as", run_as]  # fmt: skip
    out = CliRunner().invoke(cli, args, env={"GPULEDGER_NODE_TOKEN": "glt_x"})
    assert "internal error: Started" in out.output, out.output  # it starts either way
    warned = [line for line in out.output.splitlines() if "checkpoint files" in line]
    if run_as == "submitter":  # root here: its jobs run as other accounts
        assert len(warned) == 1 and "chmod o+x" in warned[0], out.output
    else:  # its jobs run as the service: the directory is the service's own
        assert warned == [], out.output
