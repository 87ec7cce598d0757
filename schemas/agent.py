"""Request and response shapes of the node agents' API (`/v1/agent/*`, node tokens only).

The server tells each agent the whole truth about its node, not a stream of orders: a poll
answers every job part the ledger runs there (`Assignment`). An agent launches what it does not
run yet and stops what it runs that is not listed, so a lost message, a restarted agent or a
restarted server changes nothing: the next answer says it all again. `version` changes whenever
the list does; a poll that names the version it has waits until it changes (long-poll).
"""

from __future__ import annotations

from typing import Annotated, TypeVar

import msgspec

from schemas.bounds import (
    CommandLine,
    Count,
    EnvPairs,
    Epoch,
    ExitCode,
    FloatSeconds,
    GraceSeconds,
    JobId,
    LogPath,
    Name,
    NodeGpus,
    Path,
    PositiveSeconds,
    Text,
    Token,
    Ulimits,
    Umask,
    Utilisation,
)
from schemas.commands import RunEnd
from schemas.events import GpuSlot

T = TypeVar("T")
MANY = msgspec.Meta(max_length=100_000)
Parts = Annotated[tuple[T, ...], MANY]
"""What a poll or a report lists, part by part (bounded)."""


AGENT_HEADER = "X-Gpuledger-Agent"
"""The request header a node agent names itself by on every call (the random id it keeps in its
state directory, `ledger.agent.identity.agent_id`): one agent holds a node
(`ledger.engines.agents.AgentExecutor.take`)."""
REBOOTED_HEADER = "X-Gpuledger-Rebooted"
"""Sent by a node agent whose host rebooted since its state directory last registered:
`<its name on the boot before> <seconds since this boot>` (`ledger.agent.identity.Boot`). The
server ends the node's runs at once when it believes it (`ledger.engines.fence.reboot_honoured`)."""


