"""The path rule for a Slurm run's command, run by its batch script on the node (atk46-23 F8;
`ledger/engines/slurm/command_check.py`): a teammate's script swapped into a group directory
ran as the submitter on Slurm, while the node agents refused it. The batch script now runs the
node agents' own check, as the job's user, with Debian's /usr/bin/python3: one file, one
answer, on both engines. Real files, real OS accounts (`userkit`), the batch script run by bash
as the user (as slurmstepd runs it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.engines.job_paths import Refused, open_outputs
from ledger.engines.slurm.command_check import (
    REFUSED_COMMAND,
    check_lines,
    checker_code,
    checker_sources,
    needs_check,
)
from ledger.engines.slurm.launching import CANNOT_START, LAUNCHED, never_ran
from ledger.engines.slurm.script import batch_script
from ledger.engines.slurm.words import SlurmJob
from tests.integration.userkit import User, os_user, shared_dir
from tests.unit.test_job_paths import _account, _launch, _own, _sbatch_user, _script_as


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[User, User]]:
    """alice (the job's owner) and bob (her teammate)."""
    with os_user("glca") as alice, os_user("glcb") as bob:
        yield alice, bob


def _agents(who: User, command: tuple[str, ...]) -> str:
    """The node agents' verdict (their supervisor's opener as `who`, from her home): why it is
    refused, "" when it may run."""
    try:
        fds = open_outputs({"account": _account(who), "workdir": str(who.home),
                            "command": command})  # fmt: skip
    except Refused as refused:
        return str(refused)
    for fd in fds.values():
        os.close(fd)
    return ""


def _slurm(who: User, command: tuple[str, ...], checker: str = "") -> tuple[str, bool]:
    """The Slurm batch script's verdict, run by bash as `who`: why it refused ("" when it let
    the command start) and whether the command ran (it touches `$HOME/RAN`)."""
    with shared_dir("gpuledger-run-") as run_dir:
        _own(run_dir, who)
        ran = who.home / "RAN"
        ran.unlink(missing_ok=True)
        marks = {m: str(run_dir / m) for m in (LAUNCHED, CANNOT_START, REFUSED_COMMAND)}
        script = batch_script(
            _launch(str(who.home), command), _sbatch_user(who), launched_file=marks[LAUNCHED],
            cannot_start_file=marks[CANNOT_START], refused_file=marks[REFUSED_COMMAND],
            checker=checker or checker_code(checker_sources()),
        )  # fmt: skip
        done = _script_as(who, script, run_dir)
        said = Path(marks[REFUSED_COMMAND])
        why = said.read_text().strip() if said.exists() else ""
        if why:
            assert done.returncode == 127 and not Path(marks[LAUNCHED]).exists(), done
            assert f"gpuledger: {why}" in done.stderr, done.stderr
            slurm = SlurmJob(slurm_id="1", name="x", state="FAILED", partition="p",
                             exit_code=127, start_time=10.0, end_time=10.5)  # fmt: skip
            # the executor records the mark's reason as the run's `launch_failed` note
            assert never_ran(slurm, None, (), run_dir, False, 10.0) == why
        return why, ran.exists()


def _team(top: Path, bob: User, alice: User) -> Path:
    """bob's group project directory (2777 here: 2775 for its group), a directory of alice's
    in it holding her script, which bob has swapped (her directory renamed away, his own in its
    place, his script at the name): what the Slurm job ran as alice (F8)."""
    proj = top / "proj"
    proj.mkdir()
    _own(proj, bob)
    proj.chmod(0o2777)
    swapped = proj / "al"
    swapped.mkdir()
    for name in ("run.sh", "t.py"):
        (swapped / name).write_text('#!/bin/sh\ntouch "$HOME/RAN"\n')
        (swapped / name).chmod(0o755)
        _own(swapped / name, bob)
    _own(swapped, bob)
    return swapped


def test_a_swapped_script_in_a_group_directory_gets_the_node_agents_answer_on_slurm(
    pair: tuple[User, User],
) -> None:
    """As reported: `submit /srv/team/run.sh` (recorded `/bin/sh /srv/team/run.sh`), the
    program by its path, `python3 /srv/team/t.py` and the same inside `sh -c`: the node agents
    refused each (`launch_failed`), the Slurm batch script ran bob's code as alice. Now the
    batch script refuses each in the node agents' very words, leaves why in its
    `refused-command` mark (the run's note) and never starts the command; her own script, a
    command that names no path, and the script directly in her working directory run on both."""
    alice, bob = pair
    with shared_dir("gpuledger-proj-") as top:
        swapped = _team(top, bob, alice)
        mine = alice.home / "bin" / "run.sh"
        mine.parent.mkdir(exist_ok=True)
        mine.write_text('#!/bin/sh\ntouch "$HOME/RAN"\n')
        mine.chmod(0o755)
        _own(mine.parent, alice)
        _own(mine, alice)
        run, py = str(swapped / "run.sh"), str(swapped / "t.py")
        refused = [("/bin/sh", run), (run,), ("python3", py), ("sh", "-c", f"cd /tmp && {run}"),
                   ("nohup", "bash", run, "--fast")]  # fmt: skip
        allowed = [("/bin/sh", str(mine)), ("./bin/run.sh",), ("sh", "-c", 'touch "$HOME/RAN"')]
        for command in refused + allowed:
            theirs = _agents(alice, command)
            why, ran = _slurm(alice, command)
            assert why == theirs, (command, why, theirs)  # one file, one answer
            assert bool(why) == (command in refused), (command, why)
            assert ran == (not why), (command, ran)  # refused: bob's code never ran
        assert "is reached through" in _slurm(alice, ("/bin/sh", run))[0]


def test_a_node_where_the_check_cannot_run_refuses_the_launch_saying_so(
    pair: tuple[User, User],
) -> None:
    """A node with no python3 able to run the check (here: a checker that fails) refuses the
    launch with one line naming the node, never runs the command unchecked; a command that
    names nothing the rule looks at needs no check at all (no python3 asked)."""
    alice, _ = pair
    mine = alice.home / "bin" / "run.sh"
    mine.parent.mkdir(exist_ok=True)
    mine.write_text('#!/bin/sh\ntouch "$HOME/RAN"\n')
    mine.chmod(0o755)
    _own(mine.parent, alice)
    _own(mine, alice)
    why, ran = _slurm(alice, ("/bin/sh", str(mine)), checker="raise SystemExit(1)")
    assert why.startswith("cannot check the command /bin/sh on node ") and not ran, why
    assert "no python3 (3.8 or later)" in why and why.endswith("refused"), why
    why, ran = _slurm(alice, ("sh", "-c", 'touch "$HOME/RAN"'), checker="raise SystemExit(1)")
    assert (why, ran) == ("", True)


@pytest.mark.parametrize(
    ("command", "want"),
    [
        (("sleep", "60"), False),
        (("true",), False),
        (("sh", "-c", "sleep 5; echo done"), False),
        (("./run.sh",), True),
        (("/bin/sh", "/srv/x/q.sh"), True),
        (("python3", "t.py"), True),
        (("env", "FOO=1", "python", "t.py"), True),
        (("sh", "-c", "cd x && python t.py"), True),
        (("nohup", "torchrun", "--nproc", "8", "t.py"), True),
    ],
)
def test_only_a_command_that_names_something_is_checked_on_the_node(
    command: tuple[str, ...], want: bool
) -> None:
    """Pure: the batch script runs the check (and asks the node for python3) only when the
    rule looks at a name of the command."""
    assert needs_check(command) is want
    lines = check_lines(command, "code", "/run/refused-command")
    assert bool(lines) is want
