"""The batch script's end of the job's process tree (docs/slurm.md, "The job is its cgroup";
atk46-s F4): slurmstepd, once the batch script exits, SIGKILLs what is left of the step's cgroup
(proctrack/cgroup) and waits until it is empty, so the job's end is the end of its last process.
A slurmstepd killed with -9 does neither: the leader exited, the script wrote its end record,
and the command's children ran on in the step's cgroup beside the next job on its GPUs, while
Slurm listed the job RUNNING and the ledger recorded it ended by that record. So the script does
it itself, as the node agents' supervisor does (`supervise.end_of_tree`): once its command has
ended, every process left in its own step's cgroup (`/proc/self/cgroup`: Slurm's
`.../job_<id>/step_<step>`, the v1 freezer's, else the v2 group's) that it may signal gets
SIGTERM, and SIGKILL after the job's grace (at once from the script's own end on: its bound after
a SIGTERM, a mark it cannot write, an end record it did not write); it keeps beating while any
lives and writes its end record only once none does, saying how many were left and whether they
were killed. A script in no such cgroup (another proctrack) leaves them to Slurm, as before.
Pure: words out."""

from __future__ import annotations

import posixpath
import shlex

from ledger.engines.slurm.ends import BEAT_EVERY_S, UNBEATEN_S

REAPING_MARK = "reaping"
"""Beside the end record: `<code> <ended> <left> <kill_at>` (times in microseconds since the
epoch; code -1: none), written before the SIGTERM to what the command left (`reap_lines`): the
executor reports the job stopping from it (`ReportLeaderEnded`, as the node agents' supervisor's
`RUNDIR/reaping`). The job user's word, as every mark: it can only make that user's own job
read stopping, its SIGKILL kept within its grace (`launching.reaping_said`)."""

REAP_POLL_S = 0.2
"""How often the script looks at its cgroup while processes its command left live: the end it
records is at most this late."""

_GROUP = r"""gpuledger_group() {
  local h c p s m j="/job_${SLURM_JOB_ID-}/"
  gpuledger_cg=
  [ -n "${SLURM_JOB_ID-}" ] || return 1
  while IFS=: read -r h c p; do
    case $p in *"$j"step_*) ;; *) continue ;; esac
    s=${p#*"$j"}; s=${s%%/*}; p=${p%%"$j"*}$j$s
    case ",$c," in
      *,freezer,*) gpuledger_cg=/sys/fs/cgroup/freezer$p; return 0 ;;
      ,,) m=/sys/fs/cgroup; [ -e $m/cgroup.controllers ] || m=$m/unified; gpuledger_cg=$m$p ;;
    esac
  done < /proc/self/cgroup
  [ -n "$gpuledger_cg" ]
}"""
"""Sets `gpuledger_cg` to the directory of the script's own step cgroup (Slurm's naming, in
both cgroup versions: the job's id, then the step's; the v1 freezer is proctrack/cgroup's);
fails when it is in none (a node without proctrack/cgroup: nothing to sweep)."""

_LIVE = r"""gpuledger_live() {
  local f p l c
  gpuledger_l=()
  for f in "$gpuledger_cg"/**/cgroup.procs; do
    while read -r p; do
      [ "$p" = $$ ] && continue
      { read -r l < "/proc/$p/stat"; } 2>/dev/null || continue
      c=${l#*(}; c=${c%)*}; l=${l##*) }; set -- $l
      [ "$1" = Z ] || [ "$2" = $$ ] && continue
      [ "$c" = slurmstepd ] && { [ "$p" = "$PPID" ] || [ ! -O "/proc/$p" ]; } && continue
      kill -0 "$p" 2>/dev/null && gpuledger_l+=("$p")
    done 2>/dev/null < "$f"
  done
}"""
"""Sets `gpuledger_l` to the live processes of the step's cgroup and its groups below that the
script may signal: never itself or its own helpers (its children: a `sleep`), a zombie, or a
slurmstepd (a script run as root shares its v2 step group with one): its own parent, or one the
script's user does not own. A program of the job's user named `slurmstepd` is the job's: it was
skipped by its name alone, and one moved into a group of its own below the step lived on beside
the next job on its GPUs after its job `completed` (atk47-s F4)."""


