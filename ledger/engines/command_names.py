"""Pure: the simple commands a job's command runs, for the path rule (T19 in docs/security.md,
`job_paths.check_command`), each with the directory its relative names are read from, and
which of them run a script by name. No file is looked at here.

The rule checks what a command runs by name: its program when named by a path, and the script
an interpreter or launcher runs (`python3 t.py`, `bash run.sh`, `torchrun --nproc 8 t.py`:
`INTERPRETER`). Other programs' words are their data (`cat`, `tar`, `tee`, `mkdir`: never
checked). Wrappers are followed to what they run:

- `env [-iv0] [-u NAME] [-C DIR] [-S STRING] [--] [NAME=VALUE]... COMMAND...` runs COMMAND (in
  DIR; STRING split into words before it);
- a shell with `-c STRING` (options before it, `-o NAME`, `--rcfile FILE` too) runs the simple
  commands of STRING, split at `;`, `&&`, `||`, `|`, `&` and newlines (a backslash-newline
  joins two lines);
- a known wrapper (`WRAPPERS`: `nohup`, `timeout 1h`, `taskset -c 0`, `setsid`, `flock LOCK`,
  `nice -n 5`, `ionice`, `time`, `stdbuf`, `numactl`, `chrt`, `xargs`, `exec`, `command`) runs
  the command after its options and own words, whatever it names (a script by its path too);
- any other program runs the command from its first later word that names an interpreter, a
  shell or env;
- the shell's `.` and `source` run the script they are given, as an interpreter does.

Outside attacks found each of these running a teammate's swapped script as the submitter
(atk43n F1, atk44n F1-F3, F5, F11), and the walk refusing a script's data (atk44n F7, F8, F12).
What is not followed: a `cd` inside a string (later names are read from the job's directory),
words the shell expands (`$HOME/t.py`, globs), functions and aliases, a program found through
PATH, a module found by `python -m`, a script's own `#!` line, and what a program opens by
itself (docs/agent.md)."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh"})
"""Programs whose `-c STRING` is a command line (without it, their first word is a script)."""

INTERPRETER = re.compile(
    r"(python[0-9.]*|pypy[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node|nodejs|Rscript|julia|lua[0-9.]*"
    r"|php[0-9.]*|torchrun|accelerate|deepspeed|mpirun|mpiexec|horovodrun|sh|bash|dash|zsh|ksh"
    r"|mksh)"
)
"""Programs (by base name) whose first word naming a file is the script they run."""

SEPARATORS = frozenset(";&|()\n")
"""What separates the simple commands of a `-c` line (shlex's punctuation)."""

KEYWORDS = frozenset({"then", "do", "else", "elif", "!", "{", "}", "exec", "time", "command",
                      "if", "while", "until"})  # fmt: skip
"""Words before a simple command that are not its program."""

SHELL_VALUE_OPTIONS = frozenset({"--rcfile", "--init-file", "-o", "+o", "-O", "+O"})
"""A shell's options that take the next word as their value."""

MAX_DEPTH = 4
"""Wrappers inside wrappers followed this deep (`env sh -c 'env ...'`); deeper is left whole."""


SOURCES = frozenset({".", "source"})
"""The shell's words that run the script they are given in the shell itself (`. run.sh`):
as a command's program only (`find . -name x` is no script run: atk46-23r R1)."""


def runs_script(program: str) -> bool:
    """Whether `program` (a command's program) runs a script it is given by name."""
    return program in SOURCES or INTERPRETER.fullmatch(os.path.basename(program)) is not None


def simple_commands(command: Sequence[str], wd: str, depth: int = 0) -> list[tuple[list[str], str]]:
    """The simple commands `command` runs, each with the directory its relative names are read
    from: wrappers as a command of their own program alone, then what they run."""
    words = list(command)
    if not words or depth >= MAX_DEPTH:
        return [(words, wd)]
    name = os.path.basename(words[0])
    if name == "env":
        rest, where = _after_env(words[1:], wd)
        return [(words[:1], wd), *simple_commands(rest, where, depth + 1)]
    if name in SHELLS:
        line = _shell_string(words[1:])
        if line is None:
            return [(words, wd)]  # a script, or the shell reading its input
        found = [(words[:1], wd)]
        for part in _split_line(line):
            found += simple_commands(part, wd, depth + 1)
        return found
    if runs_script(words[0]):
        return [(words, wd)]
    start = _wrapped(name, words)
    if start is not None:  # a known wrapper: its command, whatever it names (atk46-23r R1)
        return [(words[:start], wd), *simple_commands(words[start:], wd, depth + 1)]
    for i, word in enumerate(words[1:], 1):
        base = os.path.basename(word)
        if base == "env" or (word not in SOURCES and runs_script(word)):
            return [(words[:i], wd), *simple_commands(words[i:], wd, depth + 1)]
    return [(words, wd)]


WRAPPERS: dict[str, tuple[frozenset[str], int]] = {
    "nohup": (frozenset(), 0),
    "setsid": (frozenset(), 0),
    "nice": (frozenset({"-n", "--adjustment"}), 0),
    "ionice": (frozenset({"-c", "-n", "-p", "-P", "-u", "--class", "--classdata"}), 0),
    "timeout": (frozenset({"-s", "--signal", "-k", "--kill-after"}), 1),
    "taskset": (frozenset(), 1),
    "chrt": (frozenset(), 1),
    "time": (frozenset({"-o", "--output", "-f", "--format"}), 0),
    "stdbuf": (frozenset({"-i", "-o", "-e"}), 0),
    "flock": (frozenset({"-w", "--timeout", "-E", "--conflict-exit-code"}), 1),
    "numactl": (frozenset({"-C", "-N", "-m", "-p", "-i", "--physcpubind", "--cpunodebind",
                           "--membind", "--preferred", "--interleave"}), 0),
    "xargs": (frozenset({"-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s", "--arg-file",
                         "--delimiter", "--max-args", "--max-procs", "--max-lines"}), 0),
    "exec": (frozenset({"-a"}), 0),
    "command": (frozenset(), 0),
}  # fmt: skip
"""Programs that run a command given after their options (each option of the set takes the
next word as its value) and as many words of their own (`timeout DURATION`, `flock LOCK`,
`taskset MASK`, `chrt PRIORITY`): that command is walked whatever it names, a script named by
a path too (`timeout 20 /srv/team/y.sh`: before, only a later interpreter, shell or env was
followed, and a teammate's swapped script ran as the submitter, atk46-23r R1)."""


def _wrapped(name: str, words: list[str]) -> int | None:
    """Where the command a known wrapper (`WRAPPERS`) runs begins in `words` (None: `name` is
    no wrapper, or it names no command)."""
    if name not in WRAPPERS:
        return None
    values, own = WRAPPERS[name]
    i = 1
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        i += 2 if words[i] in values else 1
    if i < len(words) and words[i] == "--":
        i += 1
    i += own
    return i if i < len(words) else None


ENV_VALUE_OPTIONS = {"--chdir": "C", "--unset": "u", "--split-string": "S"}
"""`env`'s long options that take a value, as their short letters (`-C`, `-u`, `-S`)."""


def _after_env(args: list[str], wd: str) -> tuple[list[str], str]:
    """`env`'s command and its directory (options it does not know are passed over)."""
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return args[i + 1 :], wd
        if word.startswith("--"):
            key, _, inline = word.partition("=")
            letter = ENV_VALUE_OPTIONS.get(key, "")
        elif word.startswith("-") and len(word) > 1:  # a cluster: `-iC DIR`, `-Csub`
            at = next((j for j, ch in enumerate(word[1:], 1) if ch in "uCS"), 0)
            letter, inline = (word[at], word[at + 1 :]) if at else ("", "")
        elif "=" in word or word == "-":
            i += 1  # NAME=VALUE, or `-` (as -i)
            continue
        else:
            return args[i:], wd
        if letter:
            value = inline
            if not value:
                if i + 1 >= len(args):
                    return [], wd
                value, i = args[i + 1], i + 1
            if letter == "C":
                wd = os.path.join(wd, value)
            elif letter == "S":
                return _split_words(value) + args[i + 1 :], wd
        i += 1
    return [], wd


def _shell_string(args: list[str]) -> str | None:
    """The STRING of `SHELL [options] -c STRING ...`, or None (a script file, or no `-c`)."""
    has_c = False
    i = 0
    while i < len(args) and args[i][:1] in ("-", "+") and args[i] not in ("-", "--"):
        word = args[i]
        if word in SHELL_VALUE_OPTIONS:
            i += 1  # its value
        elif not word.startswith("--"):
            has_c = has_c or "c" in word[1:]
            if "o" in word[1:] or "O" in word[1:]:
                i += 1  # `-euo pipefail`: the cluster's -o takes the next word
        i += 1
    if i < len(args) and args[i] == "--":
        i += 1
    return args[i] if has_c and i < len(args) else None


def _split_words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # unbalanced quotes: the program cannot start as written
        return text.split()


def _split_line(line: str) -> list[list[str]]:
    """The simple commands of a shell command line: its words split at the separators
    (a backslash-newline joins two lines), words with `$`, a backquote or a glob made empty
    (the shell expands them; they name nothing here), `NAME=VALUE` words and keywords before a
    command passed over."""
    line = line.replace("\\\n", " ")
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()\n")
        lexer.whitespace = " \t\r"
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        tokens = line.split()
    parts: list[list[str]] = [[]]
    for token in tokens:
        if set(token) <= SEPARATORS:
            parts.append([])
        elif not parts[-1] and (token in KEYWORDS or _assignment(token)):
            continue
        elif any(ch in token for ch in "$`*?["):
            parts[-1].append("")  # a word the shell makes at the start: names nothing here
        else:
            parts[-1].append(token)
    return [p for p in parts if p]


def _assignment(token: str) -> bool:
    name, eq, _ = token.partition("=")
    return bool(eq) and name.replace("_", "a").isalnum() and not name[:1].isdigit()
