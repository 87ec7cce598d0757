"""The admission and security settings are among the settings every server of a store runs
alike (`ledger.wire.config.admission_of`, `ledger.store.lease.Settings.admission`): a server
that admits otherwise is refused, and the refusal names what differs (atk39-28 F2)."""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest

from ledger.engines.slurm.cluster import identity
from ledger.store import lease
from ledger.wire.config import ServeConfig, admission_meaning, admission_of
from schemas.units import Duration, Interval

OTHERS = {
    "run_as": "service",
    "min_uid": 1,
    "max_uid": 65000,
    "root_jobs": True,
    "os_accounts": {"alice": "al"},
    "privileged_groups": ["wheel2"],
    "secret_env": "^SECRET$",
    "max_jobs_per_user": 5,
    "max_array_size": 10,
    "grace": Duration("5s"),
    "partition": "gpu",
    "debug_limit": Duration("5m"),
    "interval": Interval("0.5s"),
}
"""A value other than the default for each key that changes what a leader admits or runs."""
ROOT = (0, "root")
SERVICE = (995, "gpuledger")
"""The accounts a server may run as (uid, name)."""


@pytest.mark.parametrize("key", sorted(OTHERS))
def test_every_admission_setting_changes_what_is_recorded(key: str) -> None:
    other = msgspec.structs.replace(ServeConfig(), **{key: OTHERS[key]})
    assert admission_of(other, ROOT) != admission_of(ServeConfig(), ROOT)


def test_whether_the_server_runs_as_root_is_recorded() -> None:
    """atk40-28 F1: the server's own account decides with `run_as` whose account a job runs as
    (not root: every job runs as the server's); a root leader and a standby of a service
    account with one config file recorded the same settings, and either might lead."""
    root, service = admission_of(ServeConfig(), ROOT), admission_of(ServeConfig(), SERVICE)
    assert root != service
    named = lease.admission_differences(root, service)
    assert named == [
        'service_account "root (uid 0)" (recorded) against "gpuledger (uid 995)" here',
        "service_runs_as_root true (recorded) against false here",
    ], named


def test_which_service_account_the_server_runs_as_is_recorded() -> None:
    """Two servers of two service accounts (neither root) were recorded alike (only
    `service_runs_as_root`): after a failover the new leader ran jobs as another uid and could
    not cancel the ones the old leader had submitted to Slurm (atk42-28 F1)."""
    one = admission_of(ServeConfig(), SERVICE)
    other = admission_of(ServeConfig(), (996, "gpuledger-b"))
    named = lease.admission_differences(one, other)
    assert named == [
        'service_account "gpuledger (uid 995)" (recorded) against "gpuledger-b (uid 996)" here'
    ], named
    same_name = admission_of(ServeConfig(), (997, "gpuledger"))  # one name, another uid
    assert lease.admission_differences(one, same_name), "the uid is the account"


def test_a_key_an_earlier_version_did_not_record_refuses_nobody() -> None:
    """A row recorded before a key existed (the service account, the Slurm cluster's state)
    is compared by the keys it has: the next take records the rest."""
    mine = admission_of(ServeConfig(), SERVICE)
    earlier = json.loads(mine)
    del earlier["service_account"]
    recorded = json.dumps(earlier, sort_keys=True)
    assert lease.admission_differences(recorded, mine) == []
    earlier["min_uid"] = 1
    named = lease.admission_differences(json.dumps(earlier, sort_keys=True), mine)
    assert named == ["min_uid 1 (recorded) against 1000 here"], named


def test_what_stays_per_server_is_not_recorded_and_the_text_is_canonical() -> None:
    here = ServeConfig(
        listen="0.0.0.0:1", advertise="http://a:1", kafka="k:9092", max_batch=8,
        log_format="json", sample_every=Interval("5s"),
        privileged_groups=["b", "a", "b"], os_accounts={"z": "1", "a": "2"},
    )  # fmt: skip
    there = ServeConfig(privileged_groups=["a", "b"], os_accounts={"a": "2", "z": "1"})
    assert admission_of(here, ROOT) == admission_of(there, ROOT)
    assert list(json.loads(admission_of(here, ROOT))) == sorted(
        json.loads(admission_of(here, ROOT))
    )


def _settings(config: ServeConfig) -> lease.Settings:
    return lease.Settings(2.0, (3.0, 4.0), '{"executor":"agents"}', admission_of(config, ROOT))


