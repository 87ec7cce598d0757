"""The pure half of the Slurm executor: reading Slurm's words and writing sbatch arguments."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from ledger.core import budget
from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import Node, State
from ledger.cycle.executor import Exit, Launch, Orders
from ledger.cycle.record import node_command
from ledger.engines.slurm import (
    SbatchUser,
    SlurmExecutor,
    SlurmNode,
    batch_script,
    check_config,
    end_reason,
    exit_code,
    expand_hostlist,
    gpus_of,
    gres_indices,
    job_environment,
    node_changes,
    node_down,
    node_unavailable,
    parse_jobs,
    parse_nodes,
    parse_sacctmgr_shares,
    pinned_types,
    register_commands,
    sbatch_args,
    shares_toml,
    slurm_time,
    words,
)
from ledger.engines.slurm.launching import cannot_start
from ledger.engines.slurm.leaks import Leaks, leaked_gpus, unsure
from ledger.engines.slurm.shares import accounts_written
from ledger.engines.slurm.words import SlurmJob, partition_max_time, slurm_duration
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidCommand, NotAuthorised
from schemas.events import GpuSlot

LID = "0123abcd4567"
T0 = 1_000.0  # the org_state fixture's clock

RUNNING = (
    "JobId=3 JobName=gpuledger-3 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757"
    " Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=0"
    " Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:01"
    " TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-30T18:36:36"
    " StartTime=2026-11-30T18:36:36 EndTime=Unknown Partition=gpuledger NodeList=vm BatchHost=vm"
    " NumNodes=1 JOB_GRES=gpu:fake:2   Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:fake:2(IDX:0-1)"
    f" MinCPUsNode=1 Features=(null) Comment=gpuledger:{LID}:job=3:run=1  StdErr=/dev/null"
    " StdOut=/tmp/job-3.log Power= TresPerNode=gres:gpu:2"
)
TIMEOUT = (
    "JobId=9 JobName=gpuledger-4 UserId=alice(1000) JobState=TIMEOUT Reason=TimeLimit"
    " ExitCode=0:15 StartTime=2026-11-30T18:36:36 Partition=gpuledger NodeList=vm"
    f" Comment=gpuledger:{LID}:job=4:run=0 StdOut=/tmp/x"
)
FOREIGN = (
    "JobId=12 JobName=train UserId=bob(1001) JobState=PENDING Reason=Resources ExitCode=0:0"
    " StartTime=Unknown Partition=gpuledger NodeList= Comment=my run with spaces StdOut=/tmp/y"
)


def test_a_running_run_of_this_ledger_is_read_with_its_gpus() -> None:
    jobs = parse_jobs("\n".join([RUNNING, TIMEOUT, FOREIGN]))
    run, timed_out, foreign = jobs
    assert (run.slurm_id, run.state, run.started, run.holding) == ("3", "RUNNING", True, True)
    assert run.tag(LID) == (3, 1)
    assert run.tag("ffffffffffff") is None  # another ledger's run is foreign here
    assert dict(run.gpus) == {"vm": (0, 1)}
    assert (timed_out.ended, timed_out.exit_code, timed_out.tag(LID)) == (True, 143, (4, 0))
    assert end_reason(timed_out.state) == "time_limit"
    assert foreign.tag(LID) is None
    assert foreign.comment == "my run with spaces"
    assert (foreign.started, foreign.holding) == (False, False)


def test_a_name_that_does_not_match_the_comment_is_not_ours() -> None:
    (job,) = parse_jobs(RUNNING.replace("JobName=gpuledger-3", "JobName=gpuledger-7"))
    assert job.tag(LID) is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("vm", ["vm"]),
        ("n[1-3],gpu07", ["n1", "n2", "n3", "gpu07"]),
        ("n[08-10,12]", ["n08", "n09", "n10", "n12"]),
        ("(null)", []),
    ],
)
def test_hostlists_expand(text: str, want: list[str]) -> None:
    assert expand_hostlist(text) == want


@pytest.mark.parametrize(
    ("gres", "want"),
    [
        ("gpu:fake:2(IDX:0-1)", (0, 1)),
        ("gpu:h100:3(IDX:0,2-3)", (0, 2, 3)),
        ("gpu:1(IDX:5)", (5,)),
        ("gpu:fake:2", ()),
    ],
)
def test_gres_indices(gres: str, want: tuple[int, ...]) -> None:
    assert gres_indices(gres) == want


@pytest.mark.parametrize(
    ("gres", "want"),
    [
        ("gpu:h100:8(S:0-1)", (8, "h100")),
        ("gpu:4", (4, "gpu")),
        ("gpu:a100:2,gpu:a100:2", (4, "a100")),
        ("(null)", (0, "gpu")),
    ],
)
def test_node_gpus_from_gres(gres: str, want: tuple[int, str]) -> None:
    assert gpus_of(gres) == want


@pytest.mark.parametrize(
    ("text", "want"), [("0:0", 0), ("3:0", 3), ("0:9", 137), ("1:15", 1), ("x", 0)]
)
def test_exit_codes(text: str, want: int) -> None:
    assert exit_code(text) == want


@pytest.mark.parametrize(
    ("state", "want"),
    [
        ("COMPLETED", "exited"),
        ("FAILED", "exited"),
        ("TIMEOUT", "time_limit"),
        ("NODE_FAIL", "node_failure"),
        ("CANCELLED", "cancelled"),
        ("CANCELLED+", "cancelled"),
        ("OUT_OF_MEMORY", "out_of_memory"),
    ],
)
def test_end_reasons(state: str, want: str) -> None:
    assert end_reason(state) == want


NODES = "\n".join(
    [
        "NodeName=vm Arch=x86_64 CoresPerSocket=1 Gres=gpu:fake:4 NodeAddr=127.0.0.1"
        " State=IDLE+DRAIN Partitions=gpuledger Reason=disk swap [root@2026-11-30T18:00:00]",
        "NodeName=g2 Gres=gpu:h100:8(S:0-1) State=MIXED Partitions=other,gpuledger",
        "NodeName=cpu1 Gres=(null) State=IDLE Partitions=gpuledger",
        "NodeName=g3 Gres=gpu:h100:8 State=DOWN* Partitions=other",
    ]
)


def test_nodes_of_the_partition_with_gpus() -> None:
    nodes = parse_nodes(NODES, "gpuledger")
    assert [(n.name, n.gpus, n.gpu_type, n.unavailable) for n in nodes] == [
        ("g2", 8, "h100", False),
        ("vm", 4, "fake", True),
    ]
    assert nodes[1].reason == "disk swap [root@2026-11-30T18:00:00]"


def node(name: str, state: str = "active", reason: str = "") -> Node:
    return Node(name=name, cluster="c", gpu_type="h100", gpus=8, state=state, drain_reason=reason)  # type: ignore[arg-type]


def test_slurm_drains_and_returns_follow_into_the_ledger() -> None:
    slurm = parse_nodes(NODES, "gpuledger")
    ledger = {"vm": node("vm"), "g2": node("g2", "drained", "slurm: DOWN")}
    cmds = [node_command(ch, "@executor") for ch in node_changes(slurm, ledger)]
    assert cmds == [
        c.ReturnNode(actor="@executor", node="g2"),
        c.DrainNode(
            actor="@executor",
            node="vm",
            reason="slurm: IDLE+DRAIN (disk swap [root@2026-11-30T18:00:00])",
        ),
    ]
    # a drain an admin made in the ledger is not Slurm's to undo
    assert node_changes(slurm, {"g2": node("g2", "draining", "maintenance")}) == []


@pytest.mark.parametrize(
    ("state", "want"),
    [
        ("DOWN", True),
        ("DOWN*", True),
        ("DOWN+DRAIN", True),
        ("DOWN+NOT_RESPONDING", True),
        ("IDLE", False),
        ("IDLE*", False),
        ("MIXED+NOT_RESPONDING", False),
        ("IDLE+DRAIN", False),
        ("FAIL", False),
        ("ALLOCATED+FAIL", False),
    ],
)
def test_only_a_node_slurm_gave_up_is_down(state: str, want: bool) -> None:
    assert node_down(state) is want
    assert node_unavailable(state) is (state not in ("IDLE", "IDLE*", "MIXED+NOT_RESPONDING"))


def lost(name: str, reason: str) -> Node:
    return Node(name=name, cluster="c", gpu_type="h100", gpus=8, state="lost", lost_reason=reason)


def follow(slurm_states: dict[str, str], ledger: dict[str, Node]) -> list[c.AnyCommand]:
    text = "\n".join(
        f"NodeName={n} Gres=gpu:h100:8 State={st} Partitions=p Reason=psu"
        for n, st in slurm_states.items()
    )
    changes = node_changes(parse_nodes(text, "p"), ledger)
    return [node_command(ch, "@x") for ch in changes if ch.change != "unplace"]


@pytest.mark.parametrize(
    ("slurm_state", "have", "want"),
    [
        ("DOWN", node("g"), [c.MarkNodeLost(actor="@x", node="g", reason="slurm: DOWN (psu)")]),
        (
            "DOWN*",
            node("g", "drained", "slurm: IDLE* (psu)"),
            [c.MarkNodeLost(actor="@x", node="g", reason="slurm: DOWN* (psu)")],
        ),
        (
            "DOWN",
            node("g", "draining", "maintenance"),
            [c.MarkNodeLost(actor="@x", node="g", reason="slurm: DOWN (psu)")],
        ),
        ("DOWN", lost("g", "slurm: DOWN (psu)"), []),
        ("IDLE", lost("g", "slurm: DOWN (psu)"), [c.ReturnNode(actor="@x", node="g")]),
        ("IDLE+DRAIN", lost("g", "slurm: DOWN (psu)"), [c.ReturnNode(actor="@x", node="g")]),
        ("IDLE", lost("g", "power cut"), []),
        ("IDLE*", node("g"), []),
        ("FAIL", node("g"), [c.DrainNode(actor="@x", node="g", reason="slurm: FAIL (psu)")]),
        ("MIXED", node("g", "drained", "slurm: FAIL (psu)"), [c.ReturnNode(actor="@x", node="g")]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_node_slurm_marks_down_is_lost_in_the_ledger_and_returns_with_it(
    slurm_state: str, have: Node, want: list[c.AnyCommand]
) -> None:
    assert follow({"g": slurm_state}, {"g": have}) == want


def test_unknown_partition_nodes_are_registered_once() -> None:
    slurm = parse_nodes(NODES, "gpuledger")
    assert register_commands(slurm, {"vm": node("vm")}, "root") == [
        c.RegisterNode(actor="root", node="g2", gpus=8, gpu_type="h100")
    ]


GOOD = (
    "PriorityType            = priority/basic\nPreemptType             = preempt/none\n"
    "ProctrackType           = proctrack/cgroup\n"
    "Epilog                  = /etc/slurm/gpuledger-epilog.sh\n"
)
PART = "PartitionName=gpuledger AllowGroups=ALL State=UP PreemptMode=OFF Nodes=vm"


@pytest.mark.parametrize(
    ("config", "want"),
    [
        (GOOD + PART, []),
        (GOOD, ["Slurm has no partition 'gpuledger'"]),
        # an admin's pause is no refusal: the executor starts with it paused (atk60-slurm F1)
        (GOOD + PART.replace("State=UP", "State=DOWN"), []),
        (GOOD + PART.replace("State=UP", "State=INACTIVE"), []),
        (
            GOOD.replace("priority/basic", "priority/multifactor") + PART,
            ["PriorityType is priority/multifactor"],
        ),
        (
            GOOD.replace("preempt/none", "preempt/partition_prio")
            + PART.replace("PreemptMode=OFF", "PreemptMode=REQUEUE"),
            ["PreemptType is preempt/partition_prio"],
        ),
        (GOOD.replace("preempt/none", "preempt/qos") + PART, []),
        (
            GOOD.replace("proctrack/cgroup", "proctrack/linuxproc") + PART,
            ["ProctrackType is proctrack/linuxproc: Slurm loses"],
        ),
        (
            GOOD.replace("proctrack/cgroup", "proctrack/pgid") + PART,
            ["ProctrackType is proctrack/pgid"],
        ),
    ],
)
def test_partition_settings_that_would_overrule_the_ledger(config: str, want: list[str]) -> None:
    problems = check_config(config, "gpuledger")
    assert len(problems) == len(want)
    for p, w in zip(problems, want, strict=True):
        assert p.startswith(w)


ALICE = SbatchUser(uid=1001, gid=1001, name="alice", home="/home/alice", shell="/bin/bash")


def test_untracked_process_tracking_is_accepted_only_when_asked() -> None:
    linuxproc = GOOD.replace("proctrack/cgroup", "proctrack/linuxproc") + PART
    assert check_config(linuxproc, "gpuledger", untracked_ok=True) == []
    assert len(check_config(linuxproc, "gpuledger")) == 1


ALICE = SbatchUser(uid=1001, gid=1001, name="alice", home="/home/alice", shell="/bin/bash")


def launch(*slots: GpuSlot, time_limit_s: int | None = None) -> Launch:
    return Launch(5, slots, ("python", "train.py"), None, "alice", "ai2/olmo", 2, time_limit_s)


def test_sbatch_names_the_nodes_the_gpus_per_node_the_time_and_the_user() -> None:
    job = launch(
        GpuSlot(node="n1", gpu_indices=(0, 1, 2, 3)),
        GpuSlot(node="n2", gpu_indices=(0, 1, 2, 3)),
        time_limit_s=90,
    )
    args = sbatch_args(job, "gpu", Path("/logs/job-5.log"), ALICE, LID)
    assert args[:5] == [
        "--job-name=gpuledger-5",
        f"--comment=gpuledger:{LID}:job=5:run=2",
        "--output=/logs/job-5.log",
        "--open-mode=append",
        "--no-requeue",
    ]
    # Slurm counts whole minutes; its limit is a backstop past the limit (the executor stops
    # the run itself) and a minute more (atk33 F7)
    assert "--time=3" in args
    assert "--uid=1001" in args and "--gid=1001" in args  # F1: the user's primary group
    assert "--chdir=/home/alice" in args  # no working directory given: the user's home
    assert args[-4:] == ["--partition=gpu", "--nodes=2", "--nodelist=n1,n2", "--gres=gpu:4"]
    assert ":" not in args


def test_a_gang_with_a_smaller_last_node_is_one_heterogeneous_job() -> None:
    job = launch(GpuSlot(node="n1", gpu_indices=(0, 1, 2, 3)), GpuSlot(node="n2", gpu_indices=(0,)))
    args = sbatch_args(job, "gpu", Path("/l"), SbatchUser(), LID)
    split = args.index(":")
    assert args[split - 2 :] == ["--nodelist=n1", "--gres=gpu:4", ":", "--partition=gpu",
                                 "--nodes=1", "--nodelist=n2", "--gres=gpu:1"]  # fmt: skip
    assert not any(a.startswith(("--uid", "--gid", "--chdir")) for a in args)
    assert [a for a in args if a.startswith("--time")] == ["--time=UNLIMITED"]  # no limit (F3)
    assert args.index("--time=UNLIMITED") < split  # the job's, once


def test_the_batch_script_sets_the_ledgers_variables_and_execs_the_command() -> None:
    job = launch(GpuSlot(node="n1", gpu_indices=(0,)), GpuSlot(node="n2", gpu_indices=(0,)))
    job = dataclasses.replace(job, command=("sh", "-c", "echo $X; exit 3"))
    assert batch_script(job).splitlines() == [
        "#!/bin/bash",
        "umask 0022",
        "export PATH=/usr/local/bin:/usr/bin:/bin",
        "export GPULEDGER_JOB_ID=5",
        "export GPULEDGER_RUN=2",
        "export GPULEDGER_LAUNCH=3",
        "export GPULEDGER_USER=alice",
        "export GPULEDGER_ACCOUNT=ai2/olmo",
        "export GPULEDGER_NODES=n1,n2",
        "export GPULEDGER_NODELIST=n1,n2",
        "exec sh -c 'echo $X; exit 3'",
    ]
    assert batch_script(dataclasses.replace(job, command=())).endswith("\nexec true\n")
    assert batch_script(job, umask=0o027).splitlines()[1] == "umask 0027"


@pytest.mark.parametrize(
    ("command", "want", "note"),
    [
        ("no-such", "command -v -- no-such >/dev/null 2>&1 || { echo \"gpuledger: cannot start "
                    "\"no-such\": not found in PATH\" >&2;{ : > /r/cs; } 2>/dev/null; exit 127; }",
         "cannot start no-such: not found in PATH"),
        ("./a b", "[ -f './a b' ] && [ -x './a b' ] || { echo \"gpuledger: cannot start "
                  "\"'./a b'\": no such executable file\" >&2;{ : > /r/cs; } 2>/dev/null; "
                  "exit 127; }", "cannot start ./a b: no such executable file"),
    ],
)  # fmt: skip
def test_a_command_that_cannot_be_started_leaves_its_mark_before_the_launch_mark(
    command: str, want: str, note: str
) -> None:
    """atk33 F5: the script checks its command as the node agents' supervisor does, and ends
    with the `cannot-start` mark before the `launched` one."""
    job = dataclasses.replace(launch(GpuSlot(node="n1", gpu_indices=(0,))), command=(command,))
    lines = batch_script(job, launched_file="/r/l", cannot_start_file="/r/cs").splitlines()
    assert lines[-3:] == [want, "{ : > /r/l; } 2>/dev/null", f"exec {shlex.quote(command)}"]
    assert cannot_start(job) == note


def test_the_job_gets_its_submitted_world_never_the_services() -> None:
    """F1/F2: the submitted environment and the user's identity; Slurm's own variables and
    the ledger's tokens never come from the submission; an array task gets SLURM_ARRAY_*;
    sbatch is asked for the working directory and the output files, `%` kept literal."""
    job = dataclasses.replace(
        launch(GpuSlot(node="n1", gpu_indices=(0,))),
        env=(("MY_VAR", "it's 7"), ("HOME", "/root"), ("SLURM_JOB_ID", "99"),
             ("CUDA_VISIBLE_DEVICES", "0,1,2"), ("GPULEDGER_JOB_TOKEN", "glt_x"),
             ("BAD;NAME", "x")),
        workdir="/home/alice/proj 1", stdout="/home/alice/proj 1/out-5%.log",
        stderr="/home/alice/e.log", array_job_id=4, array_task_id=1,
    )  # fmt: skip
    env = job_environment(job, ALICE)
    assert env["MY_VAR"] == "it's 7" and env["HOME"] == "/home/alice"
    assert (env["USER"], env["LOGNAME"], env["SHELL"]) == ("alice", "alice", "/bin/bash")
    assert (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) == ("4", "1")
    assert (env["GPULEDGER_ARRAY_JOB_ID"], env["GPULEDGER_ARRAY_TASK_ID"]) == ("4", "1")
    assert "SLURM_JOB_ID" not in env and "CUDA_VISIBLE_DEVICES" not in env
    assert "GPULEDGER_JOB_TOKEN" not in env and "BAD;NAME" not in env
    # N8 of the re-test: sbatch runs in the service's cwd, so Slurm's own would name that
    assert env["SLURM_SUBMIT_DIR"] == "/home/alice/proj 1"
    home = job_environment(dataclasses.replace(job, workdir=""), ALICE)
    assert home["SLURM_SUBMIT_DIR"] == "/home/alice"  # no directory: it starts in the home
    script = batch_script(job, ALICE)
    assert "export MY_VAR='it'\"'\"'s 7'" in script
    assert "cd -- '/home/alice/proj 1' || {" in script
    args = sbatch_args(job, "gpu", job.stdout, ALICE, LID, None, job.stderr)
    assert "--output=/home/alice/proj 1/out-5%%.log" in args
    assert "--error=/home/alice/e.log" in args and "--chdir=/home/alice/proj 1" in args


SACCTMGR = """\
root|||1
root||root|1
ai2|root||100
olmo|ai2||60
olmo||alice|2
olmo||bob|1
tulu|ai2||parent
tulu||dan|1
"""


def test_sacctmgr_shares_parse_and_become_a_budget_file() -> None:
    rows, parents, duplicates, inherit, orphans, left_out = parse_sacctmgr_shares(SACCTMGR)
    assert orphans == {} and left_out == ["root/root"]  # Slurm's own root user: named
    assert rows == [
        ("root", "", 1),
        ("ai2", "", 100),
        ("olmo", "", 60),
        ("olmo", "alice", 2),
        ("olmo", "bob", 1),
        ("tulu", "", 100),  # `parent`: its parent's (ai2's) share
        ("tulu", "dan", 1),
    ]
    assert parents == {"ai2": "root", "olmo": "ai2", "tulu": "ai2"} and duplicates == {}
    assert inherit == []
    toml = shares_toml(rows, parents)
    plan = budget.parse(toml.encode())
    assert {
        p: (a.kind, a.shares, a.members, a.member_shares) for p, a in plan.accounts.items()
    } == {
        "ai2": ("program", 100, None, {}),
        "ai2/olmo": ("project", 60, ["alice", "bob"], {"alice": 2}),
        "ai2/tulu": ("project", 100, ["dan"], {}),
    }
    _applies(toml)


def _applies(toml: str) -> State:
    """The state after `budget apply` of `toml` on a fresh ledger (admin root)."""
    ids = (lambda n: lambda: f"b{next(n)}")(itertools.count())
    state = State()
    for ev in decide(state, c.InitLedger(actor="root", admin="root"), 0.0, ids):
        evolve(state, ev)
    for change in budget.plan(state, budget.parse(toml.encode()), "root"):
        for ev in decide(state, change.command, 0.0, ids):
            evolve(state, ev)
    return state


def test_what_import_shares_writes_budget_apply_takes() -> None:
    """A top-level account with users (a project here) sits under Slurm's root as a program;
    users with `parent` shares (none of their own in Slurm: they compete as their account) are
    members with the default share, 1, never the account's share as a weight against its other
    users (F15: bob got 40 to alice's 10); duplicates are reported and the first share kept;
    names TOML would read as dotted keys are quoted."""
    text = """\
root|||5
physics|root||10
physics||alice|3
physics||alice|7
physics||b.smith|parent
chem|root||parent
chem||carol|1
chem|root||20
"""
    rows, parents, duplicates, inherit, _, _ = parse_sacctmgr_shares(text)
    assert duplicates == {"physics/alice": [3, 7], "chem": [-1, 20]}
    assert inherit == ["physics/b.smith"]
    state = _applies(shares_toml(rows, parents))
    tree = {p: (a.kind, a.shares) for p, a in state.accounts.items() if a.open}
    assert tree == {
        "root": ("program", 5),
        "root/physics": ("project", 10),
        "root/physics/alice": ("user", 3),
        "root/physics/b.smith": ("user", 1),  # `parent`: the default, not physics's 10
        "root/chem": ("project", 5),  # its first row said `parent`: root's
        "root/chem/carol": ("user", 1),
    }
    assert state.members == {"root/physics": {"alice", "b.smith"}, "root/chem": {"carol"}}


def test_import_shares_refuses_a_name_budget_apply_would_and_counts_what_it_writes() -> None:
    """F15: an account named `a b` is one error at import (budget apply would refuse the file
    it wrote); the count printed is the accounts written, Slurm's root among them."""
    with pytest.raises(InvalidCommand, match="line 2: account name 'a b' cannot be a ledger"):
        parse_sacctmgr_shares("root|||1\na b|root||1\n")
    rows, parents, *_ = parse_sacctmgr_shares("root|||1\nphysics|root||4\nphysics||al|1\n")
    toml = shares_toml(rows, parents)
    assert accounts_written(toml) == 2 == toml.count("[accounts.")  # root kept, and physics


ROOTS = "root/root"
"""The project of the users of Slurm's root account (a path of its own, not a machine's home)."""


def test_users_of_slurms_root_are_members_and_an_unknown_parent_is_the_top() -> None:
    """atk46-23 F6: `root||alice|3` vanished from the import with no word (alice then in no
    account: her jobs refused), and an account whose parent is in no line was written under
    that parent, a file `budget apply` refused (`unknown account 'nope'`). Root's users are
    members of the project root/root; the orphan sits at the top; both are named, and Slurm's
    own `root||root` is named as left out."""
    text = (
        "root|||1\nroot||root|1\nroot||alice|3\nroot||al2|parent\nphysics|root||2\nphysics||bob|1\n"
    )
    imp = parse_sacctmgr_shares(text)
    assert imp.left_out == ["root/root"] and imp.orphans == {}
    state = _applies(shares_toml(imp.rows, imp.parents))
    tree = {p: (a.kind, a.shares) for p, a in state.accounts.items() if a.open}
    assert tree == {
        "root": ("program", 1),
        "root/root": ("project", 4),  # alice's 3 and al2's default 1
        f"{ROOTS}/al2": ("user", 1),
        f"{ROOTS}/alice": ("user", 3),
        "root/physics": ("project", 2),
        "root/physics/bob": ("user", 1),
    }
    imp = parse_sacctmgr_shares("orphan|nope||1\norphan||u2|1\nsub|orphan||4\n")
    assert imp.orphans == {"orphan": "nope"} and imp.left_out == []
    state = _applies(shares_toml(imp.rows, imp.parents))
    tree = {p: (a.kind, a.shares) for p, a in state.accounts.items() if a.open}
    assert tree == {
        "root": ("program", 1),
        "root/orphan": ("project", 1),
        "root/orphan/u2": ("user", 1),
        "root/orphan/sub": ("project", 4),
    }
    imp = parse_sacctmgr_shares("lab|gone||3\nlab2|lab||1\nlab2||x|1\n")  # no users at the top
    assert imp.orphans == {"lab": "gone"}
    state = _applies(shares_toml(imp.rows, imp.parents))
    assert {p for p, a in state.accounts.items() if a.open} == {"lab", "lab/lab2", "lab/lab2/x"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a|b\n", "sacctmgr line 1 has 2 fields, not 4: 'a|b'"),
        ("acct|root||lots\n", "sacctmgr line 1: share 'lots' is not a whole number"),
    ],
)
def test_bad_sacctmgr_output_is_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(InvalidCommand) as err:
        parse_sacctmgr_shares(text)
    assert err.value.message == message


