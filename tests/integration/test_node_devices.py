"""A job opens only its own GPUs' device files on a host without the cgroup v1 `devices`
controller (atk43 F8): real server, real agents (the fixtures of agentkit.py), started as
the attacker did in a mount namespace where /sys/fs/cgroup/devices is unmounted: a
cgroup-v2-only host as far as the agent can tell. The agent attaches a BPF device program to the
job's v2 group; where the kernel refuses one, the agent says so at start and in its status.
Fake GPUs: `mknod DIR/nvidiaN c 195 N`, 0666 as on GPU nodes; with no driver behind them, an
open that is allowed fails "No such device or address" and one that is denied "Operation not
permitted"."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.integration import agentkit as base
from tests.integration.agentkit import Cluster, part_log, wait_for, with_flags
from tests.integration.serverkit import cli

template, cluster = base.template, base.cluster  # the node agents' suite's fixtures

NO_V1_DEVICES = ("unshare", "-m", "sh", "-c", 'umount /sys/fs/cgroup/devices && exec "$@"', "sh")
NO_BPF = ("setpriv", "--inh-caps=-bpf,-sys_admin", "--bounding-set=-bpf,-sys_admin")
"""The agent without CAP_BPF and CAP_SYS_ADMIN: the kernel refuses to load a BPF program."""
ALLOWED, DENIED = "No such device or address", "Operation not permitted"
OPEN = "GPU devices open: a job may use GPUs it was not given"


def fake_gpus(where: Path) -> Path:
    dev = where / "dev"
    dev.mkdir()
    for i in range(base.GPUS):
        os.mknod(dev / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
        os.chmod(dev / f"nvidia{i}", 0o666)
    return dev


def restart_agents(c: Cluster, *prefix: str) -> None:
    for ag in c.agents.values():
        ag.kill(signal.SIGKILL)
    for ag in c.agents.values():
        ag.prefix = prefix
        ag.start()


def opened(c: Cluster, dev: Path) -> tuple[int, dict[int, str], str]:
    """Run a one-GPU job that opens every fake GPU: (its GPU, what each open said, its v2
    group)."""
    probe = (
        'echo "cvd $CUDA_VISIBLE_DEVICES"; grep "^0::" /proc/self/cgroup; '
        f"for i in $(seq 0 {base.GPUS - 1}); do "
        f'echo "$i $( (exec 3<{dev}/nvidia$i) 2>&1 | sed "s/.*: //")"; done'
    )
    job = c.submit(1, probe)
    j = c.wait_status(job, "finished")
    lines = part_log(j["logs"][0]).read_text().splitlines()
    cvd = int(lines[0].split()[1])
    said = {int(ln.split(" ", 1)[0]): ln.split(" ", 1)[1] for ln in lines[2:]}
    return cvd, said, lines[1]


def status(c: Cluster, node: str) -> str:
    ag = c.agents[node]
    return cli(ag.state, "agent", "status", "--state-dir", str(ag.state)).stdout


@with_flags(serve=("--node-lost-after", "60s"))
def test_without_the_v1_devices_controller_a_job_opens_only_its_own_gpu(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk43 F8: with the v1 devices hierarchy gone, the job's v2 group was used for tracking
    only and a job on GPU 0 opened GPU 1 too. A BPF device program now denies it."""
    c = cluster
    dev = fake_gpus(tmp_path)
    restart_agents(c, *NO_V1_DEVICES)
    for _ in range(2):  # two jobs, so both GPU indices are tried as "the other one"
        cvd, said, group = opened(c, dev)
        assert group.startswith("0::/gpuledger/")  # the job is in its v2 group
        want = {i: ALLOWED if i == cvd else DENIED for i in range(base.GPUS)}
        assert said == want, c.why()
    for node, ag in c.agents.items():
        assert OPEN not in ag.text()
        assert "GPU devices constrained (cgroup v2 BPF device program)" in status(c, node)


@with_flags(serve=("--node-lost-after", "60s"))
def test_where_the_kernel_refuses_a_device_program_the_agent_says_gpus_are_open(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The documented limit (docs/agent.md, GPU device files): an agent without CAP_BPF on a
    host without v1 devices cannot confine GPU device files; it says so once at start, with the
    kernel's answer, and `agent status` shows it; the job can indeed open another GPU."""
    c = cluster
    dev = fake_gpus(tmp_path)
    restart_agents(c, *NO_V1_DEVICES, *NO_BPF)
    why = (
        f"{OPEN} (no cgroup v1 devices controller, the kernel refused a BPF device program: "
        "bpf(BPF_PROG_LOAD): Operation not permitted)"
    )
    for node, ag in c.agents.items():
        wait_for(f"{node}'s warning", lambda ag=ag: why in ag.text(), 10, ag.text)  # type: ignore[misc]
        assert ag.text().count(OPEN) == 1
        assert status(c, node).count(why) == 1
    _, said, _ = opened(c, dev)
    assert set(said.values()) == {ALLOWED}
