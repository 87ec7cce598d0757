"""A researcher's job behaves as it would under sbatch (issue 23), on a real server with real
job processes, as real OS users the test creates (it runs as root):

- who a job runs as: a ledger user without an OS account, a member named `root` added by a
  manager, an account below the minimum uid: refused with one line, nothing appended; a job
  that reaches the engine without an account the rule accepts is recorded `launch_failed`,
  never run as root;
- `-t` in every Slurm form; arrays whose `%N` limit is never exceeded; a dependency chain that
  runs in order;
- every `finish_reason` from a real path, in `jobs --json` and in `explain`.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.engines.accounts import own_umask
from tests.integration import userkit
from tests.integration.sbatchkit import BUDGET, USER, Served, ledger_home, os_user
from tests.integration.serverkit import cli, make_token, start_server
from tests.integration.waits import wait_for


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(ledger_home(tmp_path))
    yield s
    s.server.stop()


def _one_line_refusal(proc: subprocess.CompletedProcess[str], want: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and want in lines[0], lines[0]


def test_who_a_job_runs_as_is_refused_with_one_line_and_nothing_appended(
    served: Served,
) -> None:
    head = served.server.head()
    # a ledger user with no OS account
    proc = served.cli("ghost", "submit", "-A", "ai2/olmo", "-G", "1", "--", "true", ok=False)
    _one_line_refusal(proc, "'ghost' has no OS account here")
    # a member named root, added by a manager who is not an admin
    proc = served.cli("mgr", "member", "add", "root", "ai2/olmo", ok=False)
    _one_line_refusal(proc, "'mgr' may not add 'root': it is a system account (uid 0 < min_")
    # F3: nor `nobody` (uid 65534, above max_uid, nologin), nor a person-less account above
    # Debian's UID_MAX (Debian's `slurm` is 64030)
    proc = served.cli("mgr", "member", "add", "nobody", "ai2/olmo", ok=False)
    _one_line_refusal(proc, "'mgr' may not add 'nobody': it is a system account (uid 65534 > ")
    with userkit.os_user("glhi", uid=61123) as high:
        proc = served.cli("mgr", "member", "add", high.name, "ai2/olmo", ok=False)
        _one_line_refusal(proc, "it is a system account (uid 61123 > max_uid 60000)")
    with userkit.os_user("glsu") as sudoer:  # a person, but one with the system's rights
        subprocess.run(["usermod", "-aG", "sudo", sudoer.name], check=True)
        proc = served.cli("mgr", "member", "add", sudoer.name, "ai2/olmo", ok=False)
        _one_line_refusal(proc, "it is a system account (in group sudo)")
    # ... and a system account (uid 1) likewise; the HTTP API says the same
    code, body = served.server.request(
        "POST", "/v1/commands/member.add",
        {"actor": "", "user": "daemon", "project": "ai2/olmo"}, served.tokens["mgr"],
    )  # fmt: skip
    assert code == 403 and "it is a system account (uid 1 < min_uid" in json.dumps(body), body
    assert served.server.head() == head
    # an admin may add a system account, but no job runs as it: below the minimum uid
    served.cli("root", "member", "add", "daemon", "ai2/olmo")
    head = served.server.head()
    daemon = make_token(served.home, "--user", "daemon")
    proc = cli(
        served.home, "submit", "-A", "ai2/olmo", "-G", "1", "--", "true", ok=False,
        GPULEDGER_URL=served.server.url, GPULEDGER_TOKEN=daemon,
    )  # fmt: skip
    _one_line_refusal(proc, "'daemon' is a system account (uid 1 < min_uid 1000)")
    # root's own jobs: not unless the site allows them
    served.cli("root", "member", "add", "root", "ai2/olmo")
    head = served.server.head()
    proc = served.cli("root", "submit", "-A", "ai2/olmo", "-G", "1", "--", "true", ok=False)
    _one_line_refusal(proc, "jobs of 'root' would run as root")
    assert served.server.head() == head
    # N12: a user who is no admin submitting as root (`--as root`, $GPULEDGER_USER=root) is
    # refused as acting as someone else, before any word about how jobs run
    for how in (["--as", "root"], []):
        proc = cli(
            served.home, *how, "submit", "-A", "ai2/olmo", "-G", "1", "--", "id", ok=False,
            GPULEDGER_URL=served.server.url, GPULEDGER_TOKEN=served.tokens[USER],
            GPULEDGER_USER="root",
        )  # fmt: skip
        _one_line_refusal(proc, f"'{USER}' may not act as 'root': only admins may use --as")
        assert "would run as root" not in proc.stderr
    assert served.server.head() == head
    status = served.cli("root", "status").stdout
    assert "jobs run as   their owners' OS accounts (uid 1000-60000)" in status


def test_a_job_that_reaches_the_engine_without_an_account_fails_its_launch(
    tmp_path: Path,
) -> None:
    """Submitted to the data directory with no server in front (nothing asked then), the job
    of a user with no OS account is recorded `launch_failed` when the service would launch it,
    with why; it never runs (as root or anyone)."""
    home = ledger_home(tmp_path)
    marker = tmp_path / "ran"
    cli(home, "--as", "ghost", "submit", "-A", "ai2/olmo", "-G", "1", "--", "touch", str(marker),
        GPULEDGER_USER="root")  # fmt: skip
    s = Served(home)
    try:
        row = s.wait("the launch fails", 1, "finished")
        assert (row["finish_reason"], row["exit_code"], row["started_at"]) == (
            "launch_failed",
            None,
            None,
        )
        assert "'ghost' has no OS account here" in row["finish_note"]
        said = s.cli("root", "explain", "1").stdout
        assert "is finished (launch failed)" in said and "could not be started" in said
        assert "has no OS account" in said
        # a teammate who manages nothing sees that it failed, not the words (they name paths)
        other = s.cli(USER, "explain", "1").stdout
        assert "could not be started" in other and "has no OS account" not in other
        (row,) = [r for r in json.loads(s.cli(USER, "jobs", "--json").stdout) if r["job_id"] == 1]
        assert (row["finish_reason"], row["finish_note"], row["redacted"]) == (
            "launch_failed", "", True
        )  # fmt: skip
        assert not marker.exists()
    finally:
        s.server.stop()


def test_every_finish_reason_comes_from_a_real_path(served: Served) -> None:
    jobs: dict[str, int] = {}
    jobs["completed"] = served.submit("--", "sh", "-c", "exit 0")
    jobs["failed"] = served.submit("--", "sh", "-c", "exit 3")
    jobs["time_limit"] = served.submit("-t", "0:02", "--", "sleep", "60")
    parent = served.submit("--", "sh", "-c", "sleep 2; exit 1")
    jobs["dependency_never_satisfied"] = served.submit(f"--dependency=afterok:{parent}", "--",
                                                       "true")  # fmt: skip
    for name in ("cancelled", "preempted", "node_lost"):
        jobs[name] = served.submit("--", "sleep", "120")
    for name in ("cancelled", "preempted", "node_lost"):
        served.wait(name, jobs[name], "running")
    # the time-limited job has ended before its node may be lost (else it is lost with it)
    served.wait("time_limit", jobs["time_limit"], "finished", 90)
    served.cli(USER, "cancel", str(jobs["cancelled"]))
    served.cli("root", "preempt", str(jobs["preempted"]), "--reason", "the test makes room")
    node = served.jobs()[jobs["node_lost"]]["nodes"][0]
    served.cli("root", "node", "lost", node, "--reason", "pulled the plug")
    rows = {name: served.wait(name, job, "finished", 90) for name, job in jobs.items()}
    assert {name: row["finish_reason"] for name, row in rows.items()} == {n: n for n in jobs}
    assert (rows["completed"]["exit_code"], rows["failed"]["exit_code"]) == (0, 3)
    assert rows["node_lost"]["nodes"] == [node] and rows["node_lost"]["slots"]  # kept
    assert rows["dependency_never_satisfied"]["started_at"] is None
    assert rows["completed"]["started_at"] is not None
    words = {
        "completed": "completed: it exited 0",
        "failed": "failed: it exited non-zero",
        "time_limit": "was stopped at its time limit",
        "cancelled": f"was cancelled by {USER}",
        "preempted": "was preempted, and as it is not resumable it ended there",
        "node_lost": "ended with its node, which was lost",
        "dependency_never_satisfied": f"job {parent} ended failed: afterok:{parent} can never",
    }
    for name, job in jobs.items():
        said = served.cli("root", "explain", str(job)).stdout
        assert words[name] in said, (name, said)
    served.cli("root", "node", "return", node)


def test_an_arrays_limit_is_never_exceeded_and_a_chain_runs_in_order(
    served: Served, tmp_path: Path
) -> None:
    go = Path(os_user().pw_dir) / f"go-{tmp_path.name}"  # where the job's user can look
    go.unlink(missing_ok=True)  # left by an earlier run that failed
    wait = f"while [ ! -e {go} ]; do sleep 0.2; done"
    first = served.submit("--array=0-5%2", "--", "sh", "-c", wait)
    a = served.submit("--", "sh", "-c", wait)
    b = served.submit(f"--dependency=afterok:{a}", "--", "true")
    c = served.submit(f"--dependency=afterok:{b}", "--", "true")
    try:
        for task in (first, first + 1, a):
            served.wait("the first tasks run", task, "running")
        queued = {r["job_id"]: r for r in json.loads(served.cli(USER, "queue", "--json").stdout)}
        assert {j: queued[j]["code"] for j in range(first + 2, first + 6)} == dict.fromkeys(
            range(first + 2, first + 6), "WAIT_ARRAY_LIMIT"
        )
        assert (queued[b]["code"], queued[c]["code"]) == ("WAIT_DEPENDENCY", "WAIT_DEPENDENCY")
        assert f"afterok: job {a} has not ended" in queued[b]["reason"]
        # N11: the tasks held by %2 and the dependents were "unknown": no job here has a time
        # limit, so they still are; with limits they are estimated (test_queue_estimates_...)
        assert queued[first + 2]["estimated_start_at"] is None
        running = json.loads(served.cli(USER, "queue", "--state", "running", "--json").stdout)
        assert sorted(r["job_id"] for r in running) == [first, first + 1, a]
        assert all(r["state"] == "running" and r["nodes"] == ["n1"] for r in running)
    finally:
        go.touch()
    for job in [*range(first, first + 6), a, b, c]:
        row = served.wait("everything ends", job, "finished", 120)
        assert row["finish_reason"] == "completed", row
    # sacct -j ARRAY_ID: every task of the array; a task's own id: that task
    listed = json.loads(served.cli(USER, "jobs", "-j", f"{first},{a}", "--json").stdout)
    assert sorted(r["job_id"] for r in listed) == [*range(first, first + 6), a]
    listed = json.loads(served.cli(USER, "jobs", "-j", str(first + 2), "--json").stdout)
    assert [(r["job_id"], r["array_job_id"], r["array_task_id"]) for r in listed] == [
        (first + 2, first, 2)
    ]
    holding: set[int] = set()
    most = 0
    placed: dict[int, int] = {}
    ended: dict[int, int] = {}
    tasks = set(range(first, first + 6))
    for ev in served.events():  # in log order
        job = ev.get("job_id")
        if ev["type"] == "job.placed.v1":
            placed[job] = ev["position"]
            if job in tasks:
                holding.add(job)
                most = max(most, len(holding))
        elif ev["type"] in ("job.finished.v2", "job.preempted.v1"):
            ended[job] = ev["position"]
            holding.discard(job)
    assert most == 2, most  # the limit, reached and never passed
    assert ended[a] < placed[b] and ended[b] < placed[c]  # the chain, in order
    go.unlink()


def test_queue_estimates_array_tasks_held_by_their_limit_and_their_dependents(
    served: Served, tmp_path: Path
) -> None:
    """N11 of the re-test of issue 23: `submit -a 0-2%1 -t 1`, `submit -d afterok:<array> -t 1`:
    `queue` said "unknown" for the tasks the `%1` holds and for the dependent, though every
    task has a one-minute limit. Task k starts when task k-1 reaches its limit; the dependent
    when the array's last task does."""
    go = Path(os_user().pw_dir) / f"go-{tmp_path.name}"
    go.unlink(missing_ok=True)
    wait = f"while [ ! -e {go} ]; do sleep 0.2; done"
    first = served.submit("--array=0-2%1", "-t", "1", "--", "sh", "-c", wait)
    dep = served.submit(f"--dependency=afterok:{first}", "-t", "1", "--", "true")
    try:
        row = served.wait("the first task runs", first, "running")
        began = row["started_at"]
        queued = {r["job_id"]: r for r in json.loads(served.cli(USER, "queue", "--json").stdout)}
        got = {j: queued[j]["estimated_start_at"] for j in (first + 1, first + 2, dep)}
        assert (queued[first + 1]["code"], queued[dep]["code"]) == (
            "WAIT_ARRAY_LIMIT", "WAIT_DEPENDENCY"
        )  # fmt: skip
        assert None not in got.values(), got
        # from the running task's start (the estimate counts from the run's recorded start)
        assert abs(got[first + 1] - (began + 60)) < 1, (got, began)
        assert abs(got[first + 2] - (began + 120)) < 1, (got, began)
        assert abs(got[dep] - (began + 180)) < 1, (got, began)
        text = served.cli(USER, "queue").stdout
        assert "unknown" not in text, text
        for job in (first + 2, dep):  # explain says what queue says
            told = json.loads(served.cli(USER, "explain", str(job), "--json").stdout)
            assert told["estimated_start_at"] == got[job], (told, got)
    finally:
        go.touch()
    for job in (first, first + 1, first + 2, dep):
        served.wait("everything ends", job, "finished", 120)


