"""The batch script's lines that open a Slurm job's output and error files itself, as its user,
after the executor's claim (`outputs`: slurmstepd opens only /dev/null, so nothing swapped in at
the name after the claim is ever waited on or written to: atk38-23 F3). Pure."""

from __future__ import annotations

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


def output_lines(
    outputs: Sequence[tuple[str, int | None]], cannot_open_file: str = ""
) -> list[str]:
    """Pure: the batch script's lines that open the job's output (then error) file as its
    user: `<>` (O_RDWR: it never blocks on a named pipe, nor writes to anything), the descriptor
    checked (`OPEN_CHECK`: the inode the claim made or found), then made stdout (stderr) to
    append, opened again through the descriptor (`/proc/self/fd/N`: the same file); the error
    file is the output when it names none. A check that fails leaves `cannot_open_file` and
    ends the script (exit 127, a failed launch)."""
    mark = touch(cannot_open_file)
    lines = [OPEN_CHECK]
    for fd, (path, inode) in zip((3, 4), outputs[:2], strict=False):
        std = 1 if fd == 3 else 2
        lines.append(
            f"{{ exec {fd}<>{shlex.quote(path)}; }} 2>/dev/null && gpuledger_opened {fd} "
            f"{'' if inode is None else inode} && exec {std}>>/proc/self/fd/{fd} {fd}>&- ||"
            f" {{{mark} exit 127; }}"
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
