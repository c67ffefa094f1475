"""Runs one Python program in the sandbox and prints the result as one JSON object.

    uv run python -m rl_envs.sandbox PROGRAM.py [--stdin FILE] [--cpu-seconds 5] ...

Exit status 0 when the program ran (whatever it did: read `ok`, `exit_code`, `stopped`),
2 for a usage error (a missing file, a limit <= 0), 3 when isolation is unavailable here
(the message names what is missing). `--unsafe-no-isolation` runs it as a plain child
process instead, for debugging only.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import fields
from pathlib import Path

from rl_envs.sandbox._bwrap import SandboxUnavailableError
from rl_envs.sandbox.limits import SandboxLimits
from rl_envs.sandbox.runner import Sandbox


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rl_envs.sandbox",
        description="Run PROGRAM.py in a bubblewrap sandbox; print the result as JSON.",
    )
    parser.add_argument("program", type=Path, help="the Python file to run")
    parser.add_argument("--stdin", type=Path, help="a file whose text is the program's stdin")
    for f in fields(SandboxLimits):
        kind = float if f.name == "wall_seconds" else int
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default)
    parser.add_argument(
        "--unsafe-no-isolation",
        action="store_true",
        help="DEBUGGING ONLY: no sandbox, the program sees the host",
    )
    args = parser.parse_args(argv)
    try:
        limits = SandboxLimits(**{f.name: getattr(args, f.name) for f in fields(SandboxLimits)})
        program = args.program.read_text(encoding="utf-8")
        stdin = args.stdin.read_text(encoding="utf-8") if args.stdin else ""
    except (OSError, UnicodeDecodeError, ValueError, TypeError) as e:
        print(f"python -m rl_envs.sandbox: error: {e}", file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the unsafe switch is announced below instead
            sandbox = Sandbox(limits, unsafe_no_isolation=args.unsafe_no_isolation)
    except SandboxUnavailableError as e:
        print(f"python -m rl_envs.sandbox: sandbox unavailable: {e}", file=sys.stderr)
        return 3
    if args.unsafe_no_isolation:
        print("WARNING: --unsafe-no-isolation: the program runs WITHOUT a sandbox", file=sys.stderr)
    print(json.dumps(sandbox.run(program, stdin=stdin).to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
