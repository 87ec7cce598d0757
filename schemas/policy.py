"""Policy configs: the settings of every registered scheduling policy version, as typed values.

One frozen Struct per policy version, tagged by the version string (`version` on the wire), so a
config names the code that reads it: `FairShareConfig` is "fairshare-1", `FifoConfig` "fifo-1",
`SlurmConfig` "slurm-1", `LegacyConfig` "legacy-1". `AnyPolicyConfig` is their union: decode one
with `msgspec.json.decode(data, type=AnyPolicyConfig)`. A policy whose behaviour changes gets a
new version and a new Struct here; an old one stays as long as its decisions must replay.

`ledger.dispatch.registry` builds the policy of a config (`policy_from_config`).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

WEEK_S = 7 * 24 * 3600.0

NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Searches = Annotated[int, msgspec.Meta(ge=0)]


class PolicyConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="version"
):
    """The root of the policy configs; `version` is the tag."""

    @property
    def version(self) -> str:
        """The policy version this config is for (its tag)."""
        tag = type(self).__struct_config__.tag
        assert isinstance(tag, str)
        return tag


class FairShareConfig(PolicyConfig, frozen=True, kw_only=True, tag="fairshare-1"):
    """Hierarchical fair share with contracts, a preemption margin, squatting and a debug lane
    (ranks people: a leaf outranking another by the margin may preempt it)."""

    margin: NonNegative = 0.1
    """Hysteresis: a fair-share preemption needs the waiting side's level fair share to exceed
    the victim side's by the factor 1 + margin."""
    min_rank_gap: Annotated[int, msgspec.Meta(ge=1)] = 1
    """The rank difference needed when level fair shares are missing."""
    squat_after_s: NonNegative = 3600.0
    """A job past its contract with low utilisation for this long is squatting."""
    squat_util_pct: Annotated[float, msgspec.Meta(ge=0, le=100)] = 10.0
    """The utilisation below which a job counts as low."""
    debug_lane: bool = True
    """Funded debug-class jobs may preempt any job past its contract, whatever the ranks."""
    search_budget: Searches = 32
    """At most this many victim searches per cycle."""


class FifoConfig(PolicyConfig, frozen=True, kw_only=True, tag="fifo-1"):
    """First come, first served; never preempts."""


class SlurmConfig(PolicyConfig, frozen=True, kw_only=True, tag="slurm-1"):
    """Slurm-like multifactor priority over half-life-decayed Fair Tree ranks; preemption by
    partition tier only (funded over unfunded)."""

    weight_fairshare: NonNegative = 10_000.0
    weight_age: NonNegative = 1_000.0
    max_age_s: Annotated[float, msgspec.Meta(gt=0)] = WEEK_S
    half_life_s: Annotated[float, msgspec.Meta(gt=0)] = WEEK_S
    """PriorityDecayHalfLife: the rank source decays usage with it."""
    search_budget: Searches = 32


class LegacyConfig(PolicyConfig, frozen=True, kw_only=True, tag="legacy-1"):
    """Static priority levels, per-team caps on non-preemptible GPUs, preemptible overflow."""

    caps: dict[str, Annotated[int, msgspec.Meta(ge=0)]] = msgspec.field(default_factory=dict)
    """Team path -> GPUs it may hold non-preemptibly."""
    team_depth: Annotated[int, msgspec.Meta(ge=1)] = 2
    search_budget: Searches = 32


AnyPolicyConfig = FairShareConfig | FifoConfig | SlurmConfig | LegacyConfig
"""Any registered policy version's config (tagged by `version`)."""

POLICY_CONFIG_TYPES: tuple[type[PolicyConfig], ...] = (
    FairShareConfig,
    FifoConfig,
    SlurmConfig,
    LegacyConfig,
)
