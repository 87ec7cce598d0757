"""The long commands on a terminal and when stopped (atk61-29b): the what-if's bar in a unit the
user can check, `simulate compare --parallel`, `simulate sweep` and `audit check` with a bar of a
known total, quiet when not a terminal; and what a Ctrl-C leaves behind."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

GPULEDGER = str(Path(sys.executable).with_name("gpuledger"))
SMALL = ("--synthetic", "--nodes", "4", "--no-plots")


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    return {**out, "COLUMNS": "120"}


def on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run `gpuledger ARGS` with stderr on a pseudo-terminal: its exit code and what the
    terminal got."""
    main, other = pty.openpty()
    proc = subprocess.Popen(
        [GPULEDGER, *args], env=env(), cwd=cwd, stdout=subprocess.DEVNULL, stderr=other
    )
    os.close(other)
    got = b""
    while True:
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None:
            break
    os.close(main)
    return proc.wait(timeout=120), got.decode(errors="replace")


def quietly(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPULEDGER, *args], env=env(), cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A day of the synthetic workload on 4 nodes (about 1,000 events), 2026-01-01."""
    home = tmp_path_factory.mktemp("progress") / "w"
    out = quietly(["--home", str(home), "simulate", "run", *SMALL, "--days", "1"], home.parent)
    assert out.returncode == 0, out.stderr
    return home


def test_the_whatif_bar_counts_a_percent_of_its_estimated_work_to_the_end(
    world: Path, tmp_path: Path
) -> None:
    """It said `5,160/5,160 submissions` of a day that held 172 (atk61-29b F1)."""
    code, shown = on_a_terminal(
        ["--home", str(world), "whatif", "--policy", "fifo",
         "--from", "2026-01-01", "--to", "2026-01-02"], tmp_path,
    )  # fmt: skip
    assert code == 0, shown
    assert "of the estimated work" in shown and "100%" in shown, shown
    assert "submissions" not in shown, shown


def test_audit_check_shows_its_walk_over_the_log(world: Path, tmp_path: Path) -> None:
    """No bar at all, embedded (atk61-29b F3); through the server it had one."""
    code, shown = on_a_terminal(["--home", str(world), "audit", "check"], tmp_path)
    assert code == 0, shown
    assert "events checked" in shown, shown
    quiet = quietly(["--home", str(world), "audit", "check"], tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_a_rebuild_says_its_phase_before_its_count_starts(world: Path, tmp_path: Path) -> None:
    """The bar sat at `0/304,777 -:--:--` for 2-7 s of a 12 s rebuild (atk61-29c)."""
    home = tmp_path / "copy"
    shutil.copytree(world, home)
    code, shown = on_a_terminal(["--home", str(home), "projection", "rebuild"], tmp_path)
    assert code == 0, shown
    assert "reading the log's first events" in shown, shown


def test_a_parallel_compare_shows_one_bar_of_the_jobs_of_all_its_runs(tmp_path: Path) -> None:
    """Nothing for 6.9 s of 8.0 s, then one `done` line a run (atk61-29b F2)."""
    args = ["simulate", "compare", *SMALL, "--days", "0.5", "--policies", "fairshare,fifo",
            "--parallel", "2"]  # fmt: skip
    code, shown = on_a_terminal(["--home", str(tmp_path / "a"), *args], tmp_path)
    assert code == 0, shown
    assert "compare" in shown and "jobs submitted" in shown, shown
    quiet = quietly(["--home", str(tmp_path / "b"), *args], tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert "\r" not in quiet.stderr and "\x1b" not in quiet.stderr, quiet.stderr
    assert "jobs submitted" not in quiet.stderr, quiet.stderr


def test_a_sweep_shows_the_runs_done_of_all(tmp_path: Path) -> None:
    code, shown = on_a_terminal(
        ["--home", str(tmp_path / "s"), "simulate", "sweep", "--family", "", "--seeds", "1",
         "--nodes", "4", "--days", "0.2", "--policies", "fairshare,fifo"], tmp_path,
    )  # fmt: skip
    assert code == 0, shown
    assert "runs done" in shown and "/2" in shown, shown


def interrupted(
    args: list[str], cwd: Path, after: float, until: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`gpuledger ARGS`, not on a terminal, stopped by a Ctrl-C (to its process group, as a
    terminal sends it) `after` seconds in, or once a line of its stderr starts with `until`."""
    proc = subprocess.Popen(
        [GPULEDGER, *args], env=env(), cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    said = ""
    if until is not None:
        assert proc.stderr is not None
        for line in proc.stderr:
            said += line
            if line.startswith(until):
                break
    time.sleep(after)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # killed and reaped: its pipes and process left open failed
        os.killpg(proc.pid, signal.SIGKILL)  # the next test on this worker (s61-red-C)
        out, err = proc.communicate()
        raise AssertionError(f"{args} did not end 120 s after its Ctrl-C: {said + err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, said + err)


def test_a_ctrl_c_writes_no_blank_line_when_not_on_a_terminal(world: Path, tmp_path: Path) -> None:
    """A lone newline on stderr (a blank line in a log file), atk61-29b F4."""
    stopped = interrupted(["--home", str(world), "log", "-f"], tmp_path, 3.0)
    assert stopped.returncode == 130, stopped.stderr
    assert stopped.stderr == "", repr(stopped.stderr)


def test_a_compare_stopped_part_way_can_be_run_again(tmp_path: Path) -> None:
    """It kept the policy it had finished, wrote no report, and the same command was then
    refused: "runs/X/fifo already holds a ledger" (atk61-29b F4). It removes what it made."""
    home = tmp_path / "c"
    args = ["--home", str(home), "simulate", "compare", *SMALL, "--policies", "fifo,fairshare",
            "--parallel", "2"]  # fmt: skip
    stopped = interrupted([*args, "--days", "7"], tmp_path, 0.5, until="fifo: done")
    assert stopped.returncode == 130, stopped.stderr
    assert "fairshare: done" not in stopped.stderr, stopped.stderr  # stopped part way
    assert "Traceback" not in stopped.stderr, stopped.stderr  # a pool process's, quietly
    assert not (home / "fifo").exists() and not (home / "fairshare").exists()
    again = quietly([*args, "--days", "0.2"], tmp_path)
    assert again.returncode == 0, again.stderr


def stopped_alone(
    args: list[str], cwd: Path, until: str | Path, after: float = 0.0
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`gpuledger ARGS` sent SIGINT to its own process alone (`kill -INT PID`, `timeout -s
    INT`, a supervisor) `after` seconds after a line of its stderr starts with `until` (or
    the path `until` exists): what it did, and how long it took to end after the signal."""
    proc = subprocess.Popen(
        [GPULEDGER, *args], env=env(), cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stderr is not None
    said = ""
    while isinstance(until, Path) and not until.exists() and proc.poll() is None:
        time.sleep(0.1)
    for line in proc.stderr if isinstance(until, str) else []:
        said += line
        if line.startswith(until):
            break
    time.sleep(after)
    os.kill(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, said + err), (
        time.monotonic() - sent
    )


def test_a_parallel_compare_stops_its_runs_on_a_sigint_to_it_alone(tmp_path: Path) -> None:
    """The bar froze and it exited 130 only when its runs had ended (26.7 s); once in four the
    signal was lost and it wrote a report, exit 0 (atk61-29c F1)."""
    home = tmp_path / "c"
    args = ["--home", str(home), "simulate", "compare", *SMALL, "--policies", "fifo,fairshare",
            "--parallel", "2", "--days", "28"]  # fmt: skip
    stopped, took = stopped_alone(args, tmp_path, home / "fairshare", after=1.0)
    assert stopped.returncode == 130, stopped.stderr
    assert took < 10, took
    assert "Traceback" not in stopped.stderr and "done" not in stopped.stderr, stopped.stderr
    assert not (home / "fifo").exists() and not (home / "fairshare").exists()
    assert not (home / "report").exists()


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_a_sweep_cut_short_keeps_what_it_recorded_and_a_rerun_goes_on(
    tmp_path: Path, parallel: str
) -> None:
    """Stopped, it left empty run folders and finished runs runs.jsonl did not have; run
    again, it was refused: "001/fifo already holds a ledger" (atk61-29c F2)."""
    home = tmp_path / "s"
    args = ["--home", str(home), "simulate", "sweep", "--family", "", "--seeds", "1,2,3",
            "--nodes", "4", "--policies", "fifo,fairshare", "--parallel", parallel]  # fmt: skip
    stopped, took = stopped_alone([*args, "--days", "1"], tmp_path, "seed=1 fifo: done")
    assert stopped.returncode == 130, stopped.stderr
    assert took < 10, took
    runs = (home / "report" / "runs.jsonl").read_text().splitlines()
    said = [ln for ln in stopped.stderr.splitlines() if ln.endswith("CPU)")]
    assert 1 <= len(runs) == len(said) < 6, stopped.stderr
    recorded = sorted("/".join(Path(json.loads(r)["run"]["home"]).parts[-2:]) for r in runs)
    kept = sorted(f"{p.parent.name}/{p.name}" for p in home.glob("0*/*"))
    assert kept == recorded, (kept, recorded)
    assert all(any(p.iterdir()) for p in home.glob("0*")), list(home.glob("0*/*"))
    again = quietly([*args, "--days", "1"], tmp_path)
    assert again.returncode == 0, again.stderr
    redone = [ln for ln in again.stderr.splitlines() if ln.endswith("CPU)")]
    assert len(redone) == 6 - len(runs), again.stderr
    assert len((home / "report" / "runs.jsonl").read_text().splitlines()) == 6
    assert len(json.loads((home / "report" / "sweep.json").read_text())) == 3
    assert "report:" in again.stdout, again.stdout


def test_a_rebuild_stopped_part_way_leaves_no_half_built_copy(world: Path, tmp_path: Path) -> None:
    """`projections/ledger.duckdb.rebuild` stayed until the next rebuild (atk61-29b F4); the
    projection in use is untouched."""
    from ledger.store.embedded import EmbeddedSource
    from projections.projector import projection_path, rebuild

    home = tmp_path / "copy"
    shutil.copytree(world, home)
    before = projection_path(home).read_bytes()

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    source = EmbeddedSource(home)
    try:
        with pytest.raises(KeyboardInterrupt):
            rebuild(home, source, progress=stop, batch_size=100)
    finally:
        source.close()
    assert sorted(p.name for p in projection_path(home).parent.iterdir()) == ["ledger.duckdb"]
    assert projection_path(home).read_bytes() == before


def table_on_a_terminal(args: list[str], cwd: Path, columns: int) -> str:
    """What `gpuledger ARGS` prints with stdout on a terminal `columns` wide."""
    import fcntl
    import struct
    import termios

    main, other = pty.openpty()
    fcntl.ioctl(other, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environ = {k: v for k, v in env().items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([GPULEDGER, *args], env=environ, cwd=cwd, stdout=other,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    os.close(other)
    got = b""
    while True:
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None:
            break
    os.close(main)
    assert proc.wait(timeout=60) == 0
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", got.decode()).replace("\r", "")


@pytest.mark.parametrize("columns", [80, 100, 160])
@pytest.mark.parametrize("command", [["report", "preemptions", "--since", "2026-01-01"], ["jobs"]])
def test_the_tables_keep_names_and_dates_whole_on_a_narrow_terminal(
    world: Path, tmp_path: Path, command: list[str], columns: int
) -> None:
    """At 100 columns `report preemptions` printed `prog1/t…` and `2026-01-…`, and `jobs`
    `prog1/…` and `2026-0…` (atk61-29b F5); the summary line of `report preemptions` wrapped
    mid-field at 80 and 100 (atk61-29c). `jobs` has a name column (atk61-29c)."""
    shown = table_on_a_terminal(["--home", str(world), *command], tmp_path, columns)
    lines = shown.splitlines()  # the summary's too (it wrapped mid-field, atk61-29c)
    assert max(len(ln) for ln in lines) <= columns, shown
    assert "…" not in shown, shown
    assert command != ["jobs"] or "name" in shown, shown
    names = re.findall(r"prog\d/team\d\d", shown)
    dates = re.findall(r"2026-01-0\d[ T]\d\d:\d\d:\d\dZ", shown)
    assert len(names) >= 10 and len(dates) >= 10, shown
