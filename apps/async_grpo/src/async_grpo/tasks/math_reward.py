"""The `math` reward: 1.0 when the response's final answer equals the target as mathematics,
checked with `math-verify` (the checker TRL and open-r1 use), else 0.0.

The response is read the way math-verify reads it: the last `\\boxed{...}`, else a
`####` answer or the last number or expression; so `\\boxed{\\dfrac{3}{4}}` and `0.75`,
`1,000` and `1000`, `50\\%` and `50`, `(x+1)^2` and `x^2+2x+1` are the same answer. The
target is read as the content of a `\\boxed{}` (what `tasks.formats` takes from a GSM8K or
MATH solution).

Timeouts. math-verify bounds each parse and each comparison with `signal.alarm`, which
works only on a process's main thread. A Monarch actor's endpoints run on other threads
(`monarch-actor-event-loop`), where math-verify raises ValueError unless its timeouts are
off, and without them an answer such as `9^{9^{9}}` keeps sympy busy for minutes. So the
reward actor checks answers in a child process of its own (`MathWorker`), on whose main
thread math-verify's timeouts work (`TIMEOUT_S` per parse and per comparison; an answer
that runs out of time scores 0). Some work a signal cannot interrupt (one long call into
C); the parent's deadline covers it: past `deadline_s`, the child is killed and started
again, and that response scores 0.
"""

from __future__ import annotations

import functools
import json
import os
import select
import subprocess
import sys
import time
from typing import Any

TIMEOUT_S = 5
"""Seconds math-verify may spend on one parse or one comparison (whole seconds: it uses
`signal.alarm`); math-verify's own default. A legitimate answer takes milliseconds, but
sympy's first comparison of two expressions takes a few hundred, several times that on a
busy machine (2 s was too little on this project's 2-core machine at load 10)."""

_READY = "ready"


@functools.lru_cache(maxsize=4096)
def _gold(target: str, timeout_s: int) -> list[Any]:
    # Imported here: sympy loads only where a math reward runs.
    from math_verify import parse  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415

    return list(parse(f"\\boxed{{{target}}}", parsing_timeout=timeout_s))


def math_score(response: str, target: str, timeout_s: int = TIMEOUT_S) -> float:
    """1.0 when math-verify finds `response`'s final answer equal to `target`. Only on a
    process's main thread (math-verify's timeouts are signals); elsewhere, `MathWorker`."""
    from math_verify import parse, verify  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415

    answer = parse(response, parsing_timeout=timeout_s)
    return float(verify(_gold(target, timeout_s), answer, timeout_seconds=timeout_s))


class MathWorker:
    """`math_score` in a child process, callable from any thread as a reward function
    `(response, target) -> float`, one call at a time.

    `deadline_s` bounds one call (0: three timeouts, the two parses and the comparison, plus
    10 s); past it the child is killed, the response scores 0 and the next call starts a new
    child. The child also ends when this process does (its standard input closes)."""

    def __init__(self, timeout_s: int = TIMEOUT_S, deadline_s: float = 0.0) -> None:
        if timeout_s < 1:
            raise ValueError(f"timeout_s must be a whole number of seconds >= 1, got {timeout_s}")
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s or 3 * timeout_s + 10.0
        self.killed = 0
        """Children killed past the deadline (each one a response scored 0)."""
        self._proc: subprocess.Popen[str] | None = None
        self._start()

    @property
    def pid(self) -> int | None:
        """The child's process id (None between a kill and the next call)."""
        return self._proc.pid if self._proc is not None else None

    def _start(self, startup_s: float = 120.0) -> None:
        cmd = [sys.executable, "-m", "async_grpo.tasks.math_reward", str(self.timeout_s)]
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        line = self._read(startup_s)
        if line != _READY:
            self.close()
            raise RuntimeError(f"the math reward's checker process did not start ({line!r})")

    def _read(self, timeout_s: float) -> str | None:
        """The child's next line, None if none came within `timeout_s` or it died."""
        assert self._proc is not None
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = self._proc.stdout.readline()
        return line.strip() if line else None

    def __call__(self, response: str, target: str) -> float:
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        assert self._proc is not None
        assert self._proc.stdin is not None
        start = time.perf_counter()
        try:
            self._proc.stdin.write(json.dumps([response, target]) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:  # it died after the check above (killed, out of memory)
            line = None
        else:
            line = self._read(self.deadline_s)
        if line is None:
            self.killed += 1
            print(
                f"[math reward: no score from the checker process (pid {self._proc.pid}) "
                f"after {time.perf_counter() - start:.0f}s (limit {self.deadline_s:.0f}s); "
                "the response scores 0 and the process is started again]",
                file=sys.stderr,
                flush=True,
            )
            self.close()
            return 0.0
        return float(line)

    def close(self) -> None:
        """Kills the child (the next call starts another)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
            self._proc = None


def _serve(timeout_s: int) -> None:
    """The child: one JSON `[response, target]` a line in, one score a line out."""
    # Scores go out on a copy of the standard output; anything else written there, by C
    # code included, goes to the standard error instead of answering for a score.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    # Before "ready": sympy's import and its first comparison (which fills its caches) are
    # paid here, not inside the first check's timeout.
    math_score("\\boxed{x^2+2x+1}", "(x+1)^2", timeout_s)
    out.write(_READY + "\n")
    out.flush()
    for line in sys.stdin:
        response, target = json.loads(line)
        try:
            score = math_score(response, target, timeout_s)
        except Exception:  # math-verify returns False on its own errors; anything else is 0 too
            score = 0.0
        out.write(f"{score}\n")
        out.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
