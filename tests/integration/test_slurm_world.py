"""A researcher's job on the Slurm executor behaves as it would under sbatch (issue 23): a real
Slurm cluster, `gpuledger up --executor slurm` as a process, real non-root OS users the test
creates. The job starts where it was submitted, with the submitted environment and never the
service's, as its user with the user's groups, writing its output as that user; an exit while
the service is down is charged to Slurm's end; a limit in seconds is kept to the second, after
a restart of the service too."""

from __future__ import annotations

import json
import os
import pwd
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

from ledger.engines.accounts import own_umask
from tests.integration import test_slurm as base
from tests.integration.test_slurm import GPULEDGER, Ledger, status
from tests.integration.userkit import User, os_user, shared_dir

ROOT = Path(__file__).resolve().parents[2]

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures

SCRIPT = """#!/bin/sh
echo "pwd=$(pwd)"
echo "input=$(cat ./input.txt)"
echo "MY_VAR=$MY_VAR FOO=$FOO"
echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
echo "HOME=$HOME USER=$USER LOGNAME=$LOGNAME SHELL=$SHELL"
echo "SVC=$SERVICE_DB_PASSWORD TOK=$GPULEDGER_TOKEN ONLY=$SERVICE_ONLY"
echo "ARRAY=$SLURM_ARRAY_JOB_ID/$SLURM_ARRAY_TASK_ID"
echo "GL=$GPULEDGER_ARRAY_JOB_ID/$GPULEDGER_ARRAY_TASK_ID"
echo "SUBMIT_DIR=$SLURM_SUBMIT_DIR"
echo "UMASK=$(umask)"
"""


