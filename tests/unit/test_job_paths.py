"""The path rule of a job's working directory and output files, on every engine (atk38-23 F1, F2,
F3, F6, F10; T19 in docs/security.md): what another OS account put in a directory it may write
(a hard link, a symbolic link, a directory of its own, a named pipe swapped in after the claim)
never steers the job's files or where it runs. Real files, real OS accounts (`userkit`: the suite
runs as root), opened as the job's user by the code the engines run: the node agents' opener
(`job_paths.open_outputs`), the Slurm executor's claim (`outputs.claim_outputs`) and the Slurm
batch script (`words.batch_script`, run by bash as the user)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ledger.cycle.executor import GpuSlot, Launch
from ledger.engines.job_paths import Refused, open_outputs, owner_refused, path_refusal
from ledger.engines.slurm.launching import CANNOT_ENTER, CANNOT_OPEN, LAUNCHED
from ledger.engines.slurm.outputs import Claimed, claim_outputs
from ledger.engines.slurm.script import batch_script
from ledger.engines.slurm.words import SbatchUser
from tests.integration.userkit import User, os_user, shared_dir


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[User, User]]:
    """alice (the job's owner) and bob (another account)."""
    with os_user("glpa") as alice, os_user("glpb") as bob:
        yield alice, bob


@pytest.fixture
def team() -> Iterator[Path]:
    """A project directory every account may write, without the sticky bit (as a setgid group
    directory is for its members)."""
    with shared_dir("gpuledger-team-") as top:
        d = top / "team"
        d.mkdir()
        d.chmod(0o777)
        yield d


def _own(path: Path, who: User) -> None:
    os.lchown(path, who.uid, who.gid)


def _account(who: User) -> dict[str, object]:
    return {"uid": who.uid, "gid": who.gid, "groups": [who.gid]}


def _opened(who: User, **spec: str) -> dict[str, int]:
    """The node agents' opener as `who` (what their supervisor runs): the descriptors, closed."""
    fds = open_outputs({"account": _account(who), "umask": "0022", **spec})
    for fd in fds.values():
        os.close(fd)
    return fds


def _as(who: User, read: Callable[[], object]) -> str:
    """`read()` in a child that became `who` (as the submitter runs `submit`): what it said."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # never returns into pytest
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(who.gid)
            os.setuid(who.uid)
            os.write(w, repr(read()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode()
    assert os.waitpid(pid, 0)[1] == 0, said
    return said


def _sbatch_user(who: User) -> SbatchUser:
    return SbatchUser(uid=who.uid, gid=who.gid, name=who.name, home=str(who.home), shell="/bin/sh")


def test_a_hard_link_planted_at_the_output_is_refused_on_both_engines(
    pair: tuple[User, User], team: Path
) -> None:
    """F1: bob links alice's group-writable notes to the output's name; the job's output (under
    umask 077) would land in her notes, which bob reads."""
    alice, _ = pair
    notes = team / "notes.txt"
    notes.write_text("alice-notes\n")
    notes.chmod(0o664)
    _own(notes, alice)
    out = team / "gpuledger-6.out"
    os.link(notes, out)
    with pytest.raises(Refused, match=f"the output file {out} exists and has 2 hard links"):
        _opened(alice, stdout=str(out))
    why = claim_outputs([str(out)], _sbatch_user(alice), 10.0, 0o077)
    assert isinstance(why, str) and why.startswith(f"the output file {out} exists and has 2 hard")
    assert notes.read_text() == "alice-notes\n"


def test_the_users_own_link_renamed_into_place_in_a_writable_directory_is_not_followed(
    pair: tuple[User, User], team: Path
) -> None:
    """F1's variant: alice keeps a link in the team directory to her private file; bob renames it
    to the output's name (a rename needs only the directory's write bit). In a sticky directory
    nobody but alice may move her link: there it is followed."""
    alice, _ = pair
    private = alice.home / "data.csv"
    private.write_text("precious,data\n")
    _own(private, alice)
    out = team / "gpuledger-23.out"
    out.symlink_to(private)
    _own(out, alice)
    with pytest.raises(Refused, match=f"the output file {out} is a symbolic link, which is in a"):
        _opened(alice, stdout=str(out))
    assert private.read_text() == "precious,data\n"
    team.chmod(0o1777)
    assert "output file" in _opened(alice, stdout=str(out))  # her link, where only she moves it


def test_a_directory_link_of_another_account_in_the_path_is_not_followed(
    pair: tuple[User, User], team: Path
) -> None:
    """F2: alice's 0700 `logs` renamed by bob and replaced with his link to his 1777 directory:
    her output was made there, for him to read. A link of her own where only she may write is
    still followed."""
    alice, bob = pair
    team.chmod(0o1777)  # bob's own link, made where he may (a 0777 one: `test_a_directory_...`)
    with shared_dir("gpuledger-bob-") as bobs:
        bobs.chmod(0o1777)
        (team / "logs").symlink_to(bobs)
        _own(team / "logs", bob)
        for spec in ({"stdout": str(team / "logs" / "9.out")},
                     {"workdir": str(team), "stdout": "logs/9.out"}):  # fmt: skip
            with pytest.raises(Refused, match=r"goes through the symbolic link (/.*/team/)?logs, "
                               r"which belongs to another user"):  # fmt: skip
                _opened(alice, **spec)
        why = claim_outputs([str(team / "logs" / "9.out")], _sbatch_user(alice), 10.0)
        assert isinstance(why, str) and "goes through the symbolic link" in why
        assert list(bobs.iterdir()) == []
    mine = alice.home / "mylogs"
    mine.mkdir()
    _own(mine, alice)
    (alice.home / "logs").symlink_to(mine)
    _own(alice.home / "logs", alice)
    assert _opened(alice, stdout=str(alice.home / "logs" / "1.out"))
    assert (mine / "1.out").stat().st_uid == alice.uid


def test_the_users_own_link_to_another_accounts_file_is_refused_by_the_slurm_claim_too(
    pair: tuple[User, User], team: Path
) -> None:
    """F6: alice's own link `~/train.log` into the team directory, where bob made `team.log`
    0666: the node agents refused it and the Slurm claim followed it (bob read her output)."""
    alice, bob = pair
    theirs = team / "team.log"
    theirs.write_text("")
    theirs.chmod(0o666)
    _own(theirs, bob)
    link = alice.home / "train.log"
    link.symlink_to(theirs)
    _own(link, alice)
    want = f"the output file {theirs} exists and belongs to another user"
    with pytest.raises(Refused, match=want):
        _opened(alice, stdout=str(link))
    assert claim_outputs([str(link)], _sbatch_user(alice), 10.0) == want
    assert theirs.read_text() == ""


@pytest.mark.parametrize("swap", ["a link to another account's directory", "his own directory"])
def test_a_working_directory_swapped_by_another_account_is_refused(
    pair: tuple[User, User], team: Path, swap: str
) -> None:
    """F10: bob renames alice's 0700 `exp1` and puts his own code in its place (a link to his
    directory, or a directory of his): her job ran his `train.sh` as her. (In a sticky team
    directory he can only have made `exp1` himself; without the sticky bit any directory there
    is refused: `test_a_working_directory_in_a_directory_others_may_write_is_refused`.)"""
    alice, bob = pair
    team.chmod(0o1777)
    with shared_dir("gpuledger-bob-") as bobs:
        (bobs / "exp").mkdir()
        (bobs / "exp" / "train.sh").write_text("echo bob's code\n")
        exp1 = team / "exp1"
        if swap == "his own directory":
            (bobs / "exp").rename(exp1)
            want = f"the working directory {exp1} belongs to another user"
        else:
            exp1.symlink_to(bobs / "exp")
            want = f"the working directory {exp1} goes through the symbolic link {exp1}, which"
        _own(exp1, bob)
        with pytest.raises(Refused, match=want):
            _opened(alice, workdir=str(exp1))
        why = claim_outputs([str(exp1 / "o.out")], _sbatch_user(alice), 10.0, workdir=str(exp1))
        assert isinstance(why, str) and why.startswith(want)
    mine = team / "exp2"
    mine.mkdir(mode=0o700)
    _own(mine, alice)
    got = claim_outputs([str(mine / "o.out")], _sbatch_user(alice), 10.0, 0o077, str(mine))
    assert isinstance(got, Claimed) and got.workdir == str(mine)


def _launch(workdir: str, command: tuple[str, ...]) -> Launch:
    return Launch(
        7,
        (GpuSlot(node="n1", gpu_indices=(0,)),),
        command,
        60.0,
        "alice",
        "ai2/olmo",
        workdir=workdir,
    )


def _script_as(who: User, script: str, run_dir: Path) -> subprocess.CompletedProcess[str]:
    path = run_dir / "batch.sh"
    path.write_text(script)
    return subprocess.run(
        ["/bin/bash", str(path)], user=who.uid, group=who.gid, extra_groups=[],
        capture_output=True, text=True, timeout=20, cwd="/", check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "swap", ["none", "a named pipe bob reads", "a link to another account's file"]
)
def test_slurm_output_swapped_after_the_claim_is_never_waited_on_or_written(
    pair: tuple[User, User], team: Path, swap: str
) -> None:
    """F3: between the executor's claim and slurmstepd's open, bob (who may write the team
    directory) renames the claimed file and puts a 0666 named pipe there (slurmstepd blocked in
    its open, the node held, until bob read the job's output) or a link to his file. slurmstepd
    now opens /dev/null; the batch script opens the name itself, as the user, and takes only the
    inode claimed: a swapped name ends it at once (`cannot-open`, 127), nothing waited on or
    written. Unswapped, the job's output is appended to the claimed file."""
    alice, bob = pair
    out = team / "race-11.out"
    claimed = claim_outputs([str(out)], _sbatch_user(alice), 10.0, 0o077, str(team))
    assert isinstance(claimed, Claimed) and out.stat().st_uid == alice.uid
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and claimed.workdir == str(team)
    reader = -1
    if swap != "none":
        out.rename(team / "race-11.out.moved")
        if swap == "a named pipe bob reads":
            os.mkfifo(out, 0o666)
        else:
            (team / "steal.txt").write_text("")
            (team / "steal.txt").chmod(0o666)
            _own(team / "steal.txt", bob)
            out.symlink_to(team / "steal.txt")
        _own(out, bob)
    with shared_dir("gpuledger-run-") as run_dir:
        _own(run_dir, alice)
        marks = {m: str(run_dir / m) for m in (LAUNCHED, CANNOT_OPEN, CANNOT_ENTER)}
        script = batch_script(
            _launch(str(team), ("sh", "-c", "echo SECRET-$GPULEDGER_JOB_ID; id -u")),
            _sbatch_user(alice), launched_file=marks[LAUNCHED], umask=0o077,
            cannot_enter_file=marks[CANNOT_ENTER], outputs=claimed.files([str(out)]),
            files_umask=0o077, cannot_open_file=marks[CANNOT_OPEN], real_workdir=claimed.workdir,
        )  # fmt: skip
        if swap == "a named pipe bob reads":  # bob's reader, to see what it would get
            reader = os.open(out, os.O_RDONLY | os.O_NONBLOCK)
        try:
            done = _script_as(alice, script, run_dir)
            said = {m: os.path.lexists(p) for m, p in marks.items()}
            if swap == "none":
                assert done.returncode == 0 and said == {LAUNCHED: True, CANNOT_OPEN: False,
                                                         CANNOT_ENTER: False}  # fmt: skip
                assert out.read_text() == f"SECRET-7\n{alice.uid}\n"
                return
            assert done.returncode == 127 and done.stdout == ""
            assert said == {LAUNCHED: False, CANNOT_OPEN: True, CANNOT_ENTER: False}
            assert (team / "race-11.out.moved").read_text() == ""
            if reader >= 0:
                assert os.read(reader, 100) == b""
            else:
                assert (team / "steal.txt").read_text() == ""
        finally:
            if reader >= 0:
                os.close(reader)


LEASER = """import fcntl, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)
fd = open(sys.argv[1], "rb")
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("swap", ["a dangling link", "a link to a file bob holds a lease on"])
def test_slurm_output_swapped_after_the_claim_is_never_created_through_or_blocked_on(
    pair: tuple[User, User], team: Path, swap: str
) -> None:
    """atk39-23 F3, F9: after the claim bob swaps the output's name (its last name, in a
    directory he may write) for a dangling link into alice's home (the script's `exec 3<>`
    created the target, as alice: a file of his naming in her home) or a link to his file he
    holds a read lease on (the blocking `<>` open waited the kernel's lease-break-time, 45 s,
    the node held). Now nothing is created there and the script ends at once: 127,
    `cannot-open`, its command never run (`_script_as` gives it 20 s)."""
    alice, bob = pair
    out = team / "race-12.out"
    claimed = claim_outputs([str(out)], _sbatch_user(alice), 10.0, 0o077, str(team))
    assert isinstance(claimed, Claimed)
    out.rename(team / "race-12.out.moved")
    target = alice.home / "BOB-MADE"
    leaser = None
    if swap == "a dangling link":
        out.symlink_to(target)
    else:
        target = team / "bob-leased"
        target.write_text("")
        target.chmod(0o666)
        _own(target, bob)
        out.symlink_to(target)
        leaser = subprocess.Popen(
            ["/usr/bin/python3", "-c", LEASER, str(target)], user=bob.uid, group=bob.gid,
            extra_groups=[], stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert leaser.stdout is not None and leaser.stdout.readline() == "ready\n"
    _own(out, bob)
    try:
        with shared_dir("gpuledger-run-") as run_dir:
            _own(run_dir, alice)
            marks = {m: str(run_dir / m) for m in (LAUNCHED, CANNOT_OPEN)}
            script = batch_script(
                _launch(str(team), ("sh", "-c", "echo SECRET")), _sbatch_user(alice),
                launched_file=marks[LAUNCHED], umask=0o077, outputs=claimed.files([str(out)]),
                files_umask=0o077, cannot_open_file=marks[CANNOT_OPEN],
                real_workdir=claimed.workdir,
            )  # fmt: skip
            done = _script_as(alice, script, run_dir)
            assert done.returncode == 127 and done.stdout == ""
            assert {m: os.path.lexists(p) for m, p in marks.items()} == {
                LAUNCHED: False, CANNOT_OPEN: True}  # fmt: skip
        if swap == "a dangling link":
            assert not os.path.lexists(target)
        else:
            assert target.read_text() == ""
    finally:
        if leaser is not None:
            leaser.kill()
            leaser.communicate()


def test_slurm_working_directory_swapped_after_the_claim_ends_the_script(
    pair: tuple[User, User], team: Path
) -> None:
    """F10 on Slurm: the script enters the working directory by name (as slurmstepd does), then
    checks it is the real path the claim checked and the user's or root's, else it ends
    (`cannot-enter`, 127) before the command runs. (A team directory without the sticky bit is
    refused by the claim itself now: the swap here stands for any the claim could not see.)"""
    alice, bob = pair
    team.chmod(0o1777)
    exp1 = team / "exp1"
    exp1.mkdir(mode=0o700)
    _own(exp1, alice)
    out = alice.home / "exp1.out"
    claimed = claim_outputs([str(out)], _sbatch_user(alice), 10.0, 0o077, str(exp1))
    assert isinstance(claimed, Claimed) and claimed.workdir == str(exp1)
    exp1.rename(team / ".exp1-moved")
    exp1.mkdir(mode=0o755)
    _own(exp1, bob)
    (exp1 / "train.sh").write_text("echo bob's code ran\n")
    with shared_dir("gpuledger-run-") as run_dir:
        _own(run_dir, alice)
        marks = {m: str(run_dir / m) for m in (LAUNCHED, CANNOT_ENTER)}
        script = batch_script(
            _launch(str(exp1), ("sh", "train.sh")), _sbatch_user(alice),
            launched_file=marks[LAUNCHED], cannot_enter_file=marks[CANNOT_ENTER],
            outputs=claimed.files([str(out)]), real_workdir=claimed.workdir,
        )  # fmt: skip
        done = _script_as(alice, script, run_dir)
        assert done.returncode == 127
        assert not os.path.lexists(marks[LAUNCHED]) and os.path.lexists(marks[CANNOT_ENTER])
    assert "bob's code ran" not in out.read_text()
    assert "is not the one checked at launch" in out.read_text()


def test_the_working_directory_is_recorded_at_submit_as_its_real_path(tmp_path: Path) -> None:
    """F10: `-D` through a link is resolved when the user submits (as sbatch takes its cwd), so
    at launch only the real path is walked by the path rule."""
    from ledger.cli.submit import workdir

    (tmp_path / "real" / "exp1").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert workdir(str(tmp_path / "link" / "exp1")) == str(tmp_path / "real" / "exp1")


def _unsafe(where: Path) -> str:
    return f"is reached through {where}, which other accounts may write"


@pytest.mark.parametrize("swapped", ["a root-owned team directory", "alice's own g+w directory"])
def test_a_working_directory_in_a_directory_others_may_write_is_refused(
    pair: tuple[User, User], team: Path, swapped: str
) -> None:
    """atk39-23 F2: in the team directory (writable by the group, no sticky bit) bob renames
    alice's 0700 `exp1` away and renames a directory that passes the owner check (an admin's
    root-owned scratch, or a group-writable one of alice's own) into its place, his `train.sh`
    in it: her job ran his code as her. A name in a directory others may write is refused on
    both engines, whatever is there; the team directory itself as the working directory (its
    own parent safe) is fine."""
    alice, _ = pair
    scratch = team / "scratch"
    scratch.mkdir()
    scratch.chmod(0o2777 if swapped.startswith("a root") else 0o775)
    if not swapped.startswith("a root"):
        _own(scratch, alice)
    (scratch / "train.sh").write_text("echo bob-code-ran-as $(id -un)\n")
    exp1 = team / "exp1"
    scratch.rename(exp1)
    with pytest.raises(Refused, match=_unsafe(team)):
        _opened(alice, workdir=str(exp1))
    why = claim_outputs([str(exp1 / "o.out")], _sbatch_user(alice), 10.0, workdir=str(exp1))
    assert isinstance(why, str) and why.startswith(f"the working directory {exp1} {_unsafe(team)}")
    assert f"`chmod +t {team}` or `chmod go-w {team}`" in why
    assert list(exp1.iterdir()) == [exp1 / "train.sh"]  # nothing made
    assert "working directory" in _opened(alice, workdir=str(team))  # the team dir itself
    team.chmod(0o1777)  # sticky: only alice may rename her names there
    assert "working directory" in _opened(alice, workdir=str(exp1))


def test_an_output_directory_swapped_in_a_directory_others_may_write_is_refused(
    pair: tuple[User, User], team: Path
) -> None:
    """atk39-23 F1: bob renames alice's 0700 `logs` in the team directory away and makes his own
    0777 `logs` there: her output was made in it for him to read. Refused on both engines, by an
    absolute and a relative name; the output itself in the team directory is still made."""
    alice, bob = pair
    logs = team / "logs"
    logs.mkdir(mode=0o777)
    logs.chmod(0o777)
    _own(logs, bob)
    for spec in ({"stdout": str(logs / "2.out")}, {"workdir": str(team), "stdout": "logs/2.out"}):
        with pytest.raises(Refused, match=r"is reached through (/.*/team|the working directory)"):
            _opened(alice, **spec)
    why = claim_outputs([str(logs / "2.out")], _sbatch_user(alice), 10.0, 0o077)
    want = f"the output file {logs / '2.out'} {_unsafe(team)}"
    assert isinstance(why, str) and why.startswith(want)
    assert list(logs.iterdir()) == []
    assert "output file" in _opened(alice, workdir=str(team), stdout="2.out")
    assert (team / "2.out").stat().st_uid == alice.uid


def test_a_users_own_group_writable_directory_on_the_path_is_refused_with_the_fix(
    pair: tuple[User, User],
) -> None:
    """A directory of alice's made under umask 002 (g+w, no sticky) holds her `exp`: her group
    may rename it. Refused, naming the directory and the fix; after `chmod +t` it is used. So
    is one in her own private group, though the account database names no other member: a
    second group entry with its gid, a systemd userdb membership, `sg` through gshadow or a
    session that kept the gid all gave another account its write (atk40-23 F1-F3, against a
    rule that trusted the database), and a root:root 0775 directory was open to any process
    with gid 0 (F4)."""
    alice, bob = pair
    proj = alice.home / "proj"
    (proj / "exp").mkdir(parents=True)
    for d in (proj, proj / "exp"):
        _own(d, alice)
    for gid in (bob.gid, alice.gid):  # bob's group, then her private group
        os.chown(proj, alice.uid, gid)
        proj.chmod(0o775)
        with pytest.raises(Refused, match=f"{_unsafe(proj)} .*`chmod \\+t {proj}` or `chmod go-w"):
            _opened(alice, workdir=str(proj / "exp"))
        said = _as(alice, lambda: path_refusal(str(proj / "exp"), "working directory", "exp"))
        assert _unsafe(proj) in said
        proj.chmod(0o1775)
        assert "working directory" in _opened(alice, workdir=str(proj / "exp"))


@pytest.mark.parametrize(
    ("case", "want_refused"),
    [("another account's", True), ("root's", False), ("the user's own", False)],
)
def test_owner_refused_keeps_only_the_users_and_roots_directories(
    case: str, want_refused: bool
) -> None:
    """atk40-23 F5, the pure rule: a directory's owner may rename anything in it, whatever its
    mode, so only the user's and root's are on a job's path."""
    owner = {"another account's": 1234, "root's": 0, "the user's own": 1001}[case]
    said = owner_refused("/data/x", owner, 1001, "output file", "o.out")
    if not want_refused:
        assert said == ""
    else:
        assert said.startswith(
            "the output file o.out is reached through /data/x, which belongs to another account "
            "(uid 1234: it may rename"
        )
    assert "the working directory, which" in owner_refused("", 7, 1001, "output file", "o/x")


