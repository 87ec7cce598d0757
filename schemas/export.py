"""JSON Schema files: one per event type (named after its tag), one per command
(`commands/<op>.json`) and one per read view or filter (`views/<Name>.json`).

The committed files under `schemas/json/` are generated: `export` writes them and `check` says
which ones drift from the Structs in `schemas.events`, `schemas.commands` and `schemas.views`.
The bounds the types declare (`Meta(ge=, le=, max_length=)`) are in the schemas. Output is
deterministic (sorted keys, two space indent, trailing newline) so a regenerated file is
byte-identical when nothing changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from schemas.commands import COMMAND_TYPES
from schemas.events import EVENT_TYPES, OLDER_TYPES, tag_of
from schemas.views import VIEW_TYPES

JSON_DIR = Path(__file__).parent / "json"
"""Where the committed schemas live (shipped as package data)."""

SUFFIX = ".json"


def schema_of(cls: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON Schema of one Struct type, as msgspec generates it."""
    schema: dict[str, Any] = msgspec.json.schema(cls)
    return schema


def render(cls: type[msgspec.Struct]) -> str:
    """Pure: the canonical text of one schema file."""
    return json.dumps(schema_of(cls), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def expected_files() -> dict[str, str]:
    """Pure: relative file path -> canonical text, for every stored event type (older versions
    too: a reader of the raw log meets them), command and view, sorted by path."""
    files = {tag_of(cls) + SUFFIX: render(cls) for cls in EVENT_TYPES + OLDER_TYPES}
    for cmd in COMMAND_TYPES:
        op = cmd.__struct_config__.tag
        files[f"commands/{op}{SUFFIX}"] = render(cmd)
    for view in VIEW_TYPES:
        files[f"views/{view.__name__}{SUFFIX}"] = render(view)
    return dict(sorted(files.items()))


def _present(directory: Path) -> set[str]:
    if not directory.is_dir():
        return set()
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*" + SUFFIX)}


def export(directory: Path) -> list[Path]:
    """Write every schema into `directory` (created if missing); remove stale `*.json` files of
    types that no longer exist. Returns the written paths, sorted."""
    directory.mkdir(parents=True, exist_ok=True)
    want = expected_files()
    for stale in sorted(_present(directory) - want.keys()):
        (directory / stale).unlink()
    written = []
    for name, text in want.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="\n")
        written.append(path)
    return written


def check(directory: Path) -> list[str]:
    """Names of the files in `directory` that drift from the code: missing, extra or different.

    An empty list means the committed schemas match `schemas.events`.
    """
    want = expected_files()
    have = _present(directory)
    drift = []
    for name in sorted(want.keys() | have):
        path = directory / name
        if name not in have or name not in want or path.read_text(encoding="utf-8") != want[name]:
            drift.append(name)
    return drift