class Register(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/agent/register`: the agent says what its node has (idempotent)."""

    node: Name
    gpus: NodeGpus
    gpu_type: Name
    address: Text = ""
    """Where other nodes reach this one (MASTER_ADDR of jobs whose rank 0 runs here); "" lets
    the server take the address the request came from."""
    gpu_source: Text = ""
    """Where the GPU count and type came from ("NVML", "flags"): logged by the server."""
    version: Text = ""
    """The version of the node's list the agent has carried out (`Assignment.version`)."""
    running: Parts[PartRun] = ()
    """Every run the agent still has on the node as of `version`, the orphans it is stopping
    too (their GPUs stay held until a report no longer lists them)."""


class Registered(msgspec.Struct, frozen=True, kw_only=True):
    node: Name
    state: str
    """The node's state in the ledger after registering ("active", "draining", ...)."""
    returned: bool = False
    """The node had been marked lost and is back."""
    node_lost_after_s: float
    """How long the server waits for a silent node before it marks it lost: heartbeat well
    inside it."""
    node_fence_s: float = 0.0
    """How long after that the server waits before it may run the node's jobs elsewhere: the
    node's lease runs out at its agent's last contact + `node_lost_after_s` + `node_fence_s`,
    and its parts stop themselves then."""
    keep_delay_s: float = 0.0
    """How long after its last report to the store a server that cannot reach it begins to keep
    its agents' node leases (`ledger.server.ha.keep_timing`); 0: no server keeps (one server
    on its own store). The node's lease must outlast it and the time to switch servers (the
    agent says so at registration when it does not: docs/ha.md)."""


class PartRun(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which part a message is about: its job and the job's run (its placement)."""

    job_id: JobId
    run: Count
    """Which placement of the job this is (its preemptions so far)."""


class Part(PartRun, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """One part of a job that runs on the polling node. The server's word to its agents: an
    agent reads a newer server's parts (what agents send is refused with a field it does not
    know)."""

    slots: tuple[GpuSlot, ...]
    """Every slot of the placement in rank order (this node's part is the one naming it)."""
    command: CommandLine
    user: Name
    account: Text
    duration_s: FloatSeconds | None = None
    time_limit_s: PositiveSeconds | None = None
    grace_s: GraceSeconds | None = None
    debug: bool = False
    master_addr: Text = ""
    """Host of rank 0's node (rendezvous)."""
    job_token: Token = ""
    """The job's own token (`GPULEDGER_JOB_TOKEN`), minted at placement; "" when the server
    no longer holds it (a restart: the part was launched before)."""
    workdir: Path = ""
    """Where the job starts ("": the agent's default, the run's own directory)."""
    env: EnvPairs = ()
    """The job's environment as submitted; the agent adds the ledger's variables."""
    stdout: LogPath = ""
    stderr: LogPath = ""
    """Every field takes what a submission may hold (`schemas.bounds`): an answer an agent
    cannot read wedged its node (atk46-23 F13); `decode_assignment` refuses a part alone."""
    job_name: Text = ""
    array_job_id: JobId | None = None
    array_task_id: Count | None = None
    umask: Umask | None = None
    """The job's umask as submitted (`JobSubmitted.umask`); None: the agent's old rule."""
    ulimits: Ulimits | None = None
    """The submitter's soft resource limits (`JobSubmitted.ulimits`); None: none recorded."""


class Assignment(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/agent/poll`: every part the ledger runs on the node."""

    node: Name
    version: str
    parts: Parts[Part]
    server_time: Epoch
    epoch: int = 0
    """The leader epoch of the answering server (several servers on one PostgreSQL store,
    docs/ha.md; 0: the only server). An agent never takes a list from an older epoch than one
    it has taken: a deposed leader cannot make it launch or stop anything."""
    kill: tuple[PartRun, ...] = ()
    """Runs the ledger stopped here and then ordered killed at once (a second cancel in their
    grace, atk46-23 F7): SIGKILL now, whatever is left of their grace."""


class PartStarted(PartRun, frozen=True, kw_only=True):
    log: LogPath = ""
    """Where the part's output goes on its node."""
    started_at: Epoch | None = None
    """When its process started (the agent's clock)."""
    pid: Count = 0
    """Its leader's pid on the node."""
    tree: Text = ""
    """What holds its processes: its cgroup, or `session PID`."""


class PartExited(PartRun, frozen=True, kw_only=True):
    exit_code: ExitCode
    reason: RunEnd = "exited"
    """How the part ended (`schemas.commands.RunEnd`: `drained` when `agent --drain` stopped
    it, which the ledger requeues when the job is resumable)."""
    ended_at: Epoch | None = None
    """When its process tree was empty (the agent's clock): an exit reported late keeps it."""
    note: Text = ""
    """Why it could not start, or what was left when its leader ended."""


class PartStopped(PartRun, frozen=True, kw_only=True):
    """A run the ledger had stopped here is gone: every process of it."""

    ended_at: Epoch | None = None
    exit_code: ExitCode | None = None
    killed: bool = False
    """It outlived its grace and was killed."""


class PartReaping(PartRun, frozen=True, kw_only=True):
    """The part's command (its leader) has exited and left processes, which its supervisor
    SIGTERMed at `leader_ended_at` and SIGKILLs at `kill_at` at the latest; its exit
    (`PartExited`) comes once they are gone."""

    leader_ended_at: Epoch
    left: Count = 0
    kill_at: Epoch
    exit_code: ExitCode | None = None
    """Its command's exit code (None: not said; an agent leaves it out then, and an older
    server refuses it: the agent then sends reaping no more)."""


class PartSample(PartRun, frozen=True, kw_only=True):
    gpu_utilisation: Utilisation
    """% per GPU of the part, in the slot's GPU order."""


class PartCheckpoint(PartRun, frozen=True, kw_only=True):
    """A resumable part saved its progress."""


class Report(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/agent/report`: what happened on the node since the last report. An empty
    report is a heartbeat."""

    node: Name
    started: Parts[PartStarted] = ()
    exited: Parts[PartExited] = ()
    samples: Parts[PartSample] = ()
    checkpoints: Parts[PartCheckpoint] = ()
    stopped: Parts[PartStopped] = ()
    reaping: Parts[PartReaping] = ()
    """Parts whose command exited leaving processes in their grace (an agent leaves the field
    out when it has none: an older server refuses a report with a field it does not know)."""
    version: Text = ""
    """The version of the node's list the agent had carried out when it wrote this report."""
    running: Parts[PartRun] | None = None
    """Every run the agent had on the node then (None: not said). A run the ledger stopped that
    a report of a later version no longer lists is gone: only then may the ledger run its job
    again elsewhere."""
    draining: bool = False
    """The agent is draining its node (`gpuledger agent --drain`): the ledger drains the node
    (no new placements) before the stopped runs' exits arrive; it returns when its agent
    registers again."""


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/agent/heartbeat`."""

    node: Name


class LaunchCheck(PartRun, frozen=True, kw_only=True):
    """A launch its agent is about to start: its part as the node's list gave it."""

    job_token: Token = ""
    """The part's job token (`Part.job_token`): a part minted again is another launch."""


class Confirm(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/agent/confirm`: the agent's last check before it starts launches (Slurm's
    prolog's place): is each still its job's current placement on this node?"""

    node: Name
    launches: Parts[LaunchCheck] = ()


class Refusal(PartRun, frozen=True, kw_only=True):
    why: Text = ""


class Confirmed(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to `Confirm`: only the launches in `ok` may start now; the rest never do."""

    node: Name
    ok: Parts[PartRun] = ()
    refused: Parts[Refusal] = ()
    epoch: int = 0
    """The answering server's leader epoch (`Assignment.epoch`)."""


class Ack(msgspec.Struct, frozen=True, kw_only=True):
    server_time: Epoch
    node_state: str = ""
    """The node's state in the ledger ("lost": the agent joins again, stopping its orphans)."""
    node_lost_after_s: float | None = None
    node_fence_s: float | None = None
    """The answering server's node settings (`Registered`'s), at every contact: a server
    restarted with a shorter fence, or another server leading with its own, shortens the node's
    lease at once (learnt only at registration, a lease of the old length outlived the new
    fence and a job ran twice: atk37-28 F1). None from an older server."""


class _Listed(msgspec.Struct, frozen=True, kw_only=True):
    """A poll answer whose parts are read one by one (`decode_assignment`)."""

    node: str
    version: str
    parts: tuple[msgspec.Raw, ...]
    server_time: float
    epoch: int = 0
    kill: msgspec.Raw = msgspec.Raw(b"[]")


class _Which(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    run: int = 0


class Unreadable(msgspec.Struct, frozen=True, kw_only=True):
    """A part of a poll answer the agent could not read: the agent fails its launch with `why`."""

    job_id: int
    run: int
    why: str


def decode_assignment(data: bytes) -> tuple[Assignment, tuple[Unreadable, ...]]:
    """The poll answer in `data` with every part the agent can read, and the parts it cannot
    (each with its job, run and why). One part out of the agent's bounds used to fail the whole
    answer, killing the agent's poll thread behind a live heartbeat: every later job on the node
    stayed placed for ever (atk46-23 F13). An answer that is no assignment at all still raises
    `msgspec.ValidationError` / `DecodeError`."""
    listed = msgspec.json.decode(data, type=_Listed)
    parts: list[Part] = []
    bad: list[Unreadable] = []
    for raw in listed.parts:
        try:
            parts.append(msgspec.json.decode(raw, type=Part))
        except msgspec.ValidationError as err:
            which = msgspec.json.decode(raw, type=_Which)  # a part with no job id: raises
            bad.append(Unreadable(job_id=which.job_id, run=which.run, why=str(err)))
    head = msgspec.json.encode(
        {"node": listed.node, "version": listed.version, "parts": [],
         "server_time": listed.server_time, "epoch": listed.epoch}
    )  # fmt: skip
    asg = msgspec.json.decode(head, type=Assignment)
    kill = msgspec.json.decode(listed.kill, type=tuple[PartRun, ...])  # (its runs to kill)
    return msgspec.structs.replace(asg, parts=tuple(parts), kill=kill), tuple(bad)
