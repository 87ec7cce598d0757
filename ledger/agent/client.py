"""The agent's side of the server's agent API (`/v1/agent/*`, node token): one client per
thread of `ledger.agent.node`, following the leader of a list of servers (docs/ha.md) and fencing
out a deposed one by the leader epoch of the lists it took. An edge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from schemas import agent as a
from schemas.errors import Unavailable

if TYPE_CHECKING:
    from collections.abc import Callable

    from ledger.wire.client import Silent

ANSWER_S = 2.5
"""How long an agent waits for one server of a list to answer a request (a long poll: its own
wait + `POLL_MARGIN_S`) before it asks the next: a frozen server accepts connections and never
answers, and the node's lease must outlast the time to leave it (docs/ha.md, the sizing rule).
Each server passed so is asked again only `ledger.wire.client.SILENT_SKIP_S` later. With one
server there is none to go to: `ONE_SERVER_S`."""
POLL_MARGIN_S = 5.0
"""A long poll not answered this long after its wait is a silent server."""
ONE_SERVER_S = 30.0
"""The timeout of a request beyond its wait when the agent has one server only."""


@dataclass
class Seen:
    """The newest leader epoch whose list this agent took (shared by its clients)."""

    epoch: int = 0


Polled = tuple[a.Assignment, tuple[a.Unreadable, ...]]
"""A poll's answer: the node's list and the parts of it the agent cannot read."""


class AgentClient:
    """The agent API over the project's HTTP client (one per thread). `url` may list several
    servers (docs/ha.md): the client follows the leader; `seen` fences out a deposed one."""

    def __init__(
        self,
        url: str,
        token: str,
        timeout: float,
        seen: Seen | None = None,
        silent: Silent | None = None,
        on_keep: Callable[[float, int, tuple[float, float] | None], None] | None = None,
        agent: str = "",
        rebooted: str = "",
    ) -> None:
        from ledger.wire.client import Client

        self.client = Client(url, token, timeout=timeout, silent=silent)
        self.client.on_keep = on_keep
        if agent:  # which agent this is: one per node (`AgentExecutor.hold`)
            self.client.headers[a.AGENT_HEADER] = agent
        if rebooted:  # its host rebooted since it last registered (`identity.Boot`)
            self.client.headers[a.REBOOTED_HEADER] = rebooted
        self.seen = seen if seen is not None else Seen()

    @property
    def node_lease(self) -> tuple[float, float] | None:
        """The settings the last answer renews the node's lease under (`Client.node_lease`)."""
        return self.client.node_lease

    def call(self, method: str, path: str, body: Any, type: Any) -> Any:
        """One call of the agent API, sent again to the next server (or the leader one names)
        when a server let it time out: every call is idempotent (a registration, a heartbeat; a
        report not taken is sent again with the next anyway), and a slow leader's stall ends in
        an answer, not in a second's pause and a new request that may meet its next stall
        (atk37-28 F2)."""
        if isinstance(body, msgspec.Struct):  # defaults left out: an older server takes it
            from ledger.wire.client import sent

            body = sent(body)
        data = None if body is None else msgspec.json.encode(body)
        answer = self.client.request(method, path, data, idempotent=True)
        return msgspec.json.decode(answer, type=type)

    def poll(self, node: str, since: str, wait_s: float) -> Polled:
        """The node's list, and the parts of it this agent cannot read (`decode_assignment`)."""
        from urllib.parse import urlencode

        q = urlencode({"node": node, "since": since, "wait": wait_s})
        answer = self.client.request("GET", f"/v1/agent/poll?{q}", None, idempotent=True)
        got, unreadable = a.decode_assignment(answer)
        if 0 < got.epoch < self.seen.epoch:  # a deposed leader's list: never launch or stop by it
            raise Unavailable(
                f"a server of leader epoch {got.epoch} answered after epoch {self.seen.epoch}",
                hint="asking the leader again",
            )
        self.seen.epoch = max(self.seen.epoch, got.epoch)
        return got, unreadable
