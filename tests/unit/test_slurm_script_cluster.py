"""A run started on another Slurm cluster than the one it was submitted for (a controller
swapped during its sbatch, and the leader killed before its landing check: atk45ha F4) ends
before anything of the job's: its batch script asks `scontrol show config` (a fake one here, in
bash) and compares with the identity written into it (`script_cluster`)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.slurm.cluster import identity
from ledger.engines.slurm.launching import never_ran, run_script
from ledger.engines.slurm.script import batch_script
from ledger.engines.slurm.script_cluster import OTHER_CLUSTER_EXIT, OTHER_CLUSTER_WHY, cluster_lines
from ledger.engines.slurm.words import SbatchUser, parse_jobs
from schemas.events import GpuSlot

CONFIG = """Configuration data as of 2026-12-05T00:00:00
AccountingStorageType   = accounting_storage/none
ClusterName             = lab
ControlMachine          = old
SlurmctldHost[0]        = vm(127.0.0.1)
SlurmctldHost[1]        = vm2
SlurmctldParameters     = enable_configless,x=y
SlurmctldPort           = 6817
StateSaveLocation       = /var/spool/slurm/a
"""


def fake_scontrol(where: Path, config: str | None) -> Path:
    """An `scontrol` that prints `config` for `show config` (fails when None: no answer)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "config").write_text(config or "")
    fake = where / "scontrol"
    body = f"cat {where / 'config'}" if config is not None else "echo 'no controller' >&2; exit 1"
    fake.write_text(f"#!/bin/bash\n{body}\n")
    fake.chmod(0o755)
    return fake


def job(out: Path) -> Launch:
    return Launch(1, (GpuSlot(node="vm", gpu_indices=(0,)),),
                  ("bash", "-c", f"echo ran >> {out}"), None, "bob", "ai2/olmo")  # fmt: skip


def script_of(tmp_path: Path, expected: dict[str, object], answered: str | None) -> Path:
    """The run's batch script with its marks (`batch_script`) checking for `expected`, with an
    `scontrol` that answers `answered`."""
    tmp_path.mkdir(exist_ok=True)
    fake = fake_scontrol(tmp_path / "bin", answered)
    run_dir = tmp_path / "checkpoints" / "1.0"
    run_dir.mkdir(parents=True)
    at = {m: str(run_dir / m) for m in ("launched", "ended", "relaunched", "alive", "taken-back")}
    text = batch_script(job(tmp_path / "out"), launched_file=at["launched"],
                        ended_file=at["ended"], alive_file=at["alive"],
                        relaunched_file=at["relaunched"], taken_back_file=at["taken-back"],
                        cluster=cluster_lines(expected, str(fake)))  # fmt: skip
    script = tmp_path / "batch"
    script.write_text(text)
    return script


def test_the_executor_s_script_checks_with_the_scontrol_it_runs(tmp_path: Path) -> None:
    """`run_script` (what the executor submits) carries the check, before its launch mark."""
    text = run_script(job(tmp_path / "out"), SbatchUser(), tmp_path / "checkpoint", 0o022, (),
                      0o077, "", 60, (), 60, identity(CONFIG, False))  # fmt: skip
    assert text.index("show config") < text.index("launched")
    assert run_script(job(tmp_path / "out"), SbatchUser(), tmp_path / "checkpoint", 0o022, (),
                      0o077, "", 60, (), 60).count("show config") == 0  # fmt: skip


def run(script: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "SLURM_CLUSTER_NAME"}
    return subprocess.run(["/bin/bash", str(script)], env={**base, **env}, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip


def marks(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "checkpoints" / "1.0").iterdir())


def test_the_identity_the_script_makes_is_the_one_the_executor_makes(tmp_path: Path) -> None:
    """The script's reading of `scontrol show config` is `cluster.identity`'s: the same text
    passes, with several controller hosts and an `=` inside a value."""
    mine = identity(CONFIG, False)
    assert mine["slurm_cluster"] == "lab at vm(127.0.0.1),vm2 port 6817"
    done = run(script_of(tmp_path, mine, CONFIG))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out").read_text() == "ran\n"


@pytest.mark.parametrize(
    ("case", "answered"),
    [
        ("another StateSaveLocation", CONFIG.replace("/slurm/a", "/slurm/c")),
        ("another port", CONFIG.replace("6817", "7817")),
        ("another name", CONFIG.replace("= lab", "= other")),
        ("one controller host fewer", CONFIG.replace("SlurmctldHost[1]        = vm2\n", "")),
    ],
)
def test_a_run_started_on_another_cluster_never_runs_its_command(
    tmp_path: Path, case: str, answered: str
) -> None:
    """atk45ha F4: the copy the dead leader's sbatch left on another cluster. Before, its script
    had no such check and ran the command there (no marks checked, no exit 123)."""
    done = run(script_of(tmp_path, identity(CONFIG, False), answered))
    assert done.returncode == OTHER_CLUSTER_EXIT, (case, done.stderr)
    assert not (tmp_path / "out").exists(), case
    assert marks(tmp_path) == [], case  # no launch mark, no beat: its directory is the run's
    assert done.stderr.startswith("gpuledger: submitted for the Slurm cluster lab at "), done.stderr
    assert done.stderr.strip().endswith(": not run"), done.stderr


def test_without_an_answer_the_name_slurm_gives_the_job_is_compared(tmp_path: Path) -> None:
    """No controller answers `scontrol show config` on the node: SLURM_CLUSTER_NAME decides;
    unset or the same name, the run goes on (said on stderr)."""
    script = script_of(tmp_path, identity(CONFIG, False), None)
    other = run(script, SLURM_CLUSTER_NAME="other")
    assert other.returncode == OTHER_CLUSTER_EXIT and not (tmp_path / "out").exists()
    same = run(script, SLURM_CLUSTER_NAME="lab")
    assert same.returncode == 0 and (tmp_path / "out").read_text() == "ran\n"
    assert "checked by its name alone" in same.stderr
    unset = run(script_of(tmp_path / "again", identity(CONFIG, False), None))  # marks anew
    assert unset.returncode == 0 and (tmp_path / "again" / "out").read_text() == "ran\n"


def test_no_identity_no_check() -> None:
    assert cluster_lines(None) == []
    assert cluster_lines({"slurm_cluster": "lab at vm port 1"}) == []


def test_a_run_its_script_refused_as_on_another_cluster_never_ran(tmp_path: Path) -> None:
    """The executor of the cluster it was meant for (a controller moved while it was pending)
    takes exit 123 with no launch mark for a run that never ran, not the job's own failure."""
    t = int(time.time()) - 60
    at = lambda s: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t + s))  # noqa: E731
    (j,) = parse_jobs(
        f"JobId=7 JobName=gpuledger-1 UserId=bob(1001) JobState=FAILED Reason=None"
        f" ExitCode={OTHER_CLUSTER_EXIT}:0 StartTime={at(0)} EndTime={at(1)} Partition=gpuledger"
        " NodeList=vm Comment=gpuledger:0123abcd4567:job=1:run=0 StdOut=/tmp/y"
    )
    why = never_ran(j, None, (), tmp_path, False, 10.0)
    assert why == f"{OTHER_CLUSTER_WHY}: never ran"
    (tmp_path / "launched").touch()  # its command began: the job's own exit
    assert never_ran(j, None, (), tmp_path, False, 10.0) == ""
