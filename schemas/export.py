"""JSON Schema files for the event vocabulary: one file per event type, named after its tag.

The committed files under `schemas/json/` are generated: `export` writes them and `check` says
which ones drift from the Structs in `schemas.events`. Output is deterministic (sorted keys, two
space indent, trailing newline) so a regenerated file is byte-identical when nothing changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from schemas.events import EVENT_TYPES, OLDER_TYPES, Event, tag_of

JSON_DIR = Path(__file__).parent / "json"
"""Where the committed schemas live (shipped as package data)."""

SUFFIX = ".json"


def schema_of(cls: type[Event]) -> dict[str, Any]:
    """The JSON Schema of one event type, as msgspec generates it."""
    schema: dict[str, Any] = msgspec.json.schema(cls)
    return schema


def render(cls: type[Event]) -> str:
    """Pure: the canonical text of one schema file."""
    return json.dumps(schema_of(cls), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def expected_files() -> dict[str, str]:
    """Pure: file name -> canonical text, for every stored event type (older versions too: a
    reader of the raw log meets them), sorted by file name."""
    files = {tag_of(cls) + SUFFIX: render(cls) for cls in EVENT_TYPES + OLDER_TYPES}
    return dict(sorted(files.items()))


def export(directory: Path) -> list[Path]:
    """Write one schema per event type into `directory` (created if missing); remove stale
    `*.json` files of event types that no longer exist. Returns the written paths, sorted."""
    directory.mkdir(parents=True, exist_ok=True)
    want = expected_files()
    for stale in sorted(directory.glob("*" + SUFFIX)):
        if stale.name not in want:
            stale.unlink()
    written = []
    for name, text in want.items():
        path = directory / name
        path.write_text(text, encoding="utf-8", newline="\n")
        written.append(path)
    return written


def check(directory: Path) -> list[str]:
    """Names of the files in `directory` that drift from the code: missing, extra or different.

    An empty list means the committed schemas match `schemas.events`.
    """
    want = expected_files()
    have = {p.name for p in directory.glob("*" + SUFFIX)} if directory.is_dir() else set()
    drift = []
    for name in sorted(want.keys() | have):
        path = directory / name
        if name not in have or name not in want or path.read_text(encoding="utf-8") != want[name]:
            drift.append(name)
    return drift
