"""A job part's process tree: every process it started, found, signalled and killed as one. An edge.

Like Slurm's `proctrack/cgroup`, a job is its cgroup, not its leader: a child that outlives the
leader, or calls `setsid` to leave its session, is still the job's, and stopping the job stops
it. `Containment.probe` says what the host offers; `Tree` uses the best of it:

- **cgroup v2** (a `cgroup2` mount): a group per part for tracking (`cgroup.procs`,
  `cgroup.events` populated) and `cgroup.kill` (SIGKILL to every process at once);
- **cgroup v1** `freezer` (kill a frozen tree: nothing forks meanwhile), `pids` (tracking) and
  `devices` (like Slurm's `ConstrainDevices`: the part may open only its own GPUs' device files,
  major 195 = NVIDIA; the other GPUs' minors are denied);
- without the v1 `devices` controller (every cgroup-v2-only host), the same rule as a BPF device
  program on the part's v2 group (`ledger.engines.gpu_bpf`), when the kernel lets us attach one
  (the probe tries); when it does not, GPU device files are open to every job and `describe`
  and `gpus_open` say so, with the kernel's reason;
- neither (not root, or no writable hierarchy): the part's **session**: the job starts in a new
  session and its processes are those of that session id (a child that calls `setsid` escapes;
  the fallback says so).

Groups live under `<mount>/gpuledger/<scope>/<run>` (one scope per executor state directory).
A process is put in the groups by its parent *before* it forks the job (the supervisor joins
them for the length of one `fork`, then leaves), so no child is ever born outside.

It imports only the standard library (and `gpu_bpf`, which does too): the per-part supervisor
uses it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ledger.engines import gpu_bpf
from ledger.engines.gpu_bpf import GPU_MINORS, NVIDIA_MAJOR

OPEN = "GPU devices open: a job may use GPUs it was not given"
V1_CONTROLLERS = ("freezer", "pids", "devices")
TOP = "gpuledger"


@dataclass(frozen=True)
class Containment:
    """What this host offers for holding a job's processes (`probe`)."""

    v2: str = ""
    """The cgroup v2 mount point ("" when none is writable)."""
    v1: tuple[tuple[str, str], ...] = ()
    """(controller, mount point) of the writable v1 controllers among freezer, pids, devices."""
    why_not: str = ""
    """Why no cgroup is used, when none is."""
    bpf: bool = False
    """The v2 group confines GPU device files with a BPF program (no v1 `devices` here, and
    the probe attached one)."""
    bpf_why_not: str = ""
    """Why no BPF device program is used on the v2 group, when it is not (the kernel's answer)."""

    @property
    def cgroups(self) -> bool:
        return bool(self.v2 or self.v1)

    def mount(self, controller: str) -> str:
        return next((m for c, m in self.v1 if c == controller), "")

    @property
    def gpus_open(self) -> str:
        """Empty when a part can open only its own GPUs' device files; else the warning, with the
        reason (the agent logs it at start)."""
        if self.mount("devices") or (self.v2 and self.bpf):
            return ""
        if not self.cgroups:
            why = f"no cgroup: {self.why_not}"
        elif self.v2:
            why = f"no cgroup v1 devices controller, {self.bpf_why_not or 'no BPF device program'}"
        else:
            why = "no cgroup v1 devices controller and no cgroup v2"
        return f"{OPEN} ({why})"

    def describe(self) -> str:
        """One line for `agent status` and the logs."""
        if not self.cgroups:
            return f"session and process group (no cgroup: {self.why_not}); {OPEN}"
        parts = []
        if self.v2:
            parts.append("cgroup v2 (tracking, cgroup.kill)")
        if self.v1:
            parts.append("cgroup v1 " + ", ".join(c for c, _ in self.v1))
        if self.mount("devices"):
            devices = "GPU devices constrained (cgroup v1 devices)"
        elif not self.gpus_open:
            devices = "GPU devices constrained (cgroup v2 BPF device program)"
        else:
            devices = self.gpus_open
        return " + ".join(parts) + f"; {devices}"

    def to_json(self) -> dict[str, object]:
        return {"v2": self.v2, "v1": [list(x) for x in self.v1], "why_not": self.why_not,
                "bpf": self.bpf, "bpf_why_not": self.bpf_why_not}  # fmt: skip

    @classmethod
    def from_json(cls, data: object) -> Containment:
        if not isinstance(data, dict):
            return cls(why_not="not recorded")
        v1 = tuple((str(c), str(m)) for c, m in data.get("v1", ()))
        return cls(
            v2=str(data.get("v2", "")),
            v1=v1,
            why_not=str(data.get("why_not", "")),
            bpf=data.get("bpf") is True,
            bpf_why_not=str(data.get("bpf_why_not", "")),
        )

    @classmethod
    def probe(cls, mountinfo: str = "/proc/self/mountinfo", *, use: bool = True) -> Containment:
        """The writable cgroup hierarchies of this host (each checked by making and removing a
        group under `gpuledger/`). `use=False`: the session fallback on purpose (tests)."""
        if not use:
            return cls(why_not="turned off")
        if os.geteuid() != 0:
            return cls(why_not="not root")
        try:
            text = Path(mountinfo).read_text()
        except OSError as err:
            return cls(why_not=f"cannot read {mountinfo}: {err.strerror}")
        v2 = ""
        v1: list[tuple[str, str]] = []
        for line in text.splitlines():
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 3:
                continue
            mount, fstype, options = fields[4], rest[0], rest[2].split(",")
            if fstype == "cgroup2" and not v2 and _writable(mount):
                v2 = mount
            elif fstype == "cgroup":
                for ctl in V1_CONTROLLERS:
                    if ctl in options and ctl not in dict(v1) and _writable(mount):
                        v1.append((ctl, mount))
        v1.sort(key=lambda x: V1_CONTROLLERS.index(x[0]))
        why = "" if v2 or v1 else "no writable cgroup hierarchy"
        bpf_why = "" if not v2 or "devices" in dict(v1) else _bpf_refused(v2)
        bpf = bool(v2) and "devices" not in dict(v1) and not bpf_why
        return cls(v2=v2, v1=tuple(v1), why_not=why, bpf=bpf, bpf_why_not=bpf_why)


