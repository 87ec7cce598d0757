"""`gpuledger agent`: one per GPU node, a process apart from the server. An edge.

It runs its node's parts of the ledger's placements through the supervised executor
(`ledger.engines.supervised`: one supervisor per part, a state file of handles written atomically,
adoption after restarts) and talks to the server's agent API only (`/v1/agent/*`, node token).

Start, as numbered steps (Nomad's client restores its handles before anything else):
  1. adopt: load the state file and re-attach to the parts still alive (pid + start time); the
     ones that ended meanwhile are reported with the exit codes their supervisors wrote;
  2. ask the server what the ledger runs here, and begin to stop every part it no longer runs
     here (the orphans: a cancel while the agent was away, or a node marked lost whose jobs
     were requeued elsewhere);
  3. register the node at once (idempotent; a lost node returns), saying every run it still
     has, the orphans stopping too, then take work. It never waits for the orphans: waiting,
     it sent nothing, the node was counted lost and its lease ran out, and the fence killed
     the healthy jobs it had just adopted (atk43 F6). Their GPUs stay busy meanwhile: no
     launch here starts on a GPU a stopping run still holds (`SupervisedExecutor`), and a run
     the server stopped stays `stopping` there until a report no longer lists it.

Then: a thread long-polls the server for the node's list of parts (a placement arrives without
polling delay); the main loop launches what is listed and not running, stops what runs and is
not listed, watches its processes every `check_every`, and reports starts, exits, samples and
checkpoints (a heartbeat when there is nothing to say). Reports the server did not take are kept
and sent again. Of a list of servers, one that does not answer within seconds (a frozen process
accepts and never answers) is left for the next and passed over for a while (`ANSWER_S`), unless
another server names it as the leader (a slow leader is asked again at once: every call here is
idempotent), and
every answer of a server that keeps the node's lease while its store is away renews the lease
(`ledger.agent.lease`), before the first registration too. A node the server says is lost (or
that lost contact for longer than the server's node-lost timeout) goes through steps 2-3 again.

Stopping the agent (SIGTERM, SIGINT, kill -9) leaves every job running; the next agent on the
state directory adopts them. `--drain` is the way to stop them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from ledger.agent.checks import LastChecks, hold_for_test
from ledger.agent.client import ANSWER_S, ONE_SERVER_S, POLL_MARGIN_S, AgentClient, Polled, Seen
from ledger.agent.identity import Boot, remember_boot, this_boot
from ledger.agent.lease import LEASE_MARGIN_S, REFUSED_PAUSE_S, NodeLease, too_short
from ledger.cycle.executor import Exit, Launch, Observed, Orders, Start
from ledger.engines.gpu_util import UtilSource
from ledger.engines.proc import write_atomic
from ledger.engines.runs import part_alive
from ledger.engines.supervised import SupervisedExecutor
from ledger.store.clock import SystemClock
from schemas import agent as a
from schemas.errors import (
    LedgerError,
    NotAuthenticated,
    NotAuthorised,
    TooBusy,
    Unavailable,
)

log = logging.getLogger("gpuledger.agent")

_now = SystemClock().now

STATUS_FILE = "agent.json"
LEASE_FILE = "lease"


class AgentStatus(msgspec.Struct, kw_only=True):
    """`<state_dir>/agent.json`, what `gpuledger agent status` shows (written atomically)."""

    node: str
    url: str
    pid: int
    started_at: float
    last_contact_at: float | None = None
    last_error: str = ""
    registered: bool = False
    jobs: list[int] = []
    utilisation: str = ""
    gpus: int = 0
    gpu_type: str = ""
    gpu_source: str = ""
    containment: str = ""
    """How job processes are held here (cgroups, or sessions), `Containment.describe`."""


@dataclass
class Settings:
    node: str
    url: str
    token: str
    gpus: int
    gpu_type: str
    gpu_source: str
    address: str
    heartbeat_s: float
    poll_wait_s: float
    check_every_s: float


@dataclass
class Outbox:
    """Reports not yet taken by the server (kept across failures, sent with the next report)."""

    started: list[a.PartStarted] = field(default_factory=list)
    exited: list[a.PartExited] = field(default_factory=list)
    samples: list[a.PartSample] = field(default_factory=list)
    checkpoints: list[a.PartCheckpoint] = field(default_factory=list)
    stopped: list[a.PartStopped] = field(default_factory=list)
    reaping: list[a.PartReaping] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.started or self.exited or self.samples or self.checkpoints or self.stopped
                    or self.reaping)  # fmt: skip

    def report(self, node: str, version: str, running: tuple[a.PartRun, ...]) -> a.Report:
        return a.Report(
            node=node,
            started=tuple(self.started),
            exited=tuple(self.exited),
            samples=tuple(self.samples),
            checkpoints=tuple(self.checkpoints),
            stopped=tuple(self.stopped),
            reaping=tuple(self.reaping),
            version=version,
            running=running,
        )

    def then(self, later: Outbox) -> Outbox:
        """This outbox, then what `later` gathered (a report the server did not take is sent
        again, in order, before what came since)."""
        return Outbox(
            started=self.started + later.started,
            exited=self.exited + later.exited,
            samples=self.samples + later.samples,
            checkpoints=self.checkpoints + later.checkpoints,
            stopped=self.stopped + later.stopped,
            reaping=self.reaping + later.reaping,
        )


def refuses_reaping(err: LedgerError, out: Outbox) -> bool:
    """Pure: a server refused a report of `out` for its `reaping` parts, a field it does not
    know (older than it): the rest is sent again without them, or nothing would ever be taken
    again (exits included)."""
    return bool(out.reaping) and err.fields.get("status") == 400 and "reaping" in err.line()


def route_missing(err: LedgerError) -> bool:
    """Pure: the server answered that it has no such route (an older version: the framework's
    404, code "http"), told by the answer's status, not by words a URL may carry (atk56-23 F1:
    "cannot reach the server at http://127.0.0.1:40404" turned the last check off for good)."""
    return err.fields.get("status") == 404 and err.fields.get("answered") == "http"


def _run_of(engine_job_id: str) -> int:
    """Pure: the ledger's run of a supervised run named `<job>.<launch>`."""
    return int(engine_job_id.rsplit(".", 1)[1]) - 1


