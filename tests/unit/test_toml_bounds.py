"""TOML from outside is bounded before tomllib sees it (atk44-25 F14: a 200 KB budget file of one
dotted key, `a.a.a...=1`, grew the server past 16 GB; tomllib's memory is quadratic in the key's
parts). Every case here parsed on the old code (or took minutes and gigabytes)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ledger.core import budget
from ledger.wire import config
from schemas import toml_bounds
from schemas.errors import InvalidCommand

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("a" + ".a" * 16 + " = 1\n", "line 1: a key of more than 16 dotted parts"),
        ("x = 1\n[" + "a." * 16 + "a]\n", "line 2: a key of more than 16 dotted parts"),
        ("a . a . a . a . a . a . a . a . a . a . a . a . a . a . a . a . a = 1\n", "16 dotted"),
        ("\"a\".'b'" + '."c"' * 16 + " = 1\n", "16 dotted parts"),
        ("x = " + "[" * 17 + "]" * 17 + "\n", "nested more than 16 deep"),
        ("x = " + "{a=" * 17 + "1" + "}" * 17 + "\n", "nested more than 16 deep"),
        # a comment or a one-character one never counts as a closing bracket
        ("x = " + "[#\n" * 17 + "]" * 17 + "\n", "line 17: arrays or tables nested"),
        ("".join(f"k{i}.a.b.c.d.e.f.g.h = 1\n" for i in range(12_501)), "more than 100,000"),
    ],
)
def test_a_budget_file_past_the_bounds_is_one_clear_error(text: str, want: str) -> None:
    with pytest.raises(InvalidCommand) as got:
        budget.parse(text.encode(), "x.toml")
    assert want in str(got.value) and str(got.value).startswith("x.toml: line ")
    assert "refused before parsing" in str(got.value)


def test_the_attack_is_refused_at_once_and_small() -> None:
    text = "a" + ".a" * 100_000 + "=1"  # the attack's 200 KB file
    started = time.monotonic()
    with pytest.raises(InvalidCommand, match="a key of more than 16 dotted parts"):
        budget.parse(text.encode(), "x.toml")
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    "text",
    [
        # dots, brackets and quotes inside strings and comments count for nothing
        '[accounts."a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r/s"]\nkind = "program"\n',
        "[accounts.'[[[[[[[[[[[[[[[[[[[']\nkind = 'program' # ................. [[[[[[[[[[[[[[[[\n",
        '[accounts."p"]\nkind = "program"\nreason = """...\n.................\n"""\n',
        "[accounts.\"p\"]\nkind = \"program\"\nreason = '''{{{{{{{{{{{{{{{{{{{{\n.'''\n",
        '[accounts."p"]\nkind = "program"\nreason = "a \\" .................."\n',
        # 16 parts and 16 deep are allowed
        "a" + ".a" * 15 + " = 1\n",
        "x = " + "[" * 16 + "]" * 16 + "\n",
    ],
)
def test_files_within_the_bounds_reach_the_parser(text: str) -> None:
    toml_bounds.check(text, "x.toml")


@pytest.mark.parametrize("name", ["demo-budgets.toml", "ai2-synthetic.budgets.toml"])
def test_the_example_budget_files_are_within_the_bounds(name: str) -> None:
    assert budget.parse((EXAMPLES / name).read_bytes(), name).accounts


def test_a_config_file_is_bounded_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text("a" + ".a" * 50_000 + " = 1\n")
    with pytest.raises(InvalidCommand, match=r"serve.toml: line 1: a key of more than 16"):
        config.load(path)
    path.write_bytes(b"listen = '\xff'\n")
    with pytest.raises(InvalidCommand, match="is not valid TOML"):
        config.load(path)
    assert config.load(EXAMPLES / "serve.toml") == config.ServeConfig()
