"""Slurm as the execution engine: gpu-ledger decides, a Slurm partition runs the processes.

The pure half reads Slurm's own words (`scontrol -o` records, hostlists, GRES strings, job states,
`sacctmgr` shares) and writes `sbatch` arguments; the `SlurmExecutor` half is the edge that runs
the commands. What the ledger owns and what Slurm owns is in docs/slurm.md.

How a run is named: job name `gpuledger-<job id>`, comment `gpuledger:<ledger>:job=<job id>:run=<n>`
(`ledger` = the first 12 hex digits of the ledger's first event id, so two ledgers never take each
other's runs; n = the job's placement number, its preemptions so far). After any restart the
executor finds its runs by that name in Slurm, never from memory.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pwd
import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ledger.core.state import Node
from ledger.cycle.dispatcher import EXECUTOR
from ledger.cycle.executor import Exit, Launch, Start
from ledger.store.application import Ledger
from schemas import commands as c
from schemas.errors import EngineError, InvalidCommand
from schemas.events import EndReason, GpuSlot

log = logging.getLogger("gpuledger.slurm")

ENGINE = "slurm"
_TAG = re.compile(r"^gpuledger:(\w+):job=(\d+):run=(\d+)$")
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
_NODE_BAD = ("DRAIN", "DOWN", "FAIL", "MAINT", "INVALID", "REBOOT", "POWER")
DRAIN_PREFIX = "slurm:"
"""Drain and lost reasons the executor writes start with this; it returns only nodes it took out
of service itself."""


# --- reading Slurm (pure) ----------------------------------------------------------------------


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


def gpus_of(gres: str) -> tuple[int, str]:
    """Pure: (GPU count, GPU type) of a node's Gres (`gpu:h100:8(S:0-1)`, `gpu:4`); type "gpu"
    when Slurm names none. Several GPU kinds on one node: the count is their sum, the type the
    first one's."""
    count, kind = 0, ""
    for m in re.finditer(r"(?:^|,)gpu(?::([A-Za-z][\w.-]*))?:(\d+)", gres):
        count += int(m.group(2))
        kind = kind or (m.group(1) or "gpu")
    return count, kind or "gpu"


def exit_code(text: str) -> int:
    """Pure: Slurm's `ExitCode=status:signal` as one code (128 + signal when killed by one)."""
    status, _, sig = text.partition(":")
    st = int(status) if status.isdigit() else 0
    sg = int(sig) if sig.isdigit() else 0
    return st if st or not sg else 128 + sg


def end_reason(state: str) -> EndReason:
    """Pure: why a Slurm job state ended a run."""
    return _REASONS.get(state.split()[0].rstrip("+"), "exited")


def node_unavailable(state: str) -> bool:
    """Pure: whether a Slurm node state (`IDLE+DRAIN`, `DOWN*`, `MIXED`) takes no new work."""
    return any(flag in state.upper() for flag in _NODE_BAD)


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

    def tag(self, ledger_id: str) -> tuple[int, int] | None:
        """(job id, run) for a run this ledger submitted; None for a foreign job."""
        m = _TAG.match(self.comment)
        if m is None or m.group(1) != ledger_id or self.name != f"gpuledger-{m.group(2)}":
            return None
        return int(m.group(2)), int(m.group(3))

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def holding(self) -> bool:
        return self.state in HOLDING


def parse_jobs(text: str) -> list[SlurmJob]:
    """Pure: the jobs of `scontrol -d -o show job` output."""
    jobs = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        rec = parse_record(line)
        jobs.append(
            SlurmJob(
                slurm_id=rec["JobId"],
                name=rec.get("JobName", ""),
                state=rec.get("JobState", "").split()[0] if rec.get("JobState") else "",
                partition=rec.get("Partition", ""),
                comment=(rec.get("Comment") or "").strip(),
                exit_code=exit_code(rec.get("ExitCode", "0:0")),
                reason=rec.get("Reason", ""),
                started=rec.get("StartTime", "Unknown") not in ("Unknown", "None", "")
                and rec.get("JobState") not in WAITING,
                gpus=node_gres(line),
            )
        )
    return jobs


@dataclass(frozen=True)
class SlurmNode:
    name: str
    gpus: int
    gpu_type: str
    state: str
    reason: str = ""

    @property
    def unavailable(self) -> bool:
        return node_unavailable(self.state)

    @property
    def down(self) -> bool:
        return node_down(self.state)


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
            )
        )
    return sorted(out, key=lambda n: n.name)


