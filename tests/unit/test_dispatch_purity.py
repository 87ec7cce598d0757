"""Pure code keeps no state between calls: the dispatcher's core (`ledger.dispatch`) and the
snapshot adapter (`ledger.cycle.inputs`) have no `global` statement and no module-level
container that starts empty (a cache filled by calls). What one cycle hands the next is passed
in and handed back (`decide_carried`'s `Carry`, `snapshot_kept`'s `Views`); answers worked out
from one snapshot alone are kept with it (`Snapshot.memo`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ledger.cycle.inputs import snapshot_from_state, snapshot_kept
from ledger.dispatch import decide
from ledger.dispatch.engine import decide_carried
from ledger.dispatch.fairshare7 import FairShare7, pool_gpus
from ledger.dispatch.snapshot import NodeView, PendingJob, Snapshot

ROOT = Path(__file__).resolve().parents[2]
PURE = [*sorted((ROOT / "ledger/dispatch").glob("*.py")), ROOT / "ledger/cycle/inputs.py"]
CACHES = {"set", "dict", "list", "WeakKeyDictionary", "WeakValueDictionary", "OrderedDict"}


def _empty_container(node: ast.expr | None) -> bool:
    """`{}`, `[]`, `[None]`, `set()`, `dict()`, `list()`, a `WeakKeyDictionary()`..."""
    if isinstance(node, ast.Dict):
        return not node.keys
    if isinstance(node, ast.List):
        return all(isinstance(x, ast.Constant) and x.value is None for x in node.elts)
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        name = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        return name in {
            "set",
            "dict",
            "list",
            "WeakKeyDictionary",
            "WeakValueDictionary",
            "OrderedDict",
        }
    return False


def _module_state(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = [f"line {n.lineno}: global {', '.join(n.names)}" for n in ast.walk(tree)
             if isinstance(n, ast.Global)]  # fmt: skip
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        if _empty_container(value):
            found.append(f"line {stmt.lineno}: {ast.unparse(stmt).splitlines()[0]}")
    return found


@pytest.mark.parametrize("path", PURE, ids=lambda p: p.name)
def test_pure_modules_keep_no_state_between_calls(path: Path) -> None:
    assert _module_state(path) == [], f"{path.name} keeps module-level state"


def _nodes(free: int) -> tuple[NodeView, ...]:
    return tuple(NodeView(name=f"n{i}", cluster="c", gpu_type="h100", gpus=8,
                          free=tuple(range(free))) for i in range(4))  # fmt: skip


def test_a_snapshots_answers_are_its_own() -> None:
    """Two snapshots asked about in turn (two dispatchers, a preview beside a cycle) each get
    their own pool size: nothing one asked is read for the other."""
    job = PendingJob(job_id=1, account="a", user="u", gpus=8, min_runtime_s=60, submitted_at=0.0)
    small = Snapshot(position=1, nodes=_nodes(8)[:1])
    large = Snapshot(position=1, nodes=_nodes(8))
    assert [pool_gpus(s, job) for s in (small, large, small, large)] == [8, 32, 8, 32]
    assert small == Snapshot(position=1, nodes=_nodes(8)[:1])  # the memo is no part of its value


def test_carried_decisions_equal_fresh_ones_whoever_else_decides_between() -> None:
    """A carry is its owner's: decisions made with one equal decisions made from nothing, while
    another owner decides over other nodes in between."""
    policy = FairShare7()
    pending = tuple(
        PendingJob(job_id=i, account="a", user="u", gpus=g, min_runtime_s=60, submitted_at=i)
        for i, g in enumerate((8, 3, 16, 1), 1)
    )
    mine, other = None, None
    for step, free in enumerate((8, 5, 2, 8, 0, 7)):
        snap = Snapshot(position=step, taken_at=100.0, nodes=_nodes(free), pending=pending)
        theirs = Snapshot(
            position=step, taken_at=100.0, nodes=_nodes(8 - free)[:2], pending=pending
        )
        decision, mine = decide_carried(snap, policy, 100.0, mine)
        _, other = decide_carried(theirs, policy, 100.0, other)
        assert decision == decide(snap, policy, 100.0), f"step {step}"


def test_snapshot_kept_equals_snapshot_from_nothing_kept() -> None:
    from ledger.core.state import State

    state = State()
    one, kept = snapshot_kept(state, {"a/u": 0}, 5.0, None)
    two, kept = snapshot_kept(state, {"a/u": 0}, 5.0, kept)
    assert one == two == snapshot_from_state(state, {"a/u": 0}, 5.0)
    assert two.ranks is one.ranks and two.ranks == {"a/u": 0, "a": 0}
