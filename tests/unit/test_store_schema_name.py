"""Two words of the PostgreSQL setup (atk49 F6): an upper-case `GPULEDGER_PG_SCHEMA` is refused
in one line naming the lower-case one (PostgreSQL folds `CREATE SCHEMA Led` to `led`, and the
ledger names its schema quoted: `Led` was another, empty schema, and `audit check` advised a
rebuild from an empty log); and a command that works on the data directory, run with
GPULEDGER_URL set, says that setting sends it away (it said "a server owns it" of a new home)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.cli._common import Ctx
from ledger.store.pgread import SCHEMA_VARIABLE, store_schema
from schemas.errors import InvalidCommand, LedgerError


@pytest.mark.parametrize("name", ["LED", "Led", "ledGer"])
def test_an_upper_case_schema_is_refused_naming_the_lower_case_one(name: str) -> None:
    with pytest.raises(InvalidCommand) as got:
        store_schema({SCHEMA_VARIABLE: name})
    line = got.value.line()
    assert "upper-case" in line and f"{SCHEMA_VARIABLE}={name.lower()}" in line, line


@pytest.mark.parametrize("name", ["led", "ledger_2", "_x$1", ""])
def test_lower_case_names_and_the_default_pass(name: str) -> None:
    assert store_schema({SCHEMA_VARIABLE: name}) == (name or "public")


def test_a_data_directory_command_with_a_url_names_the_url_not_a_server(tmp_path: Path) -> None:
    ctx = Ctx(tmp_path / "new-home", None, url="http://127.0.0.1:9")
    with pytest.raises(LedgerError) as got:
        ctx.local_only()
    line = got.value.line()
    assert "GPULEDGER_URL" in line and "a server owns it" not in line, line
    assert str(tmp_path / "new-home") in line, line
