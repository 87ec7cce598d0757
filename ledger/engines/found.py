"""Live runs found from the machine, not from the state file. An edge: reads /proc and the run
directories.

A supervised executor keeps its handles in `state.json`; losing that file (or the whole state
directory: a tmpfs, a reimage, an operator's `rm`) must never make it report a live run lost, free
its GPUs, or launch it a second time. Before it reports or launches anything, the executor asks
the machine (`find_live`):

1. **Run directories** (`<state_dir>/runs/<job>.<launch>/<rank>`): a part with no `exit` whose
   supervisor, leader or tree (its cgroup, or its session) is alive is a live part.
2. **Processes marked with the run**: every job process carries `GPULEDGER_JOB_ID`,
   `GPULEDGER_LAUNCH`, `RANK` and the state directory's scope (`GPULEDGER_SCOPE`, or, for a
   process that cleared its environment, its cgroup under `gpuledger/<scope>/`). A part found
   only this way gets its run directory back: the one its leader still holds open (the record,
   descriptor 9, which follows a moved directory), else the one of its name its supervisor made
   (its leader ended, what it left lives on: never made anew over it), else a new one with the
   spec read from the process (its environment, GPUs and group) and its session leader as the
   job.
   **Only what the agent made is believed** (atk36-23 F6, F3): any OS user can start a process
   with those variables (the scope is in every job's own environment), naming another user's
   job with a later launch, and this scan then stopped the real run as an older launch. Where
   cgroups are used, a process counts only inside one of the scope's groups, which only the
   agent (root) can make or move a process into, and its run is the group's name
   (`<scope>/<job>.<launch>.<rank>`), never its environment; without cgroups, only a run whose
   processes hold a record the agent's user owns (descriptor 9, the record the supervisor
   opened, in a directory of the run's name) is believed, and only that user's or that record
   holder's uid's processes are its.

The parts found make handles (`Handle`), one per job: its newest launch. An older launch of the
same job still alive here can only be one the ledger stopped: it is stopped (SIGTERM, SIGKILL
after its grace), never adopted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

from ledger.engines.proc import alive, write_atomic
from ledger.engines.runs import (
    Handle,
    Part,
    read_exit,
    read_identity,
    read_started,
    run_name,
    spec_log,
)
from ledger.engines.supervise import RECORD_FD, tree_of
from ledger.engines.tree import TOP, Containment

SCOPE_VAR = "GPULEDGER_SCOPE"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, eq, v = item.partition(b"=")
        if eq:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def _group_of(pid: int, scope: str) -> str:
    """The part's group name under `gpuledger/` of a process in one of this scope's groups."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return ""
    mark = f"/{TOP}/{scope}/"
    for line in lines:
        path = line.split(":", 2)[-1]
        if mark in path:
            return f"{scope}/" + path.split(mark, 1)[1].split("/", 1)[0]
    return ""


def _session(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(raw[raw.rfind(b")") + 2 :].split()[3])


def _part_of(rundir: Path, spec: dict[str, object]) -> Part | None:
    """The live part in `rundir` (None if it ended or nothing of it is alive)."""
    if read_exit(rundir) is not None:
        return None
    sup = read_identity(rundir / "supervisor")
    job = read_identity(rundir / "job")
    tree = tree_of(spec, job[0] if job else None)
    if not ((sup is not None and alive(*sup)) or (job is not None and alive(*job)) or tree.pids()):
        return None
    env = spec.get("env")
    env = env if isinstance(env, dict) else {}
    gpus = spec.get("gpus")
    return Part(
        rank=int(rundir.name),
        node=str(env.get("GPULEDGER_NODE", "")),
        gpu_indices=tuple(int(i) for i in gpus) if isinstance(gpus, list) else (),
        rundir=str(rundir),
        log=spec_log(spec),
        pid=sup[0] if sup else None,
        pid_start=sup[1] if sup else None,
        cgroup=str(spec.get("cgroup") or ""),
    )


def _read_spec(rundir: Path) -> dict[str, object] | None:
    try:
        spec = json.loads((rundir / "spec.json").read_bytes())
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) else None


