"""Every package under `ledger/` is a room of the layer contract, and `ledger/` has no loose
modules: a new room that no contract names would be checked by nothing."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layered = [c for c in contracts if c["type"] == "layers"]
    assert len(layered) == 1, "one layer contract orders every room"
    return [
        room.strip()
        for floor in layered[0]["layers"]
        for room in floor.replace(":", "|").split("|")
    ]


def test_every_ledger_package_is_a_room_of_the_layer_contract() -> None:
    rooms = set(_layers())
    packages = {
        f"ledger.{p.name}"
        for p in (ROOT / "ledger").iterdir()
        if p.is_dir() and (p / "__init__.py").exists()
    }
    assert packages - rooms == set(), "add these packages to the layer contract in pyproject.toml"
    assert {r for r in rooms if r.startswith("ledger.")} <= packages, "rooms that do not exist"


def test_ledger_has_no_loose_modules() -> None:
    loose = sorted(p.name for p in (ROOT / "ledger").glob("*.py") if p.name != "__init__.py")
    assert loose == [], "put each module in the room of its role (README: the layer table)"


def test_no_source_file_is_over_800_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for folder in ("ledger", "projections", "schemas")
        for p in (ROOT / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 800
    }
    assert long == {}, "split these files by role"


def test_the_test_support_contract_names_every_production_module_of_projections() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c.get("forbidden_modules") == ["projections.testing"]
    ]
    modules = {f"projections.{p.stem}" for p in (ROOT / "projections").glob("*.py")}
    modules.discard("projections.__init__")
    assert modules <= set(contract["source_modules"]), "a new module of projections/ is unchecked"
