"""A rebooted node's agent says so at once (docs/agent.md, "One agent per node"): the agent
records the boot it registered under in its state directory (`ledger.agent.identity`) and,
on another boot, names what it was before (`REBOOTED_HEADER`); the server believes it only by
`fence.reboot_honoured`, then the node's runs end at once instead of after the node-lost
timeout and the fence. Pure rule and the agent's side, on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.agent import identity
from ledger.engines.fence import reboot_honoured


@pytest.mark.parametrize(
    ("case", "claimed", "silent_s", "uptime_s", "want"),
    [
        ("the holder, silent since well before the boot", "h", 95.0, 60.0, True),
        ("the holder, silent since exactly the margin before", "h", 90.0, 60.0, True),
        ("the holder, heard from after the boot (a copy elsewhere)", "h", 40.0, 60.0, False),
        ("the holder, heard from just before the boot (the margin)", "h", 80.0, 60.0, False),
        ("another agent than the holder", "x", 1e6, 1.0, False),
        ("no claim", "", 1e6, 1.0, False),
        ("a nonsense uptime", "h", 1e6, float("nan"), False),
        ("a negative uptime", "h", 1e6, -5.0, False),
    ],
)
def test_a_reboot_is_believed_only_from_the_holder_silent_since_before_the_boot(
    case: str, claimed: str, silent_s: float, uptime_s: float, want: bool
) -> None:
    assert reboot_honoured(claimed, "h", silent_s, uptime_s, margin_s=30.0) is want, case


def _host(tmp_path: Path, boot: str, uptime: str = "12.50 3.00") -> None:
    random = tmp_path / "proc" / "sys" / "kernel" / "random"
    random.mkdir(parents=True, exist_ok=True)
    (random / "boot_id").write_text(boot + "\n")
    (tmp_path / "proc" / "uptime").write_text(uptime + "\n")


def test_the_agent_says_it_rebooted_once_its_host_has_another_boot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First start: nothing to say. Same boot (an agent restart): nothing. Another boot than the
    one recorded at registration: its name on that boot and its uptime."""
    monkeypatch.setenv(identity.PROC_ENV, str(tmp_path / "proc"))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    _host(tmp_path, "boot-a")
    first = identity.this_boot(state)
    assert (first.previous, first.rebooted_header()) == ("", "")
    ident = identity.agent_id(state)
    assert first.instance == identity.bound(ident, "boot-a") == identity.instance_id(state)
    identity.remember_boot(state, first.boot)
    assert identity.this_boot(state).rebooted_header() == ""  # restarted on the same boot
    _host(tmp_path, "boot-b")
    again = identity.this_boot(state)
    assert again.instance == identity.bound(ident, "boot-b") != first.instance
    assert again.previous == first.instance
    assert again.rebooted_header() == f"{first.instance} 12.5"
    same = again.not_rebooted()  # a part it adopted is alive: no reboot, whatever the id says
    assert (same.instance, same.rebooted_header(), same.boot) == (first.instance, "", "boot-a")
    identity.remember_boot(state, same.boot)
    assert identity.this_boot(state).rebooted_header() == again.rebooted_header()
    identity.remember_boot(state, again.boot)
    assert identity.this_boot(state).rebooted_header() == ""
    assert (state / identity.BOOT_FILE).stat().st_mode & 0o777 == 0o600


def test_a_host_without_a_boot_id_or_uptime_says_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(identity.PROC_ENV, str(tmp_path / "proc"))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    _host(tmp_path, "boot-a")
    identity.remember_boot(state, "boot-a")
    _host(tmp_path, "boot-b", uptime="garbage")
    assert identity.this_boot(state).rebooted_header() == ""  # no uptime: not believable
    (tmp_path / "proc" / "sys" / "kernel" / "random" / "boot_id").unlink()
    got = identity.this_boot(state)
    assert (got.instance, got.previous) == (identity.agent_id(state), "")
