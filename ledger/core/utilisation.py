"""Since when each running job has stayed below the squat threshold: a fold of its samples.

Pure: `observe` folds one event; no clock, no I/O. The dispatcher cycle feeds it the log's new
events; replay feeds it the events up to a decision's position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas import events as e

DEFAULT_SQUAT_UTIL_PCT = 10.0
"""The squat threshold of a policy (or recorded settings) that does not set one."""


def squat_threshold(policy: object) -> float:
    """Pure: the utilisation % below which a running job counts as low, as `policy` declares it
    (a policy or its typed settings: fair share's `squat_util_pct`); the default for those that
    declare none (the baselines). The dispatcher and replay ask this one rule."""
    return float(getattr(policy, "squat_util_pct", DEFAULT_SQUAT_UTIL_PCT))


DEFAULT_SQUAT_AFTER_S = 3600.0
"""How long a job past its contract must stay low to squat, for a policy that does not say."""


def squat_after(policy: object) -> float:
    """Pure: how long (s) a running job past its contract must stay below the threshold to
    count as squatting, as `policy` declares it (`serve --squat-after` records it in the
    policy's settings); the default for those that declare none."""
    return float(getattr(policy, "squat_after_s", DEFAULT_SQUAT_AFTER_S))


@dataclass
class UtilTracker:
    """Since when each running job has stayed below the squat threshold (from its samples)."""

    threshold_pct: float = DEFAULT_SQUAT_UTIL_PCT
    low_since: dict[int, float] = field(default_factory=dict)

    def observe(self, event: e.AnyEvent) -> None:
        if isinstance(event, e.UtilisationSampled):
            mean = sum(event.gpu_utilisation) / max(1, len(event.gpu_utilisation))
            if mean < self.threshold_pct:
                self.low_since.setdefault(event.job_id, event.at)
            else:
                self.low_since.pop(event.job_id, None)
        elif isinstance(event, e.JobPreempted | e.JobUnplaced | e.JobFinished | e.JobPlaced):
            self.low_since.pop(event.job_id, None)
