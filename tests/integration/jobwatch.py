"""A checker outside the ledger, for the kill matrices: what the jobs themselves wrote and what
/proc shows, never what the ledger says.

Each job's processes (its leader and a forked child) append `time node launch gpus pid` to
`<seen>/<job>.leader` and `<job>.child` every 0.2 s, and `time launch done` to `<job>.done` when
the leader exits 0. A `ProcSampler` reads /proc every 0.2 s for the processes that carry a
marker variable in their environment. From either source: (job, launch) -> (node, GPU) ->
(first, last) time a process of it was seen there; `overlaps` then counts the GPU-seconds two
launches held a GPU at once and the jobs alive in two launches at once, `reruns` the completed
jobs that ran again. `Verdict.line()` is the one line a round reports.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

Span = tuple[float, float]
Spans = dict[tuple[int, int], dict[tuple[str, int], Span]]


def job_script(
    seen: Path, secs: float, node: str, launch: str, marker: str = "",
    gpus: str = "CUDA_VISIBLE_DEVICES",
) -> str:  # fmt: skip
    """A shell script: the leader and a forked child each log `time node launch gpus pid` every
    0.2 s; the leader writes `done` and exits 0 after `secs` of its own run (the child goes with
    the tree). `node` and `launch` are the shell words that name them in the engine's
    environment (`$GPULEDGER_NODE`, `$SLURMD_NODENAME`, ...). With `marker`, the script first
    re-executes itself with `marker` in its environment (for a `ProcSampler`). `gpus`: the
    variable holding the node's indices of the job's GPUs (on Slurm with ConstrainDevices,
    `SLURM_JOB_GPUS`: CUDA_VISIBLE_DEVICES counts from 0 inside the job's device cgroup)."""
    line = f'echo "$(date +%s.%N) {node} {launch} ${gpus} $$"'
    out = f"{seen}/$GPULEDGER_JOB_ID"
    body = (
        f"sh -c 'while :; do {line} >> {out}.child; sleep 0.2; done' & "
        f"end=$(( $(date +%s) + {int(secs)} )); "
        f'while [ "$(date +%s)" -lt "$end" ]; do {line} >> {out}.leader; sleep 0.2; done; '
        f'echo "$(date +%s.%N) {launch} done" >> {out}.done; exit 0'
    )
    if not marker:
        return body
    quoted = body.replace("'", "'\\''")
    return f"export {marker}; exec sh -c '{quoted}'"


def spans_of(seen: Path) -> Spans:
    """(job, launch) -> (node, GPU) -> (first, last) time a process of it logged itself there."""
    out: Spans = {}
    for f in [*seen.glob("*.leader"), *seen.glob("*.child")]:
        add_lines(out, int(f.stem), f.read_text().splitlines())
    return out


def add_lines(out: Spans, job: int, lines: Iterable[str]) -> None:
    for ln in lines:
        parts = ln.split()
        if len(parts) != 5:
            continue  # a line cut by a kill
        at, node, launch, gpus = float(parts[0]), parts[1], int(parts[2]), parts[3]
        for g in gpus.split(","):
            key = (node, int(g))
            lo, hi = out.setdefault((job, launch), {}).get(key, (at, at))
            out[(job, launch)][key] = (min(lo, at), max(hi, at))


def overlaps(spans: Spans) -> tuple[float, list[str]]:
    """(GPU-seconds held by two launches at once, the jobs alive in two launches at once)."""
    whole: dict[tuple[int, int], Span] = {}
    for run, gpus in spans.items():
        whole[run] = (min(s[0] for s in gpus.values()), max(s[1] for s in gpus.values()))
    double = sum(s for s, _ in clashes(spans))
    twice = []
    for (job, la), a in whole.items():
        for (job2, lb), b in whole.items():
            if job == job2 and la < lb and min(a[1], b[1]) > max(a[0], b[0]):
                twice.append(f"job {job}: launches {la} and {lb}")
    return double, twice


def clashes(spans: Spans) -> list[tuple[float, str]]:
    """Every GPU two launches held at once: (seconds, which), longest first."""
    by_gpu: dict[tuple[str, int], list[tuple[Span, tuple[int, int]]]] = {}
    for run, gpus in spans.items():
        for gpu, sp in gpus.items():
            by_gpu.setdefault(gpu, []).append((sp, run))
    out = []
    for gpu, held in by_gpu.items():
        for i, (a, ra) in enumerate(held):
            for b, rb in held[i + 1 :]:
                both = min(a[1], b[1]) - max(a[0], b[0])
                if ra != rb and both > 0:
                    out.append(
                        (both, f"GPU {gpu}: (job, launch) {ra} and {rb} from {max(a[0], b[0]):.1f}")
                    )
    return sorted(out, reverse=True)


def done_in(seen: Path) -> dict[int, list[int]]:
    """Job -> the launches in which its leader reached its end and exited 0."""
    return {
        int(f.stem): [int(ln.split()[1]) for ln in f.read_text().splitlines() if ln.strip()]
        for f in seen.glob("*.done")
    }


def reruns(seen: Path, spans: Spans) -> list[int]:
    """Jobs that completed in one launch and had a process seen in a later one."""
    return sorted(
        j
        for j, launches in done_in(seen).items()
        if len(launches) > 1 or any(la > min(launches) for (jj, la) in spans if jj == j)
    )


class ProcSampler(threading.Thread):
    """Every 0.2 s, each live process whose environment has `marker` (`NAME=value`): (job,
    launch) -> (node, GPU) -> when it was first and last seen, from /proc alone. `names` are the
    environment variables that hold the job, the launch and the node."""

    def __init__(
        self, marker: str, names: tuple[str, str, str], gpus: str = "CUDA_VISIBLE_DEVICES"
    ) -> None:
        super().__init__(daemon=True)
        self.marker = marker.encode()
        self.names = names
        self.gpus = gpus
        self.spans: Spans = {}
        self.stop = threading.Event()

    def run(self) -> None:
        job_v, launch_v, node_v = self.names
        while not self.stop.wait(0.2):
            now = time.time()
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                with contextlib.suppress(OSError, KeyError, ValueError, IndexError):
                    raw = Path(f"/proc/{pid}/environ").read_bytes()
                    if self.marker not in raw.split(b"\0") or _state(pid) == "Z":
                        continue
                    env = dict(
                        kv.split("=", 1)
                        for kv in raw.decode(errors="replace").split("\0")
                        if "=" in kv
                    )
                    gpus = env[self.gpus]
                    line = f"{now} {env[node_v]} {env[launch_v]} {gpus} {pid}"
                    add_lines(self.spans, int(env[job_v]), [line])

    def finish(self) -> Spans:
        self.stop.set()
        self.join()
        return self.spans


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has spent so far, all its threads (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _state(pid: str) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@dataclass
class Verdict:
    """What the checker found in one round, from both sources."""

    name: str
    jobs: int
    launches: int
    double_s: dict[str, float] = field(default_factory=dict)
    twice: dict[str, list[str]] = field(default_factory=dict)
    rerun: list[int] = field(default_factory=list)
    audit: str = ""
    times: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, seen: Path, proc: Spans, jobs: int) -> Verdict:
        job_side = spans_of(seen)
        v = cls(name=name, jobs=jobs, launches=len(job_side), rerun=reruns(seen, job_side))
        for source, spans in (("job-side logs", job_side), ("/proc", proc)):
            v.double_s[source], v.twice[source] = overlaps(spans)
        return v

    def detail(self, seen: Path, spans: Spans) -> str:
        """For a failure: each job run again, its done launches and where its launches were."""
        done = done_in(seen)

        def where(j: int) -> str:
            return ", ".join(
                f"{la}: {sorted(g)} {min(s[0] for s in g.values()):.1f}-"
                f"{max(s[1] for s in g.values()):.1f}"
                for (jj, la), g in sorted(spans.items())
                if jj == j
            )

        worst = [f"{secs:.1f} s {what}" for secs, what in clashes(spans)[:5]]
        said = (f"job {j} done in launch {done[j]}, seen in {where(j)}" for j in self.rerun)
        return "; ".join([*worst, *said])

    @property
    def clean(self) -> bool:
        return (
            all(d == 0.0 for d in self.double_s.values())
            and not any(self.twice.values())
            and not self.rerun
        )

    def line(self) -> str:
        worst = max(self.double_s.values(), default=0.0)
        twice = sorted({t for ts in self.twice.values() for t in ts})
        times = "".join(f", {k} {v:.1f} s" for k, v in self.times.items())
        return (
            f"{self.name}: {self.jobs} jobs, {self.launches} launches seen; "
            f"{worst:.1f} GPU-seconds double-booked, {len(twice)} jobs in two launches, "
            f"{len(self.rerun)} completed jobs run again; audit check: {self.audit}{times}"
        )

    def record(self) -> None:
        """Appends the line to $GPULEDGER_KILL_REPORT when it is set (scripts/kill_matrix)."""
        report = os.environ.get("GPULEDGER_KILL_REPORT")
        if report:
            with open(report, "a") as f:
                f.write(self.line() + "\n")