def test_a_directory_of_another_account_on_the_path_is_refused_on_both_engines(
    pair: tuple[User, User],
) -> None:
    """atk40-23 F5: a 0755 directory of bob's on alice's path passed (nobody else may write it),
    but as its owner bob may rename in it: her `exp` swapped for a directory of his own, her
    `logs` for his. A directory on the way that is neither hers nor root's is refused, for her
    working directory and her outputs, by the node agents' opener and the Slurm claim, and so
    is an output's own directory of his (sticky or not: he may rename her file there); the
    same tree, root's, is used."""
    alice, bob = pair
    with shared_dir("gpuledger-owner-") as top:
        bobs = top / "bob"
        (bobs / "exp").mkdir(parents=True)
        scratch = top / "scratch"
        scratch.mkdir(mode=0o1777)
        scratch.chmod(0o1777)
        _own(bobs / "exp", alice)
        want = f"is reached through {bobs}, which belongs to another account (uid {bob.uid}"
        for owner in (bob, None):
            if owner is not None:
                _own(bobs, owner)
                _own(scratch, owner)
            else:
                os.lchown(bobs, 0, 0)
                os.lchown(scratch, 0, 0)
            ways = [
                {"workdir": str(bobs / "exp")},
                {"stdout": str(bobs / "exp" / "o.out")},
                {"stdout": str(scratch / "o.out")},
            ]
            for spec in ways:
                if owner is None:
                    assert _opened(alice, **spec)
                    continue
                mine = want if "scratch" not in str(spec) else f"reached through {scratch}, which"
                with pytest.raises(Refused, match=re.escape(mine)):
                    _opened(alice, **spec)
                wd = spec.get("workdir", "")
                why = claim_outputs([spec.get("stdout") or f"{wd}/c.out"], _sbatch_user(alice),
                                    10.0, workdir=wd)  # fmt: skip
                assert isinstance(why, str) and mine in why, why
            if owner is not None:
                assert sorted(p.name for p in top.rglob("*.out")) == []


