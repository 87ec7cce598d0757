"""The node's lease, `<state_dir>/lease`: the node agent's side of the node fence (docs/agent.md).

Every part's supervisor and watchdog read `until` (`ledger.engines.lease_file.NodeLease`) and
stop the part once it has passed (a missing file too, at the last `until` they read). The
agent renews it at each contact with a server (and at each keep of a server whose store is
away) to the time the request was sent + the server's node-lost timeout + its fence, less
`LEASE_MARGIN_S`. The file also holds those two settings, as the server last gave them: an
agent restarted while no server can register it (the store away) still renews the lease by
the servers' keeps, before its first registration (a restarted agent that waited for it lost
every job of its node at the old lease's end: atk36-28 F4).
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import threading
from pathlib import Path

import msgspec

from ledger.engines.proc import write_atomic

LEASE_MARGIN_S = 3.0
"""A lease runs out this much before the server may call its fence passed: a part looks at its
lease once a second (`supervise.FENCE_CHECK_S`), so its SIGTERM and its SIGKILL after the grace
each come up to a second late, and clocks differ."""
RENEW_EVERY_S = 0.25
"""The lease file is written at most this often (a renewal less than this later is skipped): so
the file may say a contact up to this much older than the last one (the sizing rule counts it;
once a second cost up to a second of every node lease)."""
NO_FENCE_UNTIL = 1e12
"""The lease an agent whose server has no fence writes (the year 33658): the file stays, as a
part counts a missing lease as run out (atk39-23 F7)."""
REFUSED_PAUSE_S = 1.0
"""How long an agent's reporter and poller wait after a request no server took."""


def too_short(
    node_lost_after_s: float,
    node_fence_s: float,
    keep_delay_s: float,
    heartbeat_s: float,
    servers: int,
    answer_s: float,
) -> float | None:
    """Pure: what the node's lease needs, in seconds, when it is shorter than that (None: long
    enough, or no lease, or no server keeps): the sizing rule of docs/ha.md. The lease was
    renewed up to a heartbeat (and `RENEW_EVERY_S`) before the store went away; a server keeps
    it from its keep delay on. A request begun then reaches a keeping server past every silent
    one of the list, `answer_s` each: each silent server is probed again once its pass
    (`SILENT_SKIP_S`) runs out, on its own clock, so with k of them silent a request may spend
    k x `answer_s` before it is kept, and all but one of the list may be silent (the rule
    counted one: atk37-28 F3); one that ended on a refusal just before is begun again
    `REFUSED_PAUSE_S` later."""
    if not node_fence_s or not keep_delay_s:
        return None
    silent = (servers - 1) * answer_s
    need = heartbeat_s + RENEW_EVERY_S + keep_delay_s + REFUSED_PAUSE_S + silent
    have = lease_until(0.0, node_lost_after_s, node_fence_s)
    return need if have <= need else None


class LeaseFile(msgspec.Struct, kw_only=True):
    """What `<state_dir>/lease` holds (older agents wrote `until` alone)."""

    until: float
    node_lost_after_s: float | None = None
    node_fence_s: float | None = None


def lease_until(sent: float, node_lost_after_s: float, node_fence_s: float) -> float:
    """Pure: until when a contact sent at `sent` holds the node's lease."""
    return sent + node_lost_after_s + max(node_fence_s - LEASE_MARGIN_S, 0.0)


class NodeLease:
    """The lease file and the server settings it is renewed by."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lost_after_s = 60.0
        self.fence_s: float | None = None
        """The server's fence (`Registered.node_fence_s`): None while not known (no lease is
        renewed), 0: the server has no fence (no lease)."""
        self.until = 0.0
        self._learned_at = -math.inf
        """When the request was sent whose answer gave the settings held now (wall time)."""
        self._lock = threading.Lock()
        """The agent's threads learn and renew at once (a renewal never reads half of a
        change)."""
        with contextlib.suppress(OSError, msgspec.DecodeError, msgspec.ValidationError):
            got = msgspec.json.decode(path.read_bytes(), type=LeaseFile)
            self.until = got.until
            if got.node_fence_s is not None and got.node_lost_after_s is not None:
                self.lost_after_s, self.fence_s = got.node_lost_after_s, got.node_fence_s

    def learn(self, lost_after_s: float, fence_s: float, sent: float | None = None) -> None:
        """The settings an answer gave (written with the next renewal), to a request sent at
        `sent` (wall time; None: not known, taken whatever came before). An answer to a request
        sent before the one whose settings are held now changes nothing: across a failover that
        changed them, the old leader's answer, handled by one thread after the new leader's by
        another, put the old, longer lease back (and the next renewal, from the new leader's
        contact, ran by it: atk39-28 F1)."""
        with self._lock:
            if sent is not None:
                if sent < self._learned_at:
                    return
                self._learned_at = sent
            if (lost_after_s, fence_s) != (self.lost_after_s, self.fence_s):
                self.until = 0.0  # written at the next renewal, whatever it says
            self.lost_after_s, self.fence_s = lost_after_s, fence_s

    def renew(self, sent: float) -> None:
        """Renew the lease from a contact (or a keep) sent at `sent` (wall time); a server
        without a fence: a lease that never runs out (`NO_FENCE_UNTIL`; an older one would
        stop the parts for nothing, and a missing one runs out)."""
        with self._lock:
            self._renew(sent)

    def _renew(self, sent: float) -> None:
        if self.fence_s is None or sent <= 0:
            return  # never registered here: the server's fence is not known
        if self.fence_s:
            until = lease_until(sent, self.lost_after_s, self.fence_s)
        else:
            until = NO_FENCE_UNTIL
        if until < self.until + RENEW_EVERY_S:
            return
        self.until = until
        data = LeaseFile(
            until=until, node_lost_after_s=self.lost_after_s, node_fence_s=self.fence_s
        )
        write_atomic(self.path, msgspec.json.encode(data), sync=False)


def jobs_may_not_enter(state_dir: Path) -> str:
    """Why the jobs' own accounts could not reach their run directories under `state_dir`
    ("" when they can): each job's checkpoint file (`GPULEDGER_CHECKPOINT_FILE`) is
    `STATE/runs/<run>/<rank>/work/checkpoint`, so the state directory and every directory
    above it must let other accounts pass (`o+x`); a 0700 state directory left every job's
    checkpoint out of its reach, so resumable jobs were preempted as if they never
    checkpointed, and nothing said so (atk43 F10). Directories not made yet are the agent's
    to make (0755)."""
    path = state_dir.absolute()
    for d in (path, *path.parents):
        try:
            st = os.stat(d)
        except FileNotFoundError:
            continue
        if not st.st_mode & stat.S_IXOTH:
            return f"{d} does not let other accounts pass (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def others_may_write(state_dir: Path, uid: int) -> str:
    """Why the agent's state directory is not its own ("" when it is, or does not exist yet):
    another account that may write it may rewrite the node's lease (`{"until": 0}` stops every
    job of the node; an unreadable one turned its fence off) and the runs' records
    (atk37-28 F4). The directory must belong to the agent's account and be writable by it
    alone; so must the lease file in it."""
    for path in (state_dir, state_dir / "lease"):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            return f"{path} is a symbolic link"
        if st.st_uid != uid or st.st_mode & 0o022:
            return (
                f"{path} may be written by other accounts (owner uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):04o})"
            )
    return ""
