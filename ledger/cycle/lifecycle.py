"""The service's lifecycle log lines: what `gpuledger up` prints as its jobs start and end.

Pure: takes the events the log gained and the jobs they are about; returns lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from schemas import events as e
from schemas.units import plural

if TYPE_CHECKING:
    from ledger.core.state import Job


def lifecycle_lines(
    events: Sequence[e.AnyEvent], jobs: Mapping[int, Job], output_dir: str
) -> list[str]:
    """Pure: one line per job that started, finished, failed or was preempted in `events` (what
    the log gained), naming where a job's output goes (the files its engine reported, else
    `<output_dir>/job-N.log`)."""
    out = []
    started: dict[int, tuple[str, ...]] = {}
    """The logs of the jobs that started in `events` (`jobs` may predate their start)."""
    for ev in events:
        job = jobs.get(ev.job_id) if isinstance(ev, e.JobStarted | e.JobFinished) else None
        who = f"job {getattr(ev, 'job_id', '?')}"
        if job is not None:
            s = job.spec
            who += f" ({s.account}, {s.user}, {plural(s.gpus, 'GPU')})"
        if isinstance(ev, e.JobStarted):
            started[ev.job_id] = ev.logs
        logs = started.get(ev.job_id, ()) if isinstance(ev, e.JobEvent) else ()
        logs = logs or (job.logs if job is not None else ())
        log = (
            f"output: {', '.join(_paths(logs))}"
            if logs
            else (f"output: {output_dir}/job-{getattr(ev, 'job_id', '?')}.log")
        )
        match ev:
            case e.JobStarted():
                where = "; ".join(
                    f"{sl.node} GPUs {','.join(map(str, sl.gpu_indices))}"
                    for sl in (job.slots if job is not None else ())
                )
                out.append(f"{who} started{' on ' + where if where else ''}; {log}")
            case e.JobFinished() if ev.outcome in ("completed", "failed"):
                code = "" if ev.exit_code is None else f" (exit code {ev.exit_code})"
                out.append(f"{who} {ev.outcome}{code}; {log}")
            case e.JobFinished():
                out.append(f"{who} {ev.outcome}")
            case e.JobPreempted():
                out.append(f"job {ev.job_id} preempted ({ev.reason})")
            case e.JobUnplaced():
                out.append(f"job {ev.job_id} back in the queue, never started ({ev.reason})")
    return out


def _paths(logs: Sequence[str]) -> list[str]:
    """Pure: the files of a job's logs (`NODE:PATH` as agents report them, or a path), each once."""
    return list(dict.fromkeys(p.split(":", 1)[1] if ":" in p and not p.startswith("/") else p
                              for p in logs))  # fmt: skip
