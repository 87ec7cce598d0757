"""Which Slurm cluster a server talks to, as the lease row records it (docs/ha.md): the
cluster's name, its controller hosts and port (`scontrol show config`), where its controller
saves the cluster's state (`StateSaveLocation`), and whether the server
accepts processes Slurm cannot follow (`GPULEDGER_SLURM_UNTRACKED_OK`). Every server of a store
runs the same cluster's partition: a standby started with another `SLURM_CONF` took over
another cluster after a failover (atk40-28 F2), so a server on a PostgreSQL store starts only
while slurmctld answers (it needs this identity to be compared) and one that talks to another
cluster never leads (`ledger.wire.config.admission_of`)."""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from ledger.engines.slurm.words import UNTRACKED_OK
from schemas.errors import EngineError, InvalidCommand, LedgerError

if TYPE_CHECKING:
    from ledger.core.state import State

log = logging.getLogger("gpuledger.slurm")

_HOST = re.compile(r"^SlurmctldHost\[(\d+)\]$")


def identity(config: str, untracked_ok: bool) -> dict[str, object]:
    """Pure: the cluster's identity from `scontrol show config` output (`ClusterName`, every
    `SlurmctldHost[i]` in order, `SlurmctldPort`; `StateSaveLocation`), and `untracked_ok`, as
    the recorded settings' keys `slurm_cluster`, `slurm_state` and `slurm_untracked_ok`.

    `slurm_state` is where the controller keeps the cluster's state (its jobs, their ids):
    two clusters of one name, controller text and port (one stopped and the other started in
    its place, or `SlurmctldHost` a name each network resolves otherwise) were one cluster to
    the servers (atk42-28 F3). Slurm 22.05 has no cluster id to ask for: its
    `clustername` state file holds the name only, and the `cluster_id` it knows is the
    federation's, given by slurmdbd. A row recorded without `slurm_state` is compared by the
    keys it has (`lease.admission_differences`); the next take records it."""
    values: dict[str, str] = {}
    hosts: dict[int, str] = {}
    for line in config.splitlines():
        key, eq, value = line.partition("=")
        if not eq:
            continue
        key, value = key.strip(), value.strip()
        if found := _HOST.match(key):
            hosts[int(found.group(1))] = value
        else:
            values.setdefault(key, value)
    if not hosts and values.get("ControlMachine"):  # older Slurm's name for the first host
        hosts[0] = values["ControlMachine"]
    named = ",".join(hosts[i] for i in sorted(hosts)) or "?"
    cluster = f"{values.get('ClusterName', '?')} at {named} port {values.get('SlurmctldPort', '?')}"
    state = values.get("StateSaveLocation", "?")
    return {"slurm_cluster": cluster, "slurm_state": state, "slurm_untracked_ok": untracked_ok}


