"""Pure: who an OS account is on the Unix socket under serve.toml's `os_accounts` (atk46-23 F4;
`ledger.server.identity.socket_user`): the map read backwards, a mapped namesake refused."""

from __future__ import annotations

import pytest

from ledger.server.identity import socket_user
from schemas.errors import NotAuthenticated

MAP = {"jsmith": "smithj", "ann": "shared", "bea": "shared", "same": "same"}


@pytest.mark.parametrize(
    ("os_name", "want"),
    [
        ("smithj", "jsmith"),  # the OS account of ledger user jsmith is jsmith
        ("carol", "carol"),  # unmapped: its own name
        ("same", "same"),  # mapped to itself: its own name
        ("jsmith", "is not the ledger user 'jsmith'"),  # OS user jsmith is another person
        ("shared", "several ledger users"),  # ann and bea: which one cannot be said
    ],
)
def test_the_socket_reads_os_accounts_backwards(os_name: str, want: str) -> None:
    got = socket_user(os_name, MAP)
    if isinstance(got, NotAuthenticated):
        assert want in str(got), got
        assert "\n" not in str(got)
    else:
        assert got == want
    assert socket_user(os_name, {}) == os_name  # no map: the OS name, as before
