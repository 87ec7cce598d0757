"""The job steps a test cluster's slurmd still holds, and the end of those its slurmctld does not
know (`Cluster.clean`, tests/integration/test_slurm.py).

slurmctld killed -9 before it saved a submission comes back without the job and hands its id out
again, while slurmd still runs the first launch under slurmstepd: slurmctld aborts that orphan only
once the node registers, a second or more later, and a launch of the reused id meanwhile is refused
("Duplicate jobid", the node drained; CI: test_slurm_faults' first launch, after
test_slurm_ctldloss on the same cluster). slurmd finds its steps by their slurmstepd's socket in its
spool dir (`<spool>/<node>_<job>.<step>`), as read here from /proc: a live listener on such a
socket is a step it has, which it answers for (`scontrol listpids` lists the step's processes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

LIVE = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING")
"""The states of a job whose steps slurmd may hold (any other, PENDING too, holds none)."""
STEPD_GRACE_S = 10.0
"""How long a slurmstepd whose processes were killed may take to end by itself before it is
killed too (it reports its end to slurmctld first)."""


def _spool(conf: str, node: str) -> Path:
    """`node`'s slurmd's spool dir (`%n`: the node's name, a cluster of several slurmd)."""
    for line in Path(conf).read_text().splitlines():
        if line.startswith("SlurmdSpoolDir="):
            return Path(line.split("=", 1)[1].strip().replace("%n", node))
    raise AssertionError(f"{conf} names no SlurmdSpoolDir")


def held_steps(conf: str, node: str) -> dict[str, set[int]]:
    """Slurm job id -> the pids holding a listening socket of a step of it in slurmd's spool dir
    (its slurmstepd): the jobs this cluster's slurmd has a step of."""
    prefix = f"{_spool(conf, node)}/{node}_"
    inodes: dict[str, str] = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        words = line.split()
        if len(words) >= 8 and words[7].startswith(prefix):
            inodes[f"socket:[{words[6]}]"] = words[7].removeprefix(prefix).split(".")[0]
    held: dict[str, set[int]] = {}
    if not inodes:
        return held
    for fds in Path("/proc").glob("[0-9]*/fd"):
        try:
            links = [os.readlink(fd) for fd in fds.iterdir()]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for job in {inodes[link] for link in links if link in inodes}:
            held.setdefault(job, set()).add(int(fds.parent.name))
    return held


def orphans(conf: str, node: str) -> dict[str, set[int]]:
    """The steps slurmd holds of jobs slurmctld does not list live (read after them: a job
    started in between is listed). slurmctld not answering is an AssertionError."""
    held = held_steps(conf, node)
    if not held:
        return {}
    env = {**os.environ, "SLURM_CONF": conf}
    done = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%A|%T"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"squeue: {done.stderr.strip()}")
    live = {r.split("|")[0] for r in done.stdout.splitlines() if r.split("|")[-1] in LIVE}
    return {job: pids for job, pids in held.items() if job not in live}


def tasks(conf: str, node: str, job: str) -> list[int]:
    """The processes of the job's steps on the node (`scontrol listpids`)."""
    env = {**os.environ, "SLURM_CONF": conf}
    done = subprocess.run(["scontrol", "listpids", job, node], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    rows = (line.split() for line in done.stdout.splitlines()[1:])
    return [int(r[0]) for r in rows if r and r[0].isdigit()]


def end_orphans(conf: str, node: str, timeout: float = 60) -> list[str]:
    """Kill -9 the processes of every step slurmd holds of a job slurmctld does not know, then
    (past `STEPD_GRACE_S`) its slurmstepd, until slurmd holds none; the job ids it ended."""
    ended: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while found := orphans(conf, node):
        if time.monotonic() > deadline:
            raise AssertionError(f"slurmd still holds steps slurmctld does not know: {found}")
        for job, stepds in found.items():
            first = ended.setdefault(job, time.monotonic())
            late = time.monotonic() - first > STEPD_GRACE_S
            for pid in tasks(conf, node, job) + (sorted(stepds) if late else []):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    return sorted(ended)
