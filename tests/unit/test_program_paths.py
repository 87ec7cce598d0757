"""The path rule holds for the names a job's command runs by (atk43 F1; T19 in
docs/security.md): a batch script (`submit /srv/x/q.sh` records `/bin/sh /srv/x/q.sh`) or a
program named by a path is opened by its name when the job starts, so a directory on the way
that another account may write (a group project directory) or owns lets that account put its
own code in its place, run as the submitter. The launch refuses it (`launch_failed`, why in one
line), and `submit` warns of it. Real files, real OS accounts (`userkit`), opened as the job's
user by the node agents' opener (`job_paths.open_outputs`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.engines.job_paths import Refused, open_outputs
from tests.integration.userkit import User, os_user, shared_dir
from tests.unit.test_job_paths import _account, _as, _own, _unsafe


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[User, User]]:
    """alice (the job's owner) and bob (another account)."""
    with os_user("glqa") as alice, os_user("glqb") as bob:
        yield alice, bob


def _launch(who: User, *command: str) -> None:
    """The opener of a part run as `who` from its home, with `command`: Refused or nothing."""
    fds = open_outputs({"account": _account(who), "workdir": str(who.home), "command": command})
    for fd in fds.values():
        os.close(fd)


def _script(path: Path, who: User) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nid\n")
    path.chmod(0o755)
    _own(path.parent, who)
    _own(path, who)
    return path


def test_a_script_reached_through_a_group_directory_is_refused_at_launch_and_warned_of(
    pair: tuple[User, User],
) -> None:
    """atk43 F1, as reported: alice's script in a directory of hers inside bob's group project
    directory (2775 here 2777: its group may write it), named by its absolute path from her
    home. Bob could rename her directory away and put his own script in its place before the
    launch: refused, and `submit` says so; by a link of hers from her home too. Her own
    directory is fine."""
    from ledger.cli.submit import path_warnings

    alice, bob = pair
    with shared_dir("gpuledger-proj-") as top:
        proj = top / "proj"
        proj.mkdir()
        _own(proj, bob)
        proj.chmod(0o2777)
        q = _script(proj / "al" / "q.sh", alice)
        with pytest.raises(Refused, match=f"the script {q} {_unsafe(proj)}"):
            _launch(alice, "/bin/sh", str(q))
        with pytest.raises(Refused, match=f"the program {q} {_unsafe(proj)}"):
            _launch(alice, str(q))
        link = alice.home / "q-link.sh"
        link.symlink_to(q)
        _own(link, alice)
        with pytest.raises(Refused, match=f"the script q-link.sh {_unsafe(proj)}"):
            _launch(alice, "/bin/sh", "q-link.sh")
        said = _as(alice, lambda: path_warnings(str(alice.home), ("", ""), ("/bin/sh", str(q))))
        assert f"the script {q} {_unsafe(proj)}" in said, said
        gone = proj / "al2"  # bob made it vanish: it may be back once checked, so refused
        with pytest.raises(Refused, match=f"the script {gone / 'q.sh'} {_unsafe(proj)}"):
            _launch(alice, "/bin/sh", str(gone / "q.sh"))
        mine = _script(alice.home / "bin" / "q.sh", alice)
        _launch(alice, "/bin/sh", str(mine))
        _launch(alice, "./bin/q.sh")
        _launch(alice, "python3", "-m", "x", "-c", "print(1)")  # names nothing
        _launch(alice, "/bin/sh", "bin/q.sh", str(q))  # the script is hers: the rest is data
        assert _as(alice, lambda: path_warnings(str(alice.home), ("", ""), ("./bin/q.sh",))) == "[]"


def test_a_script_in_another_accounts_own_directory_is_refused(pair: tuple[User, User]) -> None:
    """A 0755 directory of bob's on the way: he may rename anything in it (atk40-23 F5's rule,
    now for the script too)."""
    alice, bob = pair
    with shared_dir("gpuledger-bobs-") as top:
        bobs = top / "bob"
        q = _script(bobs / "al" / "q.sh", alice)
        _own(bobs, bob)
        with pytest.raises(Refused, match=f"reached through {bobs}, which belongs to another"):
            _launch(alice, "/bin/sh", str(q))


def test_a_script_directly_in_a_group_directory_named_by_its_path_is_refused(
    pair: tuple[User, User],
) -> None:
    """atk43n F5: alice's script directly in the group project directory (root's, 2775 here
    2777: its group may write it, no sticky bit), named by its absolute path from her home,
    was checked only for the directory's owner (root passes): bob renamed his own file over it
    (`mv -f`) and it ran as her. The directory holding the script passes the rule of every
    directory on the way: refused, and `submit` says so. Still allowed: a bare name in the
    working directory (the documented exception, as for outputs), and with the sticky bit."""
    from ledger.cli.submit import path_warnings

    alice, _ = pair
    with shared_dir("gpuledger-group-") as top:
        team = top / "team"
        team.mkdir()
        team.chmod(0o2777)
        q = team / "train2.sh"
        q.write_text("#!/bin/sh\nid\n")
        q.chmod(0o755)
        _own(q, alice)
        with pytest.raises(Refused, match=f"the script {q} {_unsafe(team)}"):
            _launch(alice, "/bin/sh", str(q))
        with pytest.raises(Refused, match=f"the program {q} {_unsafe(team)}"):
            _launch(alice, str(q))
        said = _as(alice, lambda: path_warnings(str(alice.home), ("", ""), ("/bin/sh", str(q))))
        assert f"the script {q} {_unsafe(team)}" in said, said
        for command in (("sh", q.name), ("sh", f"./{q.name}"), (f"./{q.name}",)):
            in_team = {"account": _account(alice), "workdir": str(team), "command": command}
            for fd in open_outputs(in_team).values():  # its working directory's own script,
                os.close(fd)  # however spelled (`sh ./train2.sh` was refused: atk43n F6)
        team.chmod(0o3777)  # the sticky bit: only alice (or root) may rename her file
        _launch(alice, "/bin/sh", str(q))


@pytest.mark.parametrize(
    ("word", "bare"),
    [("run.sh", "run.sh"), ("./run.sh", "run.sh"), (".//./run.sh", "run.sh"), ("./", ""),
     ("./..", ""), ("a/../run.sh", ""), ("/srv/run.sh", ""), ("bin/run.sh", ""), ("../run.sh", "")],
)  # fmt: skip
def test_a_name_directly_in_the_working_directory_however_spelled(word: str, bare: str) -> None:
    from ledger.engines.job_paths import in_workdir

    assert in_workdir(word) == bare


def test_submit_on_another_users_behalf_warns_as_that_user(pair: tuple[User, User]) -> None:
    """Root submitting for alice (`--user`, `--as`, $GPULEDGER_USER) was warned as root: every
    directory of hers "belongs to another account" (atk43n F3). The check runs as her now (a
    child that takes her account): nothing for her own home, and what her launch would refuse
    is still said; for a name with no OS account, nothing (her launch checks)."""
    from ledger.cli.submit import warnings_as

    alice, _ = pair
    proj = alice.home / "p"
    proj.mkdir(exist_ok=True)
    _own(proj, alice)
    assert os.geteuid() == 0
    assert warnings_as(alice.name, str(proj), ("", ""), ("/bin/true",)) == []
    assert any("belongs to another" in w for w in warnings_as("root", str(proj), ("", ""), ()))
    proj.chmod(0o777)
    [why] = warnings_as(alice.name, str(proj / "x"), ("", ""), ())
    assert why.startswith(f"the working directory {proj / 'x'} {_unsafe(proj)}"), why
    assert warnings_as("no-such-account-here", str(proj / "x"), ("", ""), ()) == []


def test_the_common_wrappers_and_a_launchers_options_do_not_hide_the_script(
    pair: tuple[User, User],
) -> None:
    """atk43n F1, atk44n F1-F3, F5, F11: each of these ran a teammate's swapped script as the
    submitter, the rule having looked at the wrapper's own words only (`sh -c` after `nohup`,
    `bash -euo pipefail -c`, `env -iC`, `flock LOCK`, a continuation line) or stopped at an
    option's value naming an existing file (`--config_file cfg.yaml`). They are refused now, at
    launch and in `submit`'s warning; her own script through the same wrappers runs, and so do
    commands whose other words are data (atk44n F7, F8, F12: `--standalone train.py --data
    DIR`, `cat`, `| tee LOG`, `mkdir -p DIR`, `python3 -c CODE DATA`)."""
    from ledger.cli.submit import path_warnings

    alice, bob = pair
    with shared_dir("gpuledger-wrap-") as top:
        proj = top / "proj"
        proj.mkdir()
        _own(proj, bob)
        proj.chmod(0o2777)
        q = _script(proj / "al" / "q.sh", alice)
        data = proj / "data.txt"
        data.write_text("x\n")
        cfg = alice.home / "cfg.yaml"
        cfg.write_text("x: 1\n")
        _own(cfg, alice)
        mine = _script(alice.home / "bin" / "m.py", alice)
        refused = (
            ("sh", "-c", f"/bin/sh {q}"),
            ("bash", "-lc", f"cd /tmp && /bin/sh {q} --fast"),
            ("bash", "-euo", "pipefail", "-c", f"python3 {q}"),
            ("bash", "-c", f"python3 \\\n  {q} --x"),
            ("nohup", "sh", "-c", f"/bin/sh {q}"),
            ("timeout", "1h", "bash", "-lc", f"python3 {q}"),
            ("/usr/bin/env", "-C", "/tmp", "/bin/sh", str(q)),
            ("env", "-iC", "/tmp", "python3", str(q)),
            ("env", "-S", f"/bin/sh {q}"),
            ("flock", "/tmp", "python3", str(q)),
            ("accelerate", "launch", "--config_file", "cfg.yaml", str(q)),
            ("torchrun", f"--config_file={q}", str(mine)),
            ("nohup", "/bin/sh", str(q)),
            ("taskset", "3", "/usr/bin/env", "/bin/sh", str(q)),
        )
        for command in refused:
            with pytest.raises(Refused, match=f"the script {q} {_unsafe(proj)}"):
                _launch(alice, *command)
            said = _as(alice, lambda c=command: path_warnings(str(alice.home), ("", ""), c))
            assert f"the script {q} {_unsafe(proj)}" in said, (command, said)
        for command in (
            ("sh", "-c", f"python3 {mine}"),
            ("env", "-C", str(alice.home), "python3", "bin/m.py"),
            ("accelerate", "launch", "--config_file", "cfg.yaml", str(mine)),
            ("torchrun", "--standalone", str(mine), "--data", str(data)),
            ("bash", "-c", f"python3 {mine} --data {data} | tee {proj / 'run.log'}"),
            ("sh", "-c", f"mkdir -p {proj / 'runs'} && python3 {mine}"),
            ("cat", str(data)),
            ("python3", "-c", "print(1)", str(data)),
            ("sh", "-c", "echo $HOME"),
            ("python3", str(mine), str(q)),  # after her own script: its data, not checked
        ):
            _launch(alice, *command)
            said = _as(alice, lambda c=command: path_warnings(str(alice.home), ("", ""), c))
            assert said == "[]", (command, said)


def test_a_batch_script_directly_in_the_working_directory_is_recorded_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`submit run.sh` in a directory records `/bin/sh run.sh` as `-- sh run.sh` does, so the
    path rule gives the one file one answer (atk44n F13: refused as `/bin/sh /abs/run.sh` where
    `sh run.sh` ran); a script elsewhere keeps its absolute path."""
    from ledger.cli.submit import script_name

    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    assert script_name(Path("run.sh"), None) == "run.sh"
    assert script_name(Path("./run.sh"), None) == "run.sh"
    assert script_name(Path("sub/run.sh"), None) == str(tmp_path / "sub" / "run.sh")
    assert script_name(Path("sub/run.sh"), "sub") == "run.sh"
    assert script_name(Path("run.sh"), "sub") == str(tmp_path / "run.sh")
