"""The batch script of a Slurm run (docs/slurm.md, "The job's world"): the job's umask, its
environment, its working directory checked, its command checked, the marks the executor reads
(`launching`), and the command run as the script's child, whose end the script records; a
SIGTERM Slurm gives the batch shell alone is passed on to the command. Pure: words out."""

from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence

from ledger.cycle.executor import Launch
from ledger.engines.slurm.command_check import check_lines
from ledger.engines.slurm.ends import (
    BEAT_EVERY_S,
    UNBEATEN_S,
    ends_after_term_s,
    own_end_after_s,
)
from ledger.engines.slurm.relaunch import guard_lines
from ledger.engines.slurm.script_files import output_lines, touch, usable_lines, workdir_check
from ledger.engines.slurm.script_gpus import gpus_check
from ledger.engines.slurm.script_tree import pass_lines, reap_grace_s, reap_lines, steps_left_lines
from ledger.engines.slurm.words import SbatchUser, job_environment

WAIT = (
    'while gpuledger_sig=; wait "$gpuledger_pid"; gpuledger_rc=$?; [ -n "$gpuledger_sig" ];'
    " do :; done"
)
"""The script's wait for its command's child without a heartbeat (a signal only interrupts
the wait, which begins again)."""


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
    after_term_s: int = ends_after_term_s(30.0, 30.0),
    own_end_s: int = own_end_after_s(30.0),
    wrong_gpus_file: str = "",
    pinned_nodes: Collection[str] = (),
    files_limit: int | None = None,
    relaunched_file: str = "",
    taken_back_file: str = "",
    cluster: Sequence[str] = (),
    refused_file: str = "",
    checker: str = "",
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
    the command gets them itself; each one touches `signalled_file`), then ends what the
    command left in the step's cgroup, as slurmstepd would (`script_tree`: SIGTERM, SIGKILL
    after the job's grace, beating until none lives), and only then writes the run's end
    record, `<code> <epoch> <signalled: 0 or 1>` (a signal before the command ended: one that
    comes while the script ends what it left does not count, atk52-23 F2: a job whose command
    exited 0 then completed, as on the node agents), followed by ` <left> <killed: 0 or 1>` when
    the command left processes or the script's own end (below) SIGKILLed it (killed: 1, as the
    executor's SIGKILL is kept: atk59b N3), and exits with its code: how it really
    ended when Slurm ends it NODE_FAIL (`ends`). A signal from before the launch mark until the
    command's wait begins ends the script at once, noted too: a run with the `launched` mark
    and neither record nor note was never killed (Slurm's kill in that gap once left a run
    in doubt for good, its job `running` forever after its node came back). With
    `stopping_file`, a SIGTERM the script gets is passed on to every process of the job but
    `srun` (`script_tree.pass_lines`): the executor's own stop (`cluster.term_args`) and Slurm's
    own terminations (a node DOWN, its TIMEOUT, a plain `scancel`) signal the job's steps and
    the batch shell alone, and the command, the script's child, got nothing until SIGKILL, with
    no chance to checkpoint (atk38-24 F2), nor a rank's children (atk58 F1); the mark there
    before the command starts ends the script without starting it (`_stopped_first`: a stop
    that came first, atk43s F10). With
    `alive_file`, the script itself is the run's heartbeat (`_beating`): it touches that mark
    before it starts the command and every `BEAT_EVERY_S` while the command lives, so nothing
    kills the heartbeat but what ends the
    job (a separate heartbeat process was the job's to kill: atk40-24 F1b); a stale heartbeat
    is the outside's word that the run is gone (`ends.node_fail_ending`; atk39-24 F5: a run
    Slurm ended NODE_FAIL whose kill never came was taken for gone while it ran on). A mark it
    cannot write for `UNBEATEN_S` makes it SIGTERM the command itself, and from its first
    SIGTERM on (that one, Slurm's, the executor's, or a signal note it did not make) it ends the
    run `after_term_s` later whatever the command does (`ends.ends_after_term_s`), so a run is
    never alive beyond what the executor can bound from outside. With `wrong_gpus_file`, a run
    Slurm started without the GPUs the ledger placed it on (`pinned_nodes`: exactly) leaves it
    and ends before anything of the job's runs (`script_gpus`). With `files_limit`, the soft
    open-files limit the service started with, which the job gets back (sbatch hands its own to
    the job, raised by `serve` for its connections), as on the local executor. With
    `relaunched_file`, a run launched before (Slurm's restart of it) ends first
    (`relaunch.guard_lines`); with `taken_back_file`, a run the executor took back (Slurm would
    not start it) that Slurm starts all the same ends first (`taken_back_lines`); with
    `cluster` (`script_cluster.cluster_lines`), a run started on another cluster than the one it
    was submitted for ends next, its command never run (atk45ha F4). With `checker` and
    `refused_file`, the path rule for its command's names, run on the node as the user in its
    working directory before the command starts (`command_check`). (The
    variables sit in the script:
    `sbatch --export=ALL,VAR=...` makes Slurm start a job about 1.5 s later; sbatch itself runs
    with PATH and `SBATCH_ENV` alone, so nothing of the service's reaches the job.)"""
    env = job_environment(job, who or SbatchUser(), checkpoint_file)
    lines = ["#!/bin/bash", *taken_back_lines(taken_back_file), *cluster]
    lines += guard_lines(launched_file, ended_file, relaunched_file)
    lines += [] if job.ulimits is not None else _files_limit(files_limit)  # the submitter's
    if outputs:  # what the job needs is there and its user's, else why, before anything
        paths = [p for p, _ in outputs[:2]]
        lines += usable_lines(job.workdir, paths, cannot_enter_file, cannot_open_file)
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
    lines += check_lines(job.command, checker, refused_file)  # the node agents' rule (F8)
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
    if wrong_gpus_file:  # Slurm may start it without its GPUs (`script_gpus`)
        lines += gpus_check(job.slots, pinned_nodes, wrong_gpus_file)
    noted = f" {{ : > {shlex.quote(signalled_file)}; }} 2>/dev/null;" * bool(signalled_file)
    if ended_file:  # Slurm's kill from here on is noted, so its run is never in doubt for good
        lines.append(f"trap '{noted} exit 143' TERM INT HUP QUIT USR1 USR2 ALRM")
    end, part = shlex.quote(ended_file), shlex.quote(ended_file + ".part")
    if ended_file and stopping_file:  # a stop that came first: its command never starts (F10)
        lines.append(_stopped_first(stopping_file, end, part))
    if launched_file:  # where the service's directory is not shared, the executor waits instead
        lines.append(f"{{ : > {shlex.quote(launched_file)}; }} 2>/dev/null")
    command = shlex.join(job.command) if job.command else "true"
    if job.ulimits:  # the submitter's, set for the command alone (`ulimit_lines`)
        command = f"{ulimit_lines(job.ulimits)}; {command}"
    if not ended_file:
        lines.append("exec " + command)
        return "\n".join(lines) + "\n"
    code = shlex.quote(ended_file + ".code")
    signals = "TERM INT HUP QUIT USR1 USR2 ALRM"
    # a SIGTERM the script gets is passed on to every process of the job but `srun` (atk58 F1)
    forward = "gpuledger_termed=1; gpuledger_pass; gpuledger_far" if stopping_file else ""
    lines += pass_lines()  # (the reaping's functions too: defined before any signal)
    lines += [
        "gpuledger_signalled=0",
        # a gang's watchers on its other nodes: Slurm's own SIGTERM passed on there (atk59 F5)
        *(["gpuledger_watch"] if stopping_file else []),
        # the command runs in a child that catches the signals (so the command, which gets them
        # itself as the script passes them on, has them as they were) and writes
        # its code: bash's `wait` cannot say it once bash reaped the child inside a trap (it
        # gave -1, and `kill -0` took a command that exited 0 for one the signal killed: the
        # job FAILED in Slurm)
        *(_first_beat(alive_file) if alive_file else []),  # the run beats before it starts
        f"{{ trap : {signals}; {command}; {{ echo $? > {code}; }} 2>/dev/null; }} &",
        "gpuledger_pid=$!",
        # a signal only interrupts the wait, which begins again
        f"trap 'gpuledger_sig=1; gpuledger_signalled=1;{noted}' {signals}",
        f"trap 'gpuledger_sig=1; gpuledger_signalled=1;{noted} {forward}' TERM" * bool(forward),
        *(
            _beating(signalled_file, after_term_s, forward, own_end_s, ended_file)
            if alive_file
            else [WAIT]
        ),
        # what the command left in the step's cgroup ends before the record (`script_tree`);
        # a signal in that reap came after the command ended: not one before it (atk52-23 F2)
        *reap_lines(reap_grace_s(after_term_s, own_end_s), ended_file, bool(alive_file)),
        "gpuledger_first=$gpuledger_signalled",
        "gpuledger_reap",
        # no code: the child was killed before its command ended (a signal at its start)
        f"{{ read -r gpuledger_rc < {code}; }} 2>/dev/null || gpuledger_rc=${{gpuledger_end:-143}}",
        'case "$gpuledger_rc" in "" | *[!0-9]*) gpuledger_rc=143 ;; esac',
        # its own end (`_beating`) SIGKILLed its command after the grace: the record says
        # killed, as the executor's own SIGKILL would (atk59b N3: the service was down)
        '[ -z "${gpuledger_cut-}" ] || gpuledger_killed=1',
        'gpuledger_tree=; [ "$gpuledger_left$gpuledger_killed" = 00 ] ||'
        ' gpuledger_tree=" $gpuledger_left $gpuledger_killed"',
        # a step (`srun`) still alive here ends by Slurm's end of the job, later (atk60-slurm F2)
        *steps_left_lines(ended_file),
        f'{{ echo "$gpuledger_rc $EPOCHREALTIME $gpuledger_first$gpuledger_tree" > {part} &&'
        f" mv -f -- {part} {end}; }} 2>/dev/null",
        'exit "$gpuledger_rc"',
    ]
    return "\n".join(lines) + "\n"


TAKEN_BACK_EXIT = 124
"""The batch script's exit code when its run was taken back before it started
(`taken_back_lines`): FAILED in Slurm, no command run, no mark of the run's made."""


def taken_back_lines(taken_back_file: str) -> list[str]:
    """Pure: the batch script's first line: a run whose `taken-back` mark is there (a link
    counts) was taken back by the executor (`SlurmExecutor._take_back`: Slurm would not start
    it, its job ended `launch_failed`, nothing charged) before Slurm started it all the same
    (a slurmctld restart that lost the cancel: atk45s F5): it ends with `TAKEN_BACK_EXIT`
    before anything of the job's, so its command never runs and no mark of it is made."""
    if not taken_back_file:
        return []
    q = shlex.quote(taken_back_file)
    return [f"if [ -e {q} ] || [ -L {q} ]; then exit {TAKEN_BACK_EXIT}; fi"]


STOPPED_FIRST = "gpuledger: stopped before its command started: it was not run"
"""What the batch script says (on stderr) when the run's `stopping` mark is there before its
command starts (`_stopped_first`)."""


def _stopped_first(stopping_file: str, end: str, part: str) -> str:
    """Pure: the batch script's line, after its trap that notes a signal and before its launch
    mark, that ends the run without starting its command when the executor has already stopped
    it (its `stopping` mark, which the executor makes before its own SIGTERM): a stop of a launch
    Slurm held CONFIGURING signals no process, and the command, started after it, got no SIGTERM
    at all (the mark makes the script pass none on) and ran the whole grace (atk43s F10). It
    writes its end record, exit 143 and the stop first (`1`: never taken for an end by itself),
    and no launch mark, so the run has no start (`launching.stopped_first`). A stop that comes
    after this line signals the script, whose trap ends it, or the command itself."""
    stop = shlex.quote(stopping_file)
    return (
        f"{{ [ -e {stop} ] || [ -L {stop} ]; }} && {{ echo {shlex.quote(STOPPED_FIRST)} >&2;"
        f' {{ echo "143 $EPOCHREALTIME 1" > {part} && mv -f -- {part} {end}; }} 2>/dev/null;'
        " exit 143; }"
    )


ULIMIT_FLAGS = {
    "as": ("-v", 1024), "core": ("-c", 1024), "cpu": ("-t", 1), "data": ("-d", 1024),
    "fsize": ("-f", 1024), "memlock": ("-l", 1024), "nofile": ("-n", 1), "rss": ("-m", 1024),
    "stack": ("-s", 1024), "nproc": ("-u", 1),
}  # fmt: skip
"""bash's `ulimit` option of each recorded limit and its unit in bytes (bash counts sizes in
KiB), RLIMIT_NPROC last: the lines fork (`$(ulimit -H ...)`) before it is set."""


def ulimit_lines(ulimits: Sequence[tuple[str, int]]) -> str:
    """Pure: bash lines that give the job's command the submitter's soft limits (`-1`
    unlimited; sizes rounded down to bash's KiB), as the node agents do
    (`ledger.engines.ulimits`): each set as the user, never above the node's hard limit; one
    above it is set to the hard limit, and the job's error file says so (as slurmstepd:
    "reducing req:... to max:..."). sbatch runs with `--propagate=NONE` then, so Slurm gives
    the job nothing of the service's own (`words.sbatch_args`); without any (an older record,
    `submit --propagate=NONE`) the old rule, `files_limit`."""
    said = dict(ulimits)
    out = []
    for name, (flag, unit) in ULIMIT_FLAGS.items():
        if name not in said:
            continue
        want = "unlimited" if said[name] < 0 else str(said[name] // unit)
        over = f'[ {want} -gt "$gpuledger_h" ]' if want != "unlimited" else "true"
        cut = (
            f"echo \"gpuledger: RLIMIT_{name.upper()}: the submitter's soft limit {want} is above"
            f" this node's hard limit $gpuledger_h (ulimit {flag}): the job runs with $gpuledger_h"
            f' (as slurmstepd: reducing req:{want} to max:$gpuledger_h)" >&2'
        )
        out.append(
            f'gpuledger_h=$(ulimit -H {flag}); if [ "$gpuledger_h" != unlimited ] && {over};'
            f' then {cut}; ulimit -S {flag} "$gpuledger_h" 2>/dev/null;'
            f" else ulimit -S {flag} {want} 2>/dev/null; fi"
        )
    return "; ".join(out) or ":"


def _files_limit(soft: int | None) -> list[str]:
    """Pure: the line that lowers the soft open-files limit to `soft` when it is above it
    (`supervise.lower_files_limit`'s rule: never raised); [] without one."""
    if soft is None:
        return []
    return [
        f'gpuledger_f=$(ulimit -Sn); {{ [ "$gpuledger_f" = unlimited ] || [ "$gpuledger_f" -gt'
        f" {soft} ]; }} && ulimit -Sn {soft} 2>/dev/null"
    ]


def _first_beat(alive_file: str) -> list[str]:
    """Pure: the heartbeat's beat (`_beating`), defined and given once before the command
    starts: `touch -h` (never through a link, never an open: a named pipe at the name cannot
    hold it), the mark made again when it is gone; `gpuledger_ok`: the last beat written."""
    alive = shlex.quote(alive_file)
    return [
        f"gpuledger_beat() {{ {{ command -p touch -h -- {alive} || command -p touch -- {alive};"
        " } >/dev/null 2>&1 && gpuledger_ok=$EPOCHSECONDS; }",
        "gpuledger_ok=$EPOCHSECONDS; gpuledger_beat",
    ]


def _beating(
    signalled_file: str, after_term_s: int, forward: str, own_end_s: int, ended_file: str = ""
) -> list[str]:
    """Pure: the script's wait for its command as its heartbeat (`batch_script`): its TERM
    trap re-set so its first SIGTERM starts its end (`after_term_s` later); a beat after each
    wait of at most `BEAT_EVERY_S` (`wait -n` on the command's child and a `sleep` from the
    standard PATH: the job's own may have none; a `sleep` a signal or the job's `pkill sleep`
    ended is slept again, atk40-24 F1). A mark it cannot write for `UNBEATEN_S` is its own
    SIGTERM to the command, and its end `own_end_s` later at the latest; a signal note it did
    not make starts its end as a SIGTERM would (the executor believes the note:
    `ends.beat_bound`). An end record it did not write (`ended_file`, a regular file there
    before its own, as the executor reads one: the job's user declared the run ended; not the
    directory a job makes to keep its records unwritable, atk37-23 F6) ends the run at its
    next beat, at once, so the
    executor believes no beat a beat after the record (`ends.record_beat`: a touch of the mark
    from outside Slurm held an ended run's GPUs, atk42-24 F1); its own record replaces it. At
    its end it SIGKILLs the command and its child and goes on to the end record, after what is
    left of the job in its step's cgroup (`script_tree`: at once, its end having come)."""
    note = shlex.quote(signalled_file) if signalled_file else ""
    mark = f" {{ : > {note}; }} 2>/dev/null;" if note else ""
    fwd = f" {forward};" if forward else ""
    kill = ' { exec 2>/dev/null; gpuledger_kill KILL; kill -KILL "$gpuledger_pid"; gpuledger_end=137; break; };'  # noqa: E501
    end = shlex.quote(ended_file) if ended_file else ""
    recorded = f" [ -f {end} ] && [ ! -L {end} ] &&{kill}" if end else ""  # as `own_end` reads
    forged = (  # a regular file: not the directory a job makes to keep its notes unwritable
        f' [ "$gpuledger_signalled" = 0 ] && [ -f {note} ] && [ ! -L {note} ] && gpuledger_term;'
        if note
        else ""
    )
    return [
        'gpuledger_term() { [ -n "$gpuledger_ends" ] ||'
        f" gpuledger_ends=$((EPOCHSECONDS + {after_term_s})); }}",
        # SIGNAL to the command: the children of the command's child
        "gpuledger_kill() { local f l s=$1; for f in /proc/[0-9]*/stat; do"
        ' { read -r l < "$f"; } 2>/dev/null || continue; l=${l##*) }; set -- $l;'
        ' [ "$2" = "$gpuledger_pid" ] && kill "-$s" "${f:6:-5}" 2>/dev/null; done; }',
        f"trap 'gpuledger_sig=1; gpuledger_signalled=1;{mark} gpuledger_term;{fwd}' TERM",
        f"while :; do command -p sleep {BEAT_EVERY_S} & gpuledger_z=$!; gpuledger_done=;"
        ' wait -n -p gpuledger_done "$gpuledger_pid" "$gpuledger_z";'
        ' kill "$gpuledger_z" 2>/dev/null; [ "$gpuledger_done" = "$gpuledger_pid" ] && break;'
        f' kill -0 "$gpuledger_pid" 2>/dev/null || break;{recorded}{forged}'
        f" gpuledger_beat || [ $((EPOCHSECONDS - gpuledger_ok)) -lt {UNBEATEN_S} ] ||"
        ' { [ -n "$gpuledger_ends" ] || gpuledger_kill TERM;'
        f" gpuledger_e=$((EPOCHSECONDS + {own_end_s}));"
        ' [ -n "$gpuledger_ends" ] && [ "$gpuledger_ends" -le "$gpuledger_e" ] ||'
        " gpuledger_ends=$gpuledger_e; };"
        ' [ -z "$gpuledger_ends" ] || [ "$EPOCHSECONDS" -lt "$gpuledger_ends" ] ||'
        f" {{ gpuledger_cut=1;{kill} }}; done",
    ]
