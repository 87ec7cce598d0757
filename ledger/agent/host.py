"""What the agent learns of and takes on its host: the host-wide lock that keeps one agent per
node (`hold_node`), the host's short name, its GPUs from NVML. An edge."""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import stat
from pathlib import Path

from schemas.errors import InvalidCommand, InvalidTransition

HOST_LOCK_DIR = Path("/run/gpuledger")
"""Where an agent running as root takes its node's host-wide lock (`hold_node`)."""


def hold_node(node: str, url: str, state_dir: Path) -> int:
    """One agent per node on this host: an exclusive lock (flock, held until the process ends)
    on `HOST_LOCK_DIR/agent-<digest of the servers' URL and the node>.lock` (an agent not run as
    root: in its state directory's parent). A second agent for the node, on another state
    directory given the first's `agent-id` (a moved or restored directory), was the same agent
    to the server and launched the node's running job again beside it (atk39-23 F5). Returns
    the lock's descriptor (close-on-exec: no supervisor inherits it)."""
    base = HOST_LOCK_DIR if os.geteuid() == 0 else state_dir.absolute().parent
    base.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = os.lstat(base)
    mine = stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
    if base == HOST_LOCK_DIR and not mine:  # whoever may write it may take every node's lock
        raise InvalidCommand(
            f"{base} is not a directory of this account that only it may write",
            hint="remove it: the agent makes it (0755)",
        )
    key = hashlib.sha256(f"{url}\n{node}".encode()).hexdigest()[:16]
    path = base / f"agent-{key}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 200, 0).decode(errors="replace").strip()
        os.close(fd)
        raise InvalidTransition(
            f"node {node!r} is held by another agent on this host ({other or path}): two "
            "agents for one node would run its jobs twice",
            hint="stop it, or start this one on its --state-dir; a node has one agent",
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, state directory {state_dir}\n".encode(), 0)
    return fd


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def gpus_from_nvml() -> tuple[int, str] | None:
    """(count, name of GPU 0) from NVML, or None where it is absent."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if count else ""
    except Exception:  # no library, no driver, no GPU: all mean "no NVML here"
        return None
    if isinstance(name, bytes):
        name = name.decode()
    return count, str(name).replace(" ", "-")[:63]