def test_a_server_that_admits_otherwise_is_refused_naming_each_difference() -> None:
    recorded = _settings(ServeConfig(min_uid=1000))
    mine = _settings(ServeConfig(min_uid=1, root_jobs=True))
    assert mine.differs(recorded)
    why = lease.refusal(mine, recorded, "http://s0:8470", live=False)
    assert why is not None
    assert "min_uid 1000 (recorded) against 1 here" in why, why
    assert "root_jobs false (recorded) against true here" in why, why
    assert "recorded by the last leader, http://s0:8470" in why and "--new-settings" in why, why
    live = lease.refusal(mine, recorded, "http://s0:8470", live=True)
    assert live is not None and "the leader http://s0:8470 holds the lease now" in live, live
    assert lease.refusal(recorded, recorded, "http://s0:8470", live=True) is None


def test_a_row_from_before_the_admission_settings_refuses_nobody_for_them() -> None:
    """The first take of a server of this version records them (`lease._TAKE`)."""
    old_row = lease.Settings(2.0, (3.0, 4.0), '{"executor":"agents"}')
    assert not _settings(ServeConfig(min_uid=1)).differs(old_row)
    assert lease.refusal(_settings(ServeConfig(min_uid=1)), old_row, "s0", live=True) is None


def test_the_executor_is_said_before_the_admission_settings() -> None:
    recorded = _settings(ServeConfig(min_uid=1000))
    mine = dataclasses.replace(_settings(ServeConfig(min_uid=1)), work='{"executor":"none"}')
    why = lease.refusal(mine, recorded, "s0", live=False)
    assert why is not None and "--executor none" in why, why


@pytest.mark.parametrize(
    ("here", "there"),
    [
        ({"max_array_size": 0}, {"max_array_size": 10_000}),
        ({"privileged_groups": ["sudo"]}, {}),
        ({"privileged_groups": ["wheel2", "adm", "docker"]}, {"privileged_groups": ["wheel2"]}),
        ({"os_accounts": {"root": "root", "alice": "al"}}, {"os_accounts": {"alice": "al"}}),
        ({"os_accounts": {"svc": "svc"}}, {}),
    ],
    ids=["array 0 is 10000", "sudo built in", "built-ins listed", "own name", "only own name"],
)
def test_settings_written_otherwise_that_mean_the_same_are_recorded_alike(
    here: dict[str, object], there: dict[str, object]
) -> None:
    """atk40-28 F3: `max_array_size = 0` (10,000), the built-in `sudo` listed, an account mapped
    to its own name were recorded as other settings, and a standby so written could not start."""
    mine = admission_of(msgspec.structs.replace(ServeConfig(), **here), ROOT)
    theirs = admission_of(msgspec.structs.replace(ServeConfig(), **there), ROOT)
    assert mine == theirs
    assert not lease.admission_differences(theirs, mine)


def test_settings_that_mean_otherwise_still_differ() -> None:
    base = admission_of(ServeConfig(), ROOT)
    assert admission_of(ServeConfig(max_array_size=9_999), ROOT) != base
    assert admission_of(ServeConfig(privileged_groups=["wheel2"]), ROOT) != base
    assert admission_of(ServeConfig(os_accounts={"alice": "al"}), ROOT) != base


def test_admission_meaning_is_pure_and_keeps_what_it_does_not_know() -> None:
    given = {"max_array_size": 0, "privileged_groups": [], "os_accounts": {"a": "a"}, "x": 1}
    meant = admission_meaning(given)
    assert given["max_array_size"] == 0 and given["os_accounts"] == {"a": "a"}  # not changed
    assert meant["max_array_size"] == 10_000 and meant["os_accounts"] == {} and meant["x"] == 1
    assert "sudo" in meant["privileged_groups"]  # type: ignore[operator]
    assert admission_meaning(meant) == meant


SHOW_CONFIG = """Configuration data as of 2026-12-04T07:00:00
AccountingStorageType   = (null)
ClusterName             = gpuledger
SlurmctldHost[0]        = head(127.0.0.1)
SlurmctldHost[1]        = head2
SlurmctldPort           = {port}
SlurmdPort              = 6818
StateSaveLocation       = {state}
"""


STATE = "/var/spool/slurmctld"


