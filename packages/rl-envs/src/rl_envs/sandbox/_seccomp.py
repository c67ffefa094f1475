"""The sandbox's system-call filter: a classic BPF program for bubblewrap's `--seccomp FD`.

Namespaces, dropped capabilities and `--disable-userns` already make most dangerous calls
fail inside the sandbox. One thing they leave open is acting on the sandbox's own
processes: its program can `ptrace` bubblewrap's init (pid 1 of its PID namespace, same
uid) and stop it, and the run then ends only at its wall clock. The filter closes that and
narrows what the kernel exposes: it refuses, with EPERM, calls an untrusted program never
needs (tracing and reading other processes' memory, BPF, perf, the keyring, mounting,
namespaces, loading kernels and modules, io_uring, ...; `DENIED` lists them with why).

It is a deny list, not an allow list: CPython, its threads, `subprocess` and
`multiprocessing` use a wide, libc-version-dependent set of calls, and a call missing from
an allow list would break ordinary programs in ways that are hard to see.

Three calls are refused by argument or answered specially:
- `clone` with any namespace flag (EPERM); plain `clone` (threads, fork) passes.
- `clone3` gets ENOSYS: its flags sit in memory, where a filter cannot read them, and
  glibc (2.34+) falls back to `clone` on ENOSYS, so threads and processes still start.
- `personality` only with the values Docker's default profile allows (0, 8, 0x20000,
  0x20008, and 0xffffffff to query): no ADDR_NO_RANDOMIZE, which would turn off ASLR.

A call made through another ABI than the interpreter's own is refused whole: the 32-bit
ones (`int 0x80` on x86-64, AArch32 on arm64) and x32 (x86-64 numbers with bit 30 set)
use other numbers, which a list of x86-64 numbers would not catch.

bubblewrap loads the filter just before it runs the program (after its own namespace
setup, which needs `unshare` and `mount`), with no_new_privs set; every process the
program starts inherits it. Written here rather than with libseccomp: libseccomp's own
Python bindings are not on PyPI, what is there (`pyseccomp`, a ctypes wrapper last released
in 2021; `seccompy`, a 2026 beta) is not kept up well enough to guard the sandbox with, and
the program is a few dozen instructions.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct
import sys
from dataclasses import dataclass

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000

# Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K

# Offsets in struct seccomp_data; both architectures here are little-endian, so an
# argument's low 32 bits come first.
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

CLONE_NAMESPACES = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)
"""`clone` flags that create namespaces (CLONE_NEWTIME exists only for clone3 and
unshare: in `clone` its bit is part of the exit signal)."""

PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
"""`personality` values allowed: PER_LINUX, PER_LINUX32, UNAME26 with each, and the query."""

# name: (x86-64 number, arm64 number); None where the call does not exist.
DENIED: dict[str, tuple[int | None, int | None]] = {
    # Acting on other processes: tracing (the sandbox's init included), their memory.
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "process_madvise": (440, 440),
    "pidfd_getfd": (438, 438),
    "kcmp": (312, 272),
    # Large kernel surfaces an arithmetic program never needs.
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    # The kernel keyring is not namespaced.
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    # Mounts and namespaces: the sandbox's layout is bubblewrap's, set up before the filter.
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "unshare": (272, 97),
    "setns": (308, 268),
    "open_by_handle_at": (304, 265),
    # The machine itself: kernels, modules, power, swap, accounting, the kernel log, quotas,
    # I/O ports, the terminal.
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "syslog": (103, 116),
    "quotactl": (179, 60),
    "quotactl_fd": (443, 443),
    "lookup_dcookie": (212, 18),
    "vhangup": (153, 58),
    "iopl": (172, None),
    "ioperm": (173, None),
    "modify_ldt": (154, None),
    "uselib": (134, None),
}
"""Calls refused outright with EPERM."""

_CLONE = (56, 220)
_PERSONALITY = (135, 92)
_CLONE3 = 435  # the same number on both


@dataclass(frozen=True)
class Arch:
    """An architecture the filter knows: its audit id, and which column of `DENIED`."""

    name: str
    audit: int
    column: int


ARCHES = {
    "x86_64": Arch("x86_64", AUDIT_ARCH_X86_64, 0),
    "aarch64": Arch("aarch64", AUDIT_ARCH_AARCH64, 1),
}


class UnsupportedArchError(RuntimeError):
    """The filter has no system-call table for this interpreter's architecture."""


