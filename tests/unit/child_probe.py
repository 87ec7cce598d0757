"""A child of `ledger.server.children.run` that says the priority it runs at (for
`test_child_priority.py`): its stdin is the server's pid; it prints its nice level and its
scheduling policy once `children.enter` has run."""

from __future__ import annotations

import os
import sys

from ledger.server import children

if __name__ == "__main__":
    children.enter(int(sys.stdin.read()))
    print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))
