"""The generated JSON Schemas: deterministic, one per event type, and committed without drift."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from schemas import commands as c
from schemas import events as e
from schemas import export as x
from schemas.events import EVENT_TYPES, OLDER_TYPES, TAGS, tag_of

REGENERATE = "run `gpuledger schemas export schemas/json` and commit the result"


def test_committed_schemas_match_the_code() -> None:
    drift = x.check(x.JSON_DIR)
    assert not drift, (
        f"schemas/json drifts from schemas/events.py in {', '.join(drift)}: {REGENERATE}"
    )


def test_the_schemas_are_the_same_whatever_was_imported_first() -> None:
    """An annotation equal to another but for an int where it has a float (`Meta(ge=0)` and
    `Meta(ge=0.0)` are equal, so Python's caches hand out whichever was made first) rendered
    `"minimum": 0` or `0.0` by import order: the check failed after test_openapi's imports
    (a `SquattersArgs.idle_s` of its own, 2026-12-07)."""
    import subprocess
    import sys

    code = (  # what test_openapi does before: the document rendered, then served once
        "from ledger.server import app as a\n"
        "a.offline_document()\n"
        "from litestar.testing import TestClient\n"
        "with TestClient(a.offline_app()) as c: c.get('/v1/openapi.json')\n"
        "from schemas import export as x\n"
        "print(x.check(x.JSON_DIR))\n"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "[]", got.stdout + got.stderr


def test_export_writes_one_file_per_event_type_named_by_tag(tmp_path: Path) -> None:
    written = [p for p in x.export(tmp_path) if p.parent == tmp_path]
    assert [p.name for p in written] == sorted(f"{t}.json" for t in TAGS)
    assert len(written) == len(EVENT_TYPES + OLDER_TYPES)
    for cls in EVENT_TYPES + OLDER_TYPES:
        doc = json.loads((tmp_path / f"{tag_of(cls)}.json").read_text(encoding="utf-8"))
        assert doc["$ref"] == f"#/$defs/{cls.__name__}"
        body = doc["$defs"][cls.__name__]
        assert body["properties"]["type"] == {"enum": [tag_of(cls)]}
        assert {"type", "event_id", "at", "actor"} <= set(body["required"])


def test_export_is_deterministic_sorted_and_ends_with_a_newline(tmp_path: Path) -> None:
    first = {p.relative_to(tmp_path / "a"): p.read_bytes() for p in x.export(tmp_path / "a")}
    second = {p.relative_to(tmp_path / "b"): p.read_bytes() for p in x.export(tmp_path / "b")}
    assert first == second
    for name, data in first.items():
        assert data.endswith(b"}\n") and not data.endswith(b"\n\n"), name
        canonical = json.dumps(json.loads(data), indent=2, sort_keys=True, ensure_ascii=False)
        assert data.decode() == canonical + "\n", name


def test_export_removes_schemas_of_event_types_that_no_longer_exist(tmp_path: Path) -> None:
    (tmp_path / "job.gone.v1.json").write_text("{}\n")
    (tmp_path / "README.md").write_text("kept\n")
    x.export(tmp_path)
    assert not (tmp_path / "job.gone.v1.json").exists()
    assert (tmp_path / "README.md").exists()
    assert x.check(tmp_path) == []


def _missing(d: Path) -> None:
    (d / "job.started.v1.json").unlink()


def _extra(d: Path) -> None:
    (d / "job.exploded.v1.json").write_text("{}\n")


def _different(d: Path) -> None:
    p = d / "node.drained.v1.json"
    p.write_text(p.read_text().replace('"node"', '"host"'))


def _reformatted(d: Path) -> None:
    p = d / "admin.granted.v1.json"
    p.write_text(json.dumps(json.loads(p.read_text())) + "\n")


def _no_trailing_newline(d: Path) -> None:
    p = d / "admin.revoked.v1.json"
    p.write_text(p.read_text().rstrip("\n"))


@pytest.mark.parametrize(
    ("damage", "want_drift"),
    [
        pytest.param(_missing, ["job.started.v1.json"], id="a missing file drifts"),
        pytest.param(_extra, ["job.exploded.v1.json"], id="an extra file drifts"),
        pytest.param(_different, ["node.drained.v1.json"], id="a changed field drifts"),
        pytest.param(_reformatted, ["admin.granted.v1.json"], id="reformatting drifts"),
        pytest.param(_no_trailing_newline, ["admin.revoked.v1.json"], id="a lost newline drifts"),
    ],
)
def test_check_names_the_drifting_file(
    tmp_path: Path, damage: object, want_drift: list[str]
) -> None:
    x.export(tmp_path)
    assert callable(damage)
    damage(tmp_path)
    assert x.check(tmp_path) == want_drift


def test_check_of_a_missing_directory_lists_every_file(tmp_path: Path) -> None:
    assert x.check(tmp_path / "nowhere") == sorted(x.expected_files())
    assert {f"{t}.json" for t in TAGS} <= set(x.check(tmp_path / "nowhere"))


def test_views_and_commands_are_exported_beside_the_events(tmp_path: Path) -> None:
    x.export(tmp_path)
    share = json.loads((tmp_path / "views" / "ShareRow.json").read_text())
    body = share["$defs"]["ShareRow"]
    assert body["properties"]["level_fs"] == {"anyOf": [{"type": "number"}, {"type": "null"}]}
    assert "level_fs_infinite" in body["required"]
    submit = json.loads((tmp_path / "commands" / "submit.json").read_text())
    assert submit["$defs"]["SubmitJob"]["properties"]["op"] == {"enum": ["submit"]}


def test_a_decision_record_keeps_the_body_the_dispatcher_hands_in() -> None:
    """`CycleDecided` (v3) is `ApplyDecision.decision` with its outcomes by reference: the
    same fields of the same types, so the domain copies the body without naming them."""
    record = {f.name: f.type for f in msgspec.structs.fields(e.CycleDecided)}
    body = {f.name: f.type for f in msgspec.structs.fields(c.DecisionBody)}
    envelope = {f.name for f in msgspec.structs.fields(e.Event)}
    outcomes = {"placements": "placed", "preemptions": "preempted"}
    assert set(record) - envelope == {outcomes.get(name, name) for name in body}
    assert all(record[name] == kind for name, kind in body.items() if name not in outcomes)
