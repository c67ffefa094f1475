"""What `noxfile.py` needs beyond its sessions: running tests in a session of their own
(so a signal sent to them cannot end nox) and the GPU rehearsal's environment checks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import nox

# `uv run` exports the path of its own binary; fall back to PATH when nox runs on its own.
UV = os.environ.get("UV") or shutil.which("uv") or "uv"

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
# How long tests get to end after a stop signal was passed on to them, before SIGKILL.
STOP_GRACE_S = 120.0


def run_apart(session: nox.Session, args: list[str], env: dict[str, str]) -> None:
    """Runs `args` in a session of their own (their own process group), so that a signal
    sent to their group cannot end nox, nor the shell that started nox. A SIGINT or SIGTERM
    sent to nox is received here, with its sender: it is logged (pid and command line),
    passed on to the tests' process group (again for a second one), and the session fails
    naming it (a SIGINT then interrupts nox, as Ctrl-C does); tests still running
    `STOP_GRACE_S` later are SIGKILLed. Tests ended by a signal fail the session, naming
    the signal."""
    session.log(f"{' '.join(args)}  (in a session of its own)")
    received: list[str] = []
    interrupted = False
    # nox waits in `sigtimedwait` with the signals blocked (nox has no other thread): the
    # kernel hands a signal for nox to the thread waiting for it, with the sender's pid.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        # `exec` keeps a mask: the tests start with the signals unblocked and at their
        # defaults (a shell's background job would have passed SIGINT on ignored).
        pid = os.posix_spawn(
            args[0], args, {**os.environ, **env},
            setsid=True, setsigmask=(), setsigdef=STOP_SIGNALS,
        )  # fmt: skip
        deadline = float("inf")
        status = None
        while status is None:
            info = signal.sigtimedwait(STOP_SIGNALS, 0.5)
            if info is not None:
                name = signal.Signals(info.si_signo).name
                received.append(f"{name} from {_sender(info.si_pid)}")
                interrupted = interrupted or info.si_signo == signal.SIGINT
                session.warn(f"{received[-1]}: passed on to the tests (pgid {pid})")
                _signal_group(pid, info.si_signo)
                deadline = min(deadline, time.monotonic() + STOP_GRACE_S)
            if time.monotonic() > deadline:
                session.warn(f"the tests did not end {STOP_GRACE_S:.0f} s after it: SIGKILL")
                _signal_group(pid, signal.SIGKILL)
                deadline = float("inf")
            waited, raw = os.waitpid(pid, os.WNOHANG)
            status = os.waitstatus_to_exitcode(raw) if waited else None
        _signal_group(pid, signal.SIGKILL)  # whatever of the group outlived pytest
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    if interrupted:
        raise KeyboardInterrupt
    if received:
        session.error(f"the tests were stopped: {'; '.join(received)}")
    if status < 0:
        session.error(f"pytest was ended by {signal.Signals(-status).name}")
    if status != 0:
        session.error(f"pytest exited with status {status}")


def run_together(
    commands: Iterable[list[str]],
    env: dict[str, str],
    *,
    width: int,
    limit_s: float,
    log: Callable[[str], object],
) -> list[str]:
    """Runs `commands`, `width` at a time, in order; each one's output (stdout and stderr
    together) is printed whole when it ends, with its exit status and time (named by its
    arguments: the program is the same for all). A command still running `limit_s` after
    it started is killed. Returns one line per command that failed or was killed.

    `commands` is read one command at a time, when a place is free: a generator that
    prepares each command's environment does so while the commands before it run."""
    pending = iter(commands)
    more = True
    running: dict[subprocess.Popen[bytes], tuple[str, IO[bytes], float]] = {}
    failed: list[str] = []
    with contextlib.ExitStack() as files:
        try:
            while more or running:
                while more and len(running) < width:
                    command = next(pending, None)
                    if command is None:
                        more = False
                        break
                    out: IO[bytes] = files.enter_context(tempfile.TemporaryFile())
                    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
                    running[proc] = (" ".join(command[1:]), out, time.monotonic())
                time.sleep(0.2)
                for proc, (name, out, start) in list(running.items()):
                    took = time.monotonic() - start
                    code = proc.poll()
                    if code is None and took > limit_s:
                        proc.kill()
                        proc.wait()
                        status = f"still running after {limit_s:.0f} s, killed"
                    elif code is None:
                        continue
                    else:
                        status = f"exit status {code}"

                    del running[proc]
                    out.seek(0)
                    sys.stdout.write(out.read().decode(errors="replace"))
                    sys.stdout.flush()
                    log(f"{name}: {status} after {took:.1f} s")
                    if status != "exit status 0":
                        failed.append(f"{name}: {status}")
        finally:
            for proc in running:
                proc.kill()
                proc.wait()
    return failed


