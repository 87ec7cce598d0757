"""The cgroup v2 GPU device program (`ledger.engines.gpu_bpf`), pure: the instruction encoding
against the kernel's documented bytes, and the program run by a small eBPF interpreter here
against the v1 rule it stands for (deny 195:N for every GPU minor N not given). And what
`Containment` says of a host where GPU device files are open (atk43 F8)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.engines import gpu_bpf as b
from ledger.engines.tree import Containment

CHAR, BLOCK = 2, 1
READ, WRITE, MKNOD = 2, 4, 1  # BPF_DEVCG_ACC_*: the access half of access_type


@pytest.mark.parametrize(
    ("case", "got", "want_hex"),
    [
        ("r0 = 1", b.insn(b.MOV64_K, b.R0, imm=1), "b700000001000000"),
        ("exit", b.insn(b.EXIT), "9500000000000000"),
        ("r2 = *(u32 *)(r1 + 4)", b.insn(b.LDX_MEM_W, b.R2, b.R1, 4), "6112040000000000"),
        ("if r4 == 3 goto +2", b.insn(b.JEQ_K, b.R4, off=2, imm=3), "1504020003000000"),
        ("if r3 != 195 goto +9", b.insn(b.JNE_K, b.R3, off=9, imm=195), "55030900c3000000"),
        ("r2 &= 0xffff", b.insn(b.ALU64_AND_K, b.R2, imm=0xFFFF), "57020000ffff0000"),
        ("if r4 > 253 goto +1", b.insn(b.JGT_K, b.R4, off=1, imm=253), "25040100fd000000"),
    ],
)
def test_instructions_encode_as_the_kernel_reads_them(case: str, got: bytes, want_hex: str) -> None:
    assert got.hex() == want_hex, case


def run(code: bytes, access_type: int, major: int, minor: int) -> int:
    """An interpreter of the opcodes `program` uses, on `struct bpf_cgroup_dev_ctx`."""
    ctx = struct.pack("<III", access_type, major, minor)
    regs = [0] * 11
    pc, steps = 0, 0
    while True:
        steps += 1
        assert steps < 10_000 and 0 <= pc < len(code) // 8, f"ran off at {pc}"
        op, r, off, imm = struct.unpack_from("<BBhi", code, pc * 8)
        dst, src = r & 0xF, r >> 4
        pc += 1
        if op == b.LDX_MEM_W:
            assert src == b.R1 and off in (0, 4, 8)
            regs[dst] = struct.unpack_from("<I", ctx, off)[0]
        elif op == b.ALU64_AND_K:
            regs[dst] &= imm
        elif op == b.MOV64_K:
            regs[dst] = imm
        elif op in (b.JEQ_K, b.JNE_K, b.JGT_K):
            taken = {b.JEQ_K: regs[dst] == imm, b.JNE_K: regs[dst] != imm,
                     b.JGT_K: regs[dst] > imm}[op]  # fmt: skip
            pc += off if taken else 0
        elif op == b.EXIT:
            return regs[b.R0]
        else:
            raise AssertionError(f"unknown opcode {op:#x}")


def v1_allows(own: set[int], kind: int, major: int, minor: int) -> int:
    """The v1 rule of `Tree.create`: `c 195:N rwm` denied for every N < 254 not in `own`."""
    return int(not (kind == CHAR and major == 195 and minor < 254 and minor not in own))


@pytest.mark.parametrize(
    ("case", "own", "kind", "major", "minor", "want"),
    [
        ("its own GPU", {1}, CHAR, 195, 1, 1),
        ("another GPU", {1}, CHAR, 195, 0, 0),
        ("the last GPU minor, not given", {1}, CHAR, 195, 253, 0),
        ("nvidia-modeset", {1}, CHAR, 195, 254, 1),
        ("nvidiactl, which every CUDA process needs", {1}, CHAR, 195, 255, 1),
        ("no GPU given: every GPU denied", set(), CHAR, 195, 0, 0),
        ("a block device of major 195", set(), BLOCK, 195, 0, 1),
        ("/dev/null", set(), CHAR, 1, 3, 1),
        ("nvidia-uvm (its own major)", set(), CHAR, 508, 0, 1),
    ],
)
def test_the_program_allows_what_the_v1_rule_allows(
    case: str, own: set[int], kind: int, major: int, minor: int, want: int
) -> None:
    for access in (READ, WRITE, MKNOD, READ | WRITE):
        assert run(b.program(own), access << 16 | kind, major, minor) == want, case


@given(
    own=st.sets(st.integers(0, 253), max_size=12),
    kind=st.sampled_from([CHAR, BLOCK]),
    major=st.sampled_from([195, 1, 0, 196]),
    minor=st.integers(0, 2**20),
)
def test_the_program_equals_the_v1_rule_for_any_gpus_and_device(
    own: set[int], kind: int, major: int, minor: int
) -> None:
    want = v1_allows(own, kind, major, minor)
    assert run(b.program(own), READ << 16 | kind, major, minor) == want


def test_every_gpu_given_leaves_nothing_denied_and_the_program_stays_small() -> None:
    code = b.program(range(254))
    assert len(code) // 8 == 7 + 254 + 4 and len(code) // 8 < 4096  # the kernel's old limit
    assert all(run(code, READ << 16 | CHAR, 195, m) == 1 for m in range(256))
    assert b.program([3, 1, 1, 999, -1]) == b.program([1, 3])  # out-of-range minors ignored


# --- what the host offers, said ------------------------------------------------------------------

V2 = "/sys/fs/cgroup/unified"
V1 = (("freezer", "/sys/fs/cgroup/freezer"), ("pids", "/sys/fs/cgroup/pids"))
DEVICES = (("devices", "/sys/fs/cgroup/devices"),)


@pytest.mark.parametrize(
    ("case", "c", "want_open", "want_said"),
    [
        ("v1 devices", Containment(v2=V2, v1=V1 + DEVICES), "",
         "GPU devices constrained (cgroup v1 devices)"),
        ("v2 only, a BPF program attached", Containment(v2=V2, v1=V1, bpf=True), "",
         "GPU devices constrained (cgroup v2 BPF device program)"),
        ("v2 only, the kernel refused",
         Containment(v2=V2, bpf_why_not="the kernel refused a BPF device program: "
                     "bpf(BPF_PROG_LOAD): Operation not permitted"),
         "GPU devices open: a job may use GPUs it was not given (no cgroup v1 devices "
         "controller, the kernel refused a BPF device program: bpf(BPF_PROG_LOAD): Operation "
         "not permitted)", None),
        ("v1 without devices, no v2", Containment(v1=V1),
         "GPU devices open: a job may use GPUs it was not given (no cgroup v1 devices "
         "controller and no cgroup v2)", None),
        ("no cgroup", Containment(why_not="not root"),
         "GPU devices open: a job may use GPUs it was not given (no cgroup: not root)",
         "session and process group (no cgroup: not root); GPU devices open: a job may use "
         "GPUs it was not given"),
    ],
)  # fmt: skip
def test_the_host_says_whether_a_job_may_open_gpus_it_was_not_given(
    case: str, c: Containment, want_open: str, want_said: str | None
) -> None:
    assert c.gpus_open == want_open, case
    said = c.describe()
    if want_said is not None:
        assert said.endswith(want_said), said
    if want_open and c.cgroups:
        assert said.endswith("; " + want_open)
    assert Containment.from_json(c.to_json()) == c


def test_a_record_of_an_older_agent_has_no_bpf_program() -> None:
    old = {"v2": V2, "v1": [], "why_not": ""}
    assert Containment.from_json(old) == Containment(v2=V2)
    assert Containment.from_json(old).gpus_open.startswith("GPU devices open")
