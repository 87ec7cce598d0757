"""A node token given on the agent's command line is readable by every local user (`ps`): the
agent says so at start; given in the environment it says nothing (atk33-28 F12)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ledger.cli import agent as agent_cli
from ledger.cli import cli


@pytest.mark.parametrize("argv", [True, False])
def test_a_token_on_the_command_line_is_warned_of(
    argv: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_cli, "_run", lambda config, drain: 0)
    args = ["agent", "--node", "n1", "--url", "http://127.0.0.1:1"]
    env = {} if argv else {"GPULEDGER_NODE_TOKEN": "glt_x"}
    out = CliRunner().invoke(cli, args + (["--token", "glt_x"] if argv else []), env=env)
    assert out.exit_code == 0, out.output
    assert ("readable by every local user" in out.output) is argv, out.output
