"""A child for `test_children_progress`: tells its steps on stderr as the what-if's child does
(`children.tell`), then answers on stdout, or fails with one last line (argv: fail)."""

from __future__ import annotations

import sys

from ledger.server import children

if __name__ == "__main__":
    said: list[int] = []
    sys.stderr.write("a line that is not progress\n")
    for done in range(1001):
        children.tell(done, 1000, said)
    if sys.stdin.read() == "fail":
        sys.stderr.write("it went wrong\n")
        sys.exit(3)
    sys.stdout.write("answered")