def test_another_file_of_the_users_renamed_to_the_output_is_refused_under_a_stricter_umask(
    pair: tuple[User, User], team: Path
) -> None:
    """atk39-23 F6: bob renames alice's 0644 notes to the output's name in the team directory;
    her job, submitted under umask 077, appended its output to them, 0644, for bob to read. An
    existing output there whose mode grants more than the umask is refused (both engines); one
    the job's umask made (a relaunch) is used, as is any in a sticky directory."""
    alice, _ = pair
    notes = team / "gpuledger-7.out"
    notes.write_text("alice-notes\n")
    notes.chmod(0o644)
    _own(notes, alice)
    want = f"the output file {notes} exists with mode 0644, more than the job's umask 0077"
    with pytest.raises(Refused, match=want):
        open_outputs({"account": _account(alice), "umask": "0077", "stdout": str(notes)})
    why = claim_outputs([str(notes)], _sbatch_user(alice), 10.0, 0o077)
    assert isinstance(why, str) and why.startswith(want)
    assert notes.read_text() == "alice-notes\n"
    assert "output file" in _opened(alice, stdout=str(notes))  # umask 022 allows 0644
    fresh = team / "gpuledger-8.out"
    for _ in range(2):  # made under 077, then found again (a relaunch)
        got = open_outputs({"account": _account(alice), "umask": "0077", "stdout": str(fresh)})
        os.close(got["output file"])
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
    team.chmod(0o1777)
    got = open_outputs({"account": _account(alice), "umask": "0077", "stdout": str(notes)})
    os.close(got["output file"])