_STEPS = r"""gpuledger_steps() {
  local d f p l q
  for d in "${gpuledger_cg%/*}"/step_*; do
    case ${d##*/} in step_batch | step_extern) continue ;; esac
    [ "$d" = "$gpuledger_cg" ] && continue
    for f in "$d"/**/cgroup.procs; do
      while read -r p; do
        { read -r l < "/proc/$p/stat"; } 2>/dev/null || continue
        l=${l##*) }; set -- $l
        { read -r q < "/proc/$2/stat"; } 2>/dev/null || continue
        q=${q#*(}; q=${q%)*}
        [ "$q" = slurmstepd ] || gpuledger_l+=("$p")
      done 2>/dev/null < "$f"
    done
  done
}"""
"""Adds to `gpuledger_l` the processes of the job's other steps on this node (its `srun` steps,
the cgroups beside the script's own: not the batch step, not the extern one) that are not their
tasks: Slurm signals a step's tasks alone (proctrack/cgroup: "inherited processes will only get
SIGKILL"), so a rank's children would get no SIGTERM at all."""

STEPS_LEFT = "steps-left"
"""Beside the end record, made before it (`steps_left_lines`): when the batch script ended, a step
of the job's on its node (an `srun` in the command) still had processes. Slurm's end of the job
ends them, its KillWait after the script's end, so the run ended then, not at the script's
record (atk60-slurm F2: recorded 10 s early). The job user's word: it can only make its own
run's end later (`stops.stopped_end`, bounded by Slurm's end of the job)."""

_STEPS_LEFT = r"""gpuledger_stepsleft() {
  local d f p
  shopt -s globstar nullglob
  gpuledger_group || return 1
  for d in "${gpuledger_cg%/*}"/step_*; do
    case ${d##*/} in step_batch | step_extern) continue ;; esac
    [ "$d" = "$gpuledger_cg" ] && continue
    for f in "$d"/**/cgroup.procs; do
      { read -r p < "$f"; } 2>/dev/null && [ -n "$p" ] && return 0
    done
  done
  return 1
}"""
"""Succeeds when another step of the job's on this node (not the batch step, not the extern
one) has a process: one the script's end leaves to Slurm's end of the job."""


def steps_left_lines(ended_file: str) -> list[str]:
    """Pure: the `STEPS_LEFT` mark, made beside `ended_file` when a step of the job's still has
    processes on the node as the script ends (`_STEPS_LEFT`)."""
    at = shlex.quote(posixpath.join(posixpath.dirname(ended_file), STEPS_LEFT))
    return [_STEPS_LEFT, f"gpuledger_stepsleft && {{ : > {at}; }} 2>/dev/null"]


_TERM_L = r"""gpuledger_terml() {
  local p l c
  for p in "${gpuledger_l[@]}"; do
    { read -r l < "/proc/$p/stat"; } 2>/dev/null || continue
    c=${l#*(}; c=${c%)*}
    case $c in srun | slurmstepd) ;; *) kill -TERM "$p" 2>/dev/null ;; esac
  done
}"""
"""SIGTERM to each of `gpuledger_l` but an `srun` (and a slurmstepd): srun answers a SIGTERM by
SIGKILLing its step's tasks at once ("forcing job termination"), so a rank it started would lose
its grace; its step's tasks get their SIGTERM from Slurm itself (atk58 F1)."""

_BELOW = r"""gpuledger_below() {
  local f l p q=" $1 " n=1
  gpuledger_l=()
  while [ "$n" = 1 ]; do
    n=0
    for f in /proc/[0-9]*/stat; do
      p=${f:6:-5}; case $q in *" $p "*) continue ;; esac
      { read -r l < "$f"; } 2>/dev/null || continue
      l=${l##*) }; set -- $l
      case $q in *" $2 "*) q="$q$p "; gpuledger_l+=("$p"); n=1 ;; esac
    done
  done
}"""
"""Sets `gpuledger_l` to the processes below the given one (a script in no step cgroup: another
proctrack, or a test's)."""

