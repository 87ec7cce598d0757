"""The path rule for the names a job's command runs by, on the Slurm executor (atk46-23 F8):
a real Slurm cluster, `gpuledger up --executor slurm` as a process, real OS accounts. A
teammate's script swapped into a group directory while the job waited ran as the submitter on
Slurm, though `submit` warned it would be refused at launch and the node agents refuse it
(test_node_script_path.py). The batch script now runs the node agents' own check on the node,
as the job's user, just before the command (`ledger/engines/slurm/command_check.py`)."""

from __future__ import annotations

import json
import os
import subprocess

from tests.integration import test_slurm as base
from tests.integration.test_slurm import GPULEDGER, Ledger, status
from tests.integration.test_slurm_world import submit_as
from tests.integration.userkit import os_user, shared_dir

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures


def test_a_teammates_swapped_script_is_refused_at_launch_never_run_as_the_submitter(
    ledger: Ledger,
) -> None:
    """As reported: alice's script in a directory of hers inside bob's group project directory
    (2777 here: 2775 for its group), submitted by its absolute path, waiting on another job of
    hers (`afterok`). `submit` warns it will be refused at launch. Bob renames her directory
    away and puts his own in its place, with his script at the name, before the launch: Slurm
    ran bob's code as alice (`completed`). Now the run ends `launch_failed`, never started, its
    note the node agents' words; nothing of bob's ran. The same job from a directory of her
    own runs."""
    with (
        os_user("glfa", groups=0) as alice,
        os_user("glfb", groups=0) as bob,
        shared_dir("gpuledger-f8-") as top,
    ):
        ledger.cli("member", "add", alice.name, "ai2/olmo")
        proj = top / "proj"
        proj.mkdir()
        os.chown(proj, bob.uid, bob.gid)
        proj.chmod(0o2777)
        mine = proj / "al"
        mine.mkdir()
        script = mine / "run.sh"
        script.write_text("#!/bin/sh\necho alice-script\n")
        for p in (mine, script):
            os.chown(p, alice.uid, alice.gid)
        own = alice.home / "run.sh"
        own.write_text("#!/bin/sh\necho alice-own\n")
        os.chown(own, alice.uid, alice.gid)
        go = alice.home / "go"
        ledger.up(run_as="submitter")
        (first,) = submit_as(ledger, alice, alice.home, "--", "sh", "-c",
                             f"while [ ! -e {go} ]; do sleep 0.2; done")  # fmt: skip
        done = subprocess.run(
            [GPULEDGER, "submit", "-A", "ai2/olmo", "-G", "1", "--json",
             f"--dependency=afterok:{first}", "-o", f"{alice.home}/swap-%j.out", str(script)],
            env=ledger.env(alice.name), cwd=alice.home, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        unsafe = f"the script {script} is reached through {proj}, which other accounts may write"
        assert unsafe in done.stderr, done.stderr  # the warning: "refused ... at launch"
        swapped = int(json.loads(done.stdout)["job_id"])
        (ran_own,) = submit_as(ledger, alice, alice.home, f"--dependency=afterok:{first}",
                               "-o", f"{alice.home}/own-%j.out", str(own))  # fmt: skip
        # bob, while it waits: her directory away, his own in its place, his script there
        mine.rename(proj / "al.moved")
        mine.mkdir()
        pwned = alice.home / "PWNED_BY_BOB"
        script.write_text(f"#!/bin/sh\necho bob-code; id -u > {pwned}\n")
        for p in (mine, script):
            os.chown(p, bob.uid, bob.gid)
        go.touch()
        os.chown(go, alice.uid, alice.gid)
        ended = (first, swapped, ran_own)
        ledger.wait("all to end", lambda: all(status(ledger, j) == "finished" for j in ended),
                    timeout=120)  # fmt: skip
        rows = ledger.jobs()
        row = rows[swapped]
        assert (row["finish_reason"], row["exit_code"], row["started_at"]) == (
            "launch_failed", None, None,
        ), row  # fmt: skip
        assert row["finish_note"].startswith(unsafe), row  # the node agents' words
        assert ledger.of("job.started.v1", swapped) == []
        assert not pwned.exists()
        out = alice.home / f"swap-{swapped}.out"
        assert "bob-code" not in (out.read_text() if out.exists() else "")
        assert rows[ran_own]["finish_reason"] == "completed", rows[ran_own]
        assert (alice.home / f"own-{ran_own}.out").read_text() == "alice-own\n"
        ledger.stop()
