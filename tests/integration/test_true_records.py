"""The records a sacct user relies on, as an outsider found them wrong (atk23c), on real servers
with real jobs: `agent --drain` of a node whose job is inside its contract is host maintenance
(audit check allows it, `explain` says so, the job keeps its placement and exit code: F9); a
dependency on a job array waits for every task, `afternotok` too (F2), through the server of the
local executor; a cancelled run that outlives the cancel by its grace is recorded and charged to
its real end (atk33 F1); a limit that passes while a node's agent (or `up`) is down stops the
job at once when it returns, recorded `time_limit` at its real end (atk33 F10). The Slurm
executor's twins are in test_slurm_records.py."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from tests.integration import agentkit as agents
from tests.integration.agentkit import Cluster, alive, audit_check, part_log
from tests.integration.sbatchkit import Served, ledger_home, os_user
from tests.integration.serverkit import start_server
from tests.integration.waits import wait_for

template, cluster = agents.template, agents.cluster  # the node agents' fixtures


def test_agent_drain_inside_a_contract_is_maintenance_the_audit_allows(cluster: Cluster) -> None:
    """F9: the job (1 h contract, not resumable) is stopped by `agent --drain` of its node:
    `audit check` finds no violation and lists the drain as allowed; `explain` says the node
    was drained for maintenance, not "an admin preemption"; `jobs` keeps its placement time
    and its exit code. Issue 23's note: it is recorded as the node's drain, not a preemption
    (no `job.preempted.v1`, which would also end its charge when it was recorded): it ends
    `preempted` at its run's real end, and `report preemptions` counts none."""
    c = cluster
    job = c.submit(2, "echo $$; exec sleep 120")
    j = c.wait_status(job, "running")
    node = j["logs"][0].split(":", 1)[0]
    pid = int(wait_for("the job's pid", lambda: part_log(j["logs"][0]).read_text().split())[0])
    ag = c.agents[node]
    ag.kill(signal.SIGTERM)  # stopping the agent leaves the job running
    assert alive(pid)
    drain = agents.cli(ag.state, "agent", "--node", node, "--url", c.server.url, "--gpus",
                       str(agents.GPUS), "--state-dir", str(ag.state), "--grace", "1s", "--drain",
                       GPULEDGER_NODE_TOKEN=ag.token)  # fmt: skip
    assert f"drained node {node}: stopped 1 job(s)" in drain.stdout
    stopped = time.time()  # the run ended before the drain command returned
    row = c.wait_status(job, "finished")
    assert row["finish_reason"] == "preempted", row
    assert row["placed_at"] is not None and row["exit_code"] is not None, row
    assert row["preemptions"] == 0 and row["finished_at"] <= stopped, row
    assert [ev for ev in c.events("job.preempted.v1") if ev["job_id"] == job] == []
    report = json.loads(c.cli("report", "preemptions", "--since", "2000-01-01T00:00:00Z",
                              "--json").stdout)  # fmt: skip
    assert job not in {p["job_id"] for p in report["rows"]}, report
    explain = c.cli("explain", str(job)).stdout
    assert "drained for maintenance" in explain and "admin preemption" not in explain, explain
    assert "was preempted" not in explain, explain
    c.server.stop(signal.SIGTERM)
    checked = audit_check(c)
    assert ": 0 violations" in checked, checked
    assert "DRAINED_IN_CONTRACT" in checked, checked


def test_agent_drain_reports_a_slow_resumable_jobs_exit_and_the_job_is_requeued(
    cluster: Cluster,
) -> None:
    """atk33-23 F5: the job traps TERM and needs 7 s to save, longer than the server keeps an
    idle connection (5 s): the drain's one report of its exit met a closed connection ("exits
    not reported: ... Broken pipe"), and the resumable job ended failed or node_lost instead of
    being requeued. The report now goes on a fresh connection, and is sent again until taken."""
    c = cluster
    job = c.submit(1, "trap 'sleep 7; exit 143' TERM; echo $$; while true; do sleep 0.2; done",
                   "--resumable", "--grace", "15s")  # fmt: skip
    j = c.wait_status(job, "running")
    node = j["logs"][0].split(":", 1)[0]
    ag = c.agents[node]
    ag.kill(signal.SIGTERM)  # stopping the agent leaves the job running
    drain = agents.cli(ag.state, "agent", "--node", node, "--url", c.server.url, "--gpus",
                       str(agents.GPUS), "--state-dir", str(ag.state), "--grace", "15s",
                       "--drain", GPULEDGER_NODE_TOKEN=ag.token)  # fmt: skip
    assert f"drained node {node}: stopped 1 job(s)" in drain.stdout
    assert "not reported" not in drain.stderr, drain.stderr
    wait_for("the job's requeue", lambda: [ev for ev in c.events("job.requeued.v1")
                                          if ev["job_id"] == job], 30, c.why)  # fmt: skip
    row = c.job(job)
    assert row["status"] != "finished", row


