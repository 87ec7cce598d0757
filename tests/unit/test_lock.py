"""requirements.lock pins every package pyproject.toml's ranges need, each inside its range, and
it is what .venv holds (scripts/setup installs exactly the lock), so nothing arrives unasked."""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
TOOLS = {"pip", "setuptools"}
"""The installer and the build backend: pinned in the lock, needed by no requirement."""


def lock() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for n, line in enumerate((ROOT / "requirements.lock").read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", line)
        assert m, f"requirements.lock:{n}: {line!r} is not name==version"
        name = canonicalize_name(m[1])
        assert name not in pins, f"requirements.lock:{n}: {name} is pinned twice"
        pins[name] = Version(m[2])
    return pins


def needed(reqs: list[str], extras: frozenset[str] = frozenset()) -> dict[str, list[Requirement]]:
    """Every requirement reachable from `reqs` on this interpreter (markers evaluated, extras
    followed), by package name, read from the installed packages' metadata."""
    out: dict[str, list[Requirement]] = {}
    todo = [(Requirement(r), extras) for r in reqs]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, of = todo.pop()
        env = [{"extra": e} for e in of] or [{"extra": ""}]
        if req.marker is not None and not any(req.marker.evaluate(e) for e in env):
            continue
        name = canonicalize_name(req.name)
        out.setdefault(name, []).append(req)
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        todo += [(Requirement(r), frozenset(req.extras)) for r in md.requires(name) or []]
    return out


def test_the_lock_pins_every_needed_package_inside_its_range() -> None:
    pins = lock()
    reqs = needed([*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["dev"]])
    missing = sorted(set(reqs) - set(pins))
    assert not missing, f"requirements.lock lacks {missing}: run scripts/lock"
    outside = [
        f"{name}=={pins[name]} ({r})"
        for name, rs in reqs.items()
        for r in rs
        if not r.specifier.contains(pins[name], prereleases=True)
    ]
    assert not outside, f"pins outside their ranges: {outside}"
    extra = sorted(set(pins) - set(reqs) - TOOLS)
    assert not extra, f"requirements.lock pins what nothing needs: {extra}"
    assert set(pins) >= TOOLS


def test_the_virtualenv_is_the_lock() -> None:
    differ = {}
    for name, version in lock().items():
        try:
            have = Version(md.version(name))
        except md.PackageNotFoundError:
            have = None
        if have != version:
            differ[name] = (str(version), str(have))
    assert not differ, f"(locked, installed) differ: {differ}; run scripts/setup"


def test_duckdb_is_held_to_one_minor_version() -> None:
    (spec,) = [Requirement(r) for r in PROJECT["dependencies"] if r.startswith("duckdb")]
    assert spec.specifier.contains("2.0.1") and not spec.specifier.contains("2.1.0")
    assert not spec.specifier.contains("1.5.6")
