"""The bubblewrap command line of one sandboxed run, and what it needs from the host.

The sandbox sees a read-only root holding only the Python installation that runs it and the
shared libraries that installation loads (found with `ldd`; system library directories such
as /lib/x86_64-linux-gnu are bound whole), a fresh `/proc` of its own PID
namespace, a minimal `/dev`, and two private size-capped tmpfs: `/tmp` (its working
directory) and `/dev/shm`. Every namespace is new (user, mount, PID, network with only a
loopback, IPC, UTS, cgroup); capabilities are dropped, new user namespaces are refused
(`--disable-userns`), system calls it never needs are refused (`_seccomp`), and it dies
with its parent. Its environment is exactly `environment(...)`: nothing of the host's.

Its processes run as an unprivileged host uid: Linux does not enforce RLIMIT_NPROC on
processes whose real uid is host root, so without that a fork bomb could exhaust the host's
PIDs. A non-root caller's own uid is used as is. A root caller drops to `nobody` (65534) with
util-linux's `setpriv` before starting the sandbox; when that uid could not reach a file the
sandbox needs (a Python under /root, say), a first, root-owned bubblewrap stages those files
in a private tmpfs that only its own mount namespace sees.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass

from rl_envs.sandbox._seccomp import UnsupportedArchError, filter_program, native_arch
from rl_envs.sandbox.limits import SandboxLimits

SANDBOX_UID = 65534
"""The host uid a root caller's sandboxes run as (`nobody`)."""

PROGRAM_PATH = "/sandbox/main.py"
"""Where the program is inside the sandbox (read-only); its working directory is /tmp."""

# Runs first inside the sandbox, as `python -I -S -c BOOT <limits...> <run id> <path>`:
# sets the limits on itself (children inherit them; soft == hard, so the program cannot
# raise them), then runs the program as __main__ in this interpreter (one Python start-up
# per run instead of two). RLIMIT_NPROC counts bubblewrap's own init process too, hence +1.
# bubblewrap sets PWD after its --chdir, whatever the environment given; it goes from both
# the C environment (children) and the table `os.environ` is built from.
BOOT = """\
import posix as _p, resource as _r, sys as _s
_p.unsetenv("PWD")
_p.environ.pop(b"PWD", None)
_cpu, _mem, _fsize, _nproc, _nofile = map(int, _s.argv[1:6])
for _lim, _soft, _hard in (
    (_r.RLIMIT_CORE, 0, 0),
    (_r.RLIMIT_CPU, _cpu, _cpu + 1),
    (_r.RLIMIT_AS, _mem, _mem),
    (_r.RLIMIT_FSIZE, _fsize, _fsize),
    (_r.RLIMIT_NPROC, _nproc + 1, _nproc + 1),
    (_r.RLIMIT_NOFILE, _nofile, _nofile),
):
    _r.setrlimit(_lim, (_soft, _hard))
__file__ = _s.argv[7]
_s.argv[:] = [__file__]
with open(__file__, encoding="utf-8") as _f:
    _code = compile(_f.read(), __file__, "exec")
del _p, _r, _s, _cpu, _mem, _fsize, _nproc, _nofile, _lim, _soft, _hard, _f
exec(globals().pop("_code"))
"""


class SandboxUnavailableError(RuntimeError):
    """Isolation cannot be set up here; the message says what is missing."""


@dataclass(frozen=True)
class Runtime:
    """What every run needs from the host, found once per process.

    Attributes:
        bwrap: path of the bubblewrap executable.
        setpriv: path of util-linux's setpriv (only used by a root caller), else None.
        python: the interpreter that runs programs (the real file behind sys.executable).
        binds: (host path, sandbox path) pairs, bound read-only: the interpreter's
            installation prefix and the shared libraries outside it.
        stage: the binds that the sandbox uid could not reach on the host; a root caller
            stages these first.
        seccomp: the system-call filter, as bubblewrap's `--seccomp` reads it.
    """

    bwrap: str
    setpriv: str | None
    python: str
    binds: tuple[tuple[str, str], ...]
    stage: tuple[tuple[str, str], ...]
    seccomp: bytes

    @property
    def drops_root(self) -> bool:
        return self.setpriv is not None


def _ldd_paths(objects: Sequence[str]) -> list[str]:
    """Shared libraries `objects` load, as absolute paths (the loader included)."""
    if shutil.which("ldd") is None:
        raise SandboxUnavailableError(
            "`ldd` was not found: it lists the libraries Python needs inside the sandbox "
            "(Debian/Ubuntu: package libc-bin)"
        )
    out = subprocess.run(["ldd", *objects], capture_output=True, text=True, check=False).stdout
    paths: list[str] = []
    for raw in out.splitlines():
        line = raw.strip()
        if "=>" in line:
            target = line.split("=>", 1)[1].strip().split(" ")[0]
        else:
            target = line.split(" ")[0]
        if target.startswith("/") and os.path.exists(target):
            paths.append(target)
    return paths


