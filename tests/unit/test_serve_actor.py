"""`serve` (and `up`) act as the admin starting them, whatever server a client on this host
would reach: docs/ha.md has clients export $GPULEDGER_URL on every host, and a `serve` started
with it exported had no actor ("" tells a server to fill it in), so every take of the lease
failed in the Slurm opening, "no actor given", and was handed back about twice a second while
health said up (atk46-ha F5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.cli import _common, cli


@pytest.mark.parametrize("as_", [None, "alice"])
def test_serve_with_gpuledger_url_exported_acts_as_its_os_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_: str | None
) -> None:
    import ledger.server.run as run

    got: list[str] = []

    def serve(home: Path, config: Any, actor: str = "", **_: Any) -> int:
        got.append(actor)
        return 0

    monkeypatch.setattr(run, "serve", serve)
    env = {"GPULEDGER_HOME": str(tmp_path), "GPULEDGER_URL": "http://127.0.0.1:1,http://h2:2"}
    if as_ is not None:
        env["GPULEDGER_USER"] = as_
    result = CliRunner().invoke(cli, ["serve", "--listen", "127.0.0.1:0"], env=env)
    assert result.exit_code == 0, result.output
    assert got == [as_ or _common.os_user()]
