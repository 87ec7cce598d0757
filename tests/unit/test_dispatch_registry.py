"""The policy registry: names and versions, typed configs on the wire, knobs, and the policy a
config builds."""

from __future__ import annotations

import msgspec
import pytest

from ledger.dispatch import registry
from ledger.dispatch.baselines import LegacyCaps, LegacyCaps2, SlurmMultifactor, SlurmMultifactor2
from ledger.dispatch.fairshare2 import FairShare2
from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.fairshare9 import FairShare9
from ledger.dispatch.policy import FairShare, Fifo
from schemas.errors import InvalidCommand, UnknownEntity
from schemas.policy import (
    POLICY_CONFIG_TYPES,
    AnyPolicyConfig,
    FairShare2Config,
    FairShare3Config,
    FairShare4Config,
    FairShare5Config,
    FairShare6Config,
    FairShare7Config,
    FairShareConfig,
    FifoConfig,
    Legacy2Config,
    LegacyConfig,
    Slurm2Config,
    SlurmConfig,
    from_settings,
    settings,
)

CONFIGS: list[AnyPolicyConfig] = [
    FairShare7Config(),
    FairShare7Config(requeued_last=True, relaunch_cost_s=0.0, hold_share=0.0, debug_reserve_per=32),
    FairShare6Config(),
    FairShare6Config(debug_reserve_per=128),
    FairShare5Config(),
    FairShare4Config(),
    FairShare4Config(gain_horizon_s=3600.0, margin=0.2),
    FairShare3Config(),
    FairShare2Config(),
    FairShare2Config(team_depth=1, spare_ratio=2.0, debug_reserve_per=0, debug_lane=False),
    Slurm2Config(preempt_unfunded=True),
    Legacy2Config(caps={"ai2/olmo": 12}),
    FairShareConfig(),
    FairShareConfig(margin=0.25, min_rank_gap=2, debug_lane=False, search_budget=8),
    FifoConfig(),
    SlurmConfig(weight_age=10.0, half_life_s=86_400.0),
    LegacyConfig(caps={"ai2/olmo": 12, "ai2/tulu": 4}, team_depth=2),
]


def test_every_config_type_is_registered_under_its_tag() -> None:
    assert sorted(registry.VERSIONS) == sorted(t().version for t in POLICY_CONFIG_TYPES)
    for name, version in registry.CURRENT.items():
        assert registry.lookup(name) is registry.VERSIONS[version]
        assert registry.lookup(version).name == name


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.version)
def test_a_config_survives_the_wire_and_builds_its_policy_and_back(
    config: AnyPolicyConfig,
) -> None:
    data = msgspec.json.encode(config)
    assert msgspec.json.decode(data, type=AnyPolicyConfig) == config
    assert msgspec.json.decode(data)["version"] == config.version
    policy = registry.policy_from_config(config)
    assert policy.version == config.version
    assert registry.config_of(policy) == config
    # as v1 and v2 decision records wrote it, in strings
    assert from_settings(policy.version, settings(config)) == config


def test_the_built_policies_are_the_ones_the_names_stood_for() -> None:
    assert registry.policy_from_config(registry.default_config("fairshare-9")) == FairShare9(
        gain_horizon_s=1800.0
    )
    assert registry.policy_from_config(registry.default_config()) == FairShare7(
        gain_horizon_s=1800.0
    )
    assert registry.policy_from_config(registry.default_config("fairshare-6")) == FairShare2(
        version="fairshare-6", gain_horizon_s=1800.0, debug_reserve_per=16
    )
    assert registry.policy_from_config(registry.default_config("fairshare-4")) == FairShare2(
        version="fairshare-4", gain_horizon_s=1800.0
    )
    assert registry.policy_from_config(registry.default_config("fairshare-3")) == FairShare2()
    assert registry.policy_from_config(registry.default_config("fairshare-1")) == FairShare()
    assert registry.policy_from_config(registry.default_config("fifo")) == Fifo()
    assert registry.policy_from_config(registry.default_config("slurm-1")) == SlurmMultifactor()
    assert registry.policy_from_config(registry.default_config("slurm")) == SlurmMultifactor2()
    fractions = {"a/x": 0.75, "a/y": 0.25}
    legacy = registry.default_config("legacy-1", gpus=400, team_fractions=fractions)
    assert registry.policy_from_config(legacy) == LegacyCaps(caps={"a/x": 300, "a/y": 100})
    legacy = registry.default_config("legacy", gpus=400, team_fractions=fractions)
    assert registry.policy_from_config(legacy) == LegacyCaps2(caps={"a/x": 300, "a/y": 100})
    assert registry.ranked(FairShareConfig()) and not registry.ranked(FifoConfig())
    assert registry.half_life_s(SlurmConfig()) == SlurmConfig().half_life_s
    assert registry.half_life_s(FairShareConfig()) is None


def test_knobs_change_settings_and_refuse_unknown_ones_and_bad_values() -> None:
    tuned = registry.with_knobs(FairShareConfig(), {"margin": "0.3", "debug_lane": "false"})
    assert tuned == FairShareConfig(margin=0.3, debug_lane=False)
    with pytest.raises(InvalidCommand, match="has no setting wiggle"):
        registry.with_knobs(FairShareConfig(), {"wiggle": "1"})
    with pytest.raises(InvalidCommand, match="bad setting"):
        registry.with_knobs(FairShareConfig(), {"margin": "-1"})
    with pytest.raises(InvalidCommand, match="has no setting margin"):
        registry.with_knobs(FifoConfig(), {"margin": "0.1"})


def test_unknown_names_and_wire_configs_are_refused_clearly() -> None:
    with pytest.raises(UnknownEntity, match="unknown policy 'lottery'") as err:
        registry.default_config("lottery")
    assert "fairshare" in (err.value.hint or "")
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"version": "fairshare-0"}', type=AnyPolicyConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"version": "fairshare-1", "wiggle": 1}', type=AnyPolicyConfig)


SERVICE_KNOBS = {"margin": 0.2, "debug_lane": False, "squat_after_s": 600.0}


@pytest.mark.parametrize(
    ("given", "knobs", "known_only", "want"),
    [
        pytest.param(None, {}, False, registry.build("fairshare-7"), id="nothing: the default"),
        pytest.param("fifo", {}, False, Fifo(), id="a name: its defaults"),
        pytest.param(FairShareConfig(margin=0.5), {}, False, FairShare(margin=0.5), id="a config"),
        pytest.param(
            "fairshare-1", {"margin": "0.3"}, False, FairShare(margin=0.3), id="knobs as text"
        ),
        pytest.param(
            "fairshare-1",
            SERVICE_KNOBS,
            True,
            FairShare(margin=0.2, debug_lane=False, squat_after_s=600.0),
            id="the service's knobs set fair share",
        ),
        pytest.param("slurm", SERVICE_KNOBS, True, SlurmMultifactor2(), id="and mean nothing else"),
    ],
)
def test_build_is_the_one_way_to_a_policy(
    given: str | AnyPolicyConfig | None,
    knobs: dict[str, object],
    known_only: bool,
    want: object,
) -> None:
    assert registry.build(given, knobs, known_only=known_only) == want


def test_build_refuses_knobs_a_policy_lacks_unless_told_and_caps_legacy_teams() -> None:
    with pytest.raises(InvalidCommand, match="has no setting debug_lane, margin, squat_after_s"):
        registry.build("slurm", SERVICE_KNOBS)
    built = registry.build("legacy", gpus=10, team_fractions={"a/x": 0.75, "a/y": 0.25})
    assert built == LegacyCaps2(caps={"a/x": 7, "a/y": 2})