def _from_rundirs(state_dir: Path) -> dict[tuple[int, int], list[Part]]:
    found: dict[tuple[int, int], list[Part]] = {}
    for rundir in sorted((state_dir / "runs").glob("*/*")):
        job_s, _, launch_s = rundir.parent.name.partition(".")
        if not (job_s.isdigit() and launch_s.isdigit() and rundir.name.isdigit()):
            continue
        spec = _read_spec(rundir)
        part = _part_of(rundir, spec) if spec is not None else None
        if part is not None:
            found.setdefault((int(job_s), int(launch_s)), []).append(part)
    return found


def _from_processes(
    state_dir: Path, scope: str, containment: Containment, grace_s: float
) -> dict[tuple[int, int], list[Part]]:
    """Parts alive on this host whose run directories are gone (module doc, 2)."""
    groups: dict[tuple[int, int, int], list[int]] = {}
    envs: dict[tuple[int, int, int], dict[str, str]] = {}
    named: dict[str, tuple[int, int, int]] = {}
    bare: list[tuple[int, str]] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = _environ(pid)
        if containment.cgroups:
            # only a process in one of the scope's groups, which only the agent makes, and its
            # run as the group names it (module doc, 2: the environment is anyone's to forge)
            group = _group_of(pid, scope)
            key = _key_of_group(group)
            if key is None:
                continue
            if env.get(SCOPE_VAR) != scope:
                bare.append((pid, group))  # no environment: placed by its group below
                continue
        else:
            group = ""
            if env.get(SCOPE_VAR) != scope:
                continue
            try:
                key = (int(env["GPULEDGER_JOB_ID"]), int(env["GPULEDGER_LAUNCH"]), int(env["RANK"]))
            except (KeyError, ValueError):
                continue
        groups.setdefault(key, []).append(pid)
        envs.setdefault(key, env)
        if group:
            named[group] = key
    for pid, group in bare:
        key = named.get(group) or _key_of_group(group)
        if key is not None:
            groups.setdefault(key, []).append(pid)
            envs.setdefault(key, {})
    if not containment.cgroups:  # without groups: only runs whose record the agent made
        groups = {k: mine for k, pids in groups.items() if (mine := _made_here(k, pids))}
    found: dict[tuple[int, int], list[Part]] = {}
    for (job_id, launch, rank), pids in sorted(groups.items()):
        rundir = _held_rundir(pids) or _made_rundir(state_dir, job_id, launch, rank)
        spec = _read_spec(rundir) if rundir is not None else None
        if rundir is None or spec is None:
            rundir, spec = _new_rundir(
                state_dir, job_id, launch, rank, pids, envs[(job_id, launch, rank)],
                _group_of(pids[0], scope) if containment.cgroups else "", containment, grace_s,
            )  # fmt: skip
        part = _part_of(rundir, spec)
        if part is not None:
            found.setdefault((job_id, launch), []).append(part)
    return found


def _key_of_group(group: str) -> tuple[int, int, int] | None:
    """(job, launch, rank) of a part's group `<scope>/<job>.<launch>.<rank>` (None: not one)."""
    bits = group.rpartition("/")[2].split(".") if group else []
    if len(bits) != 3 or not all(b.isdigit() for b in bits):
        return None
    return int(bits[0]), int(bits[1]), int(bits[2])


def _uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _made_here(key: tuple[int, int, int], pids: list[int]) -> list[int]:
    """Of `pids` (marked with run `key` by their environment), the ones of a run the agent
    made: a process holds the record the supervisor opened (descriptor 9: a file this agent's
    user owns, `<job>.<launch>/<rank>/record`), and these are its holders' uids' processes.
    None when no process holds one: a forger cannot make a file of the agent's user."""
    job_id, launch, rank = key
    uids = set()
    for pid in pids:
        fd = f"/proc/{pid}/fd/{RECORD_FD}"
        with contextlib.suppress(OSError):
            target = Path(os.readlink(fd).removesuffix(" (deleted)"))
            named = (target.name, target.parent.name, target.parent.parent.name)
            if (
                named == ("record", str(rank), run_name(job_id, launch))
                and (os.stat(fd).st_uid == os.geteuid())
                and (uid := _uid(pid)) is not None
            ):
                uids.add(uid)
    return [p for p in pids if _uid(p) in uids]


