"""Runs many `python ARGS... --help` command lines for `test_doc_commands.py`, each in a
process of its own forked from this one after it imported torch and transformers: a script's
`--help` then costs its own imports only (about 1 s of CPU) instead of the 4 to 11 s most of
them spend importing torch and transformers as fresh processes.

    python tests/help_runner.py '["examples/03_rdma_transfer.py", "--help"]' ...

Prints one JSON list: for each command line, its exit status, stdout and stderr. A child
starts with the same modules loaded as a fresh interpreter would after `import torch,
transformers`; its argv, sys.path[0] (the script's directory, or the working directory for
`-m MODULE`) and file descriptors 1 and 2 are its own. A child still running
`CHILD_LIMIT_S` after it started is killed, and its stderr says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch  # noqa: F401  # imported here once, for every child
import transformers
import transformers.modeling_utils  # noqa: F401

RUNNING_AT_ONCE = 2
CHILD_LIMIT_S = 120.0  # a `--help` takes seconds; one still running then is stuck


def _run_in_child(args: list[str]) -> None:
    """Runs `python ARGS` in this (forked) process and exits with its status."""
    code = 0
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]  # run_module sets argv[0] to the module's file
            sys.path[0] = os.getcwd()
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path[0] = str(Path(args[0]).resolve().parent)
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # a crash is the result, printed as a fresh process prints it
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _start(args: list[str], out: Any, err: Any) -> int:
    pid = os.fork()
    if pid == 0:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        _run_in_child(args)
    return pid


def main() -> None:
    commands = [json.loads(a) for a in sys.argv[1:]]
    results: list[dict[str, Any]] = [{} for _ in commands]
    running: dict[int, tuple[int, Any, Any, float]] = {}
    killed: set[int] = set()
    pending = list(enumerate(commands))
    with contextlib.ExitStack() as files:
        while pending or running:
            while pending and len(running) < RUNNING_AT_ONCE:
                i, args = pending.pop(0)
                out = files.enter_context(tempfile.TemporaryFile())
                err = files.enter_context(tempfile.TemporaryFile())
                running[_start(args, out, err)] = (i, out, err, time.monotonic())
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:  # none ended: kill the overdue, look again shortly
                for child, (*_, started) in running.items():
                    if child not in killed and time.monotonic() - started > CHILD_LIMIT_S:
                        os.kill(child, signal.SIGKILL)
                        killed.add(child)
                time.sleep(0.02)
                continue
            i, out, err, _ = running.pop(pid)
            out.seek(0)
            err.seek(0)
            stderr = err.read().decode(errors="replace")
            if pid in killed:
                stderr += f"\nhelp_runner: killed, still running after {CHILD_LIMIT_S:.0f} s\n"
            results[i] = {
                "returncode": os.waitstatus_to_exitcode(status),
                "stdout": out.read().decode(errors="replace"),
                "stderr": stderr,
            }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
