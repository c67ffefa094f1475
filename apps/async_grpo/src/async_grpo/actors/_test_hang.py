"""A fault hook for tests: make one endpoint call block forever, as a deadlocked one would.

    ASYNC_GRPO_TEST_HANG="trainer.train_step:3:/tmp/run/hung-trainer"

makes the trainer's third `train_step` call in a process block its actor for good (the
whole event loop, as a collective that never completes does), once: the marker file records
that it happened, so the process that replaces it does not hang again. Several, separated
by commas, hang several endpoints. Unset (always, outside tests), `maybe_hang` costs one
dictionary lookup.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

HANG_ENV = "ASYNC_GRPO_TEST_HANG"

_calls: dict[str, int] = {}


def maybe_hang(component: str, endpoint: str) -> None:
    """Blocks forever if this is a call `HANG_ENV` names and it has not hung before."""
    specs = os.environ.get(HANG_ENV)
    if not specs:
        return
    name = f"{component}.{endpoint}"
    for spec in specs.split(","):
        target, count, marker = spec.split(":", 2)
        if target != name:
            continue
        _calls[name] = _calls.get(name, 0) + 1
        if _calls[name] != int(count) or Path(marker).exists():
            return
        Path(marker).write_text(f"{name} call {count} hung in pid {os.getpid()}\n")
        _hang_for_a_test()


def _hang_for_a_test() -> None:
    threading.Event().wait()  # never set