@pytest.mark.parametrize(
    ("given", "want_s"),
    [
        ("90", 5400), ("5:30", 330), ("1:00:00", 3600), ("2-12", 216000), ("2-12:30", 217800),
        ("2-12:30:15", 217815), ("90s", 90), ("2h", 7200),
    ],
)  # fmt: skip
def test_time_takes_every_slurm_form(tmp_path: Path, given: str, want_s: int) -> None:
    home = ledger_home(tmp_path)
    cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "-t", given, "--", "true",
        GPULEDGER_USER=USER)  # fmt: skip
    (row,) = json.loads(cli(home, "jobs", "--json", GPULEDGER_USER="root").stdout)
    assert row["time_limit_s"] == want_s
    assert row["min_runtime_s"] == min(want_s, 8 * 3600)  # a contract never outlives the limit


def test_a_batch_script_runs_through_its_interpreter_as_sbatch_runs_it(
    served: Served, tmp_path: Path
) -> None:
    """`submit train.sh first`: a script without the execute bit (sbatch needs none) runs
    through its #! line's interpreter, as its owner, with its arguments, its #SBATCH options
    and the name sbatch would give it."""
    pw = os_user()
    script = Path(pw.pw_dir) / f"train-{tmp_path.name}.sh"
    out = Path(pw.pw_dir) / f"ran-{tmp_path.name}"
    script.write_text(f'#!/bin/sh\n#SBATCH -t 5\necho "$0 $1 $(id -u)" > {out}\n')
    os.chown(script, pw.pw_uid, pw.pw_gid)
    script.chmod(0o644)
    try:
        job = served.submit(str(script), "first")
        row = served.wait("the script runs", job, "finished")
        assert (row["finish_reason"], row["time_limit_s"], row["job_name"]) == (
            "completed", 300, script.name
        )  # fmt: skip
        assert row["command"] == ["/bin/sh", str(script), "first"]
        assert out.read_text().split() == [str(script), "first", str(pw.pw_uid)]
        assert out.stat().st_uid == pw.pw_uid
    finally:
        script.unlink()
        out.unlink(missing_ok=True)


