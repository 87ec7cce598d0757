"""The package configuration covers every package and data file, so an install builds without
setuptools' "Package would be ignored" warnings (the first `scripts/demo` printed ~40 of them)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
TOP = ("schemas", "ledger", "projections")


def test_every_python_package_is_found() -> None:
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in TOP
        for p in (ROOT / top).rglob("__init__.py")
    }
    found = set(find_packages(where=str(ROOT), include=CONFIG["packages"]["find"]["include"]))
    assert on_disk <= found
    assert {f for f in found if not f.startswith("tests")} == on_disk


def test_every_data_file_is_package_data() -> None:
    data = CONFIG["package-data"]
    for top in TOP:
        for path in (ROOT / top).rglob("*"):
            if path.is_dir() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT / top).as_posix()
            assert any(fnmatch.fnmatchcase(rel, g) for g in data.get(top, [])), rel