_PASS = r"""gpuledger_pass() (
  shopt -s globstar nullglob
  if gpuledger_group; then gpuledger_live; gpuledger_steps
  else gpuledger_below "$gpuledger_pid"; fi
  gpuledger_terml
)
gpuledger_others() {
  shopt -s globstar nullglob
  gpuledger_l=(); gpuledger_group && gpuledger_steps && gpuledger_terml
}
gpuledger_spread() {
  local n=${SLURM_JOB_NUM_NODES:-1} s g v
  gpuledger_spread_pids=()
  [ -n "${SLURM_JOB_ID-}" ] || return 0
  [ "${SLURM_HET_SIZE:-1}" -gt 1 ] 2>/dev/null || [ "$n" -gt 1 ] 2>/dev/null || return 0
  s=$(command -v srun) || return 0
  if [ "${SLURM_HET_SIZE:-1}" -gt 1 ] 2>/dev/null; then
    for ((g = 1; g < SLURM_HET_SIZE; g++)); do  # its cgroup is its component's job's
      v=SLURM_JOB_ID_HET_GROUP_$g; [ -n "${!v-}" ] || continue
      "$s" --jobid="$SLURM_JOB_ID" --het-group="$g" --overlap -Q -N1 --ntasks-per-node=1 \
        bash -c "SLURM_JOB_ID=${!v}; $1" < /dev/null > /dev/null 2>&1 &
      gpuledger_spread_pids+=($!)
    done
    return 0
  fi
  "$s" --jobid="$SLURM_JOB_ID" --overlap -Q -N $((n - 1)) --ntasks-per-node=1 \
    -x "${SLURMD_NODENAME-}" bash -c "$1" < /dev/null > /dev/null 2>&1 &
  gpuledger_spread_pids+=($!)
}
gpuledger_watch() {
  local f
  f="$(declare -f gpuledger_group gpuledger_steps gpuledger_terml gpuledger_others)"
  gpuledger_spread "$f; trap 'trap \"\" TERM; gpuledger_others' TERM;
    while :; do command -p sleep 60 & wait \$!; done"
  gpuledger_watchers=("${gpuledger_spread_pids[@]}")
}
gpuledger_far() {
  local p f
  if [ "${#gpuledger_watchers[@]}" -gt 0 ]; then
    for p in "${gpuledger_watchers[@]}"; do kill -0 "$p" 2>/dev/null || break; done
    kill -0 "$p" 2>/dev/null && return 0  # each passes it on its node (`gpuledger_watch`)
  fi
  f="$(declare -f gpuledger_group gpuledger_steps gpuledger_terml gpuledger_others)"
  gpuledger_spread "$f; gpuledger_others"
}"""
"""`gpuledger_pass`, the batch script's pass of a SIGTERM it gets (the executor's stop, which
signals the job's steps and the batch shell, never `srun`: `SlurmExecutor._signal`; or Slurm's
own termination, which signals the same): SIGTERM to every process of its step's cgroup but
itself, its own helpers and `srun` (`gpuledger_live`, `gpuledger_terml`), and to the processes of
the job's other steps on this node that are not their tasks (`gpuledger_steps`); in no cgroup,
to what runs below its command's child. `gpuledger_far` does the same on the job's other nodes
(`gpuledger_others`, in a step of its own: `srun --overlap`, in the background; in a
heterogeneous job, one per later component, `--het-group`, its cgroup named by the
component's own id, `SLURM_JOB_ID_HET_GROUP_<g>`, where the step's `SLURM_JOB_ID` is the
first's: the batch script's `SLURM_JOB_NUM_NODES` is its own component's, 1, atk59 F3), so
every process of a gang, a
rank's children on every node too, gets the SIGTERM and the grace. A step launched at the
SIGTERM cannot reach the other nodes when Slurm itself ends the job (a plain `scancel`, its
TIMEOUT: the job has ended before its steps are signalled, and slurmctld refuses the step,
"Slurm job N has expired"; atk59 F5: a rank's child on node 2 got only SIGKILL), so
`gpuledger_watch`, before the command starts, launches the same pass as a watcher on each
other node (`gpuledger_spread`: one task a node, `srun --overlap`), whose
task Slurm's own SIGTERM of the job's steps reaches on its node with the ranks'; it passes one
SIGTERM on there (`gpuledger_others`), and `gpuledger_far` launches the step at the SIGTERM
only where a watcher is not running (a cluster that refused it)."""


def pass_lines() -> list[str]:
    """Pure: the shell functions of a SIGTERM's pass (`_PASS`) and of the reaping (`reap_lines`)
    share: defined before the command starts, as a signal may come at any time after."""
    return [_GROUP, _LIVE, _STEPS, _TERM_L, _BELOW, _PASS]


