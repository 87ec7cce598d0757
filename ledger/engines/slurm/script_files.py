"""The batch script's lines that open a Slurm job's output and error files itself, as its user,
after the executor's claim (`outputs`: slurmstepd opens only /dev/null, so nothing swapped in at
the name after the claim is ever waited on or written to: atk38-23 F3). Pure."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

OPEN_CHECK = r"""gpuledger_opened() {
  local s m u h i d
  s=$(stat -L -c '%f %u %h %i %t:%T' "/proc/self/fd/$1" 2>/dev/null) || return 1
  read -r m u h i d <<< "$s"
  if [ $((0x$m & 0xF000)) = 8192 ] && [ "$d" = 1:3 ]; then return 0; fi
  [ $((0x$m & 0xF000)) = 32768 ] && [ "$u" = "$UID" ] && [ "$h" = 1 ] &&
    { [ -z "$2" ] || [ "$i" = "$2" ]; }
}"""
"""`gpuledger_opened FD INODE`: whether descriptor FD is /dev/null, or a regular file of the
script's user with one link (and, given, inode INODE): the file opened, never a name again."""


def touch(path: str) -> str:
    """Pure: shell that leaves the empty mark `path`, quietly ("" without one)."""
    return f" {{ : > {shlex.quote(path)}; }} 2>/dev/null;" * bool(path)


WATCHDOG_TRAP = (
    'trap \'for f in /proc/[0-9]*/stat; do { read -r l < "$f"; } 2>/dev/null || continue;'
    ' l=${l##*) }; set -- $l; [ "$2" = "$BASHPID" ] && kill -KILL "${f:6:-5}" 2>/dev/null;'
    " done; exit 0' TERM"
)
"""The open's watchdog ends its own `sleep` when the script, its open done, ends it: a watchdog
killed once it had forked its `sleep` left that `sleep` in the job's step cgroup, which the
script's sweep then found as "its command ended leaving 1 processes of its job" (a job that
left nothing; seen at load, when the watchdog ran before the script's kill). Its children by
/proc, not `$!`: a TERM between its fork and the assignment finds the `sleep` all the same."""

OPEN_WAIT_S = 5
"""How long the script's open of an output may take before the script gives up (a name
swapped after the claim for a named pipe nobody writes, or a link to a file another account
holds a lease on): it leaves the `cannot-open` mark and ends, well inside the executor's
`launch_confirm_s`, so the run is recorded `launch_failed`, never a job that ran."""


def output_lines(
    outputs: Sequence[tuple[str, int | None]], cannot_open_file: str = ""
) -> list[str]:
    """Pure: the batch script's lines that open the job's output (then error) file as its
    user, never creating through a link and never waiting (atk39-23 F3, F9): a name that is not
    there (a file the claim could not reach) is made with noclobber (`set -C`: O_EXCL, which
    fails on any link); then only a regular file (or a device: `/dev/null`, which only root
    makes) that is no link is opened, read-only (`<`: no O_CREAT, and a read open breaks no
    other account's read lease), under a watchdog that ends the script after `OPEN_WAIT_S` (a
    swap between the test and the open: a named pipe, a link to a leased file); the
    descriptor is checked (`OPEN_CHECK`: the inode the claim made or found) and only then made
    stdout (stderr) to append, opened again through it (`/proc/self/fd/N`: the same file); the
    error file is the output when it names none. A failure leaves `cannot_open_file` and ends
    the script (exit 127, a failed launch)."""
    mark = touch(cannot_open_file)
    lines = [OPEN_CHECK]
    for fd, (path, inode) in zip((3, 4), outputs[:2], strict=False):
        std = 1 if fd == 3 else 2
        name = shlex.quote(path)
        lines.append(
            f"{{ [ -e {name} ] || [ -L {name} ] || {{ set -C; : > {name}; set +C; }}; }} "
            f"2>/dev/null; ( {WATCHDOG_TRAP}; sleep {OPEN_WAIT_S} & wait $!;{mark} kill -KILL $$ )"
            f" >/dev/null 2>&1 & "
            f"gpuledger_w=$!; {{ {{ [ -f {name} ] || [ -c {name} ]; }} && [ ! -L {name} ] && "
            f"exec {fd}<{name}; }} "
            f"2>/dev/null; gpuledger_r=$?; set +C; kill $gpuledger_w 2>/dev/null; "
            "wait $gpuledger_w 2>/dev/null; "
            f"[ $gpuledger_r = 0 ] && gpuledger_opened {fd} {'' if inode is None else inode} "
            f"&& exec {std}>>/proc/self/fd/{fd} {fd}>&- || {{{mark} exit 127; }}"
        )
    if len(outputs) < 2:
        lines.append("exec 2>&1")
    return lines