def test_a_shell_with_exported_functions_submits_and_its_world_is_recorded(
    tmp_path: Path,
) -> None:
    """A researcher's shell under environment modules exports `BASH_FUNC_module%%`: `--export`
    ALL leaves it out with a note (it is no variable name), sends the rest, never a secret."""
    home = ledger_home(tmp_path)
    proj = tmp_path / "proj"
    proj.mkdir()
    funcs = {"BASH_FUNC_module%%": "() {  eval $($LMOD_CMD bash $*)\n}"}
    secrets = {"HF_TOKEN": "hf_x", "OPENAI_KEY": "sk-LEAK1", "GITHUB_PAT": "ghp_LEAK2",
               "WANDB_KEY": "wbLEAK3", "SSHPASS": "sshLEAK4",
               "DATABASE_URL": "postgres://u:dbpassLEAK5@h/db",
               "SSH_PRIVATE": "-----BEGIN OPENSSH PRIVATE KEY-----\nLEAK6"}  # fmt: skip
    proc = cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "-J", "train", "--", "python",
               "train.py", cwd=proj, GPULEDGER_USER=USER, MY_VAR="7", **secrets,
               **funcs)  # fmt: skip
    assert "left out 1 variable(s)" in proc.stderr and "BASH_FUNC_module%%" in proc.stderr
    # F11: the secrets ALL left out are named (never their values)
    (note,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("note: not sent")]
    assert all(name in note for name in secrets) and "LEAK" not in proc.stderr, note
    log = json.loads(cli(home, "log", "--json", GPULEDGER_USER="root").stdout)
    (sub,) = [r["event"] for r in log if r["event"] and r["event"]["type"] == "job.submitted.v2"]
    assert sub["env"]["MY_VAR"] == "7" and "BASH_FUNC_module%%" not in sub["env"]
    # F10: none of them is in the log a manager or an admin reads
    assert "HF_TOKEN" not in sub["env"] and "hf_x" not in json.dumps(log)
    assert "LEAK" not in json.dumps(log) and not set(secrets) & set(sub["env"])
    # F12: a secret named on its own is one error, and nothing is appended
    for export in ("--export=MY_API_TOKEN", "--export=ALL,OPENAI_KEY=inline"):
        bad = cli(home, "submit", "-A", "ai2/olmo", "-G", "1", export, "--", "true", ok=False,
                  cwd=proj, GPULEDGER_USER=USER, MY_API_TOKEN="t")  # fmt: skip
        _one_line_refusal(bad, "is not sent to jobs: its name is one that holds secrets")
    after = json.loads(cli(home, "log", "--json", GPULEDGER_USER="root").stdout)
    assert len(after) == len(log)
    assert (sub["workdir"], sub["job_name"], sub["stdout"]) == (
        str(proj), "train", "gpuledger-%j.out"
    )  # fmt: skip


