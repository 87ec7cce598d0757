"""Slurm's words, read and written: `scontrol -o` records, hostlists, GRES strings, job and
node states, `scontrol show config`; `sbatch` arguments and the batch script.

Pure: text in, values out (the executor in `ledger.engines.slurm.executor` runs the commands).

How a run is named: job name `gpuledger-<job id>`, comment `gpuledger:<ledger>:job=<job id>:run=<n>`
(and `:grace=<s>`, the job's own grace)
(`ledger` = the first 12 hex digits of the ledger's first event id, so two ledgers never take each
other's runs; n = the job's placement number, its preemptions so far). After any restart the
executor finds its runs by that name in Slurm, never from memory.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ledger.cycle.executor import Launch, NodeChange
from schemas import commands as c
from schemas.errors import InvalidCommand
from schemas.events import AnyEvent, EndReason

if TYPE_CHECKING:
    from ledger.core.state import Node

_TAG = re.compile(r"^gpuledger:(\w+):job=(\d+):run=(\d+)(?::grace=(\d+))?$")
"""A run's comment; `grace=` (whole seconds) when its job has a grace of its own, so a service
that restarts while the run stops keeps it (the live state holds no finished job)."""
HOLDING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING"})
"""Job states in which a Slurm job holds its GPUs."""
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
_REASONS: dict[str, EndReason] = {
    "COMPLETED": "exited",
    "FAILED": "exited",
    "TIMEOUT": "time_limit",
    "DEADLINE": "time_limit",
    "NODE_FAIL": "node_failure",
    "BOOT_FAIL": "node_failure",
    "CANCELLED": "cancelled",
    "PREEMPTED": "cancelled",
    "OUT_OF_MEMORY": "out_of_memory",
}
ENDED = frozenset(_REASONS)
NEVER_STARTS = frozenset(
    {
        "PartitionTimeLimit",
        "PartitionNodeLimit",
        "PartitionConfig",
        "BadConstraints",
        "AccountNotAllowed",
        "InvalidAccount",
        "InvalidQOS",
        "QOSMaxWallDurationPerJobLimit",
    }
)
"""Reasons of a pending Slurm job that mean it will not start as it is (`squeue`'s REASON)."""
_NODE_BAD = ("DRAIN", "DOWN", "FAIL", "MAINT", "INVALID", "REBOOT", "POWER")
DRAIN_PREFIX = "slurm:"
"""Drain and lost reasons the executor writes start with this; it returns only nodes it took out
of service itself."""


# --- reading Slurm ------------------------------------------------------------------------------


def parse_record(line: str) -> dict[str, str]:
    """Pure: one `scontrol -o show ...` line as key -> value. A token without `=` continues the
    previous value (values such as Reason or Comment may hold spaces). Repeated keys (the
    per-node `Nodes=... GRES=...` pairs of `-d`) keep the first value; `node_gres` reads those."""
    out: dict[str, str] = {}
    key = ""
    for token in line.split(" "):
        k, eq, v = token.partition("=")
        if eq and k and k.replace("/", "").replace(":", "").replace("_", "").isalnum():
            key = k
            if key not in out:
                out[key] = v
            continue
        if key and token and key in out:
            out[key] += " " + token
    return out


def node_gres(line: str) -> dict[str, tuple[int, ...]]:
    """Pure: the GPU indices per node of a `scontrol -d -o show job` line
    (`Nodes=n[1-2] CPU_IDs=0 Mem=0 GRES=gpu:fake:2(IDX:0-1)`)."""
    out: dict[str, tuple[int, ...]] = {}
    for m in re.finditer(r"(?:^| )Nodes=(\S+) .*?GRES=(\S*)", line):
        indices = gres_indices(m.group(2))
        for node in expand_hostlist(m.group(1)):
            out[node] = indices
    return out


def expand_hostlist(text: str) -> list[str]:
    """Pure: Slurm's hostlist syntax (`a[1-3,5],b`) as names."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if m is None:
            if part and part != "(null)":
                names.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{prefix}{str(i).zfill(len(lo))}{suffix}")
    return names


def gres_indices(gres: str) -> tuple[int, ...]:
    """Pure: the GPU indices of a GRES string (`gpu:fake:2(IDX:0,2-3)` -> (0, 2, 3))."""
    out: list[int] = []
    for m in re.finditer(r"gpu[^(,]*\(IDX:([0-9,\-]*)\)", gres):
        for r in m.group(1).split(","):
            if not r:
                continue
            lo, _, hi = r.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(set(out)))


_GPU_GRES = re.compile(r"(?:^|,)gpu(?::([A-Za-z][\w.-]*))?:(\d+)")


def gpus_of(gres: str) -> tuple[int, str]:
    """Pure: (GPU count, GPU type) of a node's Gres (`gpu:h100:8(S:0-1)`, `gpu:4`); type "gpu"
    when Slurm names none. Several GPU kinds on one node: the count is their sum, the type the
    first one's. A node whose GPUs are pinned (`pinned_types`) has the type before the index."""
    count, kind = 0, ""
    for m in _GPU_GRES.finditer(gres):
        count += int(m.group(2))
        kind = kind or (m.group(1) or "gpu")
    if pinned_types(gres):
        kind = kind.rpartition("_")[0]
    return count, kind or "gpu"


def pinned_types(gres: str) -> tuple[str, ...]:
    """Pure: a node's GPUs each their own GRES type, named `<type>_<index>` with one GPU each
    (`gpu:h100_0:1,gpu:h100_1:1,...`, docs/slurm.md): the type of each index 0, 1, ..., so an
    sbatch can ask for exactly the GPUs the ledger chose. () when the node's GPUs are not all so
    named (Slurm then hands out the lowest free indices, which the executor reads back)."""
    found: dict[int, str] = {}
    for m in _GPU_GRES.finditer(gres):
        kind, count = m.group(1) or "", int(m.group(2))
        head, _, index = kind.rpartition("_")
        if count != 1 or not head or not index.isdigit() or int(index) in found:
            return ()
        found[int(index)] = kind
    if not found or sorted(found) != list(range(len(found))):
        return ()
    return tuple(found[i] for i in range(len(found)))


def exit_code(text: str) -> int:
    """Pure: Slurm's `ExitCode=status:signal` as one code (128 + signal when killed by one)."""
    status, _, sig = text.partition(":")
    st = int(status) if status.isdigit() else 0
    sg = int(sig) if sig.isdigit() else 0
    return st if st or not sg else 128 + sg


def exit_signal(text: str) -> int:
    """Pure: the signal of Slurm's `ExitCode=status:signal` (0: none): the signal that killed
    the batch script itself (a command a signal killed makes its script exit 128 + N, `:0`)."""
    sig = text.partition(":")[2]
    return int(sig) if sig.isdigit() else 0


def end_reason(state: str) -> EndReason:
    """Pure: why a Slurm job state ended a run."""
    return _REASONS.get(state.split()[0].rstrip("+"), "exited")


def node_unavailable(state: str) -> bool:
    """Pure: whether a Slurm node state (`IDLE+DRAIN`, `DOWN*`, `MIXED`) takes no new work."""
    return any(flag in state.upper() for flag in _NODE_BAD)


def node_unresponsive(state: str) -> bool:
    """Pure: whether Slurm has lost contact with a node's slurmd (`IDLE*`, `MIXED+NOT_RESPONDING`)
    without giving it up: what runs there cannot be observed (or stopped) now."""
    s = state.upper()
    return "NOT_RESPONDING" in s or s.split("+")[0].endswith("*")


def node_down(state: str) -> bool:
    """Pure: whether Slurm has given a node up (`DOWN`, `DOWN*`, `DOWN+DRAIN`): Slurm ends the
    jobs on it (NODE_FAIL), so the ledger records the node lost. A node that only stops
    responding (`IDLE*`, `MIXED+NOT_RESPONDING`) keeps its jobs and is left as it is until Slurm
    gives it up (`SlurmdTimeout`), so a `slurmd` restart neither ends nor drains anything; one an
    admin marks FAIL keeps its jobs running and is drained."""
    return state.upper().split("+")[0].rstrip("*~#!%$@^-") == "DOWN"


@dataclass(frozen=True)
class SlurmJob:
    """One Slurm job as `scontrol -d -o show job` shows it."""

    slurm_id: str
    name: str
    state: str
    partition: str
    comment: str = ""
    exit_code: int = 0
    reason: str = ""
    started: bool = False
    gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    start_time: float | None = None
    """Slurm's StartTime once it has started (None before, or when unreadable)."""
    end_time: float | None = None
    """Slurm's EndTime once it has ended."""
    job_gres: str = ""
    """Slurm's JOB_GRES (`gpu:h100_0:1,gpu:h100_1:0`), kept after the job ended, when `-d`'s
    per-node GRES (IDX) is gone."""
    nodes: str = ""
    """Slurm's NodeList."""
    logs: tuple[str, ...] = ()
    """Its StdOut (and StdErr when another file): a run adopted after a restart keeps them."""
    exit_signal: int = 0
    """`ExitCode`'s second part: the signal that killed its batch script (0: none)."""
    het_job_id: str = ""
    """Its heterogeneous job's id (`HetJobId`, its first component's), "" for any other job."""
    time_limit: str = ""  # Slurm's TimeLimit, as shown: its `--time` (`slurm_duration`)

    def tag(self, ledger_id: str) -> tuple[int, int] | None:
        """(job id, run) for a run this ledger submitted; None for a foreign job."""
        m = _TAG.match(self.comment)
        if m is None or m.group(1) != ledger_id or self.name != f"gpuledger-{m.group(2)}":
            return None
        return int(m.group(2)), int(m.group(3))

    @property
    def grace_s(self) -> float | None:
        """Its job's own grace as its comment says (`submit --grace`); None: none said."""
        m = _TAG.match(self.comment)
        return None if m is None or m.group(4) is None else float(m.group(4))

    @property
    def het_component(self) -> bool:
        """A later component of a heterogeneous job (`sbatch ... : ...`): part of its first."""
        return bool(self.het_job_id) and self.het_job_id != self.slurm_id

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def launch_failed(self) -> bool:
        """Slurm could not launch it (`Reason=JobLaunchFailure`, exit `0:53`: its working
        directory or output file): its command never ran."""
        launch = self.reason.split()[0:1] == ["JobLaunchFailure"]
        return self.ended and launch and self.exit_code == 128 + 53

    @property
    def holding(self) -> bool:
        return self.state in HOLDING

    @property
    def script_killed(self) -> bool:
        """Whether a signal killed its batch script (`ExitCode=N:S`, S > 1): the script wrote
        no end record then. `0:1` is Slurm's own code of a batch job a returning slurmctld
        found missing from its node (a wait status of 1; the script traps SIGHUP, so never
        dies of it), whose end record is its word (atk42-24 F2)."""
        return self.exit_signal > 1


def parse_jobs(text: str, known: dict[str, SlurmJob] | None = None) -> list[SlurmJob]:
    """Pure but for `known`: the jobs of `scontrol -d -o show job` output. `known` (line ->
    job) keeps what the last read parsed, so a line that has not changed (an ended job kept for
    MinJobAge: most of them) is not parsed again; it is replaced by this read's lines. (Parsing
    900 lines took ~250 ms of the service's cycle, half of it `strptime`.)"""
    jobs = []
    seen: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        job = known.get(line) if known is not None else None
        seen[line] = job = job or _parse_job(line)
        jobs.append(job)
    if known is not None:
        known.clear()
        known.update(seen)
    return jobs


def _parse_job(line: str) -> SlurmJob:
    """Pure: one line of `scontrol -d -o show job`."""
    rec = parse_record(line)
    return SlurmJob(
        slurm_id=rec["JobId"],
        name=rec.get("JobName", ""),
        state=rec.get("JobState", "").split()[0] if rec.get("JobState") else "",
        partition=rec.get("Partition", ""),
        comment=(rec.get("Comment") or "").strip(),
        exit_code=exit_code(rec.get("ExitCode", "0:0")),
        exit_signal=exit_signal(rec.get("ExitCode", "0:0")),
        het_job_id=rec.get("HetJobId", ""),
        reason=rec.get("Reason", ""),
        time_limit=rec.get("TimeLimit", ""),
        started=rec.get("StartTime", "Unknown") not in ("Unknown", "None", "")
        and rec.get("JobState") not in WAITING,
        gpus=node_gres(line),
        start_time=slurm_time(rec.get("StartTime", "")),
        end_time=slurm_time(rec.get("EndTime", "")),
        job_gres=rec.get("JOB_GRES", "").strip(),
        nodes=rec.get("NodeList", ""),
        logs=tuple(
            dict.fromkeys(p for k in ("StdOut", "StdErr") if (p := rec.get(k)) and p != "/dev/null")
        ),
    )


def ended_gpus(j: SlurmJob, pinned: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[int, ...]]:
    """Pure: the GPU indices an ended one-node job held, from its JOB_GRES on a node whose GPUs
    are pinned (`gpu:h100_2:1` is index 2): what Slurm still says once `-d`'s IDX is gone; {}
    when its record cannot say."""
    nodes = expand_hostlist(j.nodes)
    types = pinned.get(nodes[0], ()) if len(nodes) == 1 else ()
    held = [
        types.index(m.group(1))
        for m in _GPU_GRES.finditer(j.job_gres)
        if m.group(1) in types and int(m.group(2)) > 0
    ]
    return {nodes[0]: tuple(sorted(held))} if held else {}


def held_gpus(j: SlurmJob, pinned: Mapping[str, tuple[str, ...]]) -> Mapping[str, tuple[int, ...]]:
    """Pure: the GPU indices a Slurm job holds now, by node ({} for none). Running, configuring
    (an allocation whose PrologSlurmctld runs or whose nodes boot) or pending with an
    allocation, `scontrol -d` lists them; a COMPLETING job (it ended, or a requeue is releasing
    its allocation: its processes may live until KillWait) no longer does, but still holds what
    its JOB_GRES says on a node with pinned GPU types (`ended_gpus`)."""
    if j.ended or (not j.holding and not any(j.gpus.values())):
        return {}
    if any(j.gpus.values()):
        return j.gpus
    return ended_gpus(j, pinned) if j.state == "COMPLETING" else {}


def slurm_time(text: str) -> float | None:
    """Pure but for the machine's time zone (Slurm writes local time, as this host's clock
    reads it): `2026-12-01T18:20:05` as seconds since the epoch; None for `Unknown`, `None` or
    anything else."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def slurm_duration(text: str) -> float | None:
    """Pure: a Slurm duration (`MaxTime`: `[D-]HH:MM:SS`, `MM:SS`, minutes) in seconds; None for
    `UNLIMITED`, `INFINITE`, `NONE` or anything else."""
    days, _, rest = text.strip().rpartition("-")
    try:
        parts = [int(x) for x in rest.split(":")]
        d = int(days) if days else 0
    except ValueError:
        return None
    if not parts or len(parts) > 3 or any(x < 0 for x in parts):
        return None
    if len(parts) == 1:  # minutes
        return float(d * 86400 + parts[0] * 60)
    h, m, sec = [0] * (3 - len(parts)) + parts
    return float(d * 86400 + h * 3600 + m * 60 + sec)


def partition_max_time(text: str, partition: str) -> float | None:
    """Pure: the partition's `MaxTime` in seconds from `scontrol -o show partition P` output;
    None when unlimited or not found."""
    for line in text.splitlines():
        if line.startswith("PartitionName="):
            rec = parse_record(line)
            if rec.get("PartitionName") == partition:
                return slurm_duration(rec.get("MaxTime", ""))
    return None


def partition_state(text: str, partition: str) -> str:
    """Pure: the partition's `State` (UP, DOWN, DRAIN, INACTIVE) from `scontrol -o show
    partition P` output; "UP" when unsaid (Slurm's default) or not found."""
    for line in text.splitlines():
        if line.startswith("PartitionName="):
            rec = parse_record(line)
            if rec.get("PartitionName") == partition:
                return rec.get("State", "") or "UP"
    return "UP"


@dataclass(frozen=True)
class SlurmNode:
    name: str
    gpus: int
    gpu_type: str
    state: str
    reason: str = ""
    pinned: tuple[str, ...] = ()
    """The GRES type of each GPU index when each is its own (`pinned_types`); () otherwise."""
    gres_used: tuple[int, ...] = ()
    """The GPU indices Slurm counts allocated on the node (`GresUsed`, `scontrol -d`)."""
    slurmd_start: float | None = None
    """When its slurmd last started (`SlurmdStartTime`; `stops.slurmd_restarted`)."""

    @property
    def unavailable(self) -> bool:
        return node_unavailable(self.state)

    @property
    def down(self) -> bool:
        return node_down(self.state)

    @property
    def unresponsive(self) -> bool:
        return node_unresponsive(self.state)


def parse_nodes(text: str, partition: str) -> list[SlurmNode]:
    """Pure: the GPU nodes of `partition` in `scontrol -o show node` output."""
    out = []
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        rec = parse_record(line)
        if partition not in rec.get("Partitions", "").split(","):
            continue
        gpus, kind = gpus_of(rec.get("Gres", ""))
        if gpus == 0:
            continue
        out.append(
            SlurmNode(
                name=rec["NodeName"],
                gpus=gpus,
                gpu_type=kind,
                state=rec.get("State", ""),
                reason=(rec.get("Reason") or "").strip(),
                pinned=pinned_types(rec.get("Gres", "")),
                gres_used=gres_indices(rec.get("GresUsed", "")),
                slurmd_start=slurm_time(rec.get("SlurmdStartTime", "")),
            )
        )
    return sorted(out, key=lambda n: n.name)


UNLISTED = f"{DRAIN_PREFIX} not in the partition (another cluster's node, or taken out of it)"
"""Why a node of the ledger that Slurm does not list is drained (`node_changes`)."""


def node_changes(
    slurm: Iterable[SlurmNode], ledger: Mapping[str, Node], fence_s: float = 0.0
) -> list[NodeChange]:
    """Pure: the node changes that make the ledger's nodes follow Slurm's, with reasons starting
    "slurm:": a node Slurm marks DOWN is lost in the ledger (its jobs end there and then); a node
    that takes no new work otherwise (DRAIN, FAIL, MAINT, ...) is drained; a node Slurm
    takes back is returned if the ledger took it out of service for Slurm (a drain an admin made
    in the ledger is not Slurm's to undo). A node the ledger lost for Slurm that Slurm now drains
    is returned first and drained on the next look. Nodes the ledger does not know are left to
    `register_commands`. A node of the ledger Slurm does not list in the partition (while it
    lists some) is drained: nothing is placed where sbatch cannot go (after `--new-settings`
    onto another cluster, the old one's nodes took jobs that waited there for good: atk44ha
    F2); Slurm listing it again returns it. The jobs placed on such a node and not started go
    back to the queue (`unplace`, at every read: one placed there before the drain waited
    there for good; issue 28)."""
    slurm = list(slurm)
    listed = {n.name for n in slurm}
    gone = ("removed", "lost")
    unlisted = [(name, have) for name, have in sorted(ledger.items())
                if slurm and name not in listed and have.state not in gone]  # fmt: skip
    out: list[NodeChange] = [NodeChange(name, "drain", UNLISTED) for name, have in unlisted
                             if have.state == "active"]  # fmt: skip
    out += [NodeChange(name, "unplace", UNLISTED) for name, _ in unlisted]
    for n in slurm:
        have = ledger.get(n.name)
        if have is None or have.state == "removed":
            continue
        why = f"{DRAIN_PREFIX} {n.state}" + (f" ({n.reason})" if n.reason else "")
        ours = (have.lost_reason if have.state == "lost" else have.drain_reason).startswith(
            DRAIN_PREFIX
        )
        if n.down and have.state != "lost":
            out.append(NodeChange(n.name, "lost", why, fence_s))
        elif n.down:
            continue
        elif n.unavailable and have.state == "active":
            out.append(NodeChange(n.name, "drain", why))
        elif ours and (
            have.state == "lost" or (not n.unavailable and have.state in ("draining", "drained"))
        ):
            out.append(NodeChange(n.name, "return"))
    return out


def register_commands(
    slurm: Iterable[SlurmNode], ledger: Mapping[str, Node], actor: str
) -> list[c.AnyCommand]:
    """Pure: RegisterNode for each GPU node of the partition the ledger does not have."""
    return [
        c.RegisterNode(actor=actor, node=n.name, gpus=n.gpus, gpu_type=n.gpu_type)
        for n in slurm
        if (have := ledger.get(n.name)) is None or have.state == "removed"
    ]


UNTRACKED_OK = "GPULEDGER_SLURM_UNTRACKED_OK"
"""Set to 1 to run on a cluster whose ProctrackType cannot follow a job's whole process tree
(docs/slurm.md, 'Partition settings'): a job's orphaned children may then outlive its record."""


def check_config(config: str, partition: str, untracked_ok: bool = False) -> list[str]:
    """Pure: why Slurm's settings (`scontrol show config` and `scontrol -o show partition P`
    output, concatenated) would let Slurm reorder or preempt gpu-ledger's decisions, or let a
    job's processes outlive its Slurm job (ProctrackType other than proctrack/cgroup, unless
    `untracked_ok`); [] if none."""
    values: dict[str, str] = {}
    for line in config.splitlines():
        k, eq, v = line.partition("=")
        if eq and not line.startswith("PartitionName="):
            values[k.strip()] = v.strip()
    part = next(
        (parse_record(ln) for ln in config.splitlines() if ln.startswith("PartitionName=")), None
    )
    problems = []
    if part is None or part.get("PartitionName") != partition:
        problems.append(f"Slurm has no partition {partition!r}")
    # (a partition an admin paused, State not UP, is no refusal: the executor starts with it
    # paused, as a running one follows a pause, `paused`; atk60-slurm F1)
    priority = values.get("PriorityType", "")
    if priority != "priority/basic":
        problems.append(
            f"PriorityType is {priority or 'unset'}: Slurm would reorder the jobs gpu-ledger "
            "placed; set PriorityType=priority/basic"
        )
    preempt = values.get("PreemptType", "preempt/none")
    mode = (part or {}).get("PreemptMode", "OFF")
    if preempt != "preempt/none" and mode.upper() != "OFF":
        problems.append(
            f"PreemptType is {preempt} and partition {partition!r} has PreemptMode={mode}: "
            "Slurm would preempt on its own; set PreemptType=preempt/none or PreemptMode=OFF"
        )
    proctrack = values.get("ProctrackType", "")
    if proctrack != "proctrack/cgroup" and not untracked_ok:
        problems.append(
            f"ProctrackType is {proctrack or 'unset'}: Slurm loses a job's processes that leave "
            "its process group or are re-parented to init, and the ledger would give their GPUs "
            f"to other work; set ProctrackType=proctrack/cgroup (or {UNTRACKED_OK}=1 to accept it)"
        )
    if values.get("Epilog", "(null)") in ("", "(null)") and not untracked_ok:
        problems.append(
            "Epilog is unset: nothing ends a job's processes Slurm's proctrack misses (a child "
            "in a sub-cgroup of its step, what a batch script killed with its slurmstepd left) "
            "before Slurm starts the next job on their GPUs; set Epilog= to gpu-ledger's "
            f"ledger/engines/slurm/epilog.sh on every node (or {UNTRACKED_OK}=1 to accept it)"
        )
    return problems


EPILOG_MARK = "gpuledger-epilog"
"""A word of gpu-ledger's epilog (`epilog.sh`, its syslog tag): an Epilog file the service can
read that lacks it is likely not gpu-ledger's (`epilog_note`)."""


def epilog_note(config: str, read: Callable[[str], str | None]) -> str:
    """Pure but for `read` (a file's text, None when this host cannot read it): one warning
    line when Slurm's `Epilog` (`scontrol show config`) is a file this host reads that does not
    hold gpu-ledger's epilog (`EPILOG_MARK`: a site's own epilog that calls it from another
    file says it too); "" otherwise (unset is `check_config`'s refusal; a file only the
    compute nodes have cannot be checked from here)."""
    path = next((v.strip() for k, eq, v in (ln.partition("=") for ln in config.splitlines())
                 if eq and k.strip() == "Epilog"), "")  # fmt: skip
    text = None if path in ("", "(null)") else read(path)
    if text is None or EPILOG_MARK in text:
        return ""
    return (
        f"Slurm's Epilog {path} does not look like gpu-ledger's (no {EPILOG_MARK!r} in it): "
        "the processes of a job Slurm's proctrack misses may outlive it beside the next job "
        "(docs/slurm.md, 'Site requirement: the epilog')"
    )


@dataclass(frozen=True)
class SbatchUser:
    """Who an sbatch runs its job as: `--uid`/`--gid` (None: the service's own account) and
    the account's HOME, USER, LOGNAME and SHELL, which the job gets as sbatch gives them."""

    uid: int | None = None
    gid: int | None = None
    name: str = ""
    home: str = ""
    shell: str = ""


def slurm_path(path: str) -> str:
    """Pure: a file name as `sbatch -o/-e/-D` read it, the ledger's own patterns already
    written out: a literal `%` is `%%` (Slurm would expand `%j` and the like again)."""
    return path.replace("%", "%%")


def sbatch_args(
    job: Launch,
    partition: str,
    log_path: Path | str,
    who: SbatchUser,
    ledger_id: str,
    pinned: Mapping[str, tuple[str, ...]] | None = None,
    error_path: str = "",
    grace_s: float = 0.0,
    max_time_s: float | None = None,
) -> list[str]:
    """Pure: `sbatch` arguments that carry out exactly this placement: its nodes, its GPUs per
    node, its time limit, who it runs as (`--uid` and `--gid`, so the job has its user's primary
    group; slurmd adds the supplementary ones), where it starts (`--chdir`), its name and its
    output and error files (created by slurmstepd as the job's user). On a node whose GPUs are
    pinned (`pinned`: node -> the GRES type of each index) it asks for exactly the ledger's GPU
    indices (`--gres=gpu:h100_2:1,gpu:h100_5:1`); elsewhere for their count. Nodes that need
    different GRES make a heterogeneous job, one component per node. The script comes on stdin.
    The executor stops the run at its limit itself, to the second, with the job's grace
    (`grace_s`): Slurm's `--time` is only a backstop past both (`backstop_minutes`). A job
    that recorded its submitter's resource limits gets them from its script, and none of the
    limits sbatch itself runs with (`--propagate=NONE`: `submit --propagate=NONE` recorded an
    empty set, and gets the node's, as sbatch's); one that recorded none (older, or over HTTP
    without them) the old rule: sbatch's own, its open-files limit lowered."""
    pinned = pinned or {}
    common = [
        f"--job-name=gpuledger-{job.job_id}",
        f"--comment=gpuledger:{ledger_id}:job={job.job_id}:run={job.run}"
        + ("" if job.grace_s is None else f":grace={math.ceil(job.grace_s)}"),
        f"--output={slurm_path(str(log_path))}",
        "--open-mode=append",
        "--no-requeue",
        "--parsable",
    ]
    if error_path and error_path != str(log_path):
        common.append(f"--error={slurm_path(error_path)}")
    if job.workdir:
        common.append(f"--chdir={slurm_path(job.workdir)}")
    elif who.home:
        common.append(f"--chdir={slurm_path(who.home)}")
    common.append(f"--time={backstop_minutes(job.time_limit_s, grace_s, max_time_s)}")
    if who.uid is not None:
        common.append(f"--uid={who.uid}")
    if who.gid is not None:
        common.append(f"--gid={who.gid}")
    if job.ulimits is not None:  # the submitter's are the script's (`script.ulimit_lines`),
        common.append("--propagate=NONE")  # never the service's (`submit --propagate=NONE`
        # recorded none: the node's, as sbatch's; atk47-s F6: it got the service's core 0)
    gres = gres_per_node(job, pinned)
    groups: list[list[str]] = []
    if len(set(gres)) == 1:
        groups.append(
            [
                f"--partition={partition}",
                f"--nodes={len(job.slots)}",
                f"--nodelist={','.join(sl.node for sl in job.slots)}",
                f"--gres={gres[0]}",
            ]
        )
    else:  # a gang whose nodes need different GRES: one component per node
        for sl, one in zip(job.slots, gres, strict=True):
            groups.append(
                [f"--partition={partition}", "--nodes=1", f"--nodelist={sl.node}", f"--gres={one}"]
            )
    args = [*common, *groups[0]]
    for g in groups[1:]:
        args += [":", *g]
    return args


def gres_per_node(job: Launch, pinned: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Pure: the `--gres` of each of the job's nodes: more than one kind is a heterogeneous job."""
    return [_gres_of(sl.gpu_indices, pinned.get(sl.node, ())) for sl in job.slots]


def _gres_of(indices: tuple[int, ...], types: tuple[str, ...]) -> str:
    """Pure: the `--gres` of one node's GPUs: the pinned types of exactly these indices, or
    their count on a node without pinned types (or an index it does not have)."""
    if types and all(0 <= i < len(types) for i in indices):
        return ",".join(f"gpu:{types[i]}:1" for i in sorted(indices))
    return f"gpu:{len(indices)}"


SLURM_OWNS = re.compile(
    r"^(SLURM_|SLURMD_|SBATCH_|SRUN_|SALLOC_)|^(CUDA_VISIBLE_DEVICES|GPU_DEVICE_ORDINAL|ROCR_VISIBLE_DEVICES)$"
)
"""Variables Slurm sets for the job itself (its ids, the GPUs it allocated): a submitted value
(a shell inside another allocation) never overrides them."""
SBATCH_ENV = ("SLURM_CONF",)
"""The only variables of the service's environment `sbatch` itself is run with (with PATH):
where the cluster is. Nothing else of the service's reaches a job."""
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def job_environment(job: Launch, who: SbatchUser, checkpoint_file: str = "") -> dict[str, str]:
    """Pure: the job's environment on Slurm: the one it was submitted with (after `--export`),
    never the service's; with none, PATH alone (Slurm's `--export=NONE`); the account's HOME,
    USER, LOGNAME and SHELL; then the ledger's variables, which win. Slurm's own (`SLURM_*`,
    the GPUs) are Slurm's to set. An array task also gets `SLURM_ARRAY_JOB_ID` and
    `SLURM_ARRAY_TASK_ID` (the ledger runs each task as its own Slurm job), and every job
    `SLURM_SUBMIT_DIR`: its working directory (sbatch's would be the service's own cwd)."""
    env = {
        k: v
        for k, v in job.env
        if _NAME.match(k) and not SLURM_OWNS.match(k)
        and k not in ("GPULEDGER_JOB_TOKEN", "GPULEDGER_NODE_TOKEN")
    }  # fmt: skip
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if who.name:
        env.update(HOME=who.home, USER=who.name, LOGNAME=who.name, SHELL=who.shell or "/bin/sh")
    env.update(
        GPULEDGER_JOB_ID=str(job.job_id),
        GPULEDGER_RUN=str(job.run),
        GPULEDGER_LAUNCH=str(job.run + 1),
        GPULEDGER_USER=job.user,
        GPULEDGER_ACCOUNT=job.account,
        GPULEDGER_NODES=",".join(sl.node for sl in job.slots),
        GPULEDGER_NODELIST=",".join(sl.node for sl in job.slots),  # as on the node agents
    )
    if job.job_name:
        env["GPULEDGER_JOB_NAME"] = job.job_name
    if job.array_job_id is not None:
        env["GPULEDGER_ARRAY_JOB_ID"] = env["SLURM_ARRAY_JOB_ID"] = str(job.array_job_id)
    if job.array_task_id is not None:
        env["GPULEDGER_ARRAY_TASK_ID"] = env["SLURM_ARRAY_TASK_ID"] = str(job.array_task_id)
    if checkpoint_file:  # touched by the job: the executor records a checkpoint (as on agents)
        env["GPULEDGER_CHECKPOINT_FILE"] = checkpoint_file
    if job.workdir or who.home:  # where it was submitted from, as sbatch gives it (--chdir's)
        env["SLURM_SUBMIT_DIR"] = job.workdir or who.home
    return env


SLURM_ENDS_FIRST = frozenset({"CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "DEADLINE"})
"""States whose EndTime is Slurm's decision (the scancel, the limit, the node's loss), not the
end of the job's processes: they get SIGTERM then, and SIGKILL only `KillWait` later; the job
shows COMPLETING (its GPUs held) until they are gone."""


def processes_end(
    end_time: float | None, state: str, now: float, completing_seen: float | None
) -> float | None:
    """Pure: when a run Slurm reports ended really ended, its processes gone (docs/slurm.md,
    "Real times"). Slurm's EndTime (None when it gives none), except where Slurm decided the
    end (`SLURM_ENDS_FIRST`: a cancel, a limit) and a read saw the job still COMPLETING after
    that EndTime (`completing_seen`, the last such read): its processes outlived it, up to
    KillWait, holding its GPUs. Then the end is this read (`now`, the first that saw it gone),
    cut to Slurm's whole seconds: never later than the next run on those GPUs starts (Slurm's
    StartTime, whole seconds, comes after this read), at most a read and a second late."""
    if end_time is None or state not in SLURM_ENDS_FIRST or completing_seen is None:
        return end_time
    if completing_seen <= end_time:
        return end_time
    return max(end_time, float(math.floor(now)))


def backstop_minutes(time_limit_s: float | None, grace_s: float, max_time_s: float | None) -> int | str:  # fmt: skip  # noqa: E501
    """Pure: the `--time` (whole minutes) asked of Slurm for a run the executor stops at its
    limit itself (SIGTERM, the job's grace, then scancel): past limit and grace by a minute or
    more (Slurm checks every ~30 s: its TIMEOUT, with KillWait, never comes first; it acts only
    while the service is down), never over MaxTime (Slurm would not start it; the grace is what
    is left). No limit: `UNLIMITED`, never DefaultTime (its TIMEOUT killed it: atk61-slurm F3)."""
    if time_limit_s is None:
        return "UNLIMITED"
    minutes = max(1, math.ceil((time_limit_s + max(0.0, grace_s)) / 60)) + 1
    if max_time_s is not None:
        minutes = min(minutes, max(1, int(max_time_s // 60)))
    return minutes


def real_end(
    end_time: float | None,
    now: float,
    seen_running_at: float | None,
    away: tuple[float, float] | None,
    settle_s: float,
) -> float:
    """Pure: when a run Slurm reports ended really ended, as far as the ledger can know: Slurm's
    EndTime (`now` when it gives none, never later than `now`), except for a run that ended
    while slurmctld was away (`away`: the last read answered before the outage, the first after
    it). A returning controller records the EndTime of such a run when slurmd's retried
    completion reaches it, not when it ended; so a run last seen running before the outage
    (`seen_running_at`) whose EndTime falls in the outage or the `settle_s` after it ended, for
    the ledger, when it was last seen running. Its charge ends there: the part of the outage it
    may have run is not charged, and nothing is charged after its real end."""
    at = now if end_time is None else min(now, end_time)
    if seen_running_at is None or away is None or seen_running_at > away[0]:
        return at
    if away[0] <= at <= away[1] + settle_s:
        return seen_running_at
    return at


def name_of(first: AnyEvent | None) -> str:
    """Pure: the ledger's name in Slurm comments from its first event (`ledger_id`)."""
    if first is None:
        raise InvalidCommand("the ledger is not initialised", hint="run `gpuledger init`")
    return re.sub(r"[^0-9a-f]", "", first.event_id.lower())[:12] or "0"