def test_which_slurm_cluster_is_recorded_and_a_difference_named() -> None:
    """atk40-28 F2: which cluster a server talks to (its `SLURM_CONF`) and whether it accepts
    untracked processes were per server: a standby started with another cluster's
    configuration took its partition over after a failover."""
    a = identity(SHOW_CONFIG.format(port=6817, state=STATE), untracked_ok=False)
    assert a == {"slurm_cluster": "gpuledger at head(127.0.0.1),head2 port 6817",
                 "slurm_state": STATE, "slurm_untracked_ok": False}  # fmt: skip
    b = identity(SHOW_CONFIG.format(port=6917, state=STATE), untracked_ok=False)
    loose = identity(SHOW_CONFIG.format(port=6817, state=STATE), untracked_ok=True)
    here = admission_of(ServeConfig(executor="slurm"), ROOT, a)
    assert here == admission_of(ServeConfig(executor="slurm"), ROOT, dict(a))
    named = lease.admission_differences(here, admission_of(ServeConfig(), ROOT, b))
    assert named == [
        'slurm_cluster "gpuledger at head(127.0.0.1),head2 port 6817" (recorded) against '
        '"gpuledger at head(127.0.0.1),head2 port 6917" here'
    ], named
    named = lease.admission_differences(here, admission_of(ServeConfig(), ROOT, loose))
    assert named == ["slurm_untracked_ok false (recorded) against true here"], named


def test_two_clusters_of_one_name_controller_and_port_are_told_apart_by_their_state() -> None:
    """atk42-28 F3: the name, controller host text and port were the whole identity; two
    clusters alike in those (one started in the other's place, or a controller name each
    network resolves otherwise) were one. A row recorded without `slurm_state` (by the last
    version) is compared by the keys it has, and the next take records it."""
    b = identity(SHOW_CONFIG.format(port=6817, state=STATE), untracked_ok=False)
    c = identity(SHOW_CONFIG.format(port=6817, state="/srv/c/state"), untracked_ok=False)
    here, there = (admission_of(ServeConfig(executor="slurm"), ROOT, x) for x in (b, c))
    named = lease.admission_differences(here, there)
    assert named == [f'slurm_state "{STATE}" (recorded) against "/srv/c/state" here'], named
    earlier = json.loads(here)
    del earlier["slurm_state"]
    assert lease.admission_differences(json.dumps(earlier), there) == []
    assert identity("ClusterName=x\n", untracked_ok=False)["slurm_state"] == "?"


def _as_an_earlier_version(config: ServeConfig, *dropped: str) -> str:
    """What an earlier version (before b4925e2) recorded for `config`: the values as given, not
    as they mean, and without the keys it had not (`dropped`)."""
    text = json.loads(admission_of(config, SERVICE))
    for key in dropped:
        del text[key]
    text.update(
        max_array_size=config.max_array_size,
        privileged_groups=sorted(set(config.privileged_groups)),
        os_accounts=config.os_accounts,
    )
    return json.dumps(text, sort_keys=True)


def test_an_earlier_version_s_text_is_compared_by_what_it_means() -> None:
    """atk43ha F1: an earlier version's text was not compared at all, so across an upgrade a
    standby with `min_uid` 1 took over from the earlier leader's 1000. It is compared by what
    it means, for the keys it has; the keys it lacks are named as not compared."""
    same = ServeConfig(max_array_size=0, privileged_groups=["sudo"], os_accounts={"a": "a"})
    mine = admission_of(same, SERVICE)
    old = _as_an_earlier_version(same, "service_account", "service_runs_as_root")
    assert old != mine and lease.admission_differences(old, mine), "written otherwise"
    compared, skipped = lease.compared_admission(old, False, mine)
    assert lease.admission_differences(compared, mine) == []
    assert skipped == ["service_account", "service_runs_as_root"], skipped
    loose = admission_of(msgspec.structs.replace(same, min_uid=1), SERVICE)
    compared, _ = lease.compared_admission(old, False, loose)
    named = lease.admission_differences(compared, loose)
    assert named == ["min_uid 1000 (recorded) against 1 here"], named
    # a row of this version: as recorded, naming the keys it lacks (none here)
    assert lease.compared_admission(mine, True, mine) == (mine, [])
    lacking = json.loads(mine)
    del lacking["service_account"]
    text = json.dumps(lacking)
    assert lease.compared_admission(text, True, mine) == (text, ["service_account"])
    assert lease.compared_admission(None, False, mine) == (None, [])
