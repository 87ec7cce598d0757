"""Docs that run: every fenced block marked `sh runnable` in README.md and docs/ runs as
written from a fresh clone: in a new directory holding the clone's examples/, scripts/ and
.venv (nothing else), with no data directory yet, each block one bash script stopped at its
first failing command."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = re.compile(r"^```sh runnable\n(.*?)^```", re.M | re.S)


def runnable() -> list[tuple[str, str]]:
    """(where, script) of every runnable block, in document order."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in RUNNABLE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{path.relative_to(ROOT)}:{line}", m.group(1)))
    return out


BLOCKS = runnable()


def test_the_readme_and_docs_mark_runnable_blocks() -> None:
    where = {w.split(":")[0] for w, _ in BLOCKS}
    assert {"README.md", "docs/simulation.md"} <= where, where


@pytest.mark.parametrize(("where", "script"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_a_runnable_block_runs_as_written(where: str, script: str, tmp_path: Path) -> None:
    for name in ("examples", "scripts", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPULEDGER_") or k == "GPULEDGER_KAFKA"
    }
    env |= {"HOME": str(tmp_path), "USER": os.environ.get("USER", "root") or "root"}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    got = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert got.returncode == 0, (
        f"{where}:\n{script}\n--- stdout\n{got.stdout}\n--- stderr\n{got.stderr}"
    )
