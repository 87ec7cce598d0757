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
# It acts on its own node alone (slurmd runs it on every node of the job): a one-host cluster of
# several slurmd (MULTIPLE_SLURMD, slurm_<node> directories, as the test clusters are) keeps each
# node's processes to its own epilog, as separate hosts would. And it sweeps the job owner's other
# jobs on the node for processes of this job: a process may make a sub-cgroup of a step of its
# owner's other job (also chowned to the user) and move there, out of every sweep of this job's
# own tree; it keeps this job's id in its environment (SLURM_JOB_ID), and is killed by it.
#
# Plain POSIX sh: it runs without the project's venv. Quick when the tree is already empty (a few
# globs). Always exits 0: an epilog that fails drains the node; what it could not kill it logs
# (stderr and syslog, tag gpuledger-epilog).
#   SLURM_JOB_ID       the job (set by slurmd)
#   SLURM_JOB_UID      its owner (set by slurmd): whose other jobs' cgroups are swept
#   SLURMD_NODENAME    this node (set by slurmd; else `hostname -s`): whose cgroup directories
#   GPULEDGER_EPILOG_BOUND  seconds to keep killing before giving up (default 60; slurmd passes
#                           none of its own environment: edit the default here)
#   GPULEDGER_EPILOG_CGROUP_ROOT  where the cgroup hierarchies are (default /sys/fs/cgroup; tests)

job="${SLURM_JOB_ID:-}"
owner="${SLURM_JOB_UID:-}"
node="${SLURMD_NODENAME:-$(hostname -s 2>/dev/null)}"
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

# this node's cgroup directories of job $1 (a glob: * for every job): cgroup v1, one per controller
# hierarchy (<root>/<controller>/slurm[_<node>]/uid_<uid>/job_<id>; uid $2, * for any), and cgroup
# v2 (22.05: <root>[/unified]/system.slice/[<node>_]slurmstepd.scope/job_<id>, no uid level)
groups() {
	for g in "$root"/*/slurm/uid_$2/job_$1 "$root"/*/"slurm_$node"/uid_$2/job_$1 \
		"$root"/system.slice/slurmstepd.scope/job_$1 \
		"$root"/system.slice/"${node}_slurmstepd.scope"/job_$1 \
		"$root"/unified/system.slice/slurmstepd.scope/job_$1 \
		"$root"/unified/system.slice/"${node}_slurmstepd.scope"/job_$1; do
		[ -d "$g" ] && echo "$g"
	done
	return 0
}

# the pids of every process in the tree below directories $1 (sub-cgroups included)
procs() {
	for g in $1; do
		find "$g" -name cgroup.procs -exec cat {} + 2>/dev/null
	done | sort -u
}

# the processes of this job that moved into its owner's other jobs on this node: in their cgroups,
# this job's id in their environment (a v2 job directory has no uid level: every job's is read)
strays() {
	case "$owner" in
	'' | *[!0-9]*) return 0 ;;
	esac
	for pid in $(procs "$(groups '*' "$owner" | grep -v "/job_$job\$")"); do
		tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx "SLURM_JOB_ID=$job" && echo "$pid"
	done
	return 0
}

# the v1 freezer groups users made below the steps of the owner's other jobs on this node (Slurm
# makes none there): frozen while this job's strays are looked for and killed, so a stray that
# keeps forking (each parent gone before its environment is read) cannot outrun the look (atk59b
# N1: one forking every 2-4 ms lived ~12 s beside the next job); thawed once they are killed. Other
# processes in them (the other job's own) are held for that moment only.
made() {
	case "$owner" in
	'' | *[!0-9]*) return 0 ;;
	esac
	for g in $(groups '*' "$owner" | grep -v "/job_$job\$" | grep "^$root/freezer/"); do
		find "$g" -mindepth 2 -type d 2>/dev/null
	done
	return 0
}
hold() { # FROZEN or THAWED: every group `made` found; FROZEN waits (1 s at most) until it is
	for d in $held; do
		echo "$1" >"$d/freezer.state" 2>/dev/null
	done
	[ "$1" = FROZEN ] || return 0
	for i in 1 2 3 4 5 6 7 8 9 10; do
		frozen=1
		for d in $held; do
			[ "$(cat "$d/freezer.state" 2>/dev/null)" = FREEZING ] && frozen=0
		done
		[ "$frozen" = 1 ] && break
		sleep 0.1
	done
	return 0
}
trap 'hold THAWED' EXIT
trap 'hold THAWED; exit 0' HUP INT TERM

# a frozen v1 freezer group or v2 group holds its SIGKILLs until thawed: this job's own, and the
# groups its strays ($far) sit in
thaw() {
	for g in $dirs; do
		find "$g" -name freezer.state -exec sh -c 'for f; do echo THAWED >"$f"; done' sh {} + 2>/dev/null
		find "$g" -name cgroup.freeze -exec sh -c 'for f; do echo 0 >"$f"; done' sh {} + 2>/dev/null
		[ -e "$g/cgroup.kill" ] && echo 1 >"$g/cgroup.kill" 2>/dev/null # v2, kernel 5.14+
	done
	for pid in $far; do
		for g in $(sed -n 's/^[0-9]*:freezer://p' "/proc/$pid/cgroup" 2>/dev/null); do
			[ -e "$root/freezer$g/freezer.state" ] && echo THAWED >"$root/freezer$g/freezer.state" 2>/dev/null
		done
		for g in $(sed -n 's/^0:://p' "/proc/$pid/cgroup" 2>/dev/null); do
			for f in "$root$g/cgroup.freeze" "$root/unified$g/cgroup.freeze"; do
				[ -e "$f" ] && echo 0 >"$f" 2>/dev/null
			done
		done
	done
	return 0
}

# everything to kill: every process of this job's own groups, and its strays (the groups they may
# hide in frozen first: `hold`)
look() {
	held=$(made)
	hold FROZEN
	far=$(strays)
	left=$(printf '%s\n%s\n' "$(procs "$dirs")" "$far" | grep . | sort -u)
}

dirs=$(groups "$job" "*")
# in milliseconds (whole seconds where `date` has no %N): whole seconds made a 1 s bound anything
# from 0 to 2 s, and one that ran out before the first round gave up with every process alive
ms() {
	t=$(date +%s%3N)
	case "$t" in
	'' | *[!0-9]*) echo $(($(date +%s) * 1000)) ;;
	*) echo "$t" ;;
	esac
}
start=$(ms)
killed=0
rounds=0
strayed=""
look
while [ -n "$left" ]; do
	if [ "$rounds" -gt 0 ] && [ $(($(ms) - start)) -ge $((bound * 1000)) ]; then
		say "$(echo "$left" | wc -l) processes still in its cgroups after ${bound} s, left alive:" \
			"$(echo "$left" | tr '\n' ' ')"
		break
	fi
	for pid in $left; do # killed while frozen: each dies once thawed, before it can fork again
		kill -9 "$pid" 2>/dev/null && killed=$((killed + 1))
	done
	thaw
	hold THAWED
	[ -n "$far" ] && strayed="$strayed $(echo "$far" | tr '\n' ' ')"
	rounds=$((rounds + 1))
	sleep 0.1
	look
done
hold THAWED
[ "$killed" -gt 0 ] && say "killed $killed processes left in its cgroups"
[ -n "$strayed" ] && say "of them, in its owner's other jobs' cgroups (this job's id in their environment):$strayed"

# the emptied directories, deepest first (a v1 job's are nobody's once its slurmstepd is gone)
for g in $dirs; do
	find "$g" -depth -type d -exec rmdir {} + 2>/dev/null
done
exit 0
