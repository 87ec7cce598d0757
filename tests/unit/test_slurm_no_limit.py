"""atk61-slurm F3: a job with no time limit got no `--time`, so Slurm gave it the partition's
DefaultTime (or MaxTime) and killed it there while the service was up (`failed time_limit`,
exit 143), inside a contract `explain` promised. Now it asks `--time=UNLIMITED` (never
DefaultTime), and on a partition with a MaxTime it is not placed: it waits
`PARTITION_TIME_LIMIT`, saying why, as a job over MaxTime does (docs/slurm.md)."""

from __future__ import annotations

from collections.abc import Callable

from ledger.core.state import State
from ledger.cycle.executor import Launch
from ledger.cycle.inputs import snapshot_from_state, too_long
from ledger.engines.slurm.words import SbatchUser, backstop_minutes, sbatch_args
from ledger.reads.preview import NO_LIMIT, TOO_LONG, too_long_waits
from schemas import commands as c
from schemas.events import GpuSlot
from tests.conftest import T0
from tests.unit.test_fence import _run


def _times(limit: int | None, max_time_s: float | None) -> list[str]:
    job = Launch(1, (GpuSlot(node="vm", gpu_indices=(0,)),), ("true",), None, "bob", "ai2/o",
                 time_limit_s=limit)  # fmt: skip
    args = sbatch_args(job, "gpuledger", "/dev/null", SbatchUser(), "0123abcd4567",
                       max_time_s=max_time_s)  # fmt: skip
    return [a for a in args if a.startswith("--time")]


def test_a_job_with_no_limit_asks_slurm_for_none_never_its_default_time() -> None:
    assert _times(None, None) == ["--time=UNLIMITED"]
    assert _times(None, 3600.0) == ["--time=UNLIMITED"]  # (not placed there: below)
    assert _times(60, None) == ["--time=2"] and backstop_minutes(None, 30.0, None) == "UNLIMITED"


def test_a_job_with_no_limit_waits_on_a_partition_with_a_max_time(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    assert too_long(None, 3600.0) and not too_long(None, None) and not too_long(60.0, 3600.0)
    _run(org_state, counter_ids, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1), T0)
    [(job, blocked)] = too_long_waits(org_state, 60.0).items()
    assert (blocked.code, blocked.reason) == (TOO_LONG, NO_LIMIT.format("1m")), blocked
    assert too_long_waits(org_state, None) == {}
    snap = snapshot_from_state(org_state, {}, T0, longest_s=60.0)
    assert job not in {j.job_id for j in snap.pending}  # never placed there
    assert job in {j.job_id for j in snapshot_from_state(org_state, {}, T0).pending}