def run(state: State, cmd: c.AnyCommand, ids: Callable[[], str]) -> list[e.AnyEvent]:
    events = decide(state, cmd, T0, ids)
    for ev in events:
        evolve(state, ev)
    return events


def test_an_engine_run_is_linked_at_its_start_and_its_ending_recorded(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    run(
        org_state,
        c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60),
        counter_ids,
    )
    slots = (GpuSlot(node="n1", gpu_indices=(0, 1)),)
    placement = c.Placement(job_id=1, slots=slots)
    decision = c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
        cycle_id="c1", based_on=0, policy_version="fifo-1", placements=(placement,),
    ))  # fmt: skip
    run(org_state, decision, counter_ids)
    started = run(
        org_state,
        c.StartJob(actor="@executor", job_id=1, engine="slurm", engine_job_id="41", run=0),
        counter_ids,
    )
    assert [type(ev) for ev in started] == [e.JobStarted, e.JobEngineLinked]
    assert started[1] == e.JobEngineLinked(
        event_id=started[1].event_id,
        at=T0,
        actor="@executor",
        job_id=1,
        engine="slurm",
        engine_job_id="41",
        gpus=slots,  # the engine named none: the placement's, which it was asked for
    )
    ended = run(
        org_state,
        c.FinishJob(actor="@executor", job_id=1, exit_code=143, engine="slurm",
                    engine_job_id="41", reason="time_limit", engine_state="TIMEOUT"),
        counter_ids,
    )  # fmt: skip
    assert [type(ev) for ev in ended] == [e.JobFinished, e.JobEngineEnded]
    assert isinstance(ended[1], e.JobEngineEnded)
    assert (ended[1].reason, ended[1].engine_state, ended[1].exit_code) == (
        "time_limit",
        "TIMEOUT",
        143,
    )
    assert org_state.jobs[1].outcome == "failed" and not org_state.holders


