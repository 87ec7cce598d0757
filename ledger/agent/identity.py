"""Who a node agent is (docs/agent.md, "One agent per node"): its id, kept in its state
directory (`agent_id`), bound to this host's boot (`instance_id`), and whether the host
rebooted since the agent last ran on that directory (`this_boot`): then it tells the server at
once (`schemas.agent.REBOOTED_HEADER`), which ends the node's runs, gone with the boot, without
waiting for the node-lost timeout and the fence (`ledger.engines.fence.reboot_honoured`). An
edge (it reads and writes the state directory and /proc)."""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from ledger.engines.proc import write_atomic
from schemas.errors import InvalidCommand

ID_FILE = "agent-id"
"""This agent's id (`agent_id`), kept in its state directory."""
BOOT_FILE = "boot-id"
"""The host's boot id when this agent last registered (`remember_boot`), in its state directory."""
PROC_ENV = "GPULEDGER_AGENT_PROC"
"""Where the agent reads the host's boot id (`sys/kernel/random/boot_id`) and `uptime` (unset:
/proc). Tests point it at a directory of their own: a host that rebooted."""


def _proc() -> Path:
    return Path(os.environ.get(PROC_ENV) or "/proc")


def boot_id() -> str:
    """This host's boot ("" where the system has none): a copy of the state directory on
    another machine (a cloned disk or VM), or the same directory after a reboot, is another
    agent (`instance_id`)."""
    try:
        return (_proc() / "sys/kernel/random/boot_id").read_text()[:100].strip()
    except OSError:
        return ""


def uptime_s() -> float | None:
    """Seconds since this host booted (its own clock, not the wall clock), None if unknown."""
    try:
        value = float((_proc() / "uptime").read_text()[:100].split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def agent_id(state_dir: Path) -> str:
    """This agent's name for itself (`schemas.agent.AGENT_HEADER`): a random id made once and
    kept in `<state_dir>/agent-id` (created exclusively, 0600: written aside, then linked to its
    name, so two agents starting at once, or a crash, never leave two ids or an empty one).
    The same agent restarted on its state directory is the same agent; a second machine with
    the same `--node` and the same state directory *path* is another (atk38-23 F9: the id was
    a hash of the path)."""
    path = state_dir / ID_FILE
    if not path.exists():
        tmp = state_dir / f".{ID_FILE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(16) + "\n")
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            tmp.unlink()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as err:
        raise InvalidCommand(f"cannot read the agent's id {path}: {err.strerror}") from err
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        value = f.read(100).strip()
    mine = stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
    if not mine or st.st_mode & 0o077 or len(value) != 32 or not value.isalnum():
        raise InvalidCommand(
            f"{path} is not this agent's id (a 0600 file of its own holding 32 hex digits)",
            hint="remove it only when no other agent ever ran on this state directory",
        )
    return value


def bound(ident: str, boot: str) -> str:
    """Pure: what an agent of id `ident` sends as its name on boot `boot` (the id alone where
    the system has no boot id)."""
    return hashlib.sha256(f"{ident}:{boot}".encode()).hexdigest()[:32] if boot else ident


def instance_id(state_dir: Path) -> str:
    """What the agent sends as its name (`schemas.agent.AGENT_HEADER`): its id (`agent_id`) bound
    to this host's boot (`boot_id`), so a copy of the state directory or of its `agent-id` file
    on another machine (a cloned disk, a VM from a template) is another agent: it reported the
    node's live job lost and launched the next job beside the real node's (atk39-23 F4). After
    a reboot too: it says so (`this_boot`), and the server judges whether to believe it."""
    return bound(agent_id(state_dir), boot_id())


@dataclass(frozen=True)
class Boot:
    """This agent on this boot (`this_boot`)."""

    instance: str
    """Its name now (`instance_id`)."""
    previous: str = ""
    """Its name on the boot its state directory last registered under, when that was another
    boot of this host ("" when the same boot, or none is recorded)."""
    boot: str = ""
    """This host's boot id (`remember_boot` records it)."""
    uptime_s: float | None = None
    recorded: str = ""
    """The boot id its state directory last registered under, when another than `boot`."""

    def rebooted_header(self) -> str:
        """Pure: the `REBOOTED_HEADER` value (`<previous name> <seconds since boot>`), "" when
        there is nothing to say (no reboot, or an uptime not known)."""
        if not self.previous or self.uptime_s is None:
            return ""
        return f"{self.previous} {self.uptime_s:.1f}"

    def not_rebooted(self) -> Boot:
        """Pure: this agent as it was on the boot its state directory recorded, when the boot
        id read now is not to be believed: a part of a run it adopted is alive (its supervisor
        or leader, pid and /proc start time as recorded), which no reboot leaves (atk43 F2: a
        sandbox or a restore that changes the boot id, or a wrong `GPULEDGER_AGENT_PROC`). It
        claims no reboot, goes on under the name the server knows, and records no new boot."""
        if not self.previous:
            return self
        return Boot(self.previous, "", self.recorded)


def this_boot(state_dir: Path) -> Boot:
    """Who this agent is now, and who it was on the boot its state directory last registered
    under (`BOOT_FILE`, `remember_boot`), if that was another boot."""
    ident, boot = agent_id(state_dir), boot_id()
    recorded = _recorded_boot(state_dir)
    rebooted = bool(recorded and boot and recorded != boot)
    previous = bound(ident, recorded) if rebooted else ""
    return Boot(bound(ident, boot), previous, boot, uptime_s() if rebooted else None,
                recorded if rebooted else "")  # fmt: skip


def _recorded_boot(state_dir: Path) -> str:
    """The boot id `remember_boot` recorded ("" when none, or not a file of this account's)."""
    try:
        fd = os.open(state_dir / BOOT_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return ""
        return f.read(100).strip()


def remember_boot(state_dir: Path, boot: str) -> None:
    """Record the boot this agent registered under (once the server took it as the node's
    agent): the next start on another boot says it rebooted."""
    if boot and _recorded_boot(state_dir) != boot:
        write_atomic(state_dir / BOOT_FILE, f"{boot}\n".encode(), mode=0o600)