def _signal_group(pgid: int, signum: int) -> None:
    # ProcessLookupError: the group is gone; PermissionError: only zombies are left in it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _sender(pid: int) -> str:
    """A signal's sender: its pid and command line, from /proc."""
    if pid == 0:
        return "the kernel or a process outside this PID namespace"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ")
    except OSError:
        command = b""
    return f"pid {pid} ({command.decode(errors='replace') or 'exited'})"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def python312() -> str:
    """The GPU machine's Python minor version, 3.12 (GPU_REHEARSAL_PYTHON overrides; a
    pyenv shim that names no installed 3.12 is skipped)."""
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"), reverse=True)
    candidates = [os.environ.get("GPU_REHEARSAL_PYTHON"), *map(str, pyenv)]
    candidates.append(shutil.which("python3.12"))
    check = "import sys; sys.exit(sys.version_info[:2] != (3, 12))"
    for python in filter(None, candidates):
        if subprocess.run([python, "-c", check], capture_output=True, check=False).returncode == 0:
            return python
    raise RuntimeError("gpu_rehearsal needs Python 3.12: set GPU_REHEARSAL_PYTHON")


def installed(python: Path) -> list[str]:
    listed = subprocess.run(
        [UV, "pip", "list", "--python", str(python), "--format", "json"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return [normalized(p["name"]) for p in json.loads(listed)]


# The rehearsal of tools/gpu_check.sh: what the GPU machine has (tools/gpu_device_packages.txt)
# that the code needs, at the versions known there; nothing else comes from the registry.
GPU_REHEARSAL_REQUIREMENTS = [
    "torch==2.11.0",
    "transformers==5.17.0",
    "tokenizers==0.23.2",
    "safetensors==0.8.0",
    "huggingface-hub==1.33.0",
    "numpy==2.5.2",
    "tqdm",
    "cloudpickle",
    "psutil",
    "packaging",
    "pyre-extensions",  # torchmonarch imports these two
    "tabulate",
    "pytest",
    "pytest-timeout",
    "hypothesis",
]


def rehearsal_env(session: nox.Session, env_dir: Path, device_packages: Path) -> Path:
    """The GPU rehearsal's virtual environment in `env_dir`: Python 3.12 and
    `GPU_REHEARSAL_REQUIREMENTS`, with anything they pull in that the GPU machine lacks (the
    packages listed in `device_packages`) removed; rebuilt when either list changes. Fails
    the session if a requirement is not on the GPU machine or the environment holds more
    than it has. Returns `env_dir`."""
    device = {
        normalized(line)
        for line in device_packages.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    wanted = {normalized(re.split(r"[=<>]", r)[0]) for r in GPU_REHEARSAL_REQUIREMENTS}
    if wanted - device:
        session.error(f"not on the GPU machine: {sorted(wanted - device)}")
    base_python = python312()
    python = env_dir / "bin" / "python"
    digest = hashlib.sha256(
        "\n".join([base_python, *GPU_REHEARSAL_REQUIREMENTS, *sorted(device)]).encode()
    ).hexdigest()
    stamp = env_dir / "requirements.sha256"
    if not (stamp.exists() and stamp.read_text() == digest):
        shutil.rmtree(env_dir, ignore_errors=True)
        session.run(base_python, "-m", "venv", str(env_dir), external=True)
        session.run(
            UV, "pip", "install", "--quiet", "--python", str(python), *GPU_REHEARSAL_REQUIREMENTS
        )
        extra = sorted(set(installed(python)) - device)
        if extra:  # requirements the GPU machine does without (transformers' pydantic)
            session.log(f"removing what the GPU machine lacks: {', '.join(extra)}")
            session.run(UV, "pip", "uninstall", "--quiet", "--python", str(python), *extra)
        stamp.write_text(digest)
    extra = sorted(set(installed(python)) - device)
    if extra:
        session.error(f"the rehearsal environment holds what the GPU machine lacks: {extra}")
    return env_dir


def rehearsal_problems(report: dict[str, Any]) -> list[str]:
    """What a CPU rehearsal must show beyond exit status 0: the CPU mode, every import and
    an actor in the GPU machine's environment, gpu tests collected (skipping, with their
    reason), a bit-for-bit weight sync, the app's steps, and both modes of the async vs sync
    benchmark."""
    parts = report["parts"]
    env = parts["setup"].get("environment") or {}
    tests = parts["gpu_tests"].get("tests") or []
    sync = parts["weight_sync"].get("result") or {}
    app = parts["app"].get("result") or {}
    benchmark = parts["async_vs_sync"].get("result") or {}
    checks = {
        "the mode is cpu": report.get("mode") == "cpu",
        "every import and one actor": not env.get("problems") and bool(env.get("actor")),
        "gpu tests collected": bool(tests),
        "each gpu test skips, saying why": all(
            t["outcome"] == "skipped" and t["message"] for t in tests
        ),
        "weight sync bit for bit": sync.get("bit_for_bit") is True,
        "the app trained 3 steps": app.get("steps") == 3,
        "the benchmark ran both modes on all CPUs and on 2": all(
            {r.get("mode") for r in rows if isinstance(r, dict) and r.get("episodes_per_s")}
            == {"async", "sync"}
            for rows in (benchmark.get("all_cpus") or [], benchmark.get("two_cpus") or [])
        ),
    }
    return [f"rehearsal: not true that {what}" for what, ok in checks.items() if not ok]