def read_identity(env: Mapping[str, str], timeout_s: float = 30.0) -> dict[str, object]:
    """The identity (`identity`) of the cluster `env`'s `SLURM_CONF` names, asked of its
    slurmctld; one clear line when it does not answer (a server on a PostgreSQL store waits
    for it: its settings are compared with the recorded ones before it may stand by)."""
    where = env.get("SLURM_CONF") or "the default slurm.conf"
    try:
        done = subprocess.run(
            ["scontrol", "show", "config"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=dict(env),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        done = None
        said = str(err)
    if done is not None and done.returncode == 0 and "ClusterName" in done.stdout:
        return identity(done.stdout, env.get(UNTRACKED_OK, "") == "1")
    if done is not None:
        lines = (done.stderr or done.stdout).strip().splitlines()
        said = lines[-1] if lines else f"exit {done.returncode}"
    raise InvalidCommand(
        f"slurmctld does not answer (scontrol show config, {where}): {said}",
        hint="a Slurm server on a PostgreSQL store starts once its cluster's controller answers: "
        "which cluster it talks to is compared with the other servers' (docs/ha.md)",
    )


class OtherCluster(EngineError):
    """The slurmctld that answers is not the cluster this server runs (`Watch`)."""


COMPARED = ("slurm_cluster", "slurm_state")
"""The parts of the identity that tell two clusters apart (`identity`)."""


class Watch:
    """Which cluster the controller that answers is, asked again whenever it answers after
    being away (and every `every_s` while it answers): a controller back from an outage as
    another cluster (another `StateSaveLocation`, the same name and port) was used as the
    recorded one, and the ledger recorded its runs lost and would have placed there (atk43ha
    F5). `expected` is the identity this server runs (the one its store records; None: the
    first one read, a server on SQLite). While another answers (`away`), the executor reads,
    places and stops nothing there: every node unobserved, said in `status`."""

    def __init__(self, read: Callable[[], str], expected: Mapping[str, object] | None = None,
                 every_s: float = 5.0) -> None:  # fmt: skip
        self.read = read
        """Asks the controller (`scontrol show config`; `EngineError` when it does not answer)."""
        self.expected = None if expected is None else {k: expected.get(k) for k in COMPARED}
        self.every_s = every_s
        self.away = ""
        """Why the controller that answers is not this server's cluster ("" while it is)."""
        self._at: float | None = None  # when to ask again
        self._confirmed: float | None = None  # when this server's cluster last answered as it
        self._asked: float | None = None  # when `confirm` last asked

    def learn(self, config: str) -> str:
        """Pure but for the state it keeps: why `config` (`scontrol show config`) is not the
        expected cluster ("" when it is; the first one read is expected when none was)."""
        if "ClusterName" not in config:
            return ""  # not an answer about a cluster: nothing to compare
        seen = identity(config, False)
        mine = {k: seen[k] for k in COMPARED}
        if self.expected is None:
            self.expected = mine
        differ = [f"{k} {mine[k]} (answering) against {self.expected[k]} (this server's)"
                  for k in COMPARED if mine[k] != self.expected[k]]  # fmt: skip
        return ("the slurmctld that answers is another cluster than this server's: "
                + "; ".join(differ)) if differ else ""  # fmt: skip

    def same(self, now: float, back: bool) -> bool:
        """Whether the controller that answers is this server's cluster, asked (`read`) when it
        is `back` from an outage, and every `every_s` anyway; True when it cannot be read (an
        outage: the executor's own read says so). Says each change once in the log."""
        if not back and (self._at is not None and now < self._at):
            return not self.away
        self._at = now + self.every_s
        try:
            text = self.read()
        except EngineError:
            return True
        self._say(self.learn(text), now)
        return not self.away

    def confirm(self, now: float, within_s: float = 1.0) -> bool:
        """Before an sbatch or scancel: whether the controller that answers is this server's
        cluster, asked again unless it answered as it within `within_s`. A controller replaced
        within `scontrol`'s own retries (about 9 s) is never an outage to the reads, and `same`
        asks only every `every_s`: runs were placed and stopped on another cluster in between
        (atk44ha F1). False, and not asked again for `within_s`, when it does not answer."""
        if not self.away and self._confirmed is not None and 0 <= now - self._confirmed <= within_s:
            return True
        if self._asked is not None and 0 <= now - self._asked < within_s:
            return False
        self._asked = now
        try:
            text = self.read()
        except EngineError:
            return False
        self._say(self.learn(text), now)
        return not self.away

    def landed(self, slurm_id: str, run: tuple[int, int], ledger_id: str,
               ask: Callable[[list[str]], str], now: float) -> str | None:  # fmt: skip
        """After an sbatch of `run` answered `slurm_id`: the id to keep, None when it landed on
        another cluster (`landing`: the identity asked again, and the other's record of the
        id; `ask` runs scontrol and scancel). A run landed there is cancelled there (its
        comment and name prove it this ledger's) and counts as never launched: it is submitted
        again once this server's cluster answers. Before, it kept the other cluster's id,
        counted as missing on its own and ended as a vanished run (atk44ha F1)."""
        from ledger.engines.slurm.words import parse_jobs

        try:
            self._say(self.learn(self.read()), now)
            answering: str | None = self.away
        except EngineError:
            answering = None
        there, read = None, True
        if answering:
            try:
                listed = parse_jobs(ask(["scontrol", "-d", "-o", "show", "job", slurm_id]))
                there = next((j.tag(ledger_id) for j in listed if j.slurm_id == slurm_id), None)
            except EngineError:
                read = False
        where = landing(answering, there, run, read)
        if where == "here":
            return slurm_id
        if where == "unknown":
            log.warning(
                "job %s run %s (Slurm job %s): no slurmctld tells after its sbatch which "
                "cluster took it; kept as this cluster's",
                *run,
                slurm_id,
            )
            return slurm_id
        try:
            ask(scancel_args(slurm_id, run))
            gone = "cancelled there"
        except EngineError as err:
            gone = f"NOT cancelled there ({err.line()}): it may run there, out of reach"
        log.error("job %s run %s (Slurm job %s) was submitted to another cluster (its slurmctld "
                  "answered during the sbatch): %s; submitted again once this server's cluster "
                  "answers", *run, slurm_id, gone)  # fmt: skip
        return None

    def _say(self, why: str, now: float) -> None:
        """Keep what the last answer said (`away`), saying each change once in the log."""
        if why and why != self.away:
            log.error("%s: reading, placing and stopping nothing there until this server's "
                      "cluster answers (docs/ha.md)", why)  # fmt: skip
        elif self.away and not why:
            log.warning("this server's Slurm cluster answers again")
        self.away = why
        self._confirmed = None if why else now


def landing(
    answering: str | None, there: tuple[int, int] | None, run: tuple[int, int], read: bool = True
) -> str:
    """Pure: where an `sbatch` of `run` (job id, run) landed, judged right after it returned
    its Slurm id: `answering` is why the controller that answers then is not this server's
    cluster ("" it is; None: none answers), `there` the run (job, run) the job of that id is
    for by the answering controller's record (its comment and name; None: none, or not this
    ledger's; `read`: False when the other's record could not be read). "here": on this
    server's cluster (kept); "there": on the other cluster, which
    answered within sbatch's own retries or in the second before it (the run never launched
    here); "unknown": nobody answers to tell (kept: a run its cluster never lists counts as
    missing, then vanished). A swap there and back within one sbatch is not seen."""
    if answering == "":
        return "here"
    if answering is None or not read:
        return "unknown"
    return "there" if there == run else "here"


def scancel_args(slurm_id: str, run: tuple[int, int] | None, *how: str) -> list[str]:
    """`scancel [how] SLURM_ID`, restricted to the name of `run`'s job (`gpuledger-<job>`)
    when it is known: a controller swapped within scancel's own retries (about 9 s) has
    another job under the id, which Slurm then leaves alone (atk44ha F1; Slurm 22.05: a name
    filter with a job id cancels only a job of both, silently none otherwise)."""
    named = [f"--name=gpuledger-{run[0]}"] if run is not None else []
    return ["scancel", *how, *named, slurm_id]


def term_args(slurm_id: str, run: tuple[int, int] | None) -> list[list[str]]:
    """The executor's stop's SIGTERM (`scancel_args`: restricted to its job's name), in two:
    `scancel --signal=TERM SLURM_ID` signals the job's steps alone, on every node: the tasks of
    what its command started with `srun`, its ranks; then `--batch`, the batch shell alone,
    whose trap passes it on to every process of the job but `srun` (`script_tree.gpuledger_pass`:
    its own step's, its steps' other processes on each node). Never `--full`: that signals the
    batch step's every process, `srun` among them, and srun answers a SIGTERM by SIGKILLing its
    step's tasks at once ("forcing job termination"; srun(1), "Signals sent to the srun command
    are automatically forwarded to the tasks it is controlling with a few exceptions"): a gang's
    ranks on every node died at the SIGTERM with no grace (atk58 F1). Steps first, so a command
    that ends at its own SIGTERM has not ended the job before its ranks got theirs."""
    return [
        scancel_args(slurm_id, run, "--signal=TERM"),
        scancel_args(slurm_id, run, "--signal=TERM", "--batch"),
    ]


def kill_args(slurm_id: str, run: tuple[int, int] | None) -> list[str]:
    """`scancel --signal=KILL --batch SLURM_ID` (`scancel_args`: restricted to its job's name):
    SIGKILL to the job's batch step, whose slurmstepd kills at once every process of its step's
    cgroup (the script, the command and what they left), and Slurm then ends the job, `FAILED`
    `0:9`. A plain `scancel` or `--signal=KILL --full` is Slurm's own termination on 22.05:
    SIGTERM, then SIGKILL only `KillWait` later (atk47-s F3: a 20 s grace gave 29.5 s). Steps
    started with `srun` get Slurm's termination when the batch step ends (a step id takes no
    name filter, so the executor signals no step by its id)."""
    return scancel_args(slurm_id, run, "--signal=KILL", "--batch")


def read_text(path: str) -> str | None:
    """A file's text as this host reads it (at most 1 MiB), None when it cannot."""
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return None


def changed(recorded: Mapping[str, object], mine: Mapping[str, object]) -> str:
    """Pure: how the Slurm cluster of `mine` (this server's identity) differs from the one the
    store records (`recorded`: its admission settings), in words ("" when it is the same, or
    the record names none: an earlier version's, or not a Slurm store)."""
    return "; ".join(
        f"{k} {recorded[k]} (recorded) against {mine.get(k)} here"
        for k in COMPARED
        if k in recorded and recorded[k] != mine.get(k)
    )


def runs_held(
    jobs: Iterable[tuple[int, str, int]], stopping: Iterable[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Pure: the runs (job id, run) the ledger holds on its cluster: those of its jobs (`jobs`:
    job id, status, run) placed or running, and those it stopped whose end is not recorded
    yet (`stopping`: `State.stopped_runs`): a cancel recorded while the controller was away
    never reached its run, which runs on (atk44ha F3)."""
    held = {(job, run) for job, status, run in jobs if status in ("placed", "running")}
    return sorted(held | set(stopping))


def left_status(left: Iterable[int], live: Mapping[int, str]) -> dict[int, str]:
    """Pure: the status of each job of `left` (`runs_not_on`) by the ledger's live jobs
    (`live`: job id -> status); a job that has finished (cancelled, its run still being
    stopped: `runs_held`) is no live job: "stopping". Before, such a job crashed
    `--new-settings` with an internal error (KeyError, atk45ha F2)."""
    return {j: live.get(j, "stopping") for j in left}


def left_behind(left: Iterable[int], status: Mapping[int, str], abandoned: bool) -> str:
    """Pure: what `--new-settings` onto another cluster does to the ledger's jobs `left` (their
    runs the new cluster does not list; `status`: each job's in the ledger, "stopping" for a
    finished one: `left_status`), in words: a running run is recorded lost at the takeover and
    runs on there, out of the ledger's reach, until a server talks to that cluster again,
    which stops it as a run the ledger no longer runs; a run being stopped (its job cancelled,
    preempted or requeued) stays stopping in the ledger, its end recorded once a server talks
    to that cluster again; a placed one is submitted again on the new cluster (before, both
    were said to run on the recorded cluster, unaccounted: atk44ha L1; and the running ones
    were said recorded lost and were not: atk45ha L1). `abandoned`: `--abandon-runs` given
    (what is done), else what would be."""

    def named(jobs: list[int]) -> str:
        return ", ".join(map(str, jobs[:10])) + (", ..." if len(jobs) > 10 else "")

    running = [j for j in left if status.get(j) == "running"]
    placed = [j for j in left if status.get(j) == "placed"]
    stopping = [j for j in left if status.get(j) not in ("running", "placed")]
    said = []
    reach = ", out of the ledger's reach until a server talks to it again, which stops them"
    if running:
        said.append(
            f"{'recorded' if abandoned else 'would record'} lost {len(running)} runs the ledger "
            f"holds that it does not list (jobs {named(running)}): they run on the recorded "
            f"one{reach if abandoned else ''}"
        )
    if stopping:
        said.append(
            f"{'leaves' if abandoned else 'would leave'} {len(stopping)} runs being stopped on "
            f"the recorded one that it does not list (jobs {named(stopping)}): their end is "
            "recorded once a server talks to it again"
        )
    if placed:
        said.append(
            f"{'submits' if abandoned else 'would submit'} again here {len(placed)} placed runs "
            f"it does not list (jobs {named(placed)}): one submitted on the recorded one before "
            "may start there too"
        )
    return "; ".join(said)


def runs_not_on(
    env: Mapping[str, str], partition: str, ledger_id: str, held: Iterable[tuple[int, int]]
) -> list[int]:
    """The jobs of `held` (job id, run: `runs_held`) whose run the cluster `env`'s
    `SLURM_CONF` names does not list on `partition` (`scontrol show job`: running, pending or
    ended there), in order: runs that live on another cluster, if anywhere. `EngineError`
    when it does not answer."""
    from ledger.engines.slurm.words import parse_jobs

    try:
        done = subprocess.run(["scontrol", "-d", "-o", "show", "job"], capture_output=True,
                              text=True, timeout=60, env=dict(env), check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        raise EngineError(f"scontrol show job failed: {err}") from err
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise EngineError(f"scontrol show job: {said[-1] if said else done.returncode}")
    listed = {j.tag(ledger_id) for j in parse_jobs(done.stdout) if j.partition == partition}
    return sorted({job for job, run in held if (job, run) not in listed})


def vet_runs_left(
    state: State,
    admission: str | None,
    slurm: Mapping[str, object],
    partition: str,
    ledger_id: Callable[[], str],
    abandon: bool,
) -> set[tuple[int, int]]:
    """Refuse (one line) `--new-settings` onto another Slurm cluster than the one the store
    records (`admission`: its recorded settings) while the ledger (`state`) holds runs the new
    cluster (`slurm`, `SLURM_CONF`'s) does not list: they run on the recorded cluster, and the
    take would record them lost (exit -1) while they run on there, unaccounted and out of the
    ledger's reach; going back stopped them (atk43ha F2). Runs it stopped whose end is not
    recorded count too (`runs_held`: a cancel recorded while the controller was away never
    reached its run, atk44ha F3; its job finished: `left_status`, atk45ha F2). A move of the
    same cluster (its controller's host or port, its state copied to another
    `StateSaveLocation`) lists them, and passes; so does `abandon` (`--abandon-runs`), which
    says so and returns the running runs (job, run) left there, which the new leader's
    executor never adopts, so its takeover records them lost (before, it said so and
    recorded nothing: the new leader carried them as runs its Slurm forgot, `running` for as
    long as their heartbeat lived, atk45ha L1)."""
    import json
    import os

    how = changed(json.loads(admission or "{}"), slurm)
    held = runs_held(((j.job_id, j.status, j.run) for j in state.jobs.values()),
                     state.stopped_runs)  # fmt: skip
    if not how or not held:
        return set()
    try:
        left = runs_not_on(os.environ, partition, ledger_id(), held)
    except LedgerError as err:
        raise InvalidCommand(
            f"--new-settings onto another Slurm cluster ({how}): its jobs "
            f"cannot be read to check the ledger's runs: {err.line()}"
        ) from err
    if not left:
        log.warning("--new-settings: another Slurm cluster (%s); it lists every run the ledger "
                    "holds (a move): they are adopted there", how)  # fmt: skip
        return set()
    status = left_status(left, {j: job.status for j, job in state.jobs.items()})
    if abandon:
        log.warning("--new-settings --abandon-runs onto another Slurm cluster (%s): %s", how,
                    left_behind(left, status, True))  # fmt: skip
        return {(j, r) for j, r in held if status.get(j) == "running"}
    raise InvalidCommand(
        f"--new-settings onto another Slurm cluster ({how}) {left_behind(left, status, False)}",
        hint="let them end or cancel them first (start the servers with the recorded cluster's "
        "SLURM_CONF), or move that cluster's state with it; or give --abandon-runs with "
        "--new-settings to record the running ones lost (docs/ha.md)",
    )
