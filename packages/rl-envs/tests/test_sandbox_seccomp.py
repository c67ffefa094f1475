"""The sandbox's system-call filter: in the real sandbox, each refused call gets EPERM (and
the same calls get through with the filter swapped for one that allows everything), the
program can no longer stop bubblewrap's init, and ordinary Python still runs. The program
itself is also read instruction by instruction, for both architectures it knows."""

from __future__ import annotations

import dataclasses
import errno
import json
import re
import struct
from pathlib import Path

import pytest
from rl_envs.sandbox import Sandbox, SandboxLimits
from rl_envs.sandbox._seccomp import (
    ARCHES,
    AUDIT_ARCH_X86_64,
    CLONE_NAMESPACES,
    DENIED,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    Arch,
    UnsupportedArchError,
    filter_program,
    native_arch,
)

pytestmark = pytest.mark.timeout(120)

EPERM = SECCOMP_RET_ERRNO | errno.EPERM
ENOSYS = SECCOMP_RET_ERRNO | errno.ENOSYS

# The calls the filter must refuse whatever else changes in its table.
REQUIRED = [
    "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "keyctl",
    "add_key", "request_key", "mount", "umount2", "pivot_root", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "unshare", "setns",
    "userfaultfd", "open_by_handle_at", "reboot", "swapon", "swapoff", "acct", "syslog",
    "iopl", "ioperm", "io_uring_setup", "fsopen", "fsmount", "open_tree", "move_mount",
]  # fmt: skip

# (x86-64, arm64) numbers of calls the tests make that the filter lets through.
CLONE, CLONE3, PERSONALITY, READ = (56, 220), (435, 435), (135, 92), (0, 63)


