"""The shape a TOML document from outside may have, checked before any TOML parser sees it.

CPython's `tomllib` (and `msgspec.toml`, which calls it) keeps the whole key path for every prefix
of a dotted key, so one key of n parts costs memory quadratic in n: a 200 KB budget file holding
`a.a.a...=1` (100,000 parts) grew the server past 16 GB (atk44-25 F14). Its recursion limit stops
arrays and inline tables nested thousands deep only after the stack is deep. So every document a
user or an admin hands us (a budget file, through the API or the CLI; serve.toml and agent.toml)
passes `check` first: one scan of the text, linear, that never builds a key, refusing

- a line with more than `MAX_KEY_DOTS` dots outside strings and comments (a dotted key or a
  table header of more than `MAX_KEY_DOTS + 1` parts: a budget file needs 4 at most,
  `accounts."ai2/olmo".member_shares.alice`);
- more than `MAX_DOTS` such dots in the whole document (one per account header is usual);
- arrays and inline tables nested more than `MAX_NESTING` deep (`[[accounts]]` is 2).

Pure: reads a string.
"""

from __future__ import annotations

import re

from schemas.errors import InvalidCommand

MAX_KEY_DOTS = 15
"""A key (or a table header) of at most 16 parts."""
MAX_DOTS = 100_000
"""Dots outside strings and comments in one document."""
MAX_NESTING = 16
"""Arrays and inline tables (and a header's brackets) nested at most this deep."""

# Strings and comments are skipped whole (each alternative stops where tomllib's does; an
# unterminated one is not matched, so what follows its quote is counted: never less than
# tomllib would see as keys); the rest, one significant character at a time.
_TOKENS = re.compile(
    r'"""(?:[^"\\]|\\[\s\S]|"(?!""))*"""(?:""|")?'
    r"|'''(?:[^']|'(?!''))*'''(?:''|')?"
    r'|"(?:[^"\\\n]|\\[^\n])*"'
    r"|'[^'\n]*'"
    r"|#[^\n]*"
    r"|[.\n\[\]{}]"
)


def check(text: str, name: str) -> None:
    """None if `text` stays within the bounds above, else `InvalidCommand` naming `name`, the
    line and the bound. Run before parsing, so a refused document costs one linear scan."""
    line, dots, on_line, depth = 1, 0, 0, 0
    for m in _TOKENS.finditer(text):
        token = m.group()
        if token[0] in "\"'#":  # a string or a comment
            line += token.count("\n")
            continue
        if token == "\n":
            line, on_line = line + 1, 0
        elif token == ".":
            dots, on_line = dots + 1, on_line + 1
            if on_line > MAX_KEY_DOTS:
                _refuse(name, line, f"a key of more than {MAX_KEY_DOTS + 1} dotted parts")
            if dots > MAX_DOTS:
                _refuse(name, line, f"more than {MAX_DOTS:,} dotted key parts in the file")
        elif token in "[{":
            depth += 1
            if depth > MAX_NESTING:
                _refuse(name, line, f"arrays or tables nested more than {MAX_NESTING} deep")
        else:  # "]" or "}"
            depth = max(depth - 1, 0)


def _refuse(name: str, line: int, what: str) -> None:
    raise InvalidCommand(
        f"{name}: line {line}: {what} (refused before parsing)", hint="fix the file and retry"
    )