def _reachable_by_others(path: str) -> bool:
    """Whether a uid with no special rights can read `path` (every parent searchable)."""
    parts = os.path.abspath(path).split("/")
    for i in range(2, len(parts)):
        parent = "/".join(parts[:i]) or "/"
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    mode = os.stat(path).st_mode
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return mode & need == need


_SYSTEM_LIB_DIRS = ("/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64")


def _is_system_lib_dir(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in _SYSTEM_LIB_DIRS)


@functools.cache
def find_runtime() -> Runtime:
    """The host side of the sandbox, or `SandboxUnavailableError` naming what is missing."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailableError(f"the sandbox needs Linux namespaces; this is {sys.platform}")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError(
            "bubblewrap (`bwrap`) is not installed: install the distribution package "
            "`bubblewrap` (Debian/Ubuntu: apt-get install bubblewrap)"
        )
    setpriv = None
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxUnavailableError(
                "running as root, the sandbox drops to an unprivileged uid with `setpriv`, "
                "which was not found (Debian/Ubuntu: package util-linux)"
            )
    try:
        seccomp = filter_program(native_arch())
    except UnsupportedArchError as e:
        raise SandboxUnavailableError(str(e)) from None
    python = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    dynload = sysconfig.get_config_var("DESTSHARED") or ""
    objects = [python, *sorted(glob.glob(os.path.join(dynload, "*.so")))]
    libs = {p for p in _ldd_paths(objects) if not p.startswith(prefix + "/")}
    # A system library directory is bound whole: one mount instead of one per library
    # (about 20 ms per run fewer with CPython's ~40), and such a directory holds only
    # libraries. A library anywhere else is bound alone.
    paths = {os.path.dirname(p) if _is_system_lib_dir(os.path.dirname(p)) else p for p in libs}
    binds = [(prefix, prefix), *((p, p) for p in sorted(paths))]
    if not python.startswith(prefix + "/"):
        binds.append((python, python))
    stage = tuple(b for b in binds if setpriv is not None and not _reachable_by_others(b[0]))
    return Runtime(bwrap, setpriv, python, tuple(binds), stage, seccomp)


def environment(python: str, home: str) -> dict[str, str]:
    """The whole environment of a program run with the interpreter `python`, its home and
    temporary directory `home`. No PYTHON* variable: the interpreter runs with `-I`, which
    ignores them, and takes its settings as flags."""
    return {
        "PATH": os.path.dirname(python),  # `python3` and `sys.executable` for subprocesses
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
    }


def command(
    runtime: Runtime,
    limits: SandboxLimits,
    *,
    program_fd: int,
    status_fd: int,
    seccomp_fd: int,
    run_id: str,
) -> list[str]:
    """The argv of one run: `program_fd` holds the program's UTF-8 text and `seccomp_fd`
    `runtime.seccomp`, each from offset 0; bubblewrap writes the child's pid, then its exit
    status, to `status_fd` (JSON lines)."""
    # Directly in the outer sandbox's private /tmp: a directory bubblewrap creates on the
    # way would not be searchable by the sandbox uid.
    staged = {src: f"/tmp/rl-envs-stage-{i}" for i, (src, _) in enumerate(runtime.stage)}
    outer: list[str] = []
    if staged:
        # Its own PID namespace: when the host process dies, the outer bubblewrap and its
        # namespace's init die (--die-with-parent), and the kernel kills everything inside.
        # (A parent-death signal alone would not reach the inner bubblewrap: dropping to the
        # sandbox's uid clears it.)
        outer = [runtime.bwrap, "--dev-bind", "/", "/", "--tmpfs", "/tmp", "--unshare-pid"]
        outer += ["--die-with-parent"]
        for src, at in staged.items():
            outer += ["--ro-bind", src, at]
    drop: list[str] = []
    if runtime.setpriv is not None:
        drop = [
            runtime.setpriv,
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_UID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ]
    inner = [
        runtime.bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--json-status-fd",
        str(status_fd),
        "--seccomp",
        str(seccomp_fd),
        "--clearenv",
    ]
    for name, value in environment(runtime.python, "/tmp").items():
        inner += ["--setenv", name, value]
    for src, dest in runtime.binds:
        inner += ["--ro-bind", staged.get(src, src), dest]
    size = str(limits.tmp_bytes)
    inner += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", size, "--tmpfs", "/tmp",
        "--size", size, "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--ro-bind-data", str(program_fd), PROGRAM_PATH,
        "--remount-ro", "/",
        "--chdir", "/tmp",
    ]  # fmt: skip
    inner += [runtime.python, *interpreter_args(limits, run_id)]
    return outer + drop + inner


def interpreter_args(limits: SandboxLimits, run_id: str, path: str = PROGRAM_PATH) -> list[str]:
    """Python's flags, the boot code and its arguments (`-I -S`: no environment variables,
    no user or site packages)."""
    numbers = (
        limits.cpu_seconds,
        limits.memory_bytes,
        limits.file_size_bytes,
        limits.max_processes,
        limits.open_files,
    )
    return ["-I", "-S", "-B", "-X", "utf8", "-c", BOOT, *map(str, numbers), run_id, path]
