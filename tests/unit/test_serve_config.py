"""The serve config: every key is documented in examples/serve.toml, which loads as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ledger.wire import config
from schemas.errors import InvalidCommand
from schemas.units import Duration, Interval

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
        ("grace = 'soon'\n", "invalid duration 'soon' (use e.g. 30s, 15m, 8h, 7d) - at `$.grace`"),
        ("interval = 2\n", "got `int` - at `$.interval`"),
        ("listen = \n", "is not valid TOML"),
        ("log_level = 'bogus'\n", "Invalid enum value 'bogus' - at `$.log_level`"),
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


def test_durations_are_parsed_once_and_a_bad_flag_is_named() -> None:
    merged = config.merge(config.ServeConfig(), interval="0.5s", squat_after="2h")
    assert (merged.interval, merged.squat_after) == (Interval("0.5s"), Duration("2h"))
    assert (merged.interval.seconds, merged.grace.seconds) == (0.5, 30)
    with pytest.raises(InvalidCommand) as err:
        config.merge(config.ServeConfig(), interval="often")
    assert err.value.line() == "invalid --interval 'often' (use e.g. 0.5s, 10s, 1m)"


def test_abandon_runs_is_a_command_line_choice_only(tmp_path: Path) -> None:
    """`serve --abandon-runs` (with `--new-settings` onto another Slurm cluster, atk43ha F2)
    acts once: a file left with it is refused, as `new_settings` is."""
    path = tmp_path / "serve.toml"
    path.write_text("abandon_runs = true\n")
    with pytest.raises(InvalidCommand, match="abandon_runs is a one-time choice"):
        config.load(path)


def test_abandon_runs_without_new_settings_is_refused_before_anything(tmp_path: Path) -> None:
    from ledger.server.run import serve

    with pytest.raises(InvalidCommand, match="--abandon-runs goes with --new-settings"):
        serve(tmp_path / "home", config.ServeConfig(abandon_runs=True))
    assert not (tmp_path / "home").exists()  # refused before the data directory is touched