def _held_rundir(pids: list[int]) -> Path | None:
    """The run directory a leader still holds open (its record on descriptor 9)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            target = Path(os.readlink(f"/proc/{pid}/fd/{RECORD_FD}"))
            if target.name == "record" and target.parent.is_dir():
                return target.parent
    return None


def _made_rundir(state_dir: Path, job_id: int, launch: int, rank: int) -> Path | None:
    """The part's run directory its supervisor made, when it is still there with its spec: its
    leader may be gone while processes it left live on, holding no record (atk53-23 F1: a new
    run directory was made over it, a leftover named its job, and the leftovers were adopted as
    a running part and never killed)."""
    rundir = state_dir / "runs" / run_name(job_id, launch) / str(rank)
    return rundir if (rundir / "spec.json").is_file() else None


def _new_rundir(
    state_dir: Path, job_id: int, launch: int, rank: int, pids: list[int], env: dict[str, str],
    group: str, containment: Containment, grace_s: float,
) -> tuple[Path, dict[str, object]]:  # fmt: skip
    """A run directory for a part found only by its processes: its spec as the processes say,
    and its session leader (else its oldest process) as the job."""
    rundir = state_dir / "runs" / run_name(job_id, launch) / str(rank)
    rundir.mkdir(parents=True, exist_ok=True)
    gpus = [int(i) for i in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if i.isdigit()]
    spec: dict[str, object] = {
        "command": [],
        "env": env,
        "gpus": gpus,
        "grace_s": grace_s,
        "cgroup": group,
        "containment": containment.to_json(),
        "found": True,
    }
    write_atomic(rundir / "spec.json", json.dumps(spec).encode(), sync=False)
    sessions = {_session(p) for p in pids}
    leader = next((p for p in sorted(pids) if p in sessions), min(pids))
    started = Path(f"/proc/{leader}/stat")
    with contextlib.suppress(OSError, ValueError, IndexError):
        raw = started.read_bytes()
        ticks = int(raw[raw.rfind(b")") + 2 :].split()[19])
        write_atomic(rundir / "job", f"{leader} {ticks}\n".encode(), sync=False)
    return rundir, spec


def find_live(
    state_dir: Path, scope: str, containment: Containment, grace_s: float
) -> list[Handle]:
    """The handles of every run alive on this host for `state_dir` (module doc), newest launch
    per job; older launches still alive are stopped."""
    found = _from_rundirs(state_dir)
    for key, parts in _from_processes(state_dir, scope, containment, grace_s).items():
        have = {p.rank for p in found.get(key, [])}
        found.setdefault(key, []).extend(p for p in parts if p.rank not in have)
    newest: dict[int, int] = {}
    for job_id, launch in found:
        newest[job_id] = max(launch, newest.get(job_id, 0))
    handles = []
    for (job_id, launch), parts in sorted(found.items()):
        if launch != newest[job_id]:
            for p in parts:  # stopped by the ledger, since a newer launch ran here
                spec = _read_spec(Path(p.rundir)) or {}
                job = read_identity(Path(p.rundir) / "job")
                tree_of(spec, job[0] if job else None).signal(signal.SIGKILL)
            continue
        spec = _read_spec(Path(parts[0].rundir)) or {}
        began = [read_started(Path(p.rundir) / "job") for p in parts]
        known = [b for b in began if b is not None]
        if not known:  # no start time recorded: when its spec was written
            with contextlib.suppress(OSError):
                known = [(Path(parts[0].rundir) / "spec.json").stat().st_mtime]
        limit = spec.get("time_limit_s")
        grace = spec.get("grace_s")
        handles.append(
            Handle(
                job_id=job_id,
                launch=launch,
                launched_at=max(known) if known else 0.0,
                time_limit_s=float(limit) if isinstance(limit, int | float) else None,
                grace_s=float(grace) if isinstance(grace, int | float) else grace_s,
                parts=sorted(parts, key=lambda p: p.rank),
            )
        )
    return handles