def test_engines_without_run_ids_record_only_the_start_and_the_finish(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    run(
        org_state,
        c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=60),
        counter_ids,
    )
    placement = c.Placement(job_id=1, slots=(GpuSlot(node="n1", gpu_indices=(0,)),))
    decision = c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
        cycle_id="c1", based_on=0, policy_version="fifo-1", placements=(placement,),
    ))  # fmt: skip
    run(org_state, decision, counter_ids)
    assert [
        type(ev) for ev in run(org_state, c.StartJob(actor="@executor", job_id=1), counter_ids)
    ] == [e.JobStarted]
    done = run(org_state, c.FinishJob(actor="@executor", job_id=1, exit_code=0), counter_ids)
    assert [type(ev) for ev in done] == [e.JobFinished]


def test_an_engine_may_drain_and_return_a_node_but_a_user_may_not(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    drained = run(
        org_state, c.DrainNode(actor="@executor", node="a1", reason="slurm: DOWN"), counter_ids
    )
    assert [type(ev) for ev in drained] == [e.NodeDrainRequested, e.NodeDrained]
    run(org_state, c.ReturnNode(actor="@executor", node="a1"), counter_ids)
    assert org_state.nodes["a1"].state == "active"
    with pytest.raises(NotAuthorised):
        decide(org_state, c.DrainNode(actor="alice", node="a1", reason="x"), T0, counter_ids)


class _Reads(SlurmExecutor):
    """The executor over a scripted sequence of `scontrol show job` answers (no Slurm)."""

    def __init__(self, answers: list[str]) -> None:
        super().__init__("gpuledger", LID, Path("/nonexistent"), vanish_after_s=30.0)
        self._accounting = False
        self.answers = answers

    def refresh(self) -> bool:
        self._view = {j.slurm_id: j for j in parse_jobs(self.answers.pop(0))}
        return True

    def nodes(self) -> list[SlurmNode]:
        return []


def test_a_run_missing_from_a_few_reads_is_kept_and_only_a_lasting_absence_is_lost() -> None:
    """A controller that has just restarted may answer before it lists every job: the run is
    declared lost only once it has been missing from every read for `vanish_after_s`."""
    slurm = _Reads([RUNNING, "", "", RUNNING, "", "", ""])

    def exits(now: float) -> tuple[Exit, ...]:
        return slurm.observe(now, {}).exits

    assert slurm.adopt({3: 1}, now=0.0) == {3}
    assert exits(now=1.0) == () and exits(now=20.0) == ()  # missing for 19 s
    assert exits(now=25.0) == ()  # listed again: the clock restarts
    assert exits(now=26.0) == ()
    assert slurm.observe(now=55.0, nodes={}).running == {3}
    seen = slurm.observe(now=56.0, nodes={})  # missing from every read for 30 s
    (gone,) = seen.exits
    assert (gone.job_id, gone.reason, gone.exit_code) == (3, "lost", -1)
    assert seen.running == set()


@pytest.mark.parametrize(
    ("gres", "want"),
    [
        ("gpu:fake_0:1,gpu:fake_1:1,gpu:fake_2:1", ("fake_0", "fake_1", "fake_2")),
        ("gpu:h100_1:1(S:0),gpu:h100_0:1(S:1)", ("h100_0", "h100_1")),
        ("gpu:fake:4", ()),  # one type for all: not pinned
        ("gpu:fake_0:2", ()),  # two GPUs of one type
        ("gpu:fake_0:1,gpu:fake_2:1", ()),  # an index missing
        ("gpu:fake_0:1,gpu:other_0:1", ()),  # an index twice
        ("", ()),
    ],
)
def test_pinned_gpus_are_one_gres_type_per_index(gres: str, want: tuple[str, ...]) -> None:
    assert pinned_types(gres) == want


def test_a_pinned_node_counts_its_gpus_under_the_type_before_the_index() -> None:
    assert gpus_of("gpu:fake_0:1,gpu:fake_1:1,gpu:fake_2:1") == (3, "fake")
    assert gpus_of("gpu:a100_80g:2") == (2, "a100_80g")


def test_on_pinned_nodes_sbatch_asks_for_exactly_the_ledgers_gpus() -> None:
    pinned = {"n1": ("h_0", "h_1", "h_2", "h_3"), "n2": ("h_0", "h_1", "h_2", "h_3")}
    one = launch(GpuSlot(node="n1", gpu_indices=(3, 1)))
    assert (
        sbatch_args(one, "gpu", Path("/l"), SbatchUser(), LID, pinned)[-1]
        == "--gres=gpu:h_1:1,gpu:h_3:1"
    )
    same = launch(GpuSlot(node="n1", gpu_indices=(0, 2)), GpuSlot(node="n2", gpu_indices=(0, 2)))
    args = sbatch_args(same, "gpu", Path("/l"), SbatchUser(), LID, pinned)
    assert ":" not in args and args[-1] == "--gres=gpu:h_0:1,gpu:h_2:1"
    other = launch(GpuSlot(node="n1", gpu_indices=(0, 2)), GpuSlot(node="n2", gpu_indices=(1, 3)))
    args = sbatch_args(other, "gpu", Path("/l"), SbatchUser(), LID, pinned)
    split = args.index(":")  # the nodes need different GRES: one component each
    assert (
        args[split - 1] == "--gres=gpu:h_0:1,gpu:h_2:1" and args[-1] == "--gres=gpu:h_1:1,gpu:h_3:1"
    )
    unpinned = launch(GpuSlot(node="n3", gpu_indices=(5, 6)))
    assert sbatch_args(unpinned, "gpu", Path("/l"), SbatchUser(), LID, pinned)[-1] == "--gres=gpu:2"


def test_slurm_times_are_read_in_local_time_and_unknown_is_none() -> None:
    import time

    at = slurm_time("2026-12-01T18:20:05")
    assert at is not None and time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at)) == (
        "2026-12-01T18:20:05"
    )
    assert slurm_time("Unknown") is None and slurm_time("None") is None and slurm_time("") is None


