"""The agent's config: every key is documented in examples/agent.toml, which loads as written;
unknown keys and bad values are one clear error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ledger.agent import config
from schemas.errors import InvalidCommand

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent.toml"


def test_the_example_lists_every_key_with_its_default() -> None:
    keys = re.findall(r"^(\w+)\s*=", EXAMPLE.read_text(), flags=re.M)
    assert keys == list(config.keys())
    assert config.load(EXAMPLE) == config.AgentConfig()


def test_every_key_has_a_docstring() -> None:
    assert all(doc.strip() for doc in config.keys().values())


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("nodes = 'a'\n", "unknown field `nodes`"),
        ("run_as = 'nobody'\n", "Invalid enum value 'nobody'"),
        ("gpus = 'eight'\n", "Expected `int`, got `str`"),
        ("heartbeat = '0s'\n", "invalid interval: must be float >= 0.001, got 0.0"),
        ("url = \n", "is not valid TOML"),
    ],
)
def test_bad_files_are_one_clear_error(tmp_path: Path, text: str, want: str) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(InvalidCommand) as err:
        config.load(path)
    assert want in err.value.line()
    if "TOML" not in want:
        assert err.value.hint == "see examples/agent.toml"


def test_flags_override_the_file() -> None:
    merged = config.merge(config.AgentConfig(node="a", gpus=4), node="b", gpus=None)
    assert (merged.node, merged.gpus) == ("b", 4)