def run_filter(program: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """What the classic BPF `program` returns for one call: a small interpreter of the
    instructions the filter uses (loads of seccomp_data words, jeq/jge/jset, ret)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    code = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif op in (0x15, 0x35, 0x45):
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: acc & k != 0}[op]
            pc += 1 + (jt if taken else jf)
        elif op == 0x06:
            return int(k)
        else:
            raise AssertionError(f"unexpected BPF opcode {op:#x} at {pc}")


@pytest.mark.parametrize("arch", ARCHES.values(), ids=list(ARCHES))
def test_the_program_refuses_the_listed_calls(arch: Arch) -> None:
    program = filter_program(arch)
    col = arch.column
    for name in REQUIRED:
        assert name in DENIED, name
    for name, numbers in DENIED.items():
        if (nr := numbers[col]) is not None:
            assert run_filter(program, arch.audit, nr) == EPERM, name
    assert run_filter(program, arch.audit, READ[col]) == SECCOMP_RET_ALLOW
    # clone3's flags cannot be read: ENOSYS makes glibc fall back to clone.
    assert run_filter(program, arch.audit, CLONE3[col]) == ENOSYS
    # clone: threads and forks pass; any namespace flag is refused.
    for flags in (0x3D0F00, 0x01200011):  # pthread_create's flags, fork's (SIGCHLD | ...)
        assert run_filter(program, arch.audit, CLONE[col], flags) == SECCOMP_RET_ALLOW
    for bit in range(32):
        if CLONE_NAMESPACES & (1 << bit):
            flags = 0x01200011 | (1 << bit)
            assert run_filter(program, arch.audit, CLONE[col], flags) == EPERM, hex(flags)
    # personality: querying and plain Linux pass; turning address randomization off does not.
    for value, answer in [(0xFFFFFFFF, SECCOMP_RET_ALLOW), (0, SECCOMP_RET_ALLOW),
                          (0x0040000, EPERM), (0x0400000, EPERM)]:  # fmt: skip
        assert run_filter(program, arch.audit, PERSONALITY[col], value) == answer, value
    # Another ABI: its numbers mean other calls, so all of it is refused.
    for other in (0x40000003, 0x40000028, *(a.audit for a in ARCHES.values() if a != arch)):
        assert run_filter(program, other, READ[col]) == EPERM, hex(other)
    if arch.audit == AUDIT_ARCH_X86_64:  # x32: x86-64's audit arch, numbers with bit 30
        assert run_filter(program, arch.audit, 0x40000000 | 521) == EPERM


HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),  # arm64 uses the generic table
}


@pytest.mark.parametrize("arch", ARCHES.values(), ids=list(ARCHES))
def test_the_numbers_are_the_kernels(arch: Arch) -> None:
    header = HEADERS[arch.name]
    if not header.exists():
        pytest.skip(f"needs the kernel's headers ({header}; Debian: linux-libc-dev)")
    defined = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", header.read_text())
    }
    table = {**DENIED, "clone": CLONE, "clone3": CLONE3, "personality": PERSONALITY}
    for name, numbers in table.items():
        assert numbers[arch.column] == defined.get(name), name


# Each refused call with harmless arguments; prints {name: errno, 0 when it succeeded}.
CALLS = """
import ctypes, json, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
me = os.getpid()
ARGS = {
    "ptrace": (16, child, 0, 0),  # PTRACE_ATTACH its own child
    "process_vm_readv": (child, 0, 0, 0, 0, 0), "process_vm_writev": (child, 0, 0, 0, 0, 0),
    "process_madvise": (-1, 0, 0, 0, 0), "pidfd_getfd": (-1, 0, 0), "kcmp": (me, me, 0, 0, 0),
    "bpf": (0, 0, 0), "perf_event_open": (0, 0, -1, -1, 0), "userfaultfd": (1,),
    "io_uring_setup": (0, 0), "io_uring_enter": (-1, 0, 0, 0, 0, 0),
    "io_uring_register": (-1, 0, 0, 0), "keyctl": (0, -1, 0), "add_key": (0, 0, 0, 0, 0),
    "request_key": (0, 0, 0, 0), "mount": (0, 0, 0, 0, 0), "umount2": (0, 0),
    "pivot_root": (0, 0), "chroot": (0,), "open_tree": (-1, 0, 0),
    "move_mount": (-1, 0, -1, 0, 0), "fsopen": (0, 0), "fsconfig": (-1, 0, 0, 0, 0),
    "fsmount": (-1, 0, 0), "fspick": (-1, 0, 0), "mount_setattr": (-1, 0, 0, 0, 0),
    "unshare": (0x10000000,), "setns": (-1, 0), "open_by_handle_at": (-1, 0, 0),
    "kexec_load": (0, 0, 0, 0), "kexec_file_load": (-1, -1, 0, 0, 0),
    "init_module": (0, 0, 0), "finit_module": (-1, 0, 0), "delete_module": (0, 0),
    "reboot": (0, 0, 0, 0), "swapon": (0, 0), "swapoff": (0,), "acct": (0,),
    "syslog": (10, 0, 0), "quotactl": (0, 0, 0, 0), "quotactl_fd": (-1, 0, 0, 0),
    "lookup_dcookie": (0, 0, 0), "vhangup": (), "iopl": (0,), "ioperm": (0, 0, 0),
    "modify_ldt": (0, 0, 0), "uselib": (0,), "clone3": (0, 0),
    "clone(CLONE_NEWNET)": (0x40000000 | signal.SIGCHLD, 0, 0, 0, 0),
    "personality(ADDR_NO_RANDOMIZE)": (0x0040000,),
}
out = {}
for name, args in ARGS.items():
    nr = NUMBERS.get(name.split("(")[0])
    if nr is None:
        continue  # not on this architecture
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    if r == 0 and name.startswith("clone("):
        os._exit(0)  # a new process after all: it must not go on
    out[name] = ctypes.get_errno() if r == -1 else 0
os.kill(child, signal.SIGKILL)
print(json.dumps(out))
"""


def calls_program() -> str:
    column = native_arch().column
    numbers = {name: pair[column] for name, pair in DENIED.items()}
    numbers |= {"clone": CLONE[column], "clone3": CLONE3[column]}
    numbers["personality"] = PERSONALITY[column]
    return f"NUMBERS = {numbers!r}\n{CALLS}"


def errnos(sandbox: Sandbox) -> dict[str, str]:
    result = sandbox.run(calls_program())
    assert result.ok, result
    return {name: errno.errorcode.get(e, "ok") for name, e in json.loads(result.stdout).items()}


def test_each_refused_call_gets_eperm_in_the_sandbox(sandbox: Sandbox) -> None:
    got = errnos(sandbox)
    expected = dict.fromkeys(got, "EPERM") | {"clone3": "ENOSYS"}
    assert got == expected
    assert {n for n, numbers in DENIED.items() if numbers[native_arch().column]} <= set(got)


def test_without_the_filter_the_same_calls_get_through(sandbox: Sandbox) -> None:
    # The same sandbox with a one-instruction filter that allows every call: what the
    # kernel, the namespaces and the dropped capabilities alone answer. The filter is
    # what refuses these (the others it refuses are also refused by missing capabilities).
    runtime = sandbox._runtime
    assert runtime is not None
    open_sandbox = Sandbox(sandbox.limits)
    allow_all = struct.pack("=HBBI", 0x06, 0, 0, SECCOMP_RET_ALLOW)
    open_sandbox._runtime = dataclasses.replace(runtime, seccomp=allow_all)
    got = errnos(open_sandbox)
    assert got["ptrace"] == got["process_vm_readv"] == "ok"
    assert got["personality(ADDR_NO_RANDOMIZE)"] == "ok"
    assert got["clone3"] == "EINVAL"
    assert got["unshare"] == "ENOSPC"  # --disable-userns
    assert got["setns"] == "EBADF"


STOP_INIT = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
for request in (PTRACE_ATTACH, PTRACE_SEIZE):
    r = libc.ptrace(request, 1, None, None)  # bubblewrap's init: pid 1 here, same uid
    print(request, r, os.strerror(ctypes.get_errno()) if r else "attached", flush=True)
"""


def test_the_program_cannot_stop_the_sandboxes_init(sandbox: Sandbox) -> None:
    # Without the filter PTRACE_ATTACH stops the init, nothing reaps the program when it
    # exits, and the run ends only at the wall clock (`stopped == "timeout"`).
    result = sandbox.run(STOP_INIT, limits=SandboxLimits(wall_seconds=20))
    assert result.stopped == "exited", result
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "16 -1 Operation not permitted",
        f"{0x4206} -1 Operation not permitted",
    ]
    assert result.wall_seconds < 10


