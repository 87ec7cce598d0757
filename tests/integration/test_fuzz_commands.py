"""Fuzzing the write side through its own contract: command sequences generated from the
commands' exported JSON Schemas (`from_schema` below: the JSON Schema subset msgspec writes, with
every bound's boundary values drawn often) run through
the real `Ledger` on a real store. Each command is refused with a `LedgerError` that appends
nothing, or accepted; after every sequence the projection rebuilds and `shares`, `queue`, one
dispatcher cycle, `replay --all` and `audit check` all succeed."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.cli import cli
from ledger.cycle.dispatcher import Dispatcher, ProjectionRanks
from ledger.dispatch.policy import FairShare
from ledger.sim.kernel import KernelExecutor
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c
from schemas.errors import LedgerError
from schemas.export import schema_of

T0 = 1_767_225_600.0
ACTORS = ["root", "alice", "bob", "@dispatcher", "@executor"]
NAMES = ["ai2", "ai2/olmo", "ai2/tulu", "ai2/olmo/alice", "n0", "n1", "alice", "bob", "x"]


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid for a JSON Schema as msgspec writes them ($ref/$defs, objects with required
    properties, anyOf, enum, integer/number bounds, string lengths, array and map sizes); the
    bounds themselves come up often (hypothesis-jsonschema's role, for the subset we emit)."""
    defs = schema.get("$defs", {})

    def of(s: dict[str, Any]) -> st.SearchStrategy[Any]:
        if "$ref" in s:
            return st.deferred(lambda: of(defs[s["$ref"].rsplit("/", 1)[-1]]))
        if "anyOf" in s:
            return st.one_of([of(x) for x in s["anyOf"]])
        if "enum" in s:
            return st.sampled_from(s["enum"])
        t = s.get("type", "string" if "maxLength" in s or "pattern" in s else None)
        if t == "integer":
            lo, hi = s.get("minimum", -(2**63)), s.get("maximum", 2**63 - 1)
            return st.one_of(st.sampled_from([lo, hi]), st.integers(lo, hi))
        if t == "number":
            lo, hi = s.get("minimum"), s.get("maximum")
            edges = [x for x in (lo, hi) if x is not None]
            xlo, xhi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
            floats = st.floats(
                lo if xlo is None else xlo,
                hi if xhi is None else xhi,
                allow_nan=False,
                allow_infinity=False,
                exclude_min=xlo is not None,
                exclude_max=xhi is not None,
            )
            return st.one_of(st.sampled_from(edges), floats) if edges else floats
        if t == "string" and "pattern" in s:
            return st.from_regex(s["pattern"], fullmatch=True)
        if t == "string":
            lo, hi = s.get("minLength", 0), s.get("maxLength", 20)
            return st.one_of(
                st.text(min_size=lo, max_size=min(hi, 20)), st.just("x" * hi), st.just("")
            ).filter(lambda x: lo <= len(x) <= hi)
        if t == "boolean":
            return st.booleans()
        if t == "null":
            return st.none()
        if t == "array":
            hi = min(s.get("maxItems", 3), 3)
            return st.lists(of(s.get("items", {})), min_size=s.get("minItems", 0), max_size=hi)
        if t == "object" and "properties" in s:
            required = set(s.get("required", ()))
            props = s["properties"]
            return st.fixed_dictionaries(
                {k: of(v) for k, v in props.items() if k in required},
                optional={k: of(v) for k, v in props.items() if k not in required},
            )
        if t == "object":
            hi = min(s.get("maxProperties", 3), 3)
            keys = of(s.get("propertyNames", {"type": "string"}))
            return st.dictionaries(keys, of(s.get("additionalProperties", {})), max_size=hi)
        raise AssertionError(f"no strategy for {s}")

    return of(schema)


def _steer(op: type[c.Command]) -> st.SearchStrategy[dict[str, Any]]:
    """Schema-valid commands of one type; half of them steered onto names, ids and actors that
    exist, so that some are accepted and sequences build on each other."""
    raw = from_schema(schema_of(op))

    def steer(d: dict[str, Any], actor: str, name: str, job: int) -> dict[str, Any]:
        d = {**d, "actor": actor}
        for key in ("account", "project", "path", "node", "user"):
            if key in d and isinstance(d[key], str):
                d[key] = name if key != "user" else actor.lstrip("@")
        if "job_id" in d:
            d["job_id"] = job
        d.pop("expected_position", None)
        return d

    steered = st.builds(
        steer,
        raw,
        st.sampled_from(ACTORS),
        st.sampled_from(NAMES),
        st.integers(1, 4),
    )
    return st.one_of(raw, steered)


