"""The batch script of a Slurm run (docs/slurm.md, "The job's world"): the job's umask, its
environment, its working directory checked, its command checked, the marks the executor reads
(`launching`), and the command run as the script's child, whose end the script records; a
SIGTERM Slurm gives the batch shell alone is passed on to the command. Pure: words out."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ledger.cycle.executor import Launch
from ledger.engines.slurm.ends import BEAT_EVERY_S
from ledger.engines.slurm.script_files import output_lines, touch, workdir_check
from ledger.engines.slurm.words import SbatchUser, job_environment


def batch_script(
    job: Launch,
    who: SbatchUser | None = None,
    checkpoint_file: str = "",
    launched_file: str = "",
    umask: int = 0o022,
    cannot_enter_file: str = "",
    cannot_start_file: str = "",
    ended_file: str = "",
    signalled_file: str = "",
    stopping_file: str = "",
    outputs: Sequence[tuple[str, int | None]] = (),
    files_umask: int = 0o077,
    cannot_open_file: str = "",
    real_workdir: str = "",
    alive_file: str = "",
) -> str:
    """Pure: the batch script: with `outputs` (`script_files`), its output files opened first, as
    the user, with `files_umask`, and its working directory checked (slurmstepd opens /dev/null
    alone); the job's umask (the submitter's as recorded, else the one the service has; sbatch
    runs with SLURM_UMASK), the job's environment (`job_environment`), a check that it starts
    where it was asked to (Slurm would fall back to /tmp): a directory it cannot enter leaves
    `cannot_enter_file` and ends the script, so its run is a failed launch, never a run (as
    on the node agents); a command that cannot be started (not found in the job's PATH, or no
    executable file) leaves `cannot_start_file` and ends the script there too, so it is a
    failed launch as on the node agents, not a job that failed with 127; then the mark that it
    launched (`launched_file`, made empty: a run
    Slurm shows RUNNING is recorded started only once its script gets there, so one whose
    launch fails, JobLaunchFailure or that directory, never started), then the job's command
    replaces the shell, so it gets the signals; or, with `ended_file`, runs in the script's
    child (which writes the command's exit code: bash's `wait` cannot always say it), and the
    script waits for it (surviving the signals Slurm gives every process of the job, so
    the command gets them itself; each one touches `signalled_file`) and then writes the run's
    end record, `<code> <epoch> <signalled: 0 or 1>`, and exits with its code: how it really
    ended when Slurm ends it NODE_FAIL (`ends`). A signal from before the launch mark until the
    command's wait begins ends the script at once, noted too: a run with the `launched` mark
    and neither record nor note was never killed (Slurm's kill in that gap once left a run
    in doubt for good, its job `running` forever after its node came back). A SIGTERM the
    script gets is passed on to the command, once, unless `stopping_file` is there (the
    executor's own stop, `scancel --signal=TERM --full`, signals every process of the job
    itself): Slurm's own terminations (a node DOWN, its TIMEOUT, a plain `scancel`) signal the
    batch shell alone, and the command, the script's child, got nothing until SIGKILL, with no
    chance to checkpoint (atk38-24 F2). With `alive_file`, a heartbeat: while the command's
    child lives, a process of the script (deaf to the signals, as the command's child is)
    rewrites that mark every `BEAT_EVERY_S`; the script ends it before its end record. Slurm's
    SIGKILL ends it with the job, so a stale heartbeat is the outside's word that the run is
    gone (`ends.node_fail_ending`; atk39-24 F5: a run Slurm ended NODE_FAIL whose kill never
    came was taken for gone while it ran on). (The
    variables sit in the script:
    `sbatch --export=ALL,VAR=...` makes Slurm start a job about 1.5 s later; sbatch itself runs
    with PATH and `SBATCH_ENV` alone, so nothing of the service's reaches the job.)"""
    env = job_environment(job, who or SbatchUser(), checkpoint_file)
    lines = ["#!/bin/bash"]
    if outputs:
        lines += [f"umask {files_umask:04o}", *output_lines(outputs, cannot_open_file)]
    lines.append(f"umask {umask:04o}")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    if job.workdir:
        wd = shlex.quote(job.workdir)
        mark = touch(cannot_enter_file)
        lines.append(
            f'cd -- {wd} || {{ echo "gpuledger: cannot enter the working directory "{wd} >&2;'
            f"{mark} exit 127; }}"
        )
        lines += workdir_check(job.workdir, real_workdir, mark) if outputs else []
    if cannot_start_file and job.command:
        cmd = shlex.quote(job.command[0])
        mark = f"{{ : > {shlex.quote(cannot_start_file)}; }} 2>/dev/null;"
        test, why = (
            (f"[ -f {cmd} ] && [ -x {cmd} ]", "no such executable file")
            if "/" in job.command[0]
            else (f"command -v -- {cmd} >/dev/null 2>&1", "not found in PATH")
        )
        lines.append(
            f'{test} || {{ echo "gpuledger: cannot start "{cmd}": {why}" >&2;{mark} exit 127; }}'
        )
    noted = f" {{ : > {shlex.quote(signalled_file)}; }} 2>/dev/null;" * bool(signalled_file)
    if ended_file:  # Slurm's kill from here on is noted, so its run is never in doubt for good
        lines.append(f"trap '{noted} exit 143' TERM INT HUP QUIT USR1 USR2 ALRM")
    if launched_file:  # where the service's directory is not shared, the executor waits instead
        lines.append(f"{{ : > {shlex.quote(launched_file)}; }} 2>/dev/null")
    command = shlex.join(job.command) if job.command else "true"
    if not ended_file:
        lines.append("exec " + command)
        return "\n".join(lines) + "\n"
    end, part = shlex.quote(ended_file), shlex.quote(ended_file + ".part")
    code = shlex.quote(ended_file + ".code")
    signals = "TERM INT HUP QUIT USR1 USR2 ALRM"
    forward = ""
    if stopping_file:  # the command's pid: the one child of the child running it
        forward = (
            "gpuledger_fwd() { [ -e " + shlex.quote(stopping_file) + " ] && return; local f l;"
            ' for f in /proc/[0-9]*/stat; do { read -r l < "$f"; } 2>/dev/null || continue;'
            " l=${l##*) }; set -- $l;"
            ' [ "$2" = "$gpuledger_pid" ] && kill -TERM "${f:6:-5}" 2>/dev/null; done; }'
        )
    lines += [forward] if forward else []
    lines += [
        "gpuledger_signalled=0",
        # the command runs in a child that catches the signals (so the command, which gets them
        # itself as Slurm signals the job's every process, has them as they were) and writes
        # its code: bash's `wait` cannot say it once bash reaped the child inside a trap (it
        # gave -1, and `kill -0` took a command that exited 0 for one the signal killed: the
        # job FAILED in Slurm)
        f"{{ trap : {signals}; {command}; {{ echo $? > {code}; }} 2>/dev/null; }} &",
        "gpuledger_pid=$!",
        # a signal only interrupts the wait, which begins again
        f"trap 'gpuledger_sig=1; gpuledger_signalled=1;{noted}' {signals}",
        f"trap 'gpuledger_sig=1; gpuledger_signalled=1;{noted} gpuledger_fwd' TERM" * bool(forward),
        *([_heartbeat(alive_file, signals)] if alive_file else []),  # once the traps are set
        'while gpuledger_sig=; wait "$gpuledger_pid"; gpuledger_rc=$?; [ -n "$gpuledger_sig" ];'
        " do :; done",
        *(["kill -KILL $gpuledger_beat 2>/dev/null"] if alive_file else []),
        # no code: the child was killed before its command ended (a signal at its start)
        f"{{ read -r gpuledger_rc < {code}; }} 2>/dev/null || gpuledger_rc=143",
        'case "$gpuledger_rc" in "" | *[!0-9]*) gpuledger_rc=143 ;; esac',
        f'{{ echo "$gpuledger_rc $EPOCHREALTIME $gpuledger_signalled" > {part} &&'
        f" mv -f -- {part} {end}; }} 2>/dev/null",
        'exit "$gpuledger_rc"',
    ]
    return "\n".join(lines) + "\n"


def _heartbeat(alive_file: str, signals: str) -> str:
    """Pure: the script's heartbeat (`batch_script`): its own process, deaf to the job's
    signals and to its output, rewriting `alive_file` while the command's child lives (`sleep`
    from the standard PATH: the job's own may have none, and the loop must never spin; a
    `sleep` a signal ended, a job's `pkill sleep`, does not end it: atk40-24 F1)."""
    alive = shlex.quote(alive_file)
    return (
        f"( trap '' {signals}; while kill -0 \"$gpuledger_pid\" 2>/dev/null; do"
        f" {{ : > {alive}; }} 2>/dev/null; command -p sleep {BEAT_EVERY_S} ||"
        ' { gpuledger_s=$?; [ "$gpuledger_s" -gt 128 ] || break; }; done )'
        " </dev/null >/dev/null 2>&1 &"
        " gpuledger_beat=$!"
    )