ORDINARY = """
import multiprocessing, os, subprocess, sys, threading

def square(x):
    return x * x

def seccomp_mode():
    for line in open("/proc/self/status"):
        if line.startswith("Seccomp:"):
            return line.split()[1]

if __name__ == "__main__":
    print("filtered", seccomp_mode())
    threads = [threading.Thread(target=square, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("threads", len(threads))
    child = subprocess.run(
        [sys.executable, "-c", "print(open('/proc/self/status').read().count('Seccomp:\\t2'))"],
        capture_output=True, text=True, check=True,
    )
    print("subprocess filtered", child.stdout.strip())
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    for method in ("fork", "spawn", "forkserver"):
        with multiprocessing.get_context(method).Pool(2) as pool:
            print(method, pool.map(square, range(4)))
"""


def test_ordinary_python_still_runs(sandbox: Sandbox) -> None:
    result = sandbox.run(ORDINARY, limits=SandboxLimits(wall_seconds=30))
    assert result.ok, result
    assert result.stdout.splitlines() == [
        "filtered 2",  # SECCOMP_MODE_FILTER, inherited by every process below
        "threads 4",
        "subprocess filtered 1",
        "fork 7",
        "fork [0, 1, 4, 9]",
        "spawn [0, 1, 4, 9]",
        "forkserver [0, 1, 4, 9]",
    ], result


def test_an_unknown_architecture_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("platform.machine", lambda: "riscv64")
    with pytest.raises(UnsupportedArchError, match=r"x86_64 and aarch64; .* on riscv64$"):
        native_arch()
