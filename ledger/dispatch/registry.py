"""The policy registry: every scheduling policy version this build has, by name and by version.

Pure: lookups and conversions of values; no I/O.

A policy *name* (`fairshare`, `fifo`, `slurm`, `legacy`) stands for its current version; a
*version* (`fairshare-1`, ...) names one policy's code exactly, and its settings are a typed config
from `schemas.policy` (tagged by the version).

- `build(name_or_config, knobs)`: the one way to build the policy that decides: the service's,
  the read layer's (`queue`, `explain`), the simulator's, the what-if's and replay's;
- `default_config(name_or_version, ...)`: a version's default settings (legacy caps come from the
  cluster's size and the teams' fractions of it; `schemas.policy.BUILT_WITH`'s settings for new
  policies where a field added later defaults to what older logs were written with);
- `with_knobs(config, {"margin": "0.2"})`: the config with settings changed, checked;
- `policy_from_config(config)`: the policy of exactly those settings (what `build` ends with);
- `config_of(policy)`: back from a policy to its typed config (what a decision records).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from ledger.dispatch.baselines import (
    LegacyCaps,
    LegacyCaps2,
    SlurmLab,
    SlurmLab2,
    SlurmMultifactor,
    SlurmMultifactor2,
)
from ledger.dispatch.fairshare2 import FairShare2
from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.fairshare8 import FairShare8
from ledger.dispatch.fairshare9 import FairShare9
from ledger.dispatch.fairshare10 import FairShare10
from ledger.dispatch.fairshare11 import FairShare11
from ledger.dispatch.fairshare12 import FairShare12
from ledger.dispatch.fairshare13 import FairShare13
from ledger.dispatch.fairshare14 import FairShare14
from ledger.dispatch.fairshare16 import FairShare16
from ledger.dispatch.fairshare17 import FairShare17
from ledger.dispatch.policy import FairShare, Fifo, Policy
from schemas.errors import InvalidCommand, UnknownEntity
from schemas.policy import (
    BUILT_WITH,
    AnyPolicyConfig,
    FairShare2Config,
    FairShare3Config,
    FairShare4Config,
    FairShare5Config,
    FairShare6Config,
    FairShare7Config,
    FairShare8Config,
    FairShare9Config,
    FairShare10Config,
    FairShare11Config,
    FairShare12Config,
    FairShare13Config,
    FairShare14Config,
    FairShare16Config,
    FairShare17Config,
    FairShareConfig,
    FifoConfig,
    Legacy2Config,
    LegacyConfig,
    Slurm2Config,
    SlurmConfig,
    SlurmLab2Config,
    SlurmLabConfig,
)


@dataclass(frozen=True)
class Registered:
    """One policy version: its name, config type, and the policy that decides."""

    name: str
    """The policy's family name (`fairshare`); the current version answers to it."""
    config_type: type[AnyPolicyConfig]
    policy_type: Callable[..., Policy]
    """The policy's code; its fields are the config's plus `version`."""
    ranked: bool
    """Whether its order reads fair-share ranks (a rank source must count usage)."""

    @property
    def version(self) -> str:
        tag = self.config_type.__struct_config__.tag
        assert isinstance(tag, str)
        return tag

    def build(self, config: AnyPolicyConfig) -> Policy:
        """config -> policy."""
        return self.policy_type(version=config.version, **_fields(config))


def _fields(config: AnyPolicyConfig) -> dict[str, Any]:
    return msgspec.structs.asdict(config)


VERSIONS: dict[str, Registered] = {
    r.version: r
    for r in (
        Registered("fairshare", FairShare17Config, FairShare17, ranked=True),
        Registered("fairshare", FairShare16Config, FairShare16, ranked=True),
        Registered("fairshare", FairShare14Config, FairShare14, ranked=True),
        Registered("fairshare", FairShare13Config, FairShare13, ranked=True),
        Registered("fairshare", FairShare12Config, FairShare12, ranked=True),
        Registered("fairshare", FairShare11Config, FairShare11, ranked=True),
        Registered("fairshare", FairShare10Config, FairShare10, ranked=True),
        Registered("fairshare", FairShare9Config, FairShare9, ranked=True),
        Registered("fairshare", FairShare8Config, FairShare8, ranked=True),
        Registered("fairshare", FairShare7Config, FairShare7, ranked=True),
        Registered("fairshare", FairShare6Config, FairShare2, ranked=True),
        Registered("fairshare", FairShare5Config, FairShare2, ranked=True),
        Registered("fairshare", FairShare4Config, FairShare2, ranked=True),
        Registered("fairshare", FairShare3Config, FairShare2, ranked=True),
        Registered("fairshare", FairShare2Config, FairShare2, ranked=True),
        Registered("fairshare", FairShareConfig, FairShare, ranked=True),
        Registered("fifo", FifoConfig, Fifo, ranked=False),
        Registered("slurm", SlurmConfig, SlurmMultifactor, ranked=True),
        Registered("slurm", Slurm2Config, SlurmMultifactor2, ranked=True),
        Registered("slurm-lab", SlurmLab2Config, SlurmLab2, ranked=True),
        Registered("slurm-lab", SlurmLabConfig, SlurmLab, ranked=True),
        Registered("legacy", Legacy2Config, LegacyCaps2, ranked=False),
        Registered("legacy", LegacyConfig, LegacyCaps, ranked=False),
    )
}
"""Every registered version -> its entry."""