@pytest.mark.parametrize(
    ("state", "want"),
    [("IDLE*", True), ("MIXED+NOT_RESPONDING", True), ("ALLOCATED", False), ("IDLE+DRAIN", False),
     ("DOWN*", True)],
)  # fmt: skip
def test_a_node_whose_slurmd_does_not_respond_is_unobserved(state: str, want: bool) -> None:
    from ledger.engines.slurm.words import node_unresponsive

    assert node_unresponsive(state) is want


def test_while_slurmctld_does_not_answer_every_node_is_unobserved_and_it_is_asked_rarely(
    tmp_path: Path,
) -> None:
    from ledger.engines.slurm.executor import SlurmExecutor as Executor
    from schemas.errors import EngineError

    calls: list[list[str]] = []
    answering = False

    def run(args: list[str], stdin: str | None = None, env: object = None) -> str:
        calls.append(args)
        if not answering:
            raise EngineError("scontrol: Unable to contact slurm controller")
        return NODES if args[0] == "scontrol" and args[-2:] == ["show", "node"] else ""

    ex = Executor("gpuledger", LID, tmp_path)
    ex._run = run  # type: ignore[method-assign]
    ledger_nodes = {"vm": node("vm"), "g2": node("g2"), "old": node("old", "removed")}
    seen = ex.observe(100.0, ledger_nodes)
    assert seen.unobserved == frozenset({"vm", "g2"}) and len(calls) == 1
    assert ex.observe(100.0 + ex.probe_every_s - 0.1, ledger_nodes).unobserved and len(calls) == 1
    answering = True
    back = 100.0 + ex.probe_every_s
    # the probe asks on a thread of its own: the service's thread never waits on Slurm
    assert ex.observe(back, ledger_nodes).unobserved == frozenset({"vm", "g2"})
    assert ex._probe.thread is not None
    ex._probe.thread.join(timeout=10)
    assert calls[1][:3] == ["scontrol", "-o", "show"]
    del calls[1]
    seen = ex.observe(back, ledger_nodes)
    # the jobs, which cluster answers (back from an outage: atk43ha F5), then the partition
    # (its MaxTime and State, every probe_every_s: paused, nothing is submitted), then the nodes
    assert [a[:5] for a in calls[1:]] == [
        ["scontrol", "-d", "-o", "show", "job"],
        ["scontrol", "show", "config"],
        ["scontrol", "-o", "show", "partition", "gpuledger"][:5],
        ["scontrol", "-d", "-o", "show", "node"],
    ]
    ex.observe(back + 0.2, ledger_nodes)
    assert len(calls) == 7  # not the cluster nor the partition again so soon
    assert seen.unobserved == frozenset({"vm", "g2"})  # it settles: nothing decided yet
    assert ex.observe(back + ex.settle_s, ledger_nodes).unobserved == frozenset()