def test_a_path_the_rule_refuses_is_warned_of_at_submit_with_one_line(
    pair: tuple[User, User],
) -> None:
    """What the launch would refuse and the submitter's host can see is warned of at submit
    (`cli.submit.path_warnings`, one line each; the submission goes on: the job's node may see
    another filesystem, and its launch checks again): a working directory or an output's
    directory reached through a directory others may write without the sticky bit, or through
    one of another account's (atk40-23 F5)."""
    from ledger.cli.submit import path_warnings

    alice, bob = pair
    with shared_dir("gpuledger-submit-") as top:
        team = top / "team"
        (team / "exp1").mkdir(parents=True)
        team.chmod(0o2777)
        [why] = path_warnings(str(team / "exp1"), ("", ""))
        assert why.startswith(f"the working directory {team / 'exp1'} {_unsafe(team)}"), why
        [why] = path_warnings(str(team), ("logs/%j.out", ""))
        assert why.startswith(f"the output file logs/%j.out {_unsafe(team)}"), why
        assert path_warnings(str(team), ("%x-%j.out", "")) == []  # the team dir, an output in it
        assert path_warnings(str(top / "absent" / "x"), ("", "")) == []  # the launch checks
        team.chmod(0o3777)
        assert path_warnings(str(team / "exp1"), ("logs/%j.out", "")) == []
        bobs = top / "bob"  # a 0755 directory of bob's on alice's path
        (bobs / "exp").mkdir(parents=True)
        _own(bobs, bob)
        _own(bobs / "exp", alice)
        said = _as(alice, lambda: path_warnings(str(bobs / "exp"), ("out.txt", "")))
        assert f"is reached through {bobs}, which belongs to another account (uid {bob.uid}" in said
        assert _as(alice, lambda: path_warnings(str(alice.home), ("o/%j.out", ""))) == "[]"
