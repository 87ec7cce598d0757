"""The job page's replays in a process of their own (docs/security.md, row T6): a replay walks
the log from its start, in Python; on a thread of the server it would take the interpreter lock
from the thread that runs the dispatcher and the group commit (the cycle took three times as
long while one ran). Here it runs in a child process at a lower priority than the server's
(`ledger.server.children.lowered`), which dies with the server.

`replay(home, decisions)` (the server side, async) sends the decisions to
`python -m ledger.server.replays` on its stdin and reads the replays back from its stdout, as
msgspec MessagePack; `main()` is the child.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import msgspec

from ledger.history.compare import CycleReplay
from ledger.server import children
from schemas import events as e


class _Job(msgspec.Struct, frozen=True):
    home: str
    parent: int
    decisions: list[tuple[int, e.CycleDecided]]


async def replay(home: Path, decisions: list[tuple[int, e.CycleDecided]]) -> list[CycleReplay]:
    """The replays of `decisions` (in log order) of the log in `home`, from a child process."""
    job = msgspec.msgpack.encode(_Job(str(home), os.getpid(), decisions))
    out = await children.run("ledger.server.replays", job)
    return msgspec.msgpack.decode(out, type=list[CycleReplay])


def main() -> None:
    """The child: read the job, replay, write the replays; die with the server."""
    job = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=_Job)
    children.enter(job.parent)
    from ledger.history import replay as rp
    from ledger.store.locate import open_source

    with open_source(Path(job.home)) as source:
        done = list(rp.replay_decisions(source, job.decisions))
    sys.stdout.buffer.write(msgspec.msgpack.encode(done))


if __name__ == "__main__":
    main()