def _pending(reason: str) -> str:
    return (
        f"JobId=41 JobName=gpuledger-5 JobState=PENDING Reason={reason} StartTime=Unknown"
        f" EndTime=Unknown Partition=gpuledger Comment=gpuledger:{LID}:job=5:run=2"
    )


@pytest.mark.parametrize(
    ("reason", "after_s", "taken"),
    [("AccountNotAllowed", 0.0, True), ("Resources", 299.0, False), ("Resources", 300.0, True)],
)
def test_a_run_slurm_will_not_start_is_taken_back_and_explained(
    tmp_path: Path, reason: str, after_s: float, taken: bool
) -> None:
    from ledger.engines.slurm.executor import SlurmExecutor as Executor

    calls: list[list[str]] = []

    def run(args: list[str], stdin: str | None = None, env: object = None) -> str:
        calls.append(args)
        if args[0] == "sbatch":
            return "41\n"
        return _pending(reason) if args[:4] == ["scontrol", "-d", "-o", "show"] else ""

    # "service": the job's ledger user need not be an OS account of the machine running this
    ex = Executor("gpuledger", LID, tmp_path, start_within_s=300.0, run_as="service")
    ex._run = run  # type: ignore[method-assign]
    ex.carry_out(Orders(launches=(launch(GpuSlot(node="vm", gpu_indices=(0,))),)), 100.0)
    assert [a[0] for a in calls if a[0] == "sbatch"] == ["sbatch"]
    seen = ex.observe(100.0 + after_s, {"vm": node("vm")})
    if not taken:
        assert seen.exits == () and 5 in seen.running
        return
    [ex_] = seen.exits
    assert (ex_.job_id, ex_.reason, ex_.engine_job_id) == (5, "launch_failed", "41")
    assert reason in ex_.note and 5 not in seen.running
    assert ["scancel", "--name=gpuledger-5", "41"] in calls