def node_changes(
    slurm: Iterable[SlurmNode], ledger: Mapping[str, Node], actor: str
) -> list[c.AnyCommand]:
    """Pure: the node changes that make the ledger's nodes follow Slurm's, with reasons starting
    "slurm:": a node Slurm marks DOWN is lost in the ledger (its jobs end there and then); a node
    that takes no new work otherwise (DRAIN, FAIL, MAINT, ...) is drained; a node Slurm
    takes back is returned if the ledger took it out of service for Slurm (a drain an admin made
    in the ledger is not Slurm's to undo). A node the ledger lost for Slurm that Slurm now drains
    is returned first and drained on the next look. Nodes the ledger does not know are left to
    `register_commands`."""
    out: list[c.AnyCommand] = []
    for n in slurm:
        have = ledger.get(n.name)
        if have is None or have.state == "removed":
            continue
        why = f"{DRAIN_PREFIX} {n.state}" + (f" ({n.reason})" if n.reason else "")
        ours = (have.lost_reason if have.state == "lost" else have.drain_reason).startswith(
            DRAIN_PREFIX
        )
        if n.down and have.state != "lost":
            out.append(c.MarkNodeLost(actor=actor, node=n.name, reason=why))
        elif n.down:
            continue
        elif n.unavailable and have.state == "active":
            out.append(c.DrainNode(actor=actor, node=n.name, reason=why))
        elif ours and (
            have.state == "lost" or (not n.unavailable and have.state in ("draining", "drained"))
        ):
            out.append(c.ReturnNode(actor=actor, node=n.name))
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


def check_config(config: str, partition: str) -> list[str]:
    """Pure: why Slurm's settings (`scontrol show config` and `scontrol -o show partition P`
    output, concatenated) would let Slurm reorder or preempt gpu-ledger's decisions; [] if none."""
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
    elif part.get("State", "UP") != "UP":
        problems.append(f"partition {partition!r} is {part.get('State')}, not UP")
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
    return problems


def sbatch_args(
    job: Launch, partition: str, log_path: Path, uid: str | None, ledger_id: str
) -> list[str]:
    """Pure: `sbatch` arguments that carry out exactly this placement: its nodes, its GPU count
    per node (a heterogeneous job when a gang's nodes get different counts), its time limit, its
    user, its name and log. The script comes on stdin."""
    common = [
        f"--job-name=gpuledger-{job.job_id}",
        f"--comment=gpuledger:{ledger_id}:job={job.job_id}:run={job.run}",
        f"--output={log_path}",
        "--open-mode=append",
        "--no-requeue",
        "--parsable",
    ]
    if job.time_limit_s is not None:
        common.append(f"--time={max(1, math.ceil(job.time_limit_s / 60))}")
    if uid is not None:
        common.append(f"--uid={uid}")
    counts = {len(sl.gpu_indices) for sl in job.slots}
    groups: list[list[str]] = []
    if len(counts) == 1:
        groups.append(
            [
                f"--partition={partition}",
                f"--nodes={len(job.slots)}",
                f"--nodelist={','.join(sl.node for sl in job.slots)}",
                f"--gres=gpu:{counts.pop()}",
            ]
        )
    else:  # a gang whose last node gets fewer GPUs: one component per node
        for sl in job.slots:
            groups.append(
                [
                    f"--partition={partition}",
                    "--nodes=1",
                    f"--nodelist={sl.node}",
                    f"--gres=gpu:{len(sl.gpu_indices)}",
                ]
            )
    args = [*common, *groups[0]]
    for g in groups[1:]:
        args += [":", *g]
    return args


def batch_script(job: Launch) -> str:
    """Pure: the batch script: the ledger's variables, then the job's command replaces the shell,
    so it gets the signals. (The variables sit in the script: `sbatch --export=ALL,VAR=...` makes
    Slurm start a job about 1.5 s later.)"""
    env = {
        "GPULEDGER_JOB_ID": str(job.job_id),
        "GPULEDGER_RUN": str(job.run),
        "GPULEDGER_ACCOUNT": job.account,
        "GPULEDGER_NODES": ",".join(sl.node for sl in job.slots),
    }
    lines = ["#!/bin/bash", *(f"export {k}={shlex.quote(v)}" for k, v in env.items())]
    lines.append("exec " + (shlex.join(job.command) if job.command else "true"))
    return "\n".join(lines) + "\n"


