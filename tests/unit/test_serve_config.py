"""The serve config: every key is documented in examples/serve.toml, which loads as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ledger.wire import config
from schemas.errors import InvalidCommand

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "serve.toml"


def test_the_example_lists_every_key_with_its_default() -> None:
    keys = re.findall(r"^(\w+)\s*=", EXAMPLE.read_text(), flags=re.M)
    assert keys == list(config.keys())
    assert config.load(EXAMPLE) == config.ServeConfig()


def test_every_key_has_a_docstring() -> None:
    assert all(doc.strip() for doc in config.keys().values())


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("listne = '1:2'\n", "unknown field `listne`"),
        ("policy = 'lottery'\n", "Invalid enum value 'lottery'"),
        ("margin = 'a lot'\n", "Expected `float`, got `str`"),
        ("listen = \n", "is not valid TOML"),
    ],
)
def test_bad_files_are_one_clear_error(tmp_path: Path, text: str, want: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(InvalidCommand) as err:
        config.load(path)
    assert want in err.value.line()


def test_flags_override_the_file() -> None:
    merged = config.merge(config.ServeConfig(policy="fifo"), policy=None, listen="0.0.0.0:1")
    assert (merged.policy, merged.listen) == ("fifo", "0.0.0.0:1")
