"""The supervised executor: real processes that outlive the service. An edge.

Each part of a job (one per node of its placement) runs under its own supervisor
(`ledger.engines.supervise`), the job's parent, in a session of its own: stopping or killing the
service leaves jobs running. A state file of handles, written atomically on every change, lets a
restarted service adopt them before doing anything else (Nomad's client does the same):

    <state_dir>/state.json            the handles: job, launch number, per part the supervisor's
                                      pid and /proc start time, the job's limit, grace, stop state
    <state_dir>/runs/<job>.<launch>/<rank>/   spec.json, supervisor, job, exit (see supervise.py),
                                      work/checkpoint (the job's GPULEDGER_CHECKPOINT_FILE)
    <state_dir>/lock                  held while a service runs these jobs (one at a time)

Stopping a job is SIGTERM to each part's process group, then SIGKILL after its grace. The
executor stops a job by itself for two reasons only, and reports them: its time limit
(`Exit.reason == "time_limit"`, recorded as JobEngineEnded of engine `local`), and a failed part
of a gang job (the others are stopped; the job's exit code is the failed part's). A job the
ledger stopped (preempted, cancelled) is stopped without reporting its exit.

A placement's GPUs may still be held by a job in its grace period: its launch waits until those
processes are gone, so two live jobs never hold one GPU. The job is reported started when every
part has started. A run is named `<job>.<launch>` (launch = the ledger's run + 1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

import msgspec

from ledger.cycle.executor import (
    Exit,
    Launch,
    Observed,
    Orders,
    Reaping,
    Sample,
    Start,
    command_code,
)
from ledger.engines.accounts import RunAs, account_for, own_log, private_dirs
from ledger.engines.env import Account, job_env
from ledger.engines.found import SCOPE_VAR, find_live
from ledger.engines.gpu_util import UtilSource
from ledger.engines.proc import alive, write_atomic
from ledger.engines.run_ends import (
    all_started,
    commands_ended,
    ended_first,
    ended_run,
    exit_of,
    launched_before,
    orphaned,
    start_of,
    take_end,
    tree_of,
)
from ledger.engines.runs import (
    AgentState,
    Handle,
    Part,
    StopReason,
    checkpoint_mtime,
    failed_launch,
    handled_jobs,
    keep_stop,
    limit_from,
    live_processes,
    read_exit,
    read_identity,
    run_name,
    stopping_gpus,
)
from ledger.engines.supervise import CANNOT_START, Forked, read_reaping
from ledger.engines.tree import Containment, Tree
from ledger.reads.stopping import limit_sigkill_at
from schemas.bounds import job_grace
from schemas.errors import InvalidCommand

if TYPE_CHECKING:
    from ledger.core.state import Node

log = logging.getLogger("gpuledger.agent")

DEBUG_LIMIT_S = 15 * 60


class SupervisedExecutor:
    """Runs each part of a placement under a supervisor on this host (see the module doc).

    `address_of` names the host of a node for MASTER_ADDR (every node is this host for `up`);
    `extra_env` is added to every job's environment (`up` names its data directory there, so
    `gpuledger checkpoint` works inside a job).
    """

    def __init__(
        self,
        state_dir: Path,
        log_dir: Path,
        *,
        grace_s: float = 30.0,
        run_as: RunAs = "submitter",
        debug_limit_s: float = DEBUG_LIMIT_S,
        util: UtilSource | None = None,
        sample_every_s: float = 30.0,
        address_of: Callable[[str], str] = lambda node: "127.0.0.1",
        extra_env: Mapping[str, str] | None = None,
        local_node: str | None = None,
        fork_supervisors: bool = False,
        containment: Containment | None = None,
        lease: Path | None = None,
    ) -> None:
        self.engine = "local"
        self.relaunch_placed = True
        """Runs outlive the service: a placed job with no handle was never launched."""
        self.state_dir = state_dir
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.run_as = run_as
        self.debug_limit_s = debug_limit_s
        self.util = util
        self.sample_every_s = sample_every_s
        self.address_of = address_of
        self.extra_env = dict(extra_env or {})
        """What the service hands every job on top of its own environment (never the service's
        environment itself: a job gets the one it was submitted with)."""
        self.containment = containment if containment is not None else Containment.probe()
        """How job processes are held here: cgroups, or sessions (`ledger.engines.tree`)."""
        self.lease = lease
        """The node's lease file (node agents): parts stop themselves once it runs out."""
        self.local_node = local_node
        self.fork_supervisors = fork_supervisors
        """Start each supervisor by forking this process (a few ms) instead of starting a new
        interpreter (~40 ms of CPU): what lets a node agent start 100 parts a second."""
        """A node agent runs only its node's part of each placement (None: every part, `up`)."""
        self._next_sample_at: float | None = None
        self._starting: dict[str, subprocess.Popen[bytes] | Forked] = {}
        """Starters of supervisors (they fork the supervisor off and exit), by run directory."""
        self._pending: dict[int, Launch] = {}
        self._exits: list[Exit] = []
        self._stopped: list[Exit] = []
        self._reaped: set[tuple[int, int]] = set()
        """Runs (job, launch) whose reaping `observe` has told (once each)."""
        self._starts: list[Start] = []
        state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = self._take_lock()
        self.jobs: dict[int, Handle] = {}
        self.adopted = self._adopt()

    # --- state ---------------------------------------------------------------------------------

    def _take_lock(self) -> IO[bytes]:
        f = open(self.state_dir / "lock", "ab")  # noqa: SIM115 (held for the executor's life)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            f.close()
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise InvalidCommand(
                    f"another service runs the jobs of {self.state_dir}",
                    hint="stop it first; one service per data directory",
                ) from e
            raise
        return f

    def shutdown(self, now: float) -> list[Exit]:
        """The service stops: jobs keep running under their supervisors (no exits to record);
        the next executor on this state directory adopts them."""
        running = len(self.running())
        self.close()
        if running:
            log.info("stopped: %d job(s) keep running and will be adopted", running)
        return []

    def close(self) -> None:
        """Release the state directory. Jobs keep running; a new executor adopts them."""
        for starter in self._starting.values():
            starter.wait()  # a starter exits as soon as its supervisor is forked off
        self._starting.clear()
        self._save()
        self._lock.close()

    def _save(self) -> None:
        state = AgentState(
            jobs=sorted(self.jobs.values(), key=lambda h: h.job_id),
            containment=self.containment.describe(),
        )
        write_atomic(self.state_dir / "state.json", msgspec.json.encode(state), mode=0o600)

    def _adopt(self) -> list[Handle]:
        """Load the handles and re-attach: a part whose supervisor is gone is checked for an
        exit code; one that left none and whose job process is gone too is lost. Starts are
        reported again (the ledger drops those it has)."""
        try:
            raw = (self.state_dir / "state.json").read_bytes()
        except FileNotFoundError:
            raw = b"{}"
        state = msgspec.json.decode(raw, type=AgentState)
        handles = list(state.jobs)
        # what the machine says: runs alive here that the state file lost (`engines.found`)
        for h in find_live(self.state_dir, self.scope, self.containment, self.grace_s):
            if h.job_id not in {x.job_id for x in handles}:
                log.warning(
                    "job %s (launch %s) is alive here and the state file has no handle of it: "
                    "adopting it from its processes", h.job_id, h.launch,
                )  # fmt: skip
                handles.append(h)
        for h in handles:
            self.jobs[h.job_id] = h
            h.start_reported = False
            for p in h.parts:
                if p.exit_code is None:
                    self._refresh_part(p, None, h.grace_s)
            ended = [p.exit_code for p in h.parts if p.exit_code is not None]
            log.info(
                "adopted job %s (launch %s): %d of %d parts running%s",
                h.job_id,
                h.launch,
                len(h.parts) - len(ended),
                len(h.parts),
                f", ended with {ended}" if ended else "",
            )
        self._save()
        return list(self.jobs.values())

    # --- the executor protocol -----------------------------------------------------------------

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        """Runs that started, checkpoints and samples, runs that ended (one that ended before it
        was seen running started first), the jobs with a run here, the GPUs of stopped runs in
        their grace. (A restart before the next save reports a start again: the ledger drops it.)"""
        starts = self._take_starts()
        checkpoints, samples = self._progress(now)
        exits = self._poll(now)
        starts += self._take_starts()
        stopped, self._stopped = self._stopped, []
        return Observed(
            reaping=self._reaping(),
            starts=tuple(starts),
            checkpoints=tuple(checkpoints),
            samples=tuple(samples),
            exits=tuple(exits),
            running=frozenset(self.running()),
            stopped=tuple(stopped),
            stopping=stopping_gpus(self.jobs.values()),
        )

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        """Stop (SIGTERM now, SIGKILL after the grace; the exits go unreported), then launch
        (one save of the state file for every launch); the runs whose every part has started."""
        for job_id in orders.stops:
            self._stop(job_id, now)
        for job_id in orders.kills:  # cancelled again in its grace: SIGKILL now (atk46-23 F7)
            if (h := self.jobs.get(job_id)) is not None and h.stop_reason == "ledger":
                h.grace_s = 0.0  # the next watch kills it
        if orders.launches:
            self._launch_all(orders.launches, now)
        return tuple(self._take_starts())

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        """After a restart: `runs` maps each job the ledger holds GPUs for to its run. Handles
        of runs the ledger no longer has are stopped (their exits unreported); a run with no
        handle whose supervisors all wrote an exit code (the service stopped before recording
        it) is reported by the next `observe`. Returns the jobs with a run here."""
        known: set[int] = set()
        for h in list(self.jobs.values()):
            if runs.get(h.job_id, -1) + 1 == h.launch:
                known.add(h.job_id)
            elif h.stop_reason != "ledger":
                log.info(
                    "job %s (launch %s) is not run by the ledger: stopping it", h.job_id, h.launch
                )
                self._terminate(h, now, "ledger")
        for job_id, run in sorted(runs.items()):
            if job_id in known:
                continue
            ended = self.ended_run(job_id, run, now)
            if ended is not None:
                start, end = ended
                self._starts += [start] if start is not None else []
                self._exits.append(end)
                known.add(job_id)
        self._save()
        return known

    def heard_from(self) -> Mapping[str, float]:
        return {}

    def next_event_at(self) -> float | None:
        return None

    # --- for the node agent ----------------------------------------------------------------------

    def running(self) -> set[int]:
        """Jobs with a live process here, or waiting to start on GPUs still being freed."""
        return set(self.jobs) | set(self._pending)

    def can_start(self, job: Launch) -> bool:
        """Whether `job` would start at once (`_start_pending`): no run of its job here and
        none of its GPUs held by a run still stopping. A node agent hands over only such
        launches, each just after its last check with the server (`NodeAgent._may_start`): a
        launch left waiting here started later on a word that may have gone stale."""
        if job.job_id in self.jobs:
            return False
        busy = {g for h in self.jobs.values() for g in h.gpus}
        return not ({(sl.node, i) for sl in job.slots for i in sl.gpu_indices} & busy)

    def drain(self, job_id: int, now: float) -> None:
        """Stop `job_id` because its node is drained by hand (`gpuledger agent --drain`): SIGTERM
        now, SIGKILL after its grace; its exit is reported."""
        self._pending.pop(job_id, None)
        h = self.jobs.get(job_id)
        if h is not None and h.stop_reason is None:
            self._terminate(h, now, "drain")
            self._save()

    def launch_of(self, job_id: int) -> int | None:
        """The launch number of the run of `job_id` here (waiting to start, else running)."""
        job = self._pending.get(job_id)
        if job is not None:
            return job.run + 1
        h = self.jobs.get(job_id)
        return None if h is None else h.launch

    def handled(self) -> dict[int, int]:
        """Job -> launch of every run with processes here (running, or stopping): what a node
        agent tells the server it has. Safe to call from another thread."""
        return {j: h.launch for j, h in list(self.jobs.items())}

    def stopping(self, job_id: int) -> bool:
        """The ledger stopped `job_id` here and its processes are on their way out."""
        h = self.jobs.get(job_id)
        return h is not None and h.stop_reason == "ledger"

    # --- observing -----------------------------------------------------------------------------

    def _poll(self, now: float) -> list[Exit]:
        changed = False
        for h in list(self.jobs.values()):
            changed |= self._watch(h, now)
        self._reap_starters()
        self._start_pending(now)
        if changed:
            self._save()
        exits, self._exits = self._exits, []
        return sorted(exits, key=lambda x: x.job_id)

    def _reaping(self) -> tuple[Reaping, ...]:
        """Runs (not stopped: their stop is the ledger's word) whose every part's leader ended,
        some leaving processes its supervisor reaps (`RUNDIR/reaping`), once each."""
        out = []
        self._reaped &= {(h.job_id, h.launch) for h in self.jobs.values()}
        for h in self.jobs.values():
            if (h.stop_reason is not None or not h.start_reported or h.done
                    or (h.job_id, h.launch) in self._reaped):  # fmt: skip
                continue
            said = [None if p.exit_code is not None else read_reaping(Path(p.rundir))
                    for p in h.parts]  # fmt: skip
            if any(x is None and p.exit_code is None for x, p in zip(said, h.parts, strict=True)):
                continue
            got = [x for x in said if x is not None]
            self._reaped.add((h.job_id, h.launch))
            code = command_code(p.exit_code if x is None else x.code
                                for x, p in zip(said, h.parts, strict=True))  # fmt: skip
            out.append(Reaping(h.job_id, h.launch - 1, max(x.leader_ended_at for x in got),
                               max(x.left for x in got), max(x.kill_at for x in got),
                               code))  # fmt: skip
        return tuple(out)

    def _take_starts(self) -> list[Start]:
        """Jobs every part of which has started since the last call."""
        for h in sorted(self.jobs.values(), key=lambda h: h.launched_at):
            if h.stop_reason != "ledger" and not h.start_reported and all_started(h):
                if failed_launch(h):
                    h.start_reported = True  # its end says `launch_failed`; it never started
                    continue
                self._report_start(h)
        out, self._starts = self._starts, []
        return out

    def _report_start(self, h: Handle) -> None:
        h.start_reported = True
        self._starts.append(start_of(h))

    def _progress(self, now: float) -> tuple[list[int], list[Sample]]:
        """(jobs with a new checkpoint, utilisation samples when one is due) of started jobs."""
        checkpoints: list[int] = []
        samples: list[Sample] = []
        changed = False
        for h in self.jobs.values():
            if h.stop_reason is not None or not h.start_reported:
                continue
            mtime = self._checkpoint_mtime(h)
            if mtime > h.checkpoint_mtime:
                h.checkpoint_mtime, changed = mtime, True
                checkpoints.append(h.job_id)
        if self.util is not None and (self._next_sample_at is None or now >= self._next_sample_at):
            self._next_sample_at = now + self.sample_every_s
            samples.extend(self._samples())
        if changed:
            self._save()
        return checkpoints, samples

    # --- launching -----------------------------------------------------------------------------

    def _launch_all(self, jobs: tuple[Launch, ...], now: float) -> None:
        for job in jobs:
            here = self.jobs.get(job.job_id)
            if here is not None and here.launch <= job.run and here.stop_reason != "ledger":
                self._stop(job.job_id, now)  # requeued and placed again before a cycle said stop
            if (here is None or here.launch != job.run + 1) and job.job_id not in self._pending:
                self._pending[job.job_id] = job  # after an older run here is gone, if one is
        self._start_pending(now)

    def _stop(self, job_id: int, now: float) -> None:
        """The ledger no longer runs `job_id`: SIGTERM, SIGKILL after its grace, exit unreported."""
        self._pending.pop(job_id, None)
        h = self.jobs.get(job_id)
        if h is not None and h.stop_reason != "ledger":
            self._terminate(h, now, "ledger")
            self._save()

    def _start_pending(self, now: float) -> None:
        busy = {g for h in self.jobs.values() for g in h.gpus}
        ready: list[Handle] = []
        for job_id, job in list(self._pending.items()):
            if job_id in self.jobs:
                continue  # an earlier run of this job is still stopping: never two at once
            wanted = {(sl.node, i) for sl in job.slots for i in sl.gpu_indices}
            if wanted & busy:
                continue  # a stopped job still holds some of these GPUs: start once it is gone
            del self._pending[job_id]
            h = self._prepare(job, now)
            busy |= h.gpus
            ready.append(h)
        if not ready:
            return
        # the handles are saved (once for the batch) before any process exists; each
        # supervisor's identity is read from the file its starter writes (a crash in between
        # loses nothing)
        self._save()
        for h in ready:
            self._start(h)

    def _account(self, job: Launch) -> Account | str:
        """The OS account `job` runs as, or why it may not run (`account_for`)."""
        return account_for(job.user, self.run_as, os.geteuid())

    def _limit(self, job: Launch) -> float | None:
        if job.debug:
            return min(job.time_limit_s or self.debug_limit_s, self.debug_limit_s)
        return job.time_limit_s

    def _prepare(self, job: Launch, now: float) -> Handle:
        """The run directories, specs and handle of a launch (no process yet). A job that may
        not run here (no OS account, root on someone else's behalf) gets parts that ended at
        once, `launch_failed` with the reason."""
        launch = job.run + 1
        runs = self.state_dir / "runs" / run_name(job.job_id, launch)
        shutil.rmtree(runs, ignore_errors=True)  # a stale attempt of this very launch
        self.log_dir.mkdir(parents=True, exist_ok=True)
        account = self._account(job)
        h = Handle(
            job_id=job.job_id,
            launch=launch,
            launched_at=now,
            time_limit_s=self._limit(job),
            grace_s=job_grace(job.grace_s, self.grace_s),
            parts=[],
        )
        master = job.master_addr or self.address_of(job.slots[0].node)
        for rank, slot in enumerate(job.slots):
            if self.local_node is not None and slot.node != self.local_node:
                continue  # another node's agent runs that part
            rundir = runs / str(rank)
            part = Part(
                rank=rank, node=slot.node, gpu_indices=slot.gpu_indices, rundir=str(rundir),
                log="", marks_start=True,
            )  # fmt: skip
            h.parts.append(part)
            if isinstance(account, str):
                log.warning("job %s is not started: %s", job.job_id, account)
                part.exit_code, part.ended_at, part.note = CANNOT_START, now, account
                part.launch_failed = True
                continue
            if self.containment.cgroups:
                part.cgroup = f"{self.scope}/{run_name(job.job_id, launch)}.{rank}"
            spec, part.log = self._spec(job, rank, rundir, account, master, h.grace_s)
            spec["cgroup"] = part.cgroup
            # no fsync: the handle saved next is what must survive; a spec lost with the
            # machine is a supervisor that cannot start, reported as such. It holds the job's
            # command, environment and token: the service's alone (docs/security.md, row T13)
            write_atomic(rundir / "spec.json", json.dumps(spec).encode(), sync=False, mode=0o600)
        self.jobs[job.job_id] = h
        return h

    @property
    def scope(self) -> str:
        """This state directory's groups under `gpuledger/` (several agents share a host)."""
        return "s" + hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:12]

    def _spec(
        self, job: Launch, rank: int, rundir: Path, account: Account, master: str, grace_s: float
    ) -> tuple[dict[str, object], str]:
        """A part's spec for its supervisor, and where its output goes (for `jobs`)."""
        work = rundir / "work"
        switch = account.uid != os.geteuid()
        private_dirs(self.state_dir / "runs", rundir, account.gid if switch else None)
        work.mkdir(mode=0o700)
        default = ""
        if not job.stdout:  # the engine's log file, made here and given to the user
            name = f"job-{job.job_id}.log" if rank == 0 else f"job-{job.job_id}.{rank}.log"
            default = str(own_log(self.log_dir, name, *([account.uid, account.gid] * switch)))
        if switch:
            os.chown(work, account.uid, account.gid)
        out = job.stdout or default
        if job.stdout and job.workdir and not os.path.isabs(job.stdout):
            out = os.path.join(job.workdir, job.stdout)
        env = job_env(
            self.extra_env,
            job,
            rank,
            checkpoint_file=str(work / "checkpoint"),
            master_addr=master,
            job_token=job.job_token or None,
            account=account,
        )
        env[SCOPE_VAR] = self.scope  # the machine's mark of this state directory's runs
        spec: dict[str, object] = {
            "command": list(job.command) or ["true"],
            "env": env,
            "account": {"uid": account.uid, "gid": account.gid, "groups": list(account.groups)}
            if switch
            else None,
            "log": default,
            "stdout": job.stdout,
            "stderr": job.stderr,
            "workdir": job.workdir,
            "cwd": str(work) if switch and not job.workdir else None,
            "gpus": list(job.slots[rank].gpu_indices),
            "grace_s": grace_s,
            "containment": self.containment.to_json(),
            "lease": str(self.lease) if self.lease is not None else "",
            "time_limit_s": self._limit(job),
            "umask": None if job.umask is None else f"{job.umask:04o}",
            "ulimits": None if job.ulimits is None else dict(job.ulimits),
        }
        return spec, out

    def _start(self, h: Handle) -> None:
        for p in h.parts:
            if p.exit_code is not None:
                continue  # it may not run here (`_prepare`)
            if self.fork_supervisors:
                self._starting[p.rundir] = Forked.start(Path(p.rundir))
                continue
            self._starting[p.rundir] = subprocess.Popen(
                [sys.executable, "-I", "-m", "ledger.engines.supervise", p.rundir],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        log.info("launched job %s (launch %s): %d part(s)", h.job_id, h.launch, len(h.parts))

    # --- watching ------------------------------------------------------------------------------

    def _tree(self, p: Part) -> Tree:
        return tree_of(p, self.containment)

    def _refresh_part(self, p: Part, now: float | None, grace_s: float) -> bool:
        """Read the part's end if it ended; True when that changed."""
        rundir = Path(p.rundir)
        if take_end(p, read_exit(rundir)):
            return True
        if p.pid is None:
            starter = self._starting.get(p.rundir)
            starting = starter is not None and starter.poll() is None  # asked before the read
            ident = read_identity(rundir / "supervisor")
            if ident is not None:
                p.pid, p.pid_start = ident
            elif starting:
                return False
        if alive(p.pid, p.pid_start):
            return False
        if take_end(p, read_exit(rundir)):  # it may have ended between the two reads
            return True
        return orphaned(p, now, grace_s, self.containment)

    def _watch(self, h: Handle, now: float) -> bool:
        changed = False
        for p in h.parts:
            if p.exit_code is None:
                changed |= self._refresh_part(p, now, h.grace_s)
        failed = next((p.exit_code for p in h.parts if p.exit_code not in (None, 0)), None)
        # a gang job: a failed part stops the others
        if failed is not None and h.stop_reason is None and not h.done:
            h.failed_code = failed
            self._terminate(h, now, "part_failed")
            changed = True
        # the time limit
        if (
            h.stop_reason is None
            and h.time_limit_s is not None
            and now >= limit_from(h) + h.time_limit_s
            and not commands_ended(h)  # only leftovers of a command that ended: not stopped
        ):
            log.info("job %s reached its time limit (%gs): stopping it", h.job_id, h.time_limit_s)
            # its grace from the limit, as every read says, not from now: a run found past its
            # limit after a restart got a whole new grace (atk48-23 F1: SIGKILL 28 s after the
            # `kill_at` the reads showed); but its SIGTERM first, however late, and its SIGKILL
            # no sooner than min(grace, 10 s) after it (`kill_at`, s56)
            self._terminate(h, now, "time_limit", at=limit_from(h) + h.time_limit_s)
            changed = True
        # a part not yet reached by the stop (still starting) gets it now
        if h.stop_at is not None and not h.killed and any(not p.signalled for p in h.parts):
            self._signal(h, signal.SIGTERM)
        # the grace period ends
        if h.stop_at is not None and not h.killed and not h.done and now >= kill_at(h):
            self._signal(h, signal.SIGKILL)
            h.killed = changed = True
        launched = not any(p.launch_failed for p in h.parts)
        if h.done and h.stop_reason != "ledger" and not h.start_reported and launched:
            self._report_start(h)  # a run that ended before it was seen running started first
        if h.done:
            del self.jobs[h.job_id]
            end = exit_of(h, now)
            if h.stop_reason != "ledger":
                self._exits.append(end)
            else:  # a run the ledger stopped is gone: said as such (`JobRunEnded`)
                state = "KILLED" if h.killed else "STOPPED"
                itself = ended_first(h)  # its command had ended before the stop (F2)
                # when it started, for a run stopped before its start was recorded (placed):
                # charged from then (atk52-23 F4; the ledger keeps it for such a run alone)
                began = start_of(h).started_at if launched else None
                self._stopped.append(dataclasses.replace(end, engine_state=state, by_itself=itself,
                                                         started_at=began))  # fmt: skip
            changed = True
        return changed

    def _terminate(self, h: Handle, now: float, why: StopReason, at: float | None = None) -> None:
        """Stop `h` for `why`: SIGTERM now, SIGKILL `h.grace_s` after its stop, the earlier of
        now and `at` (when its stop was due: a time limit's moment)."""
        if why == "ledger" and h.stop_reason == "time_limit" and not h.killed:
            # past its limit, in its grace: a cancel cuts it short, as scancel does (atk46-23 F7)
            self._signal(h, signal.SIGKILL)
            h.killed = True
        if h.stop_reason is None or why == "ledger":
            h.stop_reason = why
            keep_stop([Path(p.rundir) for p in h.parts], why)  # told so after a restart
        if h.stop_at is None:
            h.stop_at = now if at is None else min(now, at)
            self._signal(h, signal.SIGTERM)
            h.termed_at = now

    def _signal(self, h: Handle, sig: signal.Signals) -> None:
        """SIGTERM or SIGKILL to every process of every part's tree (a child that outlived its
        leader, or left its session, included where cgroups hold the tree)."""
        for p in h.parts:
            if p.exit_code is not None or (sig == signal.SIGTERM and p.signalled):
                continue
            if read_identity(Path(p.rundir) / "job") is None:
                # not started yet: the supervisor passes the signal on once the job exists
                if p.pid is not None and alive(p.pid, p.pid_start):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGTERM)
                        p.signalled = True
                continue
            tree = self._tree(p)
            if sig == signal.SIGKILL:
                tree.kill()
            else:
                tree.signal(sig)
            p.signalled = True

    def _reap_starters(self) -> None:
        for rundir, starter in list(self._starting.items()):
            if starter.poll() is not None:
                del self._starting[rundir]

    def _checkpoint_mtime(self, h: Handle) -> float:
        return checkpoint_mtime(Path(p.rundir) for p in h.parts)

    def _samples(self) -> list[Sample]:
        assert self.util is not None
        out = []
        for h in self.jobs.values():
            if h.stop_reason is not None or not h.start_reported:
                continue
            values: list[float] = []
            for p in sorted(h.parts, key=lambda p: p.rank):
                got = self.util.sample(h.job_id, p.gpu_indices)
                if got is None:
                    break
                values.extend(got)
            else:
                out.append(Sample(h.job_id, tuple(values)))
        return out

    # --- recovery helpers ----------------------------------------------------------------------

    def launched_before(self, job_id: int, launch: int) -> bool:
        """`run_ends.launched_before` in this state directory."""
        return launched_before(self.state_dir, job_id, launch)

    def ended_run(self, job_id: int, run: int, now: float) -> tuple[Start | None, Exit] | None:
        """`run_ends.ended_run` in this state directory."""
        return ended_run(self.state_dir, job_id, run, now)


__all__ = ["SupervisedExecutor", "handled_jobs", "live_processes", "run_name"]


def kill_at(h: Handle) -> float:
    """Pure: when a stopped run's grace ends (`h.stop_at` set): its stop plus its grace; one
    stopped at its time limit no sooner than `min(grace, LATE_TERM_GRACE_S)` after its SIGTERM
    really went (`limit_sigkill_at`: the Slurm executor's and the reads' one rule). A cancel
    past its limit still kills at once (`_terminate`)."""
    assert h.stop_at is not None
    if h.stop_reason != "time_limit":
        return h.stop_at + h.grace_s
    return limit_sigkill_at(h.stop_at, h.grace_s, h.termed_at)