def test_at_shows_the_ledger_as_it_was_or_is_refused(tmp_path: Path) -> None:
    """`jobs --at T`: jobs submitted after T do not exist, the others are as they were at T;
    the live reads (queue, explain, squatters) refuse a T before the last event, with one
    line, and preview a T after it."""
    home = ledger_home(tmp_path)
    run = ("--", "true")
    cli(home, "submit", "-A", "ai2/olmo", "-G", "1", *run, GPULEDGER_USER=USER)
    log = json.loads(cli(home, "log", "--json", GPULEDGER_USER="root").stdout)
    first_at = log[-1]["at"]
    cli(home, "cancel", "1", GPULEDGER_USER=USER)
    cli(home, "submit", "-A", "ai2/olmo", "-G", "1", *run, GPULEDGER_USER=USER)

    def jobs(*args: str) -> dict[int, dict[str, Any]]:
        out = cli(home, "jobs", "--json", *args, GPULEDGER_USER="root").stdout
        return {r["job_id"]: r for r in json.loads(out)}

    now = jobs()
    assert (now[1]["status"], now[2]["status"]) == ("finished", "pending")
    then = jobs("--at", str(first_at))
    assert list(then) == [1] and then[1]["status"] == "pending"  # not yet cancelled
    assert then[1]["finish_reason"] is None
    assert list(jobs("--at", str(first_at), "--status", "finished")) == []
    assert list(jobs("--at", str(first_at - 3600))) == []  # before anything was submitted
    for read in (["queue"], ["explain", "1"], ["squatters"]):
        proc = cli(home, *read, "--at", str(first_at), ok=False, GPULEDGER_USER="root")
        _one_line_refusal(proc, "the ledger has moved since")
    # F13: a moment in the future is refused (limits and later placements are not simulated)
    reads = [["jobs"], ["queue"], ["explain", "1"], ["squatters"], ["priority"], ["shares"],
             ["usage"], ["report", "delivered"]]  # fmt: skip
    for read in reads:
        proc = cli(home, *read, "--at", "2100-01-01T00:00:00", ok=False, GPULEDGER_USER="root")
        _one_line_refusal(proc, "that is in the future")