COMMANDS = st.one_of(
    [
        _steer(op)  # type: ignore[type-abstract]
        for op in c.COMMAND_TYPES
        # decisions come from the real dispatcher's cycle below: a decision made up by an
        # admin is recorded, and replay rightly reports that no policy code makes it
        if op not in (c.InitLedger, c.ApplyDecision)
    ]
)


def _org(home: Path, clock: SimClock) -> Ledger:
    ledger = Ledger(home, clock, seeded_ids(1))
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
            c.OpenAccount(actor="root", path="ai2/tulu", kind="project"),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.AddMember(actor="root", user="bob", project="ai2/tulu"),
            c.RegisterNode(actor="root", node="n0", gpu_type="h100", gpus=8),
            c.SubmitJob(actor="alice", account="ai2/olmo", gpus=4, min_runtime_s=600),
        ]
    )
    return ledger


def _cli_ok(home: Path, *args: str) -> None:
    out = CliRunner().invoke(cli, ["--home", str(home), *args])
    assert out.exit_code == 0, (args, out.output)


def _one_cycle(home: Path, ledger: Ledger, clock: SimClock) -> None:
    """One cycle of the real dispatcher (fair share's defaults) on the ledger, now."""
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        Dispatcher(
            ledger, ProjectionRanks(Projector(store, source)), FairShare(), KernelExecutor()
        ).cycle(clock.now())


_runs = itertools.count()


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(docs=st.lists(COMMANDS, min_size=1, max_size=6))
def test_generated_command_sequences_never_break_the_ledger(
    tmp_path: Path, docs: list[dict[str, Any]]
) -> None:
    home = tmp_path / f"run-{next(_runs)}"
    clock = SimClock(T0)
    ledger = _org(home, clock)
    try:
        for i, doc in enumerate(docs):
            # every schema-valid document is a command of its type
            cmd = msgspec.convert(doc, c.AnyCommand)
            clock.advance_to(T0 + 60 * (i + 1))
            head = ledger.head()
            try:
                ledger.execute(cmd)
            except LedgerError as err:
                assert err.line(), "an error says what was wrong"
                assert ledger.head() == head, "a refused command appends nothing"
        _one_cycle(home, ledger, clock)
    finally:
        ledger.close()
    for args in (
        ("projection", "rebuild"),
        ("shares", "--at", str(clock.now())),
        ("queue",),
        ("replay", "--all"),
        ("audit", "check"),
    ):
        _cli_ok(home, *args)


@pytest.mark.parametrize("op", c.COMMAND_TYPES, ids=lambda op: op.__struct_config__.tag)
def test_every_command_schema_carries_its_bounds(op: type[c.Command]) -> None:
    body = schema_of(op)["$defs"][op.__name__]
    for name, prop in body["properties"].items():
        for alt in prop.get("anyOf", [prop]):
            if alt.get("type") in ("integer", "number"):
                assert "minimum" in alt and "maximum" in alt, (name, alt)
            if alt.get("type") == "string" and "enum" not in alt:
                assert "maxLength" in alt, (name, alt)
            if alt.get("type") == "array":
                assert "maxItems" in alt, (name, alt)


def test_an_admins_service_settings_do_not_make_the_services_decisions_differ(
    tmp_path: Path,
) -> None:
    """The final run's example: an admin records `service.configure` with other settings than
    the running dispatcher's; replay compared the dispatcher's honest records with them (a
    difference each). Only the settings the service recorded are what it decides with."""
    from schemas.policy import FairShare7Config

    home = tmp_path / "h"
    clock = SimClock(T0)
    ledger = _org(home, clock)
    try:
        clock.advance_to(T0 + 60)
        other = FairShare7Config(margin=0.5)
        ledger.execute(c.ConfigureService(actor="root", policy=other, interval_s=1.0,
                                          executor="none"))  # fmt: skip
        ledger.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1))
        _one_cycle(home, ledger, clock)
    finally:
        ledger.close()
    _cli_ok(home, "replay", "--all")


def test_replay_all_of_a_history_without_decisions_succeeds(tmp_path: Path) -> None:
    ledger = _org(tmp_path / "h", SimClock(T0))
    ledger.close()
    out = CliRunner().invoke(cli, ["--home", str(tmp_path / "h"), "replay", "--all"])
    assert out.exit_code == 0, out.output
    assert "nothing to replay" in out.output
