"""`gpuledger status`'s line on the leader's lease (ledger.cli.serve._lease_line)."""

from __future__ import annotations

import pytest

from ledger.cli.serve import _lease_line
from schemas.api import Health


def health(lease_s: float | None, expires_in: float | None, renewed_ago: float | None) -> Health:
    return Health(status="up", version="0", started_at=0.0, head=0, cycles=0, last_cycle_at=None,
                  last_cycle_s=None, projection_position=0, projection_lag=0, relay_position=None,
                  relay_lag=None, role="standby", leader="http://a:1", epoch=3, lease_s=lease_s,
                  lease_expires_in_s=expires_in, lease_renewed_s_ago=renewed_ago)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "lease_s", "expires_in", "renewed_ago", "want"),
    [
        ("renewed in time", 6.0, 4.8, 1.2, "6 s, renewed 1.2 s ago, expires in 4.8 s"),
        (
            "renewal late",
            6.0,
            2.5,
            3.5,
            "6 s, renewed 3.5 s ago, expires in 2.5 s (late: the leader renews every 2.0 s)",
        ),
        (
            "ran out, nobody took it yet",
            5.0,
            -0.4,
            5.4,
            "5 s, renewed 5.4 s ago, expired 0.4 s ago: the leader does not renew it (down, paused "
            "or cut off from the store); a standby takes it at its next try",
        ),
        ("no lease seen", None, None, None, ""),
        ("released by a clean stop", 5.0, None, None, ""),
    ],
)
def test_lease_line(
    case: str,
    lease_s: float | None,
    expires_in: float | None,
    renewed_ago: float | None,
    want: str,
) -> None:
    assert _lease_line(health(lease_s, expires_in, renewed_ago)) == want, case
