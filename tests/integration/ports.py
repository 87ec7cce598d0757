"""The one way integration tests pick a TCP port for a server they start (and may start again on
the same port): one free now, outside the kernel's ephemeral range. A port the kernel handed out
(`bind(0)`) comes from that range, where every outgoing connection on the machine takes its
source port: between the pick and the server's start another test's client took it ("cannot
listen on 127.0.0.1:36999: Address already in use", test_ha in the fresh-clone run of
2026-12-07). Below the range only other picks like this one can take it."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now, below the ephemeral range when there is room
    (else one the kernel picks)."""
    low = _ephemeral_low()
    pick = random.SystemRandom()
    for _ in range(200 if low > _LOWEST + 1_000 else 0):
        port = pick.randrange(_LOWEST, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
