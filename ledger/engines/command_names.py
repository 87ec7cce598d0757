"""Pure: the simple commands a job's command runs, for the path rule (T19 in docs/security.md,
`job_paths.check_command`): the command itself, and what the common wrappers run in turn, each
with the directory its relative names are read from. No file is looked at here.

- `env [-i] [-u NAME] [-C DIR] [-S STRING] [NAME=VALUE]... COMMAND...` runs COMMAND (in DIR;
  STRING split into words before it).
- `sh -c STRING` (bash, dash, zsh, ksh, mksh; options before `-c`, `-o NAME` too) runs the
  simple commands of STRING, split at `;`, `&&`, `||`, `|`, `&` and newlines.

An outside attack found each of these running a teammate's swapped script as the submitter,
the rule having looked only at `env`'s or the shell's own words (atk43n F1). What is not
followed: a `cd` inside a string (its later names are read from the job's directory), words
with `$`, backquotes or globs (the shell expands them at the start), functions and aliases,
and what a program opens by itself (a module on PYTHONPATH, a launcher's config)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh"})
"""Programs whose `-c STRING` is a command line."""

OPERATORS = frozenset({";", "&&", "||", "|", "&", "\n", ";;", "|&", "(", ")"})
"""What separates the simple commands of a `-c` string (shlex's punctuation)."""

MAX_DEPTH = 4
"""Wrappers inside wrappers followed this deep (`env sh -c 'env ...'`); deeper is left whole."""


def simple_commands(command: Sequence[str], wd: str, depth: int = 0) -> list[tuple[list[str], str]]:
    """The simple commands `command` runs, each with the directory its relative names are read
    from: the command itself when it is no wrapper this module knows."""
    words = list(command)
    if not words or depth >= MAX_DEPTH:
        return [(words, wd)]
    name = os.path.basename(words[0])
    if name == "env":
        inner = _after_env(words[1:], wd)
        if inner is not None:
            rest, where = inner
            return [(words[:1], wd), *simple_commands(rest, where, depth + 1)]
    elif name in SHELLS:
        line = _shell_string(words[1:])
        if line is not None:
            found = [(words[:1], wd)]
            for part in _split_line(line):
                found += simple_commands(part, wd, depth + 1)
            return found
    return [(words, wd)]


def _after_env(args: list[str], wd: str) -> tuple[list[str], str] | None:
    """`env`'s command and its directory, or None for an option this does not know (the words
    are then checked as any command's)."""
    i = 0
    while i < len(args):
        word = args[i]
        if word in ("-i", "-0", "-v", "-", "--ignore-environment", "--null", "--debug"):
            i += 1
        elif word in ("-u", "--unset", "-C", "--chdir", "-S", "--split-string"):
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
            if word in ("-C", "--chdir"):
                wd = os.path.join(wd, value)
            elif word in ("-S", "--split-string"):
                return _split_words(value) + args[i + 2 :], wd
            i += 2
        elif word.startswith(("--unset=", "--chdir=", "--split-string=")):
            key, value = word.split("=", 1)
            if key == "--chdir":
                wd = os.path.join(wd, value)
            elif key == "--split-string":
                return _split_words(value) + args[i + 1 :], wd
            i += 1
        elif word.startswith(("-u", "-C", "-S")) and len(word) > 2:
            return _after_env([word[:2], word[2:], *args[i + 1 :]], wd)
        elif word.startswith("-"):
            return None
        elif "=" in word:
            i += 1  # NAME=VALUE
        else:
            return args[i:], wd
    return [], wd


def _shell_string(args: list[str]) -> str | None:
    """The STRING of `SHELL [options] -c STRING ...`, or None (a script file, or no `-c`)."""
    has_c = False
    i = 0
    while i < len(args) and args[i][:1] in ("-", "+") and args[i] not in ("-", "--"):
        word = args[i]
        if word in ("-o", "+o", "-O", "+O"):
            i += 1  # its option name
        elif not word.startswith("--") and "c" in word[1:]:
            has_c = True
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
    """The simple commands of a shell command line: its words split at the operators, words
    with `$`, a backquote or a glob left out (the shell expands them; they name nothing
    here), `NAME=VALUE` words before a command skipped, keywords (`then`, `do`...) dropped."""
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()\n")
        lexer.whitespace = " \t\r"
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        tokens = line.split()
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token in OPERATORS or set(token) <= set(";&|()\n"):
            parts.append([])
        elif not parts[-1] and (token in KEYWORDS or _assignment(token)):
            continue
        elif any(ch in token for ch in "$`*?["):
            parts[-1].append("")  # a word the shell makes at the start: names nothing here
        else:
            parts[-1].append(token)
    return [p for p in parts if p]


KEYWORDS = frozenset({"then", "do", "else", "elif", "!", "{", "}", "exec", "time", "command",
                      "nohup", "if", "while", "until"})  # fmt: skip
"""Words before a simple command that are not its program."""


def _assignment(token: str) -> bool:
    name, eq, _ = token.partition("=")
    return bool(eq) and name.replace("_", "a").isalnum() and not name[:1].isdigit()
