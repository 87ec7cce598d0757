"""Slurm's own notes ("CANCELLED ... DUE TO TIME LIMIT", its "error:" lines) reach the job's
error file as under sbatch: `sbatch --error=<the file>` where no other account can put anything
in its place between the claim and slurmstepd's open (`outputs.steady`), else /dev/null as
before (atk38-23 F3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.slurm.outputs import claim_outputs, steady
from ledger.engines.slurm.words import SbatchUser, sbatch_args
from schemas.events import GpuSlot

ME = os.geteuid()


@pytest.mark.parametrize(
    ("case", "want"),
    [
        ("a directory of the user's, 0755", True),
        ("a directory others may write, no sticky bit", False),
        ("a directory others may write, with the sticky bit", True),
        ("a group-writable directory", False),
        ("a directory of another account's", False),
        ("a link on the way", False),
        ("the file of another account's", False),
        ("the file a link", False),
        ("the file missing", False),
        ("a relative name", False),
        ("a name with ..", False),
    ],
)
def test_slurm_opens_the_error_file_only_where_no_other_account_can_replace_it(
    tmp_path: Path, case: str, want: bool
) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    err = d / "job.err"
    err.write_text("")
    name = str(err)
    if case == "a directory others may write, no sticky bit":
        d.chmod(0o777)
    elif case == "a directory others may write, with the sticky bit":
        d.chmod(0o1777)
    elif case == "a group-writable directory":
        d.chmod(0o775)
    elif case == "a directory of another account's":
        os.chown(d, 4242, 4242)
    elif case == "a link on the way":
        (tmp_path / "l").symlink_to(d)
        name = str(tmp_path / "l" / "job.err")
    elif case == "the file of another account's":
        os.chown(err, 4242, 4242)
    elif case == "the file a link":
        (d / "other").write_text("")
        err.unlink()
        err.symlink_to(d / "other")
    elif case == "the file missing":
        err.unlink()
    elif case == "a relative name":
        name = os.path.relpath(err)
    elif case == "a name with ..":
        name = str(d / ".." / "d" / "job.err")
    assert steady(name, ME) is want, case


def test_the_claim_names_the_error_file_slurm_may_open_and_sbatch_is_given_it(
    tmp_path: Path,
) -> None:
    out, err = str(tmp_path / "o-7.out"), str(tmp_path / "e-7.err")
    both = claim_outputs([out, err], SbatchUser(), 5.0)
    assert not isinstance(both, str) and both.error_file == err
    alone = claim_outputs([out], SbatchUser(), 5.0)  # no error file: the output has the errors
    assert not isinstance(alone, str) and alone.error_file == out
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    elsewhere = claim_outputs([str(open_dir / "o.out")], SbatchUser(), 5.0)
    assert not isinstance(elsewhere, str) and elsewhere.error_file == ""
    job = Launch(7, (GpuSlot(node="n1", gpu_indices=(0,)),), ("true",), None, "alice", "p")
    args = sbatch_args(job, "gpu", os.devnull, SbatchUser(), "L", error_path=both.error_file)
    assert "--output=/dev/null" in args and f"--error={err}" in args
    args = sbatch_args(job, "gpu", os.devnull, SbatchUser(), "L", error_path="")
    assert not any(a.startswith("--error") for a in args)
