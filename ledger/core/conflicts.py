"""What events touch and commands depend on, for optimistic concurrency: a command that names
an expected position is rejected when a change since then touches what it depends on.

Pure: no I/O, no clock. `ledger.store.application` asks these of every append.
"""

from __future__ import annotations

from ledger.core.state import State
from schemas import commands as c
from schemas import events as e


def event_keys(event: e.AnyEvent) -> set[str]:
    """What an event touches, for optimistic concurrency: `job:N`, `node:X`, `account:P`."""
    return _named_keys(event)


def _named_keys(named: e.AnyEvent | c.AnyCommand) -> set[str]:
    """The job, nodes and accounts an event or a command names by its fields."""
    keys: set[str] = set()
    job_id = getattr(named, "job_id", None)
    if isinstance(job_id, int):
        keys.add(f"job:{job_id}")
    node = getattr(named, "node", None)
    if isinstance(node, str):
        keys.add(f"node:{node}")
    for sl in getattr(named, "slots", ()):
        keys.add(f"node:{sl.node}")
    for attr in ("path", "account", "project"):
        v = getattr(named, attr, None)
        if isinstance(v, str):
            keys.add(f"account:{v}")
    return keys


def command_keys(state: State, cmd: c.AnyCommand) -> set[str]:
    """What a command depends on; a change to any of these since its expected position conflicts."""
    keys: set[str] = set()
    if isinstance(cmd, c.ApplyDecision):
        for p in cmd.decision.preemptions:
            keys.add(f"job:{p.job_id}")
            job = state.jobs.get(p.job_id)
            keys.update(f"node:{sl.node}" for sl in (job.slots if job else ()))
        for pl in cmd.decision.placements:
            keys.add(f"job:{pl.job_id}")
            keys.update(f"node:{sl.node}" for sl in pl.slots)
        return keys
    return _named_keys(cmd)