def test_serve_without_an_executor_places_nothing_and_says_so(tmp_path: Path) -> None:
    home = ledger_home(tmp_path)
    server = start_server(home, "--executor", "none", "--interval", "0.2s")
    try:
        token = make_token(home, "--user", USER)
        env = {"GPULEDGER_URL": server.url, "GPULEDGER_TOKEN": token}
        cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--", "true", **env)

        def cycles() -> int:
            code, body = server.request("GET", "/v1/health")
            assert code == 200 and body["executor"] == "none" and body["placing"] is False
            return int(body["cycles"])

        wait_for("ten cycles", lambda: cycles() >= 10, 60, lambda: server.log_path.read_text())

        def projected() -> bool:
            code, body = server.request("GET", "/v1/health")
            return code == 200 and body["projection_position"] == body["head"]

        # the projection (usage, queue, reports) still follows the log
        wait_for("the projection to fold the submit", projected, 30, server.log_path.read_text)
        (row,) = json.loads(cli(home, "jobs", "--json", **env).stdout)
        assert row["status"] == "pending" and row["placements"] == 0
        status = cli(home, "status", **env).stdout
        assert "executor      none: nothing is placed, jobs wait" in status
        assert "jobs run as   no job runs here" in status
    finally:
        assert server.stop() == 0


def test_a_date_on_the_jobs_path_does_not_move_its_recorded_end(served: Served) -> None:
    """F4: the end time is the supervisor's own clock. A `date` in the job's PATH that answers
    an early time (a user's ~/bin, a conda env) changes nothing: the job ran 3 s, it is charged
    at least that."""
    pw = os_user()
    fake = Path(pw.pw_dir) / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "date").write_text("#!/bin/sh\necho 1000000000.5\n")
    (fake / "date").chmod(0o755)
    try:
        job = served.submit(
            "-D", pw.pw_dir, f"--export=ALL,PATH={fake}:/usr/bin:/bin", "--", "sh", "-c",
            "sleep 3",
        )  # fmt: skip
        row = served.wait("the job ends", job, "finished")
        assert row["finish_reason"] == "completed", row
        # a forged end would be clamped to the placement (finished before it started)
        assert row["finished_at"] - row["placed_at"] >= 2.9, row
        assert row["finished_at"] - row["started_at"] >= 1.5, row
    finally:
        shutil.rmtree(fake, ignore_errors=True)