def native_arch() -> Arch:
    """The architecture this interpreter's system calls use, or `UnsupportedArchError`."""
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower())
    machine = machine or platform.machine().lower()
    if machine not in ARCHES or sys.maxsize <= 2**32:
        bits = 64 if sys.maxsize > 2**32 else 32
        raise UnsupportedArchError(
            f"the sandbox's system-call filter knows 64-bit x86_64 and aarch64; this Python "
            f"is {bits}-bit on {platform.machine() or 'an unknown machine'}"
        )
    return ARCHES[machine]


@functools.cache
def filter_program(arch: Arch) -> bytes:
    """The filter for `arch` as bubblewrap reads it: struct sock_filter entries
    (u16 code, u8 jt, u8 jf, u32 k), native byte order."""
    deny, allow, enosys = "deny", "allow", "enosys"
    asm = _Assembler()
    asm.op(_LD_W_ABS, _ARCH)
    asm.jump(_JEQ, arch.audit, None, deny)
    asm.op(_LD_W_ABS, _NR)
    if arch.audit == AUDIT_ARCH_X86_64:
        asm.jump(_JGE, X32_SYSCALL_BIT, deny, None)
    for numbers in DENIED.values():
        if (nr := numbers[arch.column]) is not None:
            asm.jump(_JEQ, nr, deny, None)
    asm.jump(_JEQ, _CLONE3, enosys, None)
    asm.jump(_JEQ, _CLONE[arch.column], "clone", None)
    asm.jump(_JEQ, _PERSONALITY[arch.column], "personality", None)
    asm.op(_RET, SECCOMP_RET_ALLOW)
    asm.label("clone")
    asm.op(_LD_W_ABS, _ARG0_LOW)
    asm.jump(_JSET, CLONE_NAMESPACES, deny, allow)
    asm.label("personality")
    asm.op(_LD_W_ABS, _ARG0_LOW)
    for value in PERSONALITIES:
        asm.jump(_JEQ, value, allow, None)
    asm.label(deny)
    asm.op(_RET, SECCOMP_RET_ERRNO | errno.EPERM)
    asm.label(allow)
    asm.op(_RET, SECCOMP_RET_ALLOW)
    asm.label(enosys)
    asm.op(_RET, SECCOMP_RET_ERRNO | errno.ENOSYS)
    return asm.assemble()


class _Assembler:
    """Instructions with jumps to named labels, resolved to classic BPF's forward offsets."""

    def __init__(self) -> None:
        self._code: list[tuple[int, str | None, str | None, int]] = []
        self._labels: dict[str, int] = {}

    def op(self, code: int, k: int) -> None:
        self._code.append((code, None, None, k))

    def jump(self, code: int, k: int, true: str | None, false: str | None) -> None:
        """A conditional jump; None for a branch means the next instruction."""
        self._code.append((code, true, false, k))

    def label(self, name: str) -> None:
        self._labels[name] = len(self._code)

    def assemble(self) -> bytes:
        out = bytearray()
        for at, (code, true, false, k) in enumerate(self._code):
            out += struct.pack("=HBBI", code, self._offset(at, true), self._offset(at, false), k)
        return bytes(out)

    def _offset(self, at: int, label: str | None) -> int:
        if label is None:
            return 0
        offset = self._labels[label] - at - 1
        if not 0 <= offset <= 255:
            raise AssertionError(f"BPF jump from {at} to {label!r} out of range: {offset}")
        return offset
