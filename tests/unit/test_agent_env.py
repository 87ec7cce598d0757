"""Pure parts of the node agent: a part's environment and the live double-booking check."""

from __future__ import annotations

import dataclasses

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.env import DEFAULT_PATH, Account, job_env, master_port
from ledger.history.audit import check_live
from schemas.events import GpuSlot

GANG = Launch(
    42,
    (GpuSlot(node="a", gpu_indices=(0, 1)), GpuSlot(node="b", gpu_indices=(6, 7))),
    ("train",),
    None,
    "alice",
    "ai2/olmo",
    run=2,  # its third launch
)


@pytest.mark.parametrize(
    ("rank", "want"),
    [
        (0, {"CUDA_VISIBLE_DEVICES": "0,1", "NODE_RANK": "0", "GPULEDGER_NODE": "a"}),
        (1, {"CUDA_VISIBLE_DEVICES": "6,7", "NODE_RANK": "1", "GPULEDGER_NODE": "b"}),
    ],
)
def test_each_part_sees_only_its_nodes_gpus_and_its_rank(rank: int, want: dict[str, str]) -> None:
    job = dataclasses.replace(GANG, env=(("PATH", "/bin"), ("GPULEDGER_JOB_TOKEN", "stale")))
    env = job_env({}, job, rank, checkpoint_file="/c", master_addr="10.0.0.1")
    assert {k: env[k] for k in want} == want
    assert env["PATH"] == "/bin"
    assert "GPULEDGER_JOB_TOKEN" not in env  # never another job's token
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == str(master_port(42))
    assert env["WORLD_SIZE"] == env["NNODES"] == "2"
    assert env["GPULEDGER_NODELIST"] == "a,b" and env["GPULEDGER_LAUNCH"] == "3"
    assert env["GPULEDGER_JOB_ID"] == "42" and env["GPULEDGER_USER"] == "alice"
    assert env["GPULEDGER_CHECKPOINT_FILE"] == "/c"


def test_a_job_gets_its_submitted_environment_never_the_services() -> None:
    submitted = (("MY_VAR", "x"), ("CUDA_VISIBLE_DEVICES", "7"), ("GPULEDGER_NODE_TOKEN", "n"))
    job = dataclasses.replace(GANG, env=submitted, job_name="train", array_job_id=40,
                              array_task_id=3)  # fmt: skip
    alice = Account(name="alice", uid=1001, gid=1001, groups=(1001, 27), home="/home/alice",
                    shell="/bin/bash")  # fmt: skip
    env = job_env({"GPULEDGER_URL": "http://h:1"}, job, 0, checkpoint_file="/c",
                  master_addr="h", account=alice)  # fmt: skip
    assert env["MY_VAR"] == "x" and env["PATH"] == DEFAULT_PATH  # none submitted: a minimal one
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # the ledger's variables win
    assert "GPULEDGER_NODE_TOKEN" not in env
    assert (env["HOME"], env["USER"], env["LOGNAME"], env["SHELL"]) == (
        "/home/alice",
        "alice",
        "alice",
        "/bin/bash",
    )
    assert env["GPULEDGER_URL"] == "http://h:1" and env["GPULEDGER_JOB_NAME"] == "train"
    assert (env["GPULEDGER_ARRAY_JOB_ID"], env["GPULEDGER_ARRAY_TASK_ID"]) == ("40", "3")
    bare = job_env({}, GANG, 0, checkpoint_file="/c", master_addr="h")
    assert set(bare) - {"PATH"} == {k for k in bare if k.startswith(("GPULEDGER_", "CUDA_"))} | {
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "NNODES",
        "NODE_RANK",
        "RANK",
    }  # nothing of the service's own environment


def test_the_job_token_slot_is_filled_when_given() -> None:
    env = job_env({}, GANG, 0, checkpoint_file="/c", master_addr="h", job_token="tok")
    assert env["GPULEDGER_JOB_TOKEN"] == "tok"


def test_master_port_is_stable_and_in_range() -> None:
    assert master_port(42) == master_port(42) != master_port(43)
    assert all(20_000 <= master_port(j) < 30_000 for j in (0, 1, 9_999, 10_000, 123_456))


@pytest.mark.parametrize(
    ("case", "holders", "live", "want"),
    [
        ("a job on its own GPUs", {("a", 0): 1}, [(1, "a", 0)], []),
        ("a lost process on a GPU given to another job", {("a", 0): 2}, [(1, "a", 0)],
         [("a", 0, 1)]),
        ("an orphan on a free GPU is not two jobs", {}, [(1, "a", 0)], []),
        ("two live processes on one GPU", {}, [(1, "a", 3), (2, "a", 3)], [("a", 3, 1)]),
        ("same index, other node", {("b", 0): 2}, [(1, "a", 0)], []),
    ],
)  # fmt: skip
def test_check_live_flags_gpus_held_by_two_jobs_at_once(
    case: str,
    holders: dict[tuple[str, int], int],
    live: list[tuple[int, str, int]],
    want: list[tuple[str, int, int]],
) -> None:
    got = check_live(holders, live, position=10, at=5.0)
    assert [(v.message.split("node ")[1].split("'")[1], int(v.message.split()[1]), v.job_id)
            for v in got] == want, case  # fmt: skip
    assert all(v.code == "LIVE_GPU_HELD_TWICE" and v.position == 10 for v in got)