def test_a_deposed_leader_s_executor_neither_submits_nor_cancels(tmp_path: Path) -> None:
    """The lease runs out between the decision and the sbatch (servers sharing a PostgreSQL
    store): nothing reaches Slurm; once the lease is held again, the launch goes out."""
    from ledger.engines.slurm.executor import SlurmExecutor as Executor

    calls: list[list[str]] = []
    leading = False

    def run(args: list[str], stdin: str | None = None, env: object = None) -> str:
        calls.append(args)
        return "41\n" if args[0] == "sbatch" else ""  # Slurm lists no job

    ex = Executor("gpuledger", LID, tmp_path, may_act=lambda: leading, run_as="service")
    ex._run = run  # type: ignore[method-assign]
    orders = Orders(launches=(launch(GpuSlot(node="vm", gpu_indices=(0,))),), epoch=3)
    assert ex.carry_out(orders, 100.0) == ()
    ex.observe(101.0, {"vm": node("vm")})
    assert not any(a[0] in ("sbatch", "scancel") for a in calls)
    leading = True
    ex.carry_out(orders, 102.0)
    assert [a[0] for a in calls if a[0] == "sbatch"] == ["sbatch"]
    leading = False
    ex.carry_out(Orders(stops=(5,)), 103.0)
    assert not any(a[0] == "scancel" for a in calls)


def test_a_job_whose_owner_may_not_run_jobs_is_never_submitted_to_slurm(tmp_path: Path) -> None:
    """As root with run_as submitter, a job of a user with no OS account is no sbatch at all:
    it ends launch_failed with why (never run as root, nor as anyone else)."""
    import os

    from ledger.engines.slurm.executor import SlurmExecutor as Executor

    calls: list[list[str]] = []

    def run(args: list[str], stdin: str | None = None, env: object = None) -> str:
        calls.append(args)
        return ""

    ex = Executor("gpuledger", LID, tmp_path, run_as="submitter")
    ex._run = run  # type: ignore[method-assign]
    job = dataclasses.replace(launch(GpuSlot(node="vm", gpu_indices=(0,))), user="gl-no-such-u")
    ex.carry_out(Orders(launches=(job,)), 100.0)
    seen = ex.observe(101.0, {"vm": node("vm")})
    if os.geteuid() != 0:  # not root: every job runs as the service's own account
        assert [a[0] for a in calls].count("sbatch") == 1
        return
    assert not [a for a in calls if a[0] == "sbatch"]
    [ended] = seen.exits
    assert (ended.job_id, ended.reason) == (5, "launch_failed")
    assert "'gl-no-such-u' has no OS account" in ended.note


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("NONE", None),
        ("00:01:00", 60.0),
        ("1-00:00:00", 86400.0),
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5.0),
        ("30", 1800.0),
        ("5:30", 330.0),
        ("", None),
    ],
)
def test_slurm_durations_read_as_seconds(text: str, want: float | None) -> None:
    assert slurm_duration(text) == want


def test_the_partitions_max_time_is_read_from_its_record() -> None:
    assert partition_max_time(PART + " MaxTime=00:01:00", "gpuledger") == 60.0
    assert partition_max_time(PART + " MaxTime=UNLIMITED", "gpuledger") is None
    assert partition_max_time(PART + " MaxTime=00:01:00", "other") is None


def test_a_run_slurm_could_not_launch_is_launch_failed_with_no_start(tmp_path: Path) -> None:
    """N3 of the re-test of issue 23: a working directory missing or an output file its user
    cannot write makes Slurm fail the launch (Reason=JobLaunchFailure, ExitCode=0:53); it was
    recorded `failed` exit 181 with a start. It is `launch_failed` with why, and never started."""
    from ledger.engines.slurm.executor import SlurmExecutor as Executor

    failed = (
        "JobId=41 JobName=gpuledger-5 JobState=FAILED Reason=JobLaunchFailure Dependency=(null)"
        " ExitCode=0:53 StartTime=2026-12-01T22:39:19 EndTime=2026-12-01T22:39:19"
        f" Partition=gpuledger Comment=gpuledger:{LID}:job=5:run=2 NodeList=vm"
    )

    def run(args: list[str], stdin: str | None = None, env: object = None) -> str:
        if args[0] == "sbatch":
            return "41\n"
        return failed if args[:4] == ["scontrol", "-d", "-o", "show"] else ""

    ex = Executor("gpuledger", LID, tmp_path, run_as="service")
    ex._run = run  # type: ignore[method-assign]
    job = dataclasses.replace(
        launch(GpuSlot(node="vm", gpu_indices=(0,))), workdir="/nonexistent-n3", stdout="o.out"
    )
    ex.carry_out(Orders(launches=(job,)), 100.0)
    seen = ex.observe(101.0, {"vm": node("vm")})
    assert seen.starts == ()
    [end] = seen.exits
    assert (end.job_id, end.reason, end.engine_job_id) == (5, "launch_failed", "41")
    assert end.note.startswith("cannot enter the working directory /nonexistent-n3"), end.note


def test_a_slurm_job_touching_its_checkpoint_file_records_a_checkpoint(tmp_path: Path) -> None:
    """N4 of the re-test of issue 23: on Slurm GPULEDGER_CHECKPOINT_FILE was not set, so a
    resumable job could not say it checkpointed. It is set, in a directory of the job's user's,
    and touching it is a checkpoint, as on the node agents."""
    import os

    from ledger.engines.slurm.executor import SlurmExecutor as Executor

    running = (
        "JobId=41 JobName=gpuledger-5 JobState=RUNNING Reason=None ExitCode=0:0"
        " StartTime=2026-12-01T22:39:19 EndTime=Unknown Partition=gpuledger"
        f" Comment=gpuledger:{LID}:job=5:run=2 NodeList=vm"
    )
    scripts: list[str] = []

    def run(args: list[str], stdin: str | None = None, env: object = None) -> str:
        if args[0] == "sbatch":
            scripts.append(stdin or "")
            return "41\n"
        return running if args[:4] == ["scontrol", "-d", "-o", "show"] else ""

    ex = Executor("gpuledger", LID, tmp_path, run_as="service")
    ex._run = run  # type: ignore[method-assign]
    ex.carry_out(Orders(launches=(launch(GpuSlot(node="vm", gpu_indices=(0,))),)), 100.0)
    [line] = [x for x in scripts[0].splitlines() if "GPULEDGER_CHECKPOINT_FILE=" in x]
    path = Path(line.split("=", 1)[1].strip("'"))
    [mark] = [x for x in scripts[0].splitlines() if x.startswith("{ : > ")]
    assert mark == f"{{ : > {path.with_name('launched')}; }} 2>/dev/null"
    path.with_name("launched").touch()  # what the script does first once Slurm launches it
    seen = ex.observe(101.0, {"vm": node("vm")})
    assert [s.job_id for s in seen.starts] == [5] and seen.checkpoints == ()
    assert path.parent.is_dir() and not path.exists()
    path.touch()
    assert ex.observe(102.0, {"vm": node("vm")}).checkpoints == (5,)
    assert ex.observe(103.0, {"vm": node("vm")}).checkpoints == ()  # once per touch
    os.utime(path, (path.stat().st_mtime + 5, path.stat().st_mtime + 5))
    assert ex.observe(104.0, {"vm": node("vm")}).checkpoints == (5,)


# --- when a run ended (F9: an end during a slurmctld outage) ---------------------------------

