"""The simple commands a job's command runs, as the path rule reads them
(`ledger.engines.command_names`, pure): wrappers followed, a shell's `-c` line split."""

from __future__ import annotations

import pytest

from ledger.engines.command_names import runs_script, simple_commands


@pytest.mark.parametrize(
    ("command", "want"),
    [
        (["python3", "t.py"], [(["python3", "t.py"], "/w")]),
        (["cat", "/srv/data/x"], [(["cat", "/srv/data/x"], "/w")]),
        (["sh", "-c", "python3 /srv/t.py"], [(["sh"], "/w"), (["python3", "/srv/t.py"], "/w")]),
        (["bash", "-lc", "cd x && python3 t.py; ./run.sh a | tee log"],
         [(["bash"], "/w"), (["cd", "x"], "/w"), (["python3", "t.py"], "/w"),
          (["./run.sh", "a"], "/w"), (["tee", "log"], "/w")]),
        (["bash", "-o", "pipefail", "-c", "X=1 exec python3 t.py"],
         [(["bash"], "/w"), (["python3", "t.py"], "/w")]),
        (["bash", "-euo", "pipefail", "-c", "python3 t.py"],  # atk44n F2
         [(["bash"], "/w"), (["python3", "t.py"], "/w")]),
        (["bash", "--rcfile", "rc", "-c", "python3 t.py"],
         [(["bash"], "/w"), (["python3", "t.py"], "/w")]),
        (["bash", "-c", "python3 \\\n  /srv/t.py --x"],  # atk44n F11: a continuation line
         [(["bash"], "/w"), (["python3", "/srv/t.py", "--x"], "/w")]),
        (["sh", "script.sh", "-c"], [(["sh", "script.sh", "-c"], "/w")]),  # a script, no -c line
        (["sh", "-c", "python3 $HOME/t.py *.txt"], [(["sh"], "/w"), (["python3", "", ""], "/w")]),
        (["/usr/bin/env", "-C", "/tmp", "python3", "t.py"],
         [(["/usr/bin/env"], "/w"), (["python3", "t.py"], "/tmp")]),
        (["env", "-Csub", "python3", "t.py"], [(["env"], "/w"), (["python3", "t.py"], "/w/sub")]),
        (["env", "-iC", "/d", "python3", "t.py"],  # atk44n F3
         [(["env"], "/w"), (["python3", "t.py"], "/d")]),
        (["env", "-C", "/d", "--", "python3", "t.py"],
         [(["env"], "/w"), (["python3", "t.py"], "/d")]),
        (["env", "--default-signal", "python3", "t.py"],
         [(["env"], "/w"), (["python3", "t.py"], "/w")]),
        (["env", "-S", "python3 /srv/t.py", "x"],
         [(["env"], "/w"), (["python3", "/srv/t.py", "x"], "/w")]),
        (["env", "-i", "A=1", "-u", "B", "python3", "t.py"],
         [(["env"], "/w"), (["python3", "t.py"], "/w")]),
        (["env", "sh", "-c", "env python3 t.py"],
         [(["env"], "/w"), (["sh"], "/w"), (["env"], "/w"), (["python3", "t.py"], "/w")]),
        (["nohup", "sh", "-c", "python3 t.py"],  # atk44n F1: a -c line after another program
         [(["nohup"], "/w"), (["sh"], "/w"), (["python3", "t.py"], "/w")]),
        (["timeout", "1h", "/usr/bin/python3", "t.py"],
         [(["timeout", "1h"], "/w"), (["/usr/bin/python3", "t.py"], "/w")]),
        (["flock", "/tmp/lock", "python3", "/srv/t.py"],  # atk44n F5
         [(["flock", "/tmp/lock"], "/w"), (["python3", "/srv/t.py"], "/w")]),
        ([], [([], "/w")]),
    ],
)  # fmt: skip
def test_wrappers_are_followed_to_what_they_run(
    command: list[str], want: list[tuple[list[str], str]]
) -> None:
    assert simple_commands(command, "/w") == want


@pytest.mark.parametrize(
    ("program", "runs"),
    [("python3", True), ("/usr/bin/python3.11", True), ("bash", True), ("torchrun", True),
     ("Rscript", True), ("cat", False), ("tee", False), ("./train.sh", False), ("pythonx", False)],
)  # fmt: skip
def test_which_programs_run_a_script_they_are_given(program: str, runs: bool) -> None:
    assert runs_script(program) is runs


def test_wrappers_inside_wrappers_stop_at_a_depth() -> None:
    deep = ["env"] * 10 + ["python3", "t.py"]
    found = simple_commands(deep, "/w")
    assert len(found) == 5 and found[-1][0] == ["env"] * 6 + ["python3", "t.py"]


def test_an_unbalanced_quote_is_split_on_spaces_not_an_error() -> None:
    assert simple_commands(["sh", "-c", "python3 't.py"], "/w")[1:] == [
        (["python3", "'t.py"], "/w")
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["timeout", "20", "/srv/team/y.sh"],
        ["nohup", "/srv/team/y.sh"],
        ["nice", "-n", "5", "/srv/team/y.sh"],
        ["taskset", "-c", "0", "/srv/team/y.sh"],
        ["ionice", "-c3", "/srv/team/y.sh"],
        ["/usr/bin/time", "-o", "/tmp/out", "/srv/team/y.sh"],
        ["flock", "/tmp/lock", "/srv/team/y.sh"],
        ["timeout", "-s", "KILL", "--", "1h", "/srv/team/y.sh"],
        ["bash", "-c", ". /srv/team/y.sh"],
        ["bash", "-c", "source /srv/team/y.sh && echo done"],
    ],
)
def test_a_script_named_by_its_path_after_a_wrapper_is_walked_to(command: list[str]) -> None:
    """atk46-23r R1: a wrapper followed by a script named by its path (`timeout 20
    /srv/team/y.sh`), and the shell's `.`/`source`, ran a teammate's swapped script as the
    submitter: the walk followed a wrapper only to a later interpreter, shell or env. The
    script is a simple command of its own now (its program named by a path: checked), or the
    script `.` runs; the wrapper's own words (a lock file, `-o FILE`) are not taken for it."""
    found = simple_commands(command, "/w")
    runs = [words for words, _ in found]
    assert ["/srv/team/y.sh"] in runs or any(
        w[:1] in (["."], ["source"]) and w[1:2] == ["/srv/team/y.sh"] for w in runs
    ), runs
    assert not any(w[:1] == ["/tmp/lock"] or w[:1] == ["/tmp/out"] for w in runs)


def test_a_dot_is_a_script_runner_only_as_a_program() -> None:
    assert runs_script(".") and runs_script("source")
    find = ["find", ".", "-name", "x"]
    assert simple_commands(find, "/w") == [(find, "/w")]
