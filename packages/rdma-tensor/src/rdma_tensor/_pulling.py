"""What the two pull paths (`_pull_shm`, `_pull_rdma`) share: the copy plan, the goal of a
pull, its outcome, and small helpers over slot headers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rdma_tensor.errors import PublisherClosedError, PullTimeoutError
from rdma_tensor.manifest import TensorEntry
from rdma_tensor.staging import SlotHeader, SlotState

Plan = list[tuple[TensorEntry, torch.Tensor]]
"""Every published entry with the destination tensor it goes into."""


@dataclass(frozen=True)
class Goal:
    """What a pull waits for: a complete version >= `want`, until `deadline` (monotonic
    seconds; `wait_s` is the timeout it came from). `applied` is what `into` holds now."""

    want: int
    applied: int | None
    deadline: float
    wait_s: float


@dataclass(frozen=True)
class Outcome:
    """What a pull path did: `version` now in `into` (`changed`: whether it copied)."""

    version: int
    changed: bool
    nbytes: int
    copy_seconds: float
    retries: int = 0
    pipelined: bool = False


def copy_entries(plan: Plan, buckets: Sequence[torch.Tensor]) -> None:
    """Copies every entry from its bucket bytes into its destination (casting if needed)."""
    with torch.no_grad():
        for e, dst in plan:
            src = buckets[e.bucket][e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape)
            dst.copy_(src)
    for device in {dst.device for _, dst in plan if dst.is_cuda}:
        torch.cuda.synchronize(device)


def plan_bytes(plan: Plan) -> int:
    return sum(e.nbytes for e, _ in plan)


def newest(headers: Sequence[SlotHeader], want: int, state: SlotState) -> int | None:
    """The slot holding the newest version >= want in `state` (COMPLETE: fully complete)."""
    best = None
    for i, h in enumerate(headers):
        ok = h.complete if state is SlotState.COMPLETE else h.state is state
        if ok and h.version >= want and (best is None or h.version > headers[best].version):
            best = i
    return best


def timeout_error(goal: Goal, headers: Sequence[SlotHeader]) -> PullTimeoutError:
    held = ", ".join(f"{h.state.name.lower()} v{h.version}" for h in headers)
    return PullTimeoutError(
        f"version >= {goal.want} was not staged within {goal.wait_s}s (slots: {held})"
    )


def check_not_closed(headers: Sequence[SlotHeader]) -> None:
    if any(h.state is SlotState.CLOSED for h in headers):
        raise PublisherClosedError("the publisher was closed")
