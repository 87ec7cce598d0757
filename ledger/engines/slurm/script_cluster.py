"""The batch script's check of the cluster it lands on (docs/ha.md, "slurmctld swapped during an
sbatch"; atk45ha F4): a run is submitted for the cluster the executor confirmed just before its
`sbatch` (`cluster.Watch.confirm`), whose identity (`cluster.identity`: `ClusterName`, the
controller hosts and port, `StateSaveLocation`) is written into its script. A controller swapped
within sbatch's own retries takes the run to another cluster; the executor finds it there right
after the `sbatch` (`Watch.landed`) and cancels it, unless it dies first (kill -9, a lost host):
then nobody tracks that copy, and it ran the job's command a second time there, out of the
ledger's reach. Now the script asks `scontrol show config` (any user may: it runs as the job's
owner) before anything of the job's, and a cluster other than the one it was submitted for ends
it with `OTHER_CLUSTER_EXIT`: no command, no mark of the run's (the run's directory may be the
very one its kept copy uses). When no controller answers that question, the name Slurm gives
the job (`SLURM_CLUSTER_NAME`) is compared alone. Pure: words out."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

OTHER_CLUSTER_EXIT = 123
"""The batch script's exit code when it finds itself on another cluster than the one it was
submitted for (`cluster_lines`): FAILED in Slurm, its command never run, no mark made."""
OTHER_CLUSTER_WHY = "Slurm started it on another cluster than the one it was submitted for"

_HERE = r"""gpuledger_here() {
  local out l k v n p s m i hs= c=0; local -a h=()
  out=$(SCONTROL show config 2>/dev/null) || return 1
  [[ $out == *ClusterName* ]] || return 1
  while IFS= read -r l; do
    [[ $l == *=* ]] || continue
    k=${l%%=*} v=${l#*=}
    k=${k#"${k%%[![:space:]]*}"}; k=${k%"${k##*[![:space:]]}"}
    v=${v#"${v%%[![:space:]]*}"}; v=${v%"${v##*[![:space:]]}"}
    case $k in
      ClusterName) [ -n "${n+x}" ] || n=$v ;;
      SlurmctldPort) [ -n "${p+x}" ] || p=$v ;;
      StateSaveLocation) [ -n "${s+x}" ] || s=$v ;;
      ControlMachine) [ -n "${m+x}" ] || m=$v ;;
      SlurmctldHost\[*\]) i=${k#*[}; i=${i%]}; [[ $i =~ ^[0-9]+$ ]] && h[10#$i]=$v ;;
    esac
  done <<< "$out"
  for v in "${h[@]}"; do ((c++)) && hs+=,; hs+=$v; done
  ((c)) || hs=${m-}
  gpuledger_cl="${n-?} at ${hs:-?} port ${p-?}" gpuledger_st=${s-?}
}"""
"""Sets `gpuledger_cl` and `gpuledger_st` as `cluster.identity` makes `slurm_cluster` and
`slurm_state` from the same `scontrol show config` text; fails when no controller answers."""


def cluster_lines(expected: Mapping[str, object] | None, scontrol: str = "scontrol") -> list[str]:
    """Pure: the batch script's lines, before anything of the job's, that end it with
    `OTHER_CLUSTER_EXIT` when the cluster whose controller answers on its node is not
    `expected` (`cluster.Watch.expected`: `slurm_cluster` and `slurm_state`), or, when none
    answers, when `SLURM_CLUSTER_NAME` is set and is another name; [] without an identity to
    compare (a cluster never read). `scontrol`: the one the executor runs (its path)."""
    if not expected:
        return []
    cluster = str(expected.get("slurm_cluster") or "")
    state = str(expected.get("slurm_state") or "")
    if not cluster or not state:
        return []
    name = cluster.split(" at ", 1)[0]
    said = shlex.quote(f"gpuledger: submitted for the Slurm cluster {cluster} ({state})")
    other = f"exit {OTHER_CLUSTER_EXIT}"
    return [
        _HERE.replace("SCONTROL", shlex.quote(scontrol)),
        "if gpuledger_here; then",
        f'  if [ "$gpuledger_cl" != {shlex.quote(cluster)} ] ||'
        f' [ "$gpuledger_st" != {shlex.quote(state)} ]; then',
        f'    echo {said}" but started on $gpuledger_cl ($gpuledger_st): not run" >&2; {other}',
        "  fi",
        'elif [ -n "${SLURM_CLUSTER_NAME+x}" ] &&'
        f' [ "$SLURM_CLUSTER_NAME" != {shlex.quote(name)} ]; then',
        f'  echo {said}" but started on $SLURM_CLUSTER_NAME: not run" >&2; {other}',
        "else",
        '  echo "gpuledger: no slurmctld answers scontrol show config: the cluster is checked by'
        ' its name alone" >&2',
        "fi",
        "unset -f gpuledger_here; unset gpuledger_cl gpuledger_st",
    ]