class NodeAgent:
    def __init__(
        self,
        settings: Settings,
        executor: SupervisedExecutor,
        status_path: Path,
        util: UtilSource | None,
    ) -> None:
        self.s = settings
        self.ex = executor
        self.status_path = status_path
        self.seen = Seen()
        self._poll_client: AgentClient | None = None  # the poller's (`_send`: atk48-ha F6)
        from ledger.wire.client import Silent

        self.silent = Silent()
        """The servers of the list that let a request time out lately, shared by every client
        here: one frozen server costs the agent its timeout once, not each client."""
        self.boot = _this_boot(status_path.parent, executor)
        """This agent on this host's boot, and what it was on the boot before when the host
        rebooted since it last registered (`ledger.agent.identity`): it says so at once, with
        the ends its run directories recorded before the reboot (`_report_ends`)."""
        self.agent_id = self.boot.instance
        """Which agent this is (`schemas.agent.AGENT_HEADER`): one agent holds a node; its id
        bound to this host's boot (`identity.instance_id`)."""
        self.client = self._client(0.0)
        self.stop_event = threading.Event()
        self._draining = False
        """`drain` has begun: every report says so (`Report.draining`)."""
        self.wake = threading.Event()
        self._latest: Polled | None = None
        self._lock = threading.Lock()
        self.parts: dict[int, a.Part] = {}
        self.version = ""
        self.outbox = Outbox()
        self.finished: set[tuple[int, int]] = set()
        """(job, run) whose exit this agent saw: never launched again while still listed."""
        self.kills: set[tuple[int, int]] = set()
        """(job, run) the ledger stopped here and then ordered killed at once (`kill`)."""
        self.lease = NodeLease(status_path.with_name(LEASE_FILE))
        """The node's lease, renewed by every contact and keep: by the settings the server
        last gave (kept in the file, so a keep renews it before a restarted agent registers)."""
        self._keeping = False
        """A server without its store keeps the lease (logged once per outage)."""
        self.applied = ""
        """The version of the node's list `_apply` last carried out (reports say it)."""
        self.report_wake = threading.Event()
        self._out_lock = threading.Lock()
        self._rejoin = False
        self._no_reaping = False
        """The server refused a report for its `reaping` (older than it): none sent again."""
        self._kept_lost = False
        """The server answered our registration with the node still lost (an admin's loss):
        no joining again until an admin returns it."""
        self._last_sent = 0.0
        self._status_written = b""
        self.checks = LastChecks()
        """The launches' last check with the server (`_may_start`, the confirmer thread)."""
        self.confirm_wake = threading.Event()
        self.status = AgentStatus(
            node=settings.node,
            url=settings.url,
            pid=os.getpid(),
            started_at=_now(),
            utilisation="" if util is None else util.name,
            gpus=settings.gpus,
            gpu_type=settings.gpu_type,
            gpu_source=settings.gpu_source,
            containment=executor.containment.describe(),
        )

    # --- start ---------------------------------------------------------------------------------

    def join(self) -> None:
        """Steps 2 and 3 of the module doc: stop the orphans, then register."""
        if self.boot.rebooted_header() and not self._report_ends():
            return
        polled = self._retry("ask what runs here", lambda: self.client.poll(self.s.node, "", 0))
        if polled is None:
            return
        asg = polled[0]
        self._take(polled)
        orphans = self._apply(_now())
        self.applied = asg.version
        if orphans:
            log.info("stopping %d part(s) the ledger no longer runs here (job(s) %s): their "
                     "GPUs stay busy until they are gone", len(orphans),
                     ", ".join(map(str, sorted(orphans))))  # fmt: skip
        req = a.Register(
            node=self.s.node,
            gpus=self.s.gpus,
            gpu_type=self.s.gpu_type,
            address=self.s.address,
            gpu_source=self.s.gpu_source,
            version=self.applied,
            running=self._running(),
        )
        sent = _now()  # at the latest: a retry is sent later
        got = self._retry(
            "register",
            lambda: self.client.call("POST", "/v1/agent/register", req, a.Registered),
        )
        if got is None:
            return
        self.lease.learn(got.node_lost_after_s, got.node_fence_s, sent)
        self._check_sizing(got)
        self._kept_lost = got.state == "lost"
        self.lease.renew(self._last_sent)
        self.status.registered = True
        remember_boot(self.status_path.parent, self.boot.boot)  # a next boot says it rebooted
        kept = f"; servers keep its lease {got.keep_delay_s:.1f} s after losing their store"
        log.info(
            "registered node %s (%d GPUs, %s; node %s%s%s)", self.s.node, self.s.gpus,
            self.s.gpu_type, got.state, ", back from lost" if got.returned else "",
            kept if got.keep_delay_s else "",
        )  # fmt: skip

    def _report_ends(self) -> bool:
        """After a reboot, the first request: the ends the run directories recorded before it
        (a supervisor's exit file, written as its part ended), with the reboot said, so the
        server records them as they were (a job that completed is completed, never run again)
        before it ends the rest of the node's runs with the boot (atk43 F4). False when the
        agent stops meanwhile."""
        self._watch(_now())
        with self._out_lock:
            out, self.outbox = self.outbox, Outbox()
            # a part gone with no end recorded (`lost`) is the reboot's to end (node_failure,
            # requeued when resumable): said after, as before
            self.outbox.exited = [x for x in out.exited if x.reason == "lost"]
            out.exited = [x for x in out.exited if x.reason != "lost"]
        report = out.report(self.s.node, "", ())
        got = self._retry(
            "report the ends recorded before the reboot",
            lambda: self.client.call("POST", "/v1/agent/report", report, a.Ack),
        )
        if got is None:
            with self._out_lock:
                self.outbox = out.then(self.outbox)
        return got is not None

    def _check_sizing(self, got: a.Registered) -> None:
        """Say when the node's lease is too short to ride out a frozen server while the store
        is away (docs/ha.md, the sizing rule): the server's settings, not the agent's to fix."""
        need = too_short(got.node_lost_after_s, got.node_fence_s, got.keep_delay_s,
                         self.s.heartbeat_s, self._servers(), ANSWER_S)  # fmt: skip
        if need is not None:
            log.warning("the node's lease (node-lost timeout + fence - %g s) is shorter than "
                        "%.1f s: a frozen server while the store is away may get this node's "
                        "jobs fenced (docs/ha.md, the sizing rule)", LEASE_MARGIN_S,
                        need)  # fmt: skip

    def _servers(self) -> int:
        return len([u for u in self.s.url.split(",") if u.strip()])

    def _retry(self, what: str, fn: Any) -> Any:
        """Call `fn` until the server answers; errors of the request itself are fatal. A 429
        (a cap the server says to retry past) is retried like a 503, said once: one 429 at
        registration took the agent down, and with it the node's jobs (atk38-25 F5)."""
        warned = False
        while not self.stop_event.is_set():
            try:
                sent = _now()
                result = fn()
                self._contact(sent, self.client.node_lease)
                return result
            except (Unavailable, TooBusy) as err:
                self._error(err)
                if not warned:
                    log.warning("%s: %s (retrying)", what, err.line())
                    warned = True
            self.stop_event.wait(REFUSED_PAUSE_S)
        return None

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Until `stop_event`: the poller and reporter threads and the main loop (module doc).
        The main loop never waits on the server: it only launches, stops and watches."""
        self.join()
        for target, name in ((self._poller, "agent-poll"), (self._reporter, "agent-report"),
                             (self._confirmer, "agent-confirm")):  # fmt: skip
            threading.Thread(target=target, name=name, daemon=True).start()
        while not self.stop_event.is_set():
            now = _now()
            if self._rejoin:
                self._rejoin = False
                log.warning("this node was out of contact or marked lost: joining again")
                self.join()
            with self._lock:
                asg, self._latest = self._latest, None
            if asg is not None:
                self._take(asg)
            self._apply(now)
            self.applied = self.version
            self._watch(now)
            if not self.outbox.empty():
                self.report_wake.set()
            self._write_status()
            self.wake.wait(self.s.check_every_s)
            self.wake.clear()
        self._write_status()

    def _client(self, wait_s: float) -> AgentClient:
        """A client of the agent API for one thread: every server of the list gets `wait_s` +
        `ANSWER_S` to answer (a long poll `POLL_MARGIN_S`); every keep renews the lease."""
        several = self._servers() > 1
        bound = (POLL_MARGIN_S if wait_s else ANSWER_S) if several else ONE_SERVER_S
        return AgentClient(self.s.url, self.s.token, timeout=wait_s + bound, seen=self.seen,
                           silent=self.silent, on_keep=self._kept, agent=self.agent_id,
                           rebooted=self.boot.rebooted_header())  # fmt: skip

    def _reporter(self) -> None:
        """Send the outbox as soon as it holds something, a heartbeat otherwise."""
        client = self._client(0.0)
        while not self.stop_event.is_set():
            ok = self._send(client)
            self.report_wake.wait(self.s.heartbeat_s if ok else REFUSED_PAUSE_S)
            self.report_wake.clear()

    def _poller(self) -> None:
        client = self._client(self.s.poll_wait_s)
        self._poll_client = client
        version = ""
        while not self.stop_event.is_set():
            try:
                sent = _now()
                polled = client.poll(self.s.node, version, self.s.poll_wait_s)
            except LedgerError as err:
                self._error(err)
                self.stop_event.wait(REFUSED_PAUSE_S)
                continue
            except Exception:  # an answer it cannot read: the thread lives on (atk46-23 F13)
                log.exception("the server's list for this node could not be read; asking again")
                self.stop_event.wait(REFUSED_PAUSE_S)
                continue
            self._contact(sent, client.node_lease)
            version = polled[0].version
            log.debug("poll: version %s, %d part(s)", version, len(polled[0].parts))
            with self._lock:
                self._latest = polled
            self.wake.set()

    def _take(self, polled: Polled) -> None:
        asg, unreadable = polled
        self.version = asg.version
        self.parts = {p.job_id: p for p in asg.parts}
        self.kills = {(k.job_id, k.run) for k in asg.kill}
        listed = {(p.job_id, p.run) for p in asg.parts} | {(u.job_id, u.run) for u in unreadable}
        self.finished &= listed
        with self._lock:
            self.checks.keep({(p.job_id, p.run, p.job_token) for p in asg.parts})
        for u in unreadable:  # its launch fails here, once: the ledger ends the job
            if (u.job_id, u.run) in self.finished:
                continue
            log.error("job %s (run %s): its part cannot be read here: %s", u.job_id, u.run, u.why)
            why = f"the node's agent could not read the job's launch: {u.why}"
            end = Exit(u.job_id, -1, _now(), "launch_failed", f"{u.job_id}.{u.run + 1}", note=why)
            with self._out_lock:
                self._queue(Observed(exits=(end,)))

    def _apply(self, now: float) -> set[int]:
        """Stop what runs here and is not listed (or is an older run); launch what is listed
        and not running. Returns the jobs stopped."""
        stopped: set[int] = set()
        stops: list[int] = []
        for job_id in sorted(self.ex.running()):
            p = self.parts.get(job_id)
            if p is None or self.ex.launch_of(job_id) != p.run + 1:
                if not self.ex.stopping(job_id):
                    log.info("stopping job %s: the ledger no longer runs it here", job_id)
                    stops.append(job_id)
                stopped.add(job_id)
        # cancelled again in its grace: killed at once (atk46-23 F7)
        kills = tuple(j for j, r in sorted(self.kills) if self.ex.launch_of(j) == r + 1)
        if stops or kills:  # before the launches: a stopped run waiting for GPUs is gone at once
            self._carry_out(Orders(stops=tuple(stops), kills=kills), now)
        launches: list[Launch] = []
        running = self.ex.running()
        for job_id, p in sorted(self.parts.items()):
            if (job_id, p.run) in self.finished or job_id in running:
                continue
            ended = self.ex.ended_run(job_id, p.run, now)
            lost = ended is None and self.ex.launched_before(job_id, p.run + 1)
            if ended is not None or lost:
                # it ended while nobody watched, or it ran here and its handle is gone (the
                # state file was lost): report it, never launch it twice
                if ended is None:
                    log.warning("job %s (run %s) ran here and its handle is lost", job_id, p.run)
                    lost_start = Start(job_id, run=p.run)
                    ended = (lost_start, Exit(job_id, -1, now, "lost", f"{job_id}.{p.run + 1}"))
                start, end = ended
                with self._out_lock:
                    self._queue(Observed(starts=(start,) if start else (), exits=(end,)))
                continue
            launch = self._launch(p)  # only one that starts at once, just after its check
            if self.ex.can_start(launch) and self._may_start(p):
                launches.append(launch)
        if launches:
            self._carry_out(Orders(launches=tuple(launches)), now)
        return stopped

    def _may_start(self, p: a.Part) -> bool:
        """The launch's last check (docs/agent.md, "the last check before a launch"): it starts
        only on a server's word, given within `FRESH_S`, that it is still its job's current
        placement here (`POST /v1/agent/confirm`); otherwise it is asked for (the confirmer
        thread) and the launch waits, not started. A poll answer may be stale by the time it
        is carried out: a launch from one ran a command after its job had completed (atk55-23
        F1). A refused launch never starts (asked again after `CONFIRM_AGAIN_S` while the list
        still names it); a server that answered it lacks the route (older) is not asked for
        `OLDER_AGAIN_S`, then asked again."""
        if self.checks.lists_alone(time.monotonic()):
            return True
        hold_for_test(p.job_id, p.run)
        key = (p.job_id, p.run, p.job_token)
        with self._lock:
            if self.checks.fresh(key, time.monotonic()):
                return True
            asked = self.checks.ask(key, time.monotonic())
        if asked:
            self.confirm_wake.set()
        return False

    def _confirmer(self) -> None:
        """Asks the server about the launches `_may_start` holds, one request for all, then
        wakes the main loop (which starts the confirmed ones). Bounded: a server that does not
        answer within the client's timeout leaves them unstarted, asked again later."""
        client = self._client(0.0)
        while not self.stop_event.is_set():
            self.confirm_wake.wait(self.s.check_every_s)
            self.confirm_wake.clear()
            with self._lock:
                keys = self.checks.asking()
            if not keys:
                continue
            req = a.Confirm(node=self.s.node, launches=tuple(
                a.LaunchCheck(job_id=j, run=r, job_token=t) for j, r, t in keys))  # fmt: skip
            sent = _now()
            try:
                got: a.Confirmed = client.call("POST", "/v1/agent/confirm", req, a.Confirmed)
            except LedgerError as err:
                self._error(err)
                old = route_missing(err)
                if old:
                    log.warning("the server does not check launches (an older version): "
                                "launches start from its lists alone")  # fmt: skip
                else:
                    log.warning("launch(es) of job(s) %s not started: no server confirmed them "
                                "(%s); asked again", ", ".join(str(k[0]) for k in keys),
                                err.line())  # fmt: skip
                with self._lock:
                    self.checks.failed(keys, time.monotonic(), unsupported=old)
                self.wake.set()
                continue
            if 0 < got.epoch < self.seen.epoch:  # a deposed leader's word: asked again
                with self._lock:
                    self.checks.failed(keys, time.monotonic(), unsupported=False)
                continue
            self._contact(sent, client.node_lease)
            for r in got.refused:
                log.warning("job %s (run %s) not started: %s", r.job_id, r.run, r.why)
            with self._lock:
                self.checks.answered(keys, {(o.job_id, o.run) for o in got.ok}, time.monotonic())
            self.wake.set()

    def _carry_out(self, orders: Orders, now: float) -> None:
        began = self.ex.carry_out(orders, now)
        with self._out_lock:
            self._queue(Observed(starts=began))

    @staticmethod
    def _launch(p: a.Part) -> Launch:
        return Launch(
            p.job_id, p.slots, p.command, p.duration_s, p.user, p.account, run=p.run,
            time_limit_s=p.time_limit_s, grace_s=p.grace_s, debug=p.debug,
            master_addr=p.master_addr, job_token=p.job_token, workdir=p.workdir, env=p.env,
            stdout=p.stdout, stderr=p.stderr, job_name=p.job_name, array_job_id=p.array_job_id,
            array_task_id=p.array_task_id, umask=p.umask,
            ulimits=None if p.ulimits is None else tuple(p.ulimits.items()),
        )  # fmt: skip

    def _watch(self, now: float) -> None:
        """What the executor saw, into the outbox. A run that ended leaves `handled` (what
        reports say runs here) and enters the outbox in one step under the reporter's lock:
        a report between the two said the run gone without its end, the server let the job's
        next placement launch before it knew the run had completed, and its command ran twice
        (atk55-23 F1)."""
        with self._out_lock:
            self._queue(self.ex.observe(now, {}))

    def _queue(self, seen: Observed) -> None:
        """What the executor saw, as parts of the next report (checkpoints and samples of the
        job's current run here)."""
        for st in seen.starts:
            log_path = st.logs[0] if st.logs else ""
            mine = next((p for p in st.parts if p.node == self.s.node), None)
            self.outbox.started.append(
                a.PartStarted(
                    job_id=st.job_id,
                    run=st.run,
                    log=log_path,
                    started_at=st.started_at,
                    pid=mine.pid if mine else 0,
                    tree=mine.tree if mine else "",
                )
            )
        for ex in seen.stopped:
            if ex.started_at is not None:  # its start, which its end then says (atk52-23 F4)
                run = _run_of(ex.engine_job_id)
                self.outbox.started.append(
                    a.PartStarted(job_id=ex.job_id, run=run, started_at=ex.started_at)
                )
            if ex.by_itself:  # its command ended before the stop: told as its exit (F2)
                self._queue(Observed(exits=(replace(ex, engine_state=""),)))
                continue
            self.outbox.stopped.append(
                a.PartStopped(
                    job_id=ex.job_id,
                    run=_run_of(ex.engine_job_id),
                    ended_at=ex.at,
                    exit_code=ex.exit_code,
                    killed=ex.engine_state == "KILLED",
                )
            )
        for rp in () if self._no_reaping else seen.reaping:
            self.outbox.reaping.append(
                a.PartReaping(job_id=rp.job_id, run=rp.run, leader_ended_at=rp.leader_ended_at,
                              left=rp.left, kill_at=rp.kill_at, exit_code=rp.exit_code)
            )  # fmt: skip
        for ex in seen.exits:
            run = _run_of(ex.engine_job_id)
            self.finished.add((ex.job_id, run))
            self.outbox.exited.append(
                a.PartExited(
                    job_id=ex.job_id,
                    run=run,
                    exit_code=ex.exit_code,
                    reason=ex.reason,
                    ended_at=ex.at,
                    note=ex.note[:1000],
                )
            )
            log.info("job %s (run %s) exited with %s (%s)", ex.job_id, run, ex.exit_code, ex.reason)
        # a run that checkpointed just before it ended, both seen by this observation, has
        # left the executor's runs: its checkpoint names the run of its end (it was dropped:
        # a job's checkpoint said through its file while its start was not yet recorded was
        # lost when the job ended within the same look)
        ended = {ex.job_id: _run_of(ex.engine_job_id) for ex in seen.exits}
        for job_id in seen.checkpoints:
            current = self._current_run(job_id)
            current = ended.get(job_id) if current is None else current
            if current is not None:
                self.outbox.checkpoints.append(a.PartCheckpoint(job_id=job_id, run=current))
        for sample in seen.samples:
            current = self._current_run(sample.job_id)
            if current is not None:
                self.outbox.samples.append(
                    a.PartSample(
                        job_id=sample.job_id, run=current, gpu_utilisation=sample.gpu_utilisation
                    )
                )

    def _current_run(self, job_id: int) -> int | None:
        launch = self.ex.launch_of(job_id)
        return None if launch is None else launch - 1

    def _send(self, client: AgentClient) -> bool:
        """Send the outbox (or a heartbeat); False when the server did not take it (the outbox
        is kept and sent again)."""
        with self._out_lock:  # what runs, with the ends seen so far (`_watch`)
            out, self.outbox = self.outbox, Outbox()
            version = self.applied  # read before what runs: that is at least as new
            running = self._running()
        report = out.report(self.s.node, version, running)
        if self._draining:
            report = msgspec.structs.replace(report, draining=True)
        sent = _now()
        try:
            ack: a.Ack = client.call("POST", "/v1/agent/report", report, a.Ack)
        except LedgerError as err:
            self._error(err)
            if isinstance(err, (NotAuthenticated, NotAuthorised)):
                log.error("the server refused this agent: %s", err.line())
            elif refuses_reaping(err, out):  # an older server: said without them from now on
                log.warning("the server does not take reaping reports (an older version): "
                            "sent without them")  # fmt: skip
                self._no_reaping = True
                out.reaping = []
            with self._out_lock:  # kept, in order, before what came since
                self.outbox = out.then(self.outbox)
            return False
        if ack.node_fence_s is not None and ack.node_lost_after_s is not None:
            self.lease.learn(ack.node_lost_after_s, ack.node_fence_s, sent)  # atk37-28 F1
        self._contact(sent, client.node_lease)
        # only the acting leader takes a report: a long poll elsewhere waits on one that leads
        poll = self._poll_client  # no more (frozen: its wait + 5 s, atk48-ha F6): given up
        if poll is not None and poll.client.abandon_unless(client.client.url):
            log.info("%s leads now: the list is asked of it", client.client.url)
        if ack.node_state == "lost" and not self._kept_lost:
            self._rejoin = True
        self._kept_lost = self._kept_lost and ack.node_state == "lost"
        return True

    def _running(self) -> tuple[a.PartRun, ...]:
        """Every run this node has (stopping ones too), as the server fences launches by."""
        handled = self.ex.handled()
        return tuple(a.PartRun(job_id=j, run=handled[j] - 1) for j in sorted(handled))

    def _contact(self, sent: float = 0.0, granted: tuple[float, float] | None = None) -> float:
        """Record a successful contact of a request sent at `sent`, whose answer said it renews
        the lease under the settings `granted` (`X-Gpuledger-Node-Lease`; None: it said none,
        a server without a store of several: the last ones given); returns how long the agent
        had been out of contact."""
        if granted is not None:  # by these alone, unless a later request's answer said
            self.lease.learn(*granted, sent)  # others (atk39-28 F1): before `_last_sent`
        self._last_sent = max(self._last_sent, sent)
        self._keeping = False
        self.lease.renew(self._last_sent)
        now = _now()
        last = self.status.last_contact_at
        self.status.last_contact_at = now
        self.status.last_error = ""
        silent = 0.0 if last is None else now - last
        if self.status.registered and silent > self.lease.lost_after_s:
            self._rejoin = True  # the server may have marked this node lost meanwhile
        return silent

    def _kept(self, sent: float, epoch: int, granted: tuple[float, float] | None = None) -> None:
        """A server that cannot reach its store said it keeps this node's lease (nothing can be
        placed elsewhere while the store is away, and the leader counts every server's keeps
        before it counts a node lost: docs/ha.md): renew the lease from when that request was
        sent. Any server of the list may keep it, leader or standby, of any epoch."""
        if not self._keeping:
            log.warning("the servers cannot reach their store; a server keeps this node's "
                        "lease (epoch %d; jobs run on)", epoch)  # fmt: skip
        self._keeping = True
        wall = _now() - max(0.0, time.monotonic() - sent)  # the wall time it was sent
        if granted is not None:  # the settings the keep grants under, not the file's: after a
            self.lease.learn(*granted, wall)  # shortening --new-settings (atk39-28 F1)
        self.lease.renew(wall)

    def _error(self, err: LedgerError) -> None:
        self.status.last_error = err.line()

    def _write_status(self) -> None:
        """When it changed; informative only, so not synced (`agent status` reads it)."""
        self.status.jobs = sorted(self.ex.running())
        data = msgspec.json.encode(self.status)
        if data != self._status_written:
            write_atomic(self.status_path, data, sync=False)
            self._status_written = data

    # --- drain ---------------------------------------------------------------------------------

    def drain(self) -> int:
        """Drain the node as `gpuledger node drain` would, from its agent: the server drains it
        (no new placements), every job here is stopped (SIGTERM, grace, SIGKILL) and its exit
        reported as `drained` (resumable jobs are requeued, the others end preempted for
        maintenance); returns how many were stopped. The node returns when an agent registers
        again."""
        self._draining = True  # the node is drained in the ledger first: nothing new comes
        if not self._send(self.client):
            log.warning("the server was not told of the drain: %s", self.status.last_error)
        now = _now()
        running = sorted(self.ex.running())
        for job_id in running:
            self.ex.drain(job_id, now)
        deadline = time.monotonic() + self.ex.grace_s + 10.0
        while self.ex.running() and time.monotonic() < deadline:
            time.sleep(self.s.check_every_s)
            self._watch(_now())
        self._watch(_now())
        # the drained exits are what makes the server requeue resumable jobs (not a failure, not
        # a lost node): sent until the server takes them, for up to `REPORT_DRAIN_S`
        until = time.monotonic() + REPORT_DRAIN_S
        while not self.outbox.empty() and not self._send(self.client):
            if time.monotonic() >= until:
                log.warning("exits not reported: %s", self.status.last_error)
                break
            time.sleep(1.0)
        self._write_status()
        return len(running)


def _this_boot(state_dir: Path, ex: SupervisedExecutor) -> Boot:
    """`this_boot`, unless a part the executor adopted is alive (`runs.part_alive`): then the
    host did not reboot, whatever its boot id says now (`Boot.not_rebooted`), and the server
    must not end runs that still run here (atk43 F2)."""
    boot = this_boot(state_dir)
    live = sorted({h.job_id for h in ex.adopted for p in h.parts if part_alive(p)})
    if boot.previous and live:
        log.warning("the boot id is not the one this state directory registered under, but "
                    "job(s) %s run here as adopted (same processes, same start times): the "
                    "host did not reboot; none claimed", ", ".join(map(str, live)))  # fmt: skip
        return boot.not_rebooted()
    return boot


REPORT_DRAIN_S = 60.0
"""How long `agent --drain` keeps sending its drained jobs' exits when the server does not take
them (a server restarting, a standby taking over)."""


def read_status(state_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state_dir / STATUS_FILE).read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return data
