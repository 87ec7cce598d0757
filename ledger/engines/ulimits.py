"""The submitter's resource limits, given to the job as Slurm's PropagateResourceLimits=ALL does.

`submit` records its soft limits (`JobSubmitted.ulimits`: RLIMIT_AS, _CORE, _CPU, _DATA, _FSIZE,
_MEMLOCK, _NOFILE, _NPROC, _RSS and _STACK by their lower-case names, -1 unlimited). The job's
leader starts with each as its soft limit, set as the job's user, with the hard limit the node
gives it untouched: a limit is never raised above the node's hard limit. A submitter's limit
above it (`ulimit -n` of 1048576 on a login node, on a node whose hard limit is 524288; or
`unlimited`) is cut to the hard limit, and one line in the job's error file says so, as
slurmstepd logs `reducing req:... to max:...` (Slurm before 23.02: "Can't propagate RLIMIT_...
of ... from submit host"). On Slurm the batch script does the same in bash
(`slurm.script.ulimit_lines`), sbatch run with `--propagate=NONE`.

Imported by the per-job supervisor: the standard library only.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Callable, Iterable, Mapping

RESOURCES: dict[str, int] = {
    "as": resource.RLIMIT_AS,
    "core": resource.RLIMIT_CORE,
    "cpu": resource.RLIMIT_CPU,
    "data": resource.RLIMIT_DATA,
    "fsize": resource.RLIMIT_FSIZE,
    "memlock": resource.RLIMIT_MEMLOCK,
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
    "rss": resource.RLIMIT_RSS,
    "stack": resource.RLIMIT_STACK,
}
"""Each limit `submit` records (`schemas.bounds.LIMIT_NAMES`) and its RLIMIT_ number."""
UNLIMITED = -1
"""How a record says `unlimited` (RLIM_INFINITY)."""


def own_limits() -> dict[str, int]:
    """This process's soft limits by name, -1 unlimited: what `submit` records."""
    out = {}
    for name, number in RESOURCES.items():
        soft = resource.getrlimit(number)[0]
        out[name] = UNLIMITED if soft == resource.RLIM_INFINITY else int(soft)
    return out


def shown(value: int) -> str:
    """Pure: a limit as `ulimit` prints it."""
    return "unlimited" if value in (UNLIMITED, resource.RLIM_INFINITY) else str(value)


def plan(
    wanted: Mapping[str, int], hard_of: Callable[[int], int]
) -> tuple[list[tuple[int, int, int]], list[str]]:
    """Pure given `hard_of` (a limit's hard value, RLIM_INFINITY unlimited): the (RLIMIT_,
    soft, hard) each recorded limit is set to, and one line for each cut to the node's hard
    limit (module doc). Names this version does not know are passed over."""
    sets: list[tuple[int, int, int]] = []
    said: list[str] = []
    for name, value in sorted(wanted.items()):
        number = RESOURCES.get(name)
        if number is None:
            continue
        hard = hard_of(number)
        soft = resource.RLIM_INFINITY if value == UNLIMITED else value
        if hard != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft > hard):
            said.append(
                f"gpuledger: RLIMIT_{name.upper()}: the submitter's soft limit {shown(value)} "
                f"is above this node's hard limit {hard}: the job runs with {hard} "
                f'(as slurmstepd: "reducing req:{shown(value)} to max:{hard}")'
            )
            soft = hard
        sets.append((number, soft, hard))
    return sets, said


def hard_limit(number: int) -> int:
    return resource.getrlimit(number)[1]


def setter(sets: Iterable[tuple[int, int, int]]) -> Callable[[], None]:
    """What the job's leader runs before it starts (as the job's user): each soft limit set,
    the hard one as it was; one the kernel refuses stays as it was."""
    todo = list(sets)

    def apply() -> None:
        for number, soft, hard in todo:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(number, (soft, hard))

    return apply
