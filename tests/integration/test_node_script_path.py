"""A batch script reached through another account's directory (atk43 F1; the path rule, T19 in
docs/security.md): real server, real agents running jobs as their submitters (the fixtures of
agentkit.py), real OS accounts."""

from __future__ import annotations

import os

from tests.integration import agentkit as base
from tests.integration import userkit
from tests.integration.agentkit import Cluster, with_flags
from tests.integration.serverkit import cli

template, cluster = base.template, base.cluster  # the node agents' suite's fixtures


@with_flags(agent=("--run-as", "submitter"))
def test_a_script_whose_directory_a_teammate_swapped_is_refused_not_run_as_its_submitter(
    cluster: Cluster,
) -> None:
    """As reported: alice's script sits in a directory of hers inside bob's group project
    directory (writable by its group, no sticky bit), and she submits it by its absolute path
    from her home. Bob renames her directory away and puts his own in its place, with a script
    of his at the name. The job ran bob's code as alice. Now `submit` warns that the script is
    reached through a directory others may write, and the launch refuses it (`launch_failed`,
    why recorded): nothing of bob's runs."""
    c = cluster
    with (
        userkit.os_user("glsa") as alice,
        userkit.os_user("glsb") as bob,
        userkit.shared_dir("gpuledger-proj-") as top,
    ):
        c.cli("member", "add", alice.name, "ai2/olmo")
        proj = top / "proj"
        proj.mkdir()
        os.chown(proj, bob.uid, bob.gid)
        proj.chmod(0o2777)  # the group's to write (as a 2775 project directory for its members)
        mine = proj / "al"
        mine.mkdir()
        (mine / "q.sh").write_text("#!/bin/sh\nid\n")
        for p in (mine, mine / "q.sh"):
            os.chown(p, alice.uid, alice.gid)
        # bob, before the launch: her directory away, his own in its place
        mine.rename(proj / "al.moved")
        mine.mkdir()
        pwned = alice.home / "PWNED_BY_BOB"
        (mine / "q.sh").write_text(f"#!/bin/sh\necho owned-by-bob > {pwned}\n")
        for p in (mine, mine / "q.sh"):
            os.chown(p, bob.uid, bob.gid)
        out = cli(c.home, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h",
                  str(mine / "q.sh"), cwd=alice.home, GPULEDGER_USER=alice.name)  # fmt: skip
        said = f"the script {mine / 'q.sh'} is reached through {proj}, which other accounts may"
        assert said in out.stderr, out.stderr
        job = int(out.stdout.split()[2].rstrip(":"))
        row = c.wait_status(job, "finished")
        assert row["finish_reason"] == "launch_failed", row
        [ended] = [e for e in c.events("job.finished.v2") if e["job_id"] == job]
        assert f"the script {mine / 'q.sh'} is reached through {proj}" in ended["note"], ended
        assert not pwned.exists()