AWAY = (1_000.0, 1_060.0)
"""slurmctld last answered at 1000 and answered again at 1060."""


@pytest.mark.parametrize(
    ("case", "end_time", "now", "seen", "away", "want"),
    [
        ("no outage: Slurm's EndTime", 1_010.0, 1_011.0, 1_009.0, None, 1_010.0),
        ("an EndTime in the future is now", 1_020.0, 1_011.0, 1_009.0, None, 1_011.0),
        ("no EndTime: now", None, 1_011.0, 1_009.0, None, 1_011.0),
        ("ended in the outage: last seen running", 1_060.0, 1_061.0, 1_000.0, AWAY, 1_000.0),
        ("heard in the settle period: last seen", 1_085.0, 1_086.0, 1_000.0, AWAY, 1_000.0),
        ("ended after the settle period: EndTime", 1_095.0, 1_096.0, 1_000.0, AWAY, 1_095.0),
        ("seen running after the outage: EndTime", 1_070.0, 1_071.0, 1_065.0, AWAY, 1_070.0),
        ("never seen running: EndTime", 1_060.0, 1_061.0, None, AWAY, 1_060.0),
        ("ended before the outage: EndTime", 990.0, 1_061.0, 985.0, AWAY, 990.0),
    ],
)
def test_a_run_that_ended_while_slurmctld_was_away_ends_when_last_seen_running(
    case: str,
    end_time: float | None,
    now: float,
    seen: float | None,
    away: tuple[float, float] | None,
    want: float,
) -> None:
    assert words.real_end(end_time, now, seen, away, 30.0) == want, case


def test_hostile_sacctmgr_output_is_refused_or_read_as_slurm_would() -> None:
    """atk23c F7: a self-parented account or a longer loop is one line naming the loop (it made
    a 64-level account); a share over the ledger's bound is refused at import; an association
    seen twice keeps its first parent as it keeps its first share; `Ai2` is `ai2`."""
    for text, want in [
        ("loop|loop||1\n", "account 'loop' is its own ancestor (loop -> loop)"),
        ("a|b||1\nb|a||1\n", "is its own ancestor (a -> b -> a)"),
        ("ai2|root||99999999999\n", "share 99999999999 is over the ledger's 1,000,000,000"),
    ]:
        with pytest.raises(InvalidCommand, match=re.escape(want)):
            parse_sacctmgr_shares(text)
    got = parse_sacctmgr_shares(
        "ai2|root||10\ntulu|root||5\nolmo|ai2||3\nolmo|tulu||4\nAi2|root||10\nolmo|ai2|dan|1\n"
    )
    assert got.parents["olmo"] == "ai2" and "Ai2" not in got.parents
    assert got.duplicates == {"olmo": [3, 4], "ai2": [10, 10]}
    assert sorted(a for a, u, _ in got.rows if not u) == ["ai2", "olmo", "tulu"]


# --- atk23c: the records of ended and stopped runs ---------------------------------------------

ENDED = (
    "JobId=19196000 JobName=gpuledger-7 JobState=COMPLETED Reason=None ExitCode=0:0"
    " StartTime=2026-12-02T01:11:47 EndTime=2026-12-02T01:11:49 Partition=gpuledger NodeList=vm"
    " JOB_GRES=gpu:fake_0:0,gpu:fake_1:1,gpu:fake_2:1,gpu:fake_3:0   Nodes=vm CPU_IDs=0 Mem=0"
    f" GRES= Comment=gpuledger:{LID}:job=7:run=0 StdErr=/w/gpuledger-7.out"
    " StdOut=/w/gpuledger-7.out"
)


def test_an_ended_runs_gpus_and_output_come_from_slurms_record() -> None:
    """F11, F1 of atk23c: once a job ended, `-d`'s IDX is gone (its GPUs were recorded `[]`
    for a run first seen then); on a node whose GPUs are pinned JOB_GRES still says which.
    Its StdOut is kept for a run adopted after a restart (its logs were [])."""
    from ledger.engines.slurm.words import ended_gpus

    (j,) = parse_jobs(ENDED)
    assert dict(j.gpus) == {"vm": ()} and j.logs == ("/w/gpuledger-7.out",)
    types = ("fake_0", "fake_1", "fake_2", "fake_3")
    assert ended_gpus(j, {"vm": types}) == {"vm": (1, 2)}
    assert ended_gpus(j, {}) == {}  # not pinned: its record cannot say
    assert parse_jobs(RUNNING)[0].logs == ("/tmp/job-3.log",)  # /dev/null is no log


def test_a_slurm_job_gets_gpuledger_nodelist_as_on_the_agents() -> None:
    job = launch(GpuSlot(node="n1", gpu_indices=(0,)), GpuSlot(node="n2", gpu_indices=(0,)))
    assert job_environment(job, ALICE)["GPULEDGER_NODELIST"] == "n1,n2"


def test_a_stopped_runs_end_is_slurms_with_its_run_and_whether_it_was_killed() -> None:
    """F5 of atk23c: a run the ledger stopped is recorded ended at Slurm's EndTime."""
    from ledger.engines.slurm.stops import Stopping, stopped_end

    (j,) = parse_jobs(ENDED)
    end = stopped_end(Stopping(since=0.0, grace_s=20.0, run=(7, 0)), j, now=j.end_time + 30)
    assert (end.job_id, end.run, end.at, end.engine_state) == (7, 0, j.end_time, "COMPLETED")
    killed = stopped_end(Stopping(since=0.0, run=(7, 0), killed=True), j, now=j.end_time - 1)
    assert (killed.engine_state, killed.at) == ("KILLED", j.end_time - 1)  # never after now


LEAKY = (
    "NodeName=vm Gres=gpu:fake_0:1,gpu:fake_1:1,gpu:fake_2:1,gpu:fake_3:1 GresDrain=N/A"
    " GresUsed=gpu:fake_0:0(IDX:N/A),gpu:fake_1:1(IDX:1),gpu:fake_2:0(IDX:N/A),"
    "gpu:fake_3:1(IDX:3) State=IDLE Partitions=gpuledger"
)


def test_a_gpu_slurm_counts_allocated_that_no_job_holds_is_leaked() -> None:
    """CI's stall (slurm-wlm 22.05): after slurmctld restarted with a job it had requeued itself
    running, its end left `gpu:fake_3:1(IDX:3)` in GresUsed with no job holding it: Slurm
    started nothing asking for GPU 3, and its FIFO nothing behind that, for 5 minutes."""
    (vm,) = parse_nodes(LEAKY, "gpuledger")
    assert vm.gres_used == (1, 3)
    assert leaked_gpus({"vm": vm.gres_used}, {"vm": {1}}) == {"vm": frozenset({3})}
    assert leaked_gpus({"vm": vm.gres_used}, {"vm": {1, 3}}) == {}
    assert leaked_gpus({"vm": ()}, {}) == {}


def test_a_gpu_a_completing_job_still_holds_on_its_node_is_no_leak() -> None:
    """CI (cluster c): the last test's job was COMPLETING (its processes alive until KillWait),
    `-d` no longer listing its GPU, `GresUsed` still counting it; two reads called it leaked and
    the next run, waiting on it, was taken back. A node with such a job sees no new leak; one
    already held stays while Slurm counts it."""
    done = SlurmJob("9", "x", "COMPLETING", "gpuledger", nodes="vm")
    assert unsure([done], {}) == {"vm"}
    assert unsure([done], {"vm": ("fake_0",)}) == {"vm"}  # no JOB_GRES: nothing known
    pinned = dataclasses.replace(done, job_gres="gpu:fake_0:1")
    assert unsure([pinned], {"vm": ("fake_0",)}) == frozenset()  # its GPU 0 is known held
    assert unsure([dataclasses.replace(done, state="RUNNING")], {}) == frozenset()
    leaks = Leaks()
    for _ in range(3):
        assert not leaks.read({"vm": (0,)}, {}, unsure=frozenset({"vm"}))
    assert leaks.held == {}
    assert not leaks.read({"vm": (0,)}, {}) and leaks.read({"vm": (0,)}, {})  # then two reads
    assert leaks.held == {"vm": frozenset({0})}
    assert not leaks.read({"vm": (0, 1)}, {}, unsure=frozenset({"vm"}))  # kept, 1 not new
    assert leaks.held == {"vm": frozenset({0})}
    assert leaks.read({"vm": (1,)}, {}, unsure=frozenset({"vm"}))  # Slurm freed 0
    assert leaks.held == {}