def test_a_launch_that_fails_before_its_command_runs_never_started(served: Served) -> None:
    """N7 of the re-test of issue 23 (the Slurm twin is in test_slurm_world.py): a job whose
    output file its user cannot write, or whose working directory it cannot enter, ends
    `launch_failed` with why and no start (it never ran): not `started` then ended before it."""
    closed = served.home.parent / "closed"  # root's, 0700: the job's user may not enter it
    closed.mkdir(mode=0o700)
    marker = closed / "ran"
    no_out = served.submit("-D", "/tmp", "-o", f"{closed}/out-%j.out", "--", "touch", str(marker))
    no_dir = served.submit("-D", str(closed), "--", "touch", str(marker))
    for job, why in [(no_out, f"cannot open the output file {closed}/out-{no_out}.out"),
                     (no_dir, f"cannot enter the working directory {closed}")]:  # fmt: skip
        row = served.wait("the launch fails", job, "finished")
        assert (row["finish_reason"], row["started_at"], row["exit_code"]) == (
            "launch_failed", None, None,
        ), row  # fmt: skip
        assert why in row["finish_note"], row
        said = served.cli("root", "explain", str(job)).stdout
        assert "started. Output" not in said and "could not be started" in said, said
        assert not [e for e in served.events() if e["type"].startswith("job.started")
                    and e["job_id"] == job]  # fmt: skip
    assert not marker.exists()