SACCTMGR_ARGS = ("sacctmgr", "-nP", "show", "associations", "format=Account,ParentName,User,Share")


def parse_sacctmgr_shares(text: str) -> tuple[list[tuple[str, str, int]], dict[str, str]]:
    """Pure: `sacctmgr -nP show associations format=Account,ParentName,User,Share` as
    ((account, user or "", shares) rows, account -> parent account). A share of "parent" (the
    association uses its parent's) is skipped; the root account's user rows too."""
    rows: list[tuple[str, str, int]] = []
    parents: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.strip().split("|")]
        if len(cells) != 4:
            raise InvalidCommand(
                f"sacctmgr line {n} has {len(cells)} fields, not 4: {line.strip()!r}",
                hint="run: " + " ".join(SACCTMGR_ARGS),
            )
        account, parent, user, share = cells
        if (account, user, share) == ("Account", "User", "Share"):
            continue  # a header line
        if parent:
            parents[account] = parent
        if share.lower() == "parent" or (account == "root" and user):
            continue
        if not share.isdigit():
            raise InvalidCommand(f"sacctmgr line {n}: share {share!r} is not a whole number")
        rows.append((account, user, int(share)))
    return rows, parents


def shares_toml(rows: Iterable[tuple[str, str, int]], parents: Mapping[str, str]) -> str:
    """Pure: a budget file (`gpuledger budget apply`) from Slurm association shares. `parents`
    maps each Slurm account to its parent (`sacctmgr -nP show account withassoc
    format=Account,ParentName`); the root account is the tree's top, not an account. An account
    with users, or under one that has users, is a project; the others are programs."""
    rows = list(rows)
    users: dict[str, list[tuple[str, int]]] = {}
    for a, u, s in rows:
        if u:
            users.setdefault(a, []).append((u, s))
    account_shares = {a: s for a, u, s in rows if not u}

    def chain(acct: str) -> list[str]:
        out = [acct]
        while parents.get(out[-1], "root") not in ("root", "") and len(out) < 64:
            out.append(parents[out[-1]])
        return out

    lines = ["# imported from Slurm associations (sacctmgr); review, then `gpuledger budget apply`"]
    accounts = sorted(
        {a for a, _, _ in rows} - {"root"}, key=lambda a: "/".join(reversed(chain(a)))
    )
    for acct in accounts:
        path = "/".join(reversed(chain(acct)))
        kind = "project" if any(a in users for a in chain(acct)) else "program"
        lines += ["", f'[accounts."{path}"]', f'kind = "{kind}"']
        lines.append(f"shares = {account_shares.get(acct, 1)}")
        if acct in users:
            members = sorted(users[acct])
            lines.append("members = [" + ", ".join(f'"{u}"' for u, _ in members) + "]")
            weights = [(u, s) for u, s in members if s != 1]
            if weights:
                lines.append(
                    "member_shares = { " + ", ".join(f"{u} = {s}" for u, s in weights) + " }"
                )
    return "\n".join(lines) + "\n"


# --- the executor (edge) -----------------------------------------------------------------------


def ledger_id(ledger: Ledger) -> str:
    """This ledger's name in Slurm comments: 12 hex digits of its first event's id."""
    first = ledger.read(0, 1)
    if not first:
        raise InvalidCommand("the ledger is not initialised", hint="run `gpuledger init`")
    return re.sub(r"[^0-9a-f]", "", first[0][1].event_id.lower())[:12] or "0"


def open_executor(
    ledger: Ledger, partition: str | None, log_dir: Path, grace_s: float, actor: str
) -> SlurmExecutor:
    """The executor of `partition`, after checking Slurm lets gpu-ledger own it, with the
    partition's GPU nodes registered in the ledger by `actor` (an admin). One clear error when
    the partition is missing, cannot be owned or has no GPU node; nothing appended then."""
    if not partition:
        raise InvalidCommand(
            "the Slurm executor needs the partition gpu-ledger owns",
            hint="pass --partition P (serve: `partition` in the config file)",
        )
    slurm = SlurmExecutor(partition, ledger_id(ledger), log_dir, grace_s=grace_s)
    slurm.check()
    found = slurm.nodes()
    if not found:
        raise EngineError(
            f"Slurm partition {partition!r} has no nodes with GPUs (Gres=gpu:...)",
            hint="see docs/slurm.md",
        )
    cmds = register_commands(found, ledger.state.nodes, actor)
    if cmds:
        ledger.execute_all(cmds)
    return slurm


