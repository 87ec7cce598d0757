#!/bin/sh
# gpu-ledger's Slurm Epilog (slurm.conf `Epilog=`; docs/slurm.md, "Site requirement: the epilog").
#
# slurmd runs it as root on the node at every job's end and keeps the node COMPLETING (no next job
# on it) until it returns. It SIGKILLs every process left anywhere in the job's cgroup tree, its
# sub-cgroups too, then removes the emptied job directories. Slurm's own proctrack/cgroup signals
# only the step cgroups' own processes, and nothing sweeps at all when the job's slurmstepd and
# batch script were killed -9, so without this a child that created a sub-cgroup of its step
# (cgroup v1 chowns the step directory to the user) or a TERM-ignoring orphan of a killed script
# runs on while the next job gets its GPUs.
#
# Plain POSIX sh: it runs without the project's venv. Quick when the tree is already empty (a few
# globs). Always exits 0: an epilog that fails drains the node; what it could not kill it logs
# (stderr and syslog, tag gpuledger-epilog).
#   SLURM_JOB_ID       the job (set by slurmd)
#   GPULEDGER_EPILOG_BOUND  seconds to keep killing before giving up (default 60; slurmd passes
#                           none of its own environment: edit the default here)
#   GPULEDGER_EPILOG_CGROUP_ROOT  where the cgroup hierarchies are (default /sys/fs/cgroup; tests)

job="${SLURM_JOB_ID:-}"
bound="${GPULEDGER_EPILOG_BOUND:-60}"
root="${GPULEDGER_EPILOG_CGROUP_ROOT:-/sys/fs/cgroup}"

say() {
	echo "gpuledger-epilog: job $job: $*" >&2
	command -v logger >/dev/null 2>&1 && logger -t gpuledger-epilog -- "job $job: $*" 2>/dev/null
	return 0
}

case "$job" in
'' | *[!0-9]*) exit 0 ;; # not a job's epilog: nothing to do
esac
case "$bound" in
'' | *[!0-9]*) bound=60 ;;
esac

# the job's cgroup directories: cgroup v1, one per controller hierarchy
# (<root>/<controller>/slurm[_<node>]/uid_<uid>/job_<id>), and cgroup v2 (22.05:
# <root>[/unified]/system.slice/[<node>_]slurmstepd.scope/job_<id>)
groups() {
	for g in "$root"/*/slurm/uid_*/"job_$job" "$root"/*/slurm_*/uid_*/"job_$job" \
		"$root"/system.slice/*slurmstepd.scope/"job_$job" \
		"$root"/unified/system.slice/*slurmstepd.scope/"job_$job"; do
		[ -d "$g" ] && echo "$g"
	done
	return 0
}

# the pids of every process in the tree below the job's directories (sub-cgroups included)
members() {
	for g in $dirs; do
		find "$g" -name cgroup.procs -exec cat {} + 2>/dev/null
	done | sort -u
}

# a frozen v1 freezer group or v2 group holds its SIGKILLs until thawed
thaw() {
	for g in $dirs; do
		find "$g" -name freezer.state -exec sh -c 'for f; do echo THAWED >"$f"; done' sh {} + 2>/dev/null
		find "$g" -name cgroup.freeze -exec sh -c 'for f; do echo 0 >"$f"; done' sh {} + 2>/dev/null
		[ -e "$g/cgroup.kill" ] && echo 1 >"$g/cgroup.kill" 2>/dev/null # v2, kernel 5.14+
	done
	return 0
}

dirs=$(groups)
[ -n "$dirs" ] || exit 0
start=$(date +%s)
killed=0
left=$(members)
while [ -n "$left" ]; do
	if [ $(($(date +%s) - start)) -ge "$bound" ]; then
		say "$(echo "$left" | wc -l) processes still in its cgroups after ${bound} s, left alive:" \
			"$(echo "$left" | tr '\n' ' ')"
		break
	fi
	thaw
	for pid in $left; do
		kill -9 "$pid" 2>/dev/null && killed=$((killed + 1))
	done
	sleep 0.1
	left=$(members)
done
[ "$killed" -gt 0 ] && say "killed $killed processes left in its cgroups"

# the emptied directories, deepest first (a v1 job's are nobody's once its slurmstepd is gone)
for g in $dirs; do
	find "$g" -depth -type d -exec rmdir {} + 2>/dev/null
done
exit 0