def test_output_files_take_the_submitters_umask_and_one_another_account_planted_is_refused(
    served: Served,
) -> None:
    """atk23c F3/F4: in a directory every account may write (1777), a job's default output file
    is made by the user with the umask it was submitted under (0027 here, the service's
    differs), which the job runs with too, as sbatch does (before: 0600 and the service's
    umask); a file or a symbolic link another account planted at the output's name is never
    appended to or followed: the launch fails with why, the planted file is left as it was."""
    shared = Path(tempfile.mkdtemp(prefix="gl23-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        nobody = pwd.getpwnam("nobody")
        assert own_umask() != 0o027  # the service's (the test's) umask is another one
        before = os.umask(0o027)  # the submitter's shell
        try:
            first = served.submit("-D", str(shared), "--", "sh", "-c", "echo hi; umask; : >mine")
        finally:
            os.umask(before)
        row = served.wait("the job ends", first, "finished")
        assert row["finish_reason"] == "completed", row
        out = shared / f"gpuledger-{first}.out"
        st = out.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (pwd.getpwnam(USER).pw_uid, 0o640)
        assert out.read_text().split() == ["hi", "0027"]
        assert (shared / "mine").stat().st_mode & 0o777 == 0o640
        # another account plants the next job's default file, and a link at a chosen name
        planted = shared / f"gpuledger-{first + 1}.out"
        planted.touch(mode=0o666)
        planted.chmod(0o666)
        os.chown(planted, nobody.pw_uid, nobody.pw_gid)
        link = shared / "link.out"
        link.symlink_to(pwd.getpwnam(USER).pw_dir + "/.profile")
        os.lchown(link, nobody.pw_uid, nobody.pw_gid)
        second = served.submit("-D", str(shared), "--", "sh", "-c", "echo leaked")
        third = served.submit("-D", str(shared), "-o", "link.out", "--", "sh", "-c", "echo leaked")
        assert second == first + 1
        for job, name in [(second, planted.name), (third, "link.out")]:
            row = served.wait("the launch fails", job, "finished")
            assert (row["finish_reason"], row["started_at"]) == ("launch_failed", None), row
            assert f"{name} exists and belongs to another user" in row["finish_note"], row
        assert planted.read_text() == "" and "leaked" not in Path(link.readlink()).read_text()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_relative_output_needs_a_working_directory(served: Served) -> None:
    """atk23c F10: `-o` relative to nothing (a raw API call with no working directory) is
    refused in one line and nothing is appended, on every engine alike."""
    head = served.server.head()
    code, body = served.server.request(
        "POST", "/v1/commands/submit",
        {"actor": "", "account": "ai2/olmo", "gpus": 1, "command": ["true"],
         "stdout": "../../tmp/rel-%j.log"},
        served.tokens[USER],
    )  # fmt: skip
    assert code == 400 and "is relative and the job has no working directory" in json.dumps(body)
    assert served.server.head() == head


def test_a_dry_run_refuses_what_the_apply_would(served: Served, tmp_path: Path) -> None:
    """atk23c F8: a manager's `budget apply --dry-run` that adds a system account is refused
    as the apply is (it used to print the plan as fine)."""
    plan = tmp_path / "mgr.toml"
    plan.write_text(BUDGET.replace(f'"{USER}", "ghost"', f'"{USER}", "ghost", "root"'))
    head = served.server.head()
    for extra in (["--dry-run"], []):
        proc = served.cli("mgr", "budget", "apply", str(plan), *extra, ok=False)
        assert proc.returncode == 1 and "may not add 'root': it is a system account" in (
            proc.stderr
        ), proc.stderr
    assert served.server.head() == head


def test_a_cancelled_jobs_gpus_show_stopping_not_free_until_its_processes_end(
    served: Served,
) -> None:
    """`node list` showed a cancelled job's GPUs free during its grace, though nothing starts
    on them until its processes are gone (`serve --executor local`; the node agents and Slurm
    alike): they are `stopping`, then free once it has ended."""
    stubborn = "trap '' TERM; while :; do sleep 0.2; done"
    # A grace long enough that three `node list` calls of a loaded machine fit in it (4 s did not)
    job = served.submit("--grace", "12s", "--", "sh", "-c", stubborn)
    row = served.wait("the job runs", job, "running")
    (slot,) = row["slots"]

    def node() -> dict[str, Any]:
        rows = json.loads(served.cli("root", "node", "list", "--json").stdout)
        return next(n for n in rows if n["node"] == slot["node"])

    before = node()["free_gpus"]
    served.cli(USER, "cancel", str(job))
    shown = lambda: node()["stopping_gpus"] == slot["gpu_indices"]  # noqa: E731
    wait_for("its GPU shown stopping", shown, 30, served.why)
    assert node()["free_gpus"] == before
    assert "stopping" in served.cli("root", "node", "list").stdout
    wait_for("its GPU free", lambda: node()["free_gpus"] == before + 1, 30, served.why)
    assert node()["stopping_gpus"] == []


def test_a_named_pipe_or_directory_planted_at_the_output_is_refused_never_waited_on(
    served: Served,
) -> None:
    """atk37-23 F1: in a directory both may write, another account's named pipe at the next
    job's default output name (nobody reading it) kept the job `placed` for ever with its GPU
    held, its leader blocked in open(2); once the planter read the pipe, it got the job's
    output. A pipe someone reads, and a directory, at a name a job asks for likewise. Now each
    launch fails at once with one line, and nothing is ever written to the pipe."""
    shared = Path(tempfile.mkdtemp(prefix="gl23-fifo-", dir="/tmp"))
    reader = -1
    try:
        shared.chmod(0o1777)
        nobody = pwd.getpwnam("nobody")
        first = served.submit("-D", str(shared), "--", "true")
        served.wait("the first job ends", first, "finished")
        silent = shared / f"gpuledger-{first + 1}.out"  # nobody reads it
        read = shared / "read.out"  # the planter reads this one
        for pipe in (silent, read):
            os.mkfifo(pipe, 0o622)
            os.chown(pipe, nobody.pw_uid, nobody.pw_gid)
            pipe.chmod(0o622)
        reader = os.open(read, os.O_RDONLY | os.O_NONBLOCK)
        (shared / "dir.out").mkdir()
        secret = ["sh", "-c", "echo SECRET-of-alice"]
        second = served.submit("-D", str(shared), "--", *secret)
        third = served.submit("-D", str(shared), "-o", "read.out", "--", *secret)
        fourth = served.submit("-D", str(shared), "-o", "dir.out", "--", *secret)
        assert second == first + 1
        pipe, folder = "exists and is a named pipe", "exists and is a directory"
        wants = [(second, f"{silent} {pipe}"), (third, f"{read} {pipe}"),
                 (fourth, f"{shared / 'dir.out'} {folder}")]  # fmt: skip
        for job, why in wants:
            row = served.wait("the launch fails", job, "finished", timeout=30)
            assert (row["finish_reason"], row["started_at"]) == ("launch_failed", None), row
            note = row["finish_note"]
            assert f"the output file {why}" in note and "\n" not in note, row
        try:  # nothing was written to the pipe someone reads (b"": no writer, none wrote)
            got = os.read(reader, 4096)
        except BlockingIOError:  # a writer holds it open and wrote nothing
            got = b""
        assert got == b""
    finally:
        if reader >= 0:
            os.close(reader)
        shutil.rmtree(shared, ignore_errors=True)


SWAPPER = r"""import ctypes, os, struct, sys
top, steal = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
assert fd >= 0 and libc.inotify_add_watch(fd, top.encode(), 0x100) >= 0  # IN_CREATE
print("ready", flush=True)
while True:
    buf, i = os.read(fd, 65536), 0
    while i < len(buf):
        _, _, _, size = struct.unpack_from("iIII", buf, i)
        name = buf[i + 16:i + 16 + size].rstrip(b"\0").decode()
        i += 16 + size
        path = os.path.join(top, name)
        try:
            if name.startswith("race-") and os.lstat(path).st_uid != os.getuid():
                os.rename(path, path + ".moved")
                os.symlink(steal, path)
        except OSError:
            pass
"""
"""Another account's swapper (atk37-23 F5): each `race-*` file the job's user makes in the
shared directory is renamed away the moment it appears (inotify) and a link to the swapper's
own file put in its place."""


def test_an_output_swapped_for_a_link_once_made_never_sends_the_job_there(
    served: Served, tmp_path: Path
) -> None:
    """atk37-23 F5: the leader made the output file, checked it, then opened it again by name:
    in a group-writable directory without the sticky bit another account swapped it for a link
    in between and read the job's output (3 jobs of 12). Now the file is opened once, as the
    user, and that descriptor is the job's stdout: a swap moves the name, never the output,
    which stays in the user's own file (renamed), and the job runs as it would have."""
    shared = Path(tempfile.mkdtemp(prefix="gl23-race-", dir="/tmp"))
    nobody = pwd.getpwnam("nobody")
    theirs = Path(tempfile.mkdtemp(prefix="gl23-theirs-", dir="/tmp"))
    swapper: subprocess.Popen[str] | None = None
    try:
        shared.chmod(0o777)  # writable by all, no sticky bit: a name can be renamed by anyone
        theirs.chmod(0o755)
        os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
        steal = theirs / "steal.txt"
        steal.touch(mode=0o666)
        os.chown(steal, nobody.pw_uid, nobody.pw_gid)
        steal.chmod(0o666)
        script = theirs / "swap.py"
        script.write_text(SWAPPER)
        script.chmod(0o644)
        swapper = subprocess.Popen(  # real-time: it wakes the moment a name is made
            ["chrt", "-f", "50", "setpriv", f"--reuid={nobody.pw_uid}",
             f"--regid={nobody.pw_gid}", "--clear-groups", "/usr/bin/python3", str(script),
             str(shared), str(steal)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert swapper.stdout is not None and swapper.stdout.readline() == "ready\n"
        say = ["sh", "-c", "echo PRIVATE-$GPULEDGER_JOB_ID"]
        jobs = [served.submit("-D", str(shared), "-o", "race-%j.out", "--", *say) for _ in range(4)]
        alice = pwd.getpwnam(USER).pw_uid
        for job in jobs:
            row = served.wait("the job ends", job, "finished")
            assert row["finish_reason"] == "completed", row
            moved = shared / f"race-{job}.out.moved"  # the swapper got to every one
            assert (shared / f"race-{job}.out").is_symlink(), row
            assert moved.stat().st_uid == alice and moved.read_text() == f"PRIVATE-{job}\n"
        assert steal.read_text() == ""
    finally:
        if swapper is not None:
            swapper.kill()
            swapper.communicate()
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(theirs, ignore_errors=True)


def test_a_directory_of_another_account_on_the_path_is_warned_of_then_refused_at_launch(
    served: Served,
) -> None:
    """atk40-23 F5: a 0755 directory of another account's on the job's path (its owner may
    rename in it: her `exp` swapped for a directory of its own) was accepted. `submit` warns of
    it in one line and records the job (the job's node may see another filesystem); the
    launch refuses it with one line, `launch_failed`, never started. The same tree, root's,
    runs with no warning."""
    nobody = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="gl23-owner-", dir="/tmp"))
    try:
        top.chmod(0o755)
        theirs = top / "theirs"
        (theirs / "exp").mkdir(parents=True)
        (theirs / "exp").chmod(0o777)  # root's (the test's CLI runs as root), hers to write
        os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
        ran = theirs / "exp" / "ran"
        args = ("submit", "-A", "ai2/olmo", "-G", "1", "--json", "-D", str(theirs / "exp"),
                "--", "touch", "ran")  # fmt: skip
        said = served.cli(USER, *args)
        warned = [ln for ln in said.stderr.splitlines() if ln.startswith("warning: ")]
        why = f"is reached through {theirs}, which belongs to another account (uid {nobody.pw_uid}"
        assert len(warned) == 1 and why in warned[0], said.stderr
        job = int(json.loads(said.stdout)["job_id"])
        row = served.wait("the launch fails", job, "finished")
        assert (row["finish_reason"], row["started_at"], row["exit_code"]) == (
            "launch_failed", None, None,
        ), row  # fmt: skip
        assert why in row["finish_note"] and "\n" not in row["finish_note"], row
        assert not ran.exists()
        os.chown(theirs, 0, 0)
        said = served.cli(USER, *args)
        assert "warning" not in said.stderr, said.stderr
        row = served.wait("the job runs", int(json.loads(said.stdout)["job_id"]), "finished")
        assert row["finish_reason"] == "completed" and ran.exists(), row
    finally:
        shutil.rmtree(top, ignore_errors=True)