@dataclass
class _Run:
    job_id: int
    run: int
    launch: Launch | None
    slurm_id: str | None = None
    """None while the launch waits for its GPUs to be free in Slurm (a victim still stopping)."""
    started: bool = False
    missing_since: float | None = None
    """When a read of Slurm first lacked this run (None while Slurm lists it)."""


@dataclass
class _Stopping:
    since: float
    cancelled: bool = False


class SlurmExecutor:
    """Carries out the ledger's placements as Slurm jobs on one partition, and reports what Slurm
    says happened. Slurm keeps runs across our restarts, so `adopt` takes them over."""

    engine = ENGINE
    relaunch_placed = True

    def __init__(
        self,
        partition: str,
        ledger_id: str,
        log_dir: Path,
        grace_s: float = 30.0,
        timeout_s: float = 20.0,
        env: Mapping[str, str] | None = None,
        vanish_after_s: float = 30.0,
    ) -> None:
        self.partition = partition
        self.ledger_id = ledger_id
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.timeout_s = timeout_s
        self.vanish_after_s = vanish_after_s
        """How long a submitted run may be missing from every read before it counts as gone: a
        controller that has just restarted may answer before it lists every job."""
        self.env = dict(env if env is not None else os.environ)
        self._runs: dict[int, _Run] = {}
        self._stopping: dict[str, _Stopping] = {}
        self._view: dict[str, SlurmJob] = {}
        self._starts: list[Start] = []
        self._exits: list[Exit] = []
        self._foreign: dict[str, frozenset[int]] = {}
        self._foreign_seen: set[str] = set()
        self._accounting: bool | None = None

    # --- talking to Slurm ---

    def _run(self, args: list[str], stdin: str | None = None) -> str:
        try:
            proc = subprocess.run(
                args,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=self.env,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise EngineError(
                f"{args[0]} failed: {err}", hint="is Slurm up? see docs/slurm.md"
            ) from err
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise EngineError(
                f"{' '.join(args[:2])}: {msg[-1] if msg else f'exit {proc.returncode}'}",
                hint="is Slurm up? see docs/slurm.md",
            )
        return proc.stdout

    def check(self) -> None:
        """Refuse to run on a partition where Slurm would reorder or preempt on its own."""
        text = self._run(["scontrol", "show", "config"])
        with contextlib.suppress(EngineError):  # a missing partition is reported below
            text += "\n" + self._run(["scontrol", "-o", "show", "partition", self.partition])
        problems = check_config(text, self.partition)
        if problems:
            raise EngineError(
                f"Slurm partition {self.partition!r} cannot be run by gpu-ledger: "
                + "; ".join(problems),
                hint="see docs/slurm.md, 'Partition settings'",
            )
        self._accounting = "accounting_storage/none" not in text.replace(" ", "")

    def nodes(self) -> list[SlurmNode]:
        return parse_nodes(self._run(["scontrol", "-o", "show", "node"]), self.partition)

    def node_changes(self, nodes: Mapping[str, Node]) -> list[c.AnyCommand]:
        """The ledger's nodes follow Slurm's (`node_changes`); [] while Slurm cannot be read."""
        try:
            found = self.nodes()
        except EngineError as err:
            log.warning("slurm nodes: %s; keeping the nodes as they are", err.line())
            return []
        return node_changes(found, nodes, EXECUTOR)

    @property
    def view(self) -> Mapping[str, SlurmJob]:
        """Every Slurm job as last read (`refresh`)."""
        return self._view

    def refresh(self) -> bool:
        """Read every job from Slurm once; False (and nothing changes) when Slurm is away."""
        try:
            text = self._run(["scontrol", "-d", "-o", "show", "job"])
        except EngineError as err:
            log.warning("slurm: %s; keeping the last known state", err.line())
            return False
        self._view = {j.slurm_id: j for j in parse_jobs(text)}
        return True

    def _held(self) -> dict[str, set[int]]:
        """GPUs busy in Slurm now, plus those our submitted-but-not-started runs will take."""
        held: dict[str, set[int]] = {}
        for j in self._view.values():
            if j.holding:
                for node, idx in j.gpus.items():
                    held.setdefault(node, set()).update(idx)
        for r in self._runs.values():
            if r.slurm_id is not None and not r.started and r.launch is not None:
                for sl in r.launch.slots:
                    held.setdefault(sl.node, set()).update(sl.gpu_indices)
        return held

    def _uid(self, user: str) -> str | None:
        """The user to pass as `--uid`: only when we run as root and it is another Unix user."""
        if os.geteuid() != 0 or user == "root":
            return None
        try:
            pwd.getpwnam(user)
        except KeyError:
            return None
        return user

    def _submit(self, r: _Run) -> None:
        assert r.launch is not None
        job = r.launch
        uid = self._uid(job.user)
        out = self.log_dir / f"job-{job.job_id}.log"
        if not self.log_dir.is_dir():
            self.log_dir.mkdir(parents=True)
            if os.geteuid() == 0:
                self.log_dir.chmod(0o1777)  # jobs run as their users open their own logs
        if uid is not None:
            out.touch()
            os.chown(out, pwd.getpwnam(uid).pw_uid, -1)
        args = ["sbatch", *sbatch_args(job, self.partition, out, uid, self.ledger_id)]
        slurm_id = self._run(args, stdin=batch_script(job)).strip().split(";")[0]
        r.slurm_id = slurm_id
        log.info("job %s run %s is Slurm job %s", job.job_id, job.run, slurm_id)

    def _try_submit(self) -> None:
        """Submit the launches whose GPUs are free in Slurm, in launch order, so Slurm hands out
        exactly the GPUs the ledger chose (it takes the lowest free indices, as the ledger does)."""
        held = self._held()
        for r in list(self._runs.values()):
            if r.slurm_id is not None or r.launch is None:
                continue
            adopted = self._find(r.job_id, r.run)  # an sbatch that timed out may have landed
            if adopted is not None:
                r.slurm_id = adopted.slurm_id
                continue
            if any(held.get(sl.node, set()) & set(sl.gpu_indices) for sl in r.launch.slots):
                continue
            try:
                self._submit(r)
            except EngineError as err:
                log.warning("job %s: sbatch failed, retrying next cycle: %s", r.job_id, err.line())
                continue
            for sl in r.launch.slots:
                held.setdefault(sl.node, set()).update(sl.gpu_indices)

    def _find(self, job_id: int, run: int) -> SlurmJob | None:
        for j in self._view.values():
            if j.tag(self.ledger_id) == (job_id, run):
                return j
        return None

    # --- the executor interface ---

    def launch(self, job: Launch, now: float) -> None:
        self._runs[job.job_id] = _Run(job.job_id, job.run, job)
        self._try_submit()

    def stop(self, job_id: int, now: float) -> None:
        r = self._runs.pop(job_id, None)
        if r is None or r.slurm_id is None:
            return
        self._signal(r.slurm_id, now)

    def _signal(self, slurm_id: str, now: float) -> None:
        job = self._view.get(slurm_id)
        stopping = self._stopping.setdefault(slurm_id, _Stopping(now))
        try:
            if job is not None and job.state in WAITING:
                self._run(["scancel", slurm_id])  # never ran: nothing to save
                stopping.cancelled = True
            else:
                self._run(["scancel", "--signal=TERM", "--full", slurm_id])
        except EngineError as err:
            log.warning("slurm job %s: %s (retrying)", slurm_id, err.line())

    def starts(self, now: float) -> list[Start]:
        out, self._starts = self._starts, []
        return out

    def poll(self, now: float) -> list[Exit]:
        if self.refresh():
            self._observe(now)
            self._try_submit()
        out, self._exits = self._exits, []
        return out

    def _observe(self, now: float) -> None:
        # 1. our runs: starts, exits, vanished
        for job_id, r in list(self._runs.items()):
            if r.slurm_id is None:
                continue
            j = self._view.get(r.slurm_id)
            if j is None:
                if r.missing_since is None:
                    r.missing_since = now
                if now - r.missing_since >= self.vanish_after_s:
                    self._vanished(r, now)
                continue
            r.missing_since = None
            if j.started and not r.started and (j.holding or j.ended):
                r.started = True
                gpus = tuple(GpuSlot(node=n, gpu_indices=i) for n, i in sorted(j.gpus.items()) if i)
                self._starts.append(Start(job_id, r.slurm_id, r.run, gpus))
                self._check_gpus(r, j)
            if j.ended:
                del self._runs[job_id]
                self._exits.append(
                    Exit(job_id, j.exit_code, now, end_reason(j.state), r.slurm_id, j.state)
                )
        # 2. runs being stopped: the grace, then scancel
        for slurm_id, st in list(self._stopping.items()):
            j = self._view.get(slurm_id)
            if j is None or j.ended:
                del self._stopping[slurm_id]
            elif not st.cancelled and now - st.since >= self.grace_s:
                try:
                    self._run(["scancel", slurm_id])
                    st.cancelled = True
                except EngineError as err:
                    log.warning("slurm job %s: %s (retrying)", slurm_id, err.line())
        # 3. foreign jobs on the partition: their GPUs are busy, they are never touched
        foreign: dict[str, set[int]] = {}
        ours = {r.slurm_id for r in self._runs.values()} | set(self._stopping)
        for j in self._view.values():
            if j.partition != self.partition or j.slurm_id in ours:
                continue
            if j.tag(self.ledger_id) is not None:
                if not j.ended and j.slurm_id not in self._stopping:
                    log.warning("slurm job %s is a run the ledger no longer runs: stopping it", j)
                    self._signal(j.slurm_id, now)
                continue
            if j.holding:
                for node, idx in j.gpus.items():
                    foreign.setdefault(node, set()).update(idx)
                if j.slurm_id not in self._foreign_seen:
                    self._foreign_seen.add(j.slurm_id)
                    log.info("foreign Slurm job %s holds GPUs %s", j.slurm_id, dict(j.gpus))
        self._foreign = {n: frozenset(i) for n, i in foreign.items()}

    def _vanished(self, r: _Run, now: float) -> None:
        """A run Slurm no longer lists (past MinJobAge, or the controller lost its state)."""
        assert r.slurm_id is not None
        state, code = "", -1
        if self._accounting:
            try:
                rows = self._run(
                    ["sacct", "-n", "-P", "-X", "-j", r.slurm_id, "-o", "State,ExitCode"]
                )
                first = rows.strip().splitlines()[0].split("|") if rows.strip() else []
                if len(first) == 2:
                    state, code = first[0].split()[0], exit_code(first[1])
            except EngineError as err:
                log.warning("sacct: %s", err.line())
        if state in WAITING or state in HOLDING:
            return
        del self._runs[r.job_id]
        reason: EndReason = end_reason(state) if state in ENDED else "lost"
        self._exits.append(Exit(r.job_id, code, now, reason, r.slurm_id, state or "UNKNOWN"))

    def _check_gpus(self, r: _Run, j: SlurmJob) -> None:
        if r.launch is None:
            return
        want = {sl.node: tuple(sl.gpu_indices) for sl in r.launch.slots}
        got = {n: tuple(i) for n, i in j.gpus.items() if i}
        if j.holding and got and got != want:
            log.warning("job %s: Slurm gave GPUs %s, the ledger chose %s", r.job_id, got, want)

    def running(self) -> set[int]:
        return set(self._runs)

    def next_event_at(self) -> float | None:
        return None

    def foreign(self) -> Mapping[str, frozenset[int]]:
        """GPUs held by jobs on the partition that did not come through gpu-ledger."""
        return self._foreign

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        if not self.refresh():
            raise EngineError(
                "Slurm cannot be read, so the ledger cannot be reconciled with it",
                hint="start slurmctld (scripts/slurm/slurm up) and retry",
            )
        for j in sorted(self._view.values(), key=lambda j: int(j.slurm_id.split("_")[0])):
            tag = j.tag(self.ledger_id)
            if tag is None or j.partition != self.partition:
                continue
            job_id, run = tag
            if runs.get(job_id) == run:
                self._runs[job_id] = _Run(job_id, run, None, j.slurm_id)
                log.info("adopted Slurm job %s as job %s run %s", j.slurm_id, job_id, run)
        adopted = set(self._runs)
        self._observe(now)  # runs that ended while we were away: their exits come with `poll`
        return adopted

    def shutdown(self, now: float) -> list[Exit]:
        """Slurm runs on without us; the next start adopts the runs."""
        return []
