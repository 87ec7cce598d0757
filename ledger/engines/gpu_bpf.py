"""GPU device files on cgroup v2: a `BPF_PROG_TYPE_CGROUP_DEVICE` program on a part's group. An
edge (two `bpf(2)` calls) around a pure encoder.

cgroup v2 has no `devices.deny` file: the kernel asks a BPF program attached to the group, for
every open or mknod of a device file, whether it may (1) or not (0). The program says what the
v1 rule of `ledger.engines.tree` says: every character device is allowed except the NVIDIA GPUs
(major 195, minors 0..253) the part was not given; nvidia-modeset (254), nvidiactl (255) and
every other device stay allowed. Slurm's cgroup/v2 plugin and systemd's `DeviceAllow=` attach the
same kind of program.

Why by hand: Python has no well-kept library that loads such a program (bcc compiles C with
LLVM and needs kernel headers on every node; libbpf has no maintained Python binding), and the
program is a dozen fixed instructions: `program` encodes them (pure, unit-tested), `attach` loads
it (`BPF_PROG_LOAD`) and attaches it (`BPF_PROG_ATTACH`, `BPF_CGROUP_DEVICE`) to the group's
directory. An attached program lives as long as the group, whoever closes the file descriptors.

It imports only the standard library: the per-part supervisor uses it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from collections.abc import Iterable
from pathlib import Path

NVIDIA_MAJOR = 195
GPU_MINORS = 254
"""Minors 0..253 are GPUs (`/dev/nvidiaN`); 254 is nvidia-modeset and 255 nvidiactl."""

BPF_NR = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "ppc64le": 361, "s390x": 351}
"""`bpf(2)`'s system call number by machine (`uname -m`)."""
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2
"""Other programs on the group's ancestors (systemd's, a container runtime's) keep applying: a
device is opened only when every one of them allows it."""
BPF_DEVCG_DEV_CHAR = 2
ATTR_SIZE = 128
"""Bytes of `union bpf_attr` handed over (the kernel wants the ones it does not know zero)."""

# eBPF opcodes (linux/bpf_common.h, linux/bpf.h): class | size/op | source
LDX_MEM_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
ALU64_AND_K = 0x57  # BPF_ALU64 | BPF_AND | BPF_K: dst &= imm
MOV64_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K: dst = imm
JNE_K = 0x55  # BPF_JMP | BPF_JNE | BPF_K: if dst != imm, skip off instructions
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGT_K = 0x25  # BPF_JMP | BPF_JGT | BPF_K (unsigned)
EXIT = 0x95  # BPF_JMP | BPF_EXIT: return r0

# struct bpf_cgroup_dev_ctx { u32 access_type (access << 16 | type); u32 major; u32 minor; }
CTX_TYPE, CTX_MAJOR, CTX_MINOR = 0, 4, 8
R0, R1, R2, R3, R4 = range(5)


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One `struct bpf_insn` (8 bytes, little-endian: the registers share a byte, dst low).
    Pure."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(own_gpus: Iterable[int]) -> bytes:
    """The device program for a part given `own_gpus` (module doc). Pure.

    r2 = ctx.access_type & 0xffff;  if r2 != CHAR goto allow
    r3 = ctx.major;                 if r3 != 195 goto allow
    r4 = ctx.minor;                 if r4 > 253 goto allow
    if r4 == own[0] goto allow ...  (one test per GPU given)
    r0 = 0; exit                    (another GPU: denied)
    allow: r0 = 1; exit
    """
    own = sorted({g for g in own_gpus if 0 <= g < GPU_MINORS})
    allow = 7 + len(own) + 2  # where `allow` is: after the 7 tests, the own ones and `deny`

    def to_allow(at: int) -> int:
        return allow - at - 1  # a jump counts from the instruction after it

    code = [
        insn(LDX_MEM_W, R2, R1, CTX_TYPE),
        insn(ALU64_AND_K, R2, imm=0xFFFF),
        insn(JNE_K, R2, off=to_allow(2), imm=BPF_DEVCG_DEV_CHAR),
        insn(LDX_MEM_W, R3, R1, CTX_MAJOR),
        insn(JNE_K, R3, off=to_allow(4), imm=NVIDIA_MAJOR),
        insn(LDX_MEM_W, R4, R1, CTX_MINOR),
        insn(JGT_K, R4, off=to_allow(6), imm=GPU_MINORS - 1),
    ]
    code += [insn(JEQ_K, R4, off=to_allow(7 + i), imm=g) for i, g in enumerate(own)]
    code += [insn(MOV64_K, R0, imm=0), insn(EXIT)]  # deny
    code += [insn(MOV64_K, R0, imm=1), insn(EXIT)]  # allow
    assert len(code) == allow + 2
    return b"".join(code)


def attach(group: Path, own_gpus: Iterable[int]) -> None:
    """Load the program for `own_gpus` and attach it to the cgroup v2 group `group`; an
    `OSError` that names the call the kernel refused otherwise."""
    code = program(own_gpus)
    prog = _load(code)
    try:
        cg = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
        try:
            attr = struct.pack("<IIII", cg, prog, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI)
            _bpf(BPF_PROG_ATTACH, attr, "BPF_PROG_ATTACH")
        finally:
            os.close(cg)
    finally:
        os.close(prog)


def check(group: Path) -> str:
    """Whether this host lets us confine devices on cgroup v2: attach a program to `group` (a
    scratch group, removed by the caller). "" when it does, else why not."""
    try:
        attach(group, ())
    except OSError as err:
        return str(err.strerror or err)
    return ""


def _load(code: bytes) -> int:
    """`BPF_PROG_LOAD`: the program's file descriptor. On a refusal, ask again with the
    verifier's log so the error says why."""
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"Apache-2.0")
    log = ctypes.create_string_buffer(4096)

    def attr(log_level: int) -> bytes:
        return struct.pack(
            "<IIQQIIQII16s",
            BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8,
            ctypes.addressof(insns), ctypes.addressof(license_),
            log_level, len(log) if log_level else 0, ctypes.addressof(log) if log_level else 0,
            0, 0, b"gpuledger_gpus",
        )  # fmt: skip

    try:
        return _bpf(BPF_PROG_LOAD, attr(0), "BPF_PROG_LOAD")
    except OSError as err:
        if err.errno != 13 and err.errno != 22:  # EACCES, EINVAL: the verifier's
            raise
        try:
            return _bpf(BPF_PROG_LOAD, attr(1), "BPF_PROG_LOAD")
        except OSError as again:
            said = log.value.decode(errors="replace").strip().splitlines()
            why = f"{again.strerror} ({said[-1]})" if said else again.strerror
            raise OSError(again.errno, why) from None


def _bpf(cmd: int, attr: bytes, what: str) -> int:
    nr = BPF_NR.get(platform.machine())
    if nr is None:
        raise OSError(0, f"bpf(2): no system call number known for {platform.machine()}")
    buf = ctypes.create_string_buffer(attr.ljust(ATTR_SIZE, b"\0"), ATTR_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    got = libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), buf, ctypes.c_long(ATTR_SIZE))
    if got < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bpf({what}): {os.strerror(e)}")
    return int(got)