def reap_lines(grace_s: int, ended_file: str, beating: bool) -> list[str]:
    """Pure: the shell function `gpuledger_reap`, run once the command's child has ended and
    before the end record: SIGTERM to every process the command left in the step's cgroup, then,
    every `REAP_POLL_S`, SIGKILL to those alive `grace_s` after it (or from the script's own
    end, `gpuledger_ends`, when that comes first; at once when a regular file is at `ended_file`
    that the script did not write, or, `beating`, when its heartbeat mark cannot be written for
    `UNBEATEN_S`), until none lives; with `beating` it beats every `BEAT_EVERY_S` meanwhile. It
    sets `gpuledger_left` (how many were left) and `gpuledger_killed` (1: SIGKILL was sent)."""
    end = shlex.quote(ended_file)
    forged = f" [ -f {end} ] && [ ! -L {end} ] && k=0;" if ended_file else ""
    beat = (
        f" [ $((EPOCHSECONDS - b)) -lt {BEAT_EVERY_S} ] || {{ b=$EPOCHSECONDS; gpuledger_beat ||"
        f" [ $((EPOCHSECONDS - gpuledger_ok)) -lt {UNBEATEN_S} ] || k=0; }};"
        if beating
        else ""
    )
    said = (
        'echo "gpuledger: its command ended leaving $gpuledger_left processes of its job:'
        f' SIGTERM, SIGKILL after {grace_s} s" >&2'
    )
    mark: list[str] = []
    if ended_file:  # what the executor reads (`REAPING_MARK`), before the SIGTERM
        code = shlex.quote(ended_file + ".code")
        at = posixpath.join(posixpath.dirname(ended_file), REAPING_MARK)
        there, part = shlex.quote(at), shlex.quote(at + ".part")
        mark = [
            f"  local c=; {{ read -r c < {code}; }} 2>/dev/null;"
            ' case $c in "" | *[!0-9]*) c=-1 ;; esac',
            f'  {{ echo "$c $t $gpuledger_left $k" > {part} &&'
            f" mv -f -- {part} {there}; }} 2>/dev/null",
        ]
    return [
        "gpuledger_reap() {",
        "  gpuledger_left=0 gpuledger_killed=0",
        "  gpuledger_group || return 0",
        "  shopt -s globstar nullglob",
        '  gpuledger_live; gpuledger_left=${#gpuledger_l[@]}; [ "$gpuledger_left" = 0 ] &&'
        " return 0",
        # times in microseconds (EPOCHREALTIME's digits: its point is the locale's)
        f"  local t=${{EPOCHREALTIME//[!0-9]/}} k b=$EPOCHSECONDS; k=$((t + {grace_s} * 1000000))",
        *mark,
        # once the script got a SIGTERM (a stop: the steps' tasks got theirs), `srun` gets none
        f'  {said}; if [ -n "${{gpuledger_termed-}}" ]; then gpuledger_terml;'
        ' else kill -TERM "${gpuledger_l[@]}" 2>/dev/null; fi',
        "  while :; do",
        '    [ -n "${gpuledger_ends-}" ] && [ $((gpuledger_ends * 1000000)) -lt "$k" ] &&'
        f" k=$((gpuledger_ends * 1000000));{forged}",
        f'    command -p sleep {REAP_POLL_S} & gpuledger_z=$!; wait "$gpuledger_z"',
        '    gpuledger_live; [ "${#gpuledger_l[@]}" = 0 ] && return 0',
        '    t=${EPOCHREALTIME//[!0-9]/}; [ "$t" -lt "$k" ] ||'
        ' { gpuledger_killed=1; kill -KILL "${gpuledger_l[@]}" 2>/dev/null; };' + beat,
        "  done",
        "}",
    ]


def reap_grace_s(after_term_s: int, own_end_s: int) -> int:
    """Pure: the job's grace, in whole seconds, from the script's two bounds: `after_term_s`
    (`ends.ends_after_term_s`: the grace, Slurm's KillWait and a second) less `own_end_s`
    (`ends.own_end_after_s`: KillWait and a second); KillWait is whole seconds."""
    return max(0, after_term_s - own_end_s)
