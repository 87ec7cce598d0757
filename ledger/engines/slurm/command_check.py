"""The path rule for a Slurm run's command (`job_paths.check_command`, T19 in docs/security.md),
run by its batch script on the job's node, as the job's user, in its working directory, just
before the command starts: the very code the node agents' opener runs (`command_names` and
`job_paths`, which import only the standard library), handed as text to the node's own
`python3` (found in the standard PATH, run isolated: `-I -S`, `env -i`; the project's venv is
not readable by the job's user), so one file gets one answer on every engine. Without it a
teammate's script swapped into a group directory after the submission ran as the submitter on
Slurm while the node agents refused it (atk46-23 F8). A refusal leaves the `refused-command`
mark holding why and ends the script (exit 127): the run is `launch_failed`, its command never
run. A node where the check cannot run (no `python3` 3.8 or later, or it takes more than
`CHECK_WAIT_S`) refuses it too, saying so. A command that names nothing the rule looks at
(`sleep 60`: no path, no interpreter's script) is not checked (`needs_check`). Pure but
`checker_sources` (it reads the two modules' files)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from ledger.engines import command_names, job_paths
from ledger.engines.command_names import runs_script, simple_commands

REFUSED_COMMAND = "refused-command"
"""The mark the batch script leaves, holding why, when the path rule refuses its command."""

REFUSED_OPENINGS = (
    "the program ",
    "the script ",
    "cannot follow the program ",
    "cannot follow the script ",
    "cannot check the command ",
)
"""How a reason in the `refused-command` mark may begin (`job_paths.Refused`'s words, and the
script's own when it cannot check): the mark is the job user's to write, so it may only say
why its own launch was refused (`launching.said`)."""

CHECK_WAIT_S = 5
"""How long the check may take on the node (a hung network file system): then the launch is
refused, well inside the executor's `launch_confirm_s`."""

REFUSED_EXIT = 3
"""The checker's exit code for a refusal (its reason on stdout); any other but 0: it could not
check."""

MODULES = ("ledger.engines.command_names", "ledger.engines.job_paths")
"""The modules the checker carries, in load order (`job_paths` imports `command_names`)."""


def needs_check(command: Sequence[str]) -> bool:
    """Pure: whether the path rule looks at any name of `command` (`job_paths._check_simple`:
    a program named by a path, or what an interpreter or launcher runs)."""
    return any(
        words and ("/" in words[0] or (runs_script(words[0]) and len(words) > 1))
        for words, _ in simple_commands(command, "")
    )


def checker_sources() -> tuple[tuple[str, str], ...]:
    """The two modules' source texts, by name (`MODULES`), as this installation has them."""
    files = {MODULES[0]: command_names.__file__, MODULES[1]: job_paths.__file__}
    return tuple((name, Path(files[name]).read_text(encoding="utf-8")) for name in MODULES)


def checker_code(sources: Sequence[tuple[str, str]]) -> str:
    """Pure: the Python program the batch script runs (`python3 -I -S -c CODE WORD...`): it
    loads the modules from their texts, runs `check_command` on its arguments (the job's
    command) in the directory it starts in, and exits 0, or prints why and exits
    `REFUSED_EXIT`."""
    loads = "".join(f"_load({name!r}, {text!r})\n" for name, text in sources)
    return (
        "import sys, types\n"
        "def _load(name, text):\n"
        "    mod = types.ModuleType(name)\n"
        "    sys.modules[name] = mod\n"
        "    exec(compile(text, name, 'exec'), mod.__dict__)\n"
        f"{loads}"
        f"paths = sys.modules[{MODULES[1]!r}]\n"
        "try:\n"
        "    paths.check_command(sys.argv[1:])\n"
        "except paths.Refused as refused:\n"
        "    print(str(refused).replace('\\n', ' '))\n"
        f"    sys.exit({REFUSED_EXIT})\n"
    )


def check_lines(command: Sequence[str], code: str, refused_file: str) -> list[str]:
    """Pure: the batch script's lines, after it entered the job's working directory and before
    the command starts, that run the check (`checker_code`) with the node's `python3` and end
    the script when it refuses, or cannot run, leaving why in `refused_file` (exit 127). []
    when nothing in `command` is looked at (`needs_check`) or no code is given."""
    if not code or not refused_file or not needs_check(command):
        return []
    mark = shlex.quote(refused_file)
    node = "${SLURMD_NODENAME:-$(hostname 2>/dev/null)}"
    cannot = (
        f'"cannot check the command "{shlex.quote(command[0])}" on node {node}: no python3 (3.8'
        f" or later) in the standard PATH ran the path rule within {CHECK_WAIT_S} s"
        ' (docs/slurm.md): refused"'
    )
    return [
        'gpuledger_refuse() { echo "gpuledger: $1" >&2;'
        f" {{ printf '%s\\n' \"$1\" > {mark}; }} 2>/dev/null; exit 127; }}",
        "gpuledger_why=$(gpuledger_py=$(command -p -v python3) &&"
        " gpuledger_t=$(command -p -v timeout) && gpuledger_e=$(command -p -v env) &&"
        f' exec "$gpuledger_t" -s KILL {CHECK_WAIT_S} "$gpuledger_e" -i "$gpuledger_py" -I -S'
        f" -c {shlex.quote(code)} {shlex.join(command)} 2>/dev/null)",
        f'case $? in 0) ;; {REFUSED_EXIT}) gpuledger_refuse "$gpuledger_why" ;;'
        f" *) gpuledger_refuse {cannot} ;; esac",
    ]