def workdir_check(workdir: str, real: str, mark: str) -> list[str]:
    """Pure: the line, after the script's `cd` into `workdir`, that checks it is the directory
    the claim checked (its real path `real`, when the claim reached it) and the user's or
    root's, else says so and ends the script (`mark`: the `cannot-enter` one; atk38-23 F10)."""
    wd = shlex.quote(workdir)
    same = f' && [ "$(pwd -P)" = {shlex.quote(real)} ]' * bool(real)
    return [
        'gpuledger_o=$(stat -c %u .); { [ "$gpuledger_o" = "$UID" ] || [ "$gpuledger_o" = 0 ]; }'
        f'{same} || {{ echo "gpuledger: the working directory "{wd}" is not the one checked at '
        f'launch: another account may have replaced it" >&2;{mark} exit 127; }}'
    ]


NODE = "${SLURMD_NODENAME:-$(hostname 2>/dev/null)}"
"""The node the batch script runs on, as its reasons name it."""


def usable_lines(
    workdir: str, outputs: Sequence[str], enter_mark: str = "", open_mark: str = ""
) -> list[str]:
    """Pure: the batch script's first lines, before it opens anything (docs/slurm.md, "The job's
    world"): the working directory exists on the node and its user may enter it,
    and each output file's directory exists and may be entered, and the file written (or made
    there) by the job's user (`[ -x ]`, `[ -w ]`: the script's real uid, the job's). A failure
    says why on stderr and writes the same line into the mark (`enter_mark` for the working
    directory, `open_mark` for an output file: the executor records it as the run's
    `launch_failed` reason, `launching.said`) and ends the script, exit 127, before the
    command ever runs. Slurm itself would start the job in /tmp or fail it without a word."""
    lines = [
        'gpuledger_no() { echo "gpuledger: $2" >&2; { printf \'%s\\n\' "$2" > "$1"; }'
        " 2>/dev/null; exit 127; }",
        f"gpuledger_at={NODE}",
    ]
    at = " on node $gpuledger_at"
    if workdir:
        wd, mark = shlex.quote(workdir), shlex.quote(enter_mark or "/dev/null")
        why = f'"cannot enter the working directory "{wd}": '
        lines += [
            f'[ -d {wd} ] || gpuledger_no {mark} {why}no such directory{at}"',
            f'[ -x {wd} ] || gpuledger_no {mark} {why}its user may not enter it{at}"',
        ]
    mark = shlex.quote(open_mark or "/dev/null")
    for path in dict.fromkeys(outputs):
        name, where = shlex.quote(path), shlex.quote(os.path.dirname(path) or ".")
        why = f'"cannot open the output file "{name}": '
        lines += [
            f'[ -d {where} ] || gpuledger_no {mark} {why}its directory "{where}" does not exist'
            f'{at}"',
            f"[ -x {where} ] || gpuledger_no {mark} {why}the job's user may not enter its "
            f'directory "{where}"{at}"',
            f"if [ -e {name} ] || [ -L {name} ]; then [ -w {name} ] || gpuledger_no {mark} "
            f"{why}the job's user may not write it{at}\"; else [ -w {where} ] || gpuledger_no "
            f'{mark} {why}the job\'s user may not create it in "{where}"{at}"; fi',
        ]
    return lines
