"""A fresh clone runs every documented command: the files the docs, scripts and tests name under
examples/ are in the repository, and no tracked file points at one machine's directories (the
Philly sample was once read from a path outside the repository)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MACHINE = re.compile(
    r"/work/(?:shared|main|atk|wt|final|notes|i\d+)\b|\bshared/traces\b|/root/|/home/runner/"
)
"""Where this project was built, and the directory the trace once came from."""
NAMED = re.compile(r"examples/traces/[\w.-]+")


def tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    files = [ROOT / p for p in out.split("\0") if p]
    return [p for p in files if p.is_file() and p.suffix not in (".gz", ".png", ".jpg")]


def test_no_tracked_file_names_a_machines_directory() -> None:
    hits = []
    for path in tracked():
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(errors="replace")
        hits += [f"{path.relative_to(ROOT)}: {m[0]}" for m in MACHINE.finditer(text)]
    assert not hits, hits


def test_every_trace_the_repository_names_ships_with_it() -> None:
    named = {
        m[0].rstrip(".")
        for path in tracked()
        for m in NAMED.finditer(path.read_text(errors="replace"))
    }
    assert "examples/traces/philly-4plusgpu-sample.csv.gz" in named
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, missing
    assert "CC BY 4.0" in (ROOT / "examples/traces/README.md").read_text()