def submit_as(led: Ledger, user: User, where: Path, *args: str, **env: str) -> list[int]:
    """`gpuledger submit` run from `where` for `user`, with `env` in the submitter's shell."""
    done = subprocess.run(
        [GPULEDGER, "submit", "-A", "ai2/olmo", "-G", "1", "--json", *args],
        env=led.env(user.name) | env, cwd=where, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    return [int(j["job_id"]) for j in (got if isinstance(got, list) else [got])]


def lines(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        for word in line.split(" "):
            k, eq, v = word.partition("=")
            if eq and k not in out:
                out[k] = v
        key, _, rest = line.partition("=")
        out.setdefault(f"line:{key}", rest)
    return out


def test_a_script_in_a_users_home_runs_there_as_the_user_with_its_world_not_the_services(
    ledger: Ledger,
) -> None:
    """F1, F2, F8 and the issue's first test, on Slurm: a script in a real user's home that reads
    ./input.txt and $MY_VAR, submitted from that directory: it runs there, as that uid with its
    primary and supplementary groups, with HOME/USER/LOGNAME/SHELL of the user, none of the
    service's variables (its secrets, HOME, PATH), and writes gpuledger-<id>.out owned by the
    user, made with the umask the job was submitted under (and runs with);
    `--export=NONE,FOO=1` and `-o` patterns are honoured; an array task gets SLURM_ARRAY_*;
    a job with no working directory writes to the service's directory, which nobody else may
    write."""
    with os_user("glsw", groups=1) as user:
        ledger.cli("member", "add", user.name, "ai2/olmo")
        proj = user.home / "proj"
        proj.mkdir()
        (proj / "input.txt").write_text("from the input\n")
        (proj / "train.sh").write_text(SCRIPT)
        for p in (proj, proj / "input.txt", proj / "train.sh"):
            os.chown(p, user.uid, user.gid)
        jobs_dir = ledger.home / "jobs"  # as an older version left it: world-writable
        jobs_dir.mkdir(parents=True)
        jobs_dir.chmod(0o1777)
        ledger.up(run_as="submitter", SERVICE_DB_PASSWORD="hunter2", SERVICE_ONLY="svc-only")
        before = os.umask(0o027)  # the submitter's shell's (the service has another one)
        try:
            (plain,) = submit_as(ledger, user, proj, "train.sh", MY_VAR="hello")
        finally:
            os.umask(before)
        (named,) = submit_as(ledger, user, proj, "-J", "sj", "-o", "%x-%j-%u.out",
                             "--export=NONE,FOO=1", "train.sh")  # fmt: skip
        array = submit_as(ledger, user, proj, "--array=0-1", "-o", "arr-%A_%a.out", "train.sh")
        every = [plain, named, *array]
        ledger.wait("every job to end", lambda: all(status(ledger, j) == "finished" for j in every))
        rows = ledger.jobs()
        assert [rows[j]["finish_reason"] for j in every] == ["completed"] * 4, rows
        out = proj / f"gpuledger-{plain}.out"
        got = lines(out)
        st = out.stat()
        assert (st.st_uid, st.st_gid) == (user.uid, user.gid)  # created as the user
        # made with the umask it was submitted under, which the job runs with, as sbatch does
        # (before: 0600 and the service's umask)
        assert (st.st_mode & 0o777, got["UMASK"]) == (0o640, "0027")
        assert own_umask() != 0o027
        assert got["pwd"] == str(proj) and got["line:input"] == "from the input"
        assert got["SUBMIT_DIR"] == str(proj)  # N8: not the service's cwd
        assert got["MY_VAR"] == "hello"
        assert (int(got["uid"]), int(got["gid"])) == (user.uid, user.gid)  # F1: not gid 0
        assert set(map(int, got["line:uid"].split("groups=")[1].split())) == user.gids
        assert (got["HOME"], got["USER"], got["LOGNAME"]) == (str(user.home), user.name, user.name)
        assert got["SHELL"] == "/bin/sh"
        assert (got["SVC"], got["TOK"], got["ONLY"]) == ("", "", "")  # nothing of the service's
        # --export=NONE,FOO=1 and the -o pattern
        named_out = proj / f"sj-{named}-{user.name}.out"
        assert named_out.stat().st_mode & 0o777 == 0o666 & ~own_umask()  # its submitter's
        got = lines(named_out)
        assert (got["MY_VAR"], got["FOO"], got["pwd"]) == ("", "1", str(proj))
        # an array task: its ids as Slurm names them
        for task in range(len(array)):
            got = lines(proj / f"arr-{array[0]}_{task}.out")
            assert got["ARRAY"] == f"{array[0]}/{task}", got
            assert got["GL"] == f"{array[0]}/{task}", got
        # F8: the service's own output directory is nobody else's to write
        assert jobs_dir.stat().st_mode & 0o777 == 0o755
        ledger.stop()


def _soft_limits(text: str) -> dict[str, str]:
    """`/proc/PID/limits` -> limit name -> its soft value."""
    rows = (line for line in text.splitlines()[1:] if line[26:].split())
    return {line[:26].strip(): line[26:].split()[0] for line in rows}


def test_propagate_none_gives_the_job_the_nodes_limits_as_sbatch_not_the_services(
    ledger: Ledger,
) -> None:
    """atk47-s F6: `submit --propagate=NONE` records no limit of the submitter's, and sbatch then
    ran without `--propagate=NONE`: the job got the service's soft limits (core 0, its open
    files 1,024), where `sbatch --propagate=NONE` gives slurmd's. Now its soft limits are the
    ones a plain `sbatch --propagate=NONE` job gets on the node, read from /proc by each job."""
    seen, ref = ledger.work / "limits", ledger.work / "sbatch-limits"
    ledger.up(files=(777, 4096))  # a service whose own soft open-files limit no node has
    ledger.wait("the service", lambda: "open files: 4096" in ledger.service_log())
    ledger.submit("alice", 1, f"cat /proc/$$/limits > {seen}", "--propagate=NONE")
    c = ledger.cluster
    c.run("sbatch", "-p", f"{c.partition}-shared", "--propagate=NONE", "-o", "/dev/null",
          "--wrap", f"cat /proc/$$/limits > {ref}")  # fmt: skip
    full = lambda p: p.exists() and "Max open files" in p.read_text()  # noqa: E731
    ledger.wait("both jobs' limits", lambda: full(seen) and full(ref))
    got, want = _soft_limits(seen.read_text()), _soft_limits(ref.read_text())
    assert got["Max open files"] != "777", got
    assert got == want, (got, want)


def test_a_job_starts_with_its_submitters_soft_limits_as_sbatch_propagates_them(
    ledger: Ledger,
) -> None:
    """atk46-23 F12 on Slurm: under `ulimit -Sn 512; ulimit -Ss 4096; ulimit -Su 300` a job got
    the service's limits (nofile 20000, stack 8192), where sbatch gives it the submitting
    shell's. Its process now starts with them, as its user, the hard limits the node's."""
    with os_user("glsl") as user:
        ledger.cli("member", "add", user.name, "ai2/olmo")
        ledger.up(run_as="submitter")
        soft = {resource.RLIMIT_NOFILE: 512, resource.RLIMIT_STACK: 4096 * 1024,
                resource.RLIMIT_NPROC: 300}  # fmt: skip

        def lowered() -> None:  # the submitting shell's `ulimit -S ...`
            for number, value in soft.items():
                resource.setrlimit(number, (value, resource.getrlimit(number)[1]))

        done = subprocess.run(
            [GPULEDGER, "submit", "-A", "ai2/olmo", "-G", "1", "--json", "--", "sh", "-c",
             "cat /proc/$$/limits"],
            env=ledger.env(user.name), cwd=user.home, capture_output=True, text=True,
            timeout=120, preexec_fn=lowered,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        job = int(json.loads(done.stdout)["job_id"])
        ledger.wait("the job to end", lambda: status(ledger, job) == "finished")
        assert ledger.jobs()[job]["finish_reason"] == "completed"
        text = (user.home / f"gpuledger-{job}.out").read_text()
        got = {line[:26].strip(): line[26:].split()[:2] for line in text.splitlines()[1:]}
        assert got["Max open files"][0] == "512", text
        assert got["Max stack size"][0] == str(4096 * 1024), text
        assert got["Max processes"][0] == "300", text
        ledger.stop()


def test_an_exit_while_the_service_is_down_is_charged_to_slurms_end(ledger: Ledger) -> None:
    """F6 and the issue's test on Slurm: the job ends while `up` is killed with -9; the next
    `up` records the end Slurm kept (EndTime), within 1 s of the job's own clock, not the
    restart."""
    ledger.up()
    end, go = ledger.work / "ended-at", ledger.work / "go"
    ledger.submit("alice", 1, f"while [ ! -e {go} ]; do sleep 0.2; done; sleep 1; "
                  f"date +%s.%N > {end}; exit 4")  # fmt: skip
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
    ledger.kill9()
    go.touch()  # it ends while the service is down, whatever the load
    deadline = time.monotonic() + 60
    while not end.exists() or not end.read_text().strip():
        assert time.monotonic() < deadline, "the job did not end while the service was down"
        time.sleep(0.2)
    time.sleep(6)  # the service stays down well past the end
    restarted = time.time()
    ledger.up()
    ledger.wait("the exit to be recorded", lambda: status(ledger, 1) == "finished")
    row = ledger.jobs()[1]
    really = float(end.read_text())
    assert (row["finish_reason"], row["exit_code"]) == ("failed", 4), row
    assert abs(row["finished_at"] - really) <= 1.0, (row["finished_at"], really)
    assert row["finished_at"] < restarted - 4


def test_slurms_own_timeout_while_the_service_is_down_ends_when_the_job_died(
    ledger: Ledger,
) -> None:
    """atk47-s F5: the service killed -9 while a `-t 30s` job that ignores SIGTERM runs: Slurm's
    backstop TIMEOUT ends it (its EndTime the decision), and its processes die `KillWait` (10 s)
    later. It was recorded ended at that EndTime, 9.4 s before its process died; now at its
    script's last heartbeat (every 2 s), never before the processes' last sign of life by more
    than a beat."""
    alive = ledger.work / "alive"
    ledger.up()
    ledger.submit("alice", 1, f"trap '' TERM; while true; do date +%s.%N >> {alive}; sleep 0.2; "
                  "done", "-t", "30s", "--grace", "2s")  # fmt: skip
    ledger.wait("the job to run", lambda: alive.exists() and status(ledger, 1) == "running")
    ledger.kill9()
    slurm_id = ledger.jobs()[1]["engine_job_id"]

    def state() -> str | None:  # None: squeue failed (slurmctld slow under load), no word
        done = subprocess.run(["squeue", "-h", "-j", str(slurm_id), "-o", "%T"],
                              env=ledger.cluster.env(), capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        return done.stdout.strip() if done.returncode == 0 else None

    deadline = time.monotonic() + 200  # Slurm's --time is 2 minutes, checked every ~30 s
    while state() not in ("", "COMPLETED", "TIMEOUT"):
        assert time.monotonic() < deadline, state()
        time.sleep(0.5)
    last = float(alive.read_text().split()[-1])
    ledger.up()
    ledger.wait("the end recorded", lambda: status(ledger, 1) == "finished")
    row = ledger.jobs()[1]
    # how the restarted service read it, should it be wrong (CI: `failed`, not reproduced alone)
    assert row["finish_reason"] == "time_limit", (row, ledger.service_log()[-4000:])
    assert last - 2.5 <= row["finished_at"] <= last + 2.5, (row["finished_at"], last)


def test_a_limit_in_seconds_is_kept_to_the_second_where_slurm_rounds_up(ledger: Ledger) -> None:
    """`-t 65s`: Slurm can only be asked for 2 minutes; the executor stops the job at 65 s
    itself, and it ends `time_limit`."""
    ledger.up()
    ledger.submit("alice", 1, "sleep 300", "-t", "65s")
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
    ledger.wait("the limit", lambda: status(ledger, 1) == "finished", timeout=110)
    row: dict[str, Any] = ledger.jobs()[1]
    assert row["finish_reason"] == "time_limit", row
    # Slurm's end is in whole seconds and the start as the ledger saw it: 65 s within 2 s, far
    # from the 120 s Slurm itself would allow
    assert 63 <= row["finished_at"] - row["started_at"] < 100, row


def test_a_limit_in_seconds_is_kept_after_the_service_restarts(ledger: Ledger) -> None:
    """atk33 F4: `-t 20s` (Slurm is asked for 1 minute); the service is stopped while the job
    runs and started again: the adopted run is still stopped at 20 s, not at Slurm's minute."""
    ledger.up()
    ledger.submit("alice", 1, "sleep 300", "-t", "20s")
    ledger.wait("the job to run", lambda: status(ledger, 1) == "running")
    ledger.stop()  # Slurm runs on without the service
    ledger.up()
    ledger.wait("the limit", lambda: status(ledger, 1) == "finished", timeout=90)
    row: dict[str, Any] = ledger.jobs()[1]
    assert row["finish_reason"] == "time_limit", row
    assert 18 <= row["finished_at"] - row["started_at"] < 45, row  # Slurm's own: 60 s


def test_slurms_own_note_reaches_the_error_file_of_a_job_stopped_at_its_limit(
    ledger: Ledger,
) -> None:
    """s43 task 1: slurmstepd opened /dev/null alone, so Slurm's own notes (its "*** JOB ...
    CANCELLED AT ..." when it kills the job, "DUE TO TIME LIMIT" for its own limit) reached no
    file. Its error file's directories are root's and no other account may replace a name in
    them (the sticky bit): `sbatch --error` names it, and a job that ignores SIGTERM, stopped at
    its limit, has Slurm's note there, after its own lines."""
    ledger.up()
    err = ledger.work / "e-1.err"
    ledger.submit("alice", 1, "trap '' TERM; echo began >&2; sleep 300", "-t", "5s",
                  "-e", str(ledger.work / "e-%j.err"))  # fmt: skip
    ledger.wait("the limit", lambda: status(ledger, 1) == "finished", timeout=90)
    assert ledger.jobs()[1]["finish_reason"] == "time_limit", ledger.jobs()[1]
    ledger.wait("Slurm's note", lambda: "CANCELLED AT" in err.read_text(), timeout=30)
    text = err.read_text()
    assert text.startswith("began\n"), text
    slurm_id = ledger.jobs()[1]["engine_job_id"]
    assert f"*** JOB {slurm_id} ON {ledger.cluster.node} CANCELLED AT" in text, text


def test_a_run_slurm_cannot_launch_is_launch_failed_and_never_started(ledger: Ledger) -> None:
    """N3 of the re-test of issue 23 (the node agents' twin is in test_sbatch_like.py): an
    output file the job's user cannot write made Slurm fail the launch (JobLaunchFailure,
    exit 0:53); the job was recorded `failed` with exit 181. It ends `launch_failed` with why
    and no exit code. (slurmstepd now opens /dev/null and the batch script the file, as the
    user: it cannot, leaves `cannot-open` and ends, atk38-23 F3.)"""
    with os_user("glsn", groups=0) as user:
        ledger.cli("member", "add", user.name, "ai2/olmo")
        closed = ledger.work / "closed-n3"  # root's, 0700
        closed.mkdir(mode=0o700)
        ledger.up(run_as="submitter")
        (job,) = submit_as(ledger, user, user.home, "-o", f"{closed}/o-%j.out", "--", "true")
        ledger.wait("the launch to fail", lambda: status(ledger, job) == "finished")
        row = ledger.jobs()[job]
        assert (row["finish_reason"], row["exit_code"]) == ("launch_failed", None), row
        assert row["finish_note"].startswith(f"cannot open the output file {closed}/o-{job}.out")
        # N3's rest: a read that saw Slurm's RUNNING before the failure no longer records a
        # start (the start waits for the batch script's mark, which a failed launch never makes)
        assert row["started_at"] is None, row
        assert ledger.of("job.started.v1", job) == [], ledger.of("job.started.v1", job)
        ledger.stop()


def test_a_working_directory_it_cannot_enter_is_launch_failed_with_why(ledger: Ledger) -> None:
    """Issue 23's note: its output elsewhere, a job whose working directory its user may not
    enter (root's, 0700), or which was removed after the submission (while the job waited on a
    dependency), never runs (Slurm would start it in /tmp): it was recorded `failed` with exit
    127 and a start. It ends `launch_failed`, no start, no exit code, and `explain` says why in
    one line, as on the node agents (test_sbatch_like.py)."""
    with os_user("glcd", groups=0) as user:
        ledger.cli("member", "add", user.name, "ai2/olmo")
        closed = ledger.work / "closed-cd"  # root's, 0700: the user may not enter it
        closed.mkdir(mode=0o700)
        gone, go, gone_too = user.home / "gone", user.home / "go", user.home / "gone too"
        for d in (gone, gone_too):
            d.mkdir()
            os.chown(d, user.uid, user.gid)
        ledger.up(run_as="submitter")
        out = ["-o", f"{user.home}/o-%j.out"]  # an output file the user can open
        (first,) = submit_as(ledger, user, user.home, "--", "sh", "-c",
                             f"while [ ! -e {go} ]; do sleep 0.2; done")  # fmt: skip
        (no_entry,) = submit_as(ledger, user, user.home, "-D", str(closed), *out, "--", "true")
        (removed,) = submit_as(ledger, user, gone, *out, f"--dependency=afterany:{first}",
                               "--", "true")  # fmt: skip
        # its output in the working directory too (the default, gpuledger-%j.out): the batch
        # script said only that it could not open it (s43: the directory is checked first)
        (removed_too,) = submit_as(ledger, user, gone_too, f"--dependency=afterany:{first}",
                                   "--", "true")  # fmt: skip
        gone.rmdir()  # after the submission, before its launch
        gone_too.rmdir()
        go.touch()
        ended = (no_entry, removed, removed_too)
        ledger.wait("all to end", lambda: all(status(ledger, j) == "finished" for j in ended))
        rows = ledger.jobs()
        node = ledger.cluster.node
        for job, where, how in [(no_entry, closed, "its user may not enter it"),
                                (removed, gone, "no such directory"),
                                (removed_too, gone_too, "no such directory")]:  # fmt: skip
            row = rows[job]
            assert (row["finish_reason"], row["exit_code"], row["started_at"]) == (
                "launch_failed", None, None,
            ), row  # fmt: skip
            why = f"cannot enter the working directory {where}: {how} on node {node}"
            assert row["finish_note"] == why, row
            assert ledger.of("job.started.v1", job) == []
            said = [ln for ln in ledger.cli("explain", str(job)).splitlines() if why in ln]
            assert len(said) == 1 and "could not be started" in said[0], said
        ledger.stop()


def test_a_command_that_cannot_be_started_is_launch_failed_with_why(ledger: Ledger) -> None:
    """atk33 F5: a command not in the job's PATH, or a path that is no executable file, was
    recorded `failed` with exit 127 and a start on Slurm (`launch_failed` on the node agents).
    It ends `launch_failed`, no start, no exit code, and `explain` says why in the node
    agents' words (tests/integration/test_true_records.py's twin)."""
    ledger.up()
    for cmd in ("no-such-cmd-gl", "./no-such-file-gl"):
        ledger.cli("submit", "-A", "ai2/olmo", "-G", "1", "--", cmd, actor="alice")
    ledger.wait("both to end", lambda: all(status(ledger, j) == "finished" for j in (1, 2)))
    rows = ledger.jobs()
    for job, why in [(1, "cannot start no-such-cmd-gl: not found in PATH"),
                     (2, "cannot start ./no-such-file-gl: no such executable file")]:  # fmt: skip
        row = rows[job]
        assert (row["finish_reason"], row["exit_code"], row["started_at"]) == (
            "launch_failed", None, None,
        ), row  # fmt: skip
        assert row["finish_note"] == why, row
        assert ledger.of("job.started.v1", job) == []
        said = [ln for ln in ledger.cli("explain", str(job)).splitlines() if why in ln]
        assert len(said) == 1 and "could not be started" in said[0], said


def test_an_output_file_another_account_planted_is_refused_not_appended_to(
    ledger: Ledger,
) -> None:
    """T19 (docs/security.md), as on the node agents (test_sbatch_like.py): in a directory
    every account may write (1777), another account plants the next job's default output file
    (0666) and a link at a name a job asks for: slurmstepd appended to the file (the planter
    read the job's output) and followed the link. Now the launch fails with why, nothing is
    written; the user's own job there gets its file made for it, with the umask it was
    submitted under."""
    with os_user("glpl", groups=0) as user, shared_dir("gl23-shared-") as top:
        ledger.cli("member", "add", user.name, "ai2/olmo")
        shared = top / "shared"
        shared.mkdir()
        shared.chmod(0o1777)
        nobody = pwd.getpwnam("nobody")
        ledger.up(run_as="submitter")
        (first,) = submit_as(ledger, user, shared, "--", "sh", "-c", "echo mine")
        ledger.wait("the first job to end", lambda: status(ledger, first) == "finished")
        assert ledger.jobs()[first]["finish_reason"] == "completed"
        own = shared / f"gpuledger-{first}.out"
        mode = 0o666 & ~own_umask()  # the submitter's umask (sbatch's rule)
        assert (own.stat().st_uid, own.stat().st_mode & 0o777) == (user.uid, mode)
        # nothing else: no "its command ended leaving 1 processes" (the open's watchdog's own
        # `sleep`, left at load before `script_files.WATCHDOG_TRAP`)
        assert own.read_text() == "mine\n"
        planted = shared / f"gpuledger-{first + 1}.out"
        planted.touch()
        planted.chmod(0o666)
        os.chown(planted, nobody.pw_uid, nobody.pw_gid)
        secret = user.home / "secret.txt"
        secret.write_text("")
        os.chown(secret, user.uid, user.gid)
        link = shared / "link.out"
        link.symlink_to(secret)
        os.lchown(link, nobody.pw_uid, nobody.pw_gid)
        (second,) = submit_as(ledger, user, shared, "--", "sh", "-c", "echo leaked")
        (third,) = submit_as(ledger, user, shared, "-o", "link.out", "--", "sh", "-c",
                             "echo leaked")  # fmt: skip
        assert second == first + 1
        ended = (second, third)
        ledger.wait("both to end", lambda: all(status(ledger, j) == "finished" for j in ended))
        rows = ledger.jobs()
        for job, name in [(second, planted), (third, link)]:
            row = rows[job]
            assert (row["finish_reason"], row["started_at"]) == ("launch_failed", None), row
            why = f"the output file {name} exists and belongs to another user"
            assert row["finish_note"] == why, row
            said = [ln for ln in ledger.cli("explain", str(job)).splitlines() if why in ln]
            assert len(said) == 1, said
        assert planted.read_text() == "" and secret.read_text() == ""
        ledger.stop()


def test_a_named_pipe_or_directory_planted_at_the_output_is_refused_before_sbatch(
    ledger: Ledger,
) -> None:
    """atk37-23 F1 on Slurm: the claim looked only at files and links, so another account's
    named pipe at the output's name went to sbatch: slurmstepd (as the job's user) blocked
    opening it, the job RUNNING in Slurm and `placed` in the ledger for ever, its GPUs held
    (a cancel left the node COMPLETING until the planter read the pipe, and got the output).
    Now it is refused before sbatch with one line, nothing written to it; /dev/null, which
    sbatch users name to throw output away, is still taken."""
    with os_user("glpl", groups=0) as user, shared_dir("gl23-fifo-") as top:
        ledger.cli("member", "add", user.name, "ai2/olmo")
        shared = top / "shared"
        shared.mkdir()
        shared.chmod(0o1777)
        nobody = pwd.getpwnam("nobody")
        ledger.up(run_as="submitter")
        pipe = shared / "s-1.out"
        os.mkfifo(pipe, 0o622)
        os.chown(pipe, nobody.pw_uid, nobody.pw_gid)
        pipe.chmod(0o622)
        (shared / "dir.out").mkdir()
        say = ["sh", "-c", "echo SLURM-SECRET"]
        (first,) = submit_as(ledger, user, shared, "-o", "s-%j.out", "--", *say)
        (second,) = submit_as(ledger, user, shared, "-o", "dir.out", "--", *say)
        (third,) = submit_as(ledger, user, shared, "-o", "/dev/null", "--", *say)
        assert first == 1
        ended = (first, second, third)
        ledger.wait("all three to end", lambda: all(status(ledger, j) == "finished" for j in ended))
        rows = ledger.jobs()
        for job, why in [(first, f"the output file {pipe} exists and is a named pipe, not a "
                                 "regular file"),
                         (second, f"the output file {shared / 'dir.out'} exists and is a "
                                  "directory, not a regular file")]:  # fmt: skip
            row = rows[job]
            assert (row["finish_reason"], row["started_at"]) == ("launch_failed", None), row
            assert row["finish_note"] == why, row
        assert rows[third]["finish_reason"] == "completed", rows[third]
        reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
        try:
            assert os.read(reader, 4096) == b""  # nobody ever opened it to write
        finally:
            os.close(reader)
        assert not ledger.cluster.run("squeue", "-h", "-o", "%i").strip()
        ledger.stop()


def slurm_start(led: Ledger, slurm_id: str) -> float:
    """Slurm's StartTime of a job, as `scontrol` shows it (whole seconds, local time)."""
    from ledger.engines.slurm.words import parse_jobs

    (job,) = parse_jobs(led.cluster.run("scontrol", "-o", "show", "job", slurm_id))
    assert job.start_time is not None, job
    return job.start_time


def test_a_runs_start_is_slurms_start_time_and_a_checkpoint_from_inside_is_recorded(
    ledger: Ledger,
) -> None:
    """N5 of the re-test of issue 23: the start was recorded 1-1.6 s after Slurm's StartTime
    (when the executor saw the run), so short runs were under-charged; it is StartTime, kept
    at or after the placement. N4's rest: `gpuledger checkpoint` inside a Slurm job found no
    ledger (no URL, no token); it says the checkpoint through its checkpoint file, from the
    job's side (`--export=NONE`: nothing of the submitter's ledger settings)."""
    with shared_dir() as top:  # the CLI a job's user can run (the checkout's .venv is root's)
        done = subprocess.run(
            [str(ROOT / "scripts" / "install-shared"), "--link", str(top / "gl")],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        ledger.up()
        said = ledger.work / "checkpoint-said"
        ledger.submit("alice", 1, f"sleep 1; {top}/gl/bin/gpuledger checkpoint > {said} 2>&1; "
                      f"echo rc=$? >> {said}; sleep 3", "--resumable", "--export=NONE")  # fmt: skip
        ledger.wait("the job to end", lambda: status(ledger, 1) == "finished", timeout=90)
    row = ledger.jobs()[1]
    assert row["finish_reason"] == "completed", row
    assert "rc=0" in said.read_text(), said.read_text()
    assert len(ledger.of("job.checkpointed.v1", 1)) == 1, said.read_text()
    (placed,) = ledger.of("job.placed.v1", 1)
    (seen,) = ledger.of("job.started.v1", 1)
    want = max(slurm_start(ledger, row["engine_job_id"]), placed["at"])
    # the batch script marked its launch (what the start waits for: N3), as the job's user
    mark = ledger.home / "jobs" / "checkpoints" / "1.0" / "launched"
    assert mark.is_file()
    # a read that saw the launch CONFIGURING (the cluster's PrologSlurmctld, at load) starts it
    # at its mark instead (`tracked.real_start`, atk43s F1): the mark comes after the script's
    # cluster check (`script_cluster`, ~0.4 s at load); never when the executor saw it run
    launched = os.lstat(mark).st_ctime
    assert any(abs(row["started_at"] - t) < 1e-3 for t in (want, launched)), (
        row["started_at"], want, launched, placed["at"]
    )  # fmt: skip
    assert seen["started_at"] == row["started_at"] < seen["at"]  # recorded later than it began


def test_import_shares_round_trips_and_a_parent_share_is_no_weight_of_its_own(
    tmp_path: Path, cluster: base.Cluster
) -> None:
    """F15's rest: `Share=parent` (Slurm: no share of its own, the user competes as its
    account) made bob a member with the account's 40 against alice's 10. He is a member with the
    default share, 1, and the import says so; what import-shares writes, `budget apply` takes,
    and a second import and apply changes nothing."""
    led = Ledger(tmp_path / "home", cluster)
    led.cli("init", "--admin", "root")
    saved, budget = tmp_path / "assoc.txt", tmp_path / "budget.toml"
    saved.write_text(
        "root|||1\nphysics|root||40\nphysics||alice|10\nphysics||bob|parent\n"
        "physics||carol|parent\nchem|root||20\nchem||dan|3\n"
    )
    done = subprocess.run(
        [GPULEDGER, "slurm", "import-shares", "--from", str(saved), "-o", str(budget)],
        env=led.env("root"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "2 users have Share=parent" in done.stderr and "physics/bob" in done.stderr
    led.cli("budget", "apply", str(budget))
    tree = {a["path"]: a for a in json.loads(led.cli("account", "tree", "--json"))}
    # (top-level accounts hold users, so Slurm's root is kept as the program above them)
    assert (tree["root/physics"]["shares"], tree["root/chem"]["shares"]) == (40, 20)
    assert tree["root/physics"]["members"] == ["alice", "bob", "carol"]
    got = {u: tree[f"root/physics/{u}"]["shares"] for u in ("alice", "bob", "carol")}
    assert got == {"alice": 10, "bob": 1, "carol": 1}, got
    again = tmp_path / "again.toml"
    led.cli("slurm", "import-shares", "--from", str(saved), "-o", str(again))
    assert again.read_text() == budget.read_text()
    assert "no changes" in led.cli("budget", "apply", str(again))


def test_a_run_adopted_after_a_kill_9_keeps_its_output_and_error_files(ledger: Ledger) -> None:
    """atk42-24 F4: a run adopted after `kill -9` of the service whose start it had not yet
    recorded was recorded started with `logs: []` (Slurm's record has /dev/null: slurmstepd
    does not open the job's output). Its launch is held CONFIGURING by the cluster's prolog
    (`hold-launches`) while the service is killed, so its start is recorded only after the
    restart: `jobs --json` shows its files as it would have."""
    hold = Path(ledger.cluster.conf).parent / "hold-launches"
    hold.touch()
    try:
        ledger.up()
        ledger.submit("alice", 1, "echo out-line; echo err-line >&2; sleep 300",
                      "-e", str(ledger.work / "e-%j.err"))  # fmt: skip

        def configuring() -> bool:
            return any("job=1:" in j["comment"] and j["state"] == "CONFIGURING"
                       for j in ledger.cluster.jobs().values())  # fmt: skip

        ledger.wait("Slurm to hold the launch", configuring)
        assert status(ledger, 1) == "placed"  # its start is not recorded (10 s unmarked)
        ledger.kill9()
    finally:
        hold.unlink(missing_ok=True)
    out, err = ledger.work / "gpuledger-1.out", ledger.work / "e-1.err"
    deadline = time.monotonic() + 60  # (`ledger.wait` asks the service, which is down)
    while not (out.exists() and "out-line" in out.read_text()):
        assert time.monotonic() < deadline, "the job did not run once released"
        time.sleep(0.3)
    ledger.up()
    ledger.wait("its start", lambda: status(ledger, 1) == "running")
    assert ledger.jobs()[1]["logs"] == [str(out), str(err)], ledger.jobs()[1]
    (started,) = ledger.of("job.started.v1", 1)
    assert started["logs"] == [str(out), str(err)], started
    assert "err-line" in err.read_text()
    ledger.cli("cancel", "1")
    ledger.wait("the cancel", lambda: status(ledger, 1) == "finished")
    ledger.stop()


def test_a_job_over_the_partitions_max_time_says_why_it_waits_and_runs_once_it_is_raised(
    ledger: Ledger,
) -> None:
    """atk60-slurm F4: with the partition's MaxTime below a job's limit (`MaxTime=1`, `-t 5`)
    the job is never placed (Slurm would never start it) until MaxTime is raised, but `queue`
    gave it `NEXT_CYCLE` with an estimated start 25 s ahead and `explain` "It would be placed
    in the next cycle" for as long as it waited. Now both say why, Slurm's reason's name as its
    code, with no estimated start, while it holds; once MaxTime is raised it runs, once."""
    part = ledger.cluster.partition
    ledger.up()
    try:
        ledger.cluster.run("scontrol", "update", f"PartitionName={part}", "MaxTime=1")
        ledger.wait("the executor to read MaxTime",
                    lambda: f"partition {part}: MaxTime=1 (was UNLIMITED)" in ledger.service_log())  # fmt: skip  # noqa: E501
        ledger.submit("alice", 1, "sleep 1", "-t", "5")
        rows: list[dict[str, Any]] = []
        for _ in range(5):  # as long as it waits (several of the executor's reads)
            time.sleep(3)
            (row,) = json.loads(ledger.cli("queue", "--json"))
            rows.append(row)
            assert (row["job_id"], row["code"]) == (1, "PARTITION_TIME_LIMIT"), rows
            assert row["estimated_start_at"] is None, rows
            assert "time limit (5m) is over the partition's MaxTime (1m)" in row["reason"], rows
        said = json.loads(ledger.cli("explain", "1", "--json"))
        assert (said["code"], said["estimated_start_at"]) == ("PARTITION_TIME_LIMIT", None), said
        lines = "\n".join(said["lines"])
        assert "next cycle" not in lines, lines
        assert "It may not run yet (the partition's MaxTime): its time limit (5m) is over the "\
            "partition's MaxTime (1m)" in lines, lines  # fmt: skip
        assert status(ledger, 1) == "pending" and not ledger.of("job.placed.v1", 1)
    finally:
        ledger.cluster.run("scontrol", "update", f"PartitionName={part}", "MaxTime=INFINITE")
    ledger.wait("the job to run and end", lambda: status(ledger, 1) == "finished", 90)
    assert ledger.jobs()[1]["finish_reason"] == "completed", ledger.jobs()[1]
    assert len(ledger.of("job.engine_linked.v1", 1)) == 1  # placed and run once