def _bpf_refused(mount: str) -> str:
    """Why a BPF device program cannot be attached under `mount`/gpuledger ("" when it can):
    tried on a scratch group, removed at once."""
    probe = Path(mount) / TOP / f".probe-bpf-{os.getpid()}"
    try:
        probe.mkdir(exist_ok=True)
    except OSError as err:
        return f"cannot make {probe}: {err.strerror}"
    try:
        said = gpu_bpf.check(probe)
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return f"the kernel refused a BPF device program: {said}" if said else ""


def _writable(mount: str) -> bool:
    top = Path(mount) / TOP
    try:
        top.mkdir(exist_ok=True)
        probe = top / f".probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError:
        return False
    return True


def _read_pids(path: Path) -> set[int]:
    try:
        return {int(x) for x in path.read_text().split()}
    except (OSError, ValueError):
        return set()


def _session_of(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None  # a zombie holds nothing: it only waits for its parent to reap it
    return int(fields[3])


@dataclass
class Tree:
    """One part's processes (module doc). `name` is the group's path under `gpuledger/`
    ("" for none); `sid` the session of the fallback (the leader's pid)."""

    name: str
    containment: Containment
    sid: int | None = None
    dirs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.name and not self.dirs:
            mounts = [self.containment.v2] if self.containment.v2 else []
            mounts += [m for _, m in self.containment.v1]
            self.dirs = [Path(m) / TOP / self.name for m in mounts]

    @property
    def grouped(self) -> bool:
        return bool(self.name and self.containment.cgroups)

    # --- making ----------------------------------------------------------------------------------

    def create(self, own_gpus: Iterable[int] = (), constrain: bool = True) -> None:
        """Make the groups (idempotent) and deny every NVIDIA GPU minor but `own_gpus`: with the
        v1 devices controller, else with a BPF device program on the v2 group (attached here,
        once per part: the supervisor calls this once, before the leader is born)."""
        if not self.grouped:
            return
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        devices = self.containment.mount("devices")
        if not devices and constrain and self.containment.v2 and self.containment.bpf:
            gpu_bpf.attach(self.dirs[0], own_gpus)
        elif devices and constrain:
            own = set(own_gpus)
            deny = Path(devices) / TOP / self.name / "devices.deny"
            with open(deny, "w") as f:  # one write per rule, as the controller reads them
                for minor in range(GPU_MINORS):
                    if minor not in own:
                        f.write(f"c {NVIDIA_MAJOR}:{minor} rwm")
                        f.flush()

    def join(self, pid: int = 0) -> list[str]:
        """Move `pid` (0: the caller) into every group; returns the groups it left (for
        `leave`)."""
        if not self.grouped:
            return []
        pid = pid or os.getpid()
        before = _groups_of(pid)
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))
        return before

    def leave(self, before: list[str], pid: int = 0) -> None:
        """Move `pid` (0: the caller) back into the groups it was in before `join`."""
        if not self.grouped:
            return
        pid = pid or os.getpid()
        for d in self.dirs:
            mount = d.parent.parent
            target = _where(before, mount, self.containment)
            with contextlib.suppress(OSError):
                (target / "cgroup.procs").write_text(str(pid))

    def remove(self) -> bool:
        """Remove the groups once empty; True when none is left."""
        if not self.grouped:
            return True
        left = False
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                continue
            except OSError as err:
                left = left or err.errno == errno.EBUSY
        return not left

    # --- looking ---------------------------------------------------------------------------------

    def pids(self) -> set[int]:
        """Every live process of the part (zombies excluded: they hold nothing)."""
        if self.grouped:
            found: set[int] = set()
            for d in self.dirs:
                found |= _read_pids(d / "cgroup.procs")
            return {p for p in found if _session_of(p) is not None}
        if self.sid is None:
            return set()
        out = set()
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and _session_of(int(entry.name)) == self.sid:
                out.add(int(entry.name))
        return out

    def empty(self) -> bool:
        return not self.pids()

    # --- stopping --------------------------------------------------------------------------------

    def signal(self, sig: int) -> int:
        """Send `sig` to every process of the part; how many got it."""
        n = 0
        for pid in sorted(self.pids()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                n += 1
        return n

    def kill(self) -> int:
        """SIGKILL every process of the part, without letting it fork meanwhile where the host
        allows (cgroup.kill, or a frozen v1 freezer group); how many were alive."""
        alive = self.pids()
        if not alive:
            return 0
        if self.grouped and self.containment.v2:
            with contextlib.suppress(OSError):
                (self.dirs[0] / "cgroup.kill").write_text("1")
                return len(alive)
        freezer = self.containment.mount("freezer")
        if self.grouped and freezer:
            state = Path(freezer) / TOP / self.name / "freezer.state"
            with contextlib.suppress(OSError):
                state.write_text("FROZEN")
                deadline = time.monotonic() + 1.0
                while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
                    time.sleep(0.01)
            self.signal(signal.SIGKILL)
            with contextlib.suppress(OSError):
                state.write_text("THAWED")
            return len(alive)
        for _ in range(20):  # a process may fork between the listing and the kill
            if not self.signal(signal.SIGKILL):
                break
        return len(alive)


def _groups_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []


def _where(groups: list[str], mount: Path, c: Containment) -> Path:
    """The group of `mount`'s hierarchy a process was in (a line of /proc/PID/cgroup)."""
    controller = next((ctl for ctl, m in c.v1 if Path(m) == mount), None)
    for line in groups:
        _, controllers, path = line.split(":", 2)
        if (controller is None and controllers == "") or (
            controller is not None and controller in controllers.split(",")
        ):
            return mount / path.lstrip("/")
    return mount


def wait_empty(tree: Tree, timeout_s: float, every_s: float = 0.05) -> bool:
    """Wait until the tree is empty, at most `timeout_s`; True when it is."""
    deadline = time.monotonic() + timeout_s
    while True:
        if tree.empty():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