def test_a_drain_whose_report_never_reached_the_server_is_told_as_a_drain_by_the_next_agent(
    cluster: Cluster,
) -> None:
    """atk36-23 F5: with the server down, `agent --drain` stops a resumable job (it checkpoints
    and exits 0 on TERM) and is killed before its report is taken; the next agent found the
    run's end with no handle and told it as a plain exit: the job was recorded `completed`,
    never requeued. The drain is kept beside the run (`stopped`) and told as such."""
    c = cluster
    job = c.submit(1, "trap 'exit 0' TERM; echo $$; while true; do sleep 0.2; done",
                   "--resumable", "--grace", "15s")  # fmt: skip
    j = c.wait_status(job, "running")
    node = j["logs"][0].split(":", 1)[0]
    ag = c.agents[node]
    ag.kill(signal.SIGTERM)  # stopping the agent leaves the job running
    c.server.stop(signal.SIGKILL)
    drain = subprocess.Popen(
        [agents.GPULEDGER, "agent", "--node", node, "--url", c.server.url, "--gpus",
         str(agents.GPUS), "--state-dir", str(ag.state), "--grace", "15s", "--drain"],
        env=agents.env_for(ag.state, GPULEDGER_NODE_TOKEN=ag.token),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        ends = lambda: list((ag.state / "runs").glob(f"{job}.*/0/exit"))  # noqa: E731
        wait_for("the drained run's end", ends, 30, c.why)
        time.sleep(2)  # its handle closed, the state file saved; the report waits for a server
    finally:
        drain.kill()
        drain.wait()
    c.restart_server()
    ag.start()
    wait_for("the job's requeue", lambda: [ev for ev in c.events("job.requeued.v1")
                                          if ev["job_id"] == job], 30, c.why)  # fmt: skip
    assert c.job(job)["status"] != "finished"


def test_afternotok_on_an_array_waits_for_every_task_through_the_server(tmp_path: Path) -> None:
    """F2: task 0 completes while task 1 still runs and will fail: `afternotok:ARRAY` is
    accepted (it was refused "can never be satisfied"), waits, and runs once task 1 has failed;
    `afterok:ARRAY` ends dependency_never_satisfied when task 1 fails."""
    served = Served(ledger_home(tmp_path))
    go = Path(os_user().pw_dir) / f"go-{tmp_path.name}"  # where the job's user can look
    go.unlink(missing_ok=True)
    try:
        wait = f"while [ ! -e {go} ]; do sleep 0.2; done; exit 3"
        script = f'[ "$GPULEDGER_ARRAY_TASK_ID" = 0 ] && exit 0; {wait}'
        first = served.submit("--array=0-1", "--", "sh", "-c", script)
        served.wait("task 0 to complete", first, "finished")
        served.wait("task 1 to run", first + 1, "running")
        notok = served.submit(f"--dependency=afternotok:{first}", "--", "true")
        ok = served.submit(f"--dependency=afterok:{first}", "--", "true")
        queued = {r["job_id"]: r for r in json.loads(served.cli("root", "queue", "--json").stdout)}
        assert queued[notok]["code"] == "WAIT_DEPENDENCY", queued
        go.touch()
        rows = {j: served.wait("the ends", j, "finished") for j in (first + 1, notok, ok)}
        assert rows[first + 1]["finish_reason"] == "failed", rows
        assert rows[notok]["finish_reason"] == "completed", rows
        assert rows[ok]["finish_reason"] == "dependency_never_satisfied", rows
    finally:
        go.touch()
        served.server.stop()
        go.unlink()


def test_a_working_directory_removed_before_the_launch_is_launch_failed_on_the_agents(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 23's note, the node agents' twin of the Slurm test in test_slurm_world.py: a job
    whose working directory was removed after its submission (while it waited on a
    dependency), its output elsewhere, never runs: `launch_failed`, no start, no exit code,
    and `explain` says why in one line."""
    c = cluster
    gone, go = tmp_path / "gone", tmp_path / "go"
    gone.mkdir()
    first = c.submit(1, f"while [ ! -e {go} ]; do sleep 0.2; done")
    job = c.submit(1, "true", "-D", str(gone), "-o", str(tmp_path / "o-%j.out"),
                   f"--dependency=afterany:{first}")  # fmt: skip
    gone.rmdir()  # after the submission, before its launch
    go.touch()
    row = c.wait_status(job, "finished")
    assert (row["finish_reason"], row["exit_code"], row["started_at"]) == (
        "launch_failed", None, None,
    ), row  # fmt: skip
    why = f"cannot enter the working directory {gone}"
    assert row["finish_note"] == why, row
    assert [ev for ev in c.events("job.started.v1") if ev["job_id"] == job] == []
    said = [ln for ln in c.cli("explain", str(job)).stdout.splitlines() if why in ln]
    assert len(said) == 1 and "could not be started" in said[0], said


def usage_gpu_s(c: Cluster, user: str) -> float:
    rows = json.loads(c.cli("usage", "--by", "user", "--json").stdout)
    return sum(r["usage_gpu_hours"] for r in rows if r["name"] == user) * 3600.0


def test_a_cancelled_run_is_recorded_and_charged_to_its_real_end_after_its_grace(
    cluster: Cluster, tmp_path: Path
) -> None:
    """F1: the job (2 GPUs, `--grace 20s`) traps TERM and needs 3 s to save: the cancel is
    decided at once, but its processes hold the GPUs 3 s more. `jobs` ends it when it really
    ended (not at the cancel), its elapsed time and its usage (fairtree-3) run to then, and
    `explain` says so."""
    c = cluster
    began, ended = tmp_path / "began", tmp_path / "ended"
    script = (f"trap 'sleep 3; date +%s.%N > {ended}; exit 0' TERM; date +%s.%N > {began}; "
              f"while true; do sleep 0.2; done")  # fmt: skip
    job = c.submit(2, script, "--grace", "20s")
    row = c.wait_status(job, "running")
    wait_for("the job to start", began.exists)
    c.cli("cancel", str(job))
    cancelled = time.time()
    wait_for("the run's end", lambda: [ev for ev in c.events("job.run_ended.v2")
                                       if ev["job_id"] == job], 60, c.why)  # fmt: skip
    real_end = float(ended.read_text())
    assert real_end - cancelled >= 2.5
    row = c.job(job)
    assert row["finish_reason"] == "cancelled", row
    assert abs(row["finished_at"] - real_end) <= 1.0, (row, real_end)
    assert abs(row["elapsed_s"] - (real_end - row["started_at"])) <= 1.0, (row, real_end)
    charged = usage_gpu_s(c, "root")
    assert abs(charged - 2 * (real_end - row["started_at"])) <= 2.0, (charged, row, real_end)
    explain = c.cli("explain", str(job)).stdout
    assert "its run 0 really ended" in explain and "charged, until then" in explain, explain
    # atk33-23 F3: as it was between the cancel and the real end, the job shows no end after
    # that moment (the later report of the real end is not yet in the log then)
    at = math.ceil(cancelled + 0.5)  # whole seconds, before `real_end`
    iso = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    then = json.loads(c.cli("jobs", "-j", str(job), "--json", "--at", iso).stdout)
    assert then and (then[0]["finished_at"] or 0) <= at, (then, at, real_end)
    assert (then[0]["elapsed_s"] or 0) <= at - row["started_at"] + 0.001, (then, at)


def limit_passed_while_down(c: Cluster, down_s: float) -> None:
    """The job's limit (3 s) passes while its agent is killed (-9) for `down_s`; the job runs
    on (no agent watches it). When the agent comes back it stops the job at once:
    `time_limit`, its processes gone, ended (and charged) when they really ended."""
    job = c.submit(1, "echo $$; exec sleep 120", "-t", "3s")
    j = c.wait_status(job, "running")
    node = j["logs"][0].split(":", 1)[0]
    pid = int(wait_for("the job's pid", lambda: part_log(j["logs"][0]).read_text().split())[0])
    c.agents[node].kill(signal.SIGKILL)
    time.sleep(down_s)  # the limit passes while no agent watches
    assert alive(pid)
    back = time.time()
    c.agents[node].start()
    row = c.wait_status(job, "finished", timeout=60)
    assert not alive(pid)
    assert row["finish_reason"] == "time_limit", row
    assert back - 1.0 <= row["finished_at"] <= time.time(), (row, back)
    charged = usage_gpu_s(c, "root")
    assert abs(charged - (row["finished_at"] - row["started_at"])) <= 1.0, (charged, row)
    explain = c.cli("explain", str(job)).stdout
    assert "was stopped at its time limit" in explain, explain


@agents.with_flags(serve=("--node-lost-after", "60s"))
def test_a_limit_passed_while_the_agent_was_down_stops_the_job_when_it_returns(
    cluster: Cluster,
) -> None:
    """F10 (atk33), the agent back before its node is called lost."""
    limit_passed_while_down(cluster, 6.0)


def test_a_limit_passed_while_the_node_was_lost_stops_the_job_when_its_agent_returns(
    cluster: Cluster,
) -> None:
    """F10 (atk33), the agent back after its node was called lost (5 s), inside the fence."""
    limit_passed_while_down(cluster, 9.0)


def test_a_limit_passed_while_up_was_down_stops_the_job_when_it_restarts(tmp_path: Path) -> None:
    """F10's twin on the local executor: the service (and its in-process agent) is killed -9,
    the limit passes, and the restarted service stops the adopted job at once, `time_limit`,
    ended when its processes really ended."""
    served = Served(ledger_home(tmp_path))
    args = ("--executor", "local", "--run-as", "submitter", "--interval", "0.2s")
    try:
        job = served.submit("-t", "3s", "--", "sh", "-c", "exec sleep 120")
        served.wait("the job to run", job, "running")
        served.server.stop(signal.SIGKILL)
        time.sleep(5)
        back = time.time()
        served.server = start_server(served.home, *args, log_name="serve-2.log")
        row = served.wait("the limit", job, "finished")
        assert row["finish_reason"] == "time_limit", row
        assert back <= row["finished_at"] <= time.time(), (row, back)
    finally:
        served.server.stop()


def test_a_command_that_cannot_be_started_is_launch_failed_with_why_on_the_agents(
    cluster: Cluster,
) -> None:
    """atk33 F5, the node agents' twin of test_slurm_world.py's: the same record on both
    executors (`launch_failed`, no start, no exit code, why in `explain`)."""
    c = cluster
    for cmd in ("no-such-cmd-gl", "./no-such-file-gl"):
        c.cli("submit", "-A", "ai2/olmo", "-G", "1", "--", cmd)
    for job, why in [(1, "cannot start no-such-cmd-gl: not found in PATH"),
                     (2, "cannot start ./no-such-file-gl: no such executable file")]:  # fmt: skip
        row = c.wait_status(job, "finished")
        assert (row["finish_reason"], row["exit_code"], row["started_at"]) == (
            "launch_failed", None, None,
        ), row  # fmt: skip
        assert row["finish_note"] == why, row
        said = [ln for ln in c.cli("explain", str(job)).stdout.splitlines() if why in ln]
        assert len(said) == 1 and "could not be started" in said[0], said


def test_dependents_estimates_wait_for_their_gpus_through_the_server(tmp_path: Path) -> None:
    """F3 through `queue` and `explain` on a real server: job A holds the 8-GPU node (10 min
    limit), B (8 GPUs, 10 min) goes next; C and D (8 GPUs, 1 min) wait for A (afterok). C
    starts when B reaches its limit, D a minute later: never on GPUs B holds, nor together."""
    served = Served(ledger_home(tmp_path))
    try:
        a = served.submit("-G", "8", "-t", "10", "--", "sleep", "300")
        row = served.wait("A to run", a, "running")
        b = served.submit("-G", "8", "-t", "10", "--", "true")
        deps = [served.submit("-G", "8", "-t", "1", f"--dependency=afterok:{a}", "--", "true")
                for _ in range(2)]  # fmt: skip
        queued = {r["job_id"]: r for r in json.loads(served.cli("root", "queue", "--json").stdout)}
        b_at = queued[b]["estimated_start_at"]
        assert abs(b_at - (row["started_at"] + 600)) <= 1.0, (queued, row)
        got = [queued[d]["estimated_start_at"] for d in deps]
        assert got == [b_at + 600, b_at + 660], queued
        told = json.loads(served.cli("root", "explain", str(deps[1]), "--json").stdout)
        assert told["estimated_start_at"] == got[1], told
        served.cli("root", "cancel", str(a))  # its sleep outlives the server otherwise
        served.wait("A to end", a, "finished")
    finally:
        served.server.stop()


def test_a_requeued_job_placed_again_at_once_stops_its_run_and_starts_a_new_one(
    tmp_path: Path,
) -> None:
    """atk34-29 F5: `requeue` of a running job on a free cluster: the next cycle placed it
    again at once, so no cycle saw it waiting and ordered its run stopped; the old process ran
    on, uncounted, and the new run never started (`placed` until the server restarted). The
    old run now stops (its processes gone, checked from /proc) and the job runs again."""
    served = Served(ledger_home(tmp_path), "--grace", "2s")
    pids = Path(os_user().pw_dir) / f"pids-{tmp_path.name}"
    pids.unlink(missing_ok=True)
    try:
        job = served.submit("--min-runtime", "0", "--", "sh", "-c",
                            f"echo $$ >> {pids}; exec sleep 300")  # fmt: skip
        served.wait("the first run", job, "running")
        first = int(wait_for("the first pid", lambda: pids.read_text().split())[0])
        assert alive(first)
        served.cli("root", "requeue", str(job))
        second = wait_for("a second run", lambda: pids.read_text().split()[1:], 30, served.why)
        assert not alive(first), "the first run lives on beside the second"
        row = served.wait("the second run", job, "running")
        assert row["preemptions"] == 1, row
        assert alive(int(second[0]))
    finally:
        served.server.stop()
        pids.unlink(missing_ok=True)


def _node_row(c: Cluster, node: str) -> tuple[list[int], int]:
    """(its GPUs shown stopping, its free GPUs) as `node list --json` says."""
    rows = json.loads(c.cli("node", "list", "--json").stdout)
    row = next(r for r in rows if r["node"] == node)
    return row["stopping_gpus"], row["free_gpus"]


@agents.with_flags(serve=("--node-lost-after", "60s"))
def test_a_stopping_runs_gpus_stay_held_across_a_server_restart_and_it_keeps_its_umask(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk36-23 F1: the job (`--grace 20s`) ignores SIGTERM; it is cancelled and the server is
    killed -9 and started again inside the grace. Its GPU stays `stopping` (not free) while its
    process lives, then is free once its end is recorded (before: free at once after the
    restart). The job was submitted under umask 0027: it runs with it and its `-o` file is
    0640, as sbatch makes it (before: the service's umask, and 0600)."""
    c = cluster
    out = tmp_path / "stubborn.out"
    before = os.umask(0o027)
    try:
        script = "umask; echo $$; trap '' TERM; while :; do sleep 0.2; done"
        job = c.submit(1, script, "--grace", "20s", "-o", str(out))
    finally:
        os.umask(before)
    row = c.wait_status(job, "running")
    ((node, gpus),) = [(s["node"], s["gpu_indices"]) for s in row["slots"]]
    mask, pid = wait_for("its output", lambda: len(out.read_text().split()) > 1 and
                         out.read_text().split())[:2]  # fmt: skip
    assert (mask, out.stat().st_mode & 0o777) == ("0027", 0o640)
    c.cli("cancel", str(job))
    wait_for("its GPU stopping", lambda: _node_row(c, node) == (gpus, 1), 30, c.why)
    c.server.stop(signal.SIGKILL)
    c.restart_server()
    for _ in range(2):  # its process lives on in its grace: its GPU is not free
        assert alive(int(pid))
        assert _node_row(c, node) == (gpus, 1), c.why()
        time.sleep(1.0)
    wait_for("its process to be killed", lambda: not alive(int(pid)), 30, c.why)
    wait_for("its GPU free", lambda: _node_row(c, node) == ([], 2), 30, c.why)
    assert [ev for ev in c.events("job.run_ended.v2") if ev["job_id"] == job]


@agents.with_flags(serve=("--node-lost-after", "60s"), agent=("--check-every", "5s"))
def test_a_start_first_told_after_an_agent_restart_keeps_the_jobs_output_path(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk36-23 F4: the job's agent launches it and is killed -9 before it looked at it again
    (it looks every 5 s here), and loses its state file; the job runs and ends; the restarted
    agent tells its start and end together. The start names the job's output file (before:
    no path at all). (It used to hold the leader with a named pipe as its output, nobody
    reading: such an output is refused now, atk37-23 F1.)"""
    c = cluster
    out = tmp_path / "out.txt"
    job = c.submit(1, "echo ran", "-o", str(out))
    row = c.wait_status(job, "placed")
    node = row["slots"][0]["node"]
    ag = c.agents[node]
    rundir = ag.state / "runs" / f"{job}.1" / "0"
    wait_for("the launch", lambda: f"launched job {job} " in ag.text(), 30, c.why)
    ag.kill(signal.SIGKILL)
    assert c.job(job)["status"] == "placed"  # its agent never told its start
    (ag.state / "state.json").unlink(missing_ok=True)
    wait_for("the job's end", lambda: (rundir / "exit").exists(), 30, c.why)
    ag.start()
    done = c.wait_status(job, "finished")
    assert out.read_text() == "ran\n"
    assert (done["finish_reason"], done["started_at"] is not None) == ("completed", True), done
    assert done["logs"] == [f"{node}:{out}"], done