CURRENT: dict[str, str] = {
    "fairshare": "fairshare-7",
    "legacy": "legacy-2",
    "slurm": "slurm-2",
    "slurm-lab": "slurm-lab-2",
    "fifo": "fifo-1",
}
"""Policy name -> the version it stands for."""

NAMES: tuple[str, ...] = tuple(CURRENT)
"""The registered policy names (the default first)."""

DEFAULT = NAMES[0]


def lookup(name_or_version: str) -> Registered:
    """The registered version a name or version stands for; UnknownEntity naming the choices."""
    found = VERSIONS.get(CURRENT.get(name_or_version, name_or_version))
    if found is None:
        choices = ", ".join([*NAMES, *sorted(VERSIONS)])
        raise UnknownEntity(
            f"unknown policy {name_or_version!r}",
            hint=f"use one of {choices}",
            version=name_or_version,
        )
    return found


def default_config(
    name_or_version: str = DEFAULT,
    *,
    gpus: int = 0,
    team_fractions: Mapping[str, float] | None = None,
) -> AnyPolicyConfig:
    """Pure: the default settings of a policy. `legacy` caps each team at its fraction of the
    cluster's `gpus` (rounded down); the others ignore `gpus` and `team_fractions`."""
    entry = lookup(name_or_version)
    if entry.config_type in (LegacyConfig, Legacy2Config):
        fractions = team_fractions or {}
        caps = {t: math.floor(f * gpus) for t, f in sorted(fractions.items())}
        return entry.config_type(caps=caps)
    return with_knobs(entry.config_type(), BUILT_WITH.get(entry.version, {}))


def with_knobs(config: AnyPolicyConfig, knobs: Mapping[str, object]) -> AnyPolicyConfig:
    """Pure: `config` with the settings in `knobs` changed (values may be strings, as typed on a
    command line). An unknown setting or a bad value raises InvalidCommand naming it."""
    if not knobs:
        return config
    kind = type(config)
    unknown = sorted(set(knobs) - set(kind.__struct_fields__))
    if unknown:
        have = ", ".join(kind.__struct_fields__) or "none"
        raise InvalidCommand(
            f"policy {config.version!r} has no setting {', '.join(unknown)}",
            hint=f"its settings: {have}",
            version=config.version,
        )
    merged = {**_fields(config), **knobs}
    try:
        return msgspec.convert(merged, kind, strict=False)
    except msgspec.ValidationError as err:
        raise InvalidCommand(
            f"bad setting for policy {config.version!r}: {err}", version=config.version
        ) from err


def build(
    policy: str | AnyPolicyConfig | None = None,
    knobs: Mapping[str, object] | None = None,
    *,
    known_only: bool = False,
    gpus: int = 0,
    team_fractions: Mapping[str, float] | None = None,
) -> Policy:
    """Pure: the policy that decides: `policy` is a name or version (its default settings;
    `legacy` caps from `gpus` and `team_fractions`, see `default_config`), a typed config (those
    settings), or None (the default policy); then the settings in `knobs` changed
    (`with_knobs`). A knob the policy has no setting for is refused, unless `known_only`: then it
    is left out (the service's `--margin`, `--debug-lane` and `--squat-after` set fair share's
    settings and mean nothing to the other policies)."""
    if policy is None or isinstance(policy, str):
        config = default_config(policy or DEFAULT, gpus=gpus, team_fractions=team_fractions)
    else:
        config = policy
    if knobs and known_only:
        knobs = {k: v for k, v in knobs.items() if k in type(config).__struct_fields__}
    return policy_from_config(with_knobs(config, knobs or {}))


def policy_from_config(config: AnyPolicyConfig) -> Policy:
    """Pure: the policy that decides with `config` (its version's code)."""
    return lookup(config.version).build(config)


def config_of(policy: Policy) -> AnyPolicyConfig:
    """Pure: the typed config of a registered policy (`policy_from_config` inverted).
    UnknownEntity when its version is not registered."""
    entry = VERSIONS.get(policy.version)
    if entry is None:
        lookup(policy.version)  # raises, naming the choices
    assert entry is not None
    fields = {k: getattr(policy, k) for k in entry.config_type.__struct_fields__}
    return entry.config_type(**fields)


def ranked(config: AnyPolicyConfig) -> bool:
    """Pure: whether the policy's order reads fair-share ranks."""
    return lookup(config.version).ranked


def half_life_s(config: AnyPolicyConfig) -> float | None:
    """Pure: the half-life with which the policy's rank source decays usage (None: a window)."""
    slurms = (SlurmConfig, Slurm2Config, SlurmLabConfig)
    return config.half_life_s if isinstance(config, slurms) else None
