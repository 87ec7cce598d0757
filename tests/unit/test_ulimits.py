"""The submitter's resource limits reach the job, as sbatch's PropagateResourceLimits=ALL
(atk46-23 F12): `submit` records its soft limits (`--propagate` chooses which), the submission
keeps them, the node agents' supervisor and the Slurm batch script set them as the job's user,
never above the node's hard limit (`ledger.engines.ulimits`, `slurm.script.ulimit_lines`)."""

from __future__ import annotations

import resource
import subprocess

import msgspec
import pytest

from ledger.cli.submit import directives, propagated
from ledger.core.state import State
from ledger.cycle.executor import launch_of
from ledger.engines.slurm.script import batch_script, ulimit_lines
from ledger.engines.slurm.words import SbatchUser, sbatch_args
from ledger.engines.ulimits import own_limits, plan, setter
from schemas import codec
from schemas import events as e
from schemas.bounds import LIMIT_NAMES, Ulimits
from schemas.errors import InvalidCommand
from tests.unit.test_jobs_world import World

MINE = {"as": -1, "core": 0, "cpu": -1, "data": -1, "fsize": -1, "memlock": 8388608,
        "nofile": 512, "nproc": 300, "rss": -1, "stack": 4194304}  # fmt: skip


def test_submit_records_its_soft_limits_as_propagate_says() -> None:
    assert set(own_limits()) == set(LIMIT_NAMES)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert own_limits()["nofile"] == (-1 if soft == resource.RLIM_INFINITY else soft)
    assert propagated("ALL", MINE) == MINE
    assert propagated("NONE", MINE) == {}
    assert propagated("nofile,STACK", MINE) == {"nofile": 512, "stack": 4194304}
    with pytest.raises(InvalidCommand, match="--propagate: 'MEM' is no resource limit"):
        propagated("NOFILE,MEM", MINE)
    script = "#!/bin/sh\n#SBATCH --propagate\n#SBATCH --propagate=NONE -t 5\ntrue\n"
    assert directives(script, "a.sh") == ["--propagate", "--propagate", "NONE", "-t", "5"]


def test_the_submission_keeps_them_and_an_older_one_reads_as_none(org_state: State) -> None:
    w = World(org_state)
    (job,) = w.submit(ulimits={"stack": 4194304, "nofile": 512})
    assert job.ulimits == {"nofile": 512, "stack": 4194304}
    w.place(job.job_id)
    launch = launch_of(job.job_id, w.state.jobs[job.job_id], "alice")
    assert launch.ulimits == (("nofile", 512), ("stack", 4194304))
    (plain,) = w.submit()
    assert plain.ulimits is None
    stored = msgspec.json.decode(codec.encode(job))
    del stored["ulimits"]  # as a submission recorded before the field
    old = codec.decode(msgspec.json.encode(stored))
    assert isinstance(old, e.JobSubmitted) and old.ulimits is None and old.umask == job.umask
    for bad in ({"nofile": -2}, {"nice": 5}):  # -1 is unlimited; only the names it knows
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, Ulimits)


def test_a_limit_is_never_raised_above_the_nodes_hard_limit() -> None:
    hard = {resource.RLIMIT_NOFILE: 256, resource.RLIMIT_CORE: 0}
    sets, said = plan(MINE, lambda n: hard.get(n, resource.RLIM_INFINITY))
    got = {n: soft for n, soft, _ in sets}
    assert got[resource.RLIMIT_NOFILE] == 256 and got[resource.RLIMIT_CORE] == 0
    assert got[resource.RLIMIT_STACK] == 4194304 and got[resource.RLIMIT_AS] == -1
    assert all(h == hard.get(n, resource.RLIM_INFINITY) for n, _, h in sets)  # hard untouched
    assert said == [
        "gpuledger: RLIMIT_NOFILE: the submitter's soft limit 512 is above this node's hard "
        'limit 256: the job runs with 256 (as slurmstepd: "reducing req:512 to max:256")'
    ]
    _, said = plan({"core": -1}, lambda n: 0)
    assert "soft limit unlimited is above this node's hard limit 0" in said[0]


def test_the_leader_starts_with_them() -> None:
    """What the supervisor does before the leader starts (`supervise._start`), here with the
    test's own account."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    sets, _ = plan({"nofile": 77, "stack": 4194304}, lambda n: resource.getrlimit(n)[1])
    out = subprocess.run(
        ["sh", "-c", "ulimit -Sn; ulimit -Hn; ulimit -Ss"],
        preexec_fn=setter(sets), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.split() == ["77", str(hard if hard != resource.RLIM_INFINITY else
                                            "unlimited"), "4096"]  # fmt: skip


def test_the_slurm_script_sets_them_and_sbatch_propagates_none(org_state: State) -> None:
    w = World(org_state)
    (job,) = w.submit(ulimits={"nofile": 512, "core": -1, "nproc": 300}, command=("true",))
    w.place(job.job_id)
    launch = launch_of(job.job_id, w.state.jobs[job.job_id], "alice")
    assert "--propagate=NONE" in sbatch_args(launch, "gpu", "/l", SbatchUser(), "L")
    script = batch_script(launch, SbatchUser())
    assert ulimit_lines(launch.ulimits or ()) in script and "ulimit -Sn" not in script
    lines = ulimit_lines(launch.ulimits or ())
    assert lines.index("-H -u") > lines.index("-H -n")  # nproc last: the lines fork
    (plain,) = w.submit(command=("true",))
    w.place(plain.job_id, "n1", 1)
    old = launch_of(plain.job_id, w.state.jobs[plain.job_id], "alice")
    assert "--propagate=NONE" not in sbatch_args(old, "gpu", "/l", SbatchUser(), "L")
    (none,) = w.submit(ulimits={}, command=("true",))  # `submit --propagate=NONE`: the node's
    w.place(none.job_id, "n1", 2)
    empty = launch_of(none.job_id, w.state.jobs[none.job_id], "alice")
    # as `sbatch --propagate=NONE`: none of the service's (atk47-s F6: its core 0)
    assert "--propagate=NONE" in sbatch_args(empty, "gpu", "/l", SbatchUser(), "L")
    assert "ulimit -S" not in batch_script(empty, SbatchUser(), files_limit=1024)
    assert "ulimit -Sn 1024" in batch_script(old, SbatchUser(), files_limit=1024)  # the old rule
    got = subprocess.run(
        ["bash", "-c", f"ulimit -n 256; ulimit -Hc 0; {lines}; ulimit -Sn; ulimit -Sc; ulimit -Su"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert got.stdout.split() == ["256", "0", "300"]
    assert got.stderr.splitlines() == [
        "gpuledger: RLIMIT_CORE: the submitter's soft limit unlimited is above this node's hard "
        "limit 0 (ulimit -c): the job runs with 0 (as slurmstepd: reducing req:unlimited to "
        "max:0)",
        "gpuledger: RLIMIT_NOFILE: the submitter's soft limit 512 is above this node's hard "
        "limit 256 (ulimit -n): the job runs with 256 (as slurmstepd: reducing req:512 to "
        "max:256)",
    ]
