"""Docs that run: every fenced block in README.md and docs/ says what it is, and every command
in them is either run or checked.

- ```sh runnable: runs as written from a fresh clone: in a new directory holding the clone's
  examples/, scripts/ and .venv (nothing else), with no data directory yet, each block one bash
  script stopped at its first failing command;
- ```sh example: not run (it needs a service, another machine, root, or minutes; or it has
  placeholders, each explained beside it); every `gpuledger` command in it must parse as the CLI
  reads it (the command exists, its options exist) and every script it names must exist, with
  the options it is given (a benchmark's `--help` lists them);
- ```text: output, a file's layout or a diagram; a `$ ` line in it is a command of a recorded
  run and is checked as an example's;
- ```python, sql, nginx, yaml, toml, json, ini: code of that language.
A block with no marker, or `sh`/`bash`/`console` alone, fails the test."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import subprocess
from pathlib import Path

import click
import pytest

from ledger.cli import cli

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^( *)```(.*)$")
KINDS = {"sh runnable", "sh example", "text", "python", "sql", "nginx", "yaml", "toml", "json"}
KINDS |= {"ini"}


def fenced() -> list[tuple[str, str, str]]:
    """(where, info string, body) of every fenced block of README.md and docs/*.md."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().split("\n")
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if m is None:
                i += 1
                continue
            indent, info = m.group(1), m.group(2).strip()
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            assert j < len(lines), f"{path.relative_to(ROOT)}:{i + 1}: fence never closed"
            body = "\n".join(x[len(indent) :] for x in lines[i + 1 : j])
            out.append((f"{path.relative_to(ROOT)}:{i + 1}", info, body + "\n"))
            i = j + 1
    return out


BLOCKS = fenced()
RUNNABLE = [(w, body) for w, info, body in BLOCKS if info == "sh runnable"]


def test_every_fenced_block_says_what_it_is() -> None:
    bad = [f"{w} ```{info}" for w, info, _ in BLOCKS if info not in KINDS]
    assert not bad, "blocks with no marker (see this test's docstring):\n" + "\n".join(bad)
    assert len(RUNNABLE) >= 6, RUNNABLE


COMMANDLIKE = re.compile(
    r"^(gpuledger|python3?|\.venv/bin/\w+|scripts/\S+|export|curl)( .*)?( -| #)"
)
"""A line of a `text` block that reads as a command (a program we ship or name, then an option
or a comment): it belongs in an `sh` block, run or checked, or behind `$ ` (a recorded run's
command, checked). Not `sbatch`: docs/slurm.md shows the one the ledger itself issues."""


def test_no_command_hides_in_a_text_block() -> None:
    hidden = [
        f"{w}: {line}"
        for w, info, body in BLOCKS
        if info == "text"
        for line in body.split("\n")
        if COMMANDLIKE.match(line)
    ]
    assert not hidden, "commands in text blocks (mark them sh runnable or sh example):\n" + (
        "\n".join(hidden)
    )


# --- the commands of a block -------------------------------------------------------------------


def commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script, as words: comments and line continuations gone,
    split at newlines, `;`, `&&`, `||`, `|`, `&` and parentheses outside quotes, redirections and
    leading variable assignments dropped. Enough for the docs' blocks, not a shell."""
    text, quote, i = [], "", 0
    while i < len(script):
        ch = script[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "\\" and script[i + 1 : i + 2] == "\n":
            i += 2
            continue
        elif ch == "#" and (i == 0 or script[i - 1] in " \t\n"):
            while i < len(script) and script[i] != "\n":
                i += 1
            continue
        elif ch == "\n":
            ch = " ; "
        text.append(ch)
        i += 1
    lex = shlex.shlex("".join(text), posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    out: list[list[str]] = []
    words: list[str] = []
    redirect = False
    for tok in lex:
        if tok and set(tok) <= set(";&|()"):
            out.append(words)
            words = []
        elif tok and set(tok) <= set("<>"):
            redirect = True
        elif redirect:
            redirect = False
        elif not words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tok):
            continue
        else:
            words.append(tok)
    out.append(words)
    return [w for w in out if w]


def check_gpuledger(args: list[str]) -> None:
    """`args` parse as the CLI reads them: each command of the path exists and every option it
    is given is one of that command's (values and placeholders are not checked)."""
    cmd: click.Command = cli
    name, ctx = "gpuledger", None
    while True:
        ctx = click.Context(cmd, info_name=name, parent=ctx)
        _, rest, _ = cmd.make_parser(ctx).parse_args(list(args))  # NoSuchOption, BadOptionUsage
        if not isinstance(cmd, click.Group) or not rest:
            return
        sub = cmd.get_command(ctx, rest[0])
        assert sub is not None, f"no command {rest[0]!r} in `{name}`"
        cmd, name, args = sub, f"{name} {rest[0]}", rest[1:]


@functools.cache
def script_help(script: str) -> str:
    got = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / script), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, f"{script} --help: {got.stderr[-2000:]}"
    return got.stdout


def check_command(words: list[str]) -> None:
    if words[0] == "gpuledger":
        check_gpuledger(words[1:])
        return
    if words[0] in ("python", "python3", ".venv/bin/python") and len(words) > 1:
        if words[1] == "-m":
            for w in words[3:]:
                if w.startswith("tests/"):
                    assert (ROOT / w).exists(), w
            return
        if words[1] == "-c":  # `python -c "import a.b, c"`: the modules it names exist
            for names in re.findall(r"\bimport\s+([\w.]+(?:\s*,\s*[\w.]+)*)", words[2]):
                for name in re.split(r"\s*,\s*", names):
                    assert importlib.util.find_spec(name) is not None, f"no module {name}"
            return
        script = words[1]
        assert (ROOT / script).is_file(), f"no file {script}"
        if script.startswith("scripts/bench_"):
            helps = script_help(script)
            for w in words[2:]:
                if w.startswith("--"):
                    opt = w.split("=")[0]
                    assert re.search(rf"{re.escape(opt)}\b", helps), f"{script} has no {opt}"
        return
    if words[0].startswith("scripts/"):
        assert (ROOT / words[0]).is_file(), f"no file {words[0]}"


CHECKED = [
    (
        w,
        body
        if info == "sh example"
        else "\n".join(x[2:] for x in body.split("\n") if x[:2] == "$ "),
    )
    for w, info, body in BLOCKS
    if info == "sh example" or (info == "text" and "\n$ " in "\n" + body)
]


def test_the_splitter_finds_each_command() -> None:
    got = commands(
        "a --x 'it''s # not a comment' \\\n  --y 1   # the server's socket\n"
        'export K=$(scripts/kafka/kafka up) ; B=1 C=2 b "x\ny" > /tmp/f && c | d\n'
        "for s in 2 3; do\n  e $s\ndone\n"
    )
    assert got == [
        ["a", "--x", "its # not a comment", "--y", "1"],
        ["export", "K=$"],
        ["scripts/kafka/kafka", "up"],
        ["b", "x\ny"],
        ["c"],
        ["d"],
        ["for", "s", "in", "2", "3"],
        ["do"],
        ["e", "$s"],
        ["done"],
    ]


def test_a_wrong_option_or_command_is_caught() -> None:
    check_gpuledger(["--home", "x", "squatters", "--after", "2h", "--json"])
    with pytest.raises(click.NoSuchOption):
        check_gpuledger(["squatters", "--afterwards", "2h"])
    with pytest.raises(AssertionError):
        check_gpuledger(["report", "preempted"])
    with pytest.raises(AssertionError):
        check_command(["python", "scripts/bench_cycle.py", "--cycle", "8"])
    check_command([".venv/bin/python", "-c", "import ledger.cli, ledger.server.run"])
    with pytest.raises(AssertionError):
        check_command([".venv/bin/python", "-c", "import ledger.cli, ledger.no_such_module"])


@pytest.mark.parametrize(("where", "script"), CHECKED, ids=[w for w, _ in CHECKED])
def test_an_example_block_names_real_commands_and_options(where: str, script: str) -> None:
    for words in commands(script):
        try:
            check_command(words)
        except (AssertionError, click.ClickException) as exc:
            raise AssertionError(f"{where}: `{shlex.join(words)}`: {exc}") from exc


# --- the runnable blocks -----------------------------------------------------------------------


@pytest.mark.parametrize(("where", "script"), RUNNABLE, ids=[w for w, _ in RUNNABLE])
def test_a_runnable_block_runs_as_written(where: str, script: str, tmp_path: Path) -> None:
    for name in ("examples", "scripts", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPULEDGER_") or k == "GPULEDGER_KAFKA"
    }
    # no USER, as in containers and cron: a block names the user another way (`id -un`)
    env = {k: v for k, v in env.items() if k not in ("USER", "LOGNAME")} | {"HOME": str(tmp_path)}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    got = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, (
        f"{where}:\n{script}\n--- stdout\n{got.stdout}\n--- stderr\n{got.stderr}"
    )