def test_the_executor_holds_a_leaked_gpu_as_foreign_once_two_reads_see_it(tmp_path: Path) -> None:
    """The GPU no job holds is foreign work's to the dispatcher (never placed on), from the second
    read that shows it (one read may fall between a job's allocation and its listing), and is
    free again once Slurm frees it."""
    from ledger.engines.slurm.executor import SlurmExecutor as Executor

    nodes_text = [LEAKY]

    def run(args: list[str], stdin: str | None = None, env: object = None) -> str:
        return nodes_text[0] if args[-2:] == ["show", "node"] else ""

    ex = Executor("gpuledger", LID, tmp_path)
    ex._run = run  # type: ignore[method-assign]
    ledger_nodes = {"vm": node("vm")}
    assert ex.observe(100.0, ledger_nodes).foreign == {}
    assert ex.observe(101.0, ledger_nodes).foreign == {"vm": frozenset({1, 3})}
    nodes_text[0] = LEAKY.replace("gpu:fake_3:1(IDX:3)", "gpu:fake_3:0(IDX:N/A)")
    assert ex.observe(102.0, ledger_nodes).foreign == {"vm": frozenset({1})}
    nodes_text[0] = LEAKY.replace("GresUsed=", "X=")
    assert ex.observe(103.0, ledger_nodes).foreign == {}


def test_a_gpu_of_a_run_of_ours_is_never_taken_for_a_leak(tmp_path: Path) -> None:
    """CI: a slurmctld recovered after a restart may list our running job without its GPUs
    while GresUsed counts them: the run's own GPU is ours, not a leak held as foreign."""
    from ledger.engines.slurm.executor import SlurmExecutor as Executor
    from ledger.engines.slurm.tracked import Run

    def run(args: list[str], stdin: str | None = None, env: object = None) -> str:
        return LEAKY if args[-2:] == ["show", "node"] else ""

    ex = Executor("gpuledger", LID, tmp_path)
    ex._run = run  # type: ignore[method-assign]
    ex._runs[5] = Run(5, 0, launch(GpuSlot(node="vm", gpu_indices=(1,))), slurm_id="41",
                      started=True)  # fmt: skip
    ledger_nodes = {"vm": node("vm")}
    ex.observe(100.0, ledger_nodes)
    assert ex.observe(101.0, ledger_nodes).foreign == {"vm": frozenset({3})}


def test_an_output_name_with_a_backslash_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """atk38-23 F7: Slurm reads `\\` in -o/-e (`\\\\` opens `\\`, and a backslash turns its `%`
    patterns off), so the name the claim checked was not the name slurmstepd opened, where
    another account's named pipe waited. A backslash in either name refuses the launch with
    one line, and nothing is made."""
    from ledger.engines.slurm.outputs import Claimed, claim_outputs

    out, err = str(tmp_path / "ok-7.out"), str(tmp_path / "bs\\\\x-7.err")
    why = claim_outputs([out, err], SbatchUser(), 5.0)
    assert why.startswith(f"the error file {err} has a backslash") and "\n" not in why
    assert claim_outputs([err], SbatchUser(), 5.0).startswith("the output file")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert isinstance(claim_outputs([out], SbatchUser(), 5.0), Claimed) and Path(out).exists()


def test_a_node_slurm_does_not_list_is_drained_and_returns_when_listed() -> None:
    """atk44ha F2: after `--new-settings` onto another cluster the old cluster's node stayed
    active: jobs were placed there and sbatch failed for good ('Invalid node name'). A node
    Slurm's partition does not list takes no new work (drained, said in `node list`) until
    Slurm lists it again (back on that cluster)."""
    from ledger.engines.slurm.words import UNLISTED

    ledger = {"vm-atka": node("vm-atka"), "vm-atkb": node("vm-atkb")}
    assert follow({"vm-atkb": "IDLE"}, ledger) == [
        c.DrainNode(actor="@x", node="vm-atka", reason=UNLISTED)
    ]
    back = {"vm-atka": node("vm-atka", "drained", UNLISTED), "vm-atkb": node("vm-atkb")}
    assert follow({"vm-atka": "IDLE"}, back) == [
        c.DrainNode(actor="@x", node="vm-atkb", reason=UNLISTED),
        c.ReturnNode(actor="@x", node="vm-atka"),
    ]
    assert follow({}, ledger) == []  # a partition listed with no node: nothing drained


def test_the_jobs_placed_on_a_node_slurm_does_not_list_go_back_to_the_queue(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    """Issue 28, left open by atk44ha F2's fix: the jobs already placed on the old cluster's
    node when `--new-settings` moved the ledger onto another cluster stayed placed there, and
    sbatch failed for them at every cycle, for good. At every read, the jobs placed on a node
    the partition does not list and not started are requeued (a decision recorded, same id),
    so they are placed where the new cluster runs them; a running job there is not touched."""
    from ledger.cycle.executor import Observed
    from ledger.cycle.record import record, unplace_commands
    from ledger.engines.slurm.words import UNLISTED
    from tests.unit.test_cycle_record import FakeLedger, place

    led = FakeLedger(org_state, counter_ids)
    led.execute_all([
        c.SubmitJob(actor="carol", account="ai2/tulu", gpus=2, min_runtime_s=0),
        c.SubmitJob(actor="alice", account="ai2/olmo", gpus=4, min_runtime_s=3600),
    ])  # fmt: skip
    place(led, 1, "n1", 2)  # job 1 runs on n1's GPUs 0-1
    led.execute(c.StartJob(actor="@executor", job_id=1))
    place(led, 2, "a1", 4)  # job 2 placed on a1, not started
    only_n2 = parse_nodes("NodeName=n2 Gres=gpu:h100:8 State=IDLE Partitions=p", "p")
    changes = node_changes(only_n2, led.state.nodes)
    unplace = {ch.node: ch for ch in changes if ch.change == "unplace"}
    assert sorted(unplace) == ["a1", "n1"] and unplace["a1"].reason == UNLISTED
    assert [cmd.job_id for cmd in unplace_commands(unplace["a1"], led.state)] == [2]
    assert unplace_commands(unplace["n1"], led.state) == []  # running: not touched
    record(led, Observed(nodes=tuple(changes)), "slurm")
    assert led.state.jobs[2].status == "pending" and led.state.jobs[2].slots == ()
    assert led.state.jobs[1].status == "running"
    assert (led.state.nodes["n1"].state, led.state.nodes["a1"].state) == ("draining", "drained")
    said = [ev for ev in led.events if isinstance(ev, e.JobUnplaced)]  # never ran: no preemption
    assert [(ev.job_id, ev.run, ev.reason) for ev in said] == [
        (2, 0, f"node a1 cannot run it: {UNLISTED}")
    ]
    assert not any(isinstance(ev, e.JobPreempted) for ev in led.events)
    before = len(led.events)
    record(led, Observed(nodes=tuple(node_changes(only_n2, led.state.nodes))), "slurm")
    assert len(led.events) == before  # the next read: nothing more to say
