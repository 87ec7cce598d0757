"""The kill matrix, with real agents, a real server and real jobs that fork children: kill -9 of a
job leader with live children, of a supervisor, of an agent, of the server, SIGTERM of the
server, and an agent stopped past the node-lost timeout and the fence then woken while its old
processes may live. A checker outside the ledger, from what the jobs themselves wrote (each
process logs its node, launch, GPUs and pid every 0.2 s) and from /proc sampled every 0.2 s,
finds 0 GPU-seconds double-booked, 0 jobs alive in two launches, 0 completed jobs run again, and
`audit check` agrees."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from tests.integration.test_node_agents import (  # noqa: F401 (fixtures)
    Cluster,
    alive,
    all_events,
    audit_check,
    cluster,
    template,
    wait_for,
    with_flags,
)

Span = tuple[float, float]


def job_script(seen: Path, secs: float) -> str:
    """Leader and a forked child each log `time node launch gpus pid` every 0.2 s; the leader
    writes `done` and exits 0 after `secs` of its own run (the child goes with the tree)."""
    line = 'echo "$(date +%s.%N) $GPULEDGER_NODE $GPULEDGER_LAUNCH $CUDA_VISIBLE_DEVICES $$"'
    out = f"{seen}/$GPULEDGER_JOB_ID"
    return (
        f"sh -c 'while :; do {line} >> {out}.child; sleep 0.2; done' & "
        f"end=$(( $(date +%s) + {int(secs)} )); "
        f'while [ "$(date +%s)" -lt "$end" ]; do {line} >> {out}.leader; sleep 0.2; done; '
        f'echo "$(date +%s.%N) $GPULEDGER_LAUNCH done" >> {out}.done; exit 0'
    )


def spans_of(seen: Path) -> dict[tuple[int, int], dict[tuple[str, int], Span]]:
    """(job, launch) -> (node, GPU) -> (first, last) time a process of it was seen there."""
    out: dict[tuple[int, int], dict[tuple[str, int], Span]] = {}
    for f in seen.glob("*.leader"):
        _add_lines(out, int(f.stem), f.read_text().splitlines())
    for f in seen.glob("*.child"):
        _add_lines(out, int(f.stem), f.read_text().splitlines())
    return out


def _add_lines(
    out: dict[tuple[int, int], dict[tuple[str, int], Span]], job: int, lines: Iterable[str]
) -> None:
    for ln in lines:
        parts = ln.split()
        if len(parts) != 5:
            continue  # a line cut by a kill
        at, node, launch, gpus = float(parts[0]), parts[1], int(parts[2]), parts[3]
        for g in gpus.split(","):
            key = (node, int(g))
            lo, hi = out.setdefault((job, launch), {}).get(key, (at, at))
            out[(job, launch)][key] = (min(lo, at), max(hi, at))


def overlaps(spans: dict[tuple[int, int], dict[tuple[str, int], Span]]) -> tuple[float, list[str]]:
    """(GPU-seconds held by two launches at once, the jobs alive in two launches at once)."""
    by_gpu: dict[tuple[str, int], list[tuple[Span, tuple[int, int]]]] = {}
    whole: dict[tuple[int, int], Span] = {}
    for run, gpus in spans.items():
        for gpu, sp in gpus.items():
            by_gpu.setdefault(gpu, []).append((sp, run))
        whole[run] = (min(s[0] for s in gpus.values()), max(s[1] for s in gpus.values()))
    double = 0.0
    for held in by_gpu.values():
        for i, (a, ra) in enumerate(held):
            for b, rb in held[i + 1 :]:
                if ra != rb:
                    double += max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    twice = []
    for (job, la), a in whole.items():
        for (job2, lb), b in whole.items():
            if job == job2 and la < lb and min(a[1], b[1]) > max(a[0], b[0]):
                twice.append(f"job {job}: launches {la} and {lb}")
    return double, twice


class ProcSampler(threading.Thread):
    """Every 0.2 s, each live process with a job's environment of this ledger (its
    GPULEDGER_HOME, which the CLI sent with the submission): (job, launch) -> (node, GPU) ->
    when it was first and last seen, from /proc (the ledger is not asked)."""

    def __init__(self, home: Path) -> None:
        super().__init__(daemon=True)
        self.home = str(home)
        self.spans: dict[tuple[int, int], dict[tuple[str, int], Span]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            now = time.time()
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                with contextlib.suppress(OSError):
                    raw = Path(f"/proc/{pid}/environ").read_bytes()
                    if b"GPULEDGER_LAUNCH=" not in raw or _state(pid) == "Z":
                        continue
                    env = dict(
                        kv.split("=", 1)
                        for kv in raw.decode(errors="replace").split("\0")
                        if "=" in kv
                    )
                    if env.get("GPULEDGER_HOME") != self.home:
                        continue  # another test's (or another ledger's) job
                    job, launch = int(env["GPULEDGER_JOB_ID"]), int(env["GPULEDGER_LAUNCH"])
                    node, gpus = env["GPULEDGER_NODE"], env["CUDA_VISIBLE_DEVICES"]
                    _add_lines(self.spans, job, [f"{now} {node} {launch} {gpus} {pid}"])


def _state(pid: str) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def pids_of(state: Path, job: int) -> tuple[int, int]:
    """(supervisor pid, leader pid) of job's current part in an agent's state directory."""
    runs = sorted(
        (state / "runs").glob(f"{job}.*/0"), key=lambda p: int(p.parent.name.split(".")[1])
    )
    rundir = runs[-1]
    sup = int((rundir / "supervisor").read_text().split()[0])
    leader = int((rundir / "job").read_text().split()[0])
    return sup, leader


@with_flags(serve=("--node-fence", "4s"))
def test_the_kill_matrix_double_books_nothing_and_runs_nothing_twice(
    cluster: Cluster,  # noqa: F811
) -> None:
    c = cluster
    rng = random.Random(24)
    seen = c.home.parent / "seen"
    seen.mkdir()
    sampler = ProcSampler(c.home)
    sampler.start()
    jobs = [c.submit(rng.choice((1, 1, 2)), job_script(seen, rng.uniform(15, 25)), "--resumable")
            for _ in range(12)]  # fmt: skip

    def running() -> list[int]:
        return [j for j, x in c.jobs().items() if x["status"] == "running"]

    def node_of(job: int) -> str:
        return str(c.job(job)["logs"][0].split(":", 1)[0])

    # 1. kill -9 of a job leader with live children: the job ends (failed, 137) once its tree
    #    is empty, its GPUs are not given to another job before
    victim = wait_for("a running job", lambda: running() and running()[0], 90, c.why)
    wait_for("its processes", lambda: (seen / f"{victim}.child").exists(), 30, c.why)
    _, leader = pids_of(c.agents[node_of(victim)].state, victim)
    os.kill(leader, signal.SIGKILL)
    # 2. kill -9 of a supervisor: its job runs on, its exit is read from the tree's own record
    others = lambda: [j for j in running() if j != victim] or None  # noqa: E731
    other = wait_for("another running job", others, 90, c.why)[0]
    sup, _ = pids_of(c.agents[node_of(other)].state, other)
    os.kill(sup, signal.SIGKILL)
    # 3. kill -9 of an agent, restarted
    node = node_of(wait_for("a running job", lambda: running() or None, 90, c.why)[0])
    c.agents[node].kill(signal.SIGKILL)
    time.sleep(1)
    c.agents[node].start()
    # 4. kill -9 of the server, then SIGTERM of it, each restarted
    for sig in (signal.SIGKILL, signal.SIGTERM):
        c.server.stop(sig)
        time.sleep(1)
        c.restart_server()
    # 5. an agent stopped past the node-lost timeout and the fence, then woken (with jobs of
    #    its own: the first ones may all have ended by now)
    late = [c.submit(1, job_script(seen, 20), "--resumable") for _ in range(3)]
    jobs += late
    late_running = lambda: [j for j in running() if j in late] or None  # noqa: E731
    node = node_of(wait_for("a late job to run", late_running, 90, c.why)[0])
    c.agents[node].kill(signal.SIGSTOP)
    wait_for("its node to be lost", lambda: c.nodes()[node] == "lost", 60, c.why)
    time.sleep(7)  # past the fence (4 s) and the grace: its runs end, resumable ones move
    c.agents[node].proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    wait_for("its node to return", lambda: c.nodes()[node] == "active", 60, c.why)
    ended = lambda: all(x["status"] == "finished" for x in c.jobs().values())  # noqa: E731
    wait_for("every job to end", ended, 300, c.why)
    time.sleep(1)
    sampler.stop.set()
    sampler.join()

    job_side, proc_side = spans_of(seen), sampler.spans
    for name, spans in (("job-side logs", job_side), ("/proc", proc_side)):
        double, twice = overlaps(spans)
        assert double == 0.0, f"{name}: {double:.1f} GPU-seconds double-booked"
        assert twice == [], f"{name}: {twice}"
    done_in: dict[int, list[int]] = {}
    for f in seen.glob("*.done"):
        done_in[int(f.stem)] = [int(ln.split()[1]) for ln in f.read_text().splitlines()]
    rerun = [j for j, launches in done_in.items()
             if any(la > min(launches) for (jj, la) in job_side if jj == j)]  # fmt: skip
    assert rerun == [], f"completed jobs run again: {rerun}"
    assert all(len(v) == 1 for v in done_in.values()), done_in
    final = c.jobs()
    assert final[victim]["outcome"] == "failed"
    completed = {j for j in jobs if final[j]["outcome"] == "completed"}
    assert completed == set(done_in), (completed, done_in)
    assert other in completed  # its supervisor's death did not turn its exit 0 into a failure
    assert len(job_side) >= len(jobs)
    events = all_events(c)
    assert [e for e in events if e["type"] == "job.engine_ended.v1" and e["reason"] == "lost"] == []
    c.server.stop(signal.SIGTERM)
    assert ": 0 violations" in audit_check(c), json.dumps(final, indent=1)[:3000]
